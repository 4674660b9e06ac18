"""The CPU backend's op fusion: pads and activations run inside the kernels they surround, with the
values LiteRT computes running them as separate ops; and nothing fuses where a value is needed
elsewhere or the pad fills with something other than zero."""

from unittest import mock

import numpy as np
import pytest

from delegate import CompileOptions, read_model
from delegate.partition import make_partition
from delegate.plugins import default_manager
from delegate.runtime import Executor
from delegate.tflite.builder import GraphBuilder
from delegate_cpu.kernels.native import NativeLoops, native_loops
from tests.oputil import assert_close, litert_run
from tests.ops.test_quantized_ops import bias, matmul_out_scale, random_q, weights

NATIVE = pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
CONV = {"padding": "VALID", "stride_h": 1, "stride_w": 1, "fused_activation_function": "NONE"}
NO_ACTIVATION = {"fused_activation_function": "NONE"}


def _normal(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _run(model: bytes, inputs, native: bool, threads: int = 2):
    """delegate's outputs (one CPU partition) and which ops ran inside which."""
    g = read_model(model).main
    backend = default_manager().backend_info("cpu").factory({"native": native})
    ex = Executor(g, [make_partition(g, g.ops, "cpu", 0)], {"cpu": backend}, CompileOptions(num_threads=threads))
    out = ex.run({t.index: x for t, x in zip(g.inputs, inputs)})
    return [out[t.index] for t in g.outputs], ex.compiled[0].describe()["fused"]


def _check(model: bytes, inputs, native: bool, fused: dict[str, int]):
    outputs, ran_inside = _run(model, inputs, native)
    assert ran_inside == fused
    assert_close(outputs, litert_run(model, inputs))


def _slope(rng, channels, shape=None):
    slope = rng.uniform(-0.5, 1.5, channels).astype(np.float32)  # slopes above 1 and below 0 too
    return slope.reshape(shape) if shape else slope


@NATIVE
@pytest.mark.parametrize("activation", ["RELU", "RELU6", "RELU_N1_TO_1", "PRELU"])
@pytest.mark.parametrize("units, size", [(40, 9), (7, 5), (96, 33)])  # tail panels, few units, shared rows
def test_convolution_activation(native, activation, units, size):
    rng = np.random.default_rng(units)
    b = GraphBuilder()
    x = b.input("x", (1, size, size, 24))
    conv = b.op("CONV_2D", [x, b.const("w", _normal(rng, (units, 1, 1, 24))), b.const("b", _normal(rng, units))],
                options=CONV)
    slope = [b.const("slope", _slope(rng, units, (1, 1, units)))] if activation == "PRELU" else []
    b.output(b.op(activation, [conv, *slope]))
    _check(b.to_bytes(), [_normal(rng, (1, size, size, 24))], native, {"1": 0})


@NATIVE
@pytest.mark.parametrize("opcode, activation", [("ADD", "PRELU"), ("SUB", "RELU"), ("MUL", "PRELU")])
@pytest.mark.parametrize("shape", [(1, 2, 2, 16), (1, 40, 40, 24)])  # below and above the native threshold
def test_elementwise_activation(native, opcode, activation, shape):
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x, y = b.input("x", shape), b.input("y", shape)
    added = b.op(opcode, [x, y], options=NO_ACTIVATION)
    slope = [b.const("slope", _slope(rng, 1 if shape[1] == 2 else shape[-1]))] if activation == "PRELU" else []
    b.output(b.op(activation, [added, *slope]))
    _check(b.to_bytes(), [_normal(rng, shape), _normal(rng, shape)], native, {"1": 0})


@NATIVE
@pytest.mark.parametrize("opcode", ["DEPTHWISE_CONV_2D", "CONV_2D"])
@pytest.mark.parametrize("pads, stride", [([[0, 0], [1, 1], [1, 1], [0, 0]], 1), ([[0, 0], [0, 2], [1, 0], [0, 0]], 2)])
def test_pad_convolution_activation(native, opcode, pads, stride):
    """PAD -> VALID convolution -> PRELU: the pad as the convolution's padding, the PReLU in its epilogue."""
    rng = np.random.default_rng(4)
    b = GraphBuilder()
    x = b.input("x", (1, 13, 11, 32))
    padded = b.op("PAD", [x, b.const("pads", np.array(pads, np.int32))])
    weights = _normal(rng, (1, 3, 3, 32) if opcode == "DEPTHWISE_CONV_2D" else (48, 3, 3, 32))
    options = dict(CONV, stride_h=stride, stride_w=stride, **({"depth_multiplier": 1} if weights.shape[0] == 1 else {}))
    conv = b.op(opcode, [padded, b.const("w", weights), b.const("b", _normal(rng, weights.shape[-1] if
                                                                           opcode == "DEPTHWISE_CONV_2D" else 48))],
                options=options)
    b.output(b.op("PRELU", [conv, b.const("slope", _slope(rng, conv.shape[-1]))]))
    _check(b.to_bytes(), [_normal(rng, (1, 13, 11, 32))], native, {"0": 1, "2": 1})


@NATIVE
@pytest.mark.parametrize("opcode", ["DEPTHWISE_CONV_2D", "CONV_2D"])
@pytest.mark.parametrize("pads, stride", [([[0, 0], [1, 1], [1, 1], [0, 0]], 1), ([[0, 0], [0, 1], [0, 1], [0, 0]], 2)])
@pytest.mark.parametrize("requantized", [False, True])
def test_quantized_pad_convolution(native, opcode, pads, stride, requantized):
    """An int8 PAD (filled with its zero point) -> VALID convolution: the pad as the convolution's padding,
    bit for bit LiteRT's result; a PAD whose output is quantized otherwise than its input runs on its own."""
    rng = np.random.default_rng(6)
    b = GraphBuilder()
    in_scale, zero = 0.03, -7
    x = b.input("x", (1, 12, 10, 24), "int8", quant=(in_scale, zero))
    padded = b.op("PAD", [x, b.const("pads", np.array(pads, np.int32))],
                  quant=(in_scale * 2, zero) if requantized else (in_scale, zero))
    depthwise = opcode == "DEPTHWISE_CONV_2D"
    w, scales = weights(b, rng, (1, 3, 3, 24) if depthwise else (16, 3, 3, 24), 3 if depthwise else 0, "int8", True)
    options = dict(CONV, stride_h=stride, stride_w=stride, **({"depth_multiplier": 1} if depthwise else {}))
    pad_scale = in_scale * 2 if requantized else in_scale
    out_quant = (matmul_out_scale(pad_scale, scales, 9 if depthwise else 9 * 24), 3)
    b.output(b.op(opcode, [padded, w, bias(b, rng, pad_scale, scales, True)], dtype="int8", quant=out_quant,
                  options=options))
    model, inputs = b.to_bytes(), [random_q(rng, (1, 12, 10, 24))]
    outputs, ran_inside = _run(model, inputs, native)
    assert ran_inside == ({} if requantized else {"0": 1})
    np.testing.assert_array_equal(outputs[0], litert_run(model, inputs, builtin=True)[0])


def test_nothing_fuses_where_values_are_needed_or_differ():
    """A pad filling with 1, a pad and a convolution result read twice, a result that is a model output,
    a slope varying along the rows: each op runs on its own."""
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    x = b.input("x", (1, 6, 6, 8))
    weights, bias = b.const("w", _normal(rng, (8, 1, 1, 8))), b.const("b", _normal(rng, 8))
    ones = b.op("PADV2", [x, b.const("pads", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32)),
                          b.const("one", np.array(1.0, np.float32))])
    first = b.op("CONV_2D", [ones, weights, bias], options=CONV)
    twice = b.op("CONV_2D", [first, weights, bias], options=CONV)
    relu = b.op("RELU", [twice])
    kept = b.op("CONV_2D", [relu, weights, bias], options=CONV)
    rows = b.op("PRELU", [kept, b.const("slope", _slope(rng, 64, (8, 1, 8)))])
    b.output(b.op("ADD", [relu, twice], options=NO_ACTIVATION), kept, rows)
    _check(b.to_bytes(), [_normal(rng, (1, 6, 6, 8))], True, {})


