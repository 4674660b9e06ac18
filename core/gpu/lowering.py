"""The kit's lowering: one handler per op family decides each launch, and each GPU dialect only spells it.

A handler (registered with :func:`delegate.gpu.registry.lowers_shared`) turns a fused
:class:`~delegate.gpu.fusion.Group` into :class:`Call` s on a :class:`Lowering`: the kernel
template, its arguments in the order of the *parameter contract* below, the ops it computes
and what it iterates over.  A GPU plugin subclasses :class:`Lowering` and implements
:meth:`Lowering.emit`, spelling each call as its runtime launches it; its templates
(``kernels/<name>.cl``, ``shaders/<name>.wgsl``) implement the contract, so the same call
means the same computation in both dialects.

The parameter contract, argument by argument (OpenCL kernel arguments | WGSL bindings and uniforms):

- the output, first when the call has one: ``(buffer, int4 dims, int channels)`` | binding ``dst``
  with ``p.dst_d``, ``p.dst_c`` and ``p.count``; the group's epilogue is applied to every stored
  vector, its operands (:func:`epilogue_operands`) following all other arguments.
- :class:`TensorArg` a PHWC4 tensor: ``(buffer, int4 dims, int channels)`` | binding ``<name>``
  with ``p.<name>_d``, ``p.<name>_c``; with ``host`` (a partition input read by its one kernel in
  host order, see :meth:`Lowering.host_read`) the caller's NHWC bytes instead, followed by
  ``float4 dequant`` | the binding as ``f32`` values or ``u32`` words of four integers with
  ``p.<name>_dequant``, the call's constants ``host_input``
  naming their element type and ``host_channels`` their channels (so the reads unroll); with ``view`` (the call's constant ``views``: a concatenation reading
  through folded reshapes) followed by ``int4 view``, the NHWC shape the mapping reads it as.
- :class:`BroadcastArg` an operand read at the output position, dimensions of size 1 broadcast and
  a single channel splat over all of them when :func:`splat_channel`: ``(buffer, int4 dims, int
  splat)`` | binding ``<name>`` read by ``broadcast_<name>(o)``.
- :class:`HostArg` a flat NHWC float32 buffer (the host-order staging of a boundary tensor):
  ``(buffer)`` | binding ``<name>: array<f32>``; a quantized input's integers instead, with the
  ``dequant`` parameter and the ``host_input`` constant (see :func:`boundary_call`).
- :class:`ConstantArg` packed constants (weights, a bias), float32 in the template's layout, stored
  in the storage type: ``(buffer)`` | binding ``<name>`` of vectors.
- :class:`ParamArg` a number or a 4-vector (kind ``int``, ``float``, ``int4``, ``float4``): one
  argument | one uniform field.

Work is one item per PHWC4 vector of the output (or of ``over``), which each dialect maps onto
its grid (OpenCL (W, H, N*S), WebGPU flat workgroups).  ``constants`` specialise a template at
compile time (``("reduction", "SUM")``); each dialect spells them (OpenCL macros, WGSL substitutions).

Data movement calls read their inputs as ``in0``, ``in1``... followed by ``aligned`` (``int``: the
mapping moves whole vectors, channel offsets being multiples of 4) and the mapping's own
parameters.  A dialect may implement such a template as a variant of a general one (its gather
kernel with the mapping: OpenCL ``MAP_<NAME>`` in ``gather.cl``, WebGPU ``map_<name>.wgsl``); the
call is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Hashable, Sequence, Union

import numpy as np

from ..ir import Op, Tensor
from ..passes import CLAMPS
from ..shapes import max_unpooling_geometry, mediapipe_pool_params, pool_argmax_geometry
from ..strided import strided_slice_plan
from ..errors import CompileError
from .constants import constant_value, int_values
from .fusion import Group, ReaderFolds, Step, is_matmul, pointwise, reader_folds
from .layout import (arg_axis, as_nhwc, batch_matmul_layout, dense_groups, host_order, nhwc_axis, pack_axis,
                     pack_conv_weights, pack_depthwise_weights, pack_vector, pad_before, padding_before, reduced_axes,
                     resize_scales, same_storage, slices, split_parts, transpose_axes, transpose_conv_geometry,
                     unpack_parts, window_padding)
from .dialect import REDUCE_CODE
from .plan import Values
from .registry import handler, lowers_shared
from .support import BINARY, CONVERSIONS, MAX_UNPOOLING, POOL_ARGMAX, TRANSPOSE_CONV_BIAS, UNARY


@dataclass(frozen=True)
class HostInput:
    """A partition input as the host writes it when its bytes are not its PHWC4 bytes: NHWC, float32, or
    the caller's integers of a per-tensor quantized input, which the device dequantizes with ``dequant``
    = (scale, zero point, 0, 0) instead of the host; ``nbytes`` of them."""

    dtype: str  # float32 | uint8 | int8
    nbytes: int
    dequant: tuple[float, float, float, float] = (1.0, 0.0, 0.0, 0.0)


def host_input(t: Tensor, storage_f32: bool) -> HostInput | None:
    """How partition input ``t`` arrives from the host, or None when the host writes its float32 values
    straight into the PHWC4 buffer (float32 storage and :func:`host_order`)."""
    q = t.quantization
    quantized = t.dtype.name in ("uint8", "int8") and q is not None and len(q.scale) == 1 and not q.per_channel
    if not quantized and storage_f32 and host_order(t.shape):
        return None
    values = max(int(np.prod(as_nhwc(t.shape))), 1)
    if not quantized:
        return HostInput("float32", 4 * values)
    return HostInput(t.dtype.name, values, (float(q.scale[0]), float(q.zero_point[0]), 0.0, 0.0))


@dataclass(frozen=True)
class TensorArg:
    name: str
    value: Hashable
    shape: tuple[int, ...]
    writable: bool = False  # a second result the template stores (an LSTM's cell state)
    host: HostInput | None = None  # a partition input read in host order from the caller's bytes
    view: tuple[int, int, int, int] | None = None  # the NHWC shape a data movement reads it as (a folded reshape)


@dataclass(frozen=True)
class BroadcastArg:
    name: str
    value: Hashable
    shape: tuple[int, ...]
    splat: bool  # a single channel standing for every channel of the output


@dataclass(frozen=True)
class HostArg:
    name: str
    value: Hashable
    writable: bool = False


@dataclass(frozen=True, eq=False)
class ConstantArg:
    name: str
    key: Hashable
    values: "np.ndarray"  # float32, already in the template's layout


@dataclass(frozen=True)
class ParamArg:
    name: str
    kind: str  # int | float | int4 | float4
    value: Any


Arg = Union[TensorArg, BroadcastArg, HostArg, ConstantArg, ParamArg]
PARAM_KINDS = ("int", "float", "int4", "float4")


@dataclass
class Call:
    """One launch as the kit decides it: template, output (value, shape) and epilogue steps, the other
    arguments in contract order, the ops computed (for labels and profiles) and the vectors iterated."""

    template: str
    args: list[Arg]
    ops: list[Op]
    output: tuple[Hashable, tuple[int, ...]] | None = None
    steps: Sequence[Step] = ()
    over: tuple[int, ...] | None = None  # the shape iterated, when not the output's
    label: str = ""
    constants: tuple[tuple[str, Any], ...] = ()  # compile-time specialisation, spelled by each dialect

    def __post_init__(self) -> None:
        for arg in self.args:
            if isinstance(arg, ParamArg) and arg.kind not in PARAM_KINDS:
                raise ValueError(f"{self.template}: parameter kind {arg.kind!r} is not in the contract")
        if not self.label:
            self.label = "+".join(f"{op.opcode}#{op.index}" for op in self.ops)

    @property
    def work(self) -> tuple[int, ...]:
        """The shape whose PHWC4 vectors the launch iterates, one work item each."""
        if self.over is not None:
            return self.over
        if self.output is None:
            raise ValueError(f"{self.template}: a call without an output says what it iterates")
        return self.output[1]


def splat_channel(operand: Sequence[int], result: Sequence[int]) -> bool:
    """A single-channel operand broadcast over all channels of the result."""
    return as_nhwc(operand)[3] == 1 and as_nhwc(result)[3] > 1


def epilogue_operands(steps: Sequence[Step], out_shape: Sequence[int]) -> dict[int, Arg]:
    """The arguments the epilogue's steps take, by step index: a quantization grid (``float4``), a scalar
    operand (``float``) or a tensor operand read at the output position (broadcast), named ``e<i>``."""
    found: dict[int, Arg] = {}
    for i, step in enumerate(steps):
        if step.kind in ("quantize", "swish"):
            found[i] = ParamArg(f"e{i}", "float4", tuple(float(q) for q in step.quant))
        elif step.kind == "binary" and step.scalar:
            found[i] = ParamArg(f"e{i}", "float", float(constant_value(step.operand).ravel()[0]))
        elif step.kind == "binary":
            found[i] = broadcast(f"e{i}", step.operand, out_shape)
    return found


def tensor(name: str, t: Tensor) -> TensorArg:
    return TensorArg(name, t.index, tuple(t.shape))


def broadcast(name: str, t: Tensor, out_shape: Sequence[int]) -> BroadcastArg:
    return BroadcastArg(name, t.index, tuple(t.shape), splat_channel(t.shape, out_shape))


@dataclass
class Product:
    """Rows of ``src`` (of ``shape``) times OHWI weights ``window`` plus ``bias``, stored as ``output`` through
    ``steps``: a 1x1 window (a row per pixel) or one covering the whole image (a row per image, where the
    dialect's :attr:`Lowering.image_rows`).  ``staged`` = (fold kind, group) when the rows are the result of
    a group folded into the product (a gate, a depthwise convolution, a one-pixel 1x1 convolution: a
    "chain"), which the dialect computes where it stages its input; ``key`` names the packed constants.
    The tiled algorithms are the dialect's (:meth:`Lowering.emit_product`)."""

    src: Hashable
    shape: tuple[int, ...]
    window: np.ndarray
    bias: np.ndarray | None
    output: tuple[Hashable, tuple[int, ...]]
    steps: Sequence[Step]
    ops: list[Op]
    key: Hashable
    staged: tuple[str, Group] | None = None
    label: str = ""

    def __post_init__(self) -> None:
        self.label = self.label or "+".join(f"{op.opcode}#{op.index}" for op in self.ops)


class Lowering(Values):
    """What every dialect's lowering of a partition keeps: its values, the groups folded into their
    reader's kernel, and the calls the handlers make.

    Subclasses spell each call (:meth:`emit`) and product (:meth:`emit_product`) in their dialect.
    :meth:`call` and :meth:`product` first record the tensors the arguments can name (those of the ops
    and epilogue steps), so sizes and constant bytes are known when buffers are assigned.
    """

    dialect = ""
    image_rows = False  # the dialect's product reads a row per image (a window covering the input)
    host_readers: frozenset[str] = frozenset()  # templates reading a partition input in host order (host_read)
    host_writers: frozenset[str] = frozenset()  # templates storing a partition output in host order (host_write)
    busy_items = 1  # work items of 4 adjacent output vectors that keep the device busy (see conv_2d)

    def __init__(self) -> None:
        super().__init__()
        self.folded: dict[int, tuple[str, Group]] = {}  # result of a group its reader does -> (kind, group)
        self.host_inputs: dict[int, HostInput] = {}  # partition inputs whose host bytes are not PHWC4 (receive)
        self.host_outputs: frozenset[int] = frozenset()  # partition outputs the host reads converted (receive)

    def receive(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor], ops: Collection[Op],
                storage_f32: bool) -> None:
        """Note how the partition's ``inputs`` arrive from the host (:func:`host_input`) and which of its
        ``outputs`` the host reads through a conversion and no kernel of the partition reads: read by no op
        of the partition (``ops``), the only result of its op (one of several may be read by the op's next
        kernel, as an LSTM's gates are); for an output a reshape keeping the bytes made, the reshape's
        input, which its kernel then stores in host order."""
        self.host_inputs = {t.index: h for t in inputs if (h := host_input(t, storage_f32)) is not None}
        members = {id(op) for op in ops}
        kept = {t.index for t in outputs}

        def stored(t: Tensor) -> Tensor | None:
            """The tensor whose kernel stores ``t``'s bytes: ``t``, or what a reshape keeping the PHWC4 bytes
            (no kernel: ``t`` shares its buffer) made ``t`` from, when nothing else reads that."""
            op = t.producer
            if op is None or op.custom or op.opcode not in ("RESHAPE", "EXPAND_DIMS", "SQUEEZE") \
                    or id(op) not in members:
                return t
            x = op.inputs[0]
            if not same_storage(x.shape, t.shape) or len(x.uses) != 1 or x.index in kept or x.producer is None \
                    or t.quantization is not None:  # a quantized reshape rounds onto its grid: a kernel of its own
                return t
            return x

        self.host_outputs = frozenset(
            x.index for t in outputs if not (storage_f32 and host_order(t.shape))
            for x in [stored(t)] if x.producer is not None and len(x.producer.outputs) == 1
            and not any(id(use) in members for use in t.uses) and (x is t or not any(
                id(use) in members and use is not t.producer for use in x.uses)))

    def host_write(self, key: Hashable, template: str) -> bool:
        """Whether the kernel of ``template`` storing ``key`` stores it in host order (NHWC float32): a
        partition output needing a conversion that no kernel of the partition reads, where the dialect's
        template can (``host_writers``); the host then reads it without a conversion kernel."""
        if key not in self.host_outputs or template not in self.host_writers:
            return False
        self.host_bytes[key] = 4 * max(int(np.prod(as_nhwc(self.tensors[key].shape))), 1)
        return True

    def host_read(self, x: Tensor, template: str) -> HostInput | None:
        """The host bytes ``template`` reads for ``x``, when ``x`` is a partition input needing a conversion
        and read by this kernel alone, which the dialect's ``template`` does in host order: the partition
        then uploads the caller's bytes into ``x``'s buffer and runs no conversion kernel."""
        found = self.host_inputs.get(x.index)
        if found is None or template not in self.host_readers or len(x.uses) != 1:
            return None
        self.host_bytes[x.index] = found.nbytes
        return found

    def fold(self, groups: Sequence[Group], keep: Collection[int], folds: ReaderFolds) -> None:
        """Decide which of a partition's groups their reader's kernel does (the dialect's ``folds``)."""
        self.folded = reader_folds(groups, keep, folds)

    def lower(self, g: Group) -> None:
        """Lower one group with its dialect's handler; a folded group adds nothing of its own."""
        if g.output.index in self.folded:
            return
        found = handler(self.dialect, g.root)
        if found is None:
            raise CompileError(f"{g.root.describe()}: the {self.dialect} lowering has no kernel for it")
        found.lower(self, g)

    def call(self, call: Call) -> None:
        self._record(_tensors(call.ops, call.steps))
        if call.output and self.host_write(call.output[0], call.template):
            call.constants = (*call.constants, ("host_output", 1))
        for arg in call.args:
            if isinstance(arg, ConstantArg):
                self.constants[arg.key] = np.ascontiguousarray(arg.values, np.float32)
        self.emit(call)

    def product(self, product: Product) -> None:
        staged = list(product.staged[1].ops) if product.staged else []
        self._record(_tensors(staged + product.ops, product.steps))
        self.emit_product(product)

    def _record(self, tensors: Sequence[Tensor]) -> None:
        for t in tensors:
            self.tensors[t.index] = t

    def emit(self, call: Call) -> None:  # pragma: no cover - every dialect implements it
        raise NotImplementedError

    def emit_product(self, product: Product) -> None:  # pragma: no cover - every dialect implements it
        raise NotImplementedError

    def image_reduction(self, g: Group, x: Tensor, is_max: bool) -> bool:
        """Lower a pooling whose window covers each image whole with the dialect's workgroup reduction;
        False where the dialect has none for it (the windowed kernel computes it)."""
        return False


