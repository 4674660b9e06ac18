"""Golden tests of every WebGPU kernel against LiteRT, on the adapter wgpu finds here (Mesa lavapipe in CI).

fp32 results must be within 1e-4 of the output range; fp16 storage within
2e-2 (f16 keeps 11 significant bits, and a value is rounded at each tensor
the partition stores).
"""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from delegate import CompileOptions
from delegate.plugins import default_manager
from delegate.tflite.builder import GraphBuilder
from delegate_wgpu import kernels
from delegate_wgpu.tiling import DeviceShape, MatmulTiling, SpatialTiling, matmul_tiling, spatial_tiling
from tests.models import pool_model, transpose_conv_bias_pair, transpose_conv_model
from tests.oputil import assert_close, check_against_litert, delegate_run, litert_run

_available, _why = default_manager().backend_info("wgpu").available()
pytestmark = pytest.mark.skipif(not _available, reason=f"no WebGPU adapter: {_why}")

FP32 = 1e-4
FP16_RTOL = 2e-2
ACTIVATIONS = st.sampled_from(["NONE", "RELU", "RELU6", "RELU_N1_TO_1"])
SHAPES = st.sampled_from([(7,), (2, 9), (1, 4, 5, 3), (2, 3, 1, 6), (1, 2, 3, 8)])


def check(model, inputs, rtol=FP32, builtin=False, **kwargs):
    check_against_litert(model, inputs, backend="wgpu", rtol=rtol, atol=1e-5, builtin=builtin, **kwargs)


def unary_model(opcode, shape, options=None):
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op(opcode, [x], options=options))
    return b.to_bytes()


# -- elementwise --------------------------------------------------------------------------------

BROADCASTS = st.sampled_from([((2, 3, 4, 5), (2, 3, 4, 5)), ((1, 3, 4, 6), (6,)), ((1, 3, 4, 6), (1, 1, 1, 1)),
                              ((1, 3, 4, 6), (1, 3, 4, 1)), ((2, 1, 4, 3), (1, 5, 1, 3)), ((5,), (3, 1)),
                              ((3, 9), (3, 9)), ((4, 2, 7), (2, 1))])


@given(op=st.sampled_from(["ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM"]), shapes=BROADCASTS,
       const_second=st.booleans(), act=ACTIVATIONS, seed=st.integers(0, 2**16))
def test_binary(op, shapes, const_second, act, seed):
    rng = np.random.default_rng(seed)
    a_shape, b_shape = shapes
    b = GraphBuilder()
    x = b.input("x", a_shape)
    other = rng.standard_normal(b_shape).astype(np.float32)
    y = b.const("y", other) if const_second else b.input("y", b_shape)
    options = {"fused_activation_function": act} if op in ("ADD", "SUB", "MUL") else {}
    b.output(b.op(op, [x, y], options=options))
    inputs = [rng.standard_normal(a_shape)] + ([] if const_second else [other])
    check(b.to_bytes(), inputs, builtin=True)


