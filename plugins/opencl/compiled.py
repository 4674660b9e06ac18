"""A compiled OpenCL partition: its kernel plan's buffers resident (as ranges of one arena, see arena.py),
kernels built and bound, work-group sizes chosen.

``run`` enqueues the uploads of the partition's inputs (the caller's NHWC
arrays, converted to PHWC4 by a kernel) and every kernel on the device's
in-order queue and returns at once; the only wait is the read of the
outputs in ``to_host``.  The kernels go in with one native call where
enqueue.c builds (see enqueue.py), else through pyopencl one by one.
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping

import numpy as np

from delegate.plugin_api import CompileOptions, CompiledPartition, EntryStore, Partition, cache_key
from delegate.gpu.constants import constant_value
from delegate.gpu.fusion import plan_groups
from delegate.gpu.plan import KernelPlan, LaunchSpec
from delegate.gpu.precision import Precision
from delegate.gpu.precision import choose_precision as kit_precision

from .arena import make_arena
from .enqueue import PreparedLaunches, native_enqueue
from .geometry import pow2_at_least
from .lowering import ClLowering
from .program import variant_of
from .values import Boundary, ClValue, ReadbackBatch, WaitLimit, fill_input

# Work-group shapes tried by ``sustained_speed`` besides the driver's own choice.
LOCAL_SIZES = ((8, 8, 1), (16, 4, 1), (32, 2, 1), (4, 4, 4), (64, 1, 1), (16, 1, 4))
TUNE_REPEATS = 3
DEFAULT_GROUP = 64


def choose_precision(requested: str, device_has_fp16: bool) -> Precision:
    """The kit's choice, with what half precision means for the OpenCL kernels."""
    return kit_precision(requested, "cl_khr_fp16", device_has_fp16,
                         "half storage and arithmetic; mean, average pooling, softmax and resize accumulate in fp32",
                         "half storage through vload_half/vstore_half, fp32 arithmetic")


def build_defines(precision: Precision) -> tuple[str, ...]:
    """The prelude's macros for ``precision``."""
    if precision.storage == "f32":
        return ()
    return ("HALF_STORAGE", "HALF_MATH") if precision.half_math else ("HALF_STORAGE",)


def lower(partition: Partition, options: CompileOptions, precision: Precision, compute_units: int) -> KernelPlan:
    """The partition's kernel plan: fused groups lowered to launches, buffers shared by lifetime."""
    ops = sorted(partition.ops, key=lambda op: op.index)
    lowering = ClLowering(precision.dtype, compute_units)
    keep = {t.index for t in partition.outputs}
    groups = plan_groups(ops, keep, float_view=options.allow_quantized)
    lowering.lower_all(groups, keep, [t for t in partition.inputs if constant_value(t) is None], partition.outputs)
    plan = lowering.plan(partition, precision.storage)
    plan.facts["ops"] = sum(len(g.ops) for g in groups)
    return plan


