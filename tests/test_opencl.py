"""The opencl backend against LiteRT, op by op, on the OpenCL device found here (PoCL on CI).

Models are built with the project's writer; shapes and parameters are drawn by
hypothesis.  fp32 results must match LiteRT within 1e-4 of the output range;
the fp16-storage test allows 3e-3 (half keeps 11 significant bits and values are
rounded at every stored tensor).  Compiled programs are shared by the whole
session (the device state memoises builds by source), so the many examples of
one test cost one build.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from delegate import CompileOptions
from delegate.tflite.builder import GraphBuilder
from tests.oputil import check_against_litert

pytest.importorskip("pyopencl", reason="pyopencl is not installed")
from delegate_opencl.device import probe  # noqa: E402

_AVAILABLE, _WHY = probe()
if not _AVAILABLE:
    pytest.skip(f"no OpenCL device: {_WHY}", allow_module_level=True)

RTOL = 1e-4
ACTIVATIONS = st.sampled_from(["NONE", "RELU", "RELU6", "RELU_N1_TO_1"])


def normal(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def check(builder: GraphBuilder, inputs, rtol=RTOL, options=None):
    check_against_litert(builder.to_bytes(), inputs, backend="opencl", rtol=rtol, atol=1e-5, options=options)


@st.composite
def image(draw, max_side=9, max_channels=11):
    return (draw(st.integers(1, 2)), draw(st.integers(1, max_side)), draw(st.integers(1, max_side)),
            draw(st.integers(1, max_channels)))


@st.composite
def broadcast_pair(draw):
    shape = draw(image())
    rank = draw(st.integers(1, 4))
    full = shape[4 - rank:]
    other = tuple(d if draw(st.booleans()) else 1 for d in full)
    return (full, other) if draw(st.booleans()) else (other, full)


# -- elementwise ---------------------------------------------------------------
@given(op=st.sampled_from(["ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM"]), shapes=broadcast_pair(), act=ACTIVATIONS,
       const=st.booleans(), seed=st.integers(0, 2**16))
def test_binary(op, shapes, act, const, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shapes[0])
    y = b.const("y", normal(rng, shapes[1], 3)) if const else b.input("y", shapes[1])
    opts = {} if op in ("MAXIMUM", "MINIMUM") else {"fused_activation_function": act}
    b.output(b.op(op, [x, y], options=opts))
    inputs = [normal(rng, shapes[0], 3)] + ([] if const else [normal(rng, shapes[1], 3)])
    check(b, inputs)


@given(op=st.sampled_from(["RELU", "RELU6", "LOGISTIC", "TANH", "EXP", "HARD_SWISH"]), shape=image(),
       seed=st.integers(0, 2**16))
def test_unary(op, shape, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op(op, [x]))
    check(b, [normal(rng, shape, 4)])


@given(shape=image(), per_channel=st.booleans(), seed=st.integers(0, 2**16))
def test_prelu(shape, per_channel, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    alpha = normal(rng, (1, 1, shape[3]) if per_channel else (1, 1, 1))
    b.output(b.op("PRELU", [x, b.const("alpha", alpha)]))
    check(b, [normal(rng, shape, 3)])


@given(shapes=broadcast_pair(), seed=st.integers(0, 2**16))
def test_logical_and(shapes, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x, y = b.input("x", shapes[0], "bool"), b.input("y", shapes[1], "bool")
    b.output(b.op("LOGICAL_AND", [x, y]))
    check(b, [rng.random(shapes[0]) > 0.5, rng.random(shapes[1]) > 0.5])


# -- convolutions --------------------------------------------------------------
@st.composite
def conv_case(draw):
    n, h, w, c = draw(image(max_side=10))
    return dict(shape=(n, h, w, c), out=draw(st.integers(1, 10)), kh=draw(st.integers(1, 3)),
                kw=draw(st.integers(1, 3)), stride=(draw(st.integers(1, 2)), draw(st.integers(1, 2))),
                dilation=(draw(st.integers(1, 2)), draw(st.integers(1, 2))),
                padding=draw(st.sampled_from(["SAME", "VALID"])), act=draw(ACTIVATIONS))


def _fits(case):
    n, h, w, c = case["shape"]
    return all(size >= (k - 1) * d + 1 for size, k, d in
               ((h, case["kh"], case["dilation"][0]), (w, case["kw"], case["dilation"][1])))


def _conv_options(case):
    return {"padding": case["padding"], "stride_h": case["stride"][0], "stride_w": case["stride"][1],
            "dilation_h_factor": case["dilation"][0], "dilation_w_factor": case["dilation"][1],
            "fused_activation_function": case["act"]}


@given(case=conv_case().filter(_fits), seed=st.integers(0, 2**16))
def test_conv_2d(case, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", case["shape"])
    w = b.const("w", normal(rng, (case["out"], case["kh"], case["kw"], case["shape"][3])))
    b.output(b.op("CONV_2D", [x, w, b.const("b", normal(rng, case["out"]))], options=_conv_options(case)))
    check(b, [normal(rng, case["shape"])])


@given(case=conv_case().filter(_fits), multiplier=st.sampled_from([1, 1, 2, 3]), seed=st.integers(0, 2**16))
def test_depthwise_conv_2d(case, multiplier, seed):
    rng = np.random.default_rng(seed)
    c = case["shape"][3]
    b = GraphBuilder()
    x = b.input("x", case["shape"])
    w = b.const("w", normal(rng, (1, case["kh"], case["kw"], c * multiplier)))
    opts = _conv_options(case) | {"depth_multiplier": multiplier}
    dilated = case["dilation"] != (1, 1)
    b.output(b.op("DEPTHWISE_CONV_2D", [x, w, b.const("b", normal(rng, c * multiplier))], options=opts,
                  version=2 if dilated else 1))
    check(b, [normal(rng, case["shape"])])


@given(rows=st.integers(1, 5), depth=st.integers(1, 40), units=st.integers(1, 12), act=ACTIVATIONS,
       layout=st.sampled_from(["rank2", "flatten", "keep_dims"]), seed=st.integers(0, 2**16))
def test_fully_connected(rows, depth, units, act, layout, seed):
    rng = np.random.default_rng(seed)
    shape = {"rank2": (rows, depth), "flatten": (1, rows, 2, depth), "keep_dims": (1, rows, 2, depth)}[layout]
    b = GraphBuilder()
    x = b.input("x", shape)
    w = b.const("w", normal(rng, (units, depth if layout != "flatten" else rows * 2 * depth)))
    opts = {"fused_activation_function": act, "keep_num_dims": layout == "keep_dims"}
    b.output(b.op("FULLY_CONNECTED", [x, w, b.const("b", normal(rng, units))], options=opts))
    check(b, [normal(rng, shape)])


@given(shape=image(max_side=6), out=st.integers(1, 9), k=st.integers(1, 4), stride=st.integers(1, 3),
       padding=st.sampled_from(["SAME", "VALID"]), seed=st.integers(0, 2**16))
def test_transpose_conv(shape, out, k, stride, padding, seed):
    rng = np.random.default_rng(seed)
    n, h, w, c = shape
    size = (lambda s: s * stride) if padding == "SAME" else (lambda s: (s - 1) * stride + k)
    out_shape = (n, size(h), size(w), out)
    b = GraphBuilder()
    x = b.input("x", shape)
    weights = b.const("w", normal(rng, (out, k, k, c)))
    b.output(b.op("TRANSPOSE_CONV", [b.const("shape", np.array(out_shape, np.int32)), weights, x],
                  options={"padding": padding, "stride_w": stride, "stride_h": stride}, shape=out_shape,
                  dtype="float32"))
    check(b, [normal(rng, shape)])


@given(shape=image(max_side=6), out=st.integers(1, 6), k=st.integers(1, 4), stride=st.integers(1, 3),
       padding=st.sampled_from(["SAME", "VALID"]), seed=st.integers(0, 2**16))
def test_convolution_2d_transpose_bias(shape, out, k, stride, padding, seed):
    """MediaPipe's custom op: a transposed convolution with a bias, parameters as a raw C struct."""
    rng = np.random.default_rng(seed)
    n, h, w, c = shape
    size = (lambda s: s * stride) if padding == "SAME" else (lambda s: (s - 1) * stride + k)
    out_shape = (n, size(h), size(w), out)
    b = GraphBuilder()
    x = b.input("x", shape)
    params = struct.pack("<3i", 1 if padding == "SAME" else 2, stride, stride)
    b.output(b.op("Convolution2DTransposeBias", [x, b.const("w", normal(rng, (out, k, k, c))),
                                                 b.const("b", normal(rng, out))],
                  custom=True, custom_options=params, shape=out_shape))
    check(b, [normal(rng, shape)])


