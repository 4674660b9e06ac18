"""Dynamic-range (hybrid) kernels, float activations and int8 weights, against LiteRT's builtin kernels.

LiteRT quantizes the activations at run time; the CPU backend does the same, so it
matches the builtin kernels to float32 rounding (about 1e-7 of the output range),
while a product with dequantized weights is off by the input's rounding (0.4-1% here).
XNNPACK, LiteRT's default kernel set, always quantizes asymmetrically: where the
builtin kernel is symmetric the two sets differ by that much too.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from delegate.tflite.builder import GraphBuilder
from tests.oputil import assert_close, delegate_run, litert_run

seeds = st.integers(0, 2**16)
# float32 rounding: the builtin kernels sum the scaled products in their own order.
RTOL = 1e-6


def weights(rng, shape):
    return rng.integers(-127, 128, shape).astype(np.int8)


def weight_quant(rng, channels, per_channel, axis=0):
    scales = rng.uniform(0.002, 0.02, channels) if per_channel else np.full(channels, 0.01)
    return scales.astype(np.float32), np.zeros(channels, np.int64), axis


def check(model: bytes, x: np.ndarray) -> None:
    """Within float32 rounding of the builtin kernels, and no further from XNNPACK than those are."""
    builtin, default = litert_run(model, [x], builtin=True), litert_run(model, [x])
    actual = delegate_run(model, [x])
    assert_close(actual, builtin, rtol=RTOL, atol=0)
    spread = float(np.abs(default[0] - builtin[0]).max())
    scale = max(float(np.abs(builtin[0]).max()), 1.0)
    assert float(np.abs(actual[0] - default[0]).max()) <= spread + 2 * RTOL * scale


@settings(max_examples=12, deadline=None)
@given(seed=seeds, asymmetric=st.booleans(), per_channel=st.booleans(), keep_num_dims=st.booleans(),
       act=st.sampled_from(["NONE", "RELU", "RELU6"]))
def test_fully_connected(seed, asymmetric, per_channel, keep_num_dims, act):
    rng = np.random.default_rng(seed)
    units, depth = int(rng.integers(1, 24)), int(rng.integers(1, 70))
    b = GraphBuilder()
    x = b.input("x", (2, 3, depth))
    w = b.const("w", weights(rng, (units, depth)), quant=weight_quant(rng, units, per_channel))
    b.output(b.op("FULLY_CONNECTED", [x, w, b.const("b", rng.standard_normal(units).astype(np.float32))],
                  dtype="float32", options={"asymmetric_quantize_inputs": asymmetric, "keep_num_dims": keep_num_dims,
                                            "fused_activation_function": act}))
    check(b.to_bytes(), (rng.standard_normal((2, 3, depth)) * 3).astype(np.float32))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's formulation on the rows that are not finite
@pytest.mark.parametrize("asymmetric", [False, True])
@pytest.mark.parametrize("values", ["normal", "wide", "ties", "zeros", "not finite"])
def test_fully_connected_in_the_native_loops_is_numpys_formulation(asymmetric, values):
    """The native hybrid FULLY_CONNECTED (rows shared between two threads) is numpy's formulation bit for bit:
    each row quantized (halves away from zero, the asymmetric zero point nudged in double), its integer sums,
    the float32 scaling and bias, the clamp; rows with a value that is not finite go numpy's way whole."""
    import delegate
    rng = np.random.default_rng(len(values) + asymmetric)
    units, depth, rows = 24, 40, 197
    b = GraphBuilder()
    x = b.input("x", (1, rows, depth))
    w = b.const("w", weights(rng, (units, depth)), quant=weight_quant(rng, units, True))
    b.output(b.op("FULLY_CONNECTED", [x, w, b.const("b", rng.standard_normal(units).astype(np.float32))],
                  dtype="float32", options={"asymmetric_quantize_inputs": asymmetric, "keep_num_dims": True,
                                            "fused_activation_function": "RELU6"}))
    data = {"normal": rng.standard_normal((1, rows, depth)) * 3, "wide": rng.standard_normal((1, rows, depth)) * 1e30,
            "ties": rng.integers(-254, 255, (1, rows, depth)) / 2.0, "zeros": np.zeros((1, rows, depth)),
            "not finite": rng.standard_normal((1, rows, depth))}[values].astype(np.float32)
    if values == "ties":
        data[0, :, 0] = 127.0  # max|x| 127: the symmetric grid is the halves' own
    if values == "not finite":
        data[0, 3, 5], data[0, 7, 1] = np.nan, np.inf
    results = []
    for native in (True, False):
        session = delegate.load(b.to_bytes(), backends="[cpu]", num_threads=2,
                                **{"cpu.engine": "numpy", "cpu.native": native})
        (_, run, _, _), = session.executor.compiled[0].steps
        assert (run.__name__ == "numpy_run") != native
        results.append(next(iter(session.run_indexed({session.graph.inputs[0].index: data}).values())))
    np.testing.assert_array_equal(results[0], results[1])
    if values != "not finite":
        check(b.to_bytes(), data)


