"""A partition's plan for the device, as plain data: shaders, buffers, dispatches, inputs and outputs.

Planning fuses ops into groups (:mod:`delegate.gpu.fusion`), turns each group
into kernels (:mod:`.kernels`), and assigns buffers: partition inputs,
outputs and constants get their own; tensors living only inside the
partition share buffers wherever their lifetimes (in launch order) do not
overlap.  A reshape that keeps the PHWC4 bytes shares its input's buffer.

A :class:`Program` holds no device objects, so it serialises to bytes and a
later run on the same device can skip planning, WGSL generation and weight
packing altogether (see :mod:`.compiled`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from typing import Any, Hashable

import numpy as np

from delegate.plugin_api import CompileError, CompileOptions, Partition
from delegate.gpu import Group, constant_value, plan_groups, to_phwc4
from delegate.gpu.fusion import elementwise_steps
from delegate.gpu.constants import is_quantized
from delegate.gpu.layout import as_nhwc, phwc4_vectors

from .kernels import KernelPlan, folds_into_reader, host_to_phwc4, phwc4_to_host
from .shaders import Kernel
from .tiling import DeviceShape

PARAMS_ALIGNMENT = 256  # WebGPU's largest minUniformBufferOffsetAlignment
STORAGE_DTYPES = {"f32": np.float32, "f16": np.float16}


@dataclass
class BufferSpec:
    nbytes: int
    role: str  # "input" | "output" | "constant" | "scratch" (shared by lifetime)
    data: tuple[int, int] | None = None  # (offset, size) of a constant's bytes in the blob


@dataclass
class DispatchSpec:
    shader: int
    bindings: list[tuple[int, bool]]  # (buffer, writable) in binding order; the uniform comes last
    params: tuple[int, int]  # (offset, size) of the uniform contents from the program's params_start
    groups: tuple[int, int, int]  # workgroups along x, y, z
    label: str
    ops: list[int] = field(default_factory=list)
    tiling: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DispatchSpec":
        return cls(d["shader"], [tuple(x) for x in d["bindings"]], tuple(d["params"]), tuple(d["groups"]),
                   d["label"], d["ops"], d["tiling"])


@dataclass(frozen=True)
class Variant:
    """Another tiling of a dispatch, which tuning times against the chosen one."""

    source: str
    groups: tuple[int, int, int]
    tiling: str


@dataclass
class TensorSpec:
    """A tensor crossing the partition boundary: where it lives and how the host reads it.

    ``staging`` holds the tensor in host order (NHWC float32) and ``convert`` moves it between there
    and ``buffer`` on the device, so the host never reorders data; neither is set when the host
    bytes are the buffer's (four channels, storage f32) or when the host converts (quantized inputs).
    """

    index: int
    buffer: int
    shape: list[int]
    dtype: str
    quant: list[float] | None = None  # (scale, zero point) of a quantized tensor in the float view
    staging: int | None = None
    convert: DispatchSpec | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorSpec":
        convert = d.pop("convert")
        return cls(**d, convert=DispatchSpec.from_dict(convert) if convert else None)


def host_order(shape) -> bool:
    """Whether a tensor's PHWC4 storage holds its values in NHWC order (one slice, or one pixel)."""
    n, h, w, c = as_nhwc(shape)
    return c == 4 or (c % 4 == 0 and h * w == 1)


@dataclass
class Program:
    storage: str
    shaders: list[str]
    buffers: list[BufferSpec]
    dispatches: list[DispatchSpec]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    facts: dict[str, Any] = field(default_factory=dict)
    params_start: int = 0  # the blob holds constants, then (from here) every dispatch's uniform contents
    blob: bytes = b""
    variants: dict[int, list[Variant]] = field(default_factory=dict)  # dispatch -> other tilings (not stored)

    def to_bytes(self) -> bytes:
        head = {k: v for k, v in asdict(self).items() if k not in ("blob", "variants")}
        text = json.dumps(head).encode()
        return struct.pack("<Q", len(text)) + text + self.blob

    @classmethod
    def from_bytes(cls, raw: bytes) -> "Program":
        (size,) = struct.unpack_from("<Q", raw)
        head = json.loads(raw[8:8 + size])
        return cls(head["storage"], head["shaders"],
                   [BufferSpec(b["nbytes"], b["role"], tuple(b["data"]) if b["data"] else None)
                    for b in head["buffers"]],
                   [DispatchSpec.from_dict(d) for d in head["dispatches"]],
                   [TensorSpec.from_dict(t) for t in head["inputs"]],
                   [TensorSpec.from_dict(t) for t in head["outputs"]],
                   head["facts"], head["params_start"], raw[8 + size:])


