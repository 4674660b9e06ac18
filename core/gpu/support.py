"""The GPU kit's rule per op: which versions, dtypes and constraints its lowerings accept, and why not.

Whether a dialect lowers the op at all is answered by :mod:`delegate.gpu.registry`,
which applies these rules to the ops a dialect has handlers for.

The table follows LiteRT's GPU delegate: by default an op is accepted only at
version 1, since later versions mostly add integer variants the float
kernels do not implement; a few ops list more versions whose float semantics
the kernels do implement (dilated depthwise convolution, basic-kernel LSTM,
half-pixel bilinear resize).  With ``allow_quantized`` the quantized versions
are accepted too and run on the float view (:mod:`delegate.gpu.constants`).
A DEQUANTIZE of a constant is accepted whatever its version up to 4, and a DENSIFY
of one (sparse weights): they are folded at compile time and never run.  QUANTIZE and DEQUANTIZE of runtime
tensors are copies on the float view (QUANTIZE rounding onto its output's
grid).  Every refusal names the check that failed, so a plan can say why an
op stayed on the CPU.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..backend import CompileOptions, Support
from ..ir import DType, Op, Tensor
from ..shapes import mediapipe_pool_params, static_op, static_value
from ..strided import strided_slice_plan
from .constants import (activation_quant, constant_value, has_constant_value, int_values, is_folded_dequantize,
                        is_quantized, needs_quantized_support)

FUSED_ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6")
UNARY = ("RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "LOGISTIC", "TANH", "EXP", "HARD_SWISH", "LOG", "SQRT",
         "RSQRT", "SQUARE", "ABS", "NEG", "SIN", "COS", "FLOOR", "CEIL", "ROUND", "SIGN", "ELU", "GELU", "LEAKY_RELU")
# Copies on the float view: QUANTIZE rounds onto its output grid, a CAST to bool tests for non-zero.
CONVERSIONS = ("QUANTIZE", "DEQUANTIZE", "CAST")
COMPARISONS = ("EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL")
BINARY = ("ADD", "SUB", "MUL", "DIV", "FLOOR_DIV", "FLOOR_MOD", "SQUARED_DIFFERENCE", "POW", "MAXIMUM", "MINIMUM",
          "PRELU", "LOGICAL_AND") + COMPARISONS
TRANSPOSE_CONV_BIAS = "Convolution2DTransposeBias"

Check = Callable[[Op], "str | None"]


@dataclass(frozen=True)
class OpRule:
    """What the GPU path accepts of one op code."""

    versions: int = 1          # highest version accepted for float models
    quant_versions: int = 1    # highest version accepted with allow_quantized (float view)
    check: Check | None = None  # constraint on shapes/options; returns why not, or None
    params: tuple[int, ...] = ()  # inputs that are integer parameters (shapes, axes), not data
    bools: str = ""  # which tensors may be bool (held as 1 and 0): "first" input, "outputs" or "all"; the check
    # says which must be
    indices: bool = False  # its outputs may be int32 or int64 indices (held as floats: exact up to 2048 in f16)


def _fused(op: Op) -> str | None:
    act = op.options.get("fused_activation_function", "NONE")
    if act == "TANH":
        return ("fused TANH is ignored by LiteRT's own kernels for this op but would be applied by a GPU "
                "kernel; refused so both agree")
    if act not in FUSED_ACTIVATIONS:
        return f"fused activation {act} is not implemented on the GPU (supported: {', '.join(FUSED_ACTIVATIONS)})"
    return None


def _rank(t: Tensor, rank: int, what: str) -> str | None:
    if len(t.shape) != rank:
        return f"{what} must have rank {rank}, has shape {list(t.shape)}"
    return None


def _constant(op: Op, i: int, what: str, optional: bool = False) -> str | None:
    t = op.input(i)
    if t is None:
        return None if optional else f"{what} (input {i}) is missing"
    if not has_constant_value(t):
        return f"{what} (input {i}) must be a constant; runtime {what} stay on the CPU"
    return None


def _first(*reasons: str | None) -> str | None:
    return next((r for r in reasons if r), None)


def _conv(op: Op) -> str | None:
    o = op.options
    if min(o.get("stride_h", 1), o.get("stride_w", 1), o.get("dilation_h_factor", 1),
           o.get("dilation_w_factor", 1)) < 1:
        return "strides and dilations must be positive"
    return _first(_rank(op.inputs[0], 4, "input"), _rank(op.inputs[1], 4, "weights"),
                  _constant(op, 1, "weights"), _constant(op, 2, "bias", optional=True), _fused(op))


def _depthwise(op: Op) -> str | None:
    reason = _conv(op)
    if reason:
        return reason
    in_c, out_c = op.inputs[0].shape[3], op.outputs[0].shape[3]
    if in_c == 0 or out_c % in_c:
        return f"output channels {out_c} are not a multiple of input channels {in_c}"
    return None


def _fully_connected(op: Op) -> str | None:
    w = op.inputs[1]
    if op.options.get("weights_format", "DEFAULT") != "DEFAULT":
        return f"weights format {op.options['weights_format']} is not implemented (only DEFAULT)"
    if w.sparsity is not None:
        return "sparse weights are not implemented"
    reason = _first(_rank(w, 2, "weights"), _constant(op, 1, "weights"), _constant(op, 2, "bias", optional=True),
                    _fused(op))
    if reason:
        return reason
    if op.inputs[0].size % w.shape[1]:
        return f"input of {op.inputs[0].size} values is not a whole number of rows of {w.shape[1]}"
    return None


def _transpose_conv(op: Op) -> str | None:
    shape = int_values(op.input(0))
    if shape is None or len(shape) != 4:
        return "output_shape (input 0) must be a constant of 4 values"
    return _first(_rank(op.inputs[2], 4, "input"), _rank(op.inputs[1], 4, "weights"),
                  _constant(op, 1, "weights"), _constant(op, 3, "bias", optional=True), _fused(op))


def transpose_conv_bias_params(op: Op) -> tuple[str, int, int]:
    """(padding, stride_w, stride_h) of MediaPipe's ``Convolution2DTransposeBias``.

    Its custom options are the raw C struct ``TfLiteTransposeConvParams``:
    three int32 (padding enum 1=SAME 2=VALID, stride width, stride height).
    """
    raw = op.custom_options or b""
    if len(raw) < 12:
        raise ValueError(f"custom options are {len(raw)} bytes, expected 12 (padding, stride_w, stride_h)")
    padding, stride_w, stride_h = struct.unpack_from("<3i", raw)
    if padding not in (1, 2) or stride_w < 1 or stride_h < 1:
        raise ValueError(f"invalid parameters padding={padding} stride=({stride_w},{stride_h})")
    return ("SAME" if padding == 1 else "VALID"), stride_w, stride_h


def _transpose_conv_bias(op: Op) -> str | None:
    try:
        transpose_conv_bias_params(op)
    except ValueError as exc:
        return str(exc)
    return _first(_rank(op.inputs[0], 4, "input"), _rank(op.inputs[1], 4, "weights"),
                  _constant(op, 1, "weights"), _constant(op, 2, "bias"))


def _pool(op: Op) -> str | None:
    o = op.options
    if min(o.get("filter_height", 0), o.get("filter_width", 0), o.get("stride_h", 0), o.get("stride_w", 0)) < 1:
        return "filter sizes and strides must be positive"
    return _first(_rank(op.inputs[0], 4, "input"), _fused(op))


def _concat(op: Op) -> str | None:
    rank = len(op.outputs[0].shape)
    if any(len(t.shape) != rank for t in op.inputs):
        return "inputs of different ranks"
    return _fused(op)


def _pad(op: Op) -> str | None:
    pads = int_values(op.input(1))
    rank = len(op.inputs[0].shape)
    if pads is None or len(pads) != 2 * rank:
        return "paddings (input 1) must be a constant of shape [rank, 2]"
    if min(pads) < 0:
        return "negative paddings are not implemented"
    return _same_grid(op)


def _padv2(op: Op) -> str | None:
    if op.input(2) is not None and not has_constant_value(op.input(2)):
        return "the padding value (input 2) must be a constant"
    return _pad(op)


def _resize(op: Op) -> str | None:
    if int_values(op.input(1)) is None:
        return "size (input 1) must be a constant"
    if op.options.get("align_corners") and op.options.get("half_pixel_centers"):
        return "align_corners and half_pixel_centers cannot both be set"
    return _rank(op.inputs[0], 4, "input")


def _strided_slice(op: Op) -> str | None:
    values = [int_values(op.input(i)) for i in (1, 2, 3)]
    if any(v is None for v in values):
        return "begin, end and strides (inputs 1-3) must be constants"
    if op.options.get("ellipsis_mask") or op.options.get("new_axis_mask"):
        return "ellipsis_mask and new_axis_mask are not implemented"
    try:
        strided_slice_plan(op.inputs[0].shape, *values, op.options)
    except ValueError as exc:
        return str(exc)
    return None


def _mean(op: Op) -> str | None:
    axes = int_values(op.input(1))
    rank = len(op.inputs[0].shape)
    if axes is None:
        return "axes (input 1) must be a constant"
    if any(not -rank <= a < rank for a in axes):
        return f"axes {axes} out of range for rank {rank}"
    if any(a % rank == 0 for a in axes) and rank == 4 and op.inputs[0].shape[0] > 1:
        return "reducing over the batch axis is not implemented"
    return None


def _reduce(op: Op) -> str | None:
    axes = int_values(op.input(1))
    rank = len(op.inputs[0].shape)
    if axes is None:
        return "axes (input 1) must be a constant"
    if any(not -rank <= a < rank for a in axes):
        return f"axes {axes} out of range for rank {rank}"
    if op.opcode in ("REDUCE_ANY", "REDUCE_ALL") and op.inputs[0].dtype is not DType.bool:
        return f"{op.opcode} takes and gives bool tensors"
    return None


def _depth_to_space(op: Op) -> str | None:
    block = op.options.get("block_size", 0)
    if block < 1:
        return "block_size must be positive"
    return _rank(op.inputs[0], 4, "input")


def _slice(op: Op) -> str | None:
    begin, size = int_values(op.input(1)), int_values(op.input(2))
    if begin is None or size is None:
        return "begin and size (inputs 1 and 2) must be constants"
    return None


def _space_batch(op: Op) -> str | None:
    block, edges = int_values(op.input(1)), int_values(op.input(2))
    if block is None or edges is None:
        return "block shape and paddings or crops (inputs 1 and 2) must be constants"
    if len(block) != 2:
        return f"block shape {list(block)}: only blocks of rows and columns are implemented"
    return _rank(op.inputs[0], 4, "input")


def _tile(op: Op) -> str | None:
    multiples = int_values(op.input(1))
    if multiples is None or len(multiples) != len(op.inputs[0].shape):
        return "multiples (input 1) must be a constant with one value per axis"
    return None


def _mirror_pad(op: Op) -> str | None:
    reason = _pad(op)
    if reason:
        return reason
    pads = np.asarray(int_values(op.input(1))).reshape(-1, 2)
    symmetric = op.options.get("mode", "REFLECT") == "SYMMETRIC"
    for size, (before, after) in zip(op.inputs[0].shape, pads):
        if max(before, after) > (size if symmetric else size - 1):
            return f"padding {max(before, after)} is wider than the {size} values it mirrors"
    return None


def _pack(op: Op) -> str | None:
    rank = len(op.outputs[0].shape)
    axis = op.options.get("axis", 0)
    if not -rank <= axis < rank or op.outputs[0].shape[axis] != len(op.inputs):
        return f"axis {axis} of the output does not hold the {len(op.inputs)} inputs"
    if any(tuple(t.shape) != tuple(op.inputs[0].shape) for t in op.inputs):
        return "inputs of different shapes"
    return None


def _unpack(op: Op) -> str | None:
    rank = len(op.inputs[0].shape)
    axis = op.options.get("axis", 0)
    if not -rank <= axis < rank or len(op.outputs) != op.inputs[0].shape[axis]:
        return f"axis {axis} of an input of shape {list(op.inputs[0].shape)} does not give {len(op.outputs)} outputs"
    return None


def _binary(op: Op) -> str | None:
    try:
        shape = np.broadcast_shapes(op.inputs[0].shape, op.inputs[1].shape)
    except ValueError:
        return f"shapes {list(op.inputs[0].shape)} and {list(op.inputs[1].shape)} do not broadcast"
    if tuple(shape) != tuple(op.outputs[0].shape):
        return f"output shape {list(op.outputs[0].shape)} is not the broadcast of the inputs"
    return _fused(op)


def _logical_and(op: Op) -> str | None:
    if any(t.dtype is not DType.bool for t in list(op.inputs) + list(op.outputs)):
        return "LOGICAL_AND takes and gives bool tensors"
    return _binary(op)


def _comparison(op: Op) -> str | None:
    if op.outputs[0].dtype is not DType.bool:
        return f"{op.opcode} gives a bool tensor"
    return _binary(op)


def _same_grid(op: Op) -> str | None:
    """A quantized reshape or PAD keeps its input's grid: LiteRT copies the integers, which onto another grid
    mean other values than the float view's rounding would give (a converter never writes one)."""
    x, out = op.inputs[0], op.outputs[0]
    if is_quantized(x) and is_quantized(out) and activation_quant(x) != activation_quant(out):
        return (f"a quantized {op.opcode} onto another grid than its input's (LiteRT copies the integers "
                f"unchanged; the GPU's float view would round the values)")
    return None