def _residual_block(rng, kernel: int, units: int, conv_first: bool, add_activation: str):
    """x -> 1x1 CONV_2D (y) -> CONV_2D of ``kernel`` (z) -> ADD of z and y: a float residual connection.
    ``add_activation`` "NONE+RELU": the ADD's clamp as a separate RELU after it, as converters leave it;
    "NONE+PRELU": a PReLU after it."""
    add_activation, _, after = add_activation.partition("+")
    b = GraphBuilder()
    x = b.input("x", (1, 9, 7, 24))
    y = b.op("CONV_2D", [x, b.const("w1", _normal(rng, (units, 1, 1, 24))), b.const("b1", _normal(rng, units))],
             options=dict(CONV, fused_activation_function="RELU6"))
    z = b.op("CONV_2D", [y, b.const("w2", _normal(rng, (units, kernel, kernel, units))),
                         b.const("b2", _normal(rng, units))], options=dict(CONV, padding="SAME"))
    added = b.op("ADD", [z, y] if conv_first else [y, z], options={"fused_activation_function": add_activation})
    if after == "PRELU":
        added = b.op("PRELU", [added, b.const("slope", _slope(rng, units, (1, 1, units)))])
    elif after:
        added = b.op(after, [added])
    b.output(added)
    return b.to_bytes()