def plan_kernels(partition: Partition, options: CompileOptions, fuse: bool, max_buffers: int,
                 device: DeviceShape, tuning: bool = False) -> KernelPlan:
    """Kernels of the partition, fusing as far as each kernel stays within ``max_buffers`` storage buffers."""
    keep = {t.index for t in partition.outputs}
    members = {id(op) for op in partition.ops}
    while True:
        groups = plan_groups(partition.ops, keep, float_view=options.allow_quantized, can_host=lambda op: fuse)
        plan = KernelPlan(device, tuning)
        for group in groups if fuse else ():
            if (folds_into_reader(group) and id(group.output.uses[0]) in members and group.output.index not in keep
                    and group.root.inputs[0].index not in plan.folded):  # a reader does one fold at most
                plan.folded[group.output.index] = group
        for group in groups:
            first = len(plan.kernels)
            plan.add(group)
            bindings = max(len(k.bindings) for k in plan.kernels[first:]) if len(plan.kernels) > first else 0
            if group.fused and bindings > max_buffers:
                fitting = _ops_within(group, bindings, max_buffers, options.allow_quantized)
                keep.add(group.ops[fitting - 1].outputs[0].index)  # the group ends there; plan again
                break
        else:
            return plan


def _ops_within(group: Group, bindings: int, max_buffers: int, float_view: bool) -> int:
    """How many of the group's ops one kernel can apply when each tensor operand costs a storage buffer."""
    def operands(steps) -> int:
        return sum(1 for s in steps if s.kind == "binary" and not s.scalar)

    follower_steps, value = [], group.root.outputs[0]
    for op in group.fused:
        follower_steps.append(elementwise_steps(op, value, float_view))
        value = op.outputs[0]
    root_steps = group.steps[:len(group.steps) - sum(len(s) for s in follower_steps)]
    used = bindings - operands(group.steps) + operands(root_steps)
    count = 1
    for steps in follower_steps:
        used += operands(steps)
        if used > max_buffers:
            break
        count += 1
    return count