def _tensors(ops: Sequence[Op], steps: Sequence[Step]) -> list[Tensor]:
    found = [op_t for op in ops for op_t in (*op.inputs, *op.outputs) if op_t is not None]
    found += [step.operand for step in steps if step.operand is not None]
    return found


# -- the partition boundary: host order (NHWC float32) <-> PHWC4, on the device ----------------

def boundary_call(staging: Hashable, t: Tensor, into_device: bool, host: HostInput | None = None) -> Call:
    """The conversion between ``t``'s PHWC4 buffer and its host-order staging buffer ``staging``:
    ``layout_in`` spreads the caller's array into PHWC4 (``host``: integers it dequantizes), ``layout_out``
    gathers an output for the host."""
    if into_device:
        quantized = host is not None and host.dtype != "float32"
        return Call("layout_in", [HostArg("host", staging)] + ([ParamArg("dequant", "float4", host.dequant)]
                                                               if quantized else []), [],
                    output=(t.index, tuple(t.shape)), label=f"to_phwc4#{t.index}",
                    constants=(("host_input", host.dtype),) if quantized else ())
    return Call("layout_out", [tensor("src", t), HostArg("host", staging, writable=True)], [],
                over=tuple(t.shape), label=f"to_host#{t.index}")


# -- elementwise: the first input, broadcast to the output, through the group's epilogue ---------

