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
from delegate.gpu.fusion import ReaderFolds, chain_grids, gate_grid, gate_operands
from delegate.gpu.dialect import WGSL, reduction, unary_chain
from delegate.gpu.layout import as_nhwc, dense_groups, pack_conv_weights, pack_vector
from delegate.gpu.layout import slices as slices_of
from delegate.gpu.lowering import BroadcastArg, Call, ConstantArg, HostArg, Lowering, ParamArg, Product, TensorArg
from delegate.gpu.registry import declare_templates
from delegate.plugin_api import Tensor

from .shaders import MAPPINGS, Kernel, dims, template, templates
from .tiling import (WORKGROUP, DeviceShape, matmul_candidates, matmul_tiling, reduction_workgroup, spatial_candidates,
                     spatial_tiling)

DIALECT = "wgpu"
# Shader files that are parts of kernels, no template of their own: the prelude, the helpers templates are
# assembled with (HELPERS, a product's input reads, the workgroup reductions) and the subgroup probe.
PARTS = frozenset({"common", "lanes", "weight_blocks", "matmul_input", "matmul_input_gated",
                   "matmul_input_gated_rounded", "reduce_shared",
                   "reduce_subgroup", "subgroup_probe"})
WIDE_SOFTMAX_SLICES = 8  # from here on a workgroup shares each pixel


class KernelList(Lowering):
    """Kernels of one partition in launch order, with the values (constants, temporaries) they use."""

    dialect = DIALECT
    # every template storing its output through emit (shaders.Kernel) can store it in host order; the
    # conversions and the templates with a second result store in PHWC4, and PARTS store nothing
    host_writers = frozenset(templates()) - {"layout_in", "layout_out", "lstm_gates", "pool_argmax"} - PARTS
    host_readers = frozenset({"conv2d"})  # conv2d.wgsl reads a partition input in host order (_host_tensor)

    def __init__(self, device: DeviceShape, tuning: bool = False):
        super().__init__()
        self.device, self.tuning = device, tuning
        self.busy_items = device.invocations // 4  # the kit counts work items of 4 output vectors
        self.kernels: list[Kernel] = []
        self.groups: list[Group] = []

    def kernel(self, name: str, group: Group) -> Kernel:
        """A kernel from template ``name`` storing the group's output through the group's epilogue."""
        k = Kernel(name, "+".join(f"{op.opcode}#{op.index}" for op in group.ops), ops=[op.index for op in group.ops])
        self._record([group.output])
        k.output(group.output.index, group.output.shape, group.steps, self.host_write(group.output.index, name))
        self.kernels.append(k)
        return k

    def constant(self, key: Hashable, vectors: np.ndarray) -> Hashable:
        self.constants[key] = np.ascontiguousarray(vectors, np.float32).reshape(-1, 4)
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

    def emit_product(self, p: Product) -> None:
        """matmul.wgsl's tiled product, or dense_pair.wgsl for a chain of two one-pixel 1x1 convolutions."""
        k = Kernel("matmul", p.label, ops=[op.index for op in p.ops]).output(
            *p.output, p.steps, self.host_write(p.output[0], "matmul"))
        self.kernels.append(k)
        if p.staged is not None and p.staged[0] == "chain":
            _dense_pair(self, k, p)
        else:
            _matmul(self, k, p)

    def image_reduction(self, g: Group, x: Tensor, is_max: bool) -> bool:
        """Pooling over each whole image runs as pool_global.wgsl's workgroup reduction."""
        _global_pool(self, g, x, is_max)
        return True

    def add(self, group: Group) -> None:
        self.groups.append(group)
        self.lower(group)


# The groups the kernels do inside their reader's kernel: a zero PAD of rows and columns read by any
# convolution (its window shifted), a gate product read by a 1x1 convolution (scaling each input vector
# as it reads it), a squeeze-and-excitation bottleneck of two one-pixel 1x1 convolutions (one
# kernel, ``_dense_pair``, within the kit's chain_link), and a reshape read by a concatenation through
# its view (the gather kernel's view_lidx); a convolution does one fold at most.  A depthwise
# convolution keeps its own kernel: matmul.wgsl reads each input vector once per slice group instead of
# staging it, so computing the depthwise convolution there would repeat it for every group of output slices.
FOLDS = ReaderFolds(pad=lambda reader: True, gate=lambda reader: True, chain=lambda reader: True,
                    reshape=lambda reader: True)