@given(op=st.sampled_from(["ADD", "MUL", "SUB"]), seed=st.integers(0, 2**16))
def test_binary_runtime_first_operand_broadcast(op, seed):
    """The first input is the smaller one: the kernel broadcasts its base value too."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, 1, 1, 5))
    y = b.input("y", (2, 3, 4, 5))
    b.output(b.op(op, [x, y]))
    check(b.to_bytes(), [rng.standard_normal((1, 1, 1, 5)), rng.standard_normal((2, 3, 4, 5))], builtin=True)


@given(op=st.sampled_from(["RELU", "RELU6", "LOGISTIC", "TANH", "EXP", "HARD_SWISH"]), shape=SHAPES,
       scale=st.sampled_from([1.0, 4.0, 30.0]), seed=st.integers(0, 2**16))
def test_unary(op, shape, scale, seed):
    rng = np.random.default_rng(seed)
    scale = min(scale, 4.0) if op == "EXP" else scale
    check(unary_model(op, shape), [rng.standard_normal(shape) * scale])


@given(alpha_shape=st.sampled_from([(3,), (1, 1, 3), (5, 1), (4, 5, 3), (1,)]), seed=st.integers(0, 2**16))
def test_prelu(alpha_shape, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (2, 4, 5, 3))
    b.output(b.op("PRELU", [x, b.const("alpha", rng.standard_normal(alpha_shape).astype(np.float32))]))
    check(b.to_bytes(), [rng.standard_normal((2, 4, 5, 3)) * 3])


@given(shapes=st.sampled_from([((2, 3, 5), (2, 3, 5)), ((1, 4, 4, 6), (6,)), ((3, 7), (1, 7))]),
       seed=st.integers(0, 2**16))
def test_logical_and(shapes, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x, y = b.input("x", shapes[0], "bool"), b.input("y", shapes[1], "bool")
    b.output(b.op("LOGICAL_AND", [x, y]))
    check(b.to_bytes(), [rng.random(shapes[0]) > 0.5, rng.random(shapes[1]) > 0.5], builtin=True)


# -- convolutions and matrix products -----------------------------------------------------------

@given(h=st.integers(3, 10), w=st.integers(3, 10), cin=st.integers(1, 9), cout=st.integers(1, 9),
       k=st.sampled_from([(1, 1), (3, 3), (2, 3), (5, 5)]), stride=st.integers(1, 3), dilation=st.integers(1, 2),
       padding=st.sampled_from(["SAME", "VALID"]), act=ACTIVATIONS, batch=st.integers(1, 2),
       seed=st.integers(0, 2**16))
def test_conv_2d(h, w, cin, cout, k, stride, dilation, padding, act, batch, seed):
    kh, kw = k
    if padding == "VALID" and ((kh - 1) * dilation + 1 > h or (kw - 1) * dilation + 1 > w):
        padding = "SAME"
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (batch, h, w, cin))
    b.output(b.op("CONV_2D", [x, b.const("w", rng.standard_normal((cout, kh, kw, cin)).astype(np.float32)),
                              b.const("b", rng.standard_normal(cout).astype(np.float32))],
                  options={"padding": padding, "stride_h": stride, "stride_w": stride, "dilation_h_factor": dilation,
                           "dilation_w_factor": dilation, "fused_activation_function": act}))
    check(b.to_bytes(), [rng.standard_normal((batch, h, w, cin))], builtin=dilation > 1)


def test_grouped_conv_2d():
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input("x", (1, 6, 7, 6))
    b.output(b.op("CONV_2D", [x, b.const("w", rng.standard_normal((9, 3, 3, 2)).astype(np.float32)),
                              b.const("b", rng.standard_normal(9).astype(np.float32))],
                  options={"padding": "SAME", "stride_h": 1, "stride_w": 1}))
    check(b.to_bytes(), [rng.standard_normal((1, 6, 7, 6))], builtin=True)


@given(h=st.integers(3, 10), w=st.integers(3, 10), c=st.integers(1, 9), multiplier=st.integers(1, 3),
       k=st.sampled_from([(1, 1), (3, 3), (5, 5), (2, 3)]), stride=st.integers(1, 2), dilation=st.integers(1, 2),
       padding=st.sampled_from(["SAME", "VALID"]), act=ACTIVATIONS, seed=st.integers(0, 2**16))
def test_depthwise_conv_2d(h, w, c, multiplier, k, stride, dilation, padding, act, seed):
    kh, kw = k
    if padding == "VALID" and ((kh - 1) * dilation + 1 > h or (kw - 1) * dilation + 1 > w):
        padding = "SAME"
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, h, w, c))
    b.output(b.op("DEPTHWISE_CONV_2D",
                  [x, b.const("w", rng.standard_normal((1, kh, kw, c * multiplier)).astype(np.float32)),
                   b.const("b", rng.standard_normal(c * multiplier).astype(np.float32))],
                  version=2 if dilation > 1 else 1,
                  options={"padding": padding, "stride_h": stride, "stride_w": stride, "depth_multiplier": multiplier,
                           "dilation_h_factor": dilation, "dilation_w_factor": dilation,
                           "fused_activation_function": act}))
    check(b.to_bytes(), [rng.standard_normal((1, h, w, c))], builtin=dilation > 1)


@given(batch=st.sampled_from([(1,), (3,), (2, 3), (1, 2, 2)]), depth=st.integers(1, 20), units=st.integers(1, 12),
       keep=st.booleans(), with_bias=st.booleans(), act=ACTIVATIONS, seed=st.integers(0, 2**16))
def test_fully_connected(batch, depth, units, keep, with_bias, act, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", batch + (depth,))
    inputs = [x, b.const("w", rng.standard_normal((units, depth)).astype(np.float32))]
    inputs.append(b.const("b", rng.standard_normal(units).astype(np.float32)) if with_bias else None)
    b.output(b.op("FULLY_CONNECTED", inputs, options={"keep_num_dims": keep, "fused_activation_function": act}))
    check(b.to_bytes(), [rng.standard_normal(batch + (depth,))])


def test_fully_connected_flattens_its_input():
    """An input whose last axis is not the weights' depth is read as rows of that depth."""
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    x = b.input("x", (1, 3, 2, 5))
    b.output(b.op("FULLY_CONNECTED", [x, b.const("w", rng.standard_normal((7, 30)).astype(np.float32)), None]))
    check(b.to_bytes(), [rng.standard_normal((1, 3, 2, 5))])


