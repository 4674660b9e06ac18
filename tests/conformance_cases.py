"""The conformance matrix's cases: one list of op cases (op, shapes, options, input ranges).

tests/test_conformance.py runs every case on every installed backend and every precision it
declares, against LiteRT (see docs/conformance.md).  A case is a record: its id (also its
random seed, through its length), the op code it tests, its kind (with the op, the key of the
matrix's table of expected refusals), and ``build(rng)``, which gives (model, inputs) or
(model, inputs, the model LiteRT runs instead where the two differ).  ``reference`` names
LiteRT's kernel set it is compared with (the LiteRT engine is always compared with the default
set, which it runs); ``allow_quantized`` lets the GPUs run quantized tensors on their float view;
``numpy_reference`` stands in for LiteRT where its interpreter cannot run the op (MediaPipe's
custom ops), computing the outputs from the op's definition.

Add a case by appending a ``Case`` to ``CASES`` (or with the ``case`` decorator); the matrix picks
it up on every backend.  An op that a GPU lowering accepts must have a case here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from delegate.tflite.builder import GraphBuilder
from tests.models import normal, pool_model, sparse_conv_model, transpose_conv_bias_pair, transpose_conv_model


@dataclass(frozen=True)
class Case:
    id: str
    op: str
    kind: str  # the family of cases: elementwise, unary, quantized, hybrid, op (one op each), ...
    build: Callable[[np.random.Generator], tuple]
    reference: str = "default"  # or "builtin": BUILTIN_WITHOUT_DEFAULT_DELEGATES
    allow_quantized: bool = False
    # outputs from the inputs where LiteRT cannot run the op (MediaPipe's custom ops need MediaPipe's resolver)
    numpy_reference: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None

    def make(self) -> tuple[bytes, list[np.ndarray], bytes | None]:
        """(model, inputs, LiteRT's model or None), from the case's own seed."""
        built = self.build(np.random.default_rng(len(self.id)))
        return built if len(built) == 3 else (*built, None)


CASES: list[Case] = []


# -- one op each, with shapes and options chosen per op (the GPU op set first) ----------------------

CONV = {"padding": "SAME", "stride_w": 1, "stride_h": 1}


def case(opcode: str, name: str = "basic"):
    """Register a case of one op: compared with LiteRT's builtin kernels, quantized tensors on the GPUs'
    float view."""
    def register(fn):
        CASES.append(Case(f"{opcode}:{name}", opcode, "op", fn, reference="builtin", allow_quantized=True))
        return fn
    return register


def one_op(opcode: str, shapes, rng, consts=(), options=None, dtype="float32", scale=1.0, **kwargs):
    """A model of one op on inputs of ``shapes`` then constants ``consts``, with random inputs."""
    b = GraphBuilder()
    xs = [b.input(f"x{i}", s, dtype) for i, s in enumerate(shapes)]
    cs = [b.const(f"c{i}", c) for i, c in enumerate(consts)]
    b.output(b.op(opcode, xs + cs, options=options, **kwargs))
    if dtype == "bool":
        inputs = [rng.random(s) > 0.5 for s in shapes]
    else:
        inputs = [normal(rng, s, scale) for s in shapes]
    return b.to_bytes(), inputs, None


for _code in ("ADD", "SUB", "MUL"):
    case(_code, "broadcast_relu6")(lambda rng, c=_code: one_op(
        c, [(1, 3, 4, 6), (1, 1, 4, 6)], rng, options={"fused_activation_function": "RELU6"}))
case("ADD_N", "four")(lambda rng: one_op("ADD_N", [(1, 3, 4, 6)] * 3, rng, [normal(rng, (1, 3, 4, 6))],
                                         shape=(1, 3, 4, 6)))
for _code in ("MAXIMUM", "MINIMUM"):
    case(_code, "channel_vector")(lambda rng, c=_code: one_op(c, [(2, 3, 5)], rng, [normal(rng, (5,))]))
for _code in ("RELU", "RELU6", "LOGISTIC", "TANH", "HARD_SWISH"):
    case(_code)(lambda rng, c=_code: one_op(c, [(1, 5, 3, 7)], rng, scale=4.0))
case("EXP")(lambda rng: one_op("EXP", [(3, 9)], rng, scale=2.0))
for _code in ("RELU_N1_TO_1", "RELU_0_TO_1", "ABS", "NEG", "SQUARE", "SIN", "COS", "ELU"):
    case(_code)(lambda rng, c=_code: one_op(c, [(2, 3, 4, 5)], rng, scale=2.0))
case("GELU")(lambda rng: one_op("GELU", [(2, 3, 9)], rng, scale=3.0))
case("GELU", "approximate")(lambda rng: one_op("GELU", [(2, 3, 9)], rng, options={"approximate": True}, scale=3.0))
case("LEAKY_RELU")(lambda rng: one_op("LEAKY_RELU", [(1, 4, 3, 5)], rng, options={"alpha": 0.3}, scale=2.0))


def select(opcode: str, shapes, rng):
    b = GraphBuilder()
    cond = b.input("cond", shapes[0], "bool")
    b.output(b.op(opcode, [cond, b.input("a", shapes[1]), b.input("b", shapes[2])], dtype="float32"))
    return b.to_bytes(), [rng.random(shapes[0]) > 0.5, normal(rng, shapes[1]), normal(rng, shapes[2])], None


case("SELECT", "same_shapes")(lambda rng: select("SELECT", [(2, 3, 5)] * 3, rng))


@case("SELECT_V2", "broadcast_twice")
def _select_v2(rng):
    b = GraphBuilder()
    cond, other = b.input("cond", (1, 3, 1), "bool"), b.input("other", (2, 1, 4))
    first = b.op("SELECT_V2", [cond, b.input("a", (2, 3, 4)), b.const("b", normal(rng, (4,)))], dtype="float32")
    b.output(b.op("SELECT_V2", [b.op("LESS", [first, other], dtype="bool"), first, other], dtype="float32"))
    inputs = [rng.random((1, 3, 1)) > 0.5, normal(rng, (2, 1, 4)), normal(rng, (2, 3, 4))]
    return b.to_bytes(), inputs, None


@case("CAST", "float_bool_float")
def _cast(rng):
    b = GraphBuilder()
    x = b.input("x", (2, 3, 5))
    flags = b.op("CAST", [x], dtype="bool")
    b.output(flags, b.op("CAST", [flags], dtype="float32"), b.op("CAST", [x], dtype="float32"))
    return b.to_bytes(), [normal(rng, (2, 3, 5)) * (rng.random((2, 3, 5)) > 0.4)], None


@case("LEAKY_RELU", "detector_block")
def _detector_block(rng):
    """A YOLO-style block: CONV_2D, LEAKY_RELU (fused into the convolution's epilogue), nearest upsampling,
    concatenation with a skip input, then GELU and a comparison."""
    b = GraphBuilder()
    x, skip = b.input("x", (1, 4, 5, 3)), b.input("skip", (1, 8, 10, 2))
    y = b.op("CONV_2D", [x, b.const("w", normal(rng, (6, 3, 3, 3))), b.const("b", normal(rng, (6,)))], options=CONV)
    y = b.op("LEAKY_RELU", [y], options={"alpha": 0.1})
    y = b.op("RESIZE_NEAREST_NEIGHBOR", [y, b.const("size", np.array([8, 10], np.int32))])
    y = b.op("GELU", [b.op("CONCATENATION", [y, skip], options={"axis": 3})])
    b.output(y, b.op("GREATER", [y, b.const("t", np.array([0.5], np.float32))], dtype="bool"))
    return b.to_bytes(), [normal(rng, (1, 4, 5, 3)), normal(rng, (1, 8, 10, 2))], None


def positive_op(opcode: str, rng):
    """A unary op defined for positive inputs only, on values from 0.05 to 20."""
    model, _, _ = one_op(opcode, [(2, 5, 7)], rng)
    return model, [np.exp(rng.uniform(-3, 3, (2, 5, 7))).astype(np.float32)], None


def off_integers(rng, shape, scale):
    """Values at least a tenth from every integer, so that rounding the input to f16 cannot move a floor."""
    whole = rng.integers(-scale, scale, shape)
    return (whole + rng.uniform(0.1, 0.9, shape)).astype(np.float32)


for _code in ("LOG", "SQRT", "RSQRT"):
    case(_code, "positive")(lambda rng, c=_code: positive_op(c, rng))
case("FLOOR")(lambda rng: (one_op("FLOOR", [(3, 11)], rng)[0], [off_integers(rng, (3, 11), 5)], None))
case("CEIL")(lambda rng: (one_op("CEIL", [(3, 11)], rng)[0], [off_integers(rng, (3, 11), 5)], None))
case("ROUND", "off_ties")(lambda rng: (one_op("ROUND", [(3, 11)], rng)[0], [off_integers(rng, (3, 11), 5) + 0.5], None))
case("ROUND", "ties_to_even")(lambda rng: (one_op("ROUND", [(2, 6)], rng)[0],
                                           [np.array([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5], [3.5, 4.5, -3.5, 0.0, 7.5, 8.5]],
                                                     np.float32)], None))
case("SIGN", "with_zeros")(lambda rng: (one_op("SIGN", [(4, 6)], rng)[0],
                                        [normal(rng, (4, 6)) * (rng.random((4, 6)) > 0.3)], None))
case("DIV", "relu")(lambda rng: (one_op("DIV", [(2, 3, 5), (3, 5)], rng,
                                        options={"fused_activation_function": "RELU"})[0],
                                 [normal(rng, (2, 3, 5)), np.sign(normal(rng, (3, 5))) + normal(rng, (3, 5), 0.2)],
                                 None))
case("SQUARED_DIFFERENCE", "broadcast")(lambda rng: one_op("SQUARED_DIFFERENCE", [(2, 4, 3), (4, 1)], rng))


def floor_division(opcode: str, rng):
    """a / b of quotients away from integers (see off_integers), divisors of either sign."""
    b = ((rng.random((3, 8)) > 0.5) * 2 - 1) * rng.uniform(0.5, 2, (3, 8))
    a = off_integers(rng, (3, 8), 4) * b
    model, _, _ = one_op(opcode, [(3, 8), (3, 8)], rng, version=2 if opcode == "FLOOR_DIV" else 1)
    return model, [a.astype(np.float32), b.astype(np.float32)], None


for _code in ("FLOOR_DIV", "FLOOR_MOD"):
    case(_code, "signs")(lambda rng, c=_code: floor_division(c, rng))
case("POW", "positive_base")(lambda rng: (one_op("POW", [(2, 9), (2, 9)], rng)[0],
                                          [np.exp(rng.uniform(-1, 1, (2, 9))).astype(np.float32),
                                           rng.uniform(-2, 2, (2, 9)).astype(np.float32)], None))
case("POW", "integer_exponents")(lambda rng: (  # bases of either sign, as large as f16 results can be
    one_op("POW", [(4, 6)], rng, [np.array([0, 1, 2, 3, -1, -2], np.float32)])[0],
    [(np.sign(normal(rng, (4, 6))) * rng.uniform(0.5, 3, (4, 6))).astype(np.float32)], None))


def comparison(opcode: str, rng):
    """Inputs equal at about a third of the positions, so EQUAL and the non-strict comparisons see ties."""
    x, y = normal(rng, (2, 3, 7)), normal(rng, (2, 3, 7))
    y = np.where(rng.random(x.shape) < 0.3, x, y)
    b = GraphBuilder()
    b.output(b.op(opcode, [b.input("x", x.shape), b.input("y", y.shape)], dtype="bool"))
    return b.to_bytes(), [x, y], None


for _code in ("EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL"):
    case(_code, "ties")(lambda rng, c=_code: comparison(c, rng))
case("PRELU", "per_channel")(lambda rng: one_op("PRELU", [(1, 4, 4, 6)], rng, [normal(rng, (1, 1, 6))]))
case("LOGICAL_AND", "broadcast")(lambda rng: one_op("LOGICAL_AND", [(2, 3, 4), (3, 1)], rng, dtype="bool"))


def conv(rng, shape, out, k, options, groups=1, opcode="CONV_2D"):
    weights = (out, k, k, shape[3] // groups) if opcode == "CONV_2D" else (1, k, k, out)
    return one_op(opcode, [shape], rng, [normal(rng, weights, 0.5), normal(rng, (out,))], options={**CONV, **options})


case("CONV_2D", "3x3_stride2_relu6")(lambda rng: conv(rng, (1, 7, 6, 5), 6, 3, {
    "stride_h": 2, "stride_w": 2, "fused_activation_function": "RELU6"}))
case("CONV_2D", "1x1")(lambda rng: conv(rng, (2, 4, 5, 9), 7, 1, {}))


@case("CONV_2D", "padded_input_batch2")
def _padded_input(rng):
    """A zero PAD of a 3-channel two-image input read by a VALID convolution: the PAD folds into the
    convolution, which reads the partition input where the host wrote it (no conversion kernel)."""
    b = GraphBuilder()
    x = b.input("x", (2, 6, 7, 3))
    padded = b.op("PAD", [x, b.const("pads", np.array([[0, 0], [1, 1], [2, 1], [0, 0]], np.int32))])
    b.output(b.op("CONV_2D", [padded, b.const("w", normal(rng, (5, 3, 3, 3), 0.5)), b.const("b", normal(rng, (5,)))],
                  options={**CONV, "padding": "VALID"}))
    return b.to_bytes(), [normal(rng, (2, 6, 7, 3))]


@case("CONV_2D", "swish")
def _swish(rng):
    """A converter's swish after a convolution and after a fully connected layer, x * LOGISTIC(x) with the MUL's
    inputs in either order: on the GPUs one epilogue step of the kernel before it."""
    b = GraphBuilder()
    x = b.input("x", (1, 5, 6, 4))
    y = b.op("CONV_2D", [x, b.const("w", normal(rng, (6, 3, 3, 4), 0.5)), b.const("b", normal(rng, (6,)))],
             options=CONV)
    b.output(b.op("MUL", [y, b.op("LOGISTIC", [y])], options={"fused_activation_function": "NONE"}))
    f = b.op("FULLY_CONNECTED", [b.op("RESHAPE", [x, b.const("s", np.array([1, 120], np.int32))]),
                                 b.const("fw", normal(rng, (8, 120), 0.2)), b.const("fb", normal(rng, (8,)))])
    b.output(b.op("MUL", [b.op("LOGISTIC", [f]), f], options={"fused_activation_function": "NONE"}))
    return b.to_bytes(), [normal(rng, (1, 5, 6, 4), 2.0)]


@case("CONV_2D", "squeeze_excite_batch2")
def _squeeze_excite(rng):
    """A squeeze-and-excitation block: global pooling, two one-pixel 1x1 convolutions (one kernel on both GPU
    dialects), the sigmoid gate applied where the projection reads its input."""
    b = GraphBuilder()
    x = b.input("x", (2, 5, 6, 10))
    pooled = b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": True})
    valid = {**CONV, "padding": "VALID"}
    hidden = b.op("CONV_2D", [pooled, b.const("w1", normal(rng, (3, 1, 1, 10), 0.5)), b.const("b1", normal(rng, (3,)))],
                  options={**valid, "fused_activation_function": "RELU6"})
    gate = b.op("LOGISTIC", [b.op("CONV_2D", [hidden, b.const("w2", normal(rng, (10, 1, 1, 3), 0.5)),
                                              b.const("b2", normal(rng, (10,)))], options=valid)])
    gated = b.op("MUL", [x, gate], options={"fused_activation_function": "NONE"})
    b.output(b.op("CONV_2D", [gated, b.const("w3", normal(rng, (4, 1, 1, 10), 0.5)), b.const("b3", normal(rng, (4,)))],
                  options=valid))
    return b.to_bytes(), [normal(rng, (2, 5, 6, 10))]


def quantized_conv(rng, opcode: str, dtype: str, x_quant, out_quant, shape=(1, 6, 7, 3), out=5):
    """A quantized convolution of a quantized model input: the GPUs' float view dequantizes the input on
    the device (in the convolution reading it, or in the input's conversion kernel), or on the host
    where the device reads no such integers (int16 activations, int8 weights and int64 biases: the
    converter's int16x8)."""
    info = np.iinfo(dtype)
    w_dtype = "int8" if dtype == "int16" else dtype
    w_info = np.iinfo(w_dtype)
    w_shape = (out, 3, 3, shape[3]) if opcode == "CONV_2D" else (1, 3, 3, shape[3])
    w_quant = (0.01, 128) if dtype == "uint8" else (0.01, 0)
    b = GraphBuilder()
    x = b.input("x", shape, dtype, quant=x_quant)
    w = b.const("w", rng.integers(w_info.min + 1, w_info.max + 1, w_shape).astype(w_dtype), quant=w_quant)
    channels = w_shape[0] if opcode == "CONV_2D" else w_shape[3]
    bias = b.const("b", rng.integers(-2000, 2000, channels).astype(np.int64 if dtype == "int16" else np.int32),
                   quant=(x_quant[0] * w_quant[0], 0))
    b.output(b.op(opcode, [x, w, bias], dtype=dtype, quant=out_quant,
                  options={**CONV, **({"depth_multiplier": 1} if opcode == "DEPTHWISE_CONV_2D" else {})}))
    return b.to_bytes(), [rng.integers(info.min, info.max + 1, shape).astype(dtype)]


@case("CONV_2D", "int8_swish")
def _int8_swish(rng):
    """A quantized convolution and a converter's swish on its int8 result: the LOGISTIC's output on its own grid
    (1/256, -128) before the MUL, which the GPUs' float view keeps inside the one epilogue step.  The product's
    grid is coarser than the convolution's: under fp16 a convolution a step off stays within a step of it."""
    b = GraphBuilder()
    x = b.input("x", (1, 6, 7, 3), "int8", quant=(0.03, -4))
    w = b.const("w", rng.integers(-127, 128, (5, 3, 3, 3)).astype(np.int8), quant=(0.01, 0))
    bias = b.const("b", rng.integers(-2000, 2000, 5).astype(np.int32), quant=(0.0003, 0))
    y = b.op("CONV_2D", [x, w, bias], dtype="int8", quant=(0.05, 3), options=CONV)
    gate = b.op("LOGISTIC", [y], dtype="int8", quant=(1 / 256, -128))
    b.output(b.op("MUL", [y, gate], dtype="int8", quant=(0.08, -10), options={"fused_activation_function": "NONE"}))
    return b.to_bytes(), [rng.integers(-128, 128, (1, 6, 7, 3)).astype(np.int8)]


@case("LOGISTIC", "int16_swish")
def _int16_swish(rng):
    """The converter's int16x8 swish, x * LOGISTIC(x), on every int16 value once (the CPU looks up the MUL's
    results in one table of them), the LOGISTIC on its fixed grid (1/32768, 0), saturating at both ends."""
    b = GraphBuilder()
    x = b.input("x", (1, 16, 64, 64), "int16", quant=(0.0004, 0))
    gate = b.op("LOGISTIC", [x], dtype="int16", quant=(1 / 32768, 0))
    b.output(b.op("MUL", [x, gate], dtype="int16", quant=(0.0004, 0), options={"fused_activation_function": "NONE"}))
    return b.to_bytes(), [rng.permutation(np.arange(-32768, 32768)).astype(np.int16).reshape(1, 16, 64, 64)]


@case("DEPTHWISE_CONV_2D", "int8_padded_stride2")
def _int8_padded_depthwise(rng):
    """An int8 zero PAD on its input's grid before a stride-2 depthwise convolution, as a converter writes a
    MobileNet's: the GPUs fold it into the convolution as extra padding (it rounds nothing)."""
    b = GraphBuilder()
    x = b.input("x", (1, 7, 8, 8), "int8", quant=(0.04, -6))
    padded = b.op("PAD", [x, b.const("pads", np.array([[0, 0], [0, 1], [0, 1], [0, 0]], np.int32))], dtype="int8",
                  quant=(0.04, -6))
    w = b.const("w", rng.integers(-127, 128, (1, 3, 3, 8)).astype(np.int8), quant=(0.02, 0))
    bias = b.const("b", rng.integers(-400, 400, 8).astype(np.int32), quant=(0.0008, 0))
    b.output(b.op("DEPTHWISE_CONV_2D", [padded, w, bias], dtype="int8", quant=(0.05, 4),
                  options={**CONV, "padding": "VALID", "stride_h": 2, "stride_w": 2, "depth_multiplier": 1}))
    return b.to_bytes(), [rng.integers(-128, 128, (1, 7, 8, 8)).astype(np.int8)]


@case("DEPTHWISE_CONV_2D", "int8_into_pointwise")
def _int8_depthwise_pointwise(rng):
    """An int8 depthwise convolution (RELU6) read only by a 1x1 convolution, as in a MobileNetV2 block: OpenCL
    computes it where the product stages its input, its roundings on grids passed to that kernel (the 1x1
    convolution's grid coarse enough that an input a step off under fp16 stays within a step)."""
    b = GraphBuilder()
    x = b.input("x", (1, 9, 10, 16), "int8", quant=(0.04, -6))
    w = b.const("w", rng.integers(-127, 128, (1, 3, 3, 16)).astype(np.int8), quant=(0.02, 0))
    bias = b.const("b", rng.integers(-400, 400, 16).astype(np.int32), quant=(0.0008, 0))
    depthwise = b.op("DEPTHWISE_CONV_2D", [x, w, bias], dtype="int8", quant=(0.03, -128),
                     options={**CONV, "depth_multiplier": 1, "fused_activation_function": "RELU6"})
    pw = b.const("pw", rng.integers(-127, 128, (8, 1, 1, 16)).astype(np.int8), quant=(0.01, 0))
    pb = b.const("pb", rng.integers(-400, 400, 8).astype(np.int32), quant=(0.0003, 0))
    b.output(b.op("CONV_2D", [depthwise, pw, pb], dtype="int8", quant=(0.15, 3), options=CONV))
    return b.to_bytes(), [rng.integers(-128, 128, (1, 9, 10, 16)).astype(np.int8)]


@case("CONV_2D", "int8_squeeze_excite")
def _int8_squeeze_excite(rng):
    """An int8 squeeze-and-excitation block as an EfficientNet's: two one-pixel convolutions, a swish after the
    first, a sigmoid after the second, run in one GPU kernel with their roundings; the gate product, rounded onto
    its own grid, computed where the projection reads its input (its grid and the projection's coarse enough that
    an input a step off under fp16 stays within a step)."""
    b = GraphBuilder()
    x = b.input("x", (1, 6, 7, 8), "int8", quant=(0.05, 2))
    pooled = b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], dtype="int8", quant=(0.05, 2),
                  options={"keep_dims": True})
    valid = {**CONV, "padding": "VALID"}

    def conv(name, source, shape, quant, scale):
        w = b.const(f"w{name}", rng.integers(-127, 128, shape).astype(np.int8), quant=(0.01, 0))
        bias = b.const(f"b{name}", rng.integers(-300, 300, shape[0]).astype(np.int32), quant=(scale * 0.01, 0))
        return b.op("CONV_2D", [source, w, bias], dtype="int8", quant=quant, options=valid)
    squeezed = conv("0", pooled, (4, 1, 1, 8), (0.08, 1), 0.05)
    swished = b.op("MUL", [squeezed, b.op("LOGISTIC", [squeezed], dtype="int8", quant=(1 / 256, -128))],
                   dtype="int8", quant=(0.06, -2), options={"fused_activation_function": "NONE"})
    gate = b.op("LOGISTIC", [conv("1", swished, (8, 1, 1, 4), (0.1, 0), 0.06)], dtype="int8", quant=(1 / 256, -128))
    gated = b.op("MUL", [x, gate], dtype="int8", quant=(0.1, 1), options={"fused_activation_function": "NONE"})
    b.output(conv("2", gated, (4, 1, 1, 8), (0.25, -2), 0.1))
    return b.to_bytes(), [rng.integers(-128, 128, (1, 6, 7, 8)).astype(np.int8)]


case("CONV_2D", "uint8_input")(lambda rng: quantized_conv(rng, "CONV_2D", "uint8", (0.02, 128), (0.05, 120)))
case("CONV_2D", "int8_input_odd_bytes")(lambda rng: quantized_conv(rng, "CONV_2D", "int8", (0.03, -4), (0.04, 2),
                                                                   shape=(1, 5, 7, 3), out=6))
case("DEPTHWISE_CONV_2D", "int8_input")(lambda rng: quantized_conv(rng, "DEPTHWISE_CONV_2D", "int8", (0.03, -4),
                                                                   (0.02, 3), shape=(1, 5, 6, 6)))
case("CONV_2D", "int16x8_input")(lambda rng: quantized_conv(rng, "CONV_2D", "int16", (0.0002, 0), (0.002, 0)))
case("DEPTHWISE_CONV_2D", "int16x8_input")(lambda rng: quantized_conv(rng, "DEPTHWISE_CONV_2D", "int16", (0.0002, 0),
                                                                      (0.001, 0), shape=(1, 5, 6, 6)))
case("CONV_2D", "dilated_valid")(lambda rng: conv(rng, (1, 9, 8, 3), 5, 3, {
    "padding": "VALID", "dilation_h_factor": 2, "dilation_w_factor": 2}))
# few outputs and a long reduction: both dialects share each output's sum among a work group (conv2d_split)
case("CONV_2D", "head_long_reduction")(lambda rng: conv(rng, (1, 3, 3, 256), 10, 3, {
    "fused_activation_function": "RELU"}))
case("CONV_2D", "head_stride2_batch2")(lambda rng: conv(rng, (2, 5, 5, 130), 7, 3, {
    "stride_h": 2, "stride_w": 2}))


@case("CONV_2D", "head_padded_dilated_residual")
def _split_head_padded(rng):
    """A split-reduction convolution (9 taps x 24 input slices into 3x3x12) reading a zero PAD folded into
    it, dilated, its epilogue adding a residual and clamping (RELU6)."""
    b = GraphBuilder()
    x, r = b.input("x", (1, 5, 5, 96)), b.input("r", (1, 3, 3, 12))
    padded = b.op("PAD", [x, b.const("pads", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))])
    y = b.op("CONV_2D", [padded, b.const("w", normal(rng, (12, 3, 3, 96), 0.2)), b.const("b", normal(rng, (12,)))],
             options={**CONV, "padding": "VALID", "dilation_h_factor": 2, "dilation_w_factor": 2})
    b.output(b.op("ADD", [y, r], options={"fused_activation_function": "RELU6"}))
    return b.to_bytes(), [normal(rng, (1, 5, 5, 96)), normal(rng, (1, 3, 3, 12))]


case("CONV_2D", "grouped")(lambda rng: conv(rng, (1, 5, 5, 8), 6, 3, {}, groups=2))
case("DEPTHWISE_CONV_2D", "multiplier2")(lambda rng: conv(rng, (1, 6, 7, 3), 6, 3, {
    "depth_multiplier": 2, "fused_activation_function": "RELU"}, opcode="DEPTHWISE_CONV_2D"))
@case("DEPTHWISE_CONV_2D", "row_tails")
def _depthwise_row_tails(rng):
    """3x3 and 5x5 depthwise convolutions of rows whose pixels with every tap inside leave 1, 2 or 3 after the
    groups of 8 and 4 the CPU's native loop sums at once (each tail its own group), 24 channels (a vector of
    16 and the last 8 again)."""
    b = GraphBuilder()
    inputs, shapes = [], [(1, 3, w, 24) for w in (4, 5, 7)] + [(1, 5, w, 24) for w in (5, 6, 7)]
    for i, shape in enumerate(shapes):
        k = 3 if i < 3 else 5
        x = b.input(f"x{i}", shape)
        inputs.append(normal(rng, shape))
        b.output(b.op("DEPTHWISE_CONV_2D", [x, b.const(f"w{i}", normal(rng, (1, k, k, 24), 0.5)),
                                            b.const(f"b{i}", normal(rng, (24,)))],
                      options={**CONV, "depth_multiplier": 1, "fused_activation_function": "RELU6"}))
    return b.to_bytes(), inputs


case("FULLY_CONNECTED")(lambda rng: one_op("FULLY_CONNECTED", [(3, 12)], rng,
                                           [normal(rng, (5, 12)), normal(rng, (5,))]))
case("BATCH_MATMUL", "broadcast_batches")(lambda rng: one_op("BATCH_MATMUL", [(2, 1, 5, 7), (3, 7, 6)], rng))
case("BATCH_MATMUL", "adjoint_constant")(lambda rng: one_op(
    "BATCH_MATMUL", [(3, 9, 4)], rng, [normal(rng, (5, 9))], options={"adj_x": True, "adj_y": True}))
case("TRANSPOSE_CONV", "same_stride2")(lambda rng: (
    transpose_conv_model(3, 4, 5, 6, (3, 3), 2, "SAME", True, rng), [normal(rng, (1, 3, 4, 5))], None))
# Kernels as large as their stride upsample: each output pixel takes one tap, moved into place in rows of
# kernel width x channels values (even rows are moved as pairs, odd ones one by one).
case("TRANSPOSE_CONV", "upsample_rows_of_two")(lambda rng: (
    transpose_conv_model(5, 6, 7, 1, (2, 2), 2, "VALID", True, rng), [normal(rng, (1, 5, 6, 7))], None))
case("TRANSPOSE_CONV", "upsample_odd_rows")(lambda rng: (
    transpose_conv_model(2, 3, 4, 3, (3, 3), 3, "VALID", True, rng), [normal(rng, (1, 2, 3, 4))], None))


@case("Convolution2DTransposeBias", "valid_stride2")
def _transpose_conv_bias(rng):
    custom, builtin = transpose_conv_bias_pair(3, 3, 4, 5, (2, 2), 2, "VALID", rng)
    return custom, [normal(rng, (1, 3, 3, 4))], builtin


for _code in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
    case(_code, "3x3_stride2")(lambda rng, c=_code: (
        pool_model(c, 1, 7, 6, 5, 3, 3, 2, 2, "SAME", "NONE"), [normal(rng, (1, 7, 6, 5))], None))
case("CONCATENATION", "channels")(lambda rng: one_op("CONCATENATION", [(1, 3, 4, 5), (1, 3, 4, 2)], rng,
                                                     options={"axis": 3}))
case("CONCATENATION", "three_unaligned_channels")(lambda rng: one_op(
    "CONCATENATION", [(1, 2, 3, 3), (1, 2, 3, 6), (1, 2, 3, 2)], rng, [normal(rng, (1, 2, 3, 1))],
    options={"axis": -1}))
case("CONCATENATION", "width_with_constant")(lambda rng: one_op(
    "CONCATENATION", [(2, 3, 2, 5), (2, 3, 4, 5)], rng, [normal(rng, (2, 3, 1, 5))], options={"axis": 2}))


@case("CONCATENATION", "reshaped_inputs")
def _reshaped_concat(rng):
    """A detector's heads: per-pixel predictions of two feature maps reshaped to (boxes, values) and
    concatenated along the boxes, one input computed (a RELU) and one straight from the model's input;
    on both GPU dialects the concatenation reads the computed one through its reshape (folded)."""
    b = GraphBuilder()
    x, y = b.input("x", (1, 3, 4, 12)), b.input("y", (1, 2, 2, 6))
    a = b.op("RESHAPE", [b.op("RELU", [x]), b.const("sa", np.array([1, 24, 6], np.int32))],
             options={"new_shape": [1, 24, 6]})
    c = b.op("RESHAPE", [y, b.const("sc", np.array([1, 4, 6], np.int32))], options={"new_shape": [1, 4, 6]})
    b.output(b.op("CONCATENATION", [a, c], options={"axis": 1}))
    return b.to_bytes(), [normal(rng, (1, 3, 4, 12)), normal(rng, (1, 2, 2, 6))]


@case("CONCATENATION", "reshaped_channels_epilogue")
def _reshaped_channels(rng):
    """Channels concatenated from two reshapes moving elements between slices (3 and 5 channels, folded:
    read through their views), an input read as it is between them, and a RELU6 on the result (the
    concatenation's epilogue); a third reshape's result is also a model output, so it is stored and read."""
    b = GraphBuilder()
    x, z, w, u = (b.input("x", (1, 4, 3, 6)), b.input("z", (1, 4, 6, 5)), b.input("w", (1, 2, 6, 10)),
                  b.input("u", (1, 2, 3, 8)))
    a = b.op("RESHAPE", [b.op("LOGISTIC", [x]), b.const("sa", np.array([1, 4, 6, 3], np.int32))],
             options={"new_shape": [1, 4, 6, 3]})
    d = b.op("RESHAPE", [b.op("TANH", [w]), b.const("sd", np.array([1, 4, 6, 5], np.int32))],
             options={"new_shape": [1, 4, 6, 5]})
    e = b.op("RESHAPE", [b.op("RELU", [u]), b.const("se", np.array([1, 4, 6, 2], np.int32))],
             options={"new_shape": [1, 4, 6, 2]})
    b.output(b.op("RELU6", [b.op("CONCATENATION", [a, z, d, e], options={"axis": 3})]), e)
    return b.to_bytes(), [normal(rng, (1, 4, 3, 6), 4.0), normal(rng, (1, 4, 6, 5), 4.0), normal(rng, (1, 2, 6, 10)),
                          normal(rng, (1, 2, 3, 8))]


case("SPACE_TO_BATCH_ND", "padded_batch2")(lambda rng: one_op(
    "SPACE_TO_BATCH_ND", [(2, 5, 6, 3)], rng, [np.array([2, 2], np.int32), np.array([[1, 0], [0, 2]], np.int32)]))
case("BATCH_TO_SPACE_ND", "cropped_batch2")(lambda rng: one_op(
    "BATCH_TO_SPACE_ND", [(8, 3, 4, 5)], rng, [np.array([2, 2], np.int32), np.array([[1, 0], [0, 1]], np.int32)]))
case("PAD")(lambda rng: one_op("PAD", [(1, 3, 4, 5)], rng, [np.array([[0, 1], [2, 0], [1, 1], [0, 3]], np.int32)]))
case("RESHAPE")(lambda rng: one_op("RESHAPE", [(1, 4, 3, 6)], rng, [np.array([2, 6, 6], np.int32)]))


@case("RESHAPE", "int8_squeeze_excite")
def _int8_squeeze_excite_reshape(rng):
    """An int8 squeeze-and-excitation vector as a converter writes it: MEAN without kept dimensions, then a
    RESHAPE back to one pixel on the same grid (no rounding of its own, so no GPU kernel), read by a 1x1
    convolution (its grid coarse enough that a MEAN a step off stays within a step of it)."""
    b = GraphBuilder()
    x = b.input("x", (1, 5, 6, 8), "int8", quant=(0.05, 2))
    mean = b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], dtype="int8", quant=(0.02, -3),
                options={"keep_dims": False})
    pixel = b.op("RESHAPE", [mean, b.const("s", np.array([1, 1, 1, 8], np.int32))], dtype="int8", quant=(0.02, -3))
    w = b.const("w", rng.integers(-127, 128, (4, 1, 1, 8)).astype(np.int8), quant=(0.01, 0))
    bias = b.const("b", rng.integers(-500, 500, 4).astype(np.int32), quant=(0.0002, 0))
    b.output(pixel)  # a partition output: stored, but by the MEAN's kernel, where the reshape runs none
    b.output(b.op("CONV_2D", [pixel, w, bias], dtype="int8", quant=(0.2, 1), options={**CONV, "padding": "VALID"}))
    return b.to_bytes(), [rng.integers(-128, 128, (1, 5, 6, 8)).astype(np.int8)]