@settings(max_examples=12, deadline=None)
@given(seed=seeds, per_channel=st.booleans(), padding=st.sampled_from(["SAME", "VALID"]),
       stride=st.integers(1, 2), kernel=st.sampled_from([(1, 1), (3, 3), (2, 3)]))
def test_conv_2d(seed, per_channel, padding, stride, kernel):
    """Per-tensor weights: symmetric per image; per-channel scales: asymmetric per image."""
    rng = np.random.default_rng(seed)
    cin, cout = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    b = GraphBuilder()
    x = b.input("x", (2, 7, 6, cin))
    w = b.const("w", weights(rng, (cout, *kernel, cin)), quant=weight_quant(rng, cout, per_channel))
    b.output(b.op("CONV_2D", [x, w, b.const("b", rng.standard_normal(cout).astype(np.float32))], dtype="float32",
                  options={"padding": padding, "stride_h": stride, "stride_w": stride,
                           "fused_activation_function": "RELU"}))
    check(b.to_bytes(), rng.standard_normal((2, 7, 6, cin)).astype(np.float32))


@settings(max_examples=10, deadline=None)
@given(seed=seeds, per_channel=st.booleans(), multiplier=st.integers(1, 2), stride=st.integers(1, 2))
def test_depthwise_conv_2d(seed, per_channel, multiplier, stride):
    rng = np.random.default_rng(seed)
    cin = int(rng.integers(1, 9))
    cout = cin * multiplier
    b = GraphBuilder()
    x = b.input("x", (2, 7, 6, cin))
    w = b.const("w", weights(rng, (1, 3, 3, cout)), quant=weight_quant(rng, cout, per_channel, axis=3))
    b.output(b.op("DEPTHWISE_CONV_2D", [x, w, b.const("b", rng.standard_normal(cout).astype(np.float32))],
                  dtype="float32", options={"padding": "SAME", "stride_h": stride, "stride_w": stride,
                                            "depth_multiplier": multiplier}))
    check(b.to_bytes(), rng.standard_normal((2, 7, 6, cin)).astype(np.float32))


@pytest.mark.parametrize("asymmetric", [False, True])
@pytest.mark.parametrize("adj_y", [False, True])
def test_batch_matmul(asymmetric, adj_y):
    rng = np.random.default_rng(7)
    b = GraphBuilder()
    x = b.input("x", (2, 3, 5))
    w = b.const("w", weights(rng, (4, 5) if adj_y else (5, 4)), quant=(0.02, 0))
    b.output(b.op("BATCH_MATMUL", [x, w], dtype="float32", shape=(2, 3, 4),
                  options={"adj_y": adj_y, "asymmetric_quantize_inputs": asymmetric}))
    check(b.to_bytes(), rng.standard_normal((2, 3, 5)).astype(np.float32))


def test_zero_input_rows():
    """A row of zeros quantizes with scale 1 and gives the bias alone, as LiteRT's does."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input("x", (2, 6))
    bias = rng.standard_normal(3).astype(np.float32)
    b.output(b.op("FULLY_CONNECTED", [x, b.const("w", weights(rng, (3, 6)), quant=(0.01, 0)), b.const("b", bias)],
                  dtype="float32", options={"asymmetric_quantize_inputs": True}))
    data = np.zeros((2, 6), np.float32)
    data[1] = rng.standard_normal(6)
    out = delegate_run(b.to_bytes(), [data])[0]
    np.testing.assert_array_equal(out[0], bias)
    check(b.to_bytes(), data)