def test_float16_weights_through_dequantize():
    """MediaPipe stores weights as float16 constants behind DEQUANTIZE, folded at compile time."""
    rng = np.random.default_rng(7)
    b = GraphBuilder()
    x = b.input("x", (1, 6, 6, 5))
    w = b.op("DEQUANTIZE", [b.const("w16", rng.standard_normal((4, 3, 3, 5)).astype(np.float16))], dtype="float32")
    bias = b.op("DEQUANTIZE", [b.const("b16", rng.standard_normal(4).astype(np.float16))], dtype="float32")
    b.output(b.op("CONV_2D", [x, w, bias], options={"padding": "SAME", "stride_h": 1, "stride_w": 1}))
    check(b.to_bytes(), [rng.standard_normal((1, 6, 6, 5))])


PRECISIONS = {"fp32": {}, "fp16": {"rtol": FP16_RTOL, "options": CompileOptions(precision="fp16")}}
MATMUL_TILINGS = [MatmulTiling(4, 4, 1), MatmulTiling(2, 1, 4), MatmulTiling(1, 2, 8), MatmulTiling(4, 2, 2),
                  MatmulTiling(1, 1, 4, 128), MatmulTiling(1, 1, 16, 128)]  # the last two: a GPU's (no blocks)


LIMITS = {"max-compute-workgroup-storage-size": 32768, "max-compute-workgroups-per-dimension": 65535}