@case("RESHAPE", "int8_onto_another_grid")
def _int8_regrid(rng):
    """A quantized RESHAPE whose output grid is not its input's: LiteRT copies the integers, so the values
    change; the GPUs' float view would round them instead, and refuses it."""
    b = GraphBuilder()
    x = b.input("x", (1, 8), "int8", quant=(0.02, -3))
    b.output(b.op("RESHAPE", [x, b.const("s", np.array([1, 1, 1, 8], np.int32))], dtype="int8", quant=(0.03, 0)))
    return b.to_bytes(), [rng.integers(-128, 128, (1, 8)).astype(np.int8)]
case("EXPAND_DIMS", "last")(lambda rng: one_op("EXPAND_DIMS", [(2, 3, 5)], rng, [np.array(-1, np.int32)]))
case("SQUEEZE")(lambda rng: one_op("SQUEEZE", [(1, 3, 1, 6)], rng, options={"squeeze_dims": [2]}))
case("TRANSPOSE", "4d")(lambda rng: one_op("TRANSPOSE", [(2, 3, 4, 5)], rng, [np.array([0, 3, 1, 2], np.int32)]))
case("TRANSPOSE", "3d_channels_kept")(lambda rng: one_op("TRANSPOSE", [(3, 5, 8)], rng,
                                                         [np.array([1, 0, 2], np.int32)]))
