"""From fused groups to a kernel plan: the launches, packed weights and arguments of one partition.

Everything here happens once, at compile time and without a device: constants
are converted to the float view and packed, and each group becomes one launch
(two when a layout change must follow; none when the next kernel computes it,
see ``lower_all``) whose argument list is complete, so running the partition
is only enqueueing kernels.  Buffers are assigned by the kit's buffer planner
(tensors whose lifetimes do not overlap share one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Sequence

import numpy as np

from delegate.gpu.constants import constant_value
from delegate.gpu.dialect import OPENCL, unary_chain
from delegate.gpu.fusion import Group, ReaderFolds, Step, chain_grids, gate_grid, gate_operands, is_matmul
from delegate.gpu.layout import (as_nhwc, dense_groups, host_order, pack_conv_weights, pack_depthwise_weights,
                                 pack_vector, phwc4_vectors, slices)
from delegate.gpu.lowering import (BroadcastArg, Call, ConstantArg, HostArg, Lowering, ParamArg, TensorArg, boundary_call,
                                   Product, conv_input, epilogue_operands, window_params)
from delegate.gpu.plan import BufferSpec, KernelPlan, LaunchSpec, TensorSpec
from delegate.gpu.registry import declare_templates
from delegate.plugin_api import Op, Partition, Tensor

from .geometry import MATVEC_GROUP, MATVEC_ROWS, grid, matmul_shape, pow2_at_least, reduction_shape, round_to
from .program import STORE_HOST, Variant, templates
from .program import variant as template_variant

DIALECT = "opencl"


def _stages_input(reader: Op) -> bool:
    """A 1x1 convolution with more rows than a matvec.cl product (matmul.cl stages its input)."""
    n, h, w, _ = as_nhwc(reader.inputs[0].shape)
    return n * h * w > MATVEC_ROWS


# The groups the kernels do inside their reader's kernel: a zero PAD of rows and columns read by a
# windowed convolution (not a product, which reads no padding) as more padding; a depthwise
# convolution or a gate product computed where matmul.cl stages a 1x1 convolution's input; two
# one-pixel 1x1 convolutions (a squeeze-and-excitation bottleneck) as dense_pair.cl; a reshape read by
# a concatenation through its view (gather.cl's GATHER_VIEWS).
FOLDS = ReaderFolds(pad=lambda reader: reader.opcode == "DEPTHWISE_CONV_2D" or not is_matmul(reader),
                    gate=_stages_input, depthwise=_stages_input, chain=lambda reader: True,
                    reshape=lambda reader: True, nested=True)


# Work items per compute unit that keep the device busy: a convolution giving fewer shares each output's
# reduction among a work group instead (the kit's decision, delegate.gpu.lowering.conv_2d).
SPLIT_ITEMS_PER_UNIT = 16


@dataclass
class Launch:
    """One kernel enqueue: which variant, its arguments (``lowering.i32`` and kin; buffers as
    ``["buffer", value]``), its grid and the ops it computes.

    ``local_size`` is set when the kernel is written for one work-group shape (it shares local
    memory); otherwise the shape is chosen at compile time (default or tuned).
    """

    variant: Variant
    args: list[Any]
    global_size: tuple[int, int, int]
    ops: list[Op]
    local_size: tuple[int, int, int] | None = None
    label: str = ""

    def __post_init__(self) -> None:
        self.label = self.label or "+".join(f"{op.opcode}#{op.index}" for op in self.ops)


def i32(v) -> list:
    return ["int", int(v)]


def int2(a, b) -> list:
    return ["int2", [int(a), int(b)]]


def int4(a, b, c, d) -> list:
    return ["int4", [int(a), int(b), int(c), int(d)]]


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def _define(launch: Launch, *defines: tuple[str, Any]) -> None:
    variant = launch.variant
    launch.variant = Variant(variant.template, variant.epilogue, variant.defines + tuple(defines))


def _share_pixel(launch: Launch, call: Call) -> None:
    """A work-group reduction over each pixel's slices: GROUP items share a pixel, REDUCTIONS pixels per group."""
    n, h, w, c = as_nhwc(call.output[1])
    items, per_group = reduction_shape(slices(c))
    launch.global_size = (items, round_to(n * h * w, per_group), 1)
    launch.local_size = (items, per_group, 1)
    _define(launch, ("GROUP", items), ("REDUCTIONS", per_group))


