"""The ``wgpu`` backend: negotiates ops with the planner and compiles partitions into WebGPU programs."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from delegate.gpu.dialect import WGSL
from delegate.gpu.fusion import ReaderFolds, fusions_of, placement_groups, runs_no_kernel
from delegate.gpu.layout import phwc4_vectors, slices
from delegate.gpu.profile import default_profile
from delegate.gpu.plan import PlanCache, code_digest
from delegate.gpu.precision import Precision, choose_precision
from delegate.gpu.registry import supports
from delegate.gpu.remembered import LazyDevice
from delegate.gpu.waits import WaitLimit
from delegate.plugin_api import Backend, CompileOptions, CompiledPartition, DeviceProfile, Op, Partition, Support

from . import __version__
from .compiled import DeviceTensor, HostTensor, WgpuCompiled
from .device import (AdapterRequest, DeviceContext, bounded_maps, check_workgroup_size, describe_adapter, describe_facts,
                     device_facts, import_wgpu, open_device, remembered)
from .kernels import DIALECT, FOLDS
from .program import Program, build_program
from .tiling import DeviceShape
from .tuning import tune

# op -> input holding weights packed as 4x4 blocks (padded on both channel axes, so larger than the tensor)
BLOCK_WEIGHTS = {"CONV_2D": 1, "FULLY_CONNECTED": 1, "TRANSPOSE_CONV": 1, "Convolution2DTransposeBias": 1, "LSTM": 2}


def storage_buffers_needed(op: Op) -> int:
    """Storage buffers the op's own kernel binds (before any fused op adds operands)."""
    if op.opcode in ("CONCATENATION", "PACK"):
        return len(op.inputs) + 1
    return 4  # output, input, weights and bias at most


def largest_binding(op: Op, itemsize: int) -> tuple[str, int]:
    """(what, bytes) of the largest buffer the op's kernels bind: a tensor, or its packed weights."""
    sizes = [(f"tensor {t.name!r}", phwc4_vectors(t.shape) * 4 * itemsize)
             for t in list(op.inputs) + list(op.outputs) if t is not None and len(t.shape) <= 4]
    weights = op.input(BLOCK_WEIGHTS[op.opcode]) if op.opcode in BLOCK_WEIGHTS else None
    if weights is not None and len(weights.shape) in (2, 4):
        inner = op.inputs[0].shape[-1] if op.opcode == "CONV_2D" else weights.shape[-1]
        middle = int(np.prod(weights.shape[1:-1]))
        sizes.append(("packed weights", slices(weights.shape[0]) * 4 * middle * slices(inner) * 4 * itemsize))
    return max(sizes, key=lambda s: s[1])


