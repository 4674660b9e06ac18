"""From fused op groups to kernels: which template each op uses, its parameters and packed weights.

Each builder receives a :class:`delegate.gpu.Group` (a root op and the
elementwise steps fused after it) and appends the kernels that compute the
group's output.  Values are named by tensor index; weights rearranged for the
kernels and tensors that exist only inside a partition get their own keys.
"""

from __future__ import annotations

import copy
from string import Template
from typing import Hashable, Sequence

import numpy as np

from delegate.gpu import Group, constant_value
from delegate.gpu.fusion import ReaderFolds, gate_operands, pointwise
from delegate.gpu.constants import int_values
from delegate.gpu.dialect import WGSL, reduction, unary_chain
from delegate.gpu.layout import (as_nhwc, dense_groups, pack_conv_weights,
                                 pack_depthwise_weights, pack_vector, padding_before)
from delegate.gpu.layout import slices as slices_of
from delegate.gpu.lowering import (BroadcastArg, Call, ConstantArg, HostArg, Lowering, ParamArg, TensorArg, concat_call,
                                   relayout_call)
from delegate.gpu.registry import declare_templates, handler, lowers
from delegate.plugin_api import CompileError, Op, Tensor

from .shaders import MAPPINGS, Kernel, dims, template, templates
from .tiling import (WORKGROUP, DeviceShape, matmul_candidates, matmul_tiling, reduction_workgroup, spatial_candidates,
                     spatial_tiling)

DIALECT = "wgpu"
WIDE_SOFTMAX_SLICES = 8  # from here on a workgroup shares each pixel
DENSE_PAIR_WEIGHTS = 1 << 17  # weights of one layer that one workgroup still multiplies quickly


class KernelList(Lowering):
    """Kernels of one partition in launch order, with the values (constants, temporaries) they use."""

    def __init__(self, device: DeviceShape, tuning: bool = False):
        super().__init__()
        self.device, self.tuning = device, tuning
        self.kernels: list[Kernel] = []
        self.folded: dict[int, Group] = {}  # result of a group its reader does (FOLDS) -> the group
        self.groups: list[Group] = []

    def kernel(self, name: str, group: Group) -> Kernel:
        """A kernel from template ``name`` storing the group's output through the group's epilogue."""
        k = Kernel(name, "+".join(f"{op.opcode}#{op.index}" for op in group.ops), ops=[op.index for op in group.ops])
        k.output(group.output.index, group.output.shape, group.steps)
        self.kernels.append(k)
        return k

    def part(self, name: str, op: Op, role: str, value: Hashable, shape: Sequence[int]) -> Kernel:
        """A kernel computing one stage of ``op`` into ``value`` (no epilogue): a flattening copy, an LSTM stage."""
        k = Kernel(name, f"{op.opcode}#{op.index}:{role}", ops=[op.index]).output(value, shape)
        self.kernels.append(k)
        return k

    def constant(self, key: Hashable, vectors: np.ndarray) -> Hashable:
        self.constants[key] = np.ascontiguousarray(vectors, np.float32).reshape(-1, 4)
        return key

    def temporary(self, key: Hashable, shape: Sequence[int]) -> Hashable:
        self.temporaries[key] = tuple(shape)
        return key

    def tile(self, kernel: Kernel, chosen, candidates: Sequence, *extent) -> None:
        """Give ``kernel`` the tiling ``chosen`` for its sizes; when tuning, keep a variant of it for
        every other candidate, to be timed on the device."""
        def apply(k: Kernel, tiling) -> None:
            k.substitutions.update(tiling.constants())
            k.tile(*tiling.layout(*extent))
            k.tiling = str(tiling)
        apply(kernel, chosen)
        for tiling in candidates if self.tuning else ():
            if tiling != chosen:
                variant = copy.copy(kernel)
                variant.substitutions, variant.variants = dict(kernel.substitutions), []
                apply(variant, tiling)
                kernel.variants.append(variant)

    def emit(self, call: Call) -> None:
        k = spell(call)
        if call.template in SHAPED:
            SHAPED[call.template](self, k, call)
        self.kernels.append(k)

    def image_reduction(self, g: Group, x: Tensor, is_max: bool) -> bool:
        """Pooling over each whole image runs as pool_global.wgsl's workgroup reduction."""
        _global_pool(self, g, x, is_max)
        return True

    def add(self, group: Group) -> None:
        self.groups.append(group)
        if group.output.index not in self.folded:  # else the reader's kernel does the group
            found = handler(DIALECT, group.root)
            if found is None:
                raise CompileError(f"{group.root.describe()}: the wgpu lowering has no kernel for it")
            found.lower(self, group)