@lowers_shared(*UNARY, *BINARY, *CONVERSIONS, "ADD_N", templates=("elementwise",))
def elementwise(lowering: Lowering, g: Group) -> None:
    """The epilogue applies the ops themselves (a binary op's other operand is a step's)."""
    x = g.root.inputs[0]
    lowering.call(Call("elementwise", [broadcast("src", x, g.output.shape)], g.ops,
                       output=(g.output.index, tuple(g.output.shape)), steps=g.steps))


# -- data movement: every output element copied from the input element a mapping names ----------

def _moved(template: str, inputs: Sequence[tuple[Hashable, Sequence[int]]], aligned: bool, g: Group,
           *params: Arg) -> Call:
    return _part(template, inputs, aligned, g.ops, (g.output.index, tuple(g.output.shape)), *params, steps=g.steps)


def _part(template: str, inputs: Sequence[tuple[Hashable, Sequence[int]]], aligned: bool, ops: Sequence[Op],
          output: tuple[Hashable, tuple[int, ...]], *params: Arg, steps: Sequence[Step] = (),
          label: str = "") -> Call:
    args: list[Arg] = [TensorArg(f"in{i}", value, tuple(shape)) for i, (value, shape) in enumerate(inputs)]
    return Call(template, [*args, ParamArg("aligned", "int", int(aligned)), *params], list(ops), output=output,
                steps=steps, label=label)