def _expand_dims(op: Op) -> str | None:
    if int_values(op.input(1)) is None:
        return "axis (input 1) must be a constant"
    return _same_grid(op)


def _transpose(op: Op) -> str | None:
    perm = int_values(op.input(1))
    rank = len(op.inputs[0].shape)
    if perm is None:
        return "perm (input 1) must be a constant"
    if sorted(p % rank if rank else p for p in perm) != list(range(rank)):
        return f"perm {list(perm)} is not a permutation of the {rank} axes"
    return None


def split_axis(op: Op) -> int | None:
    """The axis a SPLIT (input 0) or SPLIT_V (input 2) cuts, when it is a constant."""
    axis = int_values(op.input(0 if op.opcode == "SPLIT" else 2))
    return None if axis is None or len(axis) != 1 else int(axis[0])


def _split(op: Op) -> str | None:
    axis = split_axis(op)
    x = op.inputs[1 if op.opcode == "SPLIT" else 0]
    if axis is None:
        return "axis must be a constant of one value"
    if not -len(x.shape) <= axis < len(x.shape):
        return f"axis {axis} out of range for rank {len(x.shape)}"
    if sum(t.shape[axis] for t in op.outputs) != x.shape[axis]:
        return "the outputs do not add up to the input along the axis"
    return None