# -- kernels -------------------------------------------------------------------------------------

def _dense_pair(plan: KernelList, k: Kernel, p: Product) -> None:
    """Make ``k`` two 1x1 convolutions of one pixel: the staged one (``p.staged``), then ``p``'s."""
    conv1 = p.staged[1].root
    x, hidden = conv1.inputs[0], as_nhwc(conv1.outputs[0].shape)[3]
    w1 = dense_groups(constant_value(conv1.inputs[1]), as_nhwc(x.shape)[3])
    k.template = "dense_pair"
    k.tensor("src", x.index, x.shape)
    blocks = [pack_conv_weights(w1).reshape(-1, 4), pack_conv_weights(p.window).reshape(-1, 4)]
    _weight_blocks(k, plan.constant(("weights", p.key), np.concatenate(blocks)))
    k.read("bias", plan.constant(("bias", p.key), np.concatenate(
        [pack_vector(constant_value(conv1.input(2)), len(w1)), pack_vector(p.bias, len(p.window))])))
    k.param("hidden_c", "i32", hidden)
    k.param("second", "i32", len(blocks[0]))
    for i, grid in chain_grids(p.staged[1]).items():  # the first convolution's rounding steps
        k.param(f"h{i}", "vec4<f32>", [float(q) for q in grid])
    chain = unary_chain(WGSL, [step.signature() for step in p.staged[1].steps], "value", lambda i: f"p.h{i}")
    k.helpers.append(f"fn hidden_steps(value: V) -> V {{\n  return {chain};\n}}")
    k.substitutions = {"HIDDEN": str(slices_of(hidden))}
    k.tile((WORKGROUP, 1, 1), (as_nhwc(x.shape)[0], 1, 1))
    k.half = True


def _weight_blocks(k: Kernel, weights: Hashable) -> None:
    """Bind weights packed in 4x4 blocks, read by the kernel as matrices."""
    k.read("weights", weights)
    k.helpers.append(template("weight_blocks"))


def _spatial(plan: KernelList, k: Kernel, shape: Sequence[int], most_slices: int, most_pixels: int = 4) -> None:
    """Tile a convolution over its output: horizontally adjacent pixels (and slices) per invocation."""
    shape = as_nhwc(shape)
    plan.tile(k, spatial_tiling(plan.device, shape, most_slices, most_pixels),
              spatial_candidates(shape, most_slices, most_pixels), shape)
    k.half = True


def _matmul(plan: KernelList, k: Kernel, p: Product) -> None:
    """Make ``k`` the product of the input's pixel rows and ``p``'s 1x1 weights, plus the bias; a staged gate
    scales each input vector as it is read."""
    if p.staged is None:
        k.tensor("src", p.src, p.shape)
        k.helpers.append(template("matmul_input"))
    else:
        image, gate = gate_operands(p.staged[1].root)
        k.tensor("src", image.index, image.shape)
        k.tensor("gate", gate.index, gate.shape)
        grid = gate_grid(p.staged[1])
        if grid is None:
            k.helpers.append(template("matmul_input_gated"))
        else:
            k.param("gate_grid", "vec4<f32>", [float(q) for q in grid])
            k.helpers.append(template("matmul_input_gated_rounded"))
    units = len(p.window)
    _weight_blocks(k, plan.constant(("weights", p.key), pack_conv_weights(p.window.reshape(units, 1, 1, -1))))
    k.read("bias", plan.constant(("bias", p.key), pack_vector(p.bias, units)))
    n, h, w, depth = as_nhwc(p.shape)
    rows, slices, depth = n * h * w, slices_of(units), slices_of(depth)
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
HELPERS = {"arg": ("lanes",), "batch_matmul": ("lanes",), "reduce": ("lanes",), "transpose_conv2d": ("weight_blocks",),
           "conv2d": ("weight_blocks",), "conv2d_split": ("weight_blocks",), "cumsum": ("lanes",), "one_hot": ("lanes",)}


def _reduction(name: str) -> dict[str, str]:
    init, combine, finish = reduction(name, "src_lane(lidx(d, first.x, first.y, first.z, first.w))")
    return {"INIT": init, "COMBINE": combine, "FINISH": finish}


