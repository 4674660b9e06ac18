"""The CPU backend's blocked kernels: layers large enough to be split into row bands, unit slices
and im2col bands over two threads, float and quantized, against LiteRT (quantized bit for bit),
with the native loops and with the numpy formulations alone (``cpu: {native: false}``),
and the one-division fixed-point rescale against gemmlowp's step-by-step arithmetic."""

import numpy as np
import pytest

from delegate import CompileOptions
from delegate.tflite.builder import GraphBuilder
from delegate_cpu.kernels.quant_util import (
    Rescale, Requantize, lane_rounding, multiply_by_quantized_multiplier, multiply_half_up,
    rounding_divide_by_pot, saturating_rounding_doubling_high_mul, vector_lanes)
from tests.oputil import check_against_litert
from tests.ops.test_quantized_ops import activation_quant, bias, matmul_out_scale, random_q, weights

TWO_THREADS = CompileOptions(num_threads=2)
NATIVE = pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])


def _float_layer(opcode, x_shape, w, options):
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", x_shape)
    units = w.shape[-1] if opcode == "DEPTHWISE_CONV_2D" else w.shape[0]
    b.output(b.op(opcode, [x, b.const("w", w), b.const("b", rng.standard_normal(units).astype(np.float32))],
                  options=options))
    return b.to_bytes(), [rng.standard_normal(x_shape).astype(np.float32)]


@pytest.mark.parametrize("x_shape, w_shape, stride, threads", [
    ((1, 56, 56, 24), (144, 1, 1, 24), 1, 2),    # row bands of a 1x1 convolution
    ((1, 7, 7, 320), (1280, 1, 1, 320), 1, 2),   # unit slices of a short, wide product
    ((2, 40, 40, 16), (32, 3, 3, 16), 2, 2),     # im2col bands, two images
    ((1, 300, 300, 8), (16, 3, 3, 8), 1, 1),     # im2col bands bounded by scratch on one thread
])
@NATIVE
def test_float_conv_blocks(x_shape, w_shape, stride, threads, native):
    w = np.random.default_rng(1).standard_normal(w_shape).astype(np.float32)
    model, inputs = _float_layer("CONV_2D", x_shape, w, {"padding": "SAME", "stride_h": stride, "stride_w": stride,
                                                         "fused_activation_function": "RELU6"})
    check_against_litert(model, inputs, options=CompileOptions(num_threads=threads),
                         backend_options={"native": native})


@pytest.mark.parametrize("x_shape, k, stride", [((1, 64, 64, 24), 3, 1), ((1, 96, 96, 32), 5, 2),
                                                ((2, 33, 31, 20), 3, 2)])
@NATIVE
def test_float_depthwise_bands(x_shape, k, stride, native):
    w = np.random.default_rng(2).standard_normal((1, k, k, x_shape[-1])).astype(np.float32)
    model, inputs = _float_layer("DEPTHWISE_CONV_2D", x_shape, w, {"padding": "SAME", "stride_h": stride,
                                                                   "stride_w": stride, "depth_multiplier": 1})
    check_against_litert(model, inputs, options=TWO_THREADS, backend_options={"native": native})


@NATIVE
def test_float_fully_connected_unit_slices(native):
    w = np.random.default_rng(3).standard_normal((1000, 2048)).astype(np.float32)
    model, inputs = _float_layer("FULLY_CONNECTED", (4, 2048), w, {})
    check_against_litert(model, inputs, options=TWO_THREADS, backend_options={"native": native})


def _quantized_layer(opcode, x_shape, w_shape, axis, options, dtype="int8", extreme=False):
    rng = np.random.default_rng(4)
    b = GraphBuilder()
    in_quant = activation_quant(rng, dtype)
    x = b.input("x", x_shape, dtype, quant=in_quant)
    if extreme:  # every weight at the int8 limits: sums too wide for exact float32
        scales = np.full(w_shape[axis], 0.01, np.float32)
        w = b.const("w", np.where(rng.random(w_shape) < 0.5, -127, 127).astype(np.int8),
                    quant=(scales, np.zeros(scales.size, np.int64), axis))
    else:
        w, scales = weights(b, rng, w_shape, axis, dtype)
    depth = int(np.prod(w_shape)) // w_shape[axis]
    out_quant = (matmul_out_scale(in_quant[0], scales, depth), activation_quant(rng, dtype)[1])
    b.output(b.op(opcode, [x, w, bias(b, rng, in_quant[0], scales)], dtype=dtype, quant=out_quant, options=options))
    return b.to_bytes(), [random_q(rng, x_shape, dtype)]


@pytest.mark.parametrize("x_shape, w_shape, stride, extreme", [
    ((1, 56, 56, 24), (144, 1, 1, 24), 1, False),
    ((1, 7, 7, 320), (1280, 1, 1, 320), 1, False),
    ((1, 30, 30, 16), (32, 3, 3, 16), 2, False),
    ((1, 7, 7, 1000), (64, 1, 1, 1000), 1, True),  # float64 products
])
@NATIVE
def test_quantized_conv_blocks(x_shape, w_shape, stride, extreme, native):
    model, inputs = _quantized_layer("CONV_2D", x_shape, w_shape, 0, {"padding": "SAME", "stride_h": stride,
                                                                      "stride_w": stride,
                                                                      "fused_activation_function": "RELU6"},
                                     extreme=extreme)
    check_against_litert(model, inputs, builtin=True, lsb=0, options=TWO_THREADS,
                         backend_options={"native": native})


