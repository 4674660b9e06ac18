"""native.c's integer kernels (int8 CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, ADD, SUB, MUL, pooling,
MEAN, table lookups, SOFTMAX; 16x8 convolutions) bit-exact against LiteRT's builtin kernels, as are the numpy
formulations: builder-made edge cases, every op of the converter's quantized fixtures, the portable
C products built without AVX2 (a subprocess with DELEGATE_NATIVE_CFLAGS=-mno-avx2) and the products built
without AMX (-mno-amx-tile)."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from delegate import CompileOptions, read_model
from delegate.partition import make_partition
from delegate.plugins import default_manager
from delegate.tflite.builder import GraphBuilder
from delegate_cpu.kernels import native as native_module
from delegate_cpu.kernels.native import NativeLoops, native_loops
from tests.oputil import check_against_litert, litert, litert_run
from tests.ops.test_quantized_ops import bias, matmul_out_scale, random_q, weights

FIXTURES = Path(__file__).parents[1] / "fixtures" / "converter"
# the int8 converter fixtures that are mobile convolutional nets (tests/test_converter_models.py checks the
# LSTM and transformer ones whole)
INT8_FIXTURES = sorted(p.name for p in FIXTURES.glob("*int8*.tflite")
                       if any(op.opcode == "DEPTHWISE_CONV_2D" for op in read_model(p.read_bytes()).main.ops))
INTEGER_SYMBOLS = {"qproduct", "qconv", "qdepthwise"}  # the convolutions'
WIDE = {"CONV_2D": "wide_conv", "DEPTHWISE_CONV_2D": "qdepthwise", "FULLY_CONNECTED": "wide_product"}
# The symbols the fixtures' ops call, and the ops checked: every op of the int8 ones; the 16x8
# convolutions of the int16x8 one (LiteRT cannot run the int16x8 transformer; its int16 ADD is a numpy
# kernel one step off LiteRT's on rare ties).
FIXTURE_CALLS = {**{name: ({"qconv", "qdepthwise", "qproduct", "qbinary"}, None) for name in INT8_FIXTURES},
                 "efficientnet_lite_blocks_int16x8.tflite": ({"wide_conv", "qdepthwise"}, set(WIDE))}
seeds = st.integers(0, 2**16)
zero_points = st.sampled_from([-128, -100, 0, 37, 127])


@contextlib.contextmanager
def native_calls():
    """The prepared native calls runs make inside (by native.c symbol)."""
    if native_loops() is None:
        pytest.skip("no C compiler with OpenMP here: the native loops do not build")
    called = []
    prepared, one_call = NativeLoops.prepared, native_module._one_call

    def spy(self, call, *arrays):
        called.append(call.symbol)
        return prepared(self, call, *arrays)

    def batch_spy(loops, stretch):  # a stretch of calls run as one native call (see batched_steps)
        op, run, sources, outs = one_call(loops, stretch)
        symbols = [call.symbol for _, call, _ in stretch]

        def counted(ins, outs):
            called.extend(symbols)
            run(ins, outs)
        return op, counted, sources, outs
    with mock.patch.object(NativeLoops, "prepared", spy), mock.patch.object(native_module, "_one_call", batch_spy):
        yield called


def exact(b: GraphBuilder, x: np.ndarray, native: bool = True) -> None:
    check_against_litert(b.to_bytes(), [x], builtin=True, lsb=0, backend_options={"native": native})


def conv_model(rng, opcode, shape, out_channels, kernel, stride, dilation, padding, act, in_zero, out_zero,
               per_channel):
    b = GraphBuilder()
    in_scale = float(rng.uniform(0.01, 0.05))
    x = b.input("x", shape, "int8", quant=(in_scale, in_zero))
    c = shape[-1]
    if opcode == "DEPTHWISE_CONV_2D":
        w, scales = weights(b, rng, (1, kernel, kernel, c), 3, "int8", per_channel)
        depth, extra = kernel * kernel, {"depth_multiplier": 1}
    else:
        w, scales = weights(b, rng, (out_channels, kernel, kernel, c), 0, "int8", per_channel)
        depth, extra = kernel * kernel * c, {}
    out_quant = (matmul_out_scale(in_scale, scales, depth), out_zero)
    b.output(b.op(opcode, [x, w, bias(b, rng, in_scale, scales, per_channel)], dtype="int8", quant=out_quant,
                  options={"padding": padding, "stride_h": stride[0], "stride_w": stride[1],
                           "dilation_h_factor": dilation, "dilation_w_factor": dilation,
                           "fused_activation_function": act, **extra}))
    return b


@settings(max_examples=40, deadline=None)
@given(seed=seeds, opcode=st.sampled_from(["CONV_2D", "DEPTHWISE_CONV_2D"]), kernel=st.sampled_from([1, 2, 3, 5]),
       stride=st.sampled_from([(1, 1), (2, 2), (1, 2), (3, 1)]), dilation=st.sampled_from([1, 2]),
       padding=st.sampled_from(["SAME", "VALID"]), act=st.sampled_from(["NONE", "RELU", "RELU6"]),
       channels=st.integers(1, 37), out_channels=st.integers(1, 40), in_zero=zero_points, out_zero=zero_points,
       per_channel=st.booleans())
def test_convolutions_are_bit_exact(seed, opcode, kernel, stride, dilation, padding, act, channels,
                                    out_channels, in_zero, out_zero, per_channel):
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 3)), int(rng.integers(5, 14)), int(rng.integers(5, 14)), channels)
    if padding == "VALID" and (kernel - 1) * dilation + 1 > min(shape[1:3]):
        padding = "SAME"
    b = conv_model(rng, opcode, shape, out_channels, kernel, stride, dilation, padding, act, in_zero, out_zero,
                   per_channel)
    with native_calls() as called:
        exact(b, random_q(rng, shape))
    assert called and set(called) <= INTEGER_SYMBOLS
    exact(b, random_q(rng, shape), native=False)


@settings(max_examples=30, deadline=None)
@given(seed=seeds, depth=st.integers(1, 300), units=st.integers(1, 70), rows=st.integers(1, 9),
       in_zero=zero_points, out_zero=zero_points, per_channel=st.booleans(), act=st.sampled_from(["NONE", "RELU"]))
def test_fully_connected_is_bit_exact(seed, depth, units, rows, in_zero, out_zero, per_channel, act):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    in_scale = float(rng.uniform(0.01, 0.05))
    x = b.input("x", (rows, depth), "int8", quant=(in_scale, in_zero))
    w, scales = weights(b, rng, (units, depth), 0, "int8", per_channel)
    b.output(b.op("FULLY_CONNECTED", [x, w, bias(b, rng, in_scale, scales, per_channel)], dtype="int8",
                  quant=(matmul_out_scale(in_scale, scales, depth), out_zero),
                  options={"fused_activation_function": act}))
    x = random_q(rng, (rows, depth))
    with native_calls() as called:
        exact(b, x)
    assert called == ["qproduct"]
    exact(b, x, native=False)


@pytest.mark.parametrize("depth", [63, 64, 65, 200])  # around AMX_MIN_DEPTH, and whole and partial tiles of 64
@pytest.mark.parametrize("rows, units", [(1, 16), (15, 33), (17, 48), (40, 100)])  # partial row tiles and panels
def test_products_around_the_tile_sizes_are_bit_exact(depth, rows, units):
    """Products by AMX tiles where the machine has them (16 rows, 64 depths, two panels at a time), by VNNI or
    AVX2 elsewhere: every edge of a tile, bit for bit."""
    rng = np.random.default_rng(depth * rows + units)
    b = GraphBuilder()
    in_scale = float(rng.uniform(0.01, 0.05))
    x = b.input("x", (rows, depth), "int8", quant=(in_scale, 11))
    w, scales = weights(b, rng, (units, depth), 0, "int8", True)
    b.output(b.op("FULLY_CONNECTED", [x, w, bias(b, rng, in_scale, scales, True)], dtype="int8",
                  quant=(matmul_out_scale(in_scale, scales, depth), -3), options={"fused_activation_function": "NONE"}))
    x = random_q(rng, (rows, depth))
    with native_calls() as called:
        exact(b, x)
    assert called == ["qproduct"]


@pytest.mark.parametrize("spread", [0.3, 1.0, 3.0])  # output scales from all multipliers above 1 to all below
def test_products_whose_rescale_shifts_left_are_bit_exact(spread):
    """Per-channel rescale multipliers above 1 (a left shift before the fixed-point multiply) and below it
    in one FULLY_CONNECTED: the products' output stage takes both (the register path leaves the left
    shift out only where every channel's is 0)."""
    rng = np.random.default_rng(int(spread * 10))
    b = GraphBuilder()
    in_scale, depth, units = 0.05, 24, 40
    x = b.input("x", (9, depth), "int8", quant=(in_scale, 3))
    w, scales = weights(b, rng, (units, depth), 0, "int8", True)
    out_scale = spread * in_scale * float(np.median(scales))  # multipliers 1/spread x scales/median
    b.output(b.op("FULLY_CONNECTED", [x, w, bias(b, rng, in_scale, scales, True)], dtype="int8",
                  quant=(out_scale, -5), options={"fused_activation_function": "NONE"}))
    inputs = random_q(rng, (9, depth))
    with native_calls() as called:
        exact(b, inputs)
    assert called == ["qproduct"]
    exact(b, inputs, native=False)