def _quantize(op: Op) -> str | None:
    if not is_quantized(op.outputs[0]):
        return "QUANTIZE gives a quantized tensor"
    return None


def _densify(op: Op) -> str | None:
    return "DENSIFY of a runtime tensor is not implemented (of a constant it is folded at compile time)"


def _dequantize(op: Op) -> str | None:
    if not is_quantized(op.inputs[0]):
        return f"DEQUANTIZE of a runtime {op.inputs[0].dtype.name} tensor is not implemented (only quantized ones)"
    return None


def _select(op: Op) -> str | None:
    cond, out = op.inputs[0], op.outputs[0]
    if cond.dtype is not DType.bool:
        return "the condition (input 0) must be a bool tensor"
    if op.opcode == "SELECT" and len(cond.shape) == 1 and len(out.shape) > 1:
        return "SELECT with a condition per row is not implemented"
    try:
        shape = np.broadcast_shapes(*(t.shape for t in op.inputs))
    except ValueError:
        return "the inputs do not broadcast"
    if tuple(shape) != tuple(out.shape):
        return f"output shape {list(out.shape)} is not the broadcast of the inputs"
    return None


def _cast(op: Op) -> str | None:
    kinds = (DType.float32, DType.bool)
    if op.inputs[0].dtype not in kinds or op.outputs[0].dtype not in kinds:
        return (f"CAST from {op.inputs[0].dtype.name} to {op.outputs[0].dtype.name} is not implemented "
                "(only between float32 and bool)")
    return None


