"""CPU backend plugin: numpy kernels for every op, with a memory plan computed once per partition."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import time
import weakref
from typing import Any, Collection, Mapping, Sequence

import numpy as np

from delegate.plugin_api import (HOST, Backend, BackendInfo, CompileError, CompileOptions, CompiledPartition,
                                 DeviceProfile, DType, Group, Op, Partition, Subgraph, Support, Tensor, find_groups,
                                 hookimpl, aligned_zeros, make_partition, native_stderr, plan_arena, cost_class,
                                 host_profile, op_bytes, op_flops, op_steps, static_op, static_value, STATE_OPS)

from . import registry
from .fusion import FUSIONS, fuse_ops
from .kernels.common import constant, known_at_compile_time, start_scratch_op
from .kernels.native import batched_steps, limit_team, partition_team
from .kernels.parallel import ThreadChoice, blas_threads, kernel_threads

log = logging.getLogger(__name__)


class CpuCompiled(CompiledPartition):
    """Kernels bound to preallocated buffers; ``run`` only calls them in order."""

    litert_refused: str | None = None  # why LiteRT did not take it, under engine auto

    def __init__(self, partition: Partition, custom: dict[str, registry.Factory], num_threads: int = 1,
                 native: bool = True):
        self.partition = partition
        self.timings: dict[int, list[float]] | None = None
        external = {t.index for t in partition.inputs}
        outputs = {t.index for t in partition.outputs}
        # Ops computing compile-time constants (DEQUANTIZE of float16 weights) do not run: their
        # consumers lay the values out themselves, or read them from one array computed here.
        ops = [op for op in partition.ops if not _computes_constants(op)]
        # Shape arithmetic on static shapes is computed here, once (see _static_values).
        left, self.static = _static_values(ops, outputs, custom)
        self.static_ops = [op.index for op in ops if op not in left]
        ops = left
        # Pads and activations around float kernels run inside them (see fusion.py).
        ops, self.fused = fuse_ops(ops, outputs)
        self.team = partition_team(ops, num_threads)
        kernels = [self._kernel(op, custom, num_threads, native, self.team) for op in ops]
        # Intermediates share one arena by lifetime; partition outputs get their own buffers,
        # since callers read them after the run while the arena is reused by the next one.
        intermediates = [t for op in ops for t in op.outputs if t.index not in outputs]
        self.arena, views = plan_arena(ops, [t for t in intermediates if t.dtype.numpy is not None])
        self.buffers: dict[int, np.ndarray] = {**views, **self.static}
        self.variables: list[Tensor] = []
        for t in partition.outputs + [t for t in intermediates if t.dtype.numpy is None]:
            computed = t.producer is not None and _computes_constants(t.producer)
            # strings are held as numpy object arrays of bytes
            self.buffers[t.index] = np.array(constant(t)) if computed else np.empty(t.shape, object) \
                if t.dtype.numpy is None else aligned_zeros(t.shape, t.dtype.numpy)
        self.steps = []
        for op, run in zip(ops, kernels):
            skip = getattr(run, "laid_out", frozenset())
            sources = [None if slot in skip and known_at_compile_time(t) else self._source(t, external)
                       for slot, t in enumerate(op.inputs)]
            self.steps.append((op, run, sources, [self.buffers[t.index] for t in op.outputs]))
        self.batched = batched_steps(self.steps)  # what runs (profiled runs too: see run)
        # BLAS is held to one thread during runs (see parallel.py) unless every kernel is a native call,
        # which never calls it (holding it costs ~5 us a run: two thread-count changes).
        blas = not all(getattr(run, "prepared", None) is not None and not getattr(run.prepared, "uses_blas", False)
                       for _, run, _, _ in self.steps)
        self.threading = ThreadChoice(limit_team, blas, self.team) if num_threads > 1 else \
            (lambda: blas_threads(1)) if blas else contextlib.nullcontext

    @staticmethod
    def _kernel(op: Op, custom: dict[str, registry.Factory], num_threads: int, native: bool,
                team: int) -> registry.Run:
        factory = registry.find_kernel(op, custom)
        if factory is None:
            raise CompileError(f"{op.describe()}: the cpu backend has no kernel for it")
        try:
            with kernel_threads(num_threads, native, team):
                return factory(op)
        except Exception as exc:
            raise CompileError(f"{op.describe()}: cpu kernel setup failed: {exc}") from exc

    def _source(self, t: Tensor | None, external: set[int]):
        if t is None:
            return None
        if t.is_variable:
            # State (LSTM cell/output) persists across runs; kernels update it in place.
            if t.index not in self.buffers:
                self.variables.append(t)
                self.buffers[t.index] = initial_state(t)
            return self.buffers[t.index]
        if t.index in external:
            return t.index  # filled from the run's inputs
        if t.data is not None:
            return np.asarray(t.data)
        if t.index not in self.buffers:  # a compile-time constant some kernel reads at run time
            self.buffers[t.index] = constant(t)
        return self.buffers[t.index]

    def run(self, inputs: Mapping[int, Any]) -> dict[int, Any]:
        timings = self.timings
        with self.threading():
            for op, run, sources, outs in self.batched:
                ins = [inputs[s] if isinstance(s, int) else s for s in sources]
                start_scratch_op()
                if timings is None:
                    run(ins, outs)
                elif hasattr(run, "timed"):  # a batched stretch of native calls times each of its ops
                    for timed_op, seconds in run.timed(ins, outs):
                        timings.setdefault(timed_op.index, []).append(seconds * 1e3)
                else:
                    start = time.perf_counter()
                    run(ins, outs)
                    timings.setdefault(op.index, []).append((time.perf_counter() - start) * 1e3)
        return {t.index: self.buffers[t.index] for t in self.partition.outputs}

    def op_timer(self) -> str:
        return "numpy engine kernel timers"

    def reset_state(self) -> None:
        for t in self.variables:
            self.buffers[t.index][...] = initial_state(t)

    def set_profiling(self, enabled: bool) -> None:
        """Time every op of the following runs (for ``delegate bench``'s per-op profile)."""
        self.timings = {} if enabled else None

    def profile(self) -> dict[int, float]:
        return {i: float(np.median(v)) for i, v in (self.timings or {}).items()}

    def describe(self) -> dict[str, Any]:
        described = {"engine": "numpy", "arena_bytes": int(self.arena.nbytes), "native_team": self.team,
                     "fused": {str(follower): host for follower, host in self.fused.items()},
                     "computed_at_compile_time": self.static_ops}
        if self.litert_refused:
            described["litert_refused"] = self.litert_refused
        return described


def initial_state(t: Tensor) -> np.ndarray:
    """A variable tensor's value before the first run, as LiteRT resets it: zero (the zero point for
    int8), or the tensor's own buffer where it has one."""
    if t.data is not None:
        return np.array(t.data, t.dtype.numpy).reshape(t.shape)
    zero = int(t.quantization.zero_point[0]) if t.dtype.numpy == np.int8 and t.quantization is not None else 0
    return np.full(t.shape, zero, t.dtype.numpy)


def _static_values(ops: list[Op], keep: set[int], custom) -> tuple[list[Op], dict[int, np.ndarray]]:
    """``ops`` less the shape arithmetic computed at compile time (``static_op``: a SHAPE of a static shape,
    then integer ops on such values and constants), and the values it computed (tensor index -> array), by
    this engine's kernels; none whose value a caller needs (``keep``).  Converters leave such chains (SHAPE ->
    STRIDED_SLICE -> PACK -> RESHAPE) where the source graph reshaped by a shape it read at run time; each
    would otherwise cost a Python call per run."""
    values: dict[int, np.ndarray] = {}
    left = []
    for op in ops:
        if any(t.index in keep for t in op.outputs) or not static_op(op):
            left.append(op)
            continue
        ins = [None if t is None else values[t.index] if t.index in values else static_value(t) for t in op.inputs]
        outs = [np.empty(t.shape, t.dtype.numpy) for t in op.outputs]
        try:  # values a run would compute, so what fails is the model's, as it would fail in every run
            CpuCompiled._kernel(op, custom, 1, False, 1)(ins, outs)
        except (ValueError, IndexError, OverflowError) as exc:
            raise CompileError(f"{op.describe()}: {exc}") from None
        values.update((t.index, out) for t, out in zip(op.outputs, outs))
    return left, values


def _computes_constants(op: Op) -> bool:
    """Whether every output of ``op`` is known at compile time (see ``common.constant``)."""
    return bool(op.outputs) and all(known_at_compile_time(t) for t in op.outputs)


# LiteRT partitions faster than this at the configured threads also try fewer (LitertCompiled._choose_threads),
# each timed over THREAD_TRIAL_RUNS runs on zeros after THREAD_TRIAL_WARMUP; fewer threads win only below
# THREAD_GAIN of the best so far.
SMALL_PARTITION_MS = 2.0
THREAD_TRIAL_WARMUP = 3
THREAD_TRIAL_RUNS = 9
THREAD_GAIN = 0.9


class LitertCompiled(CompiledPartition):
    """A CPU partition handed whole to LiteRT's interpreter: written out through the TFLite writer, or,
    when it is the whole model as read, the model's own bytes (no second copy of its weights, and
    none of the writer's transient ones: MobileNetV2 peaked at 130 MB instead of LiteRT's 79)."""

    outputs_owned = True  # get_tensor copies

    def __init__(self, partition: Partition, num_threads: int, try_threads: bool = False):
        from delegate.plugin_api import partition_model, write_model

        self.partition = partition
        self.set_profiling(False)
        self.try_threads = try_threads  # sustained_speed: time fewer threads for a small partition (see _load)
        original = _as_read(partition)
        self.model = "as read"
        if original is None or not self._load(original, num_threads):
            self.model = "written"
            self._load(write_model(partition_model(partition)), num_threads)

    def _load(self, content: bytes, num_threads: int) -> bool:
        """Build the interpreter on ``content``; whether its inputs and outputs are the partition's."""
        self.interpreter = self._interpreter(content, num_threads)
        self.threads, self.thread_ms = max(num_threads, 1), {}
        if self.try_threads and num_threads > 1 and _may_warm_up(self.partition):
            self._choose_threads(content, num_threads)
        # in the partition's order (a model's own outputs may come in any order: pose_landmark_full's do)
        inputs = _in_order(self.interpreter.get_input_details(), self.partition.inputs)
        outputs = _in_order(self.interpreter.get_output_details(), self.partition.outputs)
        self.input_slots = [d["index"] for d in inputs]
        self.output_slots = [d["index"] for d in outputs]
        return _same_tensors(inputs, self.partition.inputs) and _same_tensors(outputs, self.partition.outputs)

    def _interpreter(self, content: bytes, num_threads: int):
        """An interpreter on ``content`` with ``num_threads``, allocated and warmed up."""
        from ai_edge_litert.interpreter import Interpreter

        with native_stderr(log):
            interpreter = Interpreter(model_content=content, num_threads=max(num_threads, 1))
            interpreter.allocate_tensors()
        # XNNPACK sets up on the first invoke: do that here, at compile time, not mid-run (on zeros: the arena's
        # leftovers may be out-of-range indices); and leave no state behind for the user's first run
        # (reset_all_variables restores variable tensors, not resource variables).  Zeros are not every
        # model's valid input (LiteRT's divisions stop on a zero divisor): such a refusal is left to the
        # user's first run, on the user's inputs.
        if _may_warm_up(self.partition):
            for d in interpreter.get_input_details():
                interpreter.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
            try:
                interpreter.invoke()
            except RuntimeError as exc:
                log.debug("cpu: LiteRT's warm-up run on zeros failed: %s", str(exc).splitlines()[0])
                # an op whose kernel refuses its types only when run (int16 SQUARED_DIFFERENCE) fails every
                # run: found by asking each op alone, it sends the partition to the other engine
                refused = next(((op, why) for op in self.partition.ops if (why := litert_refusal(op))), None)
                if refused:
                    raise RuntimeError(f"LiteRT refuses {refused[0].opcode} #{refused[0].index} when it runs: "
                                       f"{refused[1]}") from None
            interpreter.reset_all_variables()
        return interpreter

    def _choose_threads(self, content: bytes, num_threads: int) -> None:
        """Keep the fastest of a few thread counts, timed on zeros, for a partition that runs in under
        SMALL_PARTITION_MS at ``num_threads``: LiteRT's thread pool costs more than small ops gain from it
        (H200, 16 threads against 1: a transformer block 0.098 against 0.011 ms, a ViT block 0.36 against
        0.18; MobileNetV2 at 224, 1.25 against 5.6, is left alone).  Under sustained_speed only: the trial
        interpreters cost ~30 ms of initialisation here (a transformer block's 10 ms init became 40), more
        than one answer gains.  The counts tried: ``num_threads``, half
        of it from 8 up, and 1, in turns (after THREAD_TRIAL_WARMUP runs each) so that the machine's
        drift is shared; the others' interpreters are dropped."""
        def once(interpreter) -> float | None:
            start = time.perf_counter()
            try:
                interpreter.invoke()
            except RuntimeError:  # zeros are not this model's input: keep the count asked for
                return None
            return (time.perf_counter() - start) * 1e3

        first = once(self.interpreter)
        if first is None or first >= SMALL_PARTITION_MS:
            self.interpreter.reset_all_variables()
            return
        trials = {num_threads: self.interpreter}
        for count in sorted({num_threads // 2 if num_threads >= 8 else 1, 1}, reverse=True):
            trials[count] = self._interpreter(content, count)
        times: dict[int, list[float]] = {count: [] for count in trials}
        for round_ in range(THREAD_TRIAL_WARMUP + THREAD_TRIAL_RUNS):
            for count, interpreter in trials.items():
                ms = once(interpreter)
                if ms is None:
                    times.pop(count, None)
                elif round_ >= THREAD_TRIAL_WARMUP and count in times:
                    times[count].append(ms)
        medians = {count: float(np.median(v)) for count, v in times.items() if v}
        self.thread_ms = {count: round(ms, 4) for count, ms in medians.items()}
        best = num_threads
        for count in sorted(medians, reverse=True):  # fewer threads only where clearly faster
            if best in medians and medians[count] < THREAD_GAIN * medians[best]:
                best = count
        self.threads, self.interpreter = best, trials[best]
        self.interpreter.reset_all_variables()

    def run(self, inputs: Mapping[int, Any]) -> dict[int, Any]:
        it = self.interpreter
        for slot, t in zip(self.input_slots, self.partition.inputs):
            it.set_tensor(slot, inputs[t.index])
        it.invoke()
        if self.profiling and self.alone_inputs is None:
            self.alone_inputs = {t.index: np.array(inputs[t.index]) for t in self.partition.inputs}
        return {t.index: it.get_tensor(slot) for slot, t in zip(self.output_slots, self.partition.outputs)}

    def reset_state(self) -> None:
        self.interpreter.reset_all_variables()

    ops_timed_alone = True

    def op_timer(self) -> str:
        return OPS_ALONE if _may_warm_up(self.partition) and not any(
            k.endswith("subgraph_index") for op in self.partition.ops for k in op.options) else ""

    def set_profiling(self, enabled: bool) -> None:
        """Profiled runs keep the inputs of the first; ``profile`` then times each op on them (``_time_alone``):
        LiteRT's interpreter times no op of a model it runs whole."""
        self.profiling = enabled and bool(self.op_timer())
        self.alone_inputs, self.alone_ms, self.chain_outputs = None, {}, {}

    def profile(self) -> dict[int, float]:
        if not self.alone_ms and self.alone_inputs is not None:
            self.alone_ms = self._time_alone(dict(self.alone_inputs))
            self.alone_inputs = {}  # timed once per profiling: a failure is not retried
        return dict(self.alone_ms)

    def _time_alone(self, values: dict[int, Any]) -> dict[int, float]:
        """Each op's median over ALONE_RUNS back-to-back runs after ALONE_WARMUP, alone in a one-op LiteRT model
        at the partition's thread count (with the constants it folds, so XNNPACK packs its weights as in the
        whole model), fed what the op before produced, stepping through the partition in order.  One such
        model at a time, released once timed: each holds a thread pool of its own, and holding all of them
        (pose_landmark_full at 16 threads: 140 models) kept 2,117 threads and 383 MB where the partition's run
        keeps 17 and 111, and the ops' times summed to 1.56x the partition's on 2 cores (1.00x one at a time; on
        a 16-core H100 host 1.7-2.0x, the same convolution 7-17 us in one place and 54-70 in another).  Empty
        where LiteRT or the writer refuses an op alone, or an op its values: no op of the partition is timed then."""
        from ai_edge_litert.interpreter import Interpreter
        from delegate.plugin_api import partition_model, write_model

        times = {}
        for op in self.partition.ops:
            if _folded_constant(op):
                continue
            inputs = list({t.index: t for t in op.inputs if t is not None and not known_at_compile_time(t)
                           and not t.is_variable}.values())
            alone = Partition(0, "cpu", _constant_chain(op) + [op], inputs, list(op.outputs), self.partition.graph)
            try:
                with native_stderr(log):
                    interpreter = Interpreter(model_content=write_model(partition_model(alone)),
                                              num_threads=self.threads)
                    interpreter.allocate_tensors()
                for d, t in zip(interpreter.get_input_details(), inputs):
                    interpreter.set_tensor(d["index"], values[t.index])
                for _ in range(ALONE_WARMUP):
                    interpreter.invoke()
                samples = []
                for _ in range(ALONE_RUNS):
                    start = time.perf_counter()
                    interpreter.invoke()
                    samples.append((time.perf_counter() - start) * 1e3)
                values.update({t.index: interpreter.get_tensor(d["index"])
                               for d, t in zip(interpreter.get_output_details(), op.outputs)})
            except Exception as exc:  # the writer or LiteRT refuses the op alone, or its values
                log.debug("cpu: %s alone could not be timed: %s", op.describe(), exc)
                return {}
            finally:
                interpreter = None  # its thread pool goes before the next op's is made
            times[op.index] = float(np.median(samples))
        self.chain_outputs = {t.index: values[t.index] for t in self.partition.outputs if t.index in values}
        return times

    def describe(self) -> dict[str, Any]:
        described = {"engine": "litert", "model": self.model, "threads": self.threads}
        if self.thread_ms:
            described["thread_trial_ms"] = {str(k): v for k, v in self.thread_ms.items()}
        return described


class SegmentedCompiled(CompiledPartition):
    """A partition of the LiteRT engine holding custom ops LiteRT's kernels lack: each stretch of such ops runs
    on numpy, each stretch between them on LiteRT, host arrays passed between them in one run (MediaPipe's
    selfie_segmentation, whole on numpy, ran 2.8 ms on the H200's host where LiteRT with its XNNPACK runs it
    in 1.7)."""

    ops_timed_alone = True  # LiteRT's stretches time ops alone; numpy's times are of the same ops in place

    def __init__(self, partition: Partition, lacking: Collection[int],
                 compile_segment, refused: str):
        self.partition = partition
        self.litert_refused = refused
        self.segments: list[CompiledPartition] = []
        stretch: list[Op] = []
        # topologically ordered: each stretch reads what earlier ones produced; the ops computing constants
        # (DEQUANTIZE of float16 weights) go with each stretch that reads their values
        for op in (op for op in partition.ops if not _folded_constant(op)):
            if stretch and (op.index in lacking) != (stretch[0].index in lacking):
                self._add(stretch, stretch[0].index in lacking, compile_segment)
                stretch = []
            stretch.append(op)
        self._add(stretch, stretch[0].index in lacking, compile_segment)

    def _add(self, stretch: list[Op], numpy: bool, compile_segment) -> None:
        chains = [p for op in stretch for p in _constant_chain(op)]
        ops = sorted({id(op): op for op in chains + stretch}.values(), key=self.partition.ops.index)
        part = make_partition(self.partition.graph, ops, self.partition.backend, len(self.segments))
        kept = {t.index for t in self.partition.outputs}
        part.outputs = [t for t in part.outputs if t.index in kept or not known_at_compile_time(t)]
        self.segments.append(compile_segment(part, numpy))

    def run(self, inputs: Mapping[int, Any]) -> dict[int, Any]:
        values = dict(inputs)
        for segment in self.segments:
            values.update(segment.run(values))
        return {t.index: values[t.index] for t in self.partition.outputs}

    def reset_state(self) -> None:
        for segment in self.segments:
            segment.reset_state()

    def op_timer(self) -> str:
        timers = [segment.op_timer() for segment in self.segments]
        return "; ".join(dict.fromkeys(timers)) if all(timers) else ""

    def set_profiling(self, enabled: bool) -> None:
        for segment in self.segments:
            segment.set_profiling(enabled)

    def profile(self) -> dict[int, float]:
        times = [segment.profile() for segment in self.segments]
        return {k: v for t in times for k, v in t.items()} if all(times) else {}

    def describe(self) -> dict[str, Any]:
        return {"engine": "litert and numpy", "litert_refused": self.litert_refused,
                "segments": [{"ops": len(segment.partition.ops), **segment.describe()}
                             for segment in self.segments]}


def _may_split(partition: Partition) -> bool:
    """Whether the partition's ops can run in stretches of their own: no state shared through resource
    variables or control flow (one stretch's assignments would be lost to another's interpreter)."""
    return not any(op.opcode in STATE_OPS or any(k.endswith("subgraph_index") for k in op.options)
                   for op in partition.ops)


OPS_ALONE = "each op alone, as a one-op LiteRT model"
LITERT_FUSIONS = frozenset({"constant", "pad", "clamp"})
ALONE_WARMUP, ALONE_RUNS = 2, 7


def _folded_constant(op: Op) -> bool:
    """A DEQUANTIZE/DENSIFY of a constant (its output known at compile time): prepared once, never run."""
    return len(op.outputs) == 1 and known_at_compile_time(op.outputs[0])


def _constant_chain(op: Op) -> list[Op]:
    """The folded constant ops that produce ``op``'s inputs, producers first."""
    chain: list[Op] = []
    for t in op.inputs:
        producer = t.producer if t is not None else None
        if producer is not None and _folded_constant(producer) and producer not in chain:
            chain = [p for p in _constant_chain(producer) if p not in chain] + chain + [producer]
    return chain


def _may_warm_up(partition: Partition) -> bool:
    """Whether a run on unset inputs is harmless: no string inputs (unset ones hold no valid strings)
    and no resource variables (nothing can undo that run's assignments)."""
    return all(t.dtype is not DType.string for t in partition.inputs) and \
        not any(op.opcode in STATE_OPS for op in partition.ops)


def _as_read(partition: Partition) -> bytes | None:
    """The model's bytes when ``partition`` is all of its main subgraph, unchanged since it was read."""
    graph = partition.graph
    if graph.serialized is None:
        return None
    data, op_count = graph.serialized
    whole = len(partition.ops) == len(graph.ops) == op_count
    same_io = sorted(t.index for t in partition.inputs) == sorted(t.index for t in graph.inputs) and \
        sorted(t.index for t in partition.outputs) == sorted(t.index for t in graph.outputs)
    return data if whole and same_io else None


def _in_order(details: list[dict], tensors: list[Tensor]) -> list[dict]:
    """LiteRT's tensor details in the order of ``tensors`` where they name the same tensors, else as given."""
    by_index = {d["index"]: d for d in details}
    ordered = [by_index.get(t.index) for t in tensors]
    return ordered if len(details) == len(tensors) and None not in ordered else details


def _same_tensors(details: list[dict], tensors: list[Tensor]) -> bool:
    """Whether LiteRT's tensor details name ``tensors``, in order, with their shapes and types."""
    return len(details) == len(tensors) and all(
        d["index"] == t.index and tuple(d["shape"]) == tuple(t.shape) and d["dtype"] == t.dtype.numpy
        for d, t in zip(details, tensors))


def _cpu_model() -> str:
    """The host processor's name (keys the CPU's cost profile)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
_LITERT_ANSWERS: dict[tuple, str | None] = {}  # op signature -> None (LiteRT runs it) or LiteRT's refusal


def litert_refusal(op: Op) -> str | None:
    """Why LiteRT's interpreter cannot run ``op`` (None when it can): the op alone, as a one-op model,
    must allocate.  Asked once per op signature (code, version, options, operand types, shapes, and
    quantization; small constants by value) and remembered for the process."""
    key = _op_signature(op)
    if key not in _LITERT_ANSWERS:
        _LITERT_ANSWERS[key] = _ask_litert(op)
    return _LITERT_ANSWERS[key]


def _op_signature(op: Op) -> tuple:
    def operand(t: Tensor | None):
        if t is None:
            return None
        q = t.quantization
        quant = None if q is None else (q.scale.tobytes(), q.zero_point.tobytes(), q.axis)
        value = None
        if t.is_constant:
            data = np.asarray(t.data)
            value = data.tobytes() if data.nbytes <= 256 else data.nbytes
        return t.dtype.value, t.shape, quant, value, t.is_variable
    return (op.opcode, op.custom, op.version, repr(sorted(op.options.items())), op.custom_options,
            tuple(operand(t) for t in op.inputs), tuple(operand(t) for t in op.outputs))


def _ask_litert(op: Op, builtin_only: bool = False) -> str | None:
    """LiteRT's refusal of ``op`` alone as a one-op model, or None when it allocates and runs it on zeros or
    ones (some kernels refuse a type only when invoked: int16 SQUARED_DIFFERENCE); ``builtin_only``: asked of
    its builtin kernels without the default delegates (XNNPACK)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    from delegate.plugin_api import partition_model, write_model

    inputs = list({t.index: t for t in op.inputs if t is not None and not t.is_constant
                   and not t.is_variable}.values())
    probe = Partition(0, "cpu", [op], inputs, list(op.outputs), Subgraph(f"probe of {op.opcode}", [], [], [], []))
    resolver = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if builtin_only else OpResolverType.AUTO
    try:
        with native_stderr(log):
            interpreter = Interpreter(model_content=write_model(partition_model(probe)),
                                      experimental_op_resolver_type=resolver)
            interpreter.allocate_tensors()
            _invoke_on_zeros_or_ones(interpreter)
    except Exception as exc:  # LiteRT reports refusals as RuntimeError/ValueError; the writer may refuse too
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def _invoke_on_zeros_or_ones(interpreter) -> None:
    """Run once on zeros (safe indices), or else on ones (safe divisors): what fails on both is the kernel's
    refusal, not the data's."""
    for fill in (0, 1):
        for detail in interpreter.get_input_details():
            interpreter.set_tensor(detail["index"], np.full(detail["shape"], fill, detail["dtype"]))
        try:
            interpreter.invoke()
            return
        except RuntimeError:
            if fill:
                raise


_LITERT_OWN_CUSTOM: dict[str, bool] = {}  # custom op name -> whether LiteRT's builtin resolver has a kernel


def litert_lacks_custom(op: Op) -> bool:
    """Whether ``op`` is a custom op LiteRT's own kernels cannot run (its builtin resolver alone refuses it).
    Its XNNPACK delegate may still take some shapes of such an op, with conventions of its own (MediaPipe's
    pooling indices as raw positions, not the op's window places): such an op runs on the project's kernel,
    so that every backend and engine of a plan agree on what it computes."""
    if not op.custom:
        return False
    if op.opcode not in _LITERT_OWN_CUSTOM:
        # a refusal is an unresolved custom op, or the op's own: either way LiteRT's kernels do not run it
        _LITERT_OWN_CUSTOM[op.opcode] = _ask_litert(op, builtin_only=True) is None
    return not _LITERT_OWN_CUSTOM[op.opcode]


def litert_installed() -> bool:
    try:
        import ai_edge_litert.interpreter  # noqa: F401
    except ImportError:
        return False
    return True


# The backend's options (JSON Schema of each; the config loader checks them, and the config's ``cpu`` section
# holds them for the host backend)
OPTIONS = {"engine": {"enum": ["numpy", "litert", "auto"]}, "native": {"type": "boolean"}}

# Figures of one thread (shared among the threads op by op: ``DeviceProfile.threads``) until `delegate calibrate`
# runs: what calibrate measured and fitted at one thread on a 2-core AMD EPYC (AVX-512) VM, 2026-12-02, in its
# least disturbed of several runs; the numpy engine's "step" kinds (``CpuBackend.cost_class``) from two runs at
# one thread on a VM of that kind (AVX2), 2026-12-06.  The kinds' factors (``DeviceProfile.kind_scale``: how many times slower
# than the float kernel of its class) stand until a measurement of the kind is fitted; measured by
# docs/benchmarks/cpu_kinds.py (chains of one op, and each op of a model timed alone): LiteRT runs int16x8
# ops, int8 products of two activations and int8 softmax through reference loops, on one thread whatever
# num_threads (measured: the int16x8 and int8 attention fixtures take the same time at 1 and 2 threads).
# A sequence LSTM steps through time with small products (the float one 15-20x from its roofline, the int8
# one 330-390x: `cpu_kinds.py --model` on the converter's LSTM fixtures, 2026-12-03); no other class says so.
# LiteRT's: a floor per time step (``cost.op_steps``), from the converter's LSTM fixtures each run alone on the
# H200 host, 2026-12-04, at 1 and 16 threads alike: float 38.6 us for 16 steps, int8 92 us for 12.
# ``thread_grain_us``, and the throughput and bandwidth of one thread: refitted 2026-12-07 to eight measurements
# of each engine on an H100 host's 16-core Xeon (MobileNetV2 fp32 and int8, selfie_segmentation,
# pose_landmark_full at 2 and 16 threads, `bench --compare litert`): the figures above divided by 1.3 (numpy) and
# 2.5 (LiteRT), each op's roofline shared among as many threads as it gives each that much.  The mean
# |log(estimate / time)| of the eight: numpy engine 0.12 (0.60 before, when the throughput was multiplied by the
# threads and the bandwidth not: MobileNetV2 at 16 threads estimated at 4.0x its time), LiteRT 0.23 (0.59).
# LiteRT's figures as calibrated on the VM put MobileNetV2 at one thread at 3.5 ms, beyond what one AVX2 core
# can compute (it took 10.6-12.6 ms there that day; estimated 8.7 now).
DEFAULT_PROFILES = {
    "numpy": DeviceProfile(gflops=153.0, gbytes_per_s=11.4, launch_us=0.0, partition_us=0.0, run_us=44.0,
                           class_scale={"conv": 1.68, "depthwise": 0.51, "pool": 0.56, "layout": 0.41, "matmul": 0.12,
                                        "reduce": 6.3, "elementwise": 0.62, "resize": 1.41, "batch_matmul": 1.69,
                                        "recurrent": 13.0, "elementwise/step": 2.1, "layout/step": 0.58,
                                        "reduce/step": 3.9},
                           class_floor_us={"depthwise": 4.2, "pool": 5.2, "layout": 4.5, "matmul": 6.1, "reduce": 3.4,
                                           "elementwise": 1.0, "resize": 28.9, "elementwise/step": 10.0,
                                           "layout/step": 5.1, "reduce/step": 21.7},
                           kind_scale={"int16": 4.0, "matmul/int16": 15.0, "elementwise/int16": 10.0,
                                       "batch_matmul/int8": 6.5, "recurrent/int8": 22.0},
                           thread_grain_us=15.0, source="default (cpu)"),
    "litert": DeviceProfile(gflops=90.0, gbytes_per_s=8.8, launch_us=0.05, partition_us=0.0, run_us=7.0,
                            class_scale={"*": 0.88, "conv": 0.88, "depthwise": 0.78, "layout": 0.66, "matmul": 0.72,
                                         "pool": 3.3, "reduce": 0.45, "elementwise": 0.98, "resize": 1.21,
                                         "batch_matmul": 0.74, "recurrent": 1.0},
                            class_floor_us={"pool": 4.8, "resize": 12.6, "recurrent": 2.4, "recurrent/int8": 7.5},
                            kind_scale={"int16": 40.0, "batch_matmul/int8": 20.0, "reduce/int8": 15.0,
                                        "elementwise/int8": 1.5, "depthwise/int8": 2.5},
                            serial_kinds=("int16", "batch_matmul/int8", "reduce/int8"),
                            thread_grain_us=24.0, source="default (cpu-litert)"),
}


# The classes whose ops the numpy engine runs either in its batched native call or as numpy steps (cost_class)
STEP_CLASSES = frozenset({"elementwise", "layout", "pool", "reduce"})


class CpuBackend(Backend):
    name = "cpu"
    layout = "NHWC"
    precisions = ("fp32", "int8")  # int8: the quantized and hybrid kernels
    fusions = FUSIONS

    def __init__(self, options: Mapping[str, Any] | None = None):
        registry.load_all()
        self.options = dict(options or {})
        self.custom: dict[str, registry.Factory] = {}
        # threads -> (the numpy engine, its profile, LiteRT's): the estimate of ops LiteRT leaves to the numpy engine
        self._engine_profiles: tuple[Backend, DeviceProfile, DeviceProfile] | None = None  # see estimate_ms
        self._steps: weakref.WeakKeyDictionary[Op, bool] = weakref.WeakKeyDictionary()  # see cost_class

    def add_custom_kernels(self, kernels: Mapping[str, registry.Factory]) -> None:
        self.custom.update(kernels)

    def placement_groups(self, ops: Sequence[Op], keep: Collection[int], options: CompileOptions) -> list[Group]:
        """The shared passes' groups for what the engine fuses: LiteRT's (XNNPACK) folds constants, zero pads
        and clamps into the op before, and runs a PRELU, a residual ADD and a swish's LOGISTIC and MUL as ops of
        their own (measured each alone: MediaPipe hand_recrop's PRELUs are a fifth of its time)."""
        return find_groups(ops, self.fusions if self.engine == "numpy" else LITERT_FUSIONS, keep)

    def supports(self, op: Op, options: CompileOptions) -> Support:
        """A numpy kernel, or, with the LiteRT engine (``litert``/``auto``), whatever LiteRT's interpreter runs."""
        factory = registry.find_kernel(op, self.custom)
        kind = "custom op" if op.custom else "quantized op" if registry.is_quantized_op(op) else "op"
        if factory is not None:
            why = registry.refusal(factory, op)
            if why is None:
                return Support.yes()
            missing = f"the cpu kernel for {kind} {op.opcode} cannot run it: {why}"
        else:
            missing = f"no cpu kernel for {kind} {op.opcode}"
        if op.custom and factory is None:  # the one remedy a user has
            missing += " (a plugin adds one through the delegate_custom_kernels hook)"
        if self.engine != "litert":
            return Support.no(missing)
        refusal = litert_refusal(op)
        if refusal is None:
            return Support.yes()
        return Support.no(f"{missing}, and LiteRT refuses it: {refusal}")

    def compile(self, partition: Partition, options: CompileOptions) -> CompiledPartition:
        """numpy kernels, or LiteRT for the whole partition when ``engine`` is litert/auto.

        With ``auto`` a partition LiteRT cannot take stays on numpy, its refusal logged and kept in the
        compiled partition's description.  Under either, a custom op that LiteRT's own kernels lack and the
        project has a kernel for (``litert_lacks_custom``) runs on numpy, and LiteRT runs the stretches of ops
        between such ops (``SegmentedCompiled``).  Either engine only ever sees a model the session validated
        (delegate.validate) before planning.
        """
        engine = self.options.get("engine", "numpy")  # "auto" still falls back per partition
        if engine == "litert" and not litert_installed():
            raise CompileError("cpu engine 'litert' needs ai-edge-litert (pip install 'delegate[reference]')")
        refused = None
        lacking = {op.index for op in partition.ops if op.custom and engine in ("litert", "auto")
                   and litert_installed() and registry.find_kernel(op, self.custom) is not None
                   and litert_lacks_custom(op)}
        if lacking:
            names = ", ".join(sorted({op.opcode for op in partition.ops if op.index in lacking}))
            refused = f"partition {partition.index} holds custom op {names}, which LiteRT's own kernels lack"
            if len(lacking) < len(partition.ops) and _may_split(partition):
                log.info("cpu: %s: the project's kernels run it, LiteRT the ops around it", refused)
                return SegmentedCompiled(partition, lacking, lambda part, numpy: self._numpy(part, options, refused)
                                         if numpy else self.compile(part, options), refused)
            log.info("cpu: %s: the project's kernels run it", refused)
        elif engine in ("litert", "auto") and litert_installed():
            try:
                return LitertCompiled(partition, options.num_threads,
                                      try_threads=options.inference_preference == "sustained_speed")
            except (RuntimeError, ValueError) as exc:
                refused = f"LiteRT could not take partition {partition.index}: {str(exc).splitlines()[0]}"
                if engine == "litert":
                    raise CompileError(refused) from None
                log.info("cpu: %s; it runs on the numpy engine", refused)
        return self._numpy(partition, options, refused)

    def _numpy(self, partition: Partition, options: CompileOptions, refused: str | None) -> CpuCompiled:
        compiled = CpuCompiled(partition, self.custom, options.num_threads, self.options.get("native", True))
        compiled.litert_refused = refused
        return compiled

    def default_profile(self) -> DeviceProfile:
        return DEFAULT_PROFILES["litert" if self.engine == "litert" else "numpy"]

    def cost_class(self, op: Op) -> str:
        """The numpy engine runs an elementwise, layout, pooling or reduction op either inside its partition's
        batched native call or as a numpy step of its own (a Python call and a pass or more over memory each):
        two kinds of kernel, of ~1 and ~6 us a call at 2 threads here, which one line of their class cannot
        fit (calibrate's transformer blocks' numpy steps put MediaPipe models' native ADDs and clamps at 5-9x
        their time).  A step is the kind "step"; which one an op is, its kernel says, built as the engine
        builds it (cheap for these classes: no weights to pack)."""
        klass = cost_class(op)
        base, _, kind = klass.partition("/")
        if self.engine != "numpy" or base not in STEP_CLASSES or kind not in ("", "strided"):
            return klass  # integer kinds keep theirs
        step = self._steps.get(op)
        if step is None:  # custom and resource ops run as Python steps: their kernels are not built to see
            step = self._steps[op] = op.custom or op.opcode in STATE_OPS or not self._runs_batched(op)
        return f"{base}/step" if step else klass

    def _runs_batched(self, op: Op) -> bool:
        """Whether the numpy engine's kernel of ``op`` is a prepared native call (batched_steps takes it)."""
        factory = registry.find_kernel(op, self.custom)
        if factory is None:
            return False
        try:
            with kernel_threads(1, self.options.get("native", True), 1):
                run = factory(op)
        except Exception:  # a kernel that cannot be built is costed as a step; compile says why it fails
            return False
        return getattr(run, "prepared", None) is not None

    def estimate_ms(self, op: Op, options: CompileOptions) -> float | None:
        """With the LiteRT engine, a custom op LiteRT's kernels lack runs on the numpy engine between stretches
        of LiteRT (``SegmentedCompiled``): the numpy engine's estimate of it, plus copying what it reads out of
        LiteRT's tensors and what it writes into them, at the host's bandwidth, both on one thread whatever the
        plan's count: a custom op's kernel is a Python step of numpy calls, which split no work among threads.
        (MediaPipe selfie_segmentation's transposed convolution, 0.05 ms by LiteRT's figures, ran 0.24-0.50 ms on
        numpy between two LiteRT calls; on an H100 host at 16 threads, estimated from the 16 threads' figures
        at 0.04 ms, it took 0.45.)  Else the planner's roofline (None)."""
        if not op.custom or self.engine != "litert" or registry.find_kernel(op, self.custom) is None \
                or not litert_lacks_custom(op):
            return None
        if self._engine_profiles is None:
            numpy_engine = CpuBackend({**self.options, "engine": "numpy"})
            self._engine_profiles = (numpy_engine, host_profile(numpy_engine, 1), host_profile(self, 1))
        numpy_engine, numpy_profile, litert_profile = self._engine_profiles
        own = numpy_profile.compute_ms(op_flops(op), op_bytes(op), numpy_engine.cost_class(op), op_steps(op))
        moved = sum(t.nbytes for t in (*op.inputs, *op.outputs) if t is not None and not known_at_compile_time(t))
        return own + 2 * moved / (litert_profile.gbytes_per_s * 1e9) * 1e3

    def device_info(self) -> dict[str, Any]:
        return {"backend": self.name, "device": "host", "engine": self.engine, "numpy": np.__version__,
                "cpu_model": _cpu_model(), "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count()}

    @property
    def engine(self) -> str:
        """The engine compiled partitions get: ``auto`` means LiteRT where it is installed."""
        engine = self.options.get("engine", "numpy")
        if engine == "auto":
            return "litert" if litert_installed() else "numpy"
        return engine


@hookimpl
def delegate_backends():
    return [BackendInfo("cpu", factory=CpuBackend, role=HOST, options=OPTIONS,
                        description="numpy kernels on the host; runs every op")]