@pytest.mark.parametrize("opcode", ["CONV_2D", "DEPTHWISE_CONV_2D"])
@pytest.mark.parametrize("shifts, largest", [((1, 8), 3), ((15, 22), 127), ((19, 26), 127)])
def test_rescales_of_every_right_shift_are_bit_exact(opcode, shifts, largest):
    """Per-channel rescales of right shifts from shifts[0] to shifts[1]: all within the products' one-shift
    output stage (right shifts 1 to 22, native.c's single_shift), or some past it (the stage's steps in turn);
    inputs and weights up to ``largest`` in magnitude, so that the outputs stay inside the clamp and the short
    shifts' ties come up often."""
    rng = np.random.default_rng(shifts[1])
    b = GraphBuilder()
    channels, in_scale = 24, 0.02
    x = b.input("x", (1, 6, 7, channels), "int8", quant=(in_scale, 0))
    depthwise = opcode == "DEPTHWISE_CONV_2D"
    shape, axis = ((1, 3, 3, channels), 3) if depthwise else ((channels, 1, 1, channels), 0)
    exponents = np.linspace(shifts[0], shifts[1], channels).round()
    scales = (2.0 ** -exponents * rng.uniform(0.55, 0.95, channels)).astype(np.float32)
    w = b.const("w", rng.integers(-largest, largest, shape, endpoint=True).astype(np.int8),
                quant=(scales, np.zeros(channels, np.int64), axis))
    bias_tensor = b.const("bias", rng.integers(-3, 4, channels).astype(np.int32),
                          quant=((np.float32(in_scale) * scales).astype(np.float32), np.zeros(channels, np.int64), 0))
    b.output(b.op(opcode, [x, w, bias_tensor], dtype="int8", quant=(in_scale, 3),
                  options={"padding": "SAME", "stride_h": 1, "stride_w": 1,
                           **({"depth_multiplier": 1} if depthwise else {})}))
    inputs = rng.integers(-largest - (largest == 127), largest, (1, 6, 7, channels), endpoint=True).astype(np.int8)
    with native_calls() as called:
        exact(b, inputs)
    assert called == (["qdepthwise"] if depthwise else ["qproduct"])


