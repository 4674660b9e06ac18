"""A compiled OpenCL partition: buffers resident, kernels built and bound, work-group sizes chosen.

``run`` enqueues the uploads of the partition's inputs (the caller's NHWC
arrays, converted to PHWC4 by a kernel) and every kernel on the device's
in-order queue and returns at once; the only wait is the read of the
outputs in ``to_host``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from delegate.plugin_api import CompileOptions, CompiledPartition, EntryStore, Partition, cache_key
from delegate.gpu.constants import constant_value
from delegate.gpu.fusion import plan_groups

from .geometry import pow2_at_least
from .lowering import Launch, Lowering
from .program import kernel_name, program_source
from .values import Boundary, ClValue, ReadbackBatch, fill_input

# Work-group shapes tried by ``sustained_speed`` besides the driver's own choice.
LOCAL_SIZES = ((8, 8, 1), (16, 4, 1), (32, 2, 1), (4, 4, 4), (64, 1, 1), (16, 1, 4))
TUNE_REPEATS = 3
DEFAULT_GROUP = 64


@dataclass(frozen=True)
class Precision:
    """Storage and arithmetic types of a partition, and why they were chosen."""

    name: str
    storage: np.dtype
    defines: tuple[str, ...]
    reason: str


def choose_precision(requested: str, device_has_fp16: bool) -> Precision:
    if requested == "fp16":
        if device_has_fp16:
            return Precision("fp16", np.dtype(np.float16), ("HALF_STORAGE", "HALF_MATH"),
                             "fp16 allowed and the device has cl_khr_fp16: half storage and arithmetic; "
                             "mean, average pooling, softmax and resize accumulate in fp32")
        return Precision("fp16 storage", np.dtype(np.float16), ("HALF_STORAGE",),
                         "fp16 allowed but the device lacks cl_khr_fp16: half storage through "
                         "vload_half/vstore_half, fp32 arithmetic")
    if requested == "fp32":
        return Precision("fp32", np.dtype(np.float32), (), "fp32 requested")
    return Precision("fp32", np.dtype(np.float32), (),
                     f"precision {requested!r} has no OpenCL kernels; fp32 used")


class ClCompiled(CompiledPartition):
    """A partition lowered to kernels bound to device-resident buffers."""

    def __init__(self, device, partition: Partition, options: CompileOptions):
        self.device = device
        self.precision = choose_precision(options.precision, device.facts["fp16"])
        ops = sorted(partition.ops, key=lambda op: op.index)
        lowering = Lowering(device.cl, device.context, device.queue, self.precision.storage,
                            device.facts["compute_units"])
        keep = {t.index for t in partition.outputs}
        self.groups = plan_groups(ops, keep, float_view=options.allow_quantized)
        lowering.lower_all(self.groups, keep)
        # Every run refills the input buffers the kernels read, except those known at compile time
        # (weights from a DEQUANTIZE folded elsewhere), which were uploaded once as constants; inputs
        # that are only parameters (a RESHAPE's shape) are not read at all.
        inputs = [t for t in partition.inputs if t.index in lowering.buffers and constant_value(t) is None]
        crossings = [(t, True) for t in inputs] + [(t, False) for t in partition.outputs]
        conversions = [lowering.boundary(t, into_device) for t, into_device in crossings]
        self.device_bytes = lowering.device_bytes
        self.labels = [launch.label for launch in lowering.launches]
        self.first_ops = [launch.ops[0].index for launch in lowering.launches]
        self.profiled: list[list[Any]] | None = None  # the kernels' events of each profiled run
        self.uploads: list[Any] = []  # keeps the caller's arrays referenced until their copies are done
        cache = EntryStore(options.cache_dir, "opencl", options.model_token) if options.cache_dir else None
        self.build_origin, self.build_seconds, self.tuned = "none", 0.0, False
        converters = [launch for launch, _ in conversions if launch is not None]
        bound = self._bind(lowering.launches + converters, cache, options.inference_preference == "sustained_speed")
        self.launches = bound[:len(lowering.launches)]
        bound_converters = iter(bound[len(lowering.launches):])
        boundaries = [Boundary(t, lowering.tensor(t), staging, *(next(bound_converters) if launch else ()))
                      for (t, _), (launch, staging) in zip(crossings, conversions)]
        self.inputs, self.outputs = boundaries[:len(inputs)], boundaries[len(inputs):]

    def _bind(self, launches: list[Launch], cache: EntryStore | None, tune: bool) -> list[tuple[Any, tuple, tuple]]:
        """Build one program for ``launches``, bind their arguments and choose the work-group sizes that
        their kernels leave open; returns (kernel, global size, local size) per launch."""
        if not launches:
            return []
        cl = self.device.cl
        variants = list(dict.fromkeys(launch.variant for launch in launches))
        names = {v: kernel_name(v, i) for i, v in enumerate(variants)}
        built = self.device.builder.build(program_source(variants, self.precision.defines), cache)
        self.build_origin, self.build_seconds = built.origin, built.seconds
        # A kernel does not keep its argument buffers alive; the partition does.
        self.bound_args = [launch.args for launch in launches]
        kernels = []
        for launch in launches:
            kernel = cl.Kernel(built.program, names[launch.variant])
            kernel.set_args(*launch.args)
            kernels.append(kernel)
        locals_: list = [launch.local_size or default_local(launch.global_size) for launch in launches]
        free = [i for i, launch in enumerate(launches) if launch.local_size is None]
        if tune and free:
            key = cache_key({"program": built.key,
                             "launches": [[names[launches[i].variant], launches[i].global_size] for i in free]})
            stored = cache.load(key, "tune") if cache else None
            chosen = [tuple(l) if l else None for l in json.loads(stored)] if stored else \
                [self._fastest(kernels[i], launches[i].global_size) for i in free]
            if cache and stored is None:
                cache.store(key, "tune", json.dumps(chosen).encode())
            for i, local in zip(free, chosen):
                locals_[i] = local
            self.tuned = True
        return [(k, _round_up(launch.global_size, local), local)
                for k, launch, local in zip(kernels, launches, locals_)]

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
        cl, queue, storage = self.device.cl, self.device.queue, self.precision.storage
        self.uploads = [fill_input(cl, queue, boundary, inputs[boundary.tensor.index], storage)
                        for boundary in self.inputs]
        enqueue = cl.enqueue_nd_range_kernel
        if self.profiled is None:
            for kernel, global_size, local_size in self.launches:
                enqueue(queue, kernel, global_size, local_size)
        else:
            self.profiled.append([enqueue(queue, kernel, global_size, local_size)
                                  for kernel, global_size, local_size in self.launches])
        values = [ClValue(b.tensor.shape, b.tensor.dtype, quant=b.tensor.quantization, boundary=b, storage=storage)
                  for b in self.outputs]
        batch = ReadbackBatch(values)
        for value in values:
            value.batch = batch
        return {b.tensor.index: v for b, v in zip(self.outputs, values)}

    def op_timer(self) -> str:
        return "OpenCL profiling events"

    def set_profiling(self, enabled: bool) -> None:
        """Keep the events of the following runs' kernels, for :meth:`profile`."""
        if enabled != (self.profiled is not None):
            self.device.set_profiling(enabled)
        self.profiled = [] if enabled else None

    def profile(self) -> dict[int, float]:
        """Median device milliseconds per op over the profiled runs; a fused kernel's time goes to its first op."""
        if not self.profiled or not self.launches:
            return {}
        self.profiled[-1][-1].wait()
        times: dict[int, float] = {}
        for i, op_index in enumerate(self.first_ops):
            ns = [run[i].profile.end - run[i].profile.start for run in self.profiled]
            times[op_index] = times.get(op_index, 0.0) + float(np.median(ns)) / 1e6
        return times

    def describe(self) -> dict[str, Any]:
        return {
            "engine": "opencl",
            "device": self.device.facts["device"],
            "precision": self.precision.name,
            "precision_reason": self.precision.reason,
            "ops": sum(len(g.ops) for g in self.groups),
            "kernels": len(self.launches),
            "fused": [label for label in self.labels if "+" in label],
            "program": self.build_origin,
            "build_ms": round(self.build_seconds * 1e3, 3),
            "work_group_sizes": "tuned" if self.tuned else "default (up to 16x4)",
            "device_bytes": self.device_bytes,
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