case("TRANSPOSE", "2d")(lambda rng: one_op("TRANSPOSE", [(6, 7)], rng, [np.array([1, 0], np.int32)]))


@case("SPLIT", "channels")
def _split(rng):
    b = GraphBuilder()
    x = b.input("x", (1, 3, 4, 12))
    b.output(*b.op("SPLIT", [b.const("axis", np.array([3], np.int32)), x], options={"num_splits": 3}, dtype="float32",
                   shapes=[(1, 3, 4, 4)] * 3))
    return b.to_bytes(), [normal(rng, (1, 3, 4, 12))], None


@case("SPLIT_V", "rows_and_channels")
def _split_v(rng):
    b = GraphBuilder()
    x = b.input("x", (2, 7, 6))
    sizes, axis = b.const("sizes", np.array([2, -1, 1], np.int32)), b.const("axis", np.array([1], np.int32))
    rows = b.op("SPLIT_V", [x, sizes, axis], options={"num_splits": 3}, shapes=[(2, 2, 6), (2, 4, 6), (2, 1, 6)])
    b.output(b.op("LOGISTIC", [rows[0]]), rows[1])  # an op reading a first output is not fused into the split
    b.output(*b.op("SPLIT_V", [rows[2], b.const("sizes2", np.array([1, 5], np.int32)),
                               b.const("axis2", np.array([-1], np.int32))],
                   options={"num_splits": 2}, shapes=[(2, 1, 1), (2, 1, 5)]))
    return b.to_bytes(), [normal(rng, (2, 7, 6))], None