def test_extreme_inputs_and_weights_are_exact():
    """Every input at -128 or 127 and weights at -127 / 127: the largest products and sums."""
    rng = np.random.default_rng(7)
    with native_calls() as called:
        _extremes(rng)
    assert set(called) == {"qconv", "qdepthwise"}


@pytest.mark.parametrize("in_zero", [-110, 0])  # -110: the zero point's fold takes the bias past int32
@pytest.mark.parametrize("opcode", ["FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D"])
def test_sums_past_int32_wrap_as_litert_does(opcode, in_zero):
    """Biases at the ends of int32 (a fuzzed classifier's -2^31): LiteRT adds them to the int32 sums, which wrap
    around; both formulations give what it gives."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    shape = (1, 64) if opcode == "FULLY_CONNECTED" else (1, 5, 5, 8)
    x = b.input("x", shape, "int8", quant=(0.02, in_zero))
    w_shape = {"FULLY_CONNECTED": (10, 64), "CONV_2D": (10, 3, 3, 8), "DEPTHWISE_CONV_2D": (1, 3, 3, 8)}[opcode]
    axis = 3 if opcode == "DEPTHWISE_CONV_2D" else 0
    scales = rng.uniform(0.002, 0.02, w_shape[axis]).astype(np.float32)
    w = b.const("w", rng.integers(-127, 128, w_shape).astype(np.int8), quant=(scales, np.zeros(w_shape[axis]), axis))
    ends = np.resize(np.array([-2 ** 31, 2 ** 31 - 1, -2 ** 31 + 5, 0], np.int64), w_shape[axis]).astype(np.int32)
    bias_t = b.const("b", ends, quant=(0.02 * scales, np.zeros(w_shape[axis]), 0))
    options = {"FULLY_CONNECTED": {}, "CONV_2D": {"padding": "SAME", "stride_h": 1, "stride_w": 1},
               "DEPTHWISE_CONV_2D": {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1}}[opcode]
    b.output(b.op(opcode, [x, w, bias_t], dtype="int8", quant=(0.05, 3), options=options))
    for native in (True, False):
        exact(b, random_q(rng, shape), native=native)


@pytest.mark.parametrize("native", [True, False])
def test_integer_lstm_gate_sums_past_int32_wrap_as_litert_does(native):
    """The converter's int8 LSTM with one gate bias at -2^31 (a fuzzed case): LiteRT's gate sums are int32 and
    wrap; both formulations give what its builtin kernels give."""
    from delegate.plugin_api import write_model

    model = read_model((FIXTURES / "lstm_sequence_int8.tflite").read_bytes())
    lstm = next(op for op in model.main.ops if op.opcode == "UNIDIRECTIONAL_SEQUENCE_LSTM")
    bias = next(t for t in lstm.inputs if t is not None and t.data is not None and t.dtype.name == "int32")
    values = np.array(bias.data, np.int32)
    values[: values.size // 2] = -2 ** 31
    bias.data = values
    model.main.serialized = None
    x = model.main.inputs[0]
    rng = np.random.default_rng(1)
    check_against_litert(write_model(model), [rng.integers(-128, 128, x.shape).astype(np.int8)], builtin=True,
                         lsb=0, backend_options={"native": native})


@pytest.mark.parametrize("native", [True, False])
def test_16x8_results_past_int32_wrap_as_litert_does(native):
    """The converter's int16x8 EfficientNet blocks with a convolution's int64 biases at 2^40 (a fuzzed case): LiteRT's
    64-bit rescale casts its result to int32, which wraps; both formulations give what its builtin kernels give."""
    from delegate.plugin_api import write_model

    model = read_model((FIXTURES / "efficientnet_lite_blocks_int16x8.tflite").read_bytes())
    conv = next(op for op in model.main.ops if op.opcode == "CONV_2D" and op.input(2) is not None
                and op.input(2).dtype.name == "int64" and op.inputs[1].shape[1:3] == (1, 1))
    values = np.array(conv.inputs[2].data, np.int64)
    values[::2] = 2 ** 40
    conv.inputs[2].data = values
    model.main.serialized = None
    x = model.main.inputs[0]
    rng = np.random.default_rng(2)
    check_against_litert(write_model(model), [rng.integers(-32768, 32768, x.shape).astype(np.int16)], builtin=True,
                         lsb=0, backend_options={"native": native})


def _extremes(rng):
    for opcode in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        b = GraphBuilder()
        x = b.input("x", (1, 9, 9, 19), "int8", quant=(0.02, -128))
        shape = (1, 3, 3, 19) if opcode == "DEPTHWISE_CONV_2D" else (21, 3, 3, 19)
        axis = 3 if opcode == "DEPTHWISE_CONV_2D" else 0
        scales = rng.uniform(0.002, 0.02, shape[axis]).astype(np.float32)
        w = b.const("w", rng.choice(np.array([-127, 127], np.int8), shape), quant=(scales, np.zeros(shape[axis]), axis))
        b.output(b.op(opcode, [x, w, bias(b, rng, 0.02, scales)], dtype="int8", quant=(4.0, 127),
                      options={"padding": "SAME", "stride_h": 1, "stride_w": 1,
                               **({"depth_multiplier": 1} if axis == 3 else {})}))
        exact(b, rng.choice(np.array([-128, 127], np.int8), (1, 9, 9, 19)))


@settings(max_examples=40, deadline=None)
@given(seed=seeds, opcode=st.sampled_from(["ADD", "SUB", "MUL"]), size=st.integers(1, 70), zeros=st.tuples(
    zero_points, zero_points, zero_points), scales=st.tuples(*[st.floats(0.002, 0.2)] * 3),
       act=st.sampled_from(["NONE", "RELU", "RELU6"]), row=st.sampled_from([None, (11,), (1, 1, 11), (1,)]))
def test_add_sub_mul_are_bit_exact(seed, opcode, size, zeros, scales, act, row):
    """Flat loops with LiteRT's vector blocks of 16 and their scalar tail, every zero point; MUL by one
    row of the last axis, or by one item."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    shape = (1, size, 11)
    row = row if opcode == "MUL" else None
    x = b.input("x", shape, "int8", quant=(scales[0], zeros[0]))
    y = b.input("y", row or shape, "int8", quant=(scales[1], zeros[1]))
    b.output(b.op(opcode, [x, y], dtype="int8", quant=(scales[2], zeros[2]),
                  options={"fused_activation_function": act}))
    inputs = [random_q(rng, shape), random_q(rng, row or shape)]
    for native in (True, False):
        with native_calls() as called:
            check_against_litert(b.to_bytes(), inputs, builtin=True, lsb=0, backend_options={"native": native})
        assert called == (["qbinary"] if native else [])


