"""YAML configuration: load, validate with errors that point at a line, resolve per model.

A config is layered: the packaged defaults (``default_config.yaml``, the same
text as ``configs/edge.yaml``), then the user's file, then ``--set`` overrides,
then ``--backends``.  Mappings merge key by key; anything else, lists included,
is replaced.  Every key and list item remembers where it came from (file and
line, or the override), so the single JSON Schema validation of the merged
document can name the file, key path and line of whatever is wrong.
"""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple

import yaml

from .backend import CompileOptions
from .config_schema import GLOBAL_SETTINGS, MODEL_SETTINGS, installed_schema
from .errors import ConfigError
from .planner import Rule

if TYPE_CHECKING:
    import jsonschema

DEFAULTS_RESOURCE = "default_config.yaml"
ZOO_PREFIX = "zoo:"

KeyPath = tuple  # str keys and int list indices, e.g. ("models", 1, "precision")


# -- where values come from -----------------------------------------------------------

class Place(NamedTuple):
    """Where a key or list item was written: a file and line, or an override (no line)."""

    source: str
    line: int | None
    base_dir: str  # what a relative path written there is relative to


def key_path(path: Iterable[Any]) -> str:
    """``("models", 1, "precision")`` -> ``models[1].precision``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


class Document:
    """A config document plus the place of every key path in it."""

    def __init__(self, data: dict[str, Any], places: dict[KeyPath, Place]):
        self.data, self.places = data, places

    def place(self, path: KeyPath) -> Place:
        for end in range(len(path), -1, -1):
            if path[:end] in self.places:
                return self.places[path[:end]]
        raise LookupError(path)  # the root always has a place

    def error(self, path: KeyPath, message: str) -> ConfigError:
        where = self.place(path)
        return ConfigError(message, file=where.source, key=key_path(path) or None, line=where.line)

    def assign(self, path: KeyPath, value: Any, places: dict[KeyPath, Place]) -> None:
        """Put ``value`` at ``path``: merged into a mapping already there, else replacing it.

        Missing mappings on the way are created; ``places`` says where the value came from.
        """
        origin = places[path]
        parent: Any = self.data
        for depth, part in enumerate(path[:-1]):
            self._check_step(origin, path[:depth], parent, part)
            if isinstance(parent, dict) and part not in parent:
                parent[part] = {}
                self.places[path[:depth + 1]] = origin
            parent = parent[part]
        current = self.data
        if path:
            self._check_step(origin, path[:-1], parent, path[-1])
            current = parent[path[-1]] if isinstance(parent, list) else parent.get(path[-1])
        if isinstance(value, dict) and isinstance(current, dict):
            _merge(current, value)
        else:
            parent[path[-1]] = value
        self.places.update(places)

    @staticmethod
    def _check_step(origin: Place, at: KeyPath, container: Any, part: Any) -> None:
        """Refuse to step from ``container`` (at ``at``) into ``part``; the override is to blame."""
        if isinstance(container, dict) and isinstance(part, str):
            return
        if isinstance(container, list) and isinstance(part, int):
            if part < len(container):
                return
            problem = f"has no item [{part}] (it has {len(container)})"
        elif isinstance(container, (dict, list)):
            problem = "is a list; index it like [0]" if isinstance(container, list) else "is a mapping; index it by key"
        else:
            problem = f"is {_describe(container)}, which has no {key_path((part,))}"
        raise ConfigError(problem, file=origin.source, key=key_path(at) or None, line=origin.line)


def _merge(base: dict[str, Any], top: dict[str, Any]) -> None:
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


# -- YAML with places -----------------------------------------------------------------

_MAP, _SEQ, _MERGE = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq", "tag:yaml.org,2002:merge"
MAX_NODES = 100_000  # aliases can make a short text expand exponentially
MAX_CONFIG_BYTES = 1 << 20  # read before parsing: YAML's composer takes seconds and memory per megabyte


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``1e-9`` as a number, as YAML 1.2 does (1.1 wants ``1.0e-9``)."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
                              list("-+0123456789."))


def parse_yaml(text: str, source: str, base_dir: str, at: KeyPath = (),
               with_lines: bool = True) -> tuple[Any, dict[KeyPath, Place]]:
    """Parse one YAML document into plain data, recording the place of every key and item.

    Keys must be strings and may not repeat; ``<<`` merge keys and aliases work.
    ``with_lines=False`` is for override values, whose lines mean nothing to the user.
    """
    places: dict[KeyPath, Place] = {at: Place(source, 1 if with_lines else None, base_dir)}
    budget = [MAX_NODES]
    inherited_pairs: dict[int, int] = {}  # mapping node -> how many pairs came from << merges

    def here(node: yaml.Node) -> int | None:
        return node.start_mark.line + 1 if with_lines else None

    def fail(node: yaml.Node, path: KeyPath, message: str) -> ConfigError:
        return ConfigError(message, file=source, key=key_path(path) or None, line=here(node))

    def scalar(node: yaml.ScalarNode, path: KeyPath) -> Any:
        try:
            value = loader.construct_object(node)
        except yaml.YAMLError:
            raise
        except Exception as exc:  # PyYAML's constructors raise built-in errors on values
            # they half-recognise: a date like 2024-13-45, `!!bool maybe`, `!!int ""`
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            reason = f" ({exc})" if isinstance(exc, ValueError) else ""
            raise fail(node, path, f"cannot read {node.value!r} as {tag}{reason}; quote it for text") from None
        if isinstance(value, float) and math.isnan(value):
            raise fail(node, path, "NaN is not a usable value here")
        return value

    def build(node: yaml.Node, path: KeyPath, active: frozenset[int]) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise fail(node, path, f"more than {MAX_NODES} values once aliases are expanded")
        if id(node) in active:
            raise fail(node, path, "an alias refers to the collection that contains it")
        inner = active | {id(node)}
        if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ:
            items = []
            for i, item in enumerate(node.value):
                places[path + (i,)] = Place(source, here(item), base_dir)
                items.append(build(item, path + (i,), inner))
            return items
        if isinstance(node, yaml.MappingNode) and node.tag == _MAP:
            return mapping(node, path, inner)
        if isinstance(node, yaml.ScalarNode):
            return scalar(node, path)
        raise fail(node, path, f"the YAML tag {node.tag} is not supported")

    def mapping(node: yaml.MappingNode, path: KeyPath, active: frozenset[int]) -> dict[str, Any]:
        if id(node) not in inherited_pairs:  # an aliased mapping is flattened once
            written = sum(1 for key, _ in node.value if key.tag != _MERGE)
            loader.flatten_mapping(node)  # merged pairs first, the ones written here last
            inherited_pairs[id(node)] = len(node.value) - written
        result: dict[str, Any] = {}
        written_at: dict[str, int | None] = {}
        for n, (key_node, value_node) in enumerate(node.value):
            if not isinstance(key_node, yaml.ScalarNode):
                raise fail(key_node, path, "a key must be plain text, not a list or mapping")
            key = scalar(key_node, path)
            if not isinstance(key, str):
                raise fail(key_node, path, f"key {key_node.value!r} must be text "
                           f"(it reads as {_describe(key)}; quote it)")
            sub = path + (key,)
            if n >= inherited_pairs[id(node)]:  # a key written here may override a merged one, not repeat
                if key in written_at:
                    raise fail(key_node, sub, f"duplicate key {key!r}{_lines(written_at[key], here(key_node))}")
                written_at[key] = here(key_node)
            places[sub] = Place(source, here(key_node), base_dir)
            result[key] = build(value_node, sub, active)
        return result

    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is not None:
            places[at] = Place(source, here(node), base_dir)
        data = None if node is None else build(node, at, frozenset())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = f"invalid YAML (column {mark.column + 1})" if mark else "invalid YAML"
        message += f": {exc.problem or exc.context}"
        if exc.problem and exc.context:
            started = exc.context_mark is not None and with_lines
            message += f" ({exc.context}{f' from line {exc.context_mark.line + 1}' if started else ''})"
        raise ConfigError(message, file=source, line=mark.line + 1 if mark and with_lines else None) from None
    except yaml.reader.ReaderError as exc:
        raise ConfigError(f"invalid character U+{exc.character:04X} ({exc.reason})", file=source,
                          line=text.count("\n", 0, exc.position) + 1 if with_lines else None) from None
    except RecursionError:
        raise ConfigError("collections nested too deeply", file=source) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, places


def _lines(first: int | None, again: int | None) -> str:
    if first is None:
        return ""
    return f" (twice on line {first})" if first == again else f" (first at line {first}, again at line {again})"


def read_document(path: str) -> Document:
    """Read and parse a config file; an empty one is an empty mapping."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError("no such config file", file=path) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a YAML config file", file=path) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=path) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"is over {MAX_CONFIG_BYTES // 1024} KiB; a config is a few keys, not data", file=path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=path,
                          line=raw.count(b"\n", 0, exc.start) + 1) from None
    data, places = parse_yaml(text, path, os.path.dirname(os.path.abspath(path)))
    if data is None:
        return Document({}, places)
    if not isinstance(data, dict):
        raise ConfigError(f"the top level must be a mapping of keys, not {_describe(data)}", file=path,
                          line=places[()].line)
    return Document(data, places)