def _one(g: Group) -> list[tuple[Hashable, Sequence[int]]]:
    return [(g.root.inputs[0].index, g.root.inputs[0].shape)]


def _same_channels(a: Sequence[int], b: Sequence[int]) -> bool:
    return as_nhwc(a)[3] == as_nhwc(b)[3]


def relayout_call(src: Hashable, src_shape: Sequence[int], dst: Hashable, dst_shape: Sequence[int],
                  ops: Sequence[Op]) -> Call:
    """Move elements between slices in NHWC order: a reshape changing the channel count or batch."""
    return _part("reshape", [(src, src_shape)], _same_channels(src_shape, dst_shape), ops, (dst, tuple(dst_shape)))


@lowers_shared("RESHAPE", "EXPAND_DIMS", "SQUEEZE", templates=("reshape",))
def reshape(lowering: Lowering, g: Group) -> None:
    """No kernel where the PHWC4 bytes stay the same: the output is stored in the input's buffer."""
    x, out = g.root.inputs[0], g.root.outputs[0]
    if not g.steps and same_storage(x.shape, out.shape):
        lowering.tensors[x.index] = x
        lowering.aliases[out.index] = x.index
        return
    lowering.call(_moved("reshape", _one(g), _same_channels(x.shape, g.output.shape), g))


@lowers_shared("TRANSPOSE", templates=("transpose",))
def transpose(lowering: Lowering, g: Group) -> None:
    x, axes = g.root.inputs[0], transpose_axes(g.root)
    lowering.call(_moved("transpose", [(x.index, x.shape)], axes[3] == 3, g, ParamArg("axes", "int4", axes)))


@lowers_shared("DEPTH_TO_SPACE", templates=("depth_to_space",))
def depth_to_space(lowering: Lowering, g: Group) -> None:
    x = g.root.inputs[0]
    lowering.call(_moved("depth_to_space", [(x.index, x.shape)], g.root.outputs[0].shape[3] % 4 == 0, g,
                         ParamArg("block", "int", int(g.root.options["block_size"]))))


@lowers_shared("SELECT", "SELECT_V2", templates=("select",))
def select(lowering: Lowering, g: Group) -> None:
    """Input 1 where the condition (input 0) holds, else input 2, each broadcast by its coordinates modulo its sizes."""
    lowering.call(_moved("select", [(t.index, t.shape) for t in g.root.inputs], False, g))


@lowers_shared("PAD", "PADV2", templates=("pad",))
def pad(lowering: Lowering, g: Group) -> None:
    """``fill`` (zero, or PADV2's constant) around the input; a zero PAD of rows and columns read by a
    convolution is usually folded into it.  Whole vectors move when the channel padding ahead is whole
    vectors, and with a non-zero fill only without channel padding (a vector's padding lanes hold zero)."""
    op, x = g.root, g.root.inputs[0]
    before = pad_before(op)
    value = constant_value(op.input(2)) if op.opcode == "PADV2" and op.input(2) is not None else None
    fill = 0.0 if value is None else float(np.asarray(value).ravel()[0])
    aligned = before[3] % 4 == 0 and (fill == 0.0 or _same_channels(x.shape, g.output.shape))
    lowering.call(_moved("pad", _one(g), aligned, g, ParamArg("before", "int4", before), ParamArg("fill", "float", fill)))


@lowers_shared("MIRROR_PAD", templates=("mirror_pad",))
def mirror_pad(lowering: Lowering, g: Group) -> None:
    x, symmetric = g.root.inputs[0], int(g.root.options.get("mode", "REFLECT") == "SYMMETRIC")
    lowering.call(_moved("mirror_pad", _one(g), _same_channels(x.shape, g.output.shape), g,
                         ParamArg("before", "int4", pad_before(g.root)), ParamArg("symmetric", "int", symmetric)))


@lowers_shared("TILE", templates=("tile",))
def tile(lowering: Lowering, g: Group) -> None:
    lowering.call(_moved("tile", _one(g), _same_channels(g.root.inputs[0].shape, g.output.shape), g))


@lowers_shared("SPACE_TO_DEPTH", templates=("space_to_depth",))
def space_to_depth(lowering: Lowering, g: Group) -> None:
    lowering.call(_moved("space_to_depth", _one(g), g.root.inputs[0].shape[3] % 4 == 0, g,
                         ParamArg("block", "int", int(g.root.options["block_size"]))))


def _space_batch(lowering: Lowering, g: Group, template: str) -> None:
    """Pixels moved between space and batch by blocks, output batch (or input batch) = block offset * images
    + image as in TFLite; ``before`` = the padding (or crop) ahead of the rows and columns."""
    op = g.root
    bh, bw = int_values(op.input(1))
    edges = np.asarray(int_values(op.input(2))).reshape(2, 2)
    lowering.call(_moved(template, _one(g), True, g, ParamArg("block", "int4", (int(bh), int(bw), 0, 0)),
                         ParamArg("before", "int4", (int(edges[0, 0]), int(edges[1, 0]), 0, 0))))


@lowers_shared("SPACE_TO_BATCH_ND", templates=("space_to_batch",))
def space_to_batch(lowering: Lowering, g: Group) -> None:
    _space_batch(lowering, g, "space_to_batch")


@lowers_shared("BATCH_TO_SPACE_ND", templates=("batch_to_space",))
def batch_to_space(lowering: Lowering, g: Group) -> None:
    _space_batch(lowering, g, "batch_to_space")


@lowers_shared("RESIZE_NEAREST_NEIGHBOR", templates=("resize_nearest",))
def resize_nearest(lowering: Lowering, g: Group) -> None:
    o = g.root.options
    lowering.call(_moved("resize_nearest", _one(g), True, g,
                         ParamArg("scale", "float4", (*resize_scales(g.root), 0.0, 0.0)),
                         ParamArg("align", "int", int(bool(o.get("align_corners")))),
                         ParamArg("half_pixel", "int", int(bool(o.get("half_pixel_centers"))))))


