"""Executes a placement plan: partitions in order, tensors resident where they were produced.

A value moves only when a partition on another backend needs it, and then once
per inference per destination; graph outputs come back to the host at the end.
A model's state beyond its tensors (resource variables, CALL_ONCE) lives in one
ModelState, active while the model's partitions run.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from .backend import Backend, CompiledPartition, CompileOptions, Partition
from .errors import DelegateError, ExecutionError
from .ir import Model, Subgraph

log = logging.getLogger(__name__)


class ModelState:
    """What one running instance of a model holds beyond its tensors, shared by all its subgraphs as in
    LiteRT's interpreter: resource variables by name, the CALL_ONCE initialisers that ran, and the
    subgraphs that control flow calls, compiled on first use (by the backend that calls them).

    Like LiteRT, ``reset_all_variables`` leaves resource variables alone: only variable tensors reset.
    """

    def __init__(self, model: Model):
        self.model = model
        self.resources: dict[str, np.ndarray] = {}
        self.initialised: set[int] = set()
        self.callees: dict[int, Any] = {}


_ACTIVE: contextvars.ContextVar[ModelState | None] = contextvars.ContextVar("delegate_model_state", default=None)


@contextlib.contextmanager
def running(state: ModelState | None) -> Iterator[None]:
    """Make ``state`` the one kernels see (``active_state``) while its model's partitions run."""
    token = _ACTIVE.set(state)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_state() -> ModelState:
    """The state of the model being run; kernels of resource-variable and control-flow ops read it."""
    state = _ACTIVE.get()
    if state is None:
        raise ExecutionError("resource variables and control flow run only inside a session of their model")
    return state


class Executor:
    """Compiled partitions of one subgraph, ready to run many times."""

    def __init__(self, graph: Subgraph, partitions: Sequence[Partition], backends: Mapping[str, Backend],
                 options: CompileOptions, compiled: Sequence[CompiledPartition] | None = None,
                 state: ModelState | None = None):
        """``state`` is the model instance's (a Session's); by default the graph alone, as its own model."""
        self.state = state if state is not None else ModelState(Model([graph]))
        self.graph = graph
        self.partitions = list(partitions)
        self.backends = dict(backends)
        self.options = options
        self.compiled = list(compiled) if compiled is not None else [
            self.backends[p.backend].compile(p, options) for p in self.partitions]
        self.transfers_last_run = 0

    def run(self, inputs: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Run once; ``inputs`` maps graph input tensor index -> host array."""
        with running(self.state):
            return self._run(inputs)

    def _run(self, inputs: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        # location: tensor index -> {backend name: value}
        where: dict[int, dict[str, Any]] = {i: {"cpu": np.asarray(v)} for i, v in inputs.items()}
        transfers = 0
        for part, compiled in zip(self.partitions, self.compiled):
            backend = self.backends[part.backend]
            args = {}
            for t in part.inputs:
                copies = where.get(t.index)
                if copies is None:
                    raise ExecutionError(f"tensor {t.index} ({t.name!r}) is needed by partition {part.index} "
                                         f"but was never produced or given")
                if part.backend not in copies:
                    host = self._to_host(t.index, copies)
                    copies[part.backend] = backend.to_device(host)
                    transfers += 1
                args[t.index] = copies[part.backend]
            try:
                results = compiled.run(args)
            except DelegateError:
                raise
            except Exception as exc:
                raise ExecutionError(f"partition {part.index} on {part.backend} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
            for idx, value in results.items():
                where[idx] = {part.backend: value}
        out = {}
        for t in self.graph.outputs:
            copies = where.get(t.index)
            if copies is None:
                if t.data is not None:
                    out[t.index] = np.asarray(t.data)
                    continue
                raise ExecutionError(f"graph output {t.index} ({t.name!r}) was never produced")
            if "cpu" not in copies:
                transfers += 1
            out[t.index] = self._to_host(t.index, copies)
        self.transfers_last_run = transfers
        return out

    def _to_host(self, index: int, copies: dict[str, Any]) -> np.ndarray:
        if "cpu" in copies:
            return copies["cpu"]
        name, value = next(iter(copies.items()))
        host = np.asarray(self.backends[name].to_host(value))
        copies["cpu"] = host
        return host

    def reset_state(self) -> None:
        """Every partition's variable tensors back to their initial values."""
        for compiled in self.compiled:
            compiled.reset_state()

    def close(self) -> None:
        for b in self.backends.values():
            b.close()
