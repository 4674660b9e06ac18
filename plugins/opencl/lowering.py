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

from delegate.gpu.constants import constant_value, int_values
from delegate.gpu.dialect import OPENCL, unary_chain
from delegate.gpu.fusion import Group, ReaderFolds, Step, gate_operands, is_matmul, reader_folds
from delegate.gpu.layout import (as_nhwc, dense_groups, host_order, pack_conv_weights, pack_depthwise_weights,
                                 pack_vector, phwc4_vectors, slices, window_padding)
from delegate.gpu.lowering import (BroadcastArg, Call, ConstantArg, HostArg, Lowering, ParamArg, TensorArg, boundary_call,
                                   concat_call, epilogue_operands, relayout_call)
from delegate.gpu.plan import BufferSpec, KernelPlan, LaunchSpec, TensorSpec
from delegate.gpu.registry import declare_templates, handler, lowers
from delegate.plugin_api import CompileError, Op, Partition, Tensor

from .geometry import MATVEC_GROUP, MATVEC_ROWS, grid, matmul_shape, pow2_at_least, reduction_shape, round_to
from .program import Variant, templates
from .program import variant as template_variant

DIALECT = "opencl"


def _stages_input(reader: Op) -> bool:
    """A 1x1 convolution with more rows than a matvec.cl product (matmul.cl stages its input)."""
    n, h, w, _ = as_nhwc(reader.inputs[0].shape)
    return n * h * w > MATVEC_ROWS


# The groups the kernels do inside their reader's kernel: a zero PAD of rows and columns read by a
# windowed convolution (not a product, which reads no padding) as more padding; a depthwise
# convolution or a gate product computed where matmul.cl stages a 1x1 convolution's input.
FOLDS = ReaderFolds(pad=lambda reader: reader.opcode == "DEPTHWISE_CONV_2D" or not is_matmul(reader),
                    gate=_stages_input, depthwise=_stages_input, nested=True)


# A convolution giving fewer work items than this per compute unit leaves the device waiting on
# memory, one tap after another: conv2d_split.cl shares each output's reduction among SPLIT_GROUP.
SPLIT_ITEMS_PER_UNIT = 16
SPLIT_GROUP = 64


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


def conv_weights(op: Op, x: Tensor) -> np.ndarray:
    """A CONV_2D's weights as a dense convolution of all of ``x``'s channels (grouped ones zero across groups)."""
    return dense_groups(constant_value(op.inputs[1]), as_nhwc(x.shape)[3])


def i32(v) -> list:
    return ["int", int(v)]


def int2(a, b) -> list:
    return ["int2", [int(a), int(b)]]


def int4(a, b, c, d) -> list:
    return ["int4", [int(a), int(b), int(c), int(d)]]


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


SHARED_PIXEL = frozenset({"softmax"})  # templates whose work groups share each pixel's slices


def share_pixel(launch: Launch, shape: Sequence[int]) -> None:
    """Make ``launch`` a work-group reduction over each pixel's slices: GROUP items share a pixel,
    REDUCTIONS pixels per group."""
    n, h, w, c = as_nhwc(shape)
    items, per_group = reduction_shape(slices(c))
    launch.global_size = (items, round_to(n * h * w, per_group), 1)
    launch.local_size = (items, per_group, 1)
    variant = launch.variant
    launch.variant = Variant(variant.template, variant.epilogue,
                             variant.defines + (("GROUP", items), ("REDUCTIONS", per_group)))