# -- pooling, reductions, softmax --------------------------------------------------
@given(op=st.sampled_from(["AVERAGE_POOL_2D", "MAX_POOL_2D"]), shape=image(), fh=st.integers(1, 3),
       fw=st.integers(1, 3), sh=st.integers(1, 2), sw=st.integers(1, 2), padding=st.sampled_from(["SAME", "VALID"]),
       act=st.sampled_from(["NONE", "RELU", "RELU6"]), seed=st.integers(0, 2**16))
def test_pool(op, shape, fh, fw, sh, sw, padding, act, seed):
    if padding == "VALID" and (shape[1] < fh or shape[2] < fw):
        fh, fw = min(fh, shape[1]), min(fw, shape[2])
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op(op, [x], options={"padding": padding, "filter_height": fh, "filter_width": fw,
                                    "stride_h": sh, "stride_w": sw, "fused_activation_function": act}))
    check(b, [normal(rng, shape, 3)])


@given(shape=image(), axes=st.sets(st.integers(-3, 3), min_size=1, max_size=3), keep=st.booleans(),
       seed=st.integers(0, 2**16))
def test_mean(shape, axes, keep, seed):
    shape = (1,) + shape[1:]
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op("MEAN", [x, b.const("axes", np.array(sorted(axes), np.int32))], options={"keep_dims": keep}))
    check(b, [normal(rng, shape, 2)])