class WgpuBackend(Backend):
    """WGSL kernels on PHWC4 buffers of one WebGPU adapter."""

    name = "wgpu"
    layout = "PHWC4"
    precisions = ("fp32", "fp16")
    fusions = fusions_of(FOLDS)  # the groups placement keeps together: what the lowering folds

    def __init__(self, options: Mapping[str, Any] | None = None):
        """Plans from the adapter's remembered facts where an earlier process stored them; the device itself
        opens when a partition first compiles (``context``)."""
        self.request = AdapterRequest.from_options(dict(options or {}))
        self.device = LazyDevice("wgpu", remembered(self.request), "wgpu", import_wgpu,
                                 lambda: open_device(self.request), device_facts)
        self.facts = self.device.facts
        check_workgroup_size(self.request, self.facts["limits"], describe_facts(self.facts))
        self.shape = DeviceShape.of(self.facts["adapter_type"], self.facts["limits"],
                                    self.facts["subgroups"] and self.request.subgroups)
        self.wait_limit = WaitLimit()  # set by ``bound_waits``, read by every partition's waits

    @property
    def context(self) -> DeviceContext:
        """The open device (see ``LazyDevice``)."""
        return self.device.opened()

    def precision(self, options: CompileOptions) -> Precision:
        """The kit's choice for ``options`` on this adapter, with what half precision means here."""
        return choose_precision(options.precision, "shader-f16", self.facts["shader_f16"],
                                "activations and weights are stored as f16, convolutions and matrix products "
                                "multiply and accumulate in f16 (kernels listed under f16_arithmetic), epilogues, "
                                "softmax and reductions compute in f32")

    def default_profile(self) -> DeviceProfile:
        return default_profile(self.device_info())

    def half_precision(self) -> tuple[bool, str]:
        if self.facts["shader_f16"]:
            return True, "the adapter has shader-f16: half storage, and half arithmetic in products"
        return False, "the adapter lacks the shader-f16 feature"

    def supports(self, op: Op, options: CompileOptions) -> Support:
        answer = supports(DIALECT, op, options)
        if not answer:
            return answer
        limits = self.facts["limits"]
        needed, most = storage_buffers_needed(op), limits["max-storage-buffers-per-shader-stage"]
        if needed > most:
            return Support.no(f"needs {needed} storage buffers in one kernel; the adapter allows {most} per stage")
        itemsize = self.precision(options).dtype.itemsize
        what, nbytes = largest_binding(op, itemsize)
        limit = min(limits["max-storage-buffer-binding-size"], limits["max-buffer-size"])
        if nbytes > limit:
            return Support.no(f"{what} needs a {nbytes}-byte buffer; the adapter binds at most {limit} bytes")
        return Support.yes()

    def placement_groups(self, ops, keep, options: CompileOptions) -> list:
        fuse = self.request.fuse
        return placement_groups(ops, keep, FOLDS if fuse else ReaderFolds(), float_view=options.allow_quantized,
                                can_host=lambda op: fuse)

    def estimate_ms(self, op: Op, options: CompileOptions) -> float | None:
        """Nothing for ops that never run (folded DEQUANTIZE, a reshape keeping the bytes); else the roofline
        (what a kernel folds is in ``placement_groups``)."""
        return 0.0 if runs_no_kernel(op, options.allow_quantized) else None

    def compile(self, partition: Partition, options: CompileOptions) -> CompiledPartition:
        """The partition's program (from the plan cache when one is configured and holds it), made real.

        With ``inference_preference: sustained_speed`` a newly planned program has its tilings timed on
        the device first (:mod:`.tuning`); the cache then keeps the tuned program."""
        precision = self.precision(options)
        storage = precision.storage
        tuning = options.inference_preference == "sustained_speed"
        cache = PlanCache("wgpu", partition, options, {
            "storage": storage, "fuse": self.request.fuse, "workgroup": self.request.workgroup_size,
            "tiling": self.shape, "tuned": tuning, "device": self.facts, "code": code_digest("delegate_wgpu", WGSL.definitions()),
            "plugin": __version__})
        program, source = cache.load(Program), "cache"
        if program is None:
            program, source = build_program(partition, options, storage, self.request.workgroup_size,
                                            self.context.limits, self.shape, self.request.fuse, tuning), "planned"
        compiled = WgpuCompiled(self.context, program, {}, self.wait_limit)
        if program.variants:
            tune(compiled)
            source = "tuned"
        if source != "cache":
            cache.store_plan(program)
        compiled.facts = {"adapter": describe_adapter(self.context.adapter),
                          "precision": precision.name, "precision_reason": precision.reason,
                          "plan_source": source, **program.facts}
        return compiled

    def bound_waits(self, seconds: float | None) -> bool:
        """Where this wgpu-py lets a map be waited for with a limit (``device.bounded_maps``): a run only records
        and submits, and the wait for its outputs (mapping their read-back buffers) gives up after ``seconds``,
        so runs need no watchdog thread.  The wait sleeps on the event wgpu-py's polling thread sets, as its
        own unbounded wait does, on a GPU and a CPU adapter alike."""
        if not bounded_maps():
            return False
        self.wait_limit.seconds = seconds
        return True

    def to_device(self, array: np.ndarray) -> HostTensor:
        """Boundary conversion NHWC -> PHWC4; the partition reading it uploads it into its input buffer."""
        return HostTensor(np.asarray(array))

    def to_host(self, value: Any) -> np.ndarray:
        if isinstance(value, DeviceTensor):
            return value.to_host()
        if isinstance(value, HostTensor):
            return value.array
        return np.asarray(value)

    def device_info(self) -> dict[str, Any]:
        return dict(self.facts)