@lowers_shared("STRIDED_SLICE", templates=("slice",))
def strided_slice(lowering: Lowering, g: Group) -> None:
    """Output elements in NHWC order walk the slice, so a slice shrinking axes needs no relayout after it."""
    op, x = g.root, g.root.inputs[0]
    sliced = strided_slice_plan(x.shape, *(int_values(op.input(i)) for i in (1, 2, 3)), op.options)
    ranges = [range(size)[index] for size, index in zip(sliced.effective_shape, sliced.index)]
    ranges = [range(0, 1)] * (4 - len(ranges)) + ranges
    aligned = ranges[3].step == 1 and ranges[3].start % 4 == 0 and as_nhwc(g.output.shape)[3] == len(ranges[3])
    lowering.call(_moved("slice", _one(g), aligned, g, *_walk([r.start for r in ranges], [r.step for r in ranges],
                                                              [len(r) for r in ranges])))


@lowers_shared("SLICE", templates=("slice",))
def slice_op(lowering: Lowering, g: Group) -> None:
    """STRIDED_SLICE's walk with steps of 1: ``size`` elements from ``begin`` along each axis (-1: to the end)."""
    op, x = g.root, g.root.inputs[0]
    begin = [int(b) for b in int_values(op.input(1))]
    size = [d - b if int(n) == -1 else int(n) for d, b, n in zip(x.shape, begin, int_values(op.input(2)))]
    length = [1] * (4 - len(size)) + size
    start = (0,) * (4 - len(begin)) + tuple(begin)
    aligned = start[3] % 4 == 0 and as_nhwc(g.output.shape)[3] == length[3]
    lowering.call(_moved("slice", _one(g), aligned, g, *_walk(start, (1, 1, 1, 1), length)))


def _walk(start: Sequence[int], step: Sequence[int], length: Sequence[int]) -> tuple[ParamArg, ...]:
    return (ParamArg("start", "int4", tuple(start)), ParamArg("step", "int4", tuple(step)),
            ParamArg("length", "int4", tuple(length)))


@lowers_shared("SPLIT", "SPLIT_V", templates=("slice",))
def split(lowering: Lowering, g: Group) -> None:
    """One slice per output."""
    x, axis, parts = split_parts(g.root)
    for i, (out, offset) in enumerate(parts):
        start = [offset if a == axis else 0 for a in range(4)]
        lowering.call(_part("slice", [(x.index, x.shape)], axis != 3 or offset % 4 == 0, [g.root],
                            (out.index, tuple(out.shape)), *_walk(start, (1, 1, 1, 1), as_nhwc(out.shape)),
                            label=f"{g.root.opcode}#{g.root.index}:part{i}"))


def concat_call(inputs: Sequence[Tensor], axis: int, output: tuple[Hashable, tuple[int, ...]], ops: Sequence[Op],
                steps: Sequence[Step] = (), label: str = "", sources: Sequence[Tensor] = ()) -> Call:
    """Every output element from the input holding its range along ``axis`` (NHWC view): input k holds
    [end_{k-1}, end_k).  One launch for all inputs, whole vectors where the channel offsets allow.
    ``sources``: what each input is read from, the input of a folded reshape (read through its view,
    element by element) or the input itself."""
    sizes = [as_nhwc(t.shape)[axis] for t in inputs]
    sources = list(sources) or list(inputs)
    viewed = any(source is not t for source, t in zip(sources, inputs))
    aligned = not viewed and (axis != 3 or all(size % 4 == 0 for size in sizes[:-1]))
    ends = [ParamArg(f"end{i}", "int", int(end)) for i, end in enumerate(np.cumsum(sizes))]
    args = [TensorArg(f"in{i}", source.index, tuple(source.shape), view=as_nhwc(t.shape) if viewed else None)
            for i, (source, t) in enumerate(zip(sources, inputs))]
    return Call("concat", [*args, ParamArg("aligned", "int", int(aligned)), ParamArg("axis", "int", axis), *ends],
                list(ops), output=output, steps=steps, label=label, constants=(("views", 1),) if viewed else ())


@lowers_shared("CONCATENATION", templates=("concat",))
def concatenation(lowering: Lowering, g: Group) -> None:
    """One launch for all inputs; an input made by a reshape folded into it (the dialect's ``reshape``
    fold) is read through the reshape's view of that reshape's own input."""
    op = g.root
    axis = nhwc_axis(op.options.get("axis", 0), len(g.output.shape))
    folded = [lowering.folded.get(t.index) for t in op.inputs]
    reshapes = sorted((f[1].root for f in folded if f is not None and f[0] == "reshape"), key=lambda r: r.index)
    sources = [f[1].root.inputs[0] if f is not None and f[0] == "reshape" else t for f, t in zip(folded, op.inputs)]
    lowering.call(concat_call(op.inputs, axis, (g.output.index, tuple(g.output.shape)), reshapes + g.ops, g.steps,
                              sources=sources))


@lowers_shared("PACK", templates=("pack",))
def pack(lowering: Lowering, g: Group) -> None:
    """The output's axis ``axis`` (NHWC view) names the input; one launch for all inputs."""
    axis = pack_axis(g.root)
    lowering.call(_moved("pack", [(t.index, t.shape) for t in g.root.inputs], axis != 3, g,
                         ParamArg("axis", "int", axis)))


@lowers_shared("UNPACK", templates=("unpack",))
def unpack(lowering: Lowering, g: Group) -> None:
    """One gather per output: the input with the unpacked axis fixed at the output's index."""
    axis, parts = unpack_parts(g.root)
    for out, index in parts:
        lowering.call(_part("unpack", _one(g), axis != 3, [g.root], (out.index, tuple(out.shape)),
                            ParamArg("axis", "int", axis), ParamArg("index", "int", index),
                            label=f"{g.root.opcode}#{g.root.index}:part{index}"))


@lowers_shared("RESIZE_BILINEAR", templates=("resize_bilinear",))
def resize_bilinear(lowering: Lowering, g: Group) -> None:
    op, x = g.root, g.root.inputs[0]
    lowering.call(Call("resize_bilinear", [tensor("src", x), ParamArg("scale", "float4", (*resize_scales(op), 0.0, 0.0)),
                                           ParamArg("half_pixel", "int", int(bool(op.options.get("half_pixel_centers"))))],
                       g.ops, output=(g.output.index, tuple(g.output.shape)), steps=g.steps))


# -- reductions with one work item per output vector -------------------------------------------

