"""One exception hierarchy, so callers and the CLI can tell failures apart.

Every message is one line that names the thing that is wrong and where; the
CLI prints it as is and maps each class to a documented exit code.  Each class
also derives from the builtin LiteRT raises in the same situation (ValueError
for a bad model, config, input or plugin, as for a delegate LiteRT cannot load;
RuntimeError for a failure to build or run),
so ``except`` clauses written for ``ai_edge_litert`` keep working.
"""

from __future__ import annotations


class DelegateError(Exception):
    """Base of every error this package raises on purpose."""

    exit_code = 1


class ModelFormatError(DelegateError, ValueError):
    """The model file is not a valid TFLite flatbuffer (or violates its invariants)."""

    exit_code = 3


class ConfigError(DelegateError, ValueError):
    """The YAML configuration is invalid; the message names file, key path and line."""

    exit_code = 4

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None,
                 line: int | None = None):
        where = ""
        if file:
            where = f"{file}"
            if line is not None:
                where += f":{line}"
            where += ": "
        if key:
            where += f"{key}: "
        super().__init__(where + message)
        self.file, self.key, self.line = file, key, line


class PluginError(DelegateError, ValueError):
    """A backend plugin is missing, unavailable or misbehaved."""

    exit_code = 5


class UnsupportedOpError(DelegateError, RuntimeError):
    """No usable backend can run an op (op index, code, version and the reasons)."""

    exit_code = 6

    def __init__(self, message: str, *, op_index: int | None = None, opcode: str | None = None,
                 backend: str | None = None):
        super().__init__(message)
        self.op_index, self.opcode, self.backend = op_index, opcode, backend


class CompileError(DelegateError, RuntimeError):
    """A backend failed to build a partition; carries the build log, and the partition (its index in the plan)
    and backend once the session knows them."""

    exit_code = 7

    def __init__(self, message: str, *, log: str = "", partition: int | None = None, backend: str | None = None):
        super().__init__(message)
        self.log, self.partition, self.backend = log, partition, backend


class ExecutionError(DelegateError, RuntimeError):
    """Running a compiled plan failed, or the inputs given to it are invalid.

    A partition that failed is named by ``partition`` (its index in the plan) and ``backend``; both are None
    for a failure of no one partition (bad inputs, a value never produced)."""

    exit_code = 8

    def __init__(self, message: str, *, partition: int | None = None, backend: str | None = None):
        super().__init__(message)
        self.partition, self.backend = partition, backend


class InputError(ExecutionError, ValueError):
    """An input has the wrong name, index, type or shape (LiteRT's ``set_tensor`` raises ValueError)."""


class CacheError(DelegateError, RuntimeError):
    """The kernel cache directory is unsafe or unusable."""

    exit_code = 9


class MeasurementError(DelegateError):
    """A measurement could not be made reliably: unstable over repeats, or outside physical bounds."""

    exit_code = 11


class DatasetError(DelegateError, ValueError):
    """A dataset is missing, unreadable or does not fit the model (names the file and sample), or a ``map``
    output directory holds files it must not overwrite."""

    exit_code = 12