@pytest.mark.parametrize("kernel", [3, 5])
@pytest.mark.parametrize("channels", [16, 20, 33])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_depthwise_rows_of_a_stride_one_filter_are_bit_exact(kernel, channels, padding):
    """A depthwise filter 3 or 5 wide at stride 1: interior pixels four at a time take each filter row's inputs
    once for its taps (AVX-512), border pixels and the last few the taps one by one; channels in whole and
    masked blocks of 16, the input zero point and per-channel scales as the converter writes them."""
    rng = np.random.default_rng(kernel * 100 + channels)
    shape = (1, 14, 17, channels)
    b = conv_model(rng, "DEPTHWISE_CONV_2D", shape, channels, kernel, (1, 1), 1, padding, "RELU6", -37, 11, True)
    with native_calls() as called:
        exact(b, random_q(rng, shape))
    assert called == ["qdepthwise"]


@pytest.mark.parametrize("channels", [16, 24, 40])
def test_mul_by_a_row_over_many_spans_is_bit_exact(channels):
    """A squeeze-excitation's MUL by one row of channel scales: the row is repeated into spans of ~4096 items
    (whole rows), many of them, the last one shorter."""
    rng = np.random.default_rng(channels)
    shape, row = (1, 45, 37, channels), (1, 1, 1, channels)
    b = GraphBuilder()
    x = b.input("x", shape, "int8", quant=(0.03, 5))
    y = b.input("y", row, "int8", quant=(0.004, -128))
    b.output(b.op("MUL", [x, y], dtype="int8", quant=(0.02, -3)))
    inputs = [random_q(rng, shape), random_q(rng, row)]
    with native_calls() as called:
        check_against_litert(b.to_bytes(), inputs, builtin=True, lsb=0)
    assert called == ["qbinary"]