def test_a_gpu_computes_one_output_vector_per_invocation_and_splits_by_depth():
    """MobileNetV2's layers as an H100 tuned them (docs/benchmarks.md): one vector each, workgroups of 128,
    the reduction split 16 ways from 64 input slices, 4 from 16, none below; a CPU adapter keeps blocks."""
    gpu = DeviceShape.of("DiscreteGPU", LIMITS, False)
    assert str(matmul_tiling(gpu, 12544, 4, 8)) == "1 rows x 1 slices, split 1, workgroup 128"
    assert str(matmul_tiling(gpu, 3136, 6, 36)) == "1 rows x 1 slices, split 4, workgroup 128"
    assert str(matmul_tiling(gpu, 49, 320, 80)) == "1 rows x 1 slices, split 16, workgroup 128"
    assert matmul_tiling(gpu, 1, 250, 320).split == 64  # one row: split further while invocations are few
    assert str(spatial_tiling(gpu, (1, 56, 56, 144), 1)) == "1 pixels x 1 slices, workgroup 128"
    # no dispatch beyond the adapter's workgroups per dimension: fewer parts, then blocks again
    assert matmul_tiling(gpu, 1024 * 1024, 4, 64).layout(1024 * 1024, 4)[1][0] <= 65535
    assert max(spatial_tiling(gpu, (1, 8, 8, 4 * 200000), 4).layout((1, 8, 8, 4 * 200000))[1]) <= 65535
    cpu = DeviceShape.of("CPU", LIMITS, False)
    assert matmul_tiling(cpu, 12544, 4, 8) == MatmulTiling(4, 4, 1)
    assert spatial_tiling(cpu, (1, 56, 56, 144), 4).pixels > 1


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("tiling", MATMUL_TILINGS, ids=str)
@pytest.mark.parametrize("case", ["fully_connected", "conv_1x1"])
def test_tiled_matmul_on_ragged_shapes(monkeypatch, tiling, case, precision):
    """Rows and output slices that are not multiples of the tile, rows crossing images, and split
    reductions whose parts add up different numbers of input slices."""
    monkeypatch.setattr(kernels, "matmul_tiling", lambda *args: tiling)
    rng = np.random.default_rng(13)
    b = GraphBuilder()
    if case == "fully_connected":
        shape, units = (5, 37), 13
        x = b.input("x", shape)
        b.output(b.op("FULLY_CONNECTED", [x, b.const("w", rng.standard_normal((units, 37)).astype(np.float32)),
                                          b.const("b", rng.standard_normal(units).astype(np.float32))],
                      options={"fused_activation_function": "RELU"}))
    else:
        shape, units = (2, 3, 5, 19), 11
        x = b.input("x", shape)
        b.output(b.op("CONV_2D", [x, b.const("w", rng.standard_normal((units, 1, 1, 19)).astype(np.float32)),
                                  b.const("b", rng.standard_normal(units).astype(np.float32))],
                      options={"padding": "VALID", "stride_h": 1, "stride_w": 1}))
    check(b.to_bytes(), [rng.standard_normal(shape)], **PRECISIONS[precision])


@pytest.mark.parametrize("op, pixels, slices", [("CONV_2D", 4, 4), ("CONV_2D", 2, 1), ("CONV_2D", 4, 2),
                                               ("DEPTHWISE_CONV_2D", 4, 1), ("DEPTHWISE_CONV_2D", 2, 1),
                                               ("TRANSPOSE_CONV", 1, 4), ("TRANSPOSE_CONV", 1, 2),
                                               ("CONV_2D", 1, 1), ("DEPTHWISE_CONV_2D", 1, 1),
                                               ("TRANSPOSE_CONV", 1, 1)])