ARG_LENGTH = 2048  # longest axis whose indices a half float holds exactly


def _arg(op: Op) -> str | None:
    axis = int_values(op.input(1))
    x = op.inputs[0]
    if axis is None or len(axis) != 1 or not -len(x.shape) <= axis[0] < len(x.shape):
        return "axis (input 1) must be a constant of one axis of the input"
    if x.shape[axis[0]] > ARG_LENGTH:
        return f"an axis of {x.shape[axis[0]]} values; indices are held as floats, exact up to {ARG_LENGTH}"
    return None


def _add_n(op: Op) -> str | None:
    if any(tuple(t.shape) != tuple(op.outputs[0].shape) for t in op.inputs):
        return "inputs of different shapes"
    return None


def _batch_matmul(op: Op) -> str | None:
    a, b = op.inputs[0].shape, op.inputs[1].shape
    if len(a) < 2 or len(b) < 2:
        return "both inputs need rank 2 or more"
    depth_a = a[-2] if op.options.get("adj_x") else a[-1]
    depth_b = b[-1] if op.options.get("adj_y") else b[-2]
    if depth_a != depth_b:
        return f"depths {depth_a} and {depth_b} differ"
    try:
        np.broadcast_shapes(a[:-2], b[:-2])
    except ValueError:
        return "the batch dimensions do not broadcast"
    return None