def build_program(partition: Partition, options: CompileOptions, storage: str, workgroup: int,
                  limits: dict[str, int], device: DeviceShape, fuse: bool = True, tuning: bool = False) -> Program:
    """Plan ``partition`` for a device with ``limits``; raises CompileError when it cannot fit.  With
    ``tuning`` the tiled kernels bring the variants :mod:`.tuning` chooses from."""
    plan = plan_kernels(partition, options, fuse, limits["max-storage-buffers-per-shader-stage"], device, tuning)
    tensors = {t.index: t for t in partition.graph.tensors}
    itemsize = np.dtype(STORAGE_DTYPES[storage]).itemsize

    def root_of(key: Hashable) -> Hashable:
        """The value whose buffer ``key`` uses (a reshape keeping the PHWC4 bytes shares its input's)."""
        while key in plan.aliases:
            key = plan.aliases[key]
        return key

    inputs = {t.index for t in partition.inputs}
    outputs = {t.index for t in partition.outputs}

    roles: dict[Hashable, str] = {}  # storage root -> input | output | constant | scratch
    sizes: dict[Hashable, int] = {}
    span: dict[Hashable, list[int]] = {}  # storage root -> [first, last] kernel using it

    def register(key: Hashable, position: int | None) -> None:
        root = root_of(key)
        if root not in roles:
            if root in plan.constants:
                roles[root], sizes[root] = "constant", plan.constants[root].nbytes // 4 * itemsize
            else:
                shape = plan.temporaries[root] if root in plan.temporaries else tensors[root].shape
                sizes[root] = phwc4_vectors(shape) * 4 * itemsize
                roles[root] = "constant" if root in tensors and constant_value(tensors[root]) is not None else "scratch"
        if key in inputs:
            roles[root] = "input"
        elif key in outputs and roles[root] == "scratch":
            roles[root] = "output"
        if position is not None:
            span.setdefault(root, [position, position])[1] = position

    for position, kernel in enumerate(plan.kernels):
        for binding in kernel.bindings:
            register(binding.value, position)
    for index in outputs:
        register(index, None)
    for index in inputs:
        if root_of(index) in roles:  # read by a kernel, or the storage of an output (a free reshape)
            register(index, None)

    buffer_of, buffers, blob = _assign_buffers(roles, sizes, span, plan, tensors, storage)
    limit = limits["max-storage-buffer-binding-size"]
    for spec in buffers:
        if spec.nbytes > limit:
            raise CompileError(f"a buffer of {spec.nbytes} bytes exceeds the adapter's storage binding limit {limit}")

    shaders: dict[str, int] = {}
    params = bytearray()
    most = limits["max-compute-workgroups-per-dimension"]

    def groups_of(kernel: Kernel) -> tuple[int, int, int]:
        groups = kernel.grid or _flat_groups(kernel.invocations, workgroup, most)
        if max(groups) > most:
            raise CompileError(f"{kernel.label}: {groups} workgroups exceed the adapter's dispatch limit {most}")
        return groups

    def dispatch(kernel: Kernel) -> DispatchSpec:
        shader = shaders.setdefault(kernel.source(storage, workgroup), len(shaders))
        data = kernel.params_bytes()
        params.extend(bytes(-len(params) % PARAMS_ALIGNMENT))
        spec = DispatchSpec(shader, [(buffer_of[root_of(b.value)], b.writable) for b in kernel.bindings],
                            (len(params), len(data)), groups_of(kernel), kernel.label, kernel.ops, kernel.tiling)
        params.extend(data)
        return spec

    dispatches = [dispatch(kernel) for kernel in plan.kernels]
    variants = {i: [Variant(v.source(storage, workgroup), groups_of(v), v.tiling) for v in kernel.variants]
                for i, kernel in enumerate(plan.kernels) if kernel.variants}

    def boundary(index: int, host_in: bool) -> TensorSpec:
        t = tensors[index]
        spec = TensorSpec(index, buffer_of[root_of(index)], list(t.shape), t.dtype.name)
        if is_quantized(t):
            spec.quant = [float(t.quantization.scale[0]), float(t.quantization.zero_point[0])]
        if (host_in and spec.quant) or (storage == "f32" and host_order(t.shape)):
            return spec
        staging = ("host order", index, host_in)
        buffer_of[staging] = spec.staging = len(buffers)
        buffers.append(BufferSpec(4 * max(int(np.prod(t.shape)), 1), "staging"))
        spec.convert = dispatch((host_to_phwc4 if host_in else phwc4_to_host)(staging, index, t.shape))
        return spec

    program_inputs = [boundary(t.index, True) for t in partition.inputs if root_of(t.index) in roles]
    program_outputs = [boundary(t.index, False) for t in partition.outputs]
    params_start = -(-len(blob) // PARAMS_ALIGNMENT) * PARAMS_ALIGNMENT
    blob = bytes(blob) + bytes(params_start - len(blob)) + bytes(params)

    facts = {
        "dispatches": len(dispatches),
        "kernels": [k.label for k in plan.kernels],
        "f16_arithmetic": [k.label for k in plan.kernels if k.half and storage == "f16"],
        "tilings": {k.label: k.tiling for k in plan.kernels if k.tiling},
        "fused": [[op.index for op in g.ops] for g in plan.groups if g.fused],
        "shaders": len(shaders),
        "buffer_bytes": {role: sum(b.nbytes for b in buffers if b.role == role)
                         for role in ("input", "output", "constant", "scratch", "staging")},
    }
    return Program(storage, list(shaders), buffers, dispatches, program_inputs, program_outputs, facts,
                   params_start, blob, variants)


def _flat_groups(invocations: int, workgroup: int, most: int) -> tuple[int, int, int]:
    """Workgroups of a flat kernel: along x, wrapping into y past the adapter's per-dimension limit."""
    groups = max(-(-invocations // workgroup), 1)
    x = min(groups, most)
    return x, -(-groups // x), 1


def _assign_buffers(roles, sizes, span, plan: KernelPlan, tensors, storage: str):
    """Buffer per storage root: own buffers for inputs, outputs and constants; scratch shared by lifetime."""
    dtype = STORAGE_DTYPES[storage]
    buffers: list[BufferSpec] = []
    buffer_of: dict[Hashable, int] = {}
    blob = bytearray()
    for root, role in roles.items():
        if role == "scratch":
            continue
        data = None
        if role == "constant":
            if root in plan.constants:
                values = plan.constants[root]
            else:
                t = tensors[root]
                values = to_phwc4(constant_value(t).reshape(t.shape), np.float32)
            raw = np.ascontiguousarray(values, dtype).tobytes()
            blob.extend(bytes(-len(blob) % 16))
            data = (len(blob), len(raw))
            blob.extend(raw)
        buffer_of[root] = len(buffers)
        buffers.append(BufferSpec(sizes[root], role, data))
    free: list[int] = []
    active: list[tuple[int, int]] = []  # (last use, buffer)
    for root in sorted((r for r, role in roles.items() if role == "scratch"), key=lambda r: span[r][0]):
        first, last = span[root]
        for item in [a for a in active if a[0] < first]:
            active.remove(item)
            free.append(item[1])
        need = sizes[root]
        fitting = [b for b in free if buffers[b].nbytes >= need]
        chosen = min(fitting, key=lambda b: buffers[b].nbytes) if fitting else (
            max(free, key=lambda b: buffers[b].nbytes) if free else None)
        if chosen is None:
            chosen = len(buffers)
            buffers.append(BufferSpec(need, "scratch"))
        else:
            free.remove(chosen)
            buffers[chosen].nbytes = max(buffers[chosen].nbytes, need)
        buffer_of[root] = chosen
        active.append((last, chosen))
    return buffer_of, buffers, blob