@pytest.mark.parametrize("multiplier", [1, 2])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tiled_convolutions_on_ragged_shapes(monkeypatch, op, pixels, slices, multiplier, precision):
    """Output widths and slice counts that are not multiples of the tile, padding on every side
    (a transposed convolution: strides 2 and 3, kernels not multiples of them)."""
    workgroup = 128 if (pixels, slices) == (1, 1) else 64  # a GPU's tiling (no blocks) in its workgroup
    monkeypatch.setattr(kernels, "spatial_tiling", lambda *args: SpatialTiling(pixels, slices, workgroup))
    rng = np.random.default_rng(14)
    b = GraphBuilder()
    x = b.input("x", (2, 6, 9, 6))
    if op == "CONV_2D":
        weights, options = (10, 3, 3, 6 // multiplier), {}
    elif op == "DEPTHWISE_CONV_2D":
        weights, options = (1, 3, 3, 6 * multiplier), {"depth_multiplier": multiplier}
    else:
        weights, options = (5 * multiplier, 3, 4, 6), {}
    w = b.const("w", rng.standard_normal(weights).astype(np.float32))
    bias = b.const("b", rng.standard_normal(weights[3] if op == "DEPTHWISE_CONV_2D" else weights[0])
                   .astype(np.float32))
    options.update(padding="SAME", stride_h=1 + multiplier, stride_w=2)
    if op == "TRANSPOSE_CONV":
        out_shape = np.array([2, 6 * options["stride_h"], 18, weights[0]], np.int32)
        b.output(b.op(op, [b.const("shape", out_shape), w, x, bias], dtype="float32", options=options))
    else:
        b.output(b.op(op, [x, w, bias], options=options))
    check(b.to_bytes(), [rng.standard_normal((2, 6, 9, 6))], builtin=True, **PRECISIONS[precision])


@given(h=st.integers(1, 7), w=st.integers(1, 7), cin=st.integers(1, 6), cout=st.integers(1, 6),
       k=st.sampled_from([(1, 1), (2, 2), (3, 3), (4, 3)]), stride=st.integers(1, 3),
       padding=st.sampled_from(["SAME", "VALID"]), with_bias=st.booleans(), seed=st.integers(0, 2**16))
def test_transpose_conv(h, w, cin, cout, k, stride, padding, with_bias, seed):
    rng = np.random.default_rng(seed)
    model = transpose_conv_model(h, w, cin, cout, k, stride, padding, with_bias, rng)
    check(model, [rng.standard_normal((1, h, w, cin))], builtin=True)


@given(h=st.integers(1, 7), w=st.integers(1, 7), cin=st.integers(1, 6), cout=st.integers(1, 5),
       k=st.sampled_from([(2, 2), (3, 3), (4, 4), (3, 2)]), stride=st.integers(1, 3),
       padding=st.sampled_from(["SAME", "VALID"]), seed=st.integers(0, 2**16))
def test_convolution_2d_transpose_bias(h, w, cin, cout, k, stride, padding, seed):
    """MediaPipe's custom op, against LiteRT's TRANSPOSE_CONV with the same geometry plus the bias."""
    rng = np.random.default_rng(seed)
    custom, builtin = transpose_conv_bias_pair(h, w, cin, cout, k, stride, padding, rng, builtin_version=3)
    data = rng.standard_normal((1, h, w, cin)).astype(np.float32)
    assert_close(delegate_run(custom, [data], "wgpu"), litert_run(builtin, [data], builtin=True),
                 rtol=FP32, atol=1e-5)


# -- pooling, resizing, reductions --------------------------------------------------------------

@given(op=st.sampled_from(["MAX_POOL_2D", "AVERAGE_POOL_2D"]), h=st.integers(1, 10), w=st.integers(1, 10),
       c=st.integers(1, 6), kh=st.integers(1, 4), kw=st.integers(1, 4), stride=st.integers(1, 3),
       padding=st.sampled_from(["SAME", "VALID"]), act=st.sampled_from(["NONE", "RELU", "RELU6"]),
       batch=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_pool_2d(op, h, w, c, kh, kw, stride, padding, act, batch, seed):
    rng = np.random.default_rng(seed)
    model = pool_model(op, batch, h, w, c, kh, kw, stride, stride, padding, act)
    check(model, [rng.standard_normal((batch, h, w, c)) * 3])


MODES = st.sampled_from([(1, False, False), (2, True, False), (3, False, True)])  # version, align, half pixel


@given(h=st.integers(1, 8), w=st.integers(1, 8), oh=st.integers(1, 17), ow=st.integers(1, 17), c=st.integers(1, 6),
       mode=MODES, batch=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_resize_bilinear(h, w, oh, ow, c, mode, batch, seed):
    version, align, half = mode
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (batch, h, w, c))
    b.output(b.op("RESIZE_BILINEAR", [x, b.const("size", np.array([oh, ow], np.int32))], version=version,
                  options={"align_corners": align, "half_pixel_centers": half}))
    check(b.to_bytes(), [rng.standard_normal((batch, h, w, c))], builtin=True)


@given(beta=st.sampled_from([1.0, 0.5, 2.0]), shape=SHAPES, scale=st.sampled_from([1.0, 30.0]),
       seed=st.integers(0, 2**16))
def test_softmax(beta, shape, scale, seed):
    rng = np.random.default_rng(seed)
    check(unary_model("SOFTMAX", shape, {"beta": beta}), [rng.standard_normal(shape) * scale])


@given(case=st.sampled_from([((1, 5, 6, 7), [1, 2]), ((1, 5, 6, 7), [3]), ((1, 5, 6, 7), [2]), ((3, 10), [1]),
                             ((2, 4, 9), [-1]), ((1, 3, 4, 6), [1, 2, 3]), ((1, 4, 4, 5), [0, 1])]),
       keep=st.booleans(), seed=st.integers(0, 2**16))
def test_mean(case, keep, seed):
    shape, axes = case
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op("MEAN", [x, b.const("axes", np.array(axes, np.int32))], options={"keep_dims": keep}))
    check(b.to_bytes(), [rng.standard_normal(shape)])


@pytest.mark.parametrize("subgroups", [True, False], ids=["subgroups", "workgroup-memory"])
@pytest.mark.parametrize("case", [("SOFTMAX", (1, 1000)), ("SOFTMAX", (3, 2, 77)), ("SOFTMAX", (2, 1, 1, 2051)),
                                  ("MEAN", (1, 7, 7, 1280)), ("MEAN", (1, 23, 17, 37)), ("MEAN", (1, 1, 1, 5)),
                                  ("AVERAGE_POOL_2D", (2, 9, 11, 21)), ("MAX_POOL_2D", (2, 13, 6, 9))],
                         ids=lambda c: f"{c[0]}{list(c[1])}" if isinstance(c, tuple) else c)
def test_workgroup_reductions(case, subgroups):
    """Softmax over many channels and global pooling: one workgroup per output, combined with subgroup
    operations (where the adapter has them) or through workgroup memory."""
    op, shape = case
    rng = np.random.default_rng(15)
    b = GraphBuilder()
    x = b.input("x", shape)
    if op == "SOFTMAX":
        b.output(b.op("SOFTMAX", [x], options={"beta": 0.7}))
    elif op == "MEAN":
        b.output(b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": True}))
    else:  # windows covering the image: exactly, and with SAME padding around it
        b.output(b.op(op, [x], options={"padding": "VALID" if op == "AVERAGE_POOL_2D" else "SAME",
                                        "filter_height": shape[1] + (op == "MAX_POOL_2D"), "filter_width": shape[2],
                                        "stride_h": 20, "stride_w": 20, "fused_activation_function": "RELU"}))
    model, inputs = b.to_bytes(), [rng.standard_normal(shape) * 5]
    actual = delegate_run(model, inputs, "wgpu", backend_options={"subgroups": subgroups})
    assert_close(actual, litert_run(model, inputs), rtol=FP32, atol=1e-5)


# -- data movement ------------------------------------------------------------------------------

@given(shapes=st.sampled_from([[(1, 3, 4, 5), (1, 3, 4, 3)], [(1, 3, 4, 4), (1, 3, 4, 8), (1, 3, 4, 2)],
                               [(2, 3, 4), (2, 5, 4)], [(1, 2, 3, 6), (1, 2, 2, 6)], [(2, 3, 5), (1, 3, 5)],
                               [(3, 5), (3, 2), (3, 1)]]),
       seed=st.integers(0, 2**16))
def test_concatenation(shapes, seed):
    rng = np.random.default_rng(seed)
    rank = len(shapes[0])
    axis = next(i for i in range(rank) if shapes[0][i] != shapes[1][i])
    b = GraphBuilder()
    xs = [b.input(f"x{i}", s) for i, s in enumerate(shapes)]
    b.output(b.op("CONCATENATION", xs, options={"axis": axis if axis < rank - 1 else -1}))
    check(b.to_bytes(), [rng.standard_normal(s) for s in shapes])


@given(shape=st.sampled_from([(1, 4, 5, 3), (2, 3, 6), (5, 7), (1, 3, 3, 8)]), seed=st.integers(0, 2**16),
       pads=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=4, max_size=4))
def test_pad(shape, pads, seed):
    rng = np.random.default_rng(seed)
    pads = pads[:len(shape)]
    if len(shape) == 4:
        pads[0] = (0, 0)
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op("PAD", [x, b.const("pads", np.array(pads, np.int32))]))
    check(b.to_bytes(), [rng.standard_normal(shape)])