case("TILE", "channels_too")(lambda rng: one_op("TILE", [(2, 3, 5)], rng, [np.array([2, 1, 3], np.int32)]))
case("TILE", "pixels")(lambda rng: one_op("TILE", [(1, 2, 3, 8)], rng, [np.array([2, 3, 2, 1], np.int32)]))
case("SPACE_TO_DEPTH", "block2")(lambda rng: one_op("SPACE_TO_DEPTH", [(1, 4, 6, 3)], rng, options={"block_size": 2}))
for _mode in ("REFLECT", "SYMMETRIC"):
    case("MIRROR_PAD", _mode.lower())(lambda rng, m=_mode: one_op(
        "MIRROR_PAD", [(1, 4, 5, 3)], rng, [np.array([[0, 0], [2, 1], [3, 0], [1, 2]], np.int32)],
        options={"mode": m}))


@case("PACK", "rows")
def _pack(rng):
    b = GraphBuilder()
    xs = [b.input(f"x{i}", (2, 6)) for i in range(3)]
    b.output(b.op("PACK", xs, options={"values_count": 3, "axis": 1}))
    return b.to_bytes(), [normal(rng, (2, 6)) for _ in range(3)], None


@case("PACK", "last_axis")
def _pack_last(rng):
    b = GraphBuilder()
    xs = [b.input(f"x{i}", (2, 3, 5)) for i in range(2)]
    b.output(b.op("PACK", xs, options={"values_count": 2, "axis": -1}))
    return b.to_bytes(), [normal(rng, (2, 3, 5)) for _ in range(2)], None


