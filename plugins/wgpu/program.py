"""A partition's kernel plan for WebGPU: the kit's plan (:mod:`delegate.gpu.plan`) with rendered shaders.

Planning fuses ops into groups (:mod:`delegate.gpu.fusion`), turns each group
into kernels (:mod:`.kernels`), and assigns buffers with the kit's
:class:`~delegate.gpu.plan.BufferPlanner` (lifetime-shared scratch; a reshape
that keeps the PHWC4 bytes shares its input's buffer).

A :class:`Program` holds no device objects, so it serialises to bytes and a
later run on the same device can skip planning, WGSL generation and weight
packing altogether (see :mod:`.compiled`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from delegate.plugin_api import CompileError, CompileOptions, Partition
from delegate.gpu import Group, plan_groups
from delegate.gpu.fusion import elementwise_steps
from delegate.gpu.constants import is_quantized
from delegate.gpu.layout import host_order
from delegate.gpu.lowering import boundary_call
from delegate.gpu.plan import BufferSpec, KernelPlan, LaunchSpec, TensorSpec

from .kernels import FOLDS, KernelList, spell
from .shaders import Kernel
from .tiling import DeviceShape

PARAMS_ALIGNMENT = 256  # WebGPU's largest minUniformBufferOffsetAlignment
STORAGE_DTYPES = {"f32": np.float32, "f16": np.float16}


@dataclass(frozen=True)
class Variant:
    """Another tiling of a launch, which tuning times against the chosen one."""

    source: str
    groups: tuple[int, int, int]
    tiling: str


@dataclass
class Program(KernelPlan):
    """The kit's plan with WebGPU's dialect data: each launch's ``params`` name its shader (an index
    into ``shaders``, the rendered WGSL), its uniform contents ((offset, size) from ``params_start``
    in the blob) and its tiling; its ``args`` are its bindings (``write`` for a writable one) in
    binding order, the uniform coming last."""

    shaders: list[str] = field(default_factory=list)
    params_start: int = 0  # the blob holds constants, then (from here) every launch's uniform contents
    variants: dict[int, list[Variant]] = field(default_factory=dict)  # launch -> other tilings (not stored)

    TRANSIENT = ("blob", "variants")


def plan_kernels(partition: Partition, options: CompileOptions, fuse: bool, max_buffers: int,
                 device: DeviceShape, storage_f32: bool, tuning: bool = False) -> KernelList:
    """Kernels of the partition, fusing as far as each kernel stays within ``max_buffers`` storage buffers;
    an output no kernel of the partition reads is stored in host order by its own kernel (the kit's
    :meth:`~delegate.gpu.lowering.Lowering.host_write`)."""
    keep = {t.index for t in partition.outputs}
    while True:
        groups = plan_groups(partition.ops, keep, float_view=options.allow_quantized, can_host=lambda op: fuse)
        plan = KernelList(device, tuning)
        plan.receive(partition.inputs, partition.outputs, partition.ops, storage_f32)
        if fuse:
            plan.fold(groups, keep, FOLDS)
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
    plan = plan_kernels(partition, options, fuse, limits["max-storage-buffers-per-shader-stage"], device,
                        storage == "f32", tuning)
    tensors = {t.index: t for t in partition.graph.tensors}
    itemsize = np.dtype(STORAGE_DTYPES[storage]).itemsize

    plan.tensors = tensors
    planner = plan.planner((t.index for t in partition.inputs), (t.index for t in partition.outputs))
    for position, kernel in enumerate(plan.kernels):
        for binding in kernel.bindings:
            plan.use(planner, binding.value, itemsize, position)
    for t in partition.outputs:
        plan.use(planner, t.index, itemsize, None)
    for t in partition.inputs:
        if planner.used(t.index):  # read by a kernel, or the storage of an output (a free reshape)
            plan.use(planner, t.index, itemsize, None)
    buffer_of, buffers, blob = planner.assign(lambda key: plan.constant_bytes(key, STORAGE_DTYPES[storage]))
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

    def dispatch(kernel: Kernel) -> LaunchSpec:
        shader = shaders.setdefault(kernel.source(storage, workgroup), len(shaders))
        data = kernel.params_bytes()
        params.extend(bytes(-len(params) % PARAMS_ALIGNMENT))
        spec = LaunchSpec(kernel.template, [["write" if b.writable else "buffer", buffer_of[b.value]]
                                        for b in kernel.bindings], list(groups_of(kernel)), kernel.label,
                          kernel.ops, {"shader": shader, "uniform": [len(params), len(data)], "tiling": kernel.tiling})
        params.extend(data)
        return spec

    dispatches = [dispatch(kernel) for kernel in plan.kernels]
    variants = {i: [Variant(v.source(storage, workgroup), groups_of(v), v.tiling) for v in kernel.variants]
                for i, kernel in enumerate(plan.kernels) if kernel.variants}

    def boundary(index: int, host_in: bool) -> TensorSpec:
        t = tensors[index]
        spec = TensorSpec(index, buffer_of[index], list(t.shape), t.dtype.name)
        if is_quantized(t):
            spec.quant = [float(t.quantization.scale[0]), float(t.quantization.zero_point[0])]
        spec.host_layout = planner.root(index) in plan.host_bytes  # read or stored so by its kernel
        if host_in and spec.host_layout:
            spec.host_dtype = plan.host_inputs[index].dtype
        if spec.host_layout or (host_in and spec.quant) or (storage == "f32" and host_order(t.shape)):
            return spec
        staging = ("host order", index, host_in)
        buffer_of[staging] = spec.staging = len(buffers)
        buffers.append(BufferSpec(4 * max(int(np.prod(t.shape)), 1), "staging"))
        spec.convert = dispatch(spell(boundary_call(staging, t, host_in)))
        return spec

    program_inputs = [boundary(t.index, True) for t in partition.inputs if planner.used(t.index)]
    program_outputs = [boundary(t.index, False) for t in partition.outputs]
    params_start = -(-len(blob) // PARAMS_ALIGNMENT) * PARAMS_ALIGNMENT
    blob = bytes(blob) + bytes(params_start - len(blob)) + bytes(params)

    facts = {
        "kernels": len(dispatches),
        "launches": [k.label for k in plan.kernels],
        "f16_arithmetic": [k.label for k in plan.kernels if k.half and storage == "f16"],
        "tilings": {k.label: k.tiling for k in plan.kernels if k.tiling},
        "fused": [[op.index for op in g.ops] for g in plan.groups if g.fused],
        "shaders": len(shaders),
    }
    program = Program(storage, dispatches, buffers, program_inputs, program_outputs, facts, blob, list(shaders),
                      params_start, variants)
    facts["buffer_bytes"] = program.buffer_bytes()
    facts["device_bytes"] = sum(facts["buffer_bytes"].values())
    return program


def _flat_groups(invocations: int, workgroup: int, most: int) -> tuple[int, int, int]:
    """Workgroups of a flat kernel: along x, wrapping into y past the adapter's per-dimension limit."""
    groups = max(-(-invocations // workgroup), 1)
    x = min(groups, most)
    return x, -(-groups // x), 1