@lowers_shared(*REDUCE_CODE, templates=("reduce",))
def reduce(lowering: Lowering, g: Group) -> None:
    """Each output lane combines its region in fp32; keep = the output with reduced axes as 1, reduce = 1 per
    reduced axis (NHWC view).  A MEAN over the rows and columns is the dialect's image reduction where it has
    one (which stores each image's result at its pixel (0, 0): the output must be stored as with kept axes)."""
    x = g.root.inputs[0]
    keep, reduced = reduced_axes(g.root)
    if (g.root.opcode == "MEAN" and reduced == (0, 1, 1, 0) and same_storage(keep, g.output.shape)
            and lowering.image_reduction(g, x, False)):
        return
    lowering.call(Call("reduce", [tensor("src", x), ParamArg("keep", "int4", keep), ParamArg("reduce", "int4", reduced)],
                       g.ops, output=(g.output.index, tuple(g.output.shape)), steps=g.steps,
                       constants=(("reduction", g.root.opcode),)))


@lowers_shared("ARG_MAX", "ARG_MIN", templates=("arg",))
def arg(lowering: Lowering, g: Group) -> None:
    """Each output lane scans its line along the axis for the first largest value of sign * input."""
    x = g.root.inputs[0]
    axis, keep = arg_axis(g.root)
    sign = 1.0 if g.root.opcode == "ARG_MAX" else -1.0
    lowering.call(Call("arg", [tensor("src", x), ParamArg("keep", "int4", keep), ParamArg("axis", "int", axis),
                               ParamArg("length", "int", as_nhwc(x.shape)[axis]), ParamArg("sign", "float", sign)],
                       g.ops, output=(g.output.index, tuple(g.output.shape)), steps=g.steps))


@lowers_shared("BATCH_MATMUL", templates=("batch_matmul",))
def batch_matmul(lowering: Lowering, g: Group) -> None:
    """Each output lane sums a row of a times a column of b over the depth, in fp32; batches broadcast."""
    (a, b), (depth, axes) = g.root.inputs[:2], batch_matmul_layout(g.root)
    lowering.call(Call("batch_matmul", [tensor("a", a), tensor("b", b), ParamArg("axes", "int4", axes),
                                        ParamArg("depth", "int", depth)],
                       g.ops, output=(g.output.index, tuple(g.output.shape)), steps=g.steps))


@lowers_shared("TRANSPOSE_CONV", TRANSPOSE_CONV_BIAS, templates=("transpose_conv2d",))
def transpose_conv(lowering: Lowering, g: Group) -> None:
    """Each output vector gathers the input pixels whose strided taps reach it (weights packed in 4x4 blocks)."""
    op, out = g.root, g.output
    geometry = transpose_conv_geometry(op)
    x, weights = geometry.x, constant_value(geometry.weights)
    _, kh, kw, _ = weights.shape
    (pad_h, pad_w), (sh, sw) = geometry.padding, geometry.strides
    bias = pack_vector(constant_value(geometry.bias), out.shape[3])
    lowering.call(Call("transpose_conv2d", [
        tensor("src", x), ConstantArg("weights", ("weights", op.index), pack_conv_weights(weights)),
        ConstantArg("bias", ("bias", op.index), bias), ParamArg("window", "int4", (kw, kh, sw, sh)),
        ParamArg("spacing", "int4", (pad_w, pad_h, 0, 0))],
        g.ops, output=(out.index, tuple(out.shape)), steps=g.steps))


# -- pooling -----------------------------------------------------------------------------------

def covers_image(op: Op) -> bool:
    """A pooling window covering its whole input at the one output pixel of each image."""
    o, (_, h, w, _) = op.options, op.inputs[0].shape
    padding = o.get("padding", "VALID")
    return tuple(op.outputs[0].shape[1:3]) == (1, 1) and all(
        k - padding_before(padding, size, k, stride) >= size
        for size, k, stride in ((h, o["filter_height"], o["stride_h"]), (w, o["filter_width"], o["stride_w"])))


@lowers_shared("AVERAGE_POOL_2D", "MAX_POOL_2D", templates=("pool2d",))
def pool(lowering: Lowering, g: Group) -> None:
    """The window clipped to the input (an average counts only the taps inside, as TFLite does); a window
    covering the image is a reduction where the dialect has one."""
    op, x, o = g.root, g.root.inputs[0], g.root.options
    is_max = op.opcode == "MAX_POOL_2D"
    if covers_image(op) and lowering.image_reduction(g, x, is_max):
        return
    kh, kw = o["filter_height"], o["filter_width"]
    pad_x, pad_y = window_padding(op, x.shape, kh, kw, dilated=False)
    lowering.call(Call("pool2d", [tensor("src", x), ParamArg("window", "int4", (kw, kh, o["stride_w"], o["stride_h"])),
                                  ParamArg("spacing", "int4", (pad_x, pad_y, 1, 1)),
                                  ParamArg("is_max", "int", int(is_max))],
                       g.ops, output=(g.output.index, tuple(g.output.shape)), steps=g.steps))


@lowers_shared("SOFTMAX", templates=("softmax",))
def softmax(lowering: Lowering, g: Group) -> None:
    """Over the channels of each pixel, in fp32; how a pixel's slices share the work is the dialect's
    (:meth:`Lowering.emit` shapes the launch: work groups sharing a pixel, or a pixel per item)."""
    op, x = g.root, g.root.inputs[0]
    lowering.call(Call("softmax", [tensor("src", x), ParamArg("beta", "float", float(op.options.get("beta", 1.0)))],
                       g.ops, output=(g.output.index, tuple(g.output.shape)), steps=g.steps))


# -- convolutions and matrix products ------------------------------------------------------------

# A windowed convolution giving fewer work items (of 4 adjacent output vectors) than keep the device busy
# (Lowering.busy_items) while each output sums at least 2 x SPLIT_GROUP (tap, input slice) pairs leaves the
# device waiting on memory, one tap after another: conv2d_split shares each output's sum among SPLIT_GROUP.
SPLIT_GROUP = 64


def conv_input(lowering: Lowering, op: Op) -> tuple[Tensor, tuple[int, int], list[Op]]:
    """What a convolution's kernel reads: its input, or the input of the zero PAD folded into it with the
    (columns, rows) of padding that adds before, and the PAD (for labels and profiles)."""
    x = op.inputs[0]
    folded = lowering.folded.get(x.index)
    if folded is None or folded[0] != "pad":
        return x, (0, 0), []
    pad = folded[1].root
    pads = int_values(pad.input(1))
    return pad.inputs[0], (int(pads[4]), int(pads[2])), [pad]