@settings(max_examples=30, deadline=None)
@given(seed=seeds, opcode=st.sampled_from(["MAX_POOL_2D", "AVERAGE_POOL_2D"]), window=st.sampled_from([1, 2, 3, 5]),
       stride=st.sampled_from([1, 2, 3]), padding=st.sampled_from(["SAME", "VALID"]),
       act=st.sampled_from(["NONE", "RELU", "RELU6"]), channels=st.integers(1, 33), zero=zero_points)
def test_pooling_is_bit_exact(seed, opcode, window, stride, padding, act, channels, zero):
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 3)), int(rng.integers(5, 12)), int(rng.integers(5, 12)), channels)
    b = GraphBuilder()
    x = b.input("x", shape, "int8", quant=(0.03, zero))
    b.output(b.op(opcode, [x], dtype="int8", quant=(0.03, zero), options={
        "padding": padding, "stride_h": stride, "stride_w": stride, "filter_height": window, "filter_width": window,
        "fused_activation_function": act}))
    inputs = random_q(rng, shape)
    with native_calls() as called:
        exact(b, inputs)
    assert called == ["qpool"]
    exact(b, inputs, native=False)


@settings(max_examples=30, deadline=None)
@given(seed=seeds, keep_dims=st.booleans(), channels=st.integers(1, 40), zeros=st.tuples(zero_points, zero_points),
       ratio=st.floats(0.3, 3.0))
def test_spatial_mean_is_bit_exact(seed, keep_dims, channels, zeros, ratio):
    """LiteRT's HxW path (keep_dims: ties up on whole blocks of 16 channels) and its generic one."""
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(1, 9)), channels)
    b = GraphBuilder()
    x = b.input("x", shape, "int8", quant=(0.02, zeros[0]))
    b.output(b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": keep_dims},
                  dtype="int8", quant=(0.02 * ratio, zeros[1])))
    inputs = random_q(rng, shape)
    with native_calls() as called:
        exact(b, inputs)
    assert called == ["qmean"]
    exact(b, inputs, native=False)