def _lstm(op: Op) -> str | None:
    o = op.options
    if o.get("kernel_type", "FULL") != "BASIC" or len(op.inputs) != 5 or len(op.outputs) != 4:
        return "only the basic LSTM kernel (5 inputs, 4 outputs) is implemented"
    if o.get("fused_activation_function") != "TANH":
        return "the basic LSTM kernel requires a TANH activation"
    if o.get("cell_clip", 0) or o.get("proj_clip", 0):
        return "cell and projection clipping are not implemented"
    return _first(_rank(op.inputs[0], 2, "input"), _constant(op, 2, "weights"), _constant(op, 3, "bias"))


# -- gathers, scans and one-hot encodings ----------------------------------------------------------

def _gather(op: Op) -> str | None:
    x, indices = op.inputs[0], op.inputs[1]
    values = int_values(indices)
    if values is None:
        return ("indices (input 1) must be a constant; runtime indices stay on the CPU, which checks each "
                "against the axis as TFLite does")
    rank = len(x.shape)
    axis = op.options.get("axis", 0)
    if not -rank <= axis < rank:
        return f"axis {axis} out of range for rank {rank}"
    if op.options.get("batch_dims", 0):
        return f"batch_dims {op.options['batch_dims']} is not implemented (only 0)"
    length = x.shape[axis]
    if length > ARG_LENGTH:
        return f"an axis of {length} values; indices are held as floats, exact up to {ARG_LENGTH}"
    bad = [int(v) for v in np.asarray(values).ravel() if not 0 <= v < length]
    if bad:
        return f"index {bad[0]} is out of range [0, {length}) (TFLite refuses it)"
    return None


def _cumsum(op: Op) -> str | None:
    axis = int_values(op.input(1))
    rank = len(op.inputs[0].shape)
    if axis is None or len(axis) != 1:
        return "axis (input 1) must be a constant of one value"
    if not -rank <= axis[0] < rank:
        return f"axis {axis[0]} out of range for rank {rank}"
    return None