@given(rank=st.sampled_from([2, 4]), shape=image(max_channels=20), beta=st.sampled_from([1.0, 0.5, 2.0]),
       seed=st.integers(0, 2**16))
def test_softmax(rank, shape, beta, seed):
    shape = shape[4 - rank:]
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op("SOFTMAX", [x], options={"beta": beta}))
    check(b, [normal(rng, shape, 4)])


# -- data movement ------------------------------------------------------------------
@given(rank=st.integers(2, 4), count=st.integers(1, 3), seed=st.integers(0, 2**16), data=st.data())
def test_concatenation(rank, count, seed, data):
    base = data.draw(image())[4 - rank:]
    axis = data.draw(st.integers(-rank, rank - 1))
    shapes = []
    for _ in range(count):
        shape = list(base)
        shape[axis] = data.draw(st.integers(1, 7))
        shapes.append(tuple(shape))
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    xs = [b.input(f"x{i}", s) for i, s in enumerate(shapes)]
    b.output(b.op("CONCATENATION", xs, options={"axis": axis, "fused_activation_function": "NONE"}))
    check(b, [normal(rng, s) for s in shapes])


@given(shape=image(), seed=st.integers(0, 2**16), data=st.data())
def test_pad(shape, seed, data):
    pads = [[data.draw(st.integers(0, 2)) for _ in range(2)] for _ in range(4)]
    pads[0] = [0, 0] if data.draw(st.booleans()) else pads[0]
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op("PAD", [x, b.const("pads", np.array(pads, np.int32))]))
    check(b, [normal(rng, shape)])


