"""Structural check of a graph before placement: every op's operands must fit the op.

Two steps per op, both before any kernel, engine or plugin sees the model:
its operands are checked against the op's entry in OPERANDS (arity, dtypes,
ranks, channel and window consistency, ranges of options and constant
operands, as LiteRT's Prepare steps refuse them), then its outputs take the
shapes the op's shape rule derives (see validate_graph).
Every tensor's quantization is checked once (finite positive scales, zero
points the type can hold).  A failure is a ModelFormatError naming the op and
the rule.  Every op code with a shape rule or a CPU kernel has an entry here
(tests/test_hostile.py checks that), so a new op cannot skip the door.  Custom ops with a rule
(TFLite_Detection_PostProcess) are sized by it too.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .errors import DelegateError, ModelFormatError, UnsupportedOpError
from .ir import DType, Op, Subgraph, Tensor
from .shapes import ELEMENTWISE_BINARY, ELEMENTWISE_UNARY, detection_postprocess_options, has_rule, \
    mediapipe_pool_params, pool_argmax_geometry, settle, shape_values


class Invalid(Exception):
    """An operand breaks one of its op's rules (the message says which)."""


def need(condition, rule: str) -> None:
    if not condition:
        raise Invalid(rule)


@dataclass(frozen=True)
class Operands:
    """What an op takes: input and output counts (inclusive ranges), the input slots that may be
    absent, whether its outputs keep the type of its data input (``keeps_type``: the slot), and a
    check of its operands and options."""

    inputs: tuple[int, int]
    outputs: tuple[int, int] = (1, 1)
    optional: frozenset[int] = frozenset()
    check: Callable[[Op], None] | None = None
    keeps_type: int | None = None


OPERANDS: dict[str, Operands] = {}
# Integer types whose values are quantized through a scale and zero point: the range each can hold.
_QUANT_RANGE = {DType.int8: (-128, 127), DType.uint8: (0, 255), DType.int16: (-32768, 32767),
                DType.int4: (-8, 7), DType.int32: (-2 ** 31, 2 ** 31 - 1), DType.int64: (-2 ** 63, 2 ** 63 - 1)}
# Most detections TFLite_Detection_PostProcess may ask for (boxes x classes per detection): its
# outputs are sized by it, so an absurd count is an absurd allocation.
MAX_DETECTIONS = 1 << 16


def operands(*opcodes: str, inputs, outputs=(1, 1), optional=(), keeps_type: int | None = None):
    """Register an op's Operands entry; used bare, or as a decorator adding its check."""
    lo_hi = inputs if isinstance(inputs, tuple) else (inputs, inputs)
    out_range = outputs if isinstance(outputs, tuple) else (outputs, outputs)

    def register(check=None):
        for code in opcodes:
            OPERANDS[code] = Operands(lo_hi, out_range, frozenset(optional), check, keeps_type)
        return check
    register()
    return register


# -- helpers ------------------------------------------------------------------

def _rank(t: Tensor, *ranks: int, what: str = "input") -> None:
    need(len(t.shape) in ranks, f"{what} {t.index} must have rank {' or '.join(map(str, ranks))}, "
                                f"not {len(t.shape)}")