@case("UNPACK", "rows")
def _unpack(rng):
    b = GraphBuilder()
    x = b.input("x", (2, 3, 5))
    b.output(*b.op("UNPACK", [x], options={"num": 3, "axis": 1}, shapes=[(2, 5)] * 3))
    return b.to_bytes(), [normal(rng, (2, 3, 5))], None


@case("UNPACK", "last_axis")
def _unpack_last(rng):
    b = GraphBuilder()
    x = b.input("x", (1, 2, 3, 4))
    b.output(*b.op("UNPACK", [x], options={"num": 4, "axis": -1}, shapes=[(1, 2, 3)] * 4))
    return b.to_bytes(), [normal(rng, (1, 2, 3, 4))], None


case("RESIZE_BILINEAR", "half_pixel")(lambda rng: one_op(
    "RESIZE_BILINEAR", [(1, 3, 4, 5)], rng, [np.array([7, 5], np.int32)], options={"half_pixel_centers": True},
    version=3))
for _mode in ("plain", "align_corners", "half_pixel_centers"):
    case("RESIZE_NEAREST_NEIGHBOR", _mode)(lambda rng, m=_mode: one_op(
        "RESIZE_NEAREST_NEIGHBOR", [(1, 3, 5, 6)], rng, [np.array([7, 4], np.int32)],
        options={} if m == "plain" else {m: True}, version=1 if m == "plain" else 3))
case("SOFTMAX")(lambda rng: one_op("SOFTMAX", [(2, 13)], rng, options={"beta": 1.5}, scale=3.0))
case("STRIDED_SLICE", "strided")(lambda rng: one_op(
    "STRIDED_SLICE", [(1, 6, 7, 9)], rng, [np.array(v, np.int32) for v in ([0, 1, 0, 2], [1, 6, 7, 9], [1, 2, 3, 1])]))
case("MEAN", "pixels")(lambda rng: one_op("MEAN", [(1, 5, 4, 6)], rng, [np.array([1, 2], np.int32)],
                                          options={"keep_dims": True}))
case("MEAN", "channels")(lambda rng: one_op("MEAN", [(1, 3, 4, 7)], rng, [np.array([3], np.int32)]))
case("MEAN", "rows_batch2")(lambda rng: one_op("MEAN", [(2, 5, 4, 6)], rng, [np.array([1], np.int32)],
                                               options={"keep_dims": True}))
case("MEAN", "pixels_batch3")(lambda rng: one_op("MEAN", [(3, 4, 5, 9)], rng, [np.array([1, 2], np.int32)]))
for _code in ("SUM", "REDUCE_PROD", "REDUCE_MAX", "REDUCE_MIN"):
    case(_code, "batch_and_channels")(lambda rng, c=_code: one_op(
        c, [(2, 3, 4, 6)], rng, [np.array([0, 3], np.int32)], scale=0.8 if c == "REDUCE_PROD" else 1.0))
    case(_code, "rows_kept")(lambda rng, c=_code: one_op(c, [(3, 5, 7)], rng, [np.array([-2], np.int32)],
                                                         options={"keep_dims": True}))
for _code in ("REDUCE_ANY", "REDUCE_ALL"):
    case(_code, "pixels")(lambda rng, c=_code: (
        one_op(c, [(1, 3, 4, 5)], rng, [np.array([1, 2], np.int32)], dtype="bool")[0],
        [rng.random((1, 3, 4, 5)) > (0.1 if c == "REDUCE_ALL" else 0.9)], None))
def arg(opcode: str, shape, axis: int, index: str, values: np.ndarray):
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op(opcode, [x, b.const("axis", np.array([axis], np.int32))],
                  options={"output_type": {"int32": 2, "int64": 4}[index]}, dtype=index))
    return b.to_bytes(), [values], None


for _code in ("ARG_MAX", "ARG_MIN"):
    case(_code, "channels_with_ties")(lambda rng, c=_code: arg(  # ties keep the first index, as LiteRT does
        c, (2, 3, 9), -1, "int32", np.round(normal(rng, (2, 3, 9)))))
    case(_code, "rows")(lambda rng, c=_code: arg(c, (1, 6, 4, 5), 1, "int64", normal(rng, (1, 6, 4, 5))))
case("DEPTH_TO_SPACE")(lambda rng: one_op("DEPTH_TO_SPACE", [(1, 2, 3, 12)], rng, options={"block_size": 2}))