@given(case=st.sampled_from([((1, 4, 6, 3), (1, 24, 3)), ((1, 4, 6, 3), (1, 72)), ((2, 6, 5), (2, 3, 10)),
                             ((1, 2, 2, 8), (1, 4, 8)), ((4, 9), (6, 6)), ((1, 1, 1, 12), (1, 3, 4))]),
       seed=st.integers(0, 2**16))
def test_reshape(case, seed):
    shape, new_shape = case
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    y = b.op("RESHAPE", [x, b.const("shape", np.array(new_shape, np.int32))], options={"new_shape": list(new_shape)})
    b.output(b.op("RELU", [y]))  # the output leaves through a kernel even when the reshape is free
    check(b.to_bytes(), [rng.standard_normal(shape)])


@given(case=st.sampled_from([
    ((1, 6, 7, 5), [0, 1, 2, 0], [1, 5, 7, 5], [1, 1, 2, 1], {}),
    ((1, 6, 7, 9), [0, 0, 0, 4], [1, 6, 7, 9], [1, 2, 1, 1], {}),
    ((1, 6, 7, 9), [0, 0, 0, 1], [1, 6, 7, 8], [1, 1, 1, 3], {}),
    ((2, 5, 6), [1, 0, 0], [2, 5, 6], [1, 1, 1], {"shrink_axis_mask": 1}),
    ((8, 10), [-1, 0], [0, 10], [-1, 2], {"end_mask": 1}),
    ((1, 6, 7, 4), [0, 0, 0, 0], [0, 3, 0, 0], [1, 1, 1, 1], {"begin_mask": 15, "end_mask": 13}),
]), seed=st.integers(0, 2**16))
def test_strided_slice(case, seed):
    shape, begin, end, strides, options = case
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op("STRIDED_SLICE", [x, b.const("begin", np.array(begin, np.int32)),
                                    b.const("end", np.array(end, np.int32)),
                                    b.const("strides", np.array(strides, np.int32))], options=options))
    check(b.to_bytes(), [rng.standard_normal(shape)], builtin=True)


