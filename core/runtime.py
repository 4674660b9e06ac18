"""Executes a placement plan: partitions in order, tensors resident where they were produced.

A value moves only when a partition on another backend needs it, and then once
per inference per destination; graph outputs come back to the host at the end.
A model's state beyond its tensors (resource variables, CALL_ONCE) lives in one
ModelState, active while the model's partitions run.
Nothing a backend returns is trusted: every value crossing a partition boundary
must have its tensor's shape and dtype (a kernel downstream would read past a
short buffer), and a plugin's compile() and run() have a time limit.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .backend import HOST, Backend, CompiledPartition, CompileOptions, Partition
from .errors import DelegateError, ExecutionError
from .ir import Model, Subgraph, Tensor

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


class running:
    """Make ``state`` the one kernels see (``active_state``) while its model's partitions run (a class, not
    a generator: it is entered every run, and costs a third as much)."""

    def __init__(self, state: ModelState | None):
        self.state = state

    def __enter__(self) -> None:
        self.token = _ACTIVE.set(self.state)

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.reset(self.token)


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
                 state: ModelState | None = None, watchdogs: Mapping[str, "Watchdog"] | None = None):
        """``state`` is the model instance's (a Session's); by default the graph alone, as its own model.
        ``watchdogs``: per backend, the time limit its partitions run under."""
        self.state = state if state is not None else ModelState(Model([graph]))
        self.graph = graph
        self.watchdogs = dict(watchdogs or {})
        self.partitions = list(partitions)
        self.backends = dict(backends)
        # whose values are host arrays: the host backend's, or "" (host memory) in a plan without one
        self.host = next((name for name, b in self.backends.items() if b.role == HOST), "")
        self.options = options
        self.compiled = list(compiled) if compiled is not None else [
            self.backends[p.backend].compile(p, options) for p in self.partitions]
        self.transfers_last_run = 0
        self._hinted: dict[int, tuple[CompiledPartition, frozenset[int]]] = {}  # position -> what it was told
        self._reads_key: tuple | None = None  # (wanted outputs, partitions) the host reads below were found for
        self._reads: list[frozenset[int]] = []  # per partition: its outputs the host reads
        self.runs = 0  # runs started; the last one's outputs it did not return stay fetchable (fetch)
        self._unread: dict[int, tuple[Tensor, dict[str, Any] | None]] = {}
        self._made_by: Mapping[int, Partition] = {}
        self._outputs = frozenset(t.index for t in graph.outputs)
        self.owned_last_run: frozenset[int] = frozenset()  # outputs of the last run its caller may keep uncopied

    def run(self, inputs: Mapping[int, np.ndarray], outputs: frozenset[int] | None = None) -> dict[int, np.ndarray]:
        """Run once; ``inputs`` maps graph input tensor index -> host array.  ``outputs``: the graph outputs
        to return (tensor indices; None: all): the others are neither returned nor read back from a device."""
        with running(self.state):
            self.runs += 1
            self._unread = {}
            self._hint_reads(self.graph_outputs() if outputs is None else outputs)
            return self._run(inputs, outputs)

    def graph_outputs(self) -> frozenset[int]:
        return self._outputs

    def _hint_reads(self, wanted: frozenset[int]) -> None:
        """Tell each partition which of its outputs the host reads: the ``wanted`` graph outputs and what a
        partition on another backend consumes (a value staying on one backend is never read back)."""
        key = (wanted, tuple(map(id, self.partitions)), tuple(map(id, self.compiled)))
        if key == self._reads_key:
            return  # every partition was told, as it is now
        if key[:2] != (self._reads_key or ())[:2]:
            consumers: dict[int, set[str]] = {}
            for part in self.partitions:
                for t in part.inputs:
                    consumers.setdefault(t.index, set()).add(part.backend)
            self._reads = [frozenset(t.index for t in part.outputs
                                     if t.index in wanted or consumers.get(t.index, set()) - {part.backend})
                           for part in self.partitions]
        for i, (part, compiled, reads) in enumerate(zip(self.partitions, self.compiled, self._reads)):
            if self._hinted.get(i) != (compiled, reads):
                hint = getattr(compiled, "read_hint", None)  # a plugin's own class may not derive from the contract
                try:
                    if hint is not None:
                        hint(reads)
                except Exception as exc:
                    raise partition_failure(part, f"read_hint() raised {type(exc).__name__}: {exc}") from exc
                self._hinted[i] = (compiled, reads)
        self._reads_key = key

    def _run(self, inputs: Mapping[int, np.ndarray], wanted: frozenset[int] | None = None) -> dict[int, np.ndarray]:
        # location: tensor index -> {backend name: value}
        where: dict[int, dict[str, Any]] = {i: {self.host: np.asarray(v)} for i, v in inputs.items()}
        made_by: dict[int, Partition] = {}  # tensor index -> the partition that returned it
        owned: set[int] = set()  # host values a partition made for this run alone (``outputs_owned``)
        transfers = 0
        for part, compiled in zip(self.partitions, self.compiled):
            backend = self.backends[part.backend]
            args = {}
            for t in part.inputs:
                copies = where.get(t.index)
                if copies is None:
                    why = ("no op makes it and the model gives it no data (an empty buffer)"
                           if t.producer is None else "it was never produced")
                    raise ExecutionError(f"tensor {t.index} ({t.name!r}) is needed by partition {part.index} "
                                         f"but has no value: {why}")
                if part.backend not in copies:
                    host = self._to_host(t, copies, made_by)
                    copies[part.backend] = backend.to_device(host)
                    transfers += 1
                args[t.index] = copies[part.backend]
            try:
                watchdog = self.watchdogs.get(part.backend)
                results = watchdog.call(compiled.run, args) if watchdog else compiled.run(args)
            except DelegateError:
                raise
            except Exception as exc:
                raise partition_failure(part, f"{type(exc).__name__}: {exc}") from exc
            if type(results) is not dict and not isinstance(results, Mapping):  # an ABC check costs ~0.3 us
                raise partition_failure(part, f"run() returned {type(results).__name__}, not a mapping of tensor "
                                              f"index to value")
            owns = part.backend == self.host and getattr(compiled, "outputs_owned", False)  # contract or not
            for t in part.outputs:
                if t.index not in results:
                    raise partition_failure(part, f"it did not return tensor {t.index} ({t.name!r})")
                value = results[t.index]
                if isinstance(value, np.ndarray):
                    check_value(part, t, value)
                where[t.index] = {part.backend: value}
                made_by[t.index] = part
                if owns:
                    owned.add(t.index)
        out = {}
        for t in self.graph.outputs:
            if wanted is not None and t.index not in wanted:
                self._unread[t.index] = (t, where.get(t.index))
                continue
            if self.host not in where.get(t.index, {self.host: None}):
                transfers += 1
            out[t.index] = self._output(t, where.get(t.index), made_by)
        self._made_by = made_by
        self.transfers_last_run = transfers
        self.owned_last_run = frozenset(owned.intersection(out))
        return out

    def _output(self, t: Tensor, copies: dict[str, Any] | None, made_by: Mapping[int, Partition]) -> np.ndarray:
        if copies is None:
            if t.data is not None:
                return np.asarray(t.data)
            raise ExecutionError(f"graph output {t.index} ({t.name!r}) was never produced")
        return self._to_host(t, copies, made_by)

    def fetch(self, index: int) -> np.ndarray:
        """Graph output ``index`` of the last run, which did not return it: read back now from where that run
        left it (valid until the next run, like the outputs ``run`` returns)."""
        if index not in self._unread:
            raise ExecutionError(f"tensor {index} is not an output the last run left unread")
        t, copies = self._unread.pop(index)
        return self._output(t, copies, self._made_by)

    def _to_host(self, t: Tensor, copies: dict[str, Any], made_by: Mapping[int, Partition]) -> np.ndarray:
        if self.host in copies:
            return copies[self.host]
        name, value = next(iter(copies.items()))
        part = made_by[t.index]
        try:
            host = np.asarray(self.backends[name].to_host(value))
        except DelegateError:
            raise
        except Exception as exc:
            raise partition_failure(part, f"its value of tensor {t.index} ({t.name!r}) did not come back: "
                                          f"{type(exc).__name__}: {exc}") from exc
        check_value(part, t, host)
        copies[self.host] = host
        return host

    def reset_state(self) -> None:
        """Every partition's variable tensors back to their initial values."""
        for compiled in self.compiled:
            compiled.reset_state()

    def close(self) -> None:
        for b in self.backends.values():
            b.close()