def _basic_lstm(rng, units: int, scale: float):
    """The basic LSTM cell on 2 rows of 5 inputs, weights and bias of ``scale`` (which sets how far the
    gates' pre-activations reach)."""
    batch, inputs = 2, 5
    b = GraphBuilder()
    xs = [b.input("x", (batch, inputs)), b.input("prev_activ", (batch, units))]
    weights = b.const("w", normal(rng, (4 * units, inputs + units), scale))
    bias = b.const("b", normal(rng, 4 * units, scale))
    prev_state = b.input("prev_state", (batch, units))
    outs = b.op("LSTM", [*xs, weights, bias, prev_state], version=2,
                options={"fused_activation_function": "TANH", "kernel_type": "BASIC"},
                shapes=[(batch, units), (batch, units), (batch, inputs + units), (batch, 4 * units)])
    b.output(*outs)
    return b.to_bytes(), [normal(rng, (batch, inputs)), normal(rng, (batch, units)), normal(rng, (batch, units))], None


case("LSTM", "basic")(lambda rng: _basic_lstm(rng, 3, 0.5))
# Gates far into saturation (pre-activations past +-10, where TANH clamps its input and LOGISTIC's exp
# overflows or vanishes), over a second slice of units.
case("LSTM", "saturated")(lambda rng: _basic_lstm(rng, 6, 6.0))


@case("QUANTIZE", "int8")
@case("DEQUANTIZE", "runtime_int8")
def _quantize_dequantize(rng):
    """float -> QUANTIZE -> int8 output, and -> DEQUANTIZE -> float output: the float view's edges."""
    b = GraphBuilder()
    x = b.input("x", (1, 3, 4, 5))
    q = b.op("QUANTIZE", [x], dtype="int8", quant=(0.03, -5))
    b.output(q, b.op("DEQUANTIZE", [q], version=2, dtype="float32"))
    return b.to_bytes(), [rng.uniform(-4, 4, (1, 3, 4, 5)).astype(np.float32)], None


@case("DEQUANTIZE", "fp16_weights")
def _dequantize(rng):
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 3))
    w = b.op("DEQUANTIZE", [b.const("w16", normal(rng, (5, 3, 3, 3)).astype(np.float16))], version=2,
             dtype="float32")
    b.output(b.op("CONV_2D", [x, w, b.const("b", normal(rng, (5,)))], options=CONV))
    return b.to_bytes(), [normal(rng, (1, 4, 4, 3))], None



# -- the rest of what the CPU backend claims: layout and index ops, normalisations, LSTMs ----------------

case("SPACE_TO_BATCH_ND", "padded")(lambda rng: one_op("SPACE_TO_BATCH_ND", [(1, 4, 6, 3)], rng, [
    np.array([2, 2], np.int32), np.array([[0, 0], [1, 1]], np.int32)]))
case("BATCH_TO_SPACE_ND", "cropped")(lambda rng: one_op("BATCH_TO_SPACE_ND", [(4, 2, 3, 3)], rng, [
    np.array([2, 2], np.int32), np.array([[0, 0], [0, 1]], np.int32)]))
case("BROADCAST_TO", "rank_up")(lambda rng: one_op("BROADCAST_TO", [(3, 1, 5)], rng, version=2, consts=
                                                   [np.array([2, 3, 4, 5], np.int32)]))
case("CUMSUM", "reverse")(lambda rng: one_op("CUMSUM", [(2, 3, 7)], rng, [np.array(2, np.int32)],
                                             options={"exclusive": False, "reverse": True}))
case("GATHER", "axis1")(lambda rng: one_op("GATHER", [(5, 4, 3)], rng, [np.array([[0, 3], [2, 2]], np.int32)],
                                           options={"axis": 1}))
case("GATHER", "channels_at_bounds")(lambda rng: one_op("GATHER", [(2, 3, 4, 9)], rng, [
    np.array([8, 0, 8, 3, 5], np.int32)], options={"axis": -1}))
case("GATHER", "rows_int64_scalar")(lambda rng: one_op("GATHER", [(6, 5, 7)], rng, [np.array(5, np.int64)]))
case("GATHER", "pixels_of_images")(lambda rng: one_op("GATHER", [(2, 4, 6, 8)], rng, [
    np.array([5, 0, 0, 5, 2, 3], np.int32)], options={"axis": 2}))


@case("GATHER", "runtime_indices")
def _gather_runtime(rng):
    """Indices computed at run time: TFLite checks each against the axis, so the GPUs leave it to the CPU."""
    b = GraphBuilder()
    b.output(b.op("GATHER", [b.input("x", (5, 4)), b.input("i", (3,), "int32")], options={"axis": 0}))
    return b.to_bytes(), [normal(rng, (5, 4)), np.array([4, 0, 2], np.int32)], None




# -- MediaPipe's pooling with indices: LiteRT's interpreter has no kernel for them (MediaPipe's resolver
# registers them), so these cases are checked against loops written from MediaPipe's definition ----------

def mediapipe_pool_options(padding: str, stride: tuple[int, int], window: tuple[int, int], activation: int = 0) -> bytes:
    """TfLitePoolParams as MediaPipe reads it: padding, stride w, stride h, filter w, filter h, activation,
    then the computed padding it fills in itself."""
    return np.array([1 if padding == "SAME" else 2, stride[1], stride[0], window[1], window[0], activation,
                     0, 0, 0, 0], "<i4").tobytes()