def _columns(launch: Launch, call: Call) -> None:
    """Four adjacent output vectors per work item; the depthwise kernel unrolls its KH x KW taps."""
    w, h, z = launch.global_size
    launch.global_size = (-(-w // 4), h, z)
    if call.template == "depthwise_conv2d":
        kw, kh, _, _ = next(arg.value for arg in call.args if isinstance(arg, ParamArg) and arg.name == "window")
        _define(launch, ("KH", kh), ("KW", kw))


def _split(launch: Launch, call: Call) -> None:
    """GROUP work items (local dimension 0) share each output vector (global dimension 1)."""
    group = dict(call.constants)["group"]
    launch.global_size = (group, phwc4_vectors(call.output[1]), 1)
    launch.local_size = (group, 1, 1)


# Kit templates whose launch this dialect shapes (its own work-group algorithms and unrolling).
SHAPED = {"softmax": _share_pixel, "conv2d": _columns, "depthwise_conv2d": _columns, "conv2d_split": _split}


class ClLowering(Lowering):
    """Turns a partition's groups into launches whose arguments name values, not device buffers.

    Values are tensor indices, packed constants (``("constant", n)``, the kit's keys) and temporaries
    (the kit's keys); :meth:`plan` assigns them buffers (:class:`delegate.gpu.plan.BufferPlanner`)
    and returns the partition's :class:`delegate.gpu.plan.KernelPlan`.
    """

    dialect = DIALECT
    image_rows = True  # matmul.cl reads a row per image (plane 1)
    host_readers = frozenset({"conv2d"})  # conv2d.cl reads a partition input in host order (HOST_INPUT)
    # every template storing its output through the prelude's STORE_OUT can store it in host order
    host_writers = frozenset(templates()) - {"layout_in", "layout_out", "lstm_gates"}

    def __init__(self, storage: np.dtype, compute_units: int):
        super().__init__()
        self.storage = np.dtype(storage)
        self.compute_units = compute_units
        self.busy_items = SPLIT_ITEMS_PER_UNIT * compute_units
        self.launches: list[Launch] = []

    # -- values -------------------------------------------------------------
    def upload(self, array: np.ndarray) -> list:
        """A read-only constant holding ``array`` (already in the kernel's layout)."""
        key = ("constant", len(self.constants))
        self.constants[key] = np.ascontiguousarray(array, np.float32)
        return ["buffer", key]

    def tensor(self, t: Tensor) -> list:
        """The buffer argument of ``t`` (its constant value is uploaded once, in PHWC4)."""
        self.tensors[t.index] = t
        return ["buffer", t.index]

    def plan(self, partition: Partition, storage: str) -> KernelPlan:
        """The launches with buffers assigned, and the boundary tensors with their conversions.

        Inputs known at compile time (weights from a DEQUANTIZE folded elsewhere) are constants,
        uploaded once; inputs that are only parameters (a RESHAPE's shape) are not read at all.
        """
        inputs = [t for t in partition.inputs if constant_value(t) is None]
        planner = self.planner((t.index for t in inputs), (t.index for t in partition.outputs))
        itemsize = self.storage.itemsize
        for position, launch in enumerate(self.launches):
            for kind, key in launch.args:
                if kind == "buffer":
                    self.use(planner, key, itemsize, position)
        for t in partition.outputs:
            self.tensors[t.index] = t
            self.use(planner, t.index, itemsize, None)
        inputs = [t for t in inputs if planner.used(t.index)]
        for t in inputs:
            self.use(planner, t.index, itemsize, None)
        buffer_of, buffers, blob = planner.assign(lambda key: self.constant_bytes(key, self.storage))

        def spec(launch: Launch) -> LaunchSpec:
            args = [["buffer", buffer_of[value]] if kind == "buffer" else [kind, value] for kind, value in launch.args]
            variant = launch.variant
            return LaunchSpec(variant.template, args, list(launch.global_size), launch.label,
                              [op.index for op in launch.ops],
                              {"epilogue": variant.epilogue, "defines": variant.defines},
                              None if launch.local_size is None else list(launch.local_size))

        def boundary(t: Tensor, into_device: bool) -> TensorSpec:
            found = TensorSpec(t.index, buffer_of[t.index], list(t.shape), t.dtype.name)
            host = self.host_inputs.get(t.index) if into_device else None
            found.host_layout = planner.root(t.index) in self.host_bytes
            if host is not None:
                found.host_dtype = host.dtype
            if found.host_layout or (host is None and self.storage == np.float32 and host_order(t.shape)):
                return found  # the host copies the NHWC bytes to or from the start of the buffer
            staging = ("staging", t.index)
            buffer_of[staging] = found.staging = len(buffers)
            nbytes = host.nbytes if host is not None else max(int(np.prod(as_nhwc(t.shape))), 1) * 4
            buffers.append(BufferSpec(nbytes, "staging"))
            found.convert = spec(self.spell(boundary_call(staging, t, into_device, host)))
            return found

        launches = [spec(launch) for launch in self.launches]
        crossings = [boundary(t, True) for t in inputs], [boundary(t, False) for t in partition.outputs]
        return KernelPlan(storage, launches, buffers, *crossings, blob=bytes(blob))

    # -- arguments ----------------------------------------------------------
    def dims(self, shape: Sequence[int]) -> list:
        n, h, w, c = as_nhwc(shape)
        return int4(w, h, slices(c), n)

    def out_args(self, buf, shape: Sequence[int]) -> list[Any]:
        return [buf, self.dims(shape), i32(as_nhwc(shape)[3])]

    def epilogue_args(self, steps: Sequence[Step], shape: Sequence[int]) -> list[Any]:
        for step in steps:
            if step.operand is not None:
                self.tensor(step.operand)
        return [part for arg in epilogue_operands(steps, shape).values() for part in self.argument(arg)]

    def argument(self, arg) -> list[list]:
        """The kernel arguments of one argument of the kit's parameter contract."""
        if isinstance(arg, TensorArg):
            extra = [["float4", list(arg.host.dequant)]] if arg.host is not None else []
            extra += [int4(*arg.view)] if arg.view is not None else []
            return [["buffer", arg.value], self.dims(arg.shape), i32(as_nhwc(arg.shape)[3])] + extra
        if isinstance(arg, BroadcastArg):
            return [["buffer", arg.value], self.dims(arg.shape), i32(arg.splat)]
        if isinstance(arg, HostArg):
            return [["buffer", arg.value]]
        if isinstance(arg, ConstantArg):
            return [["buffer", arg.key]]
        assert isinstance(arg, ParamArg)
        return [[arg.kind, list(arg.value) if arg.kind.endswith("4") else arg.value]]

    def spell(self, call: Call) -> Launch:
        """The launch of a kit call: the output's arguments, the call's, then the epilogue's; a template
        this dialect writes as a mapping of gather.cl is that variant of it."""
        args = self.out_args(["buffer", call.output[0]], call.output[1]) if call.output else []
        for arg in call.args:
            args += self.argument(arg)
        shape = call.output[1] if call.output else call.work
        variant = template_variant(call.template, tuple(s.signature() for s in call.steps), call.constants,
                                   sum(isinstance(arg, TensorArg) for arg in call.args))
        return Launch(variant, args + self.epilogue_args(call.steps, shape), grid(call.work), list(call.ops),
                      label=call.label)

    def emit(self, call: Call) -> None:
        launch = self.spell(call)
        if call.template in SHAPED:
            SHAPED[call.template](launch, call)
        self.launches.append(launch)

    def add(self, template: str, steps: Sequence[Step], args: list[Any], out_shape: Sequence[int],
            global_size: tuple[int, int, int], ops: Sequence[Op], defines: tuple = (),
            local_size: tuple[int, int, int] | None = None, label: str = "") -> None:
        variant = Variant(template, tuple(s.signature() for s in steps),
                          tuple((name, _plain(value)) for name, value in defines))
        self.launches.append(Launch(variant, args + self.epilogue_args(steps, out_shape), global_size, list(ops),
                                    local_size, label))

    # -- groups -------------------------------------------------------------
    def lower_all(self, groups: Sequence[Group], keep: Collection[int], inputs: Sequence[Tensor] = (),
                  outputs: Sequence[Tensor] = ()) -> None:
        """Lower ``groups`` in order; a group its reader's kernel does (the kit's decision for this
        dialect's :data:`FOLDS`) adds no launch of its own, nor does the conversion of an input (of
        ``inputs``) that its one kernel reads in host order or of an output (of ``outputs``) its kernel
        stores in host order."""
        self.receive(inputs, outputs, [op for g in groups for op in g.ops], self.storage == np.float32)
        self.fold(groups, keep, FOLDS)
        for g in groups:
            self.lower(g)

    def depthwise_args(self, op: Op) -> list[Any]:
        """Input, weights and window of a depthwise convolution staged by matmul.cl."""
        x, extra, _ = conv_input(self, op)
        out, weights = op.outputs[0], constant_value(op.inputs[1])
        return [self.tensor(x), self.dims(x.shape), i32(out.shape[3] // x.shape[3]),
                self.upload(pack_depthwise_weights(weights)),
                self.upload(pack_vector(constant_value(op.input(2)), out.shape[3])),
                *(part for arg in window_params(op, weights.shape[1], weights.shape[2], extra)
                  for part in self.argument(arg))]

    def emit_product(self, p: Product) -> None:
        if p.staged is not None and p.staged[0] == "chain":
            self.dense_pair(p)
            return
        self.matmul(["buffer", p.src], p.shape, p.window, p.bias, ["buffer", p.output[0]], p.output[1], p.steps,
                    p.ops, p.staged[1] if p.staged else None, p.label)

    def dense_pair(self, p: Product) -> None:
        """Two 1x1 convolutions of one pixel in one launch (dense_pair.cl): the staged one, then ``p``'s."""
        first = p.staged[1].root
        x, hidden = first.inputs[0], as_nhwc(first.outputs[0].shape)[3]
        w1 = dense_groups(constant_value(first.inputs[1]), as_nhwc(x.shape)[3])
        weights = [pack_conv_weights(w).reshape(-1, 4) for w in (w1, p.window)]
        bias = [pack_vector(constant_value(first.input(2)), len(w1)), pack_vector(p.bias, len(p.window))]
        dst, out_slices, hidden_slices = ["buffer", p.output[0]], slices(len(p.window)), slices(hidden)
        args = self.out_args(dst, p.output[1]) + [
            self.tensor(x), self.dims(x.shape), i32(as_nhwc(x.shape)[3]), self.upload(np.concatenate(weights)),
            self.upload(np.concatenate(bias)), i32(hidden), i32(len(weights[0]))]
        items = min(pow2_at_least(max(hidden_slices, out_slices)), MATVEC_GROUP)
        grids, params = grid_arguments(p.staged[1], "h")  # the first convolution's rounding steps
        args += grids
        act = unary_chain(OPENCL, [step.signature() for step in p.staged[1].steps], "(v)", lambda i: f"h{i}")
        hidden_params = (("HIDDEN_PARAMS", params),) if grids else ()
        stored = STORE_HOST if self.host_write(dst[1], "dense_pair") else ()
        self.add("dense_pair", p.steps, args, p.output[1], (items * as_nhwc(x.shape)[0], 1, 1), p.ops,
                 defines=(("GROUP", items), ("HIDDEN", hidden_slices), ("HIDDEN_ACT(v)", act)) + hidden_params
                 + stored, local_size=(items, 1, 1), label=p.label)

    def matmul(self, src, src_shape, window: np.ndarray, bias: np.ndarray | None, dst, dst_shape,
               steps: Sequence[Step], ops: Sequence[Op], source: Group | None = None, label: str = "") -> None:
        """Rows of ``src`` times OHWI weights ``window``: 1x1 (a row per pixel, its vectors a plane apart)
        or covering the whole image (a row per image, its vectors consecutive in PHWC4 order).  With
        ``source`` (a 1x1 window), the rows are that group's output (a depthwise convolution or a gate
        product), computed where the kernel stages them."""
        units, kh, kw, _ = window.shape
        n, h, w, c = as_nhwc(src_shape)
        packed = pack_conv_weights(window).transpose(0, 3, 1, 2, 4, 5)  # [S_out][S_in][KH][KW]: PHWC4 order
        depth = slices(c) * kh * kw
        rows, in_plane = (n * h * w, h * w) if kh * kw == 1 else (n, 1)
        _, oh, ow, _ = as_nhwc(dst_shape)
        args = self.out_args(dst, dst_shape) + [self.upload(packed), self.upload(pack_vector(bias, units)),
                                                i32(rows), i32(depth), i32(in_plane),
                                                i32(oh * ow)]
        out_slices = slices(units)
        if rows <= MATVEC_ROWS:
            items = min(pow2_at_least(depth), MATVEC_GROUP)
            stored = STORE_HOST if self.host_write(dst[1], "matvec") else ()
            self.add("matvec", steps, args + [src], dst_shape, (out_slices * items, 1, 1), ops,
                     defines=(("ROWS", rows), ("GROUP", items)) + stored, local_size=(items, 1, 1), label=label)
            return
        stored = STORE_HOST if self.host_write(dst[1], "matmul") else ()
        defines: tuple = ()
        staging = 1.0  # loads to stage one input vector
        if source is None:
            args.append(src)
        elif source.root.opcode == "DEPTHWISE_CONV_2D":
            grids, params = grid_arguments(source, "d")  # the depthwise convolution's rounding steps
            args += self.depthwise_args(source.root) + [int2(w, c)] + grids
            _, dkh, dkw, _ = source.root.inputs[1].shape
            act = unary_chain(OPENCL, [step.signature() for step in source.steps], "(v)", lambda i: f"d{i}")
            defines = (("DEPTHWISE_INPUT", 1), ("KH", dkh), ("KW", dkw), ("DEPTHWISE_ACT(v)", act))
            if grids:
                defines += (("DEPTHWISE_GRIDS", params),)
            staging = 3.0 * dkh * dkw  # two loads and a multiply-add per tap
        else:
            values, gate = gate_operands(source.root)
            args += [self.tensor(values), self.tensor(gate), i32(depth if as_nhwc(gate.shape)[0] > 1 else 0)]
            defines = (("GATED_INPUT", 1),)
            grid = gate_grid(source)
            if grid is not None:
                args.append(["float4", [float(q) for q in grid]])
                defines += (("GATE_GRID", 1),)
            staging = 2.0
        wg_p, wg_s, chunk, split = matmul_shape(rows, out_slices, depth, self.compute_units, staging)
        items = (round_to(rows, 2 * wg_p) // 2, round_to(out_slices, 2 * wg_s) // 2, split)  # 2 x 2 outputs each
        self.add("matmul", steps, args, dst_shape, items, ops, local_size=(wg_p, wg_s, split),
                 defines=defines + (("WG_P", wg_p), ("WG_S", wg_s), ("CHUNK", chunk), ("SPLIT", split)) + stored,
                 label=label)

    def image_reduction(self, g: Group, x: Tensor, is_max: bool) -> bool:
        """An average over each whole image runs as mean.cl's work-group reduction."""
        if is_max:
            return False
        out = g.output
        _, h, w, c = as_nhwc(x.shape)
        items, per_group = reduction_shape(w * h)
        args = self.out_args(self.tensor(out), out.shape) + [self.tensor(x), self.dims(x.shape), i32(c),
                                                             int4(1, 1, 0, 0)]
        self.add("mean", g.steps, args, out.shape, (items, round_to(phwc4_vectors(out.shape), per_group), 1), g.ops,
                 defines=(("GROUP", items), ("REDUCTIONS", per_group)), local_size=(items, per_group, 1))
        return True


def grid_arguments(group: Group, prefix: str) -> tuple[list[list], str]:
    """The kernel arguments of a folded group's rounding grids (``chain_grids``: an integer model's float view)
    and the parameters declaring them, ``float4 <prefix><step index>`` each, which its steps' code reads."""
    grids = chain_grids(group)
    return ([["float4", [float(q) for q in grid]] for grid in grids.values()],
            "".join(f", float4 {prefix}{i}" for i in grids))


declare_templates(DIALECT, templates())