class ClLowering(Lowering):
    """Turns a partition's groups into launches whose arguments name values, not device buffers.

    Values are tensor indices, packed constants (``("constant", n)``) and temporaries
    (``("temporary", n)``); :meth:`plan` assigns them buffers (:class:`delegate.gpu.plan.BufferPlanner`)
    and returns the partition's :class:`delegate.gpu.plan.KernelPlan`.
    """

    def __init__(self, storage: np.dtype, compute_units: int):
        super().__init__()
        self.storage = np.dtype(storage)
        self.compute_units = compute_units
        self.padded: dict[int, tuple[Tensor, int, int, Op]] = {}  # conv op id -> (input, pad x, pad y, PAD op)
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

    def temp(self, shape: Sequence[int]) -> list:
        key = ("temporary", len(self.temporaries))
        self.temporaries[key] = tuple(shape)
        return ["buffer", key]

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
            if self.storage == np.float32 and host_order(t.shape):
                return found  # the host copies the NHWC bytes to or from the start of the buffer
            staging = ("staging", t.index)
            buffer_of[staging] = found.staging = len(buffers)
            buffers.append(BufferSpec(max(int(np.prod(as_nhwc(t.shape))), 1) * 4, "staging"))
            found.convert = spec(self.spell(boundary_call(staging, t, into_device)))
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
            return [["buffer", arg.value], self.dims(arg.shape), i32(as_nhwc(arg.shape)[3])]
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
        if call.template in SHARED_PIXEL:
            share_pixel(launch, call.output[1])
        self.launches.append(launch)

    def add(self, template: str, steps: Sequence[Step], args: list[Any], out_shape: Sequence[int],
            global_size: tuple[int, int, int], ops: Sequence[Op], defines: tuple = (),
            local_size: tuple[int, int, int] | None = None) -> None:
        variant = Variant(template, tuple(s.signature() for s in steps),
                          tuple((name, _plain(value)) for name, value in defines))
        self.launches.append(Launch(variant, args + self.epilogue_args(steps, out_shape), global_size, list(ops),
                                    local_size))

    def relayout(self, src, src_shape, dst, dst_shape, ops: Sequence[Op]) -> None:
        """Move elements between slices when a reshape changes the channel count or batch."""
        self.call(relayout_call(src[1], src_shape, dst[1], dst_shape, ops))

    # -- groups -------------------------------------------------------------
    def lower_all(self, groups: Sequence[Group], keep: Collection[int]) -> None:
        """Lower ``groups`` in order; a group its reader's kernel does (the kit's decision,
        :data:`FOLDS`) adds no launch of its own."""
        folds = reader_folds(groups, keep, FOLDS)
        staged: dict[int, Group] = {}  # groups computed in a product's staging, by the tensor they would store
        for index, (kind, g) in folds.items():
            if kind == "pad":
                pads = np.asarray(int_values(g.root.inputs[1])).reshape(4, 2)
                self.padded[id(g.output.uses[0])] = (g.root.inputs[0], int(pads[2, 0]), int(pads[1, 0]), g.root)
            else:
                staged[index] = g
        for g in groups:
            if g.output.index in folds:
                continue
            source = staged.get(g.root.inputs[0].index) if g.root.opcode == "CONV_2D" else None
            if source is None:
                self.lower(g)
                continue
            op, x = g.root, source.output
            self.matmul(None, x.shape, conv_weights(op, x), constant_value(op.input(2)),
                        self.tensor(g.output), g.output.shape, g.steps, self.absorbed(source.ops) + g.ops, source)

    def conv_input(self, op: Op) -> Tensor:
        """What a convolution's kernel reads: its input, or the input of the PAD fused into it."""
        return self.padded[id(op)][0] if id(op) in self.padded else op.inputs[0]

    def absorbed(self, ops: Sequence[Op]) -> list[Op]:
        """``ops`` with the PAD fused into the first one before them (for labels and profiles)."""
        return ([self.padded[id(ops[0])][3]] if id(ops[0]) in self.padded else []) + list(ops)

    def lower(self, g: Group) -> None:
        found = handler(DIALECT, g.root)
        if found is None:
            raise CompileError(f"{g.root.describe()}: the opencl lowering has no kernel for it")
        found.lower(self, g)

    @lowers(DIALECT, "CONV_2D", "DEPTHWISE_CONV_2D")
    def conv_2d(self, g: Group) -> None:
        op, out = g.root, g.output
        weights, bias = constant_value(op.inputs[1]), constant_value(op.input(2))
        if op.opcode == "CONV_2D":
            weights = conv_weights(op, self.conv_input(op))
        if op.opcode == "CONV_2D" and is_matmul(op):
            x = op.inputs[0]
            self.matmul(self.tensor(x), x.shape, weights, bias, self.tensor(out), out.shape, g.steps, g.ops)
            return
        args = self.out_args(self.tensor(out), out.shape)
        w, h, z = grid(out.shape)
        columns = (-(-w // 4), h, z)  # both kernels compute 4 adjacent output vectors per work item
        if op.opcode == "DEPTHWISE_CONV_2D":
            self.add("depthwise_conv2d", g.steps, args + self.depthwise_args(op), out.shape, columns,
                     self.absorbed(g.ops), defines=(("KH", weights.shape[1]), ("KW", weights.shape[2])))
            return
        x = self.conv_input(op)
        args += [self.tensor(x), self.dims(x.shape), self.upload(pack_conv_weights(weights)),
                 self.upload(pack_vector(bias, out.shape[3])), *self._window(op, weights.shape[1], weights.shape[2])]
        reduction = weights.shape[1] * weights.shape[2] * slices(x.shape[3])
        if columns[0] * columns[1] * columns[2] < SPLIT_ITEMS_PER_UNIT * self.compute_units \
                and reduction >= SPLIT_GROUP * 2:
            self.add("conv2d_split", g.steps, args, out.shape, (SPLIT_GROUP, phwc4_vectors(out.shape), 1),
                     self.absorbed(g.ops), defines=(("GROUP", SPLIT_GROUP),), local_size=(SPLIT_GROUP, 1, 1))
            return
        self.add("conv2d", g.steps, args, out.shape, columns, self.absorbed(g.ops))

    def depthwise_args(self, op: Op) -> list[Any]:
        """Input, weights and window of a depthwise convolution, as its kernel and fused users take them."""
        x, out, weights = self.conv_input(op), op.outputs[0], constant_value(op.inputs[1])
        return [self.tensor(x), self.dims(x.shape), i32(out.shape[3] // x.shape[3]),
                self.upload(pack_depthwise_weights(weights)),
                self.upload(pack_vector(constant_value(op.input(2)), out.shape[3])),
                *self._window(op, weights.shape[1], weights.shape[2])]

    def _window(self, op: Op, kh: int, kw: int) -> list[Any]:
        """Geometry and padding arguments of a convolution's window, a fused PAD's included."""
        o = op.options
        sh, sw = o.get("stride_h", 1), o.get("stride_w", 1)
        dh, dw = o.get("dilation_h_factor", 1), o.get("dilation_w_factor", 1)
        pad_x, pad_y = window_padding(op, op.inputs[0].shape, kh, kw)
        _, extra_x, extra_y, _ = self.padded.get(id(op), (None, 0, 0, None))
        return [int4(kw, kh, sw, sh), int4(pad_x + extra_x, pad_y + extra_y, dw, dh)]

    @lowers(DIALECT, "FULLY_CONNECTED")
    def fully_connected(self, g: Group) -> None:
        op = g.root
        self.dense(self.tensor(op.inputs[0]), op.inputs[0].shape, constant_value(op.inputs[1]),
                   constant_value(op.input(2)), self.tensor(g.output), g.output.shape, g.steps, g.ops)

    def dense(self, src, src_shape, weights: np.ndarray, bias: np.ndarray | None, dst, dst_shape,
              steps: Sequence[Step], ops: Sequence[Op]) -> None:
        """Each row of ``depth`` values of ``src`` times ``weights.T`` (+ bias): a row is a pixel's channels,
        or a whole image; any other split is flattened by a relayout first."""
        units, depth = weights.shape
        n, h, w, c = as_nhwc(src_shape)
        if c == depth:
            window = weights.reshape(units, 1, 1, depth)
        elif h * w * c == depth:
            window = weights.reshape(units, h, w, c)
        else:
            flat = (n * h * w * c // depth, depth)
            tmp = self.temp(flat)
            self.relayout(src, src_shape, tmp, flat, ops)
            src, src_shape, window = tmp, flat, weights.reshape(units, 1, 1, depth)
        self.matmul(src, src_shape, window, bias, dst, dst_shape, steps, ops)

    def matmul(self, src, src_shape, window: np.ndarray, bias: np.ndarray | None, dst, dst_shape,
               steps: Sequence[Step], ops: Sequence[Op], source: Group | None = None) -> None:
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
            self.add("matvec", steps, args + [src], dst_shape, (out_slices * items, 1, 1), ops,
                     defines=(("ROWS", rows), ("GROUP", items)), local_size=(items, 1, 1))
            return
        defines: tuple = ()
        staging = 1.0  # loads to stage one input vector
        if source is None:
            args.append(src)
        elif source.root.opcode == "DEPTHWISE_CONV_2D":
            args += self.depthwise_args(source.root) + [int2(w, c)]
            _, dkh, dkw, _ = source.root.inputs[1].shape
            defines = (("DEPTHWISE_INPUT", 1), ("KH", dkh), ("KW", dkw),
                       ("DEPTHWISE_ACT(v)", unary_chain(OPENCL, [step.signature() for step in source.steps], "(v)")))
            staging = 3.0 * dkh * dkw  # two loads and a multiply-add per tap
        else:
            values, gate = gate_operands(source.root)
            args += [self.tensor(values), self.tensor(gate), i32(depth if as_nhwc(gate.shape)[0] > 1 else 0)]
            defines = (("GATED_INPUT", 1),)
            staging = 2.0
        wg_p, wg_s, chunk = matmul_shape(rows, out_slices, depth, self.compute_units, staging)
        items = (round_to(rows, 2 * wg_p) // 2, round_to(out_slices, 2 * wg_s) // 2, 1)  # 2 x 2 outputs each
        self.add("matmul", steps, args, dst_shape, items, ops, local_size=(wg_p, wg_s, 1),
                 defines=defines + (("WG_P", wg_p), ("WG_S", wg_s), ("CHUNK", chunk)))

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

    @lowers(DIALECT, "LSTM")
    def lstm(self, g: Group) -> None:
        """Basic LSTM cell: concat(input, previous output) -> fully connected -> gates."""
        op = g.root
        x, prev_activ, weights, bias, prev_state = op.inputs
        activ, state, concat_out, gates = op.outputs
        self.call(concat_call([x, prev_activ], 3, (concat_out.index, tuple(concat_out.shape)), [op]))
        self.dense(self.tensor(concat_out), concat_out.shape, constant_value(weights), constant_value(bias),
                   self.tensor(gates), gates.shape, (), [op])
        units = activ.shape[-1]
        args = [self.tensor(activ), self.tensor(state), self.dims(activ.shape), i32(units),
                self.tensor(gates), self.dims(gates.shape), self.tensor(prev_state)]
        self.add("lstm_gates", (), args, activ.shape, (as_nhwc(activ.shape)[2], slices(units), 1), [op])


declare_templates(DIALECT, templates())