def _pooled_size(size: int, window: int, stride: int, same: bool) -> tuple[int, int]:
    out = -(-size // stride) if same else (size - window + stride) // stride
    return out, max(((out - 1) * stride + window - size) // 2, 0)


def pool_argmax_reference(x: np.ndarray, padding: str, stride, window, activation: int = 0) -> list[np.ndarray]:
    """MaxPoolingWithArgmax2D from its definition: the first largest value of each window clipped to the
    input, its place ky * filter_w + kx plus 0.1, and the values clamped by RELU (1), RELU_N1_TO_1 (2), RELU6 (3)."""
    n, h, w, c = x.shape
    oh, top = _pooled_size(h, window[0], stride[0], padding == "SAME")
    ow, left = _pooled_size(w, window[1], stride[1], padding == "SAME")
    values = np.zeros((n, oh, ow, c), np.float32)
    places = np.zeros((n, oh, ow, c), np.float32)
    low, high = {1: (0, np.inf), 2: (-1, 1), 3: (0, 6)}.get(activation, (-np.inf, np.inf))
    for b, oy, ox, ch in np.ndindex(n, oh, ow, c):
        best, place = np.finfo(np.float32).min, 0
        for ky, kx in np.ndindex(*window):
            iy, ix = oy * stride[0] - top + ky, ox * stride[1] - left + kx
            if 0 <= iy < h and 0 <= ix < w and x[b, iy, ix, ch] > best:
                best, place = x[b, iy, ix, ch], ky * window[1] + kx
        values[b, oy, ox, ch] = min(max(best, low), high)
        places[b, oy, ox, ch] = np.float32(place) + np.float32(0.1)
    return [values, places]


def max_unpooling_reference(x: np.ndarray, places: np.ndarray, stride, window) -> list[np.ndarray]:
    """MaxUnpooling2D from its definition: an output of the input's size times the window, zero but where
    an input value's index (truncated) places it, input pixels in order (a later one wins)."""
    n, h, w, c = x.shape
    oh, ow = h * window[0], w * window[1]
    top, left = (max(((size - 1) * s + k - out) // 2, 0) for size, s, k, out in
                 ((h, stride[0], window[0], oh), (w, stride[1], window[1], ow)))
    out = np.zeros((n, oh, ow, c), np.float32)
    for b, iy, ix, ch in np.ndindex(n, h, w, c):
        index = int(places[b, iy, ix, ch])
        oy, ox = iy * stride[0] - top + index // window[1], ix * stride[1] - left + index % window[1]
        if 0 <= oy < oh and 0 <= ox < ow:
            out[b, oy, ox, ch] = x[b, iy, ix, ch]
    return [out]


def _pool_argmax_case(name: str, shape, padding: str, stride, window, activation: int = 0) -> None:
    def build(rng):
        b = GraphBuilder()
        values, places = b.op("MaxPoolingWithArgmax2D", [b.input("x", shape)], custom=True, num_outputs=2,
                              custom_options=mediapipe_pool_options(padding, stride, window, activation))
        b.output(values, places)
        x = normal(rng, shape)
        x[..., 0] = np.round(x[..., 0])  # ties in a window: the first largest wins
        return b.to_bytes(), [x], None
    CASES.append(Case(f"MaxPoolingWithArgmax2D:{name}", "MaxPoolingWithArgmax2D", "op", build,
                      numpy_reference=lambda inputs: pool_argmax_reference(inputs[0], padding, stride, window,
                                                                           activation)))


def _max_unpooling_case(name: str, shape, padding: str, stride, window) -> None:
    """The segmentation models' pair: MaxUnpooling2D of MaxPoolingWithArgmax2D's values and indices."""
    def build(rng):
        b = GraphBuilder()
        options = mediapipe_pool_options(padding, stride, window)
        values, places = b.op("MaxPoolingWithArgmax2D", [b.input("x", shape)], custom=True, num_outputs=2,
                              custom_options=options)
        b.output(b.op("MaxUnpooling2D", [values, places], custom=True, custom_options=options))
        return b.to_bytes(), [normal(rng, shape)], None

    def reference(inputs):
        values, places = pool_argmax_reference(inputs[0], padding, stride, window)
        return max_unpooling_reference(values, places, stride, window)
    CASES.append(Case(f"MaxUnpooling2D:{name}", "MaxUnpooling2D", "op", build, numpy_reference=reference))


_pool_argmax_case("2x2_stride2", (1, 6, 8, 5), "SAME", (2, 2), (2, 2))
_pool_argmax_case("3x3_stride2_same_relu6", (2, 7, 5, 6), "SAME", (2, 2), (3, 3), activation=3)
_pool_argmax_case("3x2_valid_relu", (1, 8, 7, 4), "VALID", (2, 1), (3, 2), activation=1)
_max_unpooling_case("2x2_stride2", (1, 6, 8, 5), "SAME", (2, 2), (2, 2))
_max_unpooling_case("odd_same", (2, 5, 7, 3), "SAME", (2, 2), (2, 2))
_max_unpooling_case("overlapping_3x3_stride2", (1, 7, 6, 4), "VALID", (2, 2), (3, 3))

case("CUMSUM", "exclusive_negative_axis")(lambda rng: one_op("CUMSUM", [(2, 5, 3, 6)], rng, [np.array(-1, np.int32)],
                                                             options={"exclusive": True, "reverse": False}))
case("CUMSUM", "rows_reverse_exclusive")(lambda rng: one_op("CUMSUM", [(3, 6, 2, 5)], rng, [np.array(1, np.int32)],
                                                            options={"exclusive": True, "reverse": True}))
case("CUMSUM", "batch")(lambda rng: one_op("CUMSUM", [(4, 7)], rng, [np.array(0, np.int32)]))


def one_hot(rng, shape, depth, axis, dtype="int32"):
    """ONE_HOT of runtime indices, some outside [0, depth) (all off there)."""
    b = GraphBuilder()
    b.output(b.op("ONE_HOT", [b.input("i", shape, dtype), b.const("depth", np.array(depth, np.int32)),
                              b.const("on", np.array(2.5, np.float32)), b.const("off", np.array(-0.5, np.float32))],
                  dtype="float32", options={"axis": axis}))
    return b.to_bytes(), [rng.integers(-1, depth + 2, shape).astype(dtype)], None


case("ONE_HOT", "last_axis")(lambda rng: one_hot(rng, (2, 3, 5), 6, -1))
case("ONE_HOT", "first_axis_int64")(lambda rng: one_hot(rng, (4, 3), 5, 0, "int64"))
case("ONE_HOT", "middle_axis")(lambda rng: one_hot(rng, (3, 7), 9, 1))
case("GATHER_ND", "rows")(lambda rng: one_op("GATHER_ND", [(4, 5, 3)], rng,
                                             [np.array([[0, 1], [3, 4], [2, 0]], np.int32)]))
case("SLICE", "to_the_end")(lambda rng: one_op("SLICE", [(3, 5, 6)], rng, [np.array([1, 0, 2], np.int32),
                                                                         np.array([2, -1, 3], np.int32)]))
case("SLICE", "channels_from_4")(lambda rng: one_op("SLICE", [(2, 4, 5, 11)], rng, [np.array([1, 1, 0, 4], np.int32),
                                                                                 np.array([1, 2, -1, 5], np.int32)]))
case("PADV2", "channels_and_pixels")(lambda rng: one_op("PADV2", [(2, 3, 4, 5)], rng, [
    np.array([[0, 1], [1, 0], [2, 1], [1, 2]], np.int32), np.array(-1.25, np.float32)]))
case("PADV2", "constant_value")(lambda rng: one_op("PADV2", [(1, 3, 4, 2)], rng, [
    np.array([[0, 0], [1, 2], [0, 1], [0, 0]], np.int32), np.array(0.5, np.float32)]))
case("L2_NORMALIZATION", "channels")(lambda rng: one_op("L2_NORMALIZATION", [(2, 3, 6)], rng))
case("LOG_SOFTMAX")(lambda rng: one_op("LOG_SOFTMAX", [(3, 11)], rng, scale=3.0))
case("L2_POOL_2D", "2x2_stride2")(lambda rng: (
    pool_model("L2_POOL_2D", 1, 6, 5, 3, 2, 2, 2, 2, "VALID", "NONE"), [normal(rng, (1, 6, 5, 3))], None))
case("LOGICAL_NOT")(lambda rng: one_op("LOGICAL_NOT", [(3, 5)], rng, dtype="bool"))
case("LOGICAL_OR", "broadcast")(lambda rng: one_op("LOGICAL_OR", [(2, 3, 4), (3, 1)], rng, dtype="bool"))


@case("DENSIFY", "sparse_fp16_weights")
def _densify(rng):
    """Sparse float16 weights made dense, then widened, for a convolution."""
    return sparse_conv_model(rng, (1, 4, 4, 12), 5), [normal(rng, (1, 4, 4, 12))], None


@case("FILL", "runtime_value")
def _fill(rng):
    b = GraphBuilder()
    b.output(b.op("FILL", [b.const("dims", np.array([2, 3, 4], np.int32)), b.input("value", ())], dtype="float32"))
    return b.to_bytes(), [normal(rng, ())], None


@case("RESHAPE", "shape_computed_from_shapes")
def _reshape_computed_shape(rng):
    """RESHAPEs whose shapes are shape arithmetic on static shapes, as converters leave it where the source graph
    read a size at run time: SHAPE -> STRIDED_SLICE -> PACK with constants, and SHAPE -> GATHER -> REDUCE_PROD ->
    CONCATENATION; the GPUs compute them at compile time, with no kernel."""
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4, 8))
    mean = b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": False})
    shape = b.op("SHAPE", [x], dtype="int32", shape=(4,), options={"out_type": 2})
    batch = b.op("STRIDED_SLICE", [shape, b.const("b", np.array([0], np.int32)), b.const("e", np.array([1], np.int32)),
                                   b.const("s", np.array([1], np.int32))],
                 options={"shrink_axis_mask": 1}, dtype="int32", shape=())
    gate = b.op("RESHAPE", [mean, b.op("PACK", [batch, *(b.const(f"d{i}", np.array(v, np.int32))
                                                         for i, v in enumerate((1, 1, 8)))],
                                       options={"axis": 0, "values_count": 4}, dtype="int32", shape=(4,))],
                shape=(2, 1, 1, 8))
    shape2 = b.op("SHAPE", [x], dtype="int32", shape=(4,), options={"out_type": 2})
    rows = b.op("REDUCE_PROD", [b.op("GATHER", [shape2, b.const("hw", np.array([1, 2], np.int32))],
                                     options={"axis": 0, "batch_dims": 0}, dtype="int32", shape=(2,)),
                                b.const("ax", np.array([0], np.int32))],
                options={"keep_dims": True}, dtype="int32", shape=(1,))
    target = b.op("CONCATENATION", [b.const("n", np.array([2], np.int32)), rows, b.const("c", np.array([8], np.int32))],
                  options={"axis": 0}, dtype="int32", shape=(3,))
    b.output(b.op("MUL", [x, gate]), b.op("RESHAPE", [b.op("RELU", [x]), target], shape=(2, 12, 8)))
    return b.to_bytes(), [normal(rng, (2, 3, 4, 8))], None


@case("SHAPE", "int32")
def _shape(rng):
    b = GraphBuilder()
    x = b.input("x", (2, 3, 5))
    b.output(b.op("SHAPE", [x], dtype="int32", options={"out_type": 2}), b.op("RELU", [x]))
    return b.to_bytes(), [normal(rng, (2, 3, 5))], None


@case("REAL", "rfft2d_parts")
@case("IMAG", "rfft2d_parts")
def _complex_parts(rng):
    b = GraphBuilder()
    spectrum = b.op("RFFT2D", [b.input("x", (3, 4, 6)), b.const("fft_length", np.array([4, 8], np.int32))],
                    dtype="complex64")
    b.output(b.op("REAL", [spectrum], dtype="float32"), b.op("IMAG", [spectrum], dtype="float32"))
    return b.to_bytes(), [normal(rng, (3, 4, 6))], None


@case("UNIDIRECTIONAL_SEQUENCE_LSTM", "peephole_projection_layer_norm")
def _sequence_lstm(rng):
    from tests.ops.test_lstm import _lstm_operands
    variant = {"cifg": False, "peephole": True, "projection": True, "projection_bias": True, "layer_norm": True}
    b = GraphBuilder()
    x = b.input("x", (2, 4, 3))
    operands = _lstm_operands(b, rng, 3, 5, 4, 2, variant)
    b.output(b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", [x] + operands, options={
        "fused_activation_function": "TANH", "cell_clip": 0.8, "proj_clip": 0.5, "time_major": False}))
    return b.to_bytes(), [normal(rng, (2, 4, 3))], None