def _one_hot(op: Op) -> str | None:
    indices, out = op.inputs[0], op.outputs[0]
    depth = int_values(op.input(1))
    if depth is None or len(depth) != 1:
        return "depth (input 1) must be a constant of one value"
    if any(constant_value(op.input(i)) is None or constant_value(op.input(i)).size != 1 for i in (2, 3)):
        return "on_value and off_value (inputs 2 and 3) must be constant scalars"
    if indices.dtype not in (DType.int32, DType.int64):
        return f"indices (input 0) are {indices.dtype.name}; ONE_HOT takes int32 or int64 indices"
    if out.dtype is not DType.float32:
        return f"output is {out.dtype.name}; the GPU path computes float32 tensors"
    if int(depth[0]) > ARG_LENGTH:
        return f"depth {int(depth[0])}; indices are held as floats, exact up to {ARG_LENGTH}"
    rank = len(out.shape)
    axis = op.options.get("axis", -1)
    if not -rank <= axis < rank:
        return f"axis {axis} out of range for rank {rank}"
    return None


def _mediapipe_pool(op: Op) -> str | None:
    try:
        _, stride_w, stride_h, filter_w, filter_h, _ = mediapipe_pool_params(op.custom_options)
    except ValueError as exc:
        return str(exc)
    if min(stride_w, stride_h, filter_w, filter_h) < 1:
        return "filter sizes and strides must be positive"
    if filter_w * filter_h > ARG_LENGTH:
        return f"a window of {filter_w * filter_h} places; indices are held as floats, exact up to {ARG_LENGTH}"
    return _rank(op.inputs[0], 4, "input")


def _max_unpooling(op: Op) -> str | None:
    if tuple(op.inputs[1].shape) != tuple(op.inputs[0].shape):
        return "the indices (input 1) must have the shape of the values"
    return _mediapipe_pool(op)