# A kit call's constant -> the substitutions spelling it (the group is the workgroup size, set where
# the launch is shaped: SHAPED; an output in host order is emit's, see spell).
SPECIALISE = {"reduction": _reduction, "group": lambda group: {}, "host_output": lambda _: {}, "views": lambda _: {},
              "host_input": lambda _: {}, "host_channels": lambda channels: {"SRC_SLICES": str(slices_of(channels))}}

# How a host-order input's element i reads as a float: float32 as it is, uint8 / int8 from words of four.
HOST_VALUES = {"float32": ("f32", "f32({name}[i])"),
               "uint8": ("u32", "f32(extractBits({name}[i >> 2u], u32(i & 3) * 8u, 8u))"),
               "int8": ("u32", "f32(extractBits(bitcast<i32>({name}[i >> 2u]), u32(i & 3) * 8u, 8u))")}


def _host_tensor(k: Kernel, arg: TensorArg) -> None:
    """A partition input its one kernel reads in host order (the kit's ``TensorArg.host``): the caller's NHWC
    values, dequantized by ``p.<name>_dequant`` = (scale, zero point) when integers; ``<name>_pixel`` is
    where a pixel's values start and ``<name>_slice`` reads one slice of them, lanes past the channels zero."""
    name, host = arg.name, arg.host
    element, value = HOST_VALUES[host.dtype]
    k.tensor(name, arg.value, arg.shape, element=element)
    k.param(f"{name}_dequant", "vec4<f32>", host.dequant)
    scaled = "v" if host.dtype == "float32" else f"(v - p.{name}_dequant.y) * p.{name}_dequant.x"
    k.helpers.append(
        f"fn {name}_value(i: i32) -> f32 {{ return {value.format(name=name)}; }}\n"
        f"fn {name}_pixel(n: i32, y: i32, x: i32) -> i32 {{\n"
        f"  return ((n * p.{name}_d.y + y) * p.{name}_d.x + x) * p.{name}_c;\n}}\n"
        f"fn {name}_slice(first: i32, s: i32) -> V {{\n  var out = V(0.0);\n"
        f"  for (var lane = 0; lane < min(4, p.{name}_c - s * 4); lane++) {{\n"
        f"    let v = {name}_value(first + s * 4 + lane);\n    out[lane] = {scaled};\n  }}\n  return out;\n}}")


def spell(call: Call) -> Kernel:
    """The kernel of a kit call: bindings and uniforms in the call's order, the epilogue on the output.
    A data movement template this dialect writes as a mapping (``map_<name>.wgsl``) is the gather
    kernel with that mapping."""
    k = Kernel(call.template, call.label, ops=[op.index for op in call.ops])
    if call.template in MAPPINGS:
        inputs = [arg for arg in call.args if isinstance(arg, TensorArg)]
        _gather_source(k, call.template, len(inputs), views=any(arg.view is not None for arg in inputs))
    k.helpers.extend(template(helper) for helper in HELPERS.get(call.template, ()))
    for name, value in call.constants:
        k.substitutions.update(SPECIALISE[name](value))
    if call.output is not None:
        k.output(*call.output, call.steps, dict(call.constants).get("host_output", False))
    else:
        k.invocations = int(np.prod(dims(call.work)))
        k.param("count", "i32", k.invocations)
    for arg in call.args:
        if isinstance(arg, TensorArg) and arg.host is not None:
            _host_tensor(k, arg)
        elif isinstance(arg, TensorArg):
            k.tensor(arg.name, arg.value, arg.shape, arg.writable)
            if arg.view is not None:
                k.param(f"{arg.name}_v", "vec4<i32>", arg.view)
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