@given(block=st.integers(2, 3), c=st.sampled_from([1, 2, 4, 5]), h=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_depth_to_space(block, c, h, seed):
    rng = np.random.default_rng(seed)
    shape = (1, h, h + 1, c * block * block)
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op("DEPTH_TO_SPACE", [x], options={"block_size": block}))
    check(b.to_bytes(), [rng.standard_normal(shape)])


# -- LSTM ---------------------------------------------------------------------------------------

@given(batch=st.integers(1, 3), depth=st.integers(1, 9), units=st.integers(1, 7), seed=st.integers(0, 2**16))
def test_basic_lstm(batch, depth, units, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (batch, depth))
    prev_activation = b.input("prev_activation", (batch, units))
    prev_state = b.input("prev_state", (batch, units))
    weights = b.const("w", rng.standard_normal((4 * units, depth + units)).astype(np.float32) * 0.5)
    bias = b.const("b", rng.standard_normal(4 * units).astype(np.float32))
    outs = b.op("LSTM", [x, prev_activation, weights, bias, prev_state], version=2,
                options={"fused_activation_function": "TANH", "cell_clip": 0.0, "proj_clip": 0.0,
                         "kernel_type": "BASIC"},
                shapes=[(batch, units), (batch, units), (batch, depth + units), (batch, 4 * units)])
    b.output(outs[0], outs[1])
    check(b.to_bytes(), [rng.standard_normal((batch, depth)), rng.standard_normal((batch, units)),
                         rng.standard_normal((batch, units))], builtin=True)