def _const(op: Op, i: int) -> np.ndarray | None:
    t = op.input(i)
    return None if t is None or t.data is None else np.asarray(t.data)


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    need(-rank <= axis < rank, f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def _positive(op: Op, *keys: str) -> None:
    for key in keys:
        value = op.options.get(key, 1)
        need(int(value) >= 1, f"{key} must be >= 1, not {value}")


def _same_dtype(op: Op, slots) -> None:
    tensors = [op.inputs[i] for i in slots if op.input(i) is not None]
    need(len({t.dtype for t in tensors}) <= 1,
         f"inputs {[t.index for t in tensors]} must share one type, not {[t.dtype.name for t in tensors]}")


def _output_like_input(op: Op, slot: int = 0) -> None:
    for t in op.outputs:
        need(t.dtype == op.inputs[slot].dtype,
             f"output {t.index} of type {t.dtype.name} must have input {slot}'s type {op.inputs[slot].dtype.name}")


# LiteRT's 64-bit rescale of an int16 kernel's sums (MultiplyByQuantizedMultiplier on int64) takes them below
# 2**47 in magnitude; an int64 bias leaving the products' sums no room there overflows it, and its kernels then
# compute what the wrap gives (a fixture's bias mutated to 9.2e18 gave outputs 65535 steps apart).
INT16_SUM_BOUND = 1 << 47


def _one_scale(op: Op, slot: int = 0) -> None:
    """A quantized convolution or product reads one scale and zero point of its data input (``slot``) and of its
    output, as LiteRT's kernels do: a scale per channel there is not something they compute with (a fuzzed
    MobileNet whose convolution read a per-channel constant came out 14 steps from LiteRT's)."""
    for t, what in ((op.input(slot), "input"), (op.outputs[0], "output")):
        q = None if t is None else t.quantization
        if q is not None and t.dtype in (DType.int8, DType.uint8, DType.int16) and np.size(q.scale) > 1:
            raise Invalid(f"{what} {t.index} has {np.size(q.scale)} scales: the kernel reads one, not one per channel")


def _bias(op: Op, slot: int, units: int, products: int = 0, data: int = 0) -> None:
    """The bias holds a value per output channel; an int64 bias of an int16 kernel (its input in slot ``data``)
    summing ``products`` products of its input and weights a value each leaving the sum within
    INT16_SUM_BOUND."""
    bias = op.input(slot)
    if bias is None:
        return
    need(bias.size == units, f"bias {bias.index} has {bias.size} values for {units} output channels")
    values = _const(op, slot)
    if products and values is not None and values.size and bias.dtype == DType.int64 \
            and op.inputs[data].dtype == DType.int16:
        weight = op.inputs[1].dtype
        largest = products * (1 << 15) * (1 << (15 if weight == DType.int16 else 7))
        widest = max(int(values.max()), -int(values.min()))
        need(widest + largest < INT16_SUM_BOUND,
             f"bias {bias.index} holds {widest if widest == int(values.max()) else -widest}: with {products} "
             f"products a sum leaves the 2**47 that LiteRT's 64-bit rescale of int16 sums takes")


# -- elementwise ----------------------------------------------------------------

_COMPARISONS = ("LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL")


@operands(*ELEMENTWISE_BINARY, inputs=2)
def _binary(op: Op) -> None:
    _same_dtype(op, (0, 1))
    if op.opcode not in _COMPARISONS:
        _output_like_input(op)
    if op.opcode == "ADD":
        _quantized_add(op)
    if op.opcode == "MUL":
        _quantized_mul(op)
    if op.opcode in ("ADD", "SUB", "MUL") and op.inputs[0].shape != op.inputs[1].shape:
        # LiteRT's broadcasting kernels abort the process on an operand with a scale per channel
        need(all(t.quantization is None or np.size(t.quantization.scale) <= 1 for t in op.inputs),
             "a broadcast operand takes one scale, not one per channel")


# A quantized MUL rescales each product to the output by the input scales' product over the output's, in
# 32-bit fixed point with a left shift for multipliers above 1: from 2**30 on that shift reaches 31 bits and the
# product overflows (a fuzzed fixture's output scale of 1e-45 gave outputs 3277 steps from LiteRT's).
MUL_MULTIPLIER_BOUND = 2.0 ** 30


def _quantized_binary(op: Op) -> tuple[Tensor, Tensor, Tensor] | None:
    """(a, b, out) of an integer ADD or MUL whose three tensors are quantized, else None."""
    out, (a, b) = op.outputs[0], op.inputs
    if out.dtype not in (DType.int8, DType.uint8, DType.int16) or any(t.quantization is None for t in (a, b, out)):
        return None
    return a, b, out


def _quantized_mul(op: Op) -> None:
    tensors = _quantized_binary(op)
    if tensors is None:
        return
    scales = [_first_scale(t) for t in tensors]
    need(scales[0] * scales[1] / scales[2] < MUL_MULTIPLIER_BOUND,
         f"the output scale {scales[2]:g} is too small for input scales {scales[0]:g} and {scales[1]:g} (their "
         f"product over it must stay below 2^30, LiteRT's fixed-point rescale)")


def _first_scale(t: Tensor | None, default: float = 1.0) -> float:
    """A tensor's (first) quantization scale, ``default`` where it has none."""
    q = None if t is None else t.quantization
    return float(np.asarray(q.scale).ravel()[0]) if q is not None and np.size(q.scale) else default


def _power_of_two(scale: float) -> bool:
    return scale > 0 and math.frexp(scale)[0] == 0.5


def _quantized_add(op: Op) -> None:
    """LiteRT's quantized ADD rescales its sum to the output by a multiplier it requires below 1 (the process
    aborts otherwise): twice the larger input scale over 2^20 (2^15 for int16) times the output's."""
    tensors = _quantized_binary(op)
    if tensors is None:
        return
    out = tensors[2]
    scales = [_first_scale(t) for t in tensors]
    zeros = [int(np.asarray(t.quantization.zero_point).ravel()[0]) for t in tensors]
    if out.dtype == DType.int16 and op.options.get("pot_scale_int16", True) and not any(zeros) and \
            all(map(_power_of_two, scales)):
        return  # int16 scales of powers of two: LiteRT shifts instead
    multiplier = 2 * max(scales[:2]) / ((1 << (15 if out.dtype == DType.int16 else 20)) * scales[2])
    need(multiplier < 1, f"the output scale {scales[2]:g} is too small for input scales {scales[0]:g} and "
                         f"{scales[1]:g} (LiteRT needs twice the larger over 2^{15 if out.dtype == DType.int16 else 20}"
                         f" of it below 1)")


_UNARY_WITH_AXIS = ("CUMSUM",)
# Unary ops keep their input's type, but for casts and SOFTMAX (int8 in, int16 out in LiteRT).
_CHANGE_TYPE = ("CAST", "QUANTIZE", "DEQUANTIZE", "SOFTMAX", "COMPLEX_ABS", "REAL", "IMAG")
operands(*(code for code in ELEMENTWISE_UNARY if code not in _UNARY_WITH_AXIS + _CHANGE_TYPE),
         inputs=1, keeps_type=0)
@operands("SOFTMAX", inputs=1)
def _softmax(op: Op) -> None:
    beta = float(op.options.get("beta", 1.0))
    need(math.isfinite(beta), f"beta must be a finite number, not {beta}")
operands("CAST", "QUANTIZE", "DEQUANTIZE", "SHAPE", "COMPLEX_ABS", "REAL", "IMAG", inputs=1)


@operands("RFFT2D", inputs=2)
def _rfft2d(op: Op) -> None:
    _rank(op.inputs[0], *range(2, 9))
    size = _const(op, 1)
    need(size is not None, "fft_length must be a constant")
    need(size.size == 2 and all(int(v) >= 1 and not int(v) & (int(v) - 1) for v in size.ravel()),
         f"fft_length {size.ravel().tolist()} must be two powers of two")
    need(int(size.ravel()[1]) >= 2, f"fft_length {size.ravel().tolist()}: the real transform needs 2 columns")
operands("DENSIFY", "ZEROS_LIKE", inputs=1, keeps_type=0)

# -- state and control flow (their subgraphs are checked where they are called) ------------------

operands("VAR_HANDLE", inputs=0)
operands("READ_VARIABLE", inputs=1)
operands("ASSIGN_VARIABLE", inputs=2, outputs=0)
operands("CALL_ONCE", inputs=0, outputs=0)
operands("IF", inputs=(1, 1 << 16), outputs=(0, 1 << 16))


@operands("WHILE", inputs=(0, 1 << 16), outputs=(0, 1 << 16))
def _while(op: Op) -> None:
    need(len(op.inputs) == len(op.outputs),
         f"a loop carries its values: {len(op.inputs)} inputs but {len(op.outputs)} outputs")


@operands("CUMSUM", inputs=2, keeps_type=0)
def _cumsum(op: Op) -> None:
    axis = _const(op, 1)
    if axis is not None:
        need(axis.size == 1, "axis must be one value")
        _axis(int(axis.ravel()[0]), len(op.inputs[0].shape))


@operands("SELECT", "SELECT_V2", inputs=3, keeps_type=1)
def _select(op: Op) -> None:
    _same_dtype(op, (1, 2))
    need(op.inputs[0].dtype == DType.bool, "the condition must be bool")


# -- convolutions, pools, products ----------------------------------------------

# LiteRT's convolution kernels refuse strides and dilations beyond 16 bits at prepare (its default delegate
# runs them, differently from every other engine)
WINDOW_STEP_MAX = 2 ** 15 - 1


def _window(op: Op) -> None:
    keys = ("stride_h", "stride_w", "dilation_h_factor", "dilation_w_factor")
    _positive(op, *keys)
    for key in keys:
        value = int(op.options.get(key, 1))
        need(value <= WINDOW_STEP_MAX, f"{key} {value} is above {WINDOW_STEP_MAX}, the most LiteRT's kernels take")


@operands("CONV_2D", inputs=(2, 3), optional=(2,))
def _conv(op: Op) -> None:
    x, w = op.inputs[0], op.inputs[1]
    _rank(x, 4)
    _rank(w, 4, what="filter")
    _window(op)
    units, kh, kw, depth = w.shape
    need(kh >= 1 and kw >= 1 and depth >= 1 and units >= 1, f"filter shape {list(w.shape)} has an empty dimension")
    channels = x.shape[3]
    need(channels % depth == 0, f"input channels {channels} are not a multiple of the filter's {depth}")
    need(units % (channels // depth) == 0 if channels else False,
         f"{units} output channels do not split into {channels // depth if channels else 0} groups")
    _bias(op, 2, units, kh * kw * depth)
    _one_scale(op)


# Three inputs, as LiteRT's kernel reads them (with two it reads past the node's inputs and crashes;
# an absent bias is -1 in the third slot).
@operands("DEPTHWISE_CONV_2D", inputs=3, optional=(2,))
def _depthwise(op: Op) -> None:
    x, w = op.inputs[0], op.inputs[1]
    _rank(x, 4)
    _rank(w, 4, what="filter")
    _window(op)
    one, kh, kw, units = w.shape
    need(one == 1 and kh >= 1 and kw >= 1, f"filter shape {list(w.shape)} must be (1, KH>=1, KW>=1, C*M)")
    channels = x.shape[3]
    need(channels >= 1 and units % channels == 0,
         f"filter channels {units} are not a multiple of the input's {channels}")
    # depth_multiplier is not checked: LiteRT's builtin kernel ignores it for units // channels
    _bias(op, 2, units, kh * kw)
    _one_scale(op)


@operands("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D", inputs=1, keeps_type=0)
def _pool(op: Op) -> None:
    _rank(op.inputs[0], 4)
    _positive(op, "stride_h", "stride_w")
    for key in ("filter_height", "filter_width"):
        need(int(op.options.get(key, 0)) >= 1, f"{key} must be >= 1, not {op.options.get(key)}")


@operands("TRANSPOSE_CONV", inputs=(3, 4), optional=(3,))
def _transpose_conv(op: Op) -> None:
    shape, w, x = op.inputs[0], op.inputs[1], op.inputs[2]
    _rank(x, 4)
    _rank(w, 4, what="filter")
    _positive(op, "stride_h", "stride_w")
    need(shape.dtype == DType.int32 and shape.shape == (4,), "the output shape must be 4 int32 values")
    units, kh, kw, depth = w.shape
    need(kh >= 1 and kw >= 1 and units >= 1, f"filter shape {list(w.shape)} has an empty dimension")
    need(depth == x.shape[3], f"filter input channels {depth} differ from the input's {x.shape[3]}")
    out = _const(op, 0)
    if out is not None:
        need(all(int(d) >= 1 for d in out.ravel()), f"output shape {out.ravel().tolist()} has a dimension < 1")
        need(int(out.ravel()[3]) == units, f"output channels {int(out.ravel()[3])} differ from the filter's {units}")
    _bias(op, 3, units, kh * kw * depth, data=2)
    _one_scale(op, 2)


@operands("Convolution2DTransposeBias", inputs=3)
def _transpose_conv_bias(op: Op) -> None:
    options = op.custom_options or b""
    need(len(options) >= 12, f"custom options hold {len(options)} bytes, not the 12 of (padding, stride_w, stride_h)")
    padding, stride_w, stride_h = struct.unpack_from("<iii", options)
    need(padding in (1, 2), f"padding {padding} is neither SAME (1) nor VALID (2)")
    need(stride_w >= 1 and stride_h >= 1, f"strides ({stride_h}, {stride_w}) must be >= 1")
    x, w = op.inputs[0], op.inputs[1]
    _rank(x, 4)
    _rank(w, 4, what="filter")
    units, kh, kw, depth = w.shape
    need(kh >= 1 and kw >= 1 and units >= 1, f"filter shape {list(w.shape)} has an empty dimension")
    need(depth == x.shape[3], f"filter input channels {depth} differ from the input's {x.shape[3]}")
    _bias(op, 2, units)


def _mediapipe_pool(op: Op) -> tuple[int, ...]:
    try:
        params = mediapipe_pool_params(op.custom_options)
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    padding, stride_w, stride_h, filter_w, filter_h, _ = params
    need(padding in (1, 2), f"padding {padding} is neither SAME (1) nor VALID (2)")
    need(min(stride_w, stride_h, filter_w, filter_h) >= 1,
         f"strides ({stride_h}, {stride_w}) and filter ({filter_h}, {filter_w}) must be >= 1")
    for t in (*op.inputs, *op.outputs):
        _rank(t, 4, what="tensor")
        need(t.dtype == DType.float32, f"tensor {t.index} is {t.dtype.name}; MediaPipe's kernel takes float32")
    return params


@operands("MaxPoolingWithArgmax2D", inputs=1, outputs=2)
def _pool_argmax(op: Op) -> None:
    _, _, _, filter_w, filter_h, _ = _mediapipe_pool(op)
    _, h, w, _ = op.inputs[0].shape
    out = pool_argmax_geometry(op.inputs[0].shape, op.custom_options)[0]
    need(out[1] >= 1 and out[2] >= 1, f"a {filter_h}x{filter_w} VALID window does not fit the {h}x{w} input")


@operands("MaxUnpooling2D", inputs=2)
def _max_unpooling(op: Op) -> None:
    _mediapipe_pool(op)
    need(op.inputs[1].shape == op.inputs[0].shape, "the indices must have the shape of the values")


@operands("FULLY_CONNECTED", inputs=(2, 3), outputs=(1, 2), optional=(2,))
def _fully_connected(op: Op) -> None:
    x, w = op.inputs[0], op.inputs[1]
    _rank(w, 2, what="weights")
    units, depth = w.shape
    need(depth >= 1, "weights have depth 0")
    need(x.size % depth == 0, f"input size {x.size} is not a multiple of the weights' depth {depth}")
    if op.options.get("keep_num_dims"):
        need(x.shape and x.shape[-1] == depth,
             f"keep_num_dims needs the input's last dimension ({x.shape[-1] if x.shape else None}) "
             f"to be the weights' depth {depth}")
    _bias(op, 2, units, depth)
    _one_scale(op)


@operands("BATCH_MATMUL", inputs=2)
def _batch_matmul(op: Op) -> None:
    a, b = op.inputs[0].shape, op.inputs[1].shape
    need(len(a) >= 2 and len(b) >= 2, "both operands need rank >= 2")
    inner_a = a[-2] if op.options.get("adj_x") else a[-1]
    inner_b = b[-1] if op.options.get("adj_y") else b[-2]
    need(inner_a == inner_b, f"inner dimensions {inner_a} and {inner_b} differ")


# The input slots of a 24-input LSTM's input and recurrent weights, gate by gate (input, forget, cell, output).
_LSTM_GATE_WEIGHTS = ((1, 5), (2, 6), (3, 7), (4, 8))


@operands("UNIDIRECTIONAL_SEQUENCE_LSTM", inputs=(20, 24), optional=(1, 5, 9, 10, 11, 12, 16, 17, 20, 21, 22, 23))
def _sequence_lstm(op: Op) -> None:
    """An integer LSTM's gate rescales in float32's range (``_integer_lstm_scales``); diagonal recurrent weights
    (``diagonal_recurrent_tensors``) one scale per cell, as LiteRT reads them, and only in its float kernel: its
    integer one, given them, crashes the process."""
    if op.inputs[0].dtype == DType.int8:
        _integer_lstm_scales(op)
    if not op.options.get("diagonal_recurrent_tensors"):
        return
    need(op.inputs[0].dtype in (DType.float32, DType.float16), "diagonal recurrent weights need a float input")
    forget = op.input(2)
    cells = forget.shape[0] if forget is not None and forget.shape else 0
    for _, slot in _LSTM_GATE_WEIGHTS:
        w = op.input(slot)
        need(w is None or w.shape == (cells,), f"diagonal recurrent weights {slot} must be {cells} values, "
                                                f"not {list(w.shape) if w is not None else None}")


def _integer_lstm_scales(op: Op) -> None:
    """The rescales of an integer LSTM's gate sums, in float32 as LiteRT derives them (weights' scale times the
    activation's over the gate's: 2^-12, or its intermediate's with layer norms), must be finite and above 0:
    past float32's range LiteRT's kernel computes from an undefined multiplier."""
    def scale(t: Tensor | None) -> np.float32:
        return np.float32(_first_scale(t))
    layer_norm = op.input(21) is not None  # the forget gate's layer norm coefficients
    x, h = op.inputs[0], op.input(18)  # the input and the output state
    with np.errstate(over="ignore", under="ignore"):
        for k, (w_in, w_rec) in enumerate(_LSTM_GATE_WEIGHTS):
            if op.input(w_in) is None:
                continue
            gate = scale(op.intermediates[k]) if layer_norm and len(op.intermediates) > k else np.float32(2.0 ** -12)
            for w, a in ((w_in, x), (w_rec, h)):
                real = scale(op.input(w)) * scale(a) / gate
                need(np.isfinite(real) and real > 0, f"the rescale of gate {k}'s sums from input {w} is {real} in "
                                                     f"float32: its scales leave float32's range")


@operands("LSTM", inputs=(5, 24), outputs=(1, 4), optional=(1, 5, 9, 10, 11, 12, 16, 17, 20, 21, 22, 23))
def _lstm(op: Op) -> None:
    """The FULL kernel's 20 or 24 inputs and one output, or the BASIC one's 5 and 4 (input, previous
    activation, weights over both, bias, previous state)."""
    if op.options.get("kernel_type") != "BASIC":
        need(len(op.inputs) >= 20 and len(op.outputs) == 1, "the FULL kernel takes 20 or 24 inputs and one output")
        return
    need(len(op.inputs) == 5 and len(op.outputs) == 4, "the BASIC kernel takes 5 inputs and 4 outputs")
    x, activation, weights, bias, state = op.inputs
    need(all(t is not None for t in op.inputs), "the BASIC kernel needs all 5 inputs")
    _rank(weights, 2)
    units = activation.shape[-1] if activation.shape else 0
    need(weights.shape == (4 * units, x.shape[-1] + units) if x.shape else False,
         f"weights of shape {list(weights.shape)} do not fit 4 x {units} units over the input and activation")
    need(bias.shape == (4 * units,) and state.shape == activation.shape, "bias or state do not fit the units")


@operands("ADD_N", inputs=(2, 1 << 16), keeps_type=0)
def _add_n(op: Op) -> None:
    _same_dtype(op, range(len(op.inputs)))
    shapes = {t.shape for t in op.inputs}
    need(len(shapes) == 1, f"inputs must share one shape, not {[list(s) for s in shapes]}")


@operands("TFLite_Detection_PostProcess", inputs=3, outputs=4)
def _detection_postprocess(op: Op) -> None:
    try:
        o = detection_postprocess_options(op.custom_options)
        values = {key: float(o[key]) for key in ("max_detections", "max_classes_per_detection",
                                                 "detections_per_class", "num_classes", "nms_score_threshold",
                                                 "nms_iou_threshold", "y_scale", "x_scale", "h_scale", "w_scale")}
    except Exception as exc:
        raise Invalid(f"custom options are not a valid flexbuffer map ({type(exc).__name__}: {exc})") from None
    need(all(math.isfinite(v) for v in values.values()), "options must be finite numbers")
    for key in ("max_detections", "max_classes_per_detection", "detections_per_class", "num_classes"):
        need(values[key] >= 1 and values[key] == int(values[key]), f"{key} must be a whole number >= 1")
    detections = values["max_detections"] * values["max_classes_per_detection"]
    need(detections <= MAX_DETECTIONS, f"max_detections x max_classes_per_detection = {detections:.0f} "
                                       f"exceeds {MAX_DETECTIONS}")
    need(0 <= values["nms_iou_threshold"] <= 1, "nms_iou_threshold must lie in [0, 1]")
    need(all(values[k] > 0 for k in ("y_scale", "x_scale", "h_scale", "w_scale")), "box scales must be > 0")
    boxes, scores, anchors = op.inputs
    _rank(boxes, 3)
    _rank(scores, 3)
    _rank(anchors, 2)
    need(boxes.shape[2] >= 4 and anchors.shape[1] == 4, "boxes need 4 coordinates per anchor")
    need(boxes.shape[1] == scores.shape[1] == anchors.shape[0], "boxes, scores and anchors disagree on anchors")
    need(values["num_classes"] <= scores.shape[2], f"num_classes {values['num_classes']:.0f} exceeds the "
                                                   f"{scores.shape[2]} score columns")


# -- shapes and data movement ---------------------------------------------------

# A shape input given as absent (-1) is refused: LiteRT reads it when the node has two inputs, and crashes.
@operands("RESHAPE", inputs=(1, 2), keeps_type=0)
def _reshape(op: Op) -> None:
    target = _const(op, 1)
    if target is None:
        if op.input(1) is not None:
            return  # computed at run time; the kernel checks the product
        if not op.options.get("new_shape"):
            return  # the declared output shape stands, as in LiteRT
        target = np.asarray(op.options["new_shape"])
    dims = [int(v) for v in target.ravel()]
    need(dims.count(-1) <= 1 and all(d >= -1 for d in dims), f"target shape {dims} has more than one -1 "
                                                             f"or a negative dimension")
    size, known = op.inputs[0].size, math.prod(d for d in dims if d != -1)
    if -1 in dims:
        need(known > 0 and size % known == 0, f"{size} values do not fill target shape {dims}")
    else:
        need(known == size, f"target shape {dims} holds {known} values, the input {size}")


@operands("SQUEEZE", inputs=1, keeps_type=0)
def _squeeze(op: Op) -> None:
    shape = op.inputs[0].shape
    for d in op.options.get("squeeze_dims", []) or []:
        need(shape[_axis(int(d), len(shape), "squeeze dimension")] == 1, f"dimension {d} is not 1")


@operands("EXPAND_DIMS", inputs=2, keeps_type=0)
def _expand_dims(op: Op) -> None:
    axis = _const(op, 1)
    if axis is not None:
        need(axis.size == 1, "axis must be one value")
        _axis(int(axis.ravel()[0]), len(op.inputs[0].shape) + 1)


@operands("CONCATENATION", inputs=(1, 1 << 16), keeps_type=0)
def _concatenation(op: Op) -> None:
    _same_dtype(op, range(len(op.inputs)))
    first = op.inputs[0].shape
    axis = _axis(int(op.options.get("axis", 0)), max(len(first), 1))
    for t in op.inputs[1:]:
        need(len(t.shape) == len(first) and all(a == b for i, (a, b) in enumerate(zip(t.shape, first)) if i != axis),
             f"input {t.index} of shape {list(t.shape)} does not stack with {list(first)} on axis {axis}")


@operands("PACK", inputs=(1, 1 << 16), keeps_type=0)
def _pack(op: Op) -> None:
    _same_dtype(op, range(len(op.inputs)))
    need(int(op.options.get("values_count", len(op.inputs))) == len(op.inputs),
         f"values_count {op.options.get('values_count')} differs from the {len(op.inputs)} inputs")
    need(len({t.shape for t in op.inputs}) == 1, "inputs must share one shape")
    _axis(int(op.options.get("axis", 0)), len(op.inputs[0].shape) + 1)


@operands("UNPACK", inputs=1, outputs=(1, 1 << 16), keeps_type=0)
def _unpack(op: Op) -> None:
    shape = op.inputs[0].shape
    need(shape, "cannot unpack a scalar")
    axis = _axis(int(op.options.get("axis", 0)), len(shape))
    need(shape[axis] == len(op.outputs) == int(op.options.get("num", shape[axis])),
         f"dimension {axis} ({shape[axis]}) differs from num / the {len(op.outputs)} outputs")


@operands("SPLIT", inputs=2, outputs=(1, 1 << 16), keeps_type=1)
def _split(op: Op) -> None:
    shape = op.inputs[1].shape
    n = int(op.options.get("num_splits", 0))
    need(n >= 1 and n == len(op.outputs), f"num_splits {n} differs from the {len(op.outputs)} outputs")
    axis = _const(op, 0)
    if axis is not None:
        a = _axis(int(axis.ravel()[0]), len(shape))
        need(shape[a] % n == 0, f"dimension {a} ({shape[a]}) does not split {n} ways")


@operands("SPLIT_V", inputs=3, outputs=(1, 1 << 16), keeps_type=0)
def _split_v(op: Op) -> None:
    sizes, axis, shape = _const(op, 1), _const(op, 2), op.inputs[0].shape
    if sizes is None or axis is None:
        return
    sizes = [int(s) for s in sizes.ravel()]
    a = _axis(int(axis.ravel()[0]), len(shape))
    need(len(sizes) == len(op.outputs), f"{len(sizes)} sizes for {len(op.outputs)} outputs")
    need(sizes.count(-1) <= 1 and all(s >= -1 for s in sizes), f"sizes {sizes} are invalid")
    known = sum(s for s in sizes if s != -1)
    need(known == shape[a] if -1 not in sizes else known <= shape[a],
         f"sizes {sizes} do not split dimension {a} ({shape[a]})")


@operands("TRANSPOSE", inputs=2, keeps_type=0)
def _transpose(op: Op) -> None:
    perm = _const(op, 1)
    if perm is not None:
        need(sorted(int(p) for p in perm.ravel()) == list(range(len(op.inputs[0].shape))),
             f"{perm.ravel().tolist()} is not a permutation of rank {len(op.inputs[0].shape)}")


@operands("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "REDUCE_ANY", "REDUCE_ALL", inputs=2, keeps_type=0)
def _reduce(op: Op) -> None:
    axes, rank = _const(op, 1), len(op.inputs[0].shape)
    if axes is not None:
        for a in axes.ravel():
            _axis(int(a), max(rank, 1))


@operands("ARG_MAX", "ARG_MIN", inputs=2)
def _arg(op: Op) -> None:
    axis = _const(op, 1)
    if axis is not None:
        need(axis.size == 1, "axis must be one value")
        _axis(int(axis.ravel()[0]), len(op.inputs[0].shape))


def _paddings(op: Op) -> np.ndarray | None:
    """The constant (rank, 2) paddings as int64, or None when computed at run time."""
    values = _const(op, 1)
    if values is None:
        return None
    rank = len(op.inputs[0].shape)
    need(values.size == 2 * rank and values.dtype.kind in "iu", f"paddings must be {rank} int pairs")
    values = values.reshape(-1, 2).astype(np.int64)
    need((values >= 0).all(), f"paddings {values.tolist()} must be >= 0")
    return values


@operands("PAD", "PADV2", "MIRROR_PAD", inputs=(2, 3), optional=(2,), keeps_type=0)
def _pad(op: Op) -> None:
    need(op.opcode == "PADV2" or len(op.inputs) == 2 or op.input(2) is None, f"{op.opcode} takes 2 inputs")
    pads = _paddings(op)
    if op.opcode == "MIRROR_PAD" and pads is not None:
        reflect = op.options.get("mode", "REFLECT") == "REFLECT"
        for d, (before, after) in zip(op.inputs[0].shape, pads):
            need(max(before, after) <= d - reflect, f"mirror padding {max(before, after)} exceeds dimension {d}")
    if op.input(2) is not None:
        need(op.inputs[2].size == 1 and op.inputs[2].dtype == op.inputs[0].dtype,
             "the pad value must be one value of the input's type")


@operands("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", inputs=2, keeps_type=0)
def _resize(op: Op) -> None:
    x, size = op.inputs
    _rank(x, 4)
    need(x.shape[1] >= 1 and x.shape[2] >= 1, f"input of shape {list(x.shape)} has no pixels to resize")
    need(size.dtype == DType.int32 and size.shape == (2,), "size must be 2 int32 values")
    values = _const(op, 1)
    if values is not None:
        need((values >= 1).all(), f"size {values.tolist()} must be >= 1")
    need(not (op.options.get("align_corners") and op.options.get("half_pixel_centers")),
         "align_corners and half_pixel_centers exclude each other")


@operands("DEPTH_TO_SPACE", "SPACE_TO_DEPTH", inputs=1, keeps_type=0)
def _depth_space(op: Op) -> None:
    x = op.inputs[0]
    _rank(x, 4)
    b = int(op.options.get("block_size", 0))
    need(b >= 1, f"block_size must be >= 1, not {b}")
    if op.opcode == "DEPTH_TO_SPACE":
        need(x.shape[3] % (b * b) == 0, f"channels {x.shape[3]} are not a multiple of block_size^2 {b * b}")
    else:
        need(x.shape[1] % b == 0 and x.shape[2] % b == 0, f"height and width must be multiples of {b}")


@operands("SPACE_TO_BATCH_ND", "BATCH_TO_SPACE_ND", inputs=3, keeps_type=0)
def _space_batch(op: Op) -> None:
    shape, block = op.inputs[0].shape, _const(op, 1)
    if block is None:
        return
    block = [int(b) for b in block.ravel()]
    need(all(b >= 1 for b in block), f"block shape {block} must be >= 1")
    need(len(shape) >= 1 + len(block), f"rank {len(shape)} is too small for block shape {block}")
    pairs = _const(op, 2)
    if pairs is None:
        return
    need(pairs.size == 2 * len(block), f"{pairs.size} paddings/crops for {len(block)} block dimensions")
    pairs = pairs.reshape(-1, 2).astype(np.int64)
    need((pairs >= 0).all(), f"paddings/crops {pairs.tolist()} must be >= 0")
    for i, b in enumerate(block):
        d = shape[1 + i]
        if op.opcode == "SPACE_TO_BATCH_ND":
            need((d + pairs[i].sum()) % b == 0, f"padded dimension {1 + i} is not a multiple of {b}")
        else:
            need(d * b - pairs[i].sum() >= 0, f"crops exceed dimension {1 + i}")
    if op.opcode == "BATCH_TO_SPACE_ND":
        need(shape[0] % math.prod(block) == 0, f"batch {shape[0]} is not a multiple of {math.prod(block)}")


@operands("SLICE", inputs=3, keeps_type=0)
def _slice(op: Op) -> None:
    begin, size, shape = _const(op, 1), _const(op, 2), op.inputs[0].shape
    if begin is None or size is None:
        return
    begin, size = begin.ravel().astype(np.int64), size.ravel().astype(np.int64)
    need(begin.size == size.size == len(shape), f"begin and size must have {len(shape)} values")
    for b, s, d in zip(begin, size, shape):
        need(0 <= b <= d and s >= -1 and (s == -1 or b + s <= d), f"slice [{b}, +{s}] leaves dimension {d}")


@operands("STRIDED_SLICE", inputs=4, keeps_type=0)
def _strided_slice(op: Op) -> None:
    strides = _const(op, 3)
    if strides is not None:
        need((strides != 0).all(), "strides must be non-zero")
    if op.options.get("offset"):
        _offset_slice(op)


def _offset_slice(op: Op) -> None:
    """With ``offset`` LiteRT sizes the output from ``end`` alone, as lengths from ``begin``: it reads out of
    bounds (the process crashes) unless every dimension has one length that stays inside it and no mask
    is set."""
    masks = [k for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")
             if int(op.options.get(k, 0))]
    need(not masks, f"offset slices take no masks, not {', '.join(masks)}")
    begin, end = _const(op, 1), _const(op, 2)
    if begin is None or end is None:
        return
    shape = op.inputs[0].shape
    begin, end = begin.ravel().astype(np.int64), end.ravel().astype(np.int64)
    need(begin.size == end.size == len(shape), f"offset slices take {len(shape)} begins and lengths")
    for b, e, d in zip(begin, end, shape):
        need(0 <= b and 0 <= e and b + e <= d, f"offset slice [{b}, +{e}] leaves dimension {d}")


@operands("GATHER", inputs=2, keeps_type=0)
def _gather(op: Op) -> None:
    params, indices = op.inputs
    need(params.shape, "cannot gather from a scalar")
    axis = _axis(int(op.options.get("axis", 0)), len(params.shape))
    batch = int(op.options.get("batch_dims", 0))
    batch = batch + len(indices.shape) if batch < 0 else batch
    need(0 <= batch <= min(axis, len(indices.shape)), f"batch_dims {batch} exceeds axis or the indices' rank")
    need(indices.dtype in (DType.int32, DType.int64, DType.int16), "indices must be integers")
    values = _const(op, 1)
    if values is not None and values.size:
        need(values.min() >= 0 and values.max() < params.shape[axis],
             f"index {values.min() if values.min() < 0 else values.max()} is out of range [0, {params.shape[axis]})")


@operands("ONE_HOT", inputs=4)
def _one_hot(op: Op) -> None:
    indices, _, on, off = op.inputs
    need(indices.dtype in (DType.int32, DType.int64), "indices must be int32 or int64")
    _axis(int(op.options.get("axis", -1)), len(indices.shape) + 1)
    depth = _const(op, 1)
    need(depth is not None and depth.size == 1 and int(depth.ravel()[0]) >= 0, "depth must be a constant >= 0")
    need(on.size == 1 and off.size == 1, "on_value and off_value must be scalars")
    need(on.dtype == off.dtype == op.outputs[0].dtype, "on_value, off_value and the output must share a type")


@operands("GATHER_ND", inputs=2, keeps_type=0)
def _gather_nd(op: Op) -> None:
    params, indices = op.inputs
    need(indices.shape and indices.shape[-1] <= len(params.shape), "indices address more dimensions than params has")
    values = _const(op, 1)
    if values is not None and values.size:
        limits = np.asarray(params.shape[:indices.shape[-1]])
        need(((values >= 0) & (values < limits)).all(), "an index is out of range")


@operands("TILE", inputs=2, keeps_type=0)
def _tile(op: Op) -> None:
    reps = _const(op, 1)
    if reps is not None:
        need(reps.size == len(op.inputs[0].shape) and (reps >= 0).all(),
             f"multiples {reps.ravel().tolist()} must be {len(op.inputs[0].shape)} values >= 0")


@operands("BROADCAST_TO", inputs=2, keeps_type=0)
def _broadcast_to(op: Op) -> None:
    shape = _const(op, 1)
    if shape is not None:
        need((shape >= 0).all(), f"shape {shape.ravel().tolist()} has a negative dimension")


@operands("FILL", inputs=2, keeps_type=1)
def _fill(op: Op) -> None:
    dims = _const(op, 0)
    if dims is not None:
        need((dims >= 0).all(), f"dims {dims.ravel().tolist()} has a negative dimension")
    need(op.inputs[1].size == 1, "the value must be a scalar")
    need(op.outputs[0].dtype == op.inputs[1].dtype,
         f"output of type {op.outputs[0].dtype.name} must have the value's type {op.inputs[1].dtype.name}")


# -- the door -------------------------------------------------------------------

def _quantization(t: Tensor) -> None:
    """Scales finite and > 0 (>= 0 for int32/int64, which only carry them), zero points the tensor's
    type can hold, per-channel parameters one per channel of their axis."""
    q = t.quantization
    if q is None or t.dtype not in _QUANT_RANGE:
        return
    scale, zero = np.asarray(q.scale, np.float64), np.asarray(q.zero_point)
    where = f"tensor {t.index} ({t.name!r})"
    need(np.isfinite(scale).all() and (scale >= 0).all() and
         (t.dtype in (DType.int32, DType.int64) or (scale > 0).all()),
         f"{where}: quantization scale {scale.tolist()[:4]} must be finite and > 0")
    lo, hi = _QUANT_RANGE[t.dtype]
    need(not zero.size or lo <= int(zero.min()) and int(zero.max()) <= hi,
         f"{where}: zero point {zero.tolist()[:4]} is outside {t.dtype.name}'s [{lo}, {hi}]")
    if scale.size > 1:
        need(0 <= q.axis < len(t.shape) and t.shape[q.axis] == scale.size,
             f"{where}: {scale.size} per-channel scales on axis {q.axis} of shape {list(t.shape)}")


def check_operands(op: Op) -> None:
    """Raise ModelFormatError when ``op``'s operands break its OPERANDS entry."""
    entry = OPERANDS.get(op.opcode)
    try:
        for t in [*op.inputs, *op.outputs]:
            if t is not None:
                _quantization(t)
        if entry is None:
            return  # an op no backend here knows: the planner refuses it with its reason
        lo, hi = entry.inputs
        need(lo <= len(op.inputs) <= hi, f"takes {lo if lo == hi else f'{lo} to {hi}'} inputs, not {len(op.inputs)}")
        lo, hi = entry.outputs
        need(lo <= len(op.outputs) <= hi,
             f"takes {lo if lo == hi else f'{lo} to {hi}'} outputs, not {len(op.outputs)}")
        for i, t in enumerate(op.inputs):
            need(t is not None or i in entry.optional, f"input {i} is required")
        if entry.keeps_type is not None:
            _output_like_input(op, entry.keeps_type)
        if entry.check is not None:
            entry.check(op)
    except Invalid as exc:
        raise ModelFormatError(f"{op.describe()}: {exc}") from None
    except (ArithmeticError, ValueError, TypeError, IndexError, KeyError, OverflowError) as exc:
        raise ModelFormatError(f"{op.describe()}: operands do not fit the op ({type(exc).__name__}: {exc})") from None


def validate_graph(graph: Subgraph) -> None:
    """Raise ModelFormatError for the first op whose operands do not fit it.

    Ops are checked in the file's order (LiteRT's execution order), each against the shapes its
    inputs really have: every op with a shape rule gives its outputs the rule's shapes, as TFLite
    does when preparing, so the file's intermediate shapes never count.  Converters write
    placeholders there ([] or [1] on DEQUANTIZE outputs, batch 1 past a SPACE_TO_BATCH_ND of a
    dynamic input, stale shapes).  Ops without a rule, or whose shapes depend on run-time values,
    keep the declared ones.  Where a declared shape changes, the file's bytes no longer describe
    the graph (LiteRT's XNNPACK delegate aborts on some placeholders): backends write it out anew.
    """
    changed = False
    with shape_values():
        for op in graph.ops:
            check_operands(op)
            if not has_rule(op.opcode):
                continue
            if not op.outputs:
                raise ModelFormatError(f"{op.describe()}: has no outputs")
            declared = [t.shape for t in op.outputs]
            try:
                settle(op)
                changed = changed or declared != [t.shape for t in op.outputs]
            except UnsupportedOpError:
                continue  # its shape depends on values computed at run time; the declared one stands
            except DelegateError as exc:
                raise ModelFormatError(f"{op.describe()}: {exc}") from None
            except Exception as exc:
                raise ModelFormatError(f"{op.describe()}: operands do not fit the op "
                                       f"({type(exc).__name__}: {exc})") from None
    if changed:
        graph.serialized = None