class ClCompiled(CompiledPartition):
    """A partition's kernel plan made real: buffers allocated, kernels built and bound."""

    def __init__(self, device, partition: Partition, plan: KernelPlan, precision: Precision, options: CompileOptions,
                 plan_source: str = "planned", native: bool = True, build_threads: int = 1,
                 wait_limit: WaitLimit | None = None):
        """``build_threads``: programs the kernels may be split into, built at once (1: one program);
        ``wait_limit``: the backend's, which bounds the waits for this partition's runs."""
        self.device, self.plan, self.precision, self.plan_source = device, plan, precision, plan_source
        self.wait_limit = wait_limit or WaitLimit()
        self.build_threads, self.programs = build_threads, 0
        cl, context, queue = device.cl, device.context, device.queue
        self.buffers = make_arena(cl, context, queue, device.device, plan.buffers, plan.blob)  # a Region each
        self.arena = self.buffers[0].buffer if self.buffers else None
        self.profiled: list[list[Any]] | None = None  # the kernels' events of each profiled run
        self.uploads: list[Any] = []  # keeps the caller's arrays referenced until their copies are done
        self.boundary_profiled: list[list[Any]] = []  # per profiled run: its uploads', conversions' and reads' events
        self.host_reads: frozenset[int] | None = None  # the outputs the host reads (None: all), see read_hint
        cache = EntryStore(options.cache_dir, "opencl", options.model_token) if options.cache_dir else None
        self.build_origin, self.build_seconds, self.tuned = "none", 0.0, False
        crossings = plan.inputs + plan.outputs
        converters = [t.convert for t in crossings if t.convert]
        bound = self._bind(plan.launches + converters, cache, options.inference_preference == "sustained_speed")
        self.launches = bound[:len(plan.launches)]
        bound_converters = iter(bound[len(plan.launches):])
        tensors = {t.index: t for t in partition.graph.tensors}
        boundaries = [Boundary(tensors[t.index], self.buffers[t.buffer],
                               None if t.staging is None else self.buffers[t.staging],
                               *(next(bound_converters) if t.convert else ()), host_dtype=np.dtype(t.host_dtype),
                               host_layout=t.host_layout) for t in crossings]
        self.inputs, self.outputs = boundaries[:len(plan.inputs)], boundaries[len(plan.inputs):]
        self.prepared, self.enqueue_reason = self._prepare(native)

    def _prepare(self, native: bool) -> tuple[PreparedLaunches | None, str]:
        """The launches ready for one native call, or None and why pyopencl's loop enqueues them."""
        if not native:
            return None, "native_enqueue: false"
        if not self.launches:
            return None, "no kernels"
        loaded = native_enqueue(self.device.cl)
        if isinstance(loaded, str):
            return None, loaded
        return PreparedLaunches(loaded, self.launches), ""

    def _argument(self, kind: str, value: Any) -> Any:
        if kind == "buffer":  # a range of the arena, by its byte offset (the kernel takes the arena first)
            return np.uint64(self.buffers[value].offset)
        if kind == "int":
            return np.int32(value)
        if kind == "float":
            return np.float32(value)
        return getattr(self.device.cl.cltypes, f"make_{kind}")(*value)

    def _bind(self, launches: list[LaunchSpec], cache: EntryStore | None, tune: bool) -> list[tuple[Any, tuple, tuple]]:
        """Find or build the kernels of ``launches`` (see ProgramBuilder.kernels), bind their arguments and
        choose the work-group sizes that their kernels leave open; returns (kernel, global size, local size) per launch."""
        if not launches:
            return []
        cl = self.device.cl
        of_launch = [variant_of(launch) for launch in launches]
        variants = list(dict.fromkeys(of_launch))
        start = time.perf_counter()
        found = self.device.builder.kernels(variants, build_defines(self.precision), cache, self.build_threads)
        self.build_seconds, self.programs = time.perf_counter() - start, len(found.programs)
        self.build_origin = "+".join(dict.fromkeys(b.origin for b in found.programs))
        names = found.found
        kernels = []
        for launch, variant in zip(launches, of_launch):
            kernel = cl.Kernel(*names[variant])
            kernel.set_args(self.arena, *(self._argument(kind, value) for kind, value in launch.args))
            kernels.append(kernel)
        sizes = [tuple(launch.work) for launch in launches]
        locals_: list = [tuple(launch.local) if launch.local else default_local(size)
                         for launch, size in zip(launches, sizes)]
        free = [i for i, launch in enumerate(launches) if launch.local is None]
        if tune and free:
            key = cache_key({"kernels": [self.device.builder.variant_key(v, build_defines(self.precision))
                                         for v in variants], "plan": self.plan.to_json()})
            stored = cache.load(key, "tune") if cache else None
            chosen = [tuple(l) if l else None for l in json.loads(stored)] if stored else \
                [self._fastest(kernels[i], sizes[i]) for i in free]
            if cache and stored is None:
                cache.store(key, "tune", json.dumps(chosen).encode())
            for i, local in zip(free, chosen):
                locals_[i] = local
            self.tuned = True
        return [(k, _round_up(size, local), local) for k, size, local in zip(kernels, sizes, locals_)]

    def _fastest(self, kernel, global_size: tuple[int, int, int]) -> tuple[int, int, int] | None:
        """The work-group shape with the lowest measured time for this launch (None: the driver's)."""
        cl, queue = self.device.cl, self.device.queue
        limit = min(self.device.facts["max_work_group_size"],
                    kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.device.device))
        best, best_time = None, float("inf")
        for local in (None,) + tuple(l for l in LOCAL_SIZES if l[0] * l[1] * l[2] <= limit):
            size = _round_up(global_size, local)
            cl.enqueue_nd_range_kernel(queue, kernel, size, local)  # warm-up (first launches compile)
            queue.finish()
            elapsed = float("inf")
            for _ in range(TUNE_REPEATS):
                start = time.perf_counter()
                cl.enqueue_nd_range_kernel(queue, kernel, size, local)
                queue.finish()
                elapsed = min(elapsed, time.perf_counter() - start)
            if elapsed < best_time:
                best, best_time = local, elapsed
        return best

    def run(self, inputs: Mapping[int, Any]) -> dict[int, Any]:
        cl, queue, storage = self.device.cl, self.device.queue, self.precision.dtype
        self.uploads = [event for boundary in self.inputs
                        for event in fill_input(cl, queue, boundary, inputs[boundary.tensor.index], storage)]
        boundary_events = None
        if self.profiled is not None:
            boundary_events = list(self.uploads)
            self.boundary_profiled.append(boundary_events)
        self._enqueue_kernels()
        values = [ClValue(b.tensor.shape, b.tensor.dtype, quant=b.tensor.quantization, boundary=b, storage=storage)
                  for b in self.outputs]
        batch = ReadbackBatch(values, self.device.context, self.host_reads, boundary_events, self.uploads,
                              self.wait_limit)
        for value in values:
            value.batch = batch
        return {b.tensor.index: v for b, v in zip(self.outputs, values)}

    def _enqueue_kernels(self) -> None:
        """Every kernel of the partition on the queue: one native call, pyopencl's loop, or (profiling)
        the loop keeping an event per kernel."""
        cl, queue = self.device.cl, self.device.queue
        enqueue = cl.enqueue_nd_range_kernel
        if self.profiled is None and self.prepared is not None:
            self.prepared.enqueue(cl, queue)
        elif self.profiled is None:
            for kernel, global_size, local_size in self.launches:
                enqueue(queue, kernel, global_size, local_size)
        else:  # profiling events need pyopencl's Event per kernel
            self.profiled.append([enqueue(queue, kernel, global_size, local_size)
                                  for kernel, global_size, local_size in self.launches])

    def read_hint(self, indices) -> None:
        """Read back, with the first output the host asks for, only the outputs in ``indices`` (None: all);
        any other output is still read when asked for, with a wait of its own."""
        self.host_reads = None if indices is None else frozenset(indices)

    def run_resident(self) -> bool:
        """One run on the values already in the input buffers, outputs left on the device: the kernels
        enqueued as ``run`` enqueues them, then the queue drained."""
        self._enqueue_kernels()
        self.device.queue.finish()
        return True

    def enqueue_path(self) -> str:
        """How ``run`` enqueues the kernels now."""
        if self.profiled is not None:
            return "pyopencl loop (profiling: an event per kernel)"
        if self.prepared is not None:
            return f"native (one call for {len(self.launches)} kernels)"
        return f"pyopencl loop ({self.enqueue_reason})"

    def op_timer(self) -> str:
        return "OpenCL profiling events"

    def set_profiling(self, enabled: bool) -> None:
        """Keep the events of the following runs' kernels, uploads and reads, for :meth:`profile` and
        :meth:`boundary_ms`."""
        if enabled != (self.profiled is not None):
            self.device.set_profiling(enabled)
        self.profiled = [] if enabled else None
        if enabled:
            self.boundary_profiled = []

    def profile(self) -> dict[int, float]:
        """Median device milliseconds per op over the profiled runs; a fused kernel's time goes to its first op."""
        if not self.profiled or not self.launches:
            return {}
        self.profiled[-1][-1].wait()
        times: dict[int, float] = {}
        first_ops = [launch.ops[0] for launch in self.plan.launches]
        for i, op_index in enumerate(first_ops):
            ns = [run[i].profile.end - run[i].profile.start for run in self.profiled]
            times[op_index] = times.get(op_index, 0.0) + float(np.median(ns)) / 1e6
        return times

    def boundary_ms(self) -> float | None:
        """Median device milliseconds per profiled run of the host copies and layout conversions at the
        partition's edges (uploads, conversions to and from PHWC4, reads), from their profiling events."""
        runs = [events for events in self.boundary_profiled if events]
        if not runs:
            return None
        runs[-1][-1].wait()
        return float(np.median([sum(e.profile.end - e.profile.start for e in events) for events in runs])) / 1e6

    def describe(self) -> dict[str, Any]:
        return {
            "engine": "opencl",
            "device": self.device.facts["device"],
            "precision": self.precision.name,
            "precision_reason": self.precision.reason,
            "ops": self.plan.facts["ops"],
            "kernels": len(self.launches),
            "conversions": len([b for b in self.inputs + self.outputs if b.kernel is not None]),
            "enqueue": self.enqueue_path(),
            "launches": [launch.label for launch in self.plan.launches],
            "fused": [launch.label for launch in self.plan.launches if "+" in launch.label],
            "plan_source": self.plan_source,
            "program": self.build_origin,
            "programs": self.programs,
            "build_ms": round(self.build_seconds * 1e3, 3),
            "work_group_sizes": "tuned" if self.tuned else "default (up to 16x4)",
            "device_bytes": self.arena.size if self.arena is not None else 0,
            "host_outputs": sorted({b.host_kind for b in self.outputs if b.host_kind}) or "none read yet",
            "buffer_bytes": self.plan.buffer_bytes(),
        }


def default_local(global_size: tuple[int, ...]) -> tuple[int, ...]:
    """Up to 16 x 4 work items over x and y, and z filling the group up to 64 where x and y are narrow
    (a 7x7 image would otherwise leave most of a GPU's SIMD lanes idle); few distinct shapes to
    compile (drivers such as PoCL build one work-group function per local size)."""
    x, y = (min(limit, pow2_at_least(g)) for limit, g in zip((16, 4), global_size))
    return x, y, min(DEFAULT_GROUP // (x * y), pow2_at_least(global_size[2]))


def _round_up(size: tuple[int, ...], local: tuple[int, ...] | None) -> tuple[int, ...]:
    if local is None:
        return tuple(size)
    return tuple(-(-g // l) * l for g, l in zip(size, local))