def builds(*codes: str):
    """Register the decorated builder as the wgpu lowering of ``codes``."""
    return lowers(DIALECT, *codes)


def _bias(plan: KernelList, op: Op, index: int, channels: int) -> Hashable:
    return plan.constant(("bias", op.index), pack_vector(constant_value(op.input(index)), channels))


def _on_one_pixel(op: Op) -> bool:
    """A 1x1 convolution of an input with one pixel per image, small enough for one workgroup."""
    return (pointwise(op) and len(op.inputs[0].shape) == 4 and tuple(op.inputs[0].shape[1:3]) == (1, 1)
            and op.inputs[1].size <= DENSE_PAIR_WEIGHTS)


# The groups the kernels do inside their reader's kernel: a zero PAD of rows and columns read by any
# convolution (its window shifted), a gate product read by a 1x1 convolution (scaling each input vector
# as it reads it), and a squeeze-and-excitation bottleneck of two one-pixel 1x1 convolutions (one
# kernel, ``_dense_pair``); a reader does one fold at most.
FOLDS = ReaderFolds(pad=lambda reader: True, gate=lambda reader: True, chain=_on_one_pixel)


# -- kernels -------------------------------------------------------------------------------------

def _dense_pair(plan: KernelList, first: Group, second: Group) -> None:
    """Two 1x1 convolutions of one pixel as one kernel (a "chain" fold)."""
    conv1, conv2 = first.root, second.root
    x, hidden = conv1.inputs[0], as_nhwc(conv1.outputs[0].shape)[3]
    w1 = dense_groups(constant_value(conv1.inputs[1]), as_nhwc(x.shape)[3])
    w2 = dense_groups(constant_value(conv2.inputs[1]), hidden)
    k = plan.kernel("dense_pair", second)
    _note_fold(k, conv1)
    k.tensor("src", x.index, x.shape)
    blocks = [pack_conv_weights(w1).reshape(-1, 4), pack_conv_weights(w2).reshape(-1, 4)]
    _weight_blocks(k, plan.constant(("weights", conv2.index), np.concatenate(blocks)))
    k.read("bias", plan.constant(("bias", conv2.index), np.concatenate(
        [pack_vector(constant_value(op.input(2)), len(w)) for op, w in ((conv1, w1), (conv2, w2))])))
    k.param("hidden_c", "i32", hidden)
    k.param("second", "i32", len(blocks[0]))
    chain = unary_chain(WGSL, [step.signature() for step in first.steps], "value")
    k.helpers.append(f"fn hidden_steps(value: V) -> V {{\n  return {chain};\n}}")
    k.substitutions = {"HIDDEN": str(slices_of(hidden))}
    k.tile((WORKGROUP, 1, 1), (as_nhwc(x.shape)[0], 1, 1))
    k.half = True