def _integer_sequence_lstm(rng):
    """The converter's integer LSTM (int8 activations, int16 cell state), with peepholes and layer norm."""
    from tests.ops.test_lstm import _integer_lstm
    variant = {"cifg": False, "peephole": True, "projection": False, "projection_bias": False, "layer_norm": True}
    return _integer_lstm(rng, variant, False, 3, 5, 4, 4, 2, (0.6, 0.0), "UNIDIRECTIONAL_SEQUENCE_LSTM")


CASES.append(Case("UNIDIRECTIONAL_SEQUENCE_LSTM:int8", "UNIDIRECTIONAL_SEQUENCE_LSTM", "quantized",
                  lambda rng: (lambda m, x: (m, [x]))(*_integer_sequence_lstm(rng)), reference="builtin"))

# -- elementwise ops over every broadcast rank, their quantized forms, hybrid and spectral ops ---------

ARITHMETIC = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE")
COMPARISONS = ("LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL")
DIVISIONS = ("DIV", "FLOOR_DIV", "FLOOR_MOD")
# Operand shapes of every rank combination LiteRT's kernels broadcast (numpy's rules).
RANKS = [((1, 197, 192), (197, 192)), ((197, 192), (1, 197, 192)), ((2, 3, 4, 5), (5,)), ((5,), (2, 3, 4, 5)),
         ((4, 1, 5), (2, 1, 4, 1, 1)), ((2, 1, 3), (4, 1)), ((1, 4, 3), (1, 1, 3)), ((), (2, 3)),
         ((1, 2, 1, 3, 1, 2), (2, 1, 3, 4, 1))]
QUANT = {"int8": (0.05, 3), "int16": (0.01, 0)}


def _binary(op: str, a: tuple, b: tuple, dtype: str, constant: bool):
    def build(rng):
        g = GraphBuilder()
        q = QUANT.get(dtype)

        def values(shape):
            if dtype == "float32":
                v = rng.standard_normal(shape).astype(np.float32)
                if op in COMPARISONS:  # quarters: exact in half precision too, and with ties for EQUAL
                    return np.round(v * 4) / np.float32(4)
                return v + np.float32(3) if op == "DIV" else v
            return rng.integers(-100, 100, shape).astype(dtype)
        x = g.input("x", a, dtype, quant=q)
        y_values = values(b)
        if op in DIVISIONS and dtype != "float32":  # never at the divisor's zero (point)
            y_values[(y_values == 0) | (y_values == q[1])] = 7
        y = g.const("y", y_values, dtype, quant=q) if constant else g.input("y", b, dtype, quant=q)
        boolean = op in COMPARISONS
        g.output(g.op(op, [x, y], dtype="bool" if boolean else None, quant=None if boolean else q))
        return g.to_bytes(), [values(a)] + ([] if constant else [y_values])
    return build


# Unary float ops, on inputs inside their domains (positive where a log or root needs it).
UNARY = ("RELU", "RELU6", "RELU_N1_TO_1", "LOGISTIC", "TANH", "EXP", "LOG", "SQRT", "RSQRT", "SQUARE", "ABS", "NEG",
         "SIN", "COS", "FLOOR", "CEIL", "ROUND", "SIGN", "HARD_SWISH", "GELU", "ELU", "LEAKY_RELU")
POSITIVE = ("LOG", "SQRT", "RSQRT")
STEPS = ("FLOOR", "CEIL", "ROUND")  # jumps at the integers (ROUND: halfway between them)


def _unary(op: str, shape: tuple):
    def build(rng):
        g = GraphBuilder()
        x = g.input("x", shape)
        g.output(g.op(op, [x], options={"alpha": 0.2} if op == "LEAKY_RELU" else None))
        values = (rng.standard_normal(shape) * 3).astype(np.float32)
        if op in STEPS:  # a tenth from every jump, which rounding the input to f16 cannot cross
            values = off_integers(rng, shape, 8) + np.float32(0.5 if op == "ROUND" else 0.0)
        return g.to_bytes(), [np.abs(values) + np.float32(0.1) if op in POSITIVE else values]
    return build


def _grouped_conv(groups: int):
    def build(rng):
        g = GraphBuilder()
        x = g.input("x", (1, 6, 5, 4 * groups))
        w = g.const("w", rng.standard_normal((2 * groups, 3, 3, 4)).astype(np.float32))
        g.output(g.op("CONV_2D", [x, w, g.const("b", rng.standard_normal(2 * groups).astype(np.float32))],
                      options={"padding": "SAME", "stride_h": 1, "stride_w": 1}))
        return g.to_bytes(), [rng.standard_normal((1, 6, 5, 4 * groups)).astype(np.float32)]
    return build


def _hybrid_fully_connected(asymmetric: bool):
    def build(rng):
        g = GraphBuilder()
        x = g.input("x", (3, 20))
        w = g.const("w", rng.integers(-127, 128, (8, 20)).astype(np.int8), quant=(0.01, 0))
        g.output(g.op("FULLY_CONNECTED", [x, w, g.const("b", rng.standard_normal(8).astype(np.float32))],
                      dtype="float32", options={"asymmetric_quantize_inputs": asymmetric}))
        return g.to_bytes(), [(rng.standard_normal((3, 20)) * 2).astype(np.float32)]
    return build


def _hybrid_conv(opcode: str, per_channel: bool):
    """A dynamic-range CONV_2D or DEPTHWISE_CONV_2D: int8 weights with one scale or one per channel."""
    def build(rng):
        g = GraphBuilder()
        x = g.input("x", (2, 7, 6, 4))
        shape, axis = ((6, 3, 3, 4), 0) if opcode == "CONV_2D" else ((1, 3, 3, 4), 3)
        channels = shape[axis]
        scales = rng.uniform(0.002, 0.02, channels) if per_channel else np.full(channels, 0.01)
        w = g.const("w", rng.integers(-127, 128, shape).astype(np.int8),
                    quant=(scales.astype(np.float32), np.zeros(channels, np.int64), axis))
        options = {"padding": "SAME", "stride_h": 1, "stride_w": 1}
        if opcode == "DEPTHWISE_CONV_2D":
            options["depth_multiplier"] = 1
        g.output(g.op(opcode, [x, w, g.const("b", rng.standard_normal(channels).astype(np.float32))], dtype="float32",
                      options=options))
        return g.to_bytes(), [rng.standard_normal((2, 7, 6, 4)).astype(np.float32)]
    return build


def _reduce_prod(dtype: str):
    def build(rng):
        g = GraphBuilder()
        x = g.input("x", (2, 3, 4), dtype, quant=QUANT[dtype])
        g.output(g.op("REDUCE_PROD", [x, g.const("axes", np.array([1], np.int32))], dtype=dtype,
                      quant=(QUANT[dtype][0] ** 2 * 4, 0)))
        return g.to_bytes(), [rng.integers(-100, 100, (2, 3, 4)).astype(dtype)]
    return build


def _rfft2d(rng):
    g = GraphBuilder()
    x = g.input("x", (2, 6, 7))
    spectrum = g.op("RFFT2D", [x, g.const("fft_length", np.array([8, 8], np.int32))], dtype="complex64")
    g.output(g.op("COMPLEX_ABS", [spectrum], dtype="float32"), spectrum)
    return g.to_bytes(), [rng.standard_normal((2, 6, 7)).astype(np.float32)]


CASES += (
    [Case(f"{op}-{a}-{b}-{'const' if c else 'input'}", op, "elementwise", _binary(op, a, b, "float32", c))
     for op in ARITHMETIC for a, b in RANKS for c in (False, True)]
    + [Case(f"{op}-{a}-{b}", op, "elementwise", _binary(op, a, b, "float32", False))
       for op in COMPARISONS for a, b in RANKS[:4]]
    + [Case(f"{op}-{shape}", op, "unary", _unary(op, shape)) for op in UNARY for shape in ((1, 5, 4, 6), (3, 7))]
    + [Case(f"{op}-{dtype}-{a}-{b}", op, "quantized", _binary(op, a, b, dtype, False), reference="builtin")
       for dtype in QUANT for op in ("ADD", "SUB", "MUL", "LESS", "EQUAL", "NOT_EQUAL", "GREATER_EQUAL", *DIVISIONS)
       for a, b in RANKS if not (dtype == "int16" and op == "MUL")]
    + [Case(f"REDUCE_PROD-{dtype}", "REDUCE_PROD", "quantized", _reduce_prod(dtype), reference="builtin")
       for dtype in QUANT]
    + [Case("RFFT2D-COMPLEX_ABS", "RFFT2D", "spectral", _rfft2d)]
    + [Case(f"CONV_2D-groups{g}", "CONV_2D", "grouped_conv" if g > 1 else "conv", _grouped_conv(g)) for g in (1, 2, 4)]
    + [Case(f"{op}-hybrid-{'per-channel' if p else 'per-tensor'}", op, "hybrid", _hybrid_conv(op, p),
            reference="builtin")
       for op in ("CONV_2D", "DEPTHWISE_CONV_2D") for p in (False, True)]
    + [Case(f"FULLY_CONNECTED-hybrid-{'asym' if a else 'sym'}", "FULLY_CONNECTED", "hybrid",
            _hybrid_fully_connected(a), reference="builtin")
       for a in (False, True)]
)