RULES: dict[str, OpRule] = {
    "ADD": OpRule(1, 2, _binary),
    "SUB": OpRule(1, 2, _binary),
    "MUL": OpRule(1, 4, _binary),
    "MAXIMUM": OpRule(1, 2, _binary),
    "MINIMUM": OpRule(1, 2, _binary),
    "PRELU": OpRule(1, 1, _binary),
    "ADD_N": OpRule(1, 1, _add_n),
    "DIV": OpRule(1, 2, _binary),
    "FLOOR_DIV": OpRule(2, 2, _binary),  # v1 is int32 only
    "FLOOR_MOD": OpRule(1, 1, _binary),
    "SQUARED_DIFFERENCE": OpRule(1, 2, _binary),
    "POW": OpRule(1, 1, _binary),
    "LOGICAL_AND": OpRule(1, 1, _logical_and, bools="all"),
    **{code: OpRule(1, 2, _comparison, bools="outputs") for code in COMPARISONS},
    "RELU": OpRule(1, 2),
    "RELU6": OpRule(1, 2),
    "RELU_N1_TO_1": OpRule(1, 2),
    "RELU_0_TO_1": OpRule(1, 1),
    "LOGISTIC": OpRule(1, 2),
    "TANH": OpRule(1, 2),
    "EXP": OpRule(1, 2),
    "HARD_SWISH": OpRule(1, 1),
    "LOG": OpRule(1, 2),
    "SQRT": OpRule(1, 1),
    "RSQRT": OpRule(1, 2),
    "SQUARE": OpRule(1, 1),
    "ABS": OpRule(1, 2),
    "NEG": OpRule(1, 2),
    "SIN": OpRule(1, 1),
    "COS": OpRule(1, 1),
    "FLOOR": OpRule(1, 1),
    "CEIL": OpRule(1, 1),
    "ROUND": OpRule(1, 1),
    "SIGN": OpRule(1, 1),
    "ELU": OpRule(1, 1),
    "GELU": OpRule(1, 2),
    "LEAKY_RELU": OpRule(1, 2),
    "CONV_2D": OpRule(1, 5, _conv),
    "DEPTHWISE_CONV_2D": OpRule(2, 6, _depthwise),
    "FULLY_CONNECTED": OpRule(1, 9, _fully_connected),
    "BATCH_MATMUL": OpRule(1, 2, _batch_matmul),
    "TRANSPOSE_CONV": OpRule(1, 3, _transpose_conv, params=(0,)),
    "AVERAGE_POOL_2D": OpRule(1, 2, _pool),
    "MAX_POOL_2D": OpRule(1, 2, _pool),
    "CONCATENATION": OpRule(1, 2, _concat),
    "PAD": OpRule(1, 2, _pad, params=(1,)),
    "PADV2": OpRule(1, 2, _padv2, params=(1,)),
    "RESHAPE": OpRule(1, 1, _same_grid, params=(1,)),
    "SPLIT": OpRule(1, 2, _split, params=(0,)),
    "SPLIT_V": OpRule(1, 2, _split, params=(1, 2)),
    "EXPAND_DIMS": OpRule(1, 1, _expand_dims, params=(1,)),
    "SQUEEZE": OpRule(1, 1, _same_grid),
    "TRANSPOSE": OpRule(1, 2, _transpose, params=(1,)),
    "RESIZE_BILINEAR": OpRule(3, 3, _resize, params=(1,)),
    "RESIZE_NEAREST_NEIGHBOR": OpRule(3, 4, _resize, params=(1,)),
    "SOFTMAX": OpRule(1, 2),
    "STRIDED_SLICE": OpRule(1, 2, _strided_slice, params=(1, 2, 3)),
    "MEAN": OpRule(1, 2, _mean, params=(1,)),
    **{code: OpRule(1, 2, _reduce, params=(1,)) for code in ("SUM", "REDUCE_PROD", "REDUCE_MAX", "REDUCE_MIN")},
    **{code: OpRule(1, 1, _reduce, params=(1,), bools="all") for code in ("REDUCE_ANY", "REDUCE_ALL")},
    "DEPTH_TO_SPACE": OpRule(1, 2, _depth_to_space),
    "SPACE_TO_DEPTH": OpRule(1, 2, _depth_to_space),
    "SLICE": OpRule(1, 2, _slice, params=(1, 2)),
    "SPACE_TO_BATCH_ND": OpRule(1, 2, _space_batch, params=(1, 2)),
    "BATCH_TO_SPACE_ND": OpRule(1, 2, _space_batch, params=(1, 2)),
    "TILE": OpRule(1, 2, _tile, params=(1,)),
    "MIRROR_PAD": OpRule(1, 2, _mirror_pad, params=(1,)),
    "SELECT": OpRule(1, 2, _select, bools="first"),
    "SELECT_V2": OpRule(1, 1, _select, bools="first"),
    "ARG_MAX": OpRule(1, 2, _arg, params=(1,), indices=True),
    "ARG_MIN": OpRule(1, 2, _arg, params=(1,), indices=True),
    "PACK": OpRule(1, 2, _pack),
    "UNPACK": OpRule(1, 2, _unpack),
    "LSTM": OpRule(2, 2, _lstm),
    "DEQUANTIZE": OpRule(4, 4, _dequantize),
    "DENSIFY": OpRule(1, 1, _densify),
    "QUANTIZE": OpRule(1, 3, _quantize),
    "CAST": OpRule(1, 1, _cast, bools="all"),
    "GATHER": OpRule(1, 1, _gather, params=(1,)),
    "CUMSUM": OpRule(1, 1, _cumsum, params=(1,)),
    "ONE_HOT": OpRule(1, 1, _one_hot, params=(0, 1, 2, 3)),
}
POOL_ARGMAX, MAX_UNPOOLING = "MaxPoolingWithArgmax2D", "MaxUnpooling2D"
CUSTOM_RULES: dict[str, OpRule] = {
    TRANSPOSE_CONV_BIAS: OpRule(1, 1, _transpose_conv_bias),
    POOL_ARGMAX: OpRule(1, 1, _mediapipe_pool),
    MAX_UNPOOLING: OpRule(1, 1, _max_unpooling),
}