@builds("CONV_2D")
def _conv(plan: KernelList, group: Group) -> None:
    op = group.root
    x, out = op.inputs[0], op.outputs[0]
    folded = plan.folded.get(x.index)
    if folded is not None and folded.root.opcode == "CONV_2D":
        _dense_pair(plan, folded, group)
        return
    weights = dense_groups(constant_value(op.inputs[1]), x.shape[3])
    if pointwise(op) and (folded is None or folded.root.opcode == "MUL"):
        _matmul(plan, plan.kernel("matmul", group), op, x.index, x.shape, weights.reshape(len(weights), -1), 2)
        return
    k = plan.kernel("conv2d", group)
    shift = _source(plan, k, x)
    _weight_blocks(k, plan.constant(("weights", op.index), pack_conv_weights(weights)))
    k.read("bias", _bias(plan, op, 2, out.shape[3]))
    _window(k, op.options, x.shape, weights.shape[1:3], shift)
    _spatial(plan, k, out.shape, 4)


def _weight_blocks(k: Kernel, weights: Hashable) -> None:
    """Bind weights packed in 4x4 blocks, read by the kernel as matrices."""
    k.read("weights", weights)
    k.helpers.append(template("weight_blocks"))


def _source(plan: KernelList, k: Kernel, x: Tensor) -> tuple[int, int]:
    """Bind a convolution's input as ``src``; for a folded PAD, the PAD's input, and the (rows, columns)
    of padding that shift the window."""
    if x.index not in plan.folded:
        k.tensor("src", x.index, x.shape)
        return 0, 0
    pad = plan.folded[x.index].root
    k.tensor("src", pad.inputs[0].index, pad.inputs[0].shape)
    _note_fold(k, pad)
    pads = int_values(pad.input(1))
    return pads[2], pads[4]


def _note_fold(k: Kernel, op: Op) -> None:
    """Record that ``k`` also does ``op`` (for labels and profiles)."""
    k.label += f"+{op.opcode}#{op.index}"
    k.ops.append(op.index)


def _spatial(plan: KernelList, k: Kernel, shape: Sequence[int], most_slices: int, most_pixels: int = 4) -> None:
    """Tile a convolution over its output: horizontally adjacent pixels (and slices) per invocation."""
    shape = as_nhwc(shape)
    plan.tile(k, spatial_tiling(plan.device, shape, most_slices, most_pixels),
              spatial_candidates(shape, most_slices, most_pixels), shape)
    k.half = True


def _window(k: Kernel, o: dict, in_shape: Sequence[int], kernel: Sequence[int], shift=(0, 0)) -> None:
    """Window parameters over an input of ``in_shape``, moved by ``shift`` (rows, columns) more padding."""
    kh, kw = kernel
    sh, sw = o.get("stride_h", 1), o.get("stride_w", 1)
    dh, dw = o.get("dilation_h_factor", 1), o.get("dilation_w_factor", 1)
    padding = o.get("padding", "VALID")
    k.param("window", "vec4<i32>", (kw, kh, sw, sh))
    k.param("spacing", "vec4<i32>", (padding_before(padding, in_shape[2], kw, sw, dw) + shift[1],
                                     padding_before(padding, in_shape[1], kh, sh, dh) + shift[0], dw, dh))