@given(shape=image(), seed=st.integers(0, 2**16), data=st.data())
def test_reshape(shape, seed, data):
    total = int(np.prod(shape))
    target = data.draw(st.sampled_from([(total,), (1, total), (shape[0], shape[1] * shape[2], shape[3]),
                                        (shape[0] * shape[1], shape[2] * shape[3]), (1, 1, 1, total),
                                        (shape[0], 1, shape[1] * shape[2], shape[3])]))
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    y = b.op("RELU", [x])  # so the reshape reads a tensor produced on the device
    b.output(b.op("RESHAPE", [y, b.const("shape", np.array(target, np.int32))]))
    check(b, [normal(rng, shape)])


@given(shape=image(max_side=6), out_h=st.integers(1, 12), out_w=st.integers(1, 12),
       mode=st.sampled_from(["plain", "align_corners", "half_pixel"]), seed=st.integers(0, 2**16))
def test_resize_bilinear(shape, out_h, out_w, mode, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    opts = {"align_corners": mode == "align_corners", "half_pixel_centers": mode == "half_pixel"}
    b.output(b.op("RESIZE_BILINEAR", [x, b.const("size", np.array([out_h, out_w], np.int32))], options=opts,
                  version=3 if mode == "half_pixel" else 1))
    check(b, [normal(rng, shape)])


@given(shape=image(), seed=st.integers(0, 2**16), data=st.data())
def test_strided_slice(shape, seed, data):
    begin, end, strides = [], [], []
    for size in shape:
        start = data.draw(st.integers(-size, size - 1))
        stop = data.draw(st.integers(-size, size))
        step = data.draw(st.sampled_from([1, 1, 2, 3, -1]))
        begin.append(start), end.append(stop), strides.append(step)
    masks = {name: data.draw(st.integers(0, 15)) for name in ("begin_mask", "end_mask")}
    masks["shrink_axis_mask"] = data.draw(st.sampled_from([0, 0, 1, 2, 8, 6]))
    from delegate.strided import strided_slice_plan
    out = strided_slice_plan(shape, begin, end, strides, masks).output_shape
    if 0 in out:
        return  # an empty slice has no GPU tensor (it is refused); nothing to compare
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    consts = [b.const(n, np.array(v, np.int32)) for n, v in (("begin", begin), ("end", end), ("strides", strides))]
    b.output(b.op("STRIDED_SLICE", [x, *consts], options=masks))
    check(b, [normal(rng, shape)])


@given(block=st.integers(1, 3), hw=st.integers(1, 4), depth=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_depth_to_space(block, hw, depth, seed):
    shape = (1, hw, hw + 1, depth * block * block)
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op("DEPTH_TO_SPACE", [x], options={"block_size": block}))
    check(b, [normal(rng, shape)])


# -- recurrent ----------------------------------------------------------------------
@settings(max_examples=6)
@given(batch=st.integers(1, 3), inputs=st.integers(1, 9), units=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_lstm_basic_kernel(batch, inputs, units, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (batch, inputs))
    prev_activ = b.input("prev_activ", (batch, units))
    prev_state = b.input("prev_state", (batch, units))
    weights = b.const("w", normal(rng, (4 * units, inputs + units), 0.5))
    bias = b.const("b", normal(rng, 4 * units, 0.5))
    outs = b.op("LSTM", [x, prev_activ, weights, bias, prev_state], version=2,
                options={"fused_activation_function": "TANH", "kernel_type": "BASIC"},
                shapes=[(batch, units), (batch, units), (batch, inputs + units), (batch, 4 * units)])
    b.output(*outs)
    check(b, [normal(rng, (batch, inputs)), normal(rng, (batch, units)), normal(rng, (batch, units))])