def rule_for(op: Op) -> OpRule | None:
    return (CUSTOM_RULES if op.custom else RULES).get(op.opcode)


def _tensor_reason(t: Tensor, what: str, options: CompileOptions, bool_ok: bool) -> str | None:
    if len(t.shape) > 4:
        return f"{what} has rank {len(t.shape)}; the GPU layout holds rank <= 4"
    if t.size == 0:
        return f"{what} is empty (shape {list(t.shape)})"
    if t.dtype is DType.bool and bool_ok:
        return None
    if needs_quantized_support(t):
        if not options.allow_quantized:
            return f"{what} is quantized {t.dtype.name}; enable allow_quantized to run it on the float view"
        if is_quantized(t) and t.quantization.per_channel and not t.is_constant:
            return f"{what} is quantized per channel; only constants may be"
        return None
    if t.dtype is DType.float16 and (t.is_constant or has_constant_value(t)):
        return None
    if t.dtype is not DType.float32:
        return f"{what} is {t.dtype.name}; the GPU path computes float32 tensors"
    return None


def computed_at_compile_time(op: Op) -> bool:
    """Shape arithmetic on static shapes (``shapes.static_op``) whose values only more of it or an op's
    parameters read (a RESHAPE's shape): the lowering computes nothing for it, runs no kernel, and the ops
    stay with their reader (``fusion.placement_groups``).  Left to the CPU, a converter's SHAPE ->
    STRIDED_SLICE -> PACK before each RESHAPE split a GPU plan at every one of them."""
    if not static_op(op) or static_value(op.outputs[0]) is None:  # one that fails is left to the CPU to report
        return False
    for t in op.outputs:
        if len(t.uses) != 1:  # a graph output, or read twice: its value may have to leave the partition
            return False
        use = t.uses[0]
        rule = rule_for(use)
        if not computed_at_compile_time(use) and (use.custom or rule is None or any(
                x is t and i not in rule.params for i, x in enumerate(use.inputs))):
            return False
    return True


def check_op(op: Op, options: CompileOptions) -> Support:
    """The GPU path's answer for ``op``: yes, or no with the human reason."""
    rule = rule_for(op)
    if rule is None:
        kind = "custom op" if op.custom else "op"
        return Support.no(f"{kind} {op.opcode} has no GPU kernel")
    if op.version > rule.versions:
        if op.version > rule.quant_versions:
            return Support.no(f"{op.opcode} version {op.version} is not supported on the GPU "
                              f"(float up to v{rule.versions}, quantized up to v{rule.quant_versions})")
        if not options.allow_quantized:
            return Support.no(f"{op.opcode} version {op.version} is a quantized variant; the GPU accepts "
                              f"v{rule.versions} unless allow_quantized is on")
    if is_folded_dequantize(op):
        return _check_folded_dequantize(op, options)
    for i, t in enumerate(op.inputs):
        if t is None or i in rule.params:
            continue
        reason = _tensor_reason(t, f"input {i}", options, rule.bools == "all" or (rule.bools == "first" and i == 0))
        if reason:
            return Support.no(reason)
    for i, t in enumerate(op.outputs):
        if rule.indices and t.dtype in (DType.int32, DType.int64):
            continue
        reason = _tensor_reason(t, f"output {i}", options, rule.bools in ("all", "outputs"))
        if reason:
            return Support.no(reason)
    reason = rule.check(op) if rule.check else None
    return Support.no(reason) if reason else Support.yes()


def _check_folded_dequantize(op: Op, options: CompileOptions) -> Support:
    if not op.input(0).dtype.is_float and not options.allow_quantized:
        return Support.no(f"{op.opcode} of a {op.input(0).dtype.name} constant needs allow_quantized")
    return Support.yes()