# -- precision and the float view ---------------------------------------------------------------

HALF = CompileOptions(precision="fp16")


@given(h=st.integers(3, 8), cin=st.integers(1, 9), cout=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_fp16_conv_chain(h, cin, cout, seed):
    """f16 storage: looser tolerance (2e-2 of the range), arithmetic still accumulates in f32."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, h, h, cin))
    y = b.op("CONV_2D", [x, b.const("w", rng.standard_normal((cout, 3, 3, cin)).astype(np.float32)),
                         b.const("b", rng.standard_normal(cout).astype(np.float32))],
             options={"padding": "SAME", "stride_h": 1, "stride_w": 1, "fused_activation_function": "RELU"})
    y = b.op("MEAN", [y, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": False})
    b.output(b.op("SOFTMAX", [y], options={"beta": 1.0}))
    check(b.to_bytes(), [rng.standard_normal((1, h, h, cin))], rtol=FP16_RTOL, options=HALF)


def test_fp16_is_used_and_explained():
    """f16 storage everywhere; f16 multiply-adds only in convolutions and matrix products."""
    from delegate.partition import make_partition
    from delegate import read_model
    rng = np.random.default_rng(16)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 4))
    y = b.op("CONV_2D", [x, b.const("w", rng.standard_normal((8, 3, 3, 4)).astype(np.float32)), None],
             options={"padding": "SAME", "stride_h": 1, "stride_w": 1})
    b.output(b.op("SOFTMAX", [y], options={"beta": 1.0}))
    g = read_model(b.to_bytes()).main
    backend = default_manager().backend_info("wgpu").factory({})
    compiled = backend.compile(make_partition(g, g.ops, "wgpu", 0), HALF)
    facts = compiled.describe()
    if backend.device_info()["shader_f16"]:
        assert facts["precision"] == "fp16" and "shader-f16" in facts["precision_reason"]
        assert facts["f16_arithmetic"] == ["CONV_2D#0"]
    else:
        assert facts["precision"] == "fp32" and "lacks" in facts["precision_reason"]
        assert facts["f16_arithmetic"] == []
    full = backend.compile(make_partition(g, g.ops, "wgpu", 0), CompileOptions()).describe()
    assert full["precision"] == "fp32" and full["f16_arithmetic"] == []


QUANT = CompileOptions(allow_quantized=True)


@given(cin=st.integers(1, 6), cout=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_quantized_conv_through_the_float_view(cin, cout, seed):
    """int8 activations and per-channel int8 weights run as floats, rounded onto each output's grid."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, 5, 5, cin), "int8", quant=(0.05, 3))
    w = rng.integers(-127, 128, (cout, 3, 3, cin)).astype(np.int8)
    scales = rng.uniform(0.002, 0.01, cout).astype(np.float32)
    bias = rng.integers(-500, 500, cout).astype(np.int32)
    y = b.op("CONV_2D", [x, b.const("w", w, quant=(scales, np.zeros(cout, np.int64), 0)),
                         b.const("b", bias, quant=(scales * 0.05, np.zeros(cout, np.int64), 0))],
             version=3, dtype="int8", quant=(0.04, -2),
             options={"padding": "SAME", "stride_h": 1, "stride_w": 1, "fused_activation_function": "RELU"})
    pooled = b.op("MAX_POOL_2D", [y], dtype="int8", quant=(0.04, -2), version=2,
                  options={"padding": "VALID", "filter_height": 2, "filter_width": 2, "stride_h": 1, "stride_w": 1})
    b.output(b.op("ADD", [pooled, pooled], dtype="int8", quant=(0.08, 0), version=2))
    data = rng.integers(-128, 128, (1, 5, 5, cin)).astype(np.int8)
    check(b.to_bytes(), [data], options=QUANT, lsb=1)