def check_value(part: Partition, t: Tensor, value: np.ndarray) -> None:
    """A value ``part`` returned for ``t`` has exactly its shape and dtype; anything else is its failure."""
    dtype = t.dtype.numpy
    if tuple(value.shape) != tuple(t.shape) or (dtype is not None and value.dtype != dtype):
        want = f"{list(t.shape)} {dtype if dtype is not None else t.dtype.name}"
        raise partition_failure(part, f"it returned tensor {t.index} ({t.name!r}) as {list(value.shape)} "
                                      f"{value.dtype}; the model says {want}")


def partition_failure(part: Partition, what: str) -> ExecutionError:
    """The error of partition ``part`` failing, with the partition and its backend as fields (fallback reads them)."""
    return ExecutionError(f"partition {part.index} on {part.backend} failed: {what}", partition=part.index,
                          backend=part.backend)


class Watchdog:
    """Runs a plugin's calls on one helper thread of its own and stops waiting after ``seconds``.

    A call that does not return in time cannot be stopped from Python: its thread is left behind
    (a daemon, so it never keeps the process alive) and the next call gets a new one."""

    def __init__(self, backend: str, seconds: float, key: str):
        self.backend, self.seconds, self.key = backend, seconds, key
        self._jobs: queue.SimpleQueue | None = None

    def call(self, fn: Callable[..., Any], *args: Any, what: str = "run()") -> Any:
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(self._jobs,), name=f"delegate-{self.backend}", daemon=True).start()
        done: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs.put((fn, args, done))
        try:
            ok, result = done.get(timeout=self.seconds)
        except queue.Empty:
            self._jobs = None  # that thread is stuck; abandon it
            raise TimeoutError(f"backend {self.backend!r}: {what} did not finish within {self.seconds:g} s "
                               f"(limits.{self.key})") from None
        if not ok:
            raise result
        return result


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        fn, args, done = jobs.get()
        try:
            done.put((True, fn(*args)))
        except BaseException as exc:  # handed to the caller, who raises it
            done.put((False, exc))
        # nothing of this call stays referenced while waiting for the next: the caller's arrays among
        # the arguments are the caller's again (the Interpreter refuses to run while its buffers are viewed)
        del fn, args, done
