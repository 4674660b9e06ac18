"""The ``wgpu`` backend: negotiates ops with the planner and compiles partitions into WebGPU programs."""

from __future__ import annotations

import hashlib
import logging
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

import numpy as np

from delegate.backend import Backend, CompiledPartition, CompileOptions, Partition, Support
from delegate.cache import EntryStore, cache_key, ops_fingerprint
from delegate.gpu.dialect import WGSL
from delegate.gpu.fusion import runs_no_kernel
from delegate.gpu.layout import phwc4_vectors, slices
from delegate.gpu.precision import Precision, choose_precision
from delegate.gpu.registry import supports
from delegate.ir import Op

from . import __version__
from .compiled import DeviceTensor, HostTensor, WgpuCompiled
from .device import AdapterRequest, describe_adapter, device_facts, open_device
from .kernels import DIALECT, FOLDS
from .program import Program, build_program
from .tiling import DeviceShape
from .tuning import tune

log = logging.getLogger(__name__)
# op -> input holding weights packed as 4x4 blocks (padded on both channel axes, so larger than the tensor)
BLOCK_WEIGHTS = {"CONV_2D": 1, "FULLY_CONNECTED": 1, "TRANSPOSE_CONV": 1, "Convolution2DTransposeBias": 1, "LSTM": 2}


@lru_cache(maxsize=1)
def shader_digest() -> str:
    """Digest of every shader template and the dialect's rendered code: a cached plan is only valid for the
    sources it was made from."""
    digest = hashlib.sha256(WGSL.definitions().encode())
    for entry in sorted(resources.files("delegate_wgpu").joinpath("shaders").iterdir(), key=lambda e: e.name):
        digest.update(entry.name.encode() + entry.read_bytes())
    return digest.hexdigest()


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
    is_accelerator = True

    def __init__(self, options: Mapping[str, Any] | None = None):
        self.request = AdapterRequest.from_options(dict(options or {}))
        self.context = open_device(self.request)
        self.facts = device_facts(self.context)
        self.shape = DeviceShape.of(self.facts["adapter_type"], self.context.limits,
                                    self.context.subgroups and self.request.subgroups)

    def precision(self, options: CompileOptions) -> Precision:
        """The kit's choice for ``options`` on this adapter, with what half precision means here."""
        return choose_precision(options.precision, "shader-f16", self.context.f16,
                                "activations and weights are stored as f16, convolutions and matrix products "
                                "multiply and accumulate in f16 (kernels listed under f16_arithmetic), epilogues, "
                                "softmax and reductions compute in f32")

    def half_precision(self) -> tuple[bool, str]:
        if self.context.f16:
            return True, "the adapter has shader-f16: half storage, and half arithmetic in products"
        return False, "the adapter lacks the shader-f16 feature"

    def supports(self, op: Op, options: CompileOptions) -> Support:
        answer = supports(DIALECT, op, options)
        if not answer:
            return answer
        limits = self.context.limits
        needed, most = storage_buffers_needed(op), limits["max-storage-buffers-per-shader-stage"]
        if needed > most:
            return Support.no(f"needs {needed} storage buffers in one kernel; the adapter allows {most} per stage")
        itemsize = self.precision(options).dtype.itemsize
        what, nbytes = largest_binding(op, itemsize)
        limit = min(limits["max-storage-buffer-binding-size"], limits["max-buffer-size"])
        if nbytes > limit:
            return Support.no(f"{what} needs a {nbytes}-byte buffer; the adapter binds at most {limit} bytes")
        return Support.yes()

    def estimate_ms(self, op: Op, options: CompileOptions) -> float | None:
        """Nothing for ops that never run (folded DEQUANTIZE, a reshape keeping the bytes, a PAD or a gating MUL
        done by the convolution reading it); else the roofline."""
        return 0.0 if runs_no_kernel(op, FOLDS) else None

    def compile(self, partition: Partition, options: CompileOptions) -> CompiledPartition:
        """The partition's program (from the plan cache when one is configured and holds it), made real.

        With ``inference_preference: sustained_speed`` a newly planned program has its tilings timed on
        the device first (:mod:`.tuning`); the cache then keeps the tuned program."""
        precision = self.precision(options)
        storage = precision.storage
        tuning = options.inference_preference == "sustained_speed"
        store, key = self._cache_entry(partition, options, storage, tuning)
        program, source = self._cached(store, key), "cache"
        if program is None:
            program, source = build_program(partition, options, storage, self.request.workgroup_size,
                                            self.context.limits, self.shape, self.request.fuse, tuning), "planned"
        compiled = WgpuCompiled(self.context, program, {})
        if program.variants:
            tune(compiled)
            source = "tuned"
        if store is not None and source != "cache":
            store.store(key, "plan", program.to_bytes())
        compiled.facts = {"adapter": describe_adapter(self.context.adapter),
                          "precision": precision.name, "precision_reason": precision.reason,
                          "plan_source": source, **program.facts}
        return compiled

    def _cache_entry(self, partition: Partition, options: CompileOptions, storage: str,
                     tuning: bool) -> tuple[EntryStore | None, str]:
        """Where the partition's plan is cached, and under which key; (None, "") without a cache."""
        if not (options.cache_dir and options.model_token):
            return None, ""
        store = EntryStore(options.cache_dir, "wgpu", options.model_token)
        return store, cache_key({
            "model": options.model_token, "ops": ops_fingerprint(partition.ops),
            "inputs": [(t.index, t.shape, t.dtype.name) for t in partition.inputs],
            "outputs": [(t.index, t.shape, t.dtype.name) for t in partition.outputs],
            "storage": storage, "allow_quantized": options.allow_quantized, "fuse": self.request.fuse,
            "workgroup": self.request.workgroup_size, "tiling": self.shape, "tuned": tuning, "device": self.facts,
            "shaders": shader_digest(), "plugin": __version__})

    @staticmethod
    def _cached(store: EntryStore | None, key: str) -> Program | None:
        raw = store.load(key, "plan") if store is not None else None
        if raw is None:
            return None
        try:
            return Program.from_bytes(raw)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("wgpu: cached plan %s could not be read (%s); planning again", key[:12], exc)
            return None

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