@builds("DEPTHWISE_CONV_2D")
def _depthwise(plan: KernelList, group: Group) -> None:
    op = group.root
    x, out = op.inputs[0], op.outputs[0]
    weights = constant_value(op.inputs[1])
    k = plan.kernel("depthwise_conv2d", group)
    shift = _source(plan, k, x)
    k.read("weights", plan.constant(("weights", op.index), pack_depthwise_weights(weights)))
    k.read("bias", _bias(plan, op, 2, out.shape[3]))
    _window(k, op.options, x.shape, weights.shape[1:3], shift)
    k.substitutions["MULTIPLIER"] = str(out.shape[3] // x.shape[3])
    _spatial(plan, k, out.shape, 1)


@builds("FULLY_CONNECTED")
def _fully_connected(plan: KernelList, group: Group) -> None:
    op = group.root
    x = op.inputs[0]
    weights = constant_value(op.inputs[1])
    depth = weights.shape[1]
    source, shape = x.index, x.shape
    if x.shape[-1] != depth:  # the input is flattened into rows of `depth` values first
        shape = (x.size // depth, depth)
        source = plan.temporary(("rows", op.index), shape)
        plan.call(relayout_call(x.index, x.shape, source, shape, [op]))
    _matmul(plan, plan.kernel("matmul", group), op, source, shape, weights, 2)


def _matmul(plan: KernelList, k: Kernel, op: Op, source: Hashable, shape: Sequence[int], weights: np.ndarray,
            bias_input: int) -> None:
    """Make ``k`` the product of the input's pixel rows and [units, depth] ``weights``, plus the bias."""
    if source not in plan.folded:
        k.tensor("src", source, shape)
        k.helpers.append(template("matmul_input"))
    else:
        gated = plan.folded[source].root
        image, gate = gate_operands(gated)
        k.tensor("src", image.index, image.shape)
        k.tensor("gate", gate.index, gate.shape)
        k.helpers.append(template("matmul_input_gated"))
        _note_fold(k, gated)
    _weight_blocks(k, plan.constant(("weights", op.index), pack_conv_weights(weights.reshape(len(weights), 1, 1, -1))))
    k.read("bias", _bias(plan, op, bias_input, len(weights)))
    n, h, w, depth = as_nhwc(shape)
    rows, slices, depth = n * h * w, slices_of(len(weights)), slices_of(depth)
    k.param("rows", "i32", rows)
    plan.tile(k, matmul_tiling(plan.device, rows, slices, depth), matmul_candidates(plan.device, rows, slices, depth),
              rows, slices)
    k.half = True


def _softmax(plan: "KernelList", k: Kernel, call: Call) -> None:
    """A pixel per invocation, or from WIDE_SOFTMAX_SLICES slices on a workgroup sharing each pixel."""
    n, h, w, c = as_nhwc(call.output[1])
    pixels, depth = n * h * w, slices_of(c)
    k.param("pixels", "i32", pixels)
    if depth >= WIDE_SOFTMAX_SLICES:
        k.template = "softmax_wide"
        most = plan.device.most_workgroups
        _workgroup_reduction(plan, k, depth, (min(pixels, most), -(-pixels // most)))
    else:
        k.invocations = pixels


def _workgroup_reduction(plan: KernelList, k: Kernel, length: int, workgroups: tuple[int, int]) -> None:
    """One workgroup per output of a reduction over ``length`` vectors."""
    k.helpers.append(template("reduce_subgroup" if plan.device.subgroups else "reduce_shared"))
    k.tile((reduction_workgroup(length), 1, 1), (*workgroups, 1))


def _global_pool(plan: KernelList, group: Group, x: Tensor, is_max: bool) -> None:
    """Pooling over every pixel of each image as one workgroup reduction per output vector."""
    n, h, w, c = as_nhwc(x.shape)
    k = plan.kernel("pool_global", group)
    k.tensor("src", x.index, x.shape)
    k.param("is_max", "i32", int(is_max))
    _workgroup_reduction(plan, k, h * w, (slices_of(c), n))


# The WGSL each kit template needs besides its own: lanes.wgsl's main (the template defines lane_value),
# weight_blocks.wgsl (weights read as 4x4 matrices).
HELPERS = {"arg": ("lanes",), "batch_matmul": ("lanes",), "reduce": ("lanes",), "transpose_conv2d": ("weight_blocks",)}


def _reduction(name: str) -> dict[str, str]:
    init, combine, finish = reduction(name, "src_lane(lidx(d, first.x, first.y, first.z, first.w))")
    return {"INIT": init, "COMBINE": combine, "FINISH": finish}


SPECIALISE = {"reduction": _reduction}  # a kit call's constant -> the substitutions spelling it


def spell(call: Call) -> Kernel:
    """The kernel of a kit call: bindings and uniforms in the call's order, the epilogue on the output.
    A data movement template this dialect writes as a mapping (``map_<name>.wgsl``) is the gather
    kernel with that mapping."""
    k = Kernel(call.template, call.label, ops=[op.index for op in call.ops])
    if call.template in MAPPINGS:
        _gather_source(k, call.template, sum(isinstance(arg, TensorArg) for arg in call.args))
    k.helpers.extend(template(helper) for helper in HELPERS.get(call.template, ()))
    for name, value in call.constants:
        k.substitutions.update(SPECIALISE[name](value))
    if call.output is not None:
        k.output(*call.output, call.steps)
    else:
        k.invocations = int(np.prod(dims(call.work)))
        k.param("count", "i32", k.invocations)
    for arg in call.args:
        if isinstance(arg, TensorArg):
            k.tensor(arg.name, arg.value, arg.shape)
        elif isinstance(arg, BroadcastArg):
            k.broadcast(arg.name, arg.value, arg.shape, arg.splat)
        elif isinstance(arg, HostArg):
            (k.write if arg.writable else k.read)(arg.name, arg.value, "f32")
        elif isinstance(arg, ConstantArg):
            k.read(arg.name, arg.key)
        else:
            assert isinstance(arg, ParamArg)
            k.uniform(arg)
    return k


# -- data movement: the gather kernel with one mapping per op ------------------------------------

def _concat_cases(inputs: int) -> dict[str, str]:
    """map_concat.wgsl's search for the input holding the coordinate along ``p.axis``."""
    return {"CASES": "\n".join(f"  if (along < p.end{i}) {{ var a = at; a[p.axis] = along - start; return Src({i}, a); }}\n"
                                f"  start = p.end{i};" for i in range(inputs))}


MAPPING_CODE = {"concat": _concat_cases}  # mappings whose code depends on how many inputs they read


def _gather_source(k: Kernel, mapping: str, inputs: int) -> Kernel:
    """The gather template with mapping ``mapping`` reading inputs ``in0`` .. ``in<inputs - 1>``."""
    lanes, vectors = [], []
    for i in range(inputs):
        lanes.append(f"    case {i}: {{ return in{i}_lane(lidx(p.in{i}_d, a.x, a.y, a.z, a.w)); }}")
        vectors.append(f"    case {i}: {{ return in{i}_at(vidx(p.in{i}_d, a.x, a.y, a.z, a.w >> 2u)); }}")
    read = "\n".join([
        "fn read_lane(src: Src) -> f32 {", "  let a = src.at;", "  switch src.input {", *lanes,
        "    default: { return 0.0; }", "  }", "}",
        "fn read_vec(src: Src) -> V {", "  let a = src.at;", "  switch src.input {", *vectors,
        "    default: { return V(0.0); }", "  }", "}"])
    k.template = "gather"
    substitutions = MAPPING_CODE.get(mapping, lambda inputs: {})(inputs)
    k.substitutions = {"MAP": Template(template(f"map_{mapping}")).substitute(substitutions), "READ": read}
    return k


@builds("LSTM")
def _lstm(plan: KernelList, group: Group) -> None:
    """The basic LSTM cell: [input, previous activation] -> matrix product -> gates."""
    op = group.root
    x, prev_activation, weights, _, prev_state = op.inputs
    activation, state, concat, gates = op.outputs
    plan.call(concat_call([x, prev_activation], 3, (concat.index, tuple(concat.shape)), [op],
                          label=f"{op.opcode}#{op.index}:concat"))
    _matmul(plan, plan.part("matmul", op, "matmul", gates.index, gates.shape), op, concat.index,
            concat.shape, constant_value(weights), 3)
    cell = plan.part("lstm_gates", op, "gates", activation.index, activation.shape)
    cell.tensor("gates", gates.index, gates.shape)
    cell.tensor("prev_state", prev_state.index, prev_state.shape)
    cell.tensor("state", state.index, state.shape, writable=True)


def _transpose_conv(plan: "KernelList", k: Kernel, call: Call) -> None:
    _spatial(plan, k, call.output[1], 4, most_pixels=1)


SHAPED = {"softmax": _softmax, "transpose_conv2d": _transpose_conv}  # kit templates whose launch this dialect shapes (its own algorithms)


declare_templates(DIALECT, templates())