def window_params(op: Op, kh: int, kw: int, extra: tuple[int, int] = (0, 0)) -> tuple[ParamArg, ParamArg]:
    """``window`` = (kernel w, kernel h, stride x, stride y) and ``spacing`` = (pad x, pad y, dilation x,
    dilation y) of a convolution, ``extra`` (columns, rows) of a folded PAD included."""
    o = op.options
    pad_x, pad_y = window_padding(op, op.inputs[0].shape, kh, kw)
    return (ParamArg("window", "int4", (kw, kh, o.get("stride_w", 1), o.get("stride_h", 1))),
            ParamArg("spacing", "int4", (pad_x + extra[0], pad_y + extra[1], o.get("dilation_w_factor", 1),
                                         o.get("dilation_h_factor", 1))))


def conv_weights(op: Op, x: Tensor) -> np.ndarray:
    """A CONV_2D's OHWI weights as a dense convolution of all of ``x``'s channels (grouped ones zero across groups)."""
    return dense_groups(constant_value(op.inputs[1]), as_nhwc(x.shape)[3])


def _output(g: Group) -> tuple[Hashable, tuple[int, ...]]:
    return g.output.index, tuple(g.output.shape)


@lowers_shared("CONV_2D", templates=("conv2d", "conv2d_split", "matmul"))
def conv_2d(lowering: Lowering, g: Group) -> None:
    """A product where the convolution is one (``is_matmul``) or reads a group folded into the product; else
    each output vector sums its window, split among work items when the outputs are few and the sums long."""
    op, out = g.root, g.output
    bias = constant_value(op.input(2))
    staged = lowering.folded.get(op.inputs[0].index)
    if staged is not None and staged[0] != "pad":
        source = staged[1]
        _, _, pad = conv_input(lowering, source.root)
        lowering.product(Product(source.output.index, tuple(source.output.shape), conv_weights(op, source.output),
                                 bias, _output(g), g.steps, pad + source.ops + g.ops, op.index, staged))
        return
    x, extra, pad = conv_input(lowering, op)
    weights = conv_weights(op, x)
    if not pad and is_matmul(op) and (pointwise(op) or lowering.image_rows):
        lowering.product(Product(x.index, tuple(x.shape), weights, bias, _output(g), g.steps, g.ops, op.index))
        return
    _, kh, kw, _ = weights.shape
    n, h, w, c = as_nhwc(out.shape)
    items = -(-w // 4) * h * n * slices(c)
    split = items < lowering.busy_items and kh * kw * slices(as_nhwc(x.shape)[3]) >= 2 * SPLIT_GROUP
    host = None if split else lowering.host_read(x, "conv2d")
    constants = (("group", SPLIT_GROUP),) if split else \
        (("host_input", host.dtype), ("host_channels", as_nhwc(x.shape)[3])) if host else ()
    lowering.call(Call("conv2d_split" if split else "conv2d", [
        TensorArg("src", x.index, tuple(x.shape), host=host),
        ConstantArg("weights", ("weights", op.index), pack_conv_weights(weights)),
        ConstantArg("bias", ("bias", op.index), pack_vector(bias, c)), *window_params(op, kh, kw, extra)],
        pad + g.ops, output=_output(g), steps=g.steps, constants=constants))


@lowers_shared("DEPTHWISE_CONV_2D", templates=("depthwise_conv2d",))
def depthwise_conv_2d(lowering: Lowering, g: Group) -> None:
    """Output channel c filters input channel c / multiplier; a depthwise convolution folded into the 1x1
    convolution reading it (the dialect's ``depthwise`` fold) is computed by that product instead."""
    op, out = g.root, g.output
    x, extra, pad = conv_input(lowering, op)
    weights = constant_value(op.inputs[1])
    lowering.call(Call("depthwise_conv2d", [
        tensor("src", x), ParamArg("multiplier", "int", out.shape[3] // x.shape[3]),
        ConstantArg("weights", ("weights", op.index), pack_depthwise_weights(weights)),
        ConstantArg("bias", ("bias", op.index), pack_vector(constant_value(op.input(2)), out.shape[3])),
        *window_params(op, weights.shape[1], weights.shape[2], extra)],
        pad + g.ops, output=_output(g), steps=g.steps))


def dense(lowering: Lowering, x: Tensor, weights: np.ndarray, bias: np.ndarray | None,
          output: tuple[Hashable, tuple[int, ...]], steps: Sequence[Step], ops: list[Op], key: Hashable,
          label: str = "") -> None:
    """Rows of ``depth`` values of ``x`` times ``weights.T`` (+ bias): a row is a pixel's channels, or a whole
    image where the dialect reads image rows; any other split is flattened by a relayout first."""
    units, depth = weights.shape
    n, h, w, c = as_nhwc(x.shape)
    src, shape = x.index, tuple(x.shape)
    if c == depth:
        window = weights.reshape(units, 1, 1, depth)
    elif lowering.image_rows and h * w * c == depth:
        window = weights.reshape(units, h, w, c)
    else:
        src, shape = ("rows", key), (n * h * w * c // depth, depth)
        lowering.temporaries[src] = shape
        lowering.call(relayout_call(x.index, x.shape, src, shape, ops))
        window = weights.reshape(units, 1, 1, depth)
    lowering.product(Product(src, shape, window, bias, output, steps, ops, key, label=label))


@lowers_shared("FULLY_CONNECTED", templates=("matmul",))
def fully_connected(lowering: Lowering, g: Group) -> None:
    op = g.root
    dense(lowering, op.inputs[0], constant_value(op.inputs[1]), constant_value(op.input(2)), _output(g), g.steps,
          g.ops, op.index)


@lowers_shared("LSTM", templates=("concat", "matmul", "lstm_gates"))
def lstm(lowering: Lowering, g: Group) -> None:
    """The basic LSTM cell: [input, previous activation] -> matrix product -> gates (the new activation is
    the output, the new cell state the template's second result)."""
    op = g.root
    x, prev_activation, weights, bias, prev_state = op.inputs
    activation, state, concat, gates = op.outputs
    label = f"{op.opcode}#{op.index}"
    lowering.call(concat_call([x, prev_activation], 3, (concat.index, tuple(concat.shape)), [op],
                              label=f"{label}:concat"))
    dense(lowering, concat, constant_value(weights), constant_value(bias), (gates.index, tuple(gates.shape)), (),
          [op], op.index, label=f"{label}:matmul")
    lowering.call(Call("lstm_gates", [tensor("gates", gates), tensor("prev_state", prev_state),
                                      TensorArg("state", state.index, tuple(state.shape), writable=True)],
                       [op], output=(activation.index, tuple(activation.shape)), label=f"{label}:gates"))



# -- gathers, scans and one-hot encodings --------------------------------------------------------
# Output elements in NHWC order split as (outer, k, inner) around the op's axis: the flat walks of
# these templates need no relayout for any rank up to 4.

@lowers_shared("GATHER", templates=("take",))
def gather(lowering: Lowering, g: Group) -> None:
    """Constant indices make GATHER a mapping: output element (outer, k, inner) is the input's
    (outer, table[k], inner); walk = (indices, inner size, axis length).  Whole vectors move unless the
    axis is the last (the channels then come from different rows)."""
    op, x = g.root, g.root.inputs[0]
    rank = len(x.shape)
    axis = op.options.get("axis", 0) % rank
    table = np.asarray(int_values(op.input(1))).ravel()
    inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
    lowering.call(_moved("take", _one(g), axis != rank - 1, g,
                         ParamArg("walk", "int4", (len(table), inner, int(x.shape[axis]), 0)),
                         ConstantArg("table", ("indices", op.index), pack_vector(table, len(table)))))


@lowers_shared("CUMSUM", templates=("cumsum",))
def cumsum(lowering: Lowering, g: Group) -> None:
    """Each output lane sums its line along the axis (NHWC view) up to itself in fp32: from the start,
    or from the end with ``reverse``, without itself with ``exclusive``."""
    op, x = g.root, g.root.inputs[0]
    axis = nhwc_axis(int(int_values(op.input(1))[0]), len(x.shape))
    lowering.call(Call("cumsum", [tensor("src", x), ParamArg("axis", "int", axis),
                                  ParamArg("length", "int", as_nhwc(x.shape)[axis]),
                                  ParamArg("exclusive", "int", int(bool(op.options.get("exclusive")))),
                                  ParamArg("reverse", "int", int(bool(op.options.get("reverse"))))],
                       g.ops, output=_output(g), steps=g.steps))


@lowers_shared("ONE_HOT", templates=("one_hot",))
def one_hot(lowering: Lowering, g: Group) -> None:
    """Output element (outer, d, inner) is ``on`` where index (outer, inner) equals d, else ``off`` (an
    index outside [0, depth) matches nothing); walk = (depth, inner size).  The indices are read on the
    float view, exact up to the depths the rule allows."""
    op, out = g.root, g.output
    rank = len(out.shape)
    axis = op.options.get("axis", -1) % rank
    depth = int(int_values(op.input(1))[0])
    on, off = (float(np.asarray(constant_value(op.input(i))).ravel()[0]) for i in (2, 3))
    inner = int(np.prod(out.shape[axis + 1:], dtype=np.int64))
    lowering.call(Call("one_hot", [tensor("src", op.inputs[0]), ParamArg("walk", "int4", (depth, inner, 0, 0)),
                                   ParamArg("on_value", "float", on), ParamArg("off_value", "float", off)],
                       g.ops, output=_output(g), steps=g.steps))


# -- MediaPipe's pooling with indices ------------------------------------------------------------

@lowers_shared(POOL_ARGMAX, templates=("pool_argmax",))
def pool_argmax(lowering: Lowering, g: Group) -> None:
    """MAX_POOL_2D whose kernel also stores each maximum's place in its window (ky * kernel w + kx, plus
    0.1 as MediaPipe stores it) in the second output; the activation clamps the values to ``bounds``."""
    op, x = g.root, g.root.inputs[0]
    _, stride_w, stride_h, filter_w, filter_h, activation = mediapipe_pool_params(op.custom_options)
    _, (pad_h, pad_w) = pool_argmax_geometry(x.shape, op.custom_options)
    most = float(np.finfo(np.float32).max)
    low, high = (max(bound, -most) if i == 0 else min(bound, most)
                 for i, bound in enumerate(CLAMPS.get(activation, (-most, most))))
    places = op.outputs[1]
    lowering.call(Call("pool_argmax", [
        tensor("src", x), TensorArg("indices", places.index, tuple(places.shape), writable=True),
        ParamArg("window", "int4", (filter_w, filter_h, stride_w, stride_h)),
        ParamArg("spacing", "int4", (pad_w, pad_h, 1, 1)),
        ParamArg("bounds", "float4", (low, high, 0.0, 0.0))],
        g.ops, output=_output(g), steps=g.steps))


@lowers_shared(MAX_UNPOOLING, templates=("max_unpool",))
def max_unpooling(lowering: Lowering, g: Group) -> None:
    """MediaPipe's scatter as a gather: each output lane takes the value of the last input pixel (in
    row-major order) whose window holds it and whose index names its place there, zero where none does.
    An index naming no place of its window (never one MaxPoolingWithArgmax2D gives) writes nothing."""
    op, (x, places) = g.root, g.root.inputs
    _, stride_w, stride_h, filter_w, filter_h, _ = mediapipe_pool_params(op.custom_options)
    _, (pad_h, pad_w) = max_unpooling_geometry(x.shape, op.custom_options)
    lowering.call(Call("max_unpool", [tensor("src", x), tensor("indices", places),
                                      ParamArg("window", "int4", (filter_w, filter_h, stride_w, stride_h)),
                                      ParamArg("spacing", "int4", (pad_w, pad_h, 1, 1))],
                       g.ops, output=_output(g), steps=g.steps))


__all__ = ["Arg", "BroadcastArg", "Call", "ConstantArg", "HostArg", "HostInput", "Lowering", "ParamArg", "Product",
           "SPLIT_GROUP", "TensorArg", "boundary_call", "broadcast", "concat_call", "conv_input", "conv_weights",
           "covers_image", "epilogue_operands", "host_input", "relayout_call", "splat_channel", "tensor"]