@lru_cache(maxsize=1)
def _defaults() -> Document:
    resource = resources.files(__package__).joinpath(DEFAULTS_RESOURCE)
    with resources.as_file(resource) as path:
        return read_document(str(path))


# -- overrides ------------------------------------------------------------------------

_KEY = re.compile(r"[A-Za-z_][\w-]*(\[\d+\])*(\.[A-Za-z_][\w-]*(\[\d+\])*)*")


def parse_key(text: str, source: str) -> KeyPath:
    """``models[0].precision`` -> ``("models", 0, "precision")``."""
    if not _KEY.fullmatch(text):
        raise ConfigError("expected KEY=VALUE with KEY like precision, serialization.dir or "
                          "models[0].precision", file=source)
    return tuple(int(index) if index else name for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", text))


def apply_set(doc: Document, override: str) -> tuple[KeyPath, Any]:
    """Apply one ``--set KEY=VALUE``; VALUE is YAML (``fp16``, ``[cpu]``, ``{enabled: true}``).  Returns the
    key path and the value set."""
    key, sep, value_text = override.partition("=")
    key = key.strip()
    source = f"--set {key}".strip()
    if not sep:
        raise ConfigError(f"{override!r} has no '='; expected KEY=VALUE", file=source)
    path = parse_key(key, source)
    value, places = parse_yaml(value_text, source, os.getcwd(), at=path, with_lines=False)
    doc.assign(path, value, places)
    return path, value


def apply_backends(doc: Document, names: str) -> None:
    """``--backends a,b,c`` replaces ``backends`` everywhere, keeping options given for a name."""
    source = "--backends"
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    if not wanted:
        raise ConfigError("needs at least one backend name, e.g. --backends opencl,cpu", file=source)
    current = doc.data.get("backends")
    with_options = {entry["name"]: i for i, entry in enumerate(current) if isinstance(entry, dict)
                    and isinstance(entry.get("name"), str)} if isinstance(current, list) else {}
    place = Place(source, None, os.getcwd())
    entries, places = [], {("backends",): place}
    for i, name in enumerate(wanted):
        old = with_options.get(name)
        entries.append(name if old is None else copy.deepcopy(current[old]))
        if old is not None:  # its options keep pointing at the lines they were written on
            places.update({("backends", i) + p[2:]: where for p, where in doc.places.items()
                           if p[:2] == ("backends", old)})
        places[("backends", i)] = place
    doc.assign(("backends",), entries, places)
    for model in doc.data.get("models") or []:
        if isinstance(model, dict):
            model.pop("backends", None)


# -- validation -----------------------------------------------------------------------

def _is_integer(_checker: Any, value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(_checker: Any, value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@lru_cache(maxsize=1)
def validator() -> jsonschema.protocols.Validator:
    """The validator of the schema with the installed plugins' backend options (built on first use: jsonschema,
    its dependencies and the compiled schema take ~11 MB, which a run of the built-in defaults never needs)."""
    import jsonschema

    checker = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many({"integer": _is_integer,
                                                                          "number": _is_number})
    return jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=checker)(installed_schema())


_TYPE_NAMES = {"object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "true or false", "null": "null"}


def _show(value: Any) -> str:
    """A value as YAML would spell it, shortened."""
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    text = repr(value) if isinstance(value, (str, int, float)) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _describe(value: Any) -> str:
    """A value with its kind, for type errors."""
    if isinstance(value, (dict, list)) or value is None:
        return _show(value)
    kind = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(type(value), type(value).__name__)
    return f"{kind} {_show(value)}"


def _unknown_key(error: jsonschema.ValidationError) -> tuple[KeyPath, str]:
    allowed = list(error.schema.get("properties", {}))
    path = tuple(error.absolute_path)
    key = next(k for k in error.instance if k not in allowed)
    if len(path) == 2 and path[0] == "models" and key in GLOBAL_SETTINGS:
        return path + (key,), f"{key!r} can only be set at the top level, not per model"
    import difflib  # only for a misspelt key: kept out of every load's imports

    close = difflib.get_close_matches(str(key), allowed, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"valid keys here: {', '.join(allowed)}"
    return path + (key,), f"unknown key {key!r}; {hint}"


def _message(error: jsonschema.ValidationError) -> str:
    kind, expected, value = error.validator, error.validator_value, error.instance
    if kind == "type":
        types = [expected] if isinstance(expected, str) else expected
        hint = " (quote it to make it a string)" if "string" in types and not isinstance(
            value, (dict, list)) else ""
        return f"expected {' or '.join(_TYPE_NAMES[t] for t in types)}, got {_describe(value)}{hint}"
    if kind == "enum":
        return f"{_show(value)} is not one of: {', '.join(map(str, expected))}"
    if kind == "required":
        return f"missing required key {next(k for k in expected if k not in value)!r}"
    bounds = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<="}
    if kind in bounds:
        return f"must be {bounds[kind]} {expected}, got {_show(value)}"
    if kind in ("minItems", "maxItems"):
        return f"needs {'at least' if kind == 'minItems' else 'at most'} {expected} item(s), got {len(value)}"
    if kind == "minLength":
        return "must not be empty"
    if kind == "uniqueItems":
        return "lists the same item twice"
    if "errorMessage" in error.schema:
        return error.schema["errorMessage"]
    return error.message.splitlines()[0]


# Keywords of a section every key of which is optional, and of a scalar checked on its own.
_SECTION_KEYWORDS = {"$schema", "title", "type", "additionalProperties", "properties"}
_SCALAR_KEYWORDS = {"type", "enum", "minimum", "maximum", "exclusiveMinimum", "minLength"}
_SCALAR_TYPES = {"string": str, "boolean": bool, "null": type(None)}


def _has_type(value: Any, name: str) -> bool:
    if name in ("integer", "number"):
        return (_is_integer if name == "integer" else _is_number)(None, value)
    return name in _SCALAR_TYPES and isinstance(value, _SCALAR_TYPES[name])


def plainly_valid(path: KeyPath, value: Any) -> bool:
    """Whether setting ``value`` at ``path`` of a valid document surely leaves it valid: every mapping on the
    way is a section of optional keys and the value passes its own type, enum and bounds.  A run of the
    built-in defaults with such ``--set`` values needs no jsonschema (4 MB resident with its dependencies);
    False sends the document through the full validation and its messages."""
    schema = installed_schema()
    for key in path:
        if (not isinstance(key, str) or set(schema) - _SECTION_KEYWORDS or schema.get("type") != "object"
                or schema.get("additionalProperties") is not False or key not in schema.get("properties", {})):
            return False
        schema = schema["properties"][key]
    if set(schema) - _SCALAR_KEYWORDS:
        return False
    types = schema.get("type", [])
    if types and not any(_has_type(value, t) for t in ([types] if isinstance(types, str) else types)):
        return False
    if "enum" in schema and not any(type(value) is type(choice) and value == choice for choice in schema["enum"]):
        return False
    if _is_number(None, value):
        low, high, above = schema.get("minimum"), schema.get("maximum"), schema.get("exclusiveMinimum")
        if ((low is not None and not value >= low) or (high is not None and not value <= high)
                or (above is not None and not value > above)):
            return False
    return not isinstance(value, str) or len(value) >= schema.get("minLength", 0)


def validate_document(doc: Document, schema: bool = True) -> None:
    """Raise a ConfigError for the first problem in the merged document, in file order (``schema`` False:
    the checks beyond the schema only, for a document known to meet it)."""
    problems = []
    for error in validator().iter_errors(doc.data) if schema else ():
        if error.validator == "additionalProperties":
            path, message = _unknown_key(error)
        else:
            path, message = tuple(error.absolute_path), _message(error)
        line = doc.place(path).line
        # file order; overrides (no line) first; the deepest problem of a line (an unknown key
        # rather than the missing key it was meant to be)
        problems.append(((line is not None, line or 0, -len(path)), path, message))
    if problems:
        _, path, message = min(problems, key=lambda p: p[0])
        raise doc.error(path, message)
    scopes = [((), doc.data)] + [(("models", i), m) for i, m in enumerate(doc.data["models"])]
    for at, scope in scopes:
        lo_hi = (scope.get("input") or {}).get("range")
        if lo_hi is not None and not lo_hi[0] < lo_hi[1]:
            raise doc.error(at + ("input", "range"), f"must be [lo, hi] with lo < hi, got {lo_hi}")
        seen: set[str] = set()
        for i, entry in enumerate(scope.get("backends") or []):
            name = entry if isinstance(entry, str) else entry["name"]
            if name in seen:
                raise doc.error(at + ("backends", i), f"backend {name!r} is listed twice")
            seen.add(name)


# -- typed result ---------------------------------------------------------------------

class Section(Mapping):
    """A typed section that also reads like its YAML mapping, without the keys left null.

    ``section.dir`` and ``section.get("dir")`` both work; ``dict(section)`` holds
    only what is set, so a null threshold is simply absent.
    """

    def __getitem__(self, key: str) -> Any:
        if key not in self._names() or getattr(self, key) is None:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return (name for name in self._names() if getattr(self, name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class BackendChoice(Section):
    """One ``backends`` entry: the backend's name and the options its factory receives."""

    name: str
    options: Mapping[str, Any]


@dataclass(frozen=True)
class Serialization(Section):
    """Compiled-kernel cache: off while ``dir`` is None."""

    dir: str | None
    model_token: str | None


@dataclass(frozen=True)
class Limits(Section):
    """What one session may use: memory for its tensors (null: the machine's), and seconds a plugin's
    compile() or run() may take before it counts as failed (null: no limit)."""

    memory_mb: float | None = None
    compile_timeout_s: float | None = 1200.0
    run_timeout_s: float | None = 300.0

    def memory_bytes(self) -> int:
        return int(self.memory_mb * 2**20) if self.memory_mb is not None else machine_memory()


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's, or when lower its cgroup's limit, or what its
    address-space limit (``ulimit -v``) leaves beside what it has mapped already (a model planning 12 GiB under a
    4 GiB limit otherwise ended in numpy's MemoryError where the budget's one-line refusal was due)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        total = 1 << 40
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            total = min(total, max(soft - _mapped_bytes(), 0))
    except (ImportError, ValueError, OSError):
        pass
    return total


def _mapped_bytes() -> int:
    """This process's address space in use (VmSize), 0 where the system does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass(frozen=True)
class AccuracyGuard(Section):
    enabled: bool
    max_abs_error: float | None
    max_rel_error: float | None


@dataclass(frozen=True)
class Placement(Section):
    """How the plan is chosen: from estimates, or by timing candidate plans (see plan_search)."""

    search: str
    budget_s: float
    host_first: bool


@dataclass(frozen=True)
class InputSpec(Section):
    """Image preprocessing: mean/std when set, else 0..255 mapped onto ``range``."""

    mean: float | tuple[float, ...] | None
    std: float | tuple[float, ...] | None
    range: tuple[float, float]
    color: str
    layout: str


@dataclass(frozen=True)
class Thresholds(Section):
    max_abs_error: float | None
    max_rel_error: float | None
    min_cosine: float | None


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every setting of a run; a ModelConfig holds them resolved for one model."""

    backends: tuple[BackendChoice, ...]
    precision: str
    allow_quantized: bool
    inference_preference: str
    partitioner: str
    placement: Placement
    max_delegated_partitions: int
    min_nodes_per_partition: int
    pin: tuple[Rule, ...]
    deny: tuple[Rule, ...]
    serialization: Serialization
    fallback: bool
    num_threads: int | None
    limits: Limits
    accuracy_guard: AccuracyGuard
    cpu: Mapping[str, Any]  # the host backend's options, as its plugin declares them
    input: InputSpec
    validate: Thresholds
    disable_plugins: tuple[str, ...]
    concurrency: str
    executor: str

    def compile_options(self) -> CompileOptions:
        """What backends compile with; ``num_threads: null`` becomes the usable core count."""
        return CompileOptions(precision=self.precision, allow_quantized=self.allow_quantized,
                              inference_preference=self.inference_preference,
                              num_threads=self.num_threads or available_cores(),
                              cache_dir=self.serialization.dir, model_token=self.serialization.model_token)

    def settings(self) -> dict[str, Any]:
        """Just the Settings fields: what a ModelConfig starts from."""
        return {f.name: getattr(self, f.name) for f in fields(Settings)}

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``--json`` output."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class ModelConfig(Settings):
    """The settings of one model: its section over the top level."""

    path: str
    name: str


@dataclass(frozen=True, kw_only=True)
class Config(Settings):
    """A loaded configuration: top-level settings and the resolved ``models:`` sections."""

    models: tuple[ModelConfig, ...]
    source: str | None

    def for_model(self, which: int | str) -> ModelConfig:
        """A ``models:`` entry by index, name or path; any other path runs with the top level."""
        if isinstance(which, int):
            if not 0 <= which < len(self.models):
                raise ConfigError(f"no such model section; the config has {len(self.models)}",
                                  file=self.source, key=f"models[{which}]")
            return self.models[which]
        for model in self.models:
            if which in (model.name, model.path) or _same_file(which, model.path):
                return model
        return ModelConfig(**self.settings(), path=which, name=model_name(which))


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


def model_name(path: str) -> str:
    """``zoo:posenet`` -> ``posenet``; ``models/det.tflite`` -> ``det``."""
    if path.startswith(ZOO_PREFIX):
        return path[len(ZOO_PREFIX):]
    return os.path.splitext(os.path.basename(path))[0]


def _same_file(a: str, b: str) -> bool:
    return not (a.startswith(ZOO_PREFIX) or b.startswith(ZOO_PREFIX)) and os.path.abspath(a) == os.path.abspath(b)


def _resolve_path(doc: Document, path: KeyPath) -> str | None:
    """Expand ~ and $VARS; a relative path is relative to where it was written."""
    value = _get(doc.data, path)
    if value is None or value.startswith(ZOO_PREFIX):
        return value
    shell_form = re.search(r"\$\{\w+[^\w}][^}]*\}?", value)
    if shell_form:
        raise doc.error(path, f"{shell_form.group(0)}: only $NAME and ${{NAME}} are expanded, "
                              f"not shell defaults or other forms")
    expanded = os.path.expanduser(os.path.expandvars(value))
    unset = re.search(r"\$\{?(\w+)", expanded)
    if unset:
        raise doc.error(path, f"environment variable {unset.group(1)} is not set")
    return os.path.normpath(os.path.join(doc.place(path).base_dir, expanded))


def _get(data: Any, path: KeyPath) -> Any:
    for part in path:
        data = data[part]
    return data


def _floats(value: Any) -> Any:
    """YAML numbers as floats, a list of them as a tuple; null stays None."""
    if value is None:
        return None
    if isinstance(value, list):
        return tuple(float(v) for v in value)
    return float(value)


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    """Typed fields from a validated mapping that has every key."""
    def thresholds(section: dict[str, Any]) -> dict[str, Any]:
        return {k: v if isinstance(v, bool) else _floats(v) for k, v in section.items()}

    inp = values["input"]
    return dict(
        values, pin=tuple(Rule(**r) for r in values["pin"]), deny=tuple(Rule(**r) for r in values["deny"]),
        backends=tuple(BackendChoice(b, {}) if isinstance(b, str) else BackendChoice(b["name"], b.get("options", {}))
                       for b in values["backends"]),
        serialization=Serialization(**values["serialization"]),
        limits=Limits(**{k: None if v is None else float(v) for k, v in values["limits"].items()}),
        accuracy_guard=AccuracyGuard(**thresholds(values["accuracy_guard"])),
        cpu=dict(values["cpu"]),
        placement=Placement(search=values["placement"]["search"], budget_s=float(values["placement"]["budget_s"]),
                            host_first=bool(values["placement"]["host_first"])),
        input=InputSpec(mean=_floats(inp["mean"]), std=_floats(inp["std"]), range=_floats(inp["range"]),
                        color=inp["color"], layout=inp["layout"]),
        validate=Thresholds(**thresholds(values["validate"])),
        disable_plugins=tuple(values["disable_plugins"]))


def build_config(doc: Document, source: str | None) -> Config:
    """The typed Config of a validated document; model sections inherit the top level."""
    data = copy.deepcopy(doc.data)
    data["serialization"]["dir"] = _resolve_path(doc, ("serialization", "dir"))
    top = {k: v for k, v in data.items() if k != "models"}
    models, names = [], {}
    for i, section in enumerate(data["models"]):
        at = ("models", i)
        section["path"] = _resolve_path(doc, at + ("path",))
        if "dir" in section.get("serialization", {}):
            section["serialization"]["dir"] = _resolve_path(doc, at + ("serialization", "dir"))
        name = section.pop("name", None) or model_name(section["path"])
        if name in names:
            raise doc.error(at + ("name",) if at + ("name",) in doc.places else at + ("path",),
                            f"model name {name!r} is already used by models[{names[name]}]; "
                            "give each entry its own name")
        names[name] = i
        values = copy.deepcopy(top)
        _merge(values, {k: v for k, v in section.items() if k in MODEL_SETTINGS})
        models.append(ModelConfig(**_typed(values), path=section["path"], name=name))
    return Config(**_typed(top), models=tuple(models), source=source)


def load_config(path: str | os.PathLike | None = None, overrides: Iterable[str] = (),
                backends: str | None = None) -> Config:
    """Load ``path`` (None: the built-in edge defaults), apply overrides, validate, resolve.  The built-in
    defaults alone are not validated again (the tests validate them against the schema).

    Raises ConfigError naming the file (or ``--set KEY`` / ``--backends``), the key
    path and the line of the first problem.
    """
    defaults = _defaults()
    doc = Document(copy.deepcopy(defaults.data), dict(defaults.places))
    source = None if path is None else os.fspath(path)
    if source is not None:
        user = read_document(source)
        doc.assign((), user.data, user.places)
    settings = [apply_set(doc, override) for override in overrides]
    if backends is not None:  # keeps a valid document valid: names or entries already there
        apply_backends(doc, backends)
    if source is not None or settings or backends is not None:
        validate_document(doc, schema=source is not None or not all(plainly_valid(*s) for s in settings))
    return build_config(doc, source)