@NATIVE
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("units", [3, 8, 40])  # below half a vector of the packed products, half one, a tail panel
@pytest.mark.parametrize("conv_first, add_activation", [(True, "NONE"), (False, "RELU6"), (True, "NONE+RELU"),
                                                        (False, "NONE+PRELU")])
def test_float_residual_add_runs_in_the_convolution(native, kernel, units, conv_first, add_activation):
    """The float ADD of a convolution's result and an earlier one runs in that convolution: added in the
    native loops' epilogue as each tile is stored (its activation after it, a separate clamp or PReLU after
    the ADD included), or after the convolution."""
    rng = np.random.default_rng(kernel + units)
    model = _residual_block(rng, kernel, units, conv_first, add_activation)
    bound = []
    spied = NativeLoops.bind

    def spy(self, call, *arrays):
        bound.append((call.symbol, len(arrays)))
        return spied(self, call, *arrays)
    with mock.patch.object(NativeLoops, "bind", spy):
        _check(model, [_normal(rng, (1, 9, 7, 24))], native, {"2": 1, "3": 1} if "+" in add_activation else {"2": 1})
    adding = {symbol for symbol, arrays in bound if arrays == 3 and symbol in ("packed_product", "conv_prepared")}
    packs = native and native_loops() is not None
    assert adding == ({"conv_prepared" if kernel == 3 else "packed_product"} if packs else set())


GATE_GRIDS = {("LOGISTIC", "int8"): (1 / 256, -128), ("TANH", "int8"): (1 / 128, 0),
              ("LOGISTIC", "int16"): (1 / 32768, 0), ("TANH", "int16"): (1 / 32768, 0)}


@NATIVE
@pytest.mark.parametrize("dtype, shape, quant", [("int8", (1, 4, 8, 8), (0.06, -5)),
                                                 ("int16", (1, 16, 64, 64), (0.0004, 0))])
@pytest.mark.parametrize("gate, swapped", [("LOGISTIC", False), ("TANH", True)])
def test_a_quantized_swish_is_one_table(native, dtype, shape, quant, gate, swapped):
    """x * LOGISTIC(x) (or TANH), on 8- or 16-bit tensors and every value of the type: the MUL runs inside the
    table op, whose one table holds the MUL's results for every input (looked up by the native loops, or by
    numpy without them), LiteRT's builtin kernels' bit for bit."""
    b = GraphBuilder()
    x = b.input("x", shape, dtype, quant=quant)
    gated = b.op(gate, [x], dtype=dtype, quant=GATE_GRIDS[gate, dtype])
    b.output(b.op("MUL", [gated, x] if swapped else [x, gated], dtype=dtype, quant=quant, options=NO_ACTIVATION))
    info = np.iinfo(dtype)
    every = np.random.default_rng(3).permutation(np.arange(info.min, info.max + 1)).astype(dtype).reshape(shape)
    outputs, ran_inside = _run(b.to_bytes(), [every], native)
    assert ran_inside == {"1": 0}  # the MUL ran inside the table op
    np.testing.assert_array_equal(outputs[0], litert_run(b.to_bytes(), [every], builtin=True)[0])