@pytest.mark.parametrize("dtype, x_shape, w_shape", [
    ("int8", (1, 7, 7, 576), (160, 3, 3, 576)),   # narrow, but its operand converted whole would pass BLOCK_SCRATCH
    ("uint8", (1, 5, 5, 64), (96, 1, 1, 64)),     # per-tensor weights with a zero point
])
def test_quantized_short_products_convert_stored_weights_by_block(dtype, x_shape, w_shape):
    """Few-row products keep their weights as stored and convert one block of units at a time."""
    model, inputs = _quantized_layer("CONV_2D", x_shape, w_shape, 0, {"padding": "SAME", "stride_h": 1,
                                                                      "stride_w": 1}, dtype)
    check_against_litert(model, inputs, builtin=True, lsb=0, options=TWO_THREADS)


@pytest.mark.parametrize("dtype, channels, stride", [("int8", 20, 1), ("int8", 96, 2), ("uint8", 20, 2)])
@NATIVE
def test_quantized_depthwise_bands(dtype, channels, stride, native):
    """int8 rounds ties up on whole groups of 8 channels and away from zero on the rest; uint8 away."""
    model, inputs = _quantized_layer("DEPTHWISE_CONV_2D", (1, 64, 64, channels), (1, 3, 3, channels), 3,
                                     {"padding": "SAME", "stride_h": stride, "stride_w": stride,
                                      "depth_multiplier": 1}, dtype)
    check_against_litert(model, inputs, builtin=True, lsb=0, options=TWO_THREADS,
                         backend_options={"native": native})


@NATIVE
def test_quantized_fully_connected_unit_slices(native):
    model, inputs = _quantized_layer("FULLY_CONNECTED", (4, 2048), (1000, 2048), 0, {})
    check_against_litert(model, inputs, builtin=True, lsb=0, options=TWO_THREADS,
                         backend_options={"native": native})


# --- fixed point --------------------------------------------------------------------------------

def _gemmlowp_high_mul(a: int, b: int) -> int:
    """Step by step, in Python integers: nudge by the product's sign, truncate toward zero."""
    if a == b == -(1 << 31):
        return (1 << 31) - 1
    product = a * b
    nudged = product + ((1 << 30) if product >= 0 else 1 - (1 << 30))
    quotient = abs(nudged) // (1 << 31)
    return quotient if nudged >= 0 else -quotient


def _rounding_shift(x: int, exponent: int) -> int:
    """x / 2**exponent, ties away from zero."""
    mask = (1 << exponent) - 1
    return (x >> exponent) + ((x & mask) > (mask >> 1) + (x < 0))


def test_fixed_point_helpers_match_gemmlowp_steps():
    rng = np.random.default_rng(5)
    a = np.concatenate([rng.integers(-(1 << 31), 1 << 31, 3000), [-(1 << 31), (1 << 31) - 1, 0, -1, 1]])
    b = np.concatenate([rng.integers(-(1 << 31), 1 << 31, 3000), [-(1 << 31), -(1 << 31), 1 << 30, 1 << 30, 1 << 30]])
    expected = [_gemmlowp_high_mul(int(x), int(y)) for x, y in zip(a, b)]
    assert saturating_rounding_doubling_high_mul(a, b).tolist() == expected
    x = np.concatenate([rng.integers(-(1 << 40), 1 << 40, 2000), np.arange(-70, 70)])
    for exponent in (0, 1, 2, 5, 31):
        assert rounding_divide_by_pot(x, exponent).tolist() == [_rounding_shift(int(v), exponent) for v in x]


@pytest.mark.parametrize("seed", range(8))
def test_rescale_matches_step_by_step_requantize(seed):
    """Per-channel multipliers from 2**-24 to 4 (and exact powers of two, where ties abound), the three
    roundings, bias and zero point folded in, one shift for all channels or one per channel."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        channels = int(rng.integers(1, 40))
        real = np.exp2(rng.uniform(-24, 2, channels))
        real[rng.random(channels) < 0.2] = 0.5 ** rng.integers(1, 20)
        zero_point, bounds = int(rng.integers(-128, 128)), tuple(sorted(rng.integers(-128, 128, 2).tolist()))
        bound = int(rng.choice([1 << 10, 1 << 23]))
        acc = rng.integers(-bound, bound, (int(rng.integers(1, 30)), channels))
        acc[::3] = rng.integers(-64, 64, acc[::3].shape)
        b = rng.integers(-(1 << 20), 1 << 20, channels)
        vector = vector_lanes(channels, 8)
        for rounding, away in ((multiply_half_up, False), (multiply_by_quantized_multiplier, True),
                               (lane_rounding(vector), ~vector)):
            expected = np.empty(acc.shape, np.int8)
            Requantize.of(real, zero_point, bounds, rounding)(acc + b, expected)
            rows = np.empty(acc.shape, np.int8)
            Rescale(real, zero_point, bounds, away, b, bound, row_pixels=acc.shape[0])(
                acc.astype(np.float32)[None], rows[None])
            assert np.array_equal(rows, expected)
            u0 = int(rng.integers(0, channels))
            part = np.empty((acc.shape[0], channels - u0), np.int8)
            Rescale(real, zero_point, bounds, away, b, bound)(acc[:, u0:].astype(np.float64), part, u0, channels)
            assert np.array_equal(part, expected[:, u0:])