@pytest.mark.parametrize("dtype, opcode", [("int8", "LOGISTIC"), ("uint8", "TANH"), ("int8", "GELU")])
def test_table_lookups_are_bit_exact(dtype, opcode):
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    zero = -5 if dtype == "int8" else 131
    x = b.input("x", (4, 77), dtype, quant=(0.04, zero))
    out_quant = (1 / 256, -128 if dtype == "int8" else 0) if opcode == "LOGISTIC" else (1 / 128, zero)
    b.output(b.op(opcode, [x], dtype=dtype, quant=out_quant))
    info = np.iinfo(dtype)  # every value once (vector blocks of 32 or 64 and the scalar tail), in random places
    every = np.arange(info.min, info.max + 1).astype(dtype)
    inputs = rng.permutation(np.concatenate([every, random_q(rng, 4 * 77 - every.size, dtype)])).reshape(4, 77)
    with native_calls() as called:
        exact(b, inputs)
    assert called == ["qlookup"]
    exact(b, inputs, native=False)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, beta=st.sampled_from([1.0, 0.35, 2.0]), depth=st.integers(1, 70), rows=st.integers(1, 4),
       in_zero=zero_points, in_scale=st.floats(0.01, 0.5))
def test_softmax_is_bit_exact(seed, beta, depth, rows, in_zero, in_scale):
    """int8 SOFTMAX (LiteRT's table kernel; its output is always 1/256 at -128) natively and in numpy."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (rows, depth), "int8", quant=(in_scale, in_zero))
    b.output(b.op("SOFTMAX", [x], dtype="int8", quant=(1 / 256, -128), options={"beta": beta}))
    inputs = random_q(rng, (rows, depth))
    with native_calls() as called:
        exact(b, inputs)
    assert called == ["qsoftmax"]
    exact(b, inputs, native=False)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, opcode=st.sampled_from(["CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"]),
       bias_type=st.sampled_from(["INT64", "INT32"]), kernel=st.sampled_from([1, 3]), stride=st.sampled_from([1, 2]),
       padding=st.sampled_from(["SAME", "VALID"]), channels=st.integers(1, 19), units=st.integers(1, 21),
       act=st.sampled_from(["NONE", "RELU", "RELU6"]))
def test_16x8_layers_are_bit_exact(seed, opcode, bias_type, kernel, stride, padding, channels, units, act):
    """int16 activations with int8 weights: int64 biases take LiteRT's reference rescale, int32 ones ruy's
    (FULLY_CONNECTED's reference rescale in double stays with numpy)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    in_scale = float(rng.uniform(0.01, 0.05)) / 256
    options = {"fused_activation_function": act}
    if opcode == "FULLY_CONNECTED":
        shape, w_shape, axis, depth = (3, channels), (units, channels), 0, channels
    else:
        shape = (1, int(rng.integers(5, 11)), int(rng.integers(5, 11)), channels)
        depthwise = opcode == "DEPTHWISE_CONV_2D"
        w_shape, axis = ((1, kernel, kernel, channels), 3) if depthwise else ((units, kernel, kernel, channels), 0)
        depth = kernel * kernel * (1 if depthwise else channels)
        options.update(padding=padding, stride_h=stride, stride_w=stride)
        if depthwise:
            options["depth_multiplier"] = 1
            bias_type = "INT64"  # LiteRT's 16x8 depthwise reads int64 biases only
    if bias_type == "INT32":
        options["quantized_bias_type"] = 2  # TensorType INT32
    x = b.input("x", shape, "int16", quant=(in_scale, 0))
    w, scales = weights(b, rng, w_shape, axis)
    bias_tensor = bias(b, rng, in_scale, scales, dtype=np.int64 if bias_type == "INT64" else np.int32)
    b.output(b.op(opcode, [x, w, bias_tensor], options=options, dtype="int16",
                  quant=(matmul_out_scale(in_scale, scales, depth, "int16"), 0)))
    inputs = random_q(rng, shape, "int16")
    with native_calls() as called:
        exact(b, inputs)
    reference_fc = opcode == "FULLY_CONNECTED" and bias_type == "INT64"
    assert called == ([] if reference_fc else [WIDE[opcode]])
    exact(b, inputs, native=False)


def residual_block(rng, kernel: int, conv_first: bool, add_zero: int):
    """x -> 1x1 CONV_2D (y) -> CONV_2D of ``kernel`` (z) -> ADD of z and y (z first or second): the
    residual connection of MobileNetV2's blocks; the ADD on its own scales and zero point."""
    b = GraphBuilder()
    x = b.input("x", (1, 7, 6, 5), "int8", quant=(0.03, 7))
    y, z = x, None
    for name, k, c_in, c_out in (("y", 1, 5, 12), ("z", kernel, 12, 12)):
        w, scales = weights(b, rng, (c_out, k, k, c_in), 0, "int8", True)
        in_scale = 0.03 if name == "y" else 0.05
        out = b.op("CONV_2D", [y if name == "z" else x, w, bias(b, rng, in_scale, scales)], dtype="int8",
                   quant=(0.05 if name == "y" else 0.08, -3 if name == "y" else 11),
                   options={"padding": "SAME", "stride_h": 1, "stride_w": 1})
        y, z = (out, z) if name == "y" else (y, out)
    b.output(b.op("ADD", [z, y] if conv_first else [y, z], dtype="int8", quant=(0.1, add_zero),
                  options={"fused_activation_function": "RELU"}))
    return b


@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("conv_first", [True, False])
def test_residual_add_runs_in_the_convolution(kernel, conv_first):
    """The ADD of a convolution's result and an earlier one is fused into that convolution (qproduct for
    1x1, qconv else) and stays bit-exact, natively and through the numpy kernels in turn."""
    rng = np.random.default_rng(kernel + 2 * conv_first)
    b = residual_block(rng, kernel, conv_first, -20)
    g = read_model(b.to_bytes()).main
    compiled = default_manager().backend_info("cpu").factory({}).compile(make_partition(g, g.ops, "cpu", 0),
                                                                         CompileOptions())
    assert compiled.fused == {2: 1}
    inputs = random_q(rng, (1, 7, 6, 5))
    with native_calls() as called:
        exact(b, inputs)
    assert called == ["qproduct", "qproduct" if kernel == 1 else "qconv"]
    exact(b, inputs, native=False)


@pytest.mark.parametrize("window, symbols", [(22, ["qdepthwise"]), (23, [])])
def test_16x8_depthwise_sums_stay_in_int32(window, symbols):
    """qdepthwise sums in int32: a 22x22 window of extreme int16 inputs and weights still fits (native), a
    23x23 one could overflow and takes the numpy formulation; both exact."""
    rng = np.random.default_rng(window)
    b = GraphBuilder()
    in_scale, w_scale = 0.0002, 0.01
    x = b.input("x", (1, 23, 23, 3), "int16", quant=(in_scale, 0))
    w = b.const("w", rng.choice(np.array([-127, 127], np.int8), (1, window, window, 3)), quant=(w_scale, 0))
    bias_tensor = b.const("bias", np.zeros(3, np.int64), quant=(in_scale * w_scale, 0))
    b.output(b.op("DEPTHWISE_CONV_2D", [x, w, bias_tensor], dtype="int16", quant=(in_scale * w_scale * 2e9 / 32767, 0),
                  options={"padding": "VALID", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1}))
    inputs = rng.choice(np.array([-32768, 32767], np.int16), (1, 23, 23, 3))
    with native_calls() as called:
        exact(b, inputs)
    assert called == symbols


@pytest.mark.parametrize("name", sorted(FIXTURE_CALLS))
def test_every_op_of_the_quantized_fixtures_is_bit_exact(name):
    """Each op on LiteRT's own intermediate tensors, alone."""
    data = (FIXTURES / name).read_bytes()
    it = litert.Interpreter(model_content=data, experimental_preserve_all_tensors=True,
                            experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    rng = np.random.default_rng(0)
    for d in it.get_input_details():
        it.set_tensor(d["index"], random_q(rng, d["shape"], d["dtype"]))
    it.invoke()
    g = read_model(data).main
    backend = default_manager().backend_info("cpu").factory({})
    checked, calls = 0, native_calls()
    called = calls.__enter__()
    symbols, opcodes = FIXTURE_CALLS[name]
    for op in g.ops:
        if opcodes is not None and op.opcode not in opcodes:
            continue
        compiled = backend.compile(make_partition(g, [op], "cpu", 0), CompileOptions())
        out = compiled.run({t.index: it.get_tensor(t.index) for t in make_partition(g, [op], "cpu", 0).inputs})
        np.testing.assert_array_equal(out[op.outputs[0].index], it.get_tensor(op.outputs[0].index),
                                      err_msg=op.describe())
        checked += 1
    calls.__exit__(None, None, None)
    assert checked >= 5 and symbols <= set(called)


BUILD_RUN = """
import sys
import numpy as np
from delegate_cpu.kernels.native import native_loops
from tests.ops import test_integer_kernels as t
loops = native_loops()
assert eval(sys.argv[1]), (loops.integer_isa, loops.integer_amx)
rng = np.random.default_rng(3)
channels, step = int(sys.argv[2]), int(sys.argv[3])
for opcode, kernel, stride in (("CONV_2D", 3, (2, 2)), ("CONV_2D", 1, (1, 1)), ("DEPTHWISE_CONV_2D", 3, (step, step))):
    b = t.conv_model(rng, opcode, (1, 11, 10, channels), 21, kernel, stride, 1, "SAME", "RELU", -128, 5, True)
    t.exact(b, t.random_q(rng, (1, 11, 10, channels)))
print("exact")
"""


@pytest.mark.parametrize("flags, built, channels, depthwise_stride", [
    ("-mno-avx2 -mno-avx512f", "loops.integer_isa == 'portable'", 13, 1),  # machines without AVX2
    # machines without AMX: VNNI where they have AVX-512 VNNI (3x3 products of 360 depths), else AVX2 or portable C
    ("-mno-amx-tile -mno-amx-int8", "not loops.integer_amx", 40, 2)], ids=["portable", "without_amx"])
def test_products_as_other_machines_build_them_are_bit_exact(tmp_path, flags, built, channels, depthwise_stride):
    """The native loops built with ``flags`` (a subprocess with DELEGATE_NATIVE_CFLAGS), bit for bit LiteRT's."""
    env = {**os.environ, "DELEGATE_NATIVE_CFLAGS": flags, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", BUILD_RUN, built, str(channels), str(depthwise_stride)],
                          cwd=Path(__file__).parents[2], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "exact" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("name", INT8_FIXTURES)
def test_whole_int8_fixtures_run_in_few_native_calls(name):
    """A partition's stretches of integer kernels run as one native call each, bit-exact end to end."""
    if native_loops() is None:
        pytest.skip("no C compiler with OpenMP here: the native loops do not build")
    data = (FIXTURES / name).read_bytes()
    g = read_model(data).main
    compiled = default_manager().backend_info("cpu").factory({}).compile(make_partition(g, g.ops, "cpu", 0),
                                                                         CompileOptions())
    assert len(compiled.batched) * 2 < len(compiled.steps)
    rng = np.random.default_rng(1)
    inputs = [random_q(rng, t.shape, t.dtype.numpy) for t in g.inputs]
    expected = litert_run(data, inputs, builtin=True)
    for _ in range(2):  # the bound buffers are reused run after run
        out = compiled.run({t.index: x for t, x in zip(g.inputs, inputs)})
        for t, e in zip(g.outputs, expected):
            np.testing.assert_array_equal(out[t.index], e)


def test_profiled_runs_time_each_op_inside_the_batched_call():
    """Per-op times are those of the run that really happens: the batched native call times each of its
    ops (the Python call per op, timed before, cost more than most of these kernels), every op gets a
    time, and the outputs are those of an unprofiled run."""
    if native_loops() is None:
        pytest.skip("no C compiler with OpenMP here: the native loops do not build")
    data = (FIXTURES / "efficientnet_lite_blocks_int8.tflite").read_bytes()
    g = read_model(data).main
    compiled = default_manager().backend_info("cpu").factory({}).compile(make_partition(g, g.ops, "cpu", 0),
                                                                         CompileOptions())
    stretches = [run for _, run, _, _ in compiled.batched if hasattr(run, "timed")]
    assert stretches and sum(len(run.ops) for run in stretches) * 2 > len(compiled.steps)
    inputs = {t.index: random_q(np.random.default_rng(2), t.shape, t.dtype.numpy) for t in g.inputs}
    plain = {i: v.copy() for i, v in compiled.run(inputs).items()}
    compiled.set_profiling(True)
    profiled = compiled.run(inputs)
    times = compiled.profile()
    compiled.set_profiling(False)
    assert set(times) == {op.index for op, *_ in compiled.steps} and all(ms >= 0 for ms in times.values())
    assert sum(times.values()) > 0
    for i, v in plain.items():
        np.testing.assert_array_equal(profiled[i], v)