def _gather_source(k: Kernel, mapping: str, inputs: int, fill: str = "0.0", views: bool = False) -> Kernel:
    """The gather template with mapping ``mapping`` reading inputs ``in0`` .. ``in<inputs - 1>``, and
    ``fill`` outside them (input -1).  With ``views`` (the kit's ``TensorArg.view``: a concatenation reading
    through folded reshapes) the mapping's coordinate is in input i's view ``p.in<i>_v`` (N, H, W, C) and
    names the element of the same NHWC order in the input's storage; the call then moves lanes only."""
    lanes, vectors = [], []
    for i in range(inputs):
        v = f"p.in{i}_v"
        at = (f"view_lidx(p.in{i}_d, p.in{i}_c, ((a.x * {v}.y + a.y) * {v}.z + a.z) * {v}.w + a.w)" if views
              else f"lidx(p.in{i}_d, a.x, a.y, a.z, a.w)")
        lanes.append(f"    case {i}: {{ return in{i}_lane({at}); }}")
        vectors.append(f"    case {i}: {{ return in{i}_at(vidx(p.in{i}_d, a.x, a.y, a.z, a.w >> 2u)); }}")
    read = "\n".join([
        "fn read_lane(src: Src) -> f32 {", "  let a = src.at;", "  switch src.input {", *lanes,
        f"    default: {{ return {fill}; }}", "  }", "}",
        "fn read_vec(src: Src) -> V {", "  let a = src.at;", "  switch src.input {", *vectors,
        f"    default: {{ return V({fill}); }}", "  }", "}"])
    k.template = "gather"
    if views:
        k.helpers.append(VIEW_LANE)
    substitutions = MAPPING_CODE.get(mapping, lambda inputs: {})(inputs)
    k.substitutions = {"MAP": Template(template(f"map_{mapping}")).substitute(substitutions), "READ": read}
    return k


# A view's element (flat: its position in NHWC order) in the storage of an input of dims d = (W, H, S, N)
# and c channels: the element of the same NHWC position there.
VIEW_LANE = """fn view_lidx(d: vec4<i32>, c: i32, flat: i32) -> i32 {
  return lidx(d, flat / (d.y * d.x * c), flat / (d.x * c) % d.y, flat / c % d.x, flat % c);
}"""


def _pad(plan: "KernelList", k: Kernel, call: Call) -> None:
    """A PADV2's fill read from the kit's uniform; a zero fill (every PAD) is the shader's constant instead."""
    fill = next(arg.value for arg in call.args if isinstance(arg, ParamArg) and arg.name == "fill")
    if fill == 0.0:
        k.params = [param for param in k.params if param[0] != "fill"]
    else:
        _gather_source(k, "pad", 1, "p.fill")


def _transpose_conv(plan: "KernelList", k: Kernel, call: Call) -> None:
    _spatial(plan, k, call.output[1], 4, most_pixels=1)


def _conv(plan: "KernelList", k: Kernel, call: Call) -> None:
    """conv2d.wgsl reads its input in PHWC4 unless it is a partition input read in host order (_host_tensor)."""
    if "SRC_SLICES" not in k.substitutions:
        k.substitutions["SRC_SLICES"] = "p.src_d.z"
        k.helpers.append("fn src_pixel(n: i32, y: i32, x: i32) -> i32 { return vidx(p.src_d, n, y, x, 0); }\n"
                         "fn src_slice(first: i32, s: i32) -> V { return src_at(first + s * p.src_d.x * p.src_d.y); }")
    _spatial(plan, k, call.output[1], 4)


def _depthwise(plan: "KernelList", k: Kernel, call: Call) -> None:
    """The kit's channel multiplier as a shader constant rather than a uniform: the lane gathers of a
    multiplier above 1 then compile out of the inner loop where it is 1 (nearly every depthwise layer)."""
    multiplier = next(arg.value for arg in call.args if isinstance(arg, ParamArg) and arg.name == "multiplier")
    k.params = [param for param in k.params if param[0] != "multiplier"]
    k.substitutions["MULTIPLIER"] = str(multiplier)
    _spatial(plan, k, call.output[1], 1)


def _conv_split(plan: "KernelList", k: Kernel, call: Call) -> None:
    """One workgroup of the kit's group size per output vector, along x and wrapping into y."""
    k.helpers.append(template("reduce_subgroup" if plan.device.subgroups else "reduce_shared"))
    vectors, most = k.invocations, plan.device.most_workgroups
    k.tile((dict(call.constants)["group"], 1, 1), (min(vectors, most), -(-vectors // most), 1))
    k.half = True


# Kit templates whose launch this dialect shapes or specialises (its own tilings and workgroup algorithms,
# parameters that are shader constants here).
SHAPED = {"softmax": _softmax, "transpose_conv2d": _transpose_conv, "conv2d": _conv, "depthwise_conv2d": _depthwise,
          "conv2d_split": _conv_split, "pad": _pad}


declare_templates(DIALECT, templates())
