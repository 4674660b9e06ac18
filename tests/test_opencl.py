"""The opencl backend against LiteRT, op by op, on the OpenCL device found here (PoCL on CI).

Models are built with the project's writer; shapes and parameters are drawn by
hypothesis.  fp32 results must match LiteRT within 1e-4 of the output range;
the fp16-storage test allows 3e-3 (half keeps 11 significant bits and values are
rounded at every stored tensor).  Compiled programs are shared by the whole
session (the device state memoises builds by source), so the many examples of
one test cost one build.
"""

from __future__ import annotations

import re
import stat
import struct
import time

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from delegate import CacheError, CompileError, CompileOptions, PluginError, read_model
from delegate.cache import CacheWarning, EntryStore
from delegate.gpu.fusion import is_matmul
from delegate.gpu.plan import BufferSpec
from delegate.partition import make_partition
from delegate.plugins import default_manager
from delegate.runtime import Executor
from delegate.tflite.builder import GraphBuilder
from tests.models import normal, residual_block, squeeze_excitation
from tests.oputil import assert_close, check_against_litert, litert_run

pyopencl = pytest.importorskip("pyopencl", reason="pyopencl is not installed")
from delegate_opencl import lowering  # noqa: E402
from delegate_opencl.compiled import ClCompiled  # noqa: E402
from delegate_opencl.geometry import MATVEC_ROWS  # noqa: E402
from delegate_opencl.device import probe  # noqa: E402
from delegate_opencl.arena import ALIGN, make_arena, offsets  # noqa: E402
from delegate_opencl.program import (MAPPINGS, ProgramBuilder, Variant, epilogue_code, program_source,  # noqa: E402
                                     template, templates, variant, variant_of)

_AVAILABLE, _WHY = probe()
if not _AVAILABLE:
    pytest.skip(f"no OpenCL device: {_WHY}", allow_module_level=True)

RTOL = 1e-4
ACTIVATIONS = st.sampled_from(["NONE", "RELU", "RELU6", "RELU_N1_TO_1"])


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


@pytest.mark.parametrize("tile", [(16, 8, 8, 1), (4, 8, 8, 1), (64, 2, 8, 1), (16, 2, 1, 1), (8, 4, 4, 1),
                                  (4, 8, 4, 4), (8, 4, 8, 2), (16, 2, 4, 8), (32, 4, 1, 2)])
@settings(max_examples=8)
@given(rows=st.integers(5, 70), depth=st.integers(1, 45), units=st.integers(1, 40), conv=st.booleans(),
       fp16=st.booleans(), seed=st.integers(0, 2**16))
def test_matmul_tiles(tile, rows, depth, units, conv, fp16, seed):
    """Work-group shapes, chunks and split sums of the tiled product, on sizes that are not multiples of its
    tile or of the staged chunk (nor of the chunks all layers of a split sum take per step): 1x1
    convolutions over rows pixels and fully connected layers over rows rows."""
    rng = np.random.default_rng(seed)
    shape = (1, 1, rows, depth) if conv else (rows, depth)
    b = GraphBuilder()
    x = b.input("x", shape)
    w = normal(rng, (units, 1, 1, depth) if conv else (units, depth))
    bias = b.const("b", normal(rng, units))
    if conv:
        b.output(b.op("CONV_2D", [x, b.const("w", w), bias], options={"padding": "SAME", "stride_h": 1, "stride_w": 1,
                                                                    "fused_activation_function": "RELU"}))
    else:
        b.output(b.op("FULLY_CONNECTED", [x, b.const("w", w), bias], options={"fused_activation_function": "RELU"}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lowering, "matmul_shape", lambda *args: tile)
        check(b, [normal(rng, shape)], *((FP16_RTOL, FP16) if fp16 else ()))


@settings(max_examples=8)
@given(batch=st.integers(1, 6), side=st.integers(1, 4), channels=st.integers(1, 9), units=st.integers(1, 12),
       seed=st.integers(0, 2**16))
def test_conv_covering_the_input_is_a_matrix_product(batch, side, channels, units, seed):
    """A window as large as the input gives one pixel per image: a product over the whole image, its
    sum spread over a work group up to 4 images, tiled beyond."""
    rng = np.random.default_rng(seed)
    shape = (batch, side, side + 1, channels)
    b = GraphBuilder()
    x = b.input("x", shape)
    w = b.const("w", normal(rng, (units, side, side + 1, channels)))
    b.output(b.op("CONV_2D", [x, w, b.const("b", normal(rng, units))],
                  options={"padding": "VALID", "stride_h": 1, "stride_w": 1}))
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
    stride = min(stride, k)  # LiteRT runs this op through XNNPACK only, which needs stride <= kernel
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


@pytest.mark.parametrize("op,shape,axes", [("MEAN", (1, 40, 33, 70), (1, 2)), ("MEAN", (1, 3, 5, 300), (3,)),
                                            ("SOFTMAX", (2, 1000), None), ("SOFTMAX", (1, 9, 7, 130), None),
                                            ("AVERAGE_POOL_2D", (2, 17, 23, 9), None)])
@pytest.mark.parametrize("fp16", [False, True])
def test_reductions_over_many_values(op, shape, axes, fp16):
    """Reductions longer than a work group: every item sums several values before the group combines
    them (a global average pool runs as a mean)."""
    rng = np.random.default_rng(11)
    b = GraphBuilder()
    x = b.input("x", shape)
    if op == "MEAN":
        y = b.op("MEAN", [x, b.const("axes", np.array(axes, np.int32))], options={"keep_dims": True})
    elif op == "SOFTMAX":
        y = b.op("SOFTMAX", [x], options={"beta": 1.0})
    else:
        y = b.op(op, [x], options={"padding": "VALID", "filter_height": shape[1], "filter_width": shape[2],
                                   "stride_h": 1, "stride_w": 1, "fused_activation_function": "RELU6"})
    b.output(y)
    check(b, [normal(rng, shape, 3)], *((FP16_RTOL, FP16) if fp16 else ()))


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


def test_concatenation_clears_the_padding_lanes_of_a_shared_buffer(backend):
    """The concatenation's output reuses the buffer of an earlier tensor holding inf in its last lanes;
    the lanes past the six channels must read as zeros, or the 1x1 product after it computes inf * 0."""
    b = GraphBuilder()
    x = b.input("x", (1, 3, 3, 8))
    u = b.op("EXP", [b.op("MUL", [x, b.const("k", np.array([100.0], np.float32))])])
    parts = []
    for i, (start, stop) in enumerate(((0, 3), (3, 6))):
        consts = [b.const(f"{n}{i}", np.array(v, np.int32))
                  for n, v in (("begin", [0, 0, 0, start]), ("end", [1, 3, 3, stop]), ("strides", [1, 1, 1, 1]))]
        parts.append(b.op("MINIMUM", [b.op("STRIDED_SLICE", [u, *consts]), b.const(f"one{i}", np.ones(1, np.float32))]))
    c = b.op("CONCATENATION", parts, options={"axis": 3})
    rng = np.random.default_rng(4)
    b.output(b.op("CONV_2D", [c, b.const("w", normal(rng, (4, 1, 1, 6))), b.const("b", normal(rng, 4))],
                  options={"padding": "VALID", "stride_w": 1, "stride_h": 1}))
    _, compiled = compile_whole(backend, b)
    writes = {launch.label.split("#")[0]: launch.args[0][1] for launch in compiled.plan.launches}
    assert writes["CONCATENATION"] == writes["MUL"]  # the product's result (inf past channel 6) is gone by then
    data = normal(rng, (1, 3, 3, 8))
    data[..., 6:] = 2.0  # exp(200) is inf in float32
    check(b, [data])


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
    # LiteRT reads garbage for a shrunk axis with a negative stride; keep those strides positive.
    strides = [abs(step) if masks["shrink_axis_mask"] >> i & 1 else step for i, step in enumerate(strides)]
    from delegate.strided import strided_slice_plan
    out = strided_slice_plan(shape, begin, end, strides, masks).output_shape
    assume(0 not in out)  # an empty result is refused by the GPU path
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


# -- precision ------------------------------------------------------------------------
FP16 = CompileOptions(precision="fp16")
FP16_RTOL = 3e-3  # half storage: ~11 significant bits, rounded at every stored tensor and weight


@settings(max_examples=8)
@given(case=conv_case().filter(_fits), seed=st.integers(0, 2**16))
def test_fp16_storage(case, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", case["shape"])
    w = b.const("w", normal(rng, (case["out"], case["kh"], case["kw"], case["shape"][3])))
    y = b.op("CONV_2D", [x, w, b.const("b", normal(rng, case["out"]))], options=_conv_options(case))
    pooled = b.op("AVERAGE_POOL_2D", [y], options={"padding": "SAME", "filter_height": 2, "filter_width": 2,
                                                   "stride_h": 1, "stride_w": 1})
    b.output(b.op("SOFTMAX", [b.op("HARD_SWISH", [pooled])], options={"beta": 1.0}))
    check(b, [normal(rng, case["shape"])], rtol=FP16_RTOL, options=FP16)


# -- compiled partitions: fusion, folding, layout ----------------------------------------
@pytest.fixture(scope="module")
def backend():
    from delegate_opencl.backend import OpenCLBackend
    return OpenCLBackend({})


def compile_whole(backend, b: GraphBuilder, options=None):
    g = read_model(b.to_bytes()).main
    return g, backend.compile(make_partition(g, g.ops, "opencl", 0), options or CompileOptions())


def run_compiled(backend, g, compiled, inputs):
    values = compiled.run({t.index: backend.to_device(x) for t, x in zip(g.inputs, inputs)})
    return [backend.to_host(values[t.index]) for t in g.outputs]


def test_fusion_runs_conv_and_followers_as_one_kernel(backend):
    rng = np.random.default_rng(1)
    fused = residual_block(rng)
    g, compiled = compile_whole(backend, fused)
    facts = compiled.describe()
    assert facts["ops"] == 4 and facts["kernels"] == 1
    assert facts["fused"] == ["CONV_2D#0+ADD#1+MUL#2+HARD_SWISH#3"]
    inputs = [normal(rng, (1, 6, 5, 7)), normal(rng, (1, 6, 5, 6))]
    check(fused, inputs)
    rng = np.random.default_rng(1)
    _, split = compile_whole(backend, residual_block(rng, extra_output=True))  # the ADD result is needed outside
    assert split.describe()["kernels"] == 2


def test_elementwise_chain_is_one_kernel(backend):
    rng = np.random.default_rng(2)
    b = GraphBuilder()
    x, y = b.input("x", (1, 3, 4, 5)), b.input("y", (1, 1, 1, 5))
    v = b.op("LOGISTIC", [x])
    v = b.op("MUL", [v, y], options={"fused_activation_function": "NONE"})
    v = b.op("SUB", [b.const("c", normal(rng, (5,))), v], options={"fused_activation_function": "RELU"})
    b.output(b.op("PRELU", [v, b.const("a", normal(rng, (1, 1, 5)))]))
    _, compiled = compile_whole(backend, b)
    assert compiled.describe()["kernels"] == 1
    check(b, [normal(rng, (1, 3, 4, 5)), normal(rng, (1, 1, 1, 5))])


@pytest.mark.parametrize("batch, channels, precision", [(1, 16, "fp32"), (2, 37, "fp32"), (1, 96, "fp16")])
def test_squeeze_and_excitation_in_three_kernels(backend, batch, channels, precision):
    """As on WebGPU: global pooling; both bottleneck convolutions in one work group (dense_pair.cl, its
    LOGISTIC the epilogue); the gate applied where the projection stages its input."""
    rng = np.random.default_rng(21)
    b = squeeze_excitation(rng, batch, channels, fused_relu=True)
    g, compiled = compile_whole(backend, b, CompileOptions(precision=precision))
    assert compiled.describe()["launches"][1] == "CONV_2D#1+CONV_2D#2+LOGISTIC#3"
    assert compiled.describe()["kernels"] == 3
    inputs = [normal(rng, (batch, 6, 7, channels))]
    assert_close(run_compiled(backend, g, compiled, inputs), litert_run(b.to_bytes(), inputs),
                 rtol=2e-2 if precision == "fp16" else RTOL, atol=1e-5)


def test_a_chain_of_three_one_pixel_convolutions_pairs_the_first_two(backend):
    """A one-pixel 1x1 convolution reading the first of a pair is not folded into the next: the first two run
    as one dense_pair.cl launch, the third as its own product."""
    rng = np.random.default_rng(23)
    b = GraphBuilder()
    v = b.input("x", (1, 1, 1, 6))
    for i, (cin, cout) in enumerate([(6, 5), (5, 7), (7, 3)]):
        v = b.op("CONV_2D", [v, b.const(f"w{i}", normal(rng, (cout, 1, 1, cin))), b.const(f"b{i}", normal(rng, cout))],
                 options={"padding": "VALID", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"})
    b.output(v)
    g, compiled = compile_whole(backend, b)
    assert compiled.describe()["launches"] == ["CONV_2D#0+CONV_2D#1", "CONV_2D#2"]
    inputs = [normal(rng, (1, 1, 1, 6))]
    assert_close(run_compiled(backend, g, compiled, inputs), litert_run(b.to_bytes(), inputs), rtol=RTOL, atol=1e-5)


@settings(max_examples=10)
@given(case=conv_case().filter(_fits), multiplier=st.sampled_from([1, 2]), units=st.integers(1, 9),
       relu=st.booleans(), fp16=st.booleans(), seed=st.integers(0, 2**16))
def test_depthwise_then_1x1_is_one_kernel(backend, case, multiplier, units, relu, fp16, seed):
    """A depthwise convolution read only by a 1x1 convolution is computed inside the product's kernel,
    its activations (fused or as ops) included; not when its result is needed elsewhere."""
    rng = np.random.default_rng(seed)
    n, h, w, c = case["shape"]
    shape = (n, h + 2, w + 2, c)  # a few more pixels than the rows spread over a work group
    b = GraphBuilder()
    x = b.input("x", shape)
    dw = b.op("DEPTHWISE_CONV_2D", [x, b.const("dw", normal(rng, (1, case["kh"], case["kw"], c * multiplier))),
                                    b.const("db", normal(rng, c * multiplier))],
              options=_conv_options(case) | {"depth_multiplier": multiplier},
              version=2 if case["dilation"] != (1, 1) else 1)
    if relu:
        dw = b.op("RELU", [dw])
    pw = b.const("pw", normal(rng, (units, 1, 1, c * multiplier)))
    b.output(b.op("CONV_2D", [dw, pw, b.const("pb", normal(rng, units))],
                  options={"padding": "VALID", "stride_h": 1, "stride_w": 1, "fused_activation_function": "RELU6"}))
    g, compiled = compile_whole(backend, b)
    pixels = int(np.prod(g.ops[-1].inputs[0].shape[:3]))
    assert compiled.describe()["kernels"] == (1 if pixels > MATVEC_ROWS else 2)
    check(b, [normal(rng, shape)], *((FP16_RTOL, FP16) if fp16 else ()))
    b.output(dw)  # the depthwise result leaves the partition: stored, so computed on its own
    _, compiled = compile_whole(backend, b)
    assert compiled.describe()["kernels"] == 2


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("source", ["pixels", "depthwise", "gated"])
def test_products_of_few_tiles_split_their_sums_on_a_device_of_many_units(backend, source, fp16):
    """Counted as on the H200 (132 compute units), a 7x7 product of long sums gives too few tiles and its
    work group's layers share each sum (SPLIT), whatever it stages: the pixels, a depthwise convolution
    computed there (one kernel for both), or a gated input; the results are LiteRT's."""
    real = lowering.matmul_shape
    rng = np.random.default_rng(31)
    channels = 128 if source == "depthwise" else 256  # the depthwise fold's limit: DEPTHWISE_FOLD_MAX_CHANNELS
    if source == "gated":
        b = squeeze_excitation(rng, 1, channels, fused_relu=True)
        inputs = [normal(rng, (1, 6, 7, channels))]
    else:
        b = GraphBuilder()
        v = b.input("x", (1, 7, 7, channels))
        if source == "depthwise":
            v = b.op("DEPTHWISE_CONV_2D", [v, b.const("dw", normal(rng, (1, 3, 3, channels))),
                                           b.const("db", normal(rng, channels))],
                     options={"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1})
        b.output(b.op("CONV_2D", [v, b.const("w", normal(rng, (40, 1, 1, channels), 1 / 16)),
                                  b.const("b", normal(rng, 40))],
                      options={"padding": "VALID", "stride_h": 1, "stride_w": 1, "fused_activation_function": "RELU6"}))
        inputs = [normal(rng, (1, 7, 7, channels))]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lowering, "matmul_shape", lambda rows, slices, depth, units, staging=1.0:
                      real(rows, slices, depth, 132, staging))
        g, compiled = compile_whole(backend, b, CompileOptions(precision="fp16" if fp16 else "fp32"))
    splits = [dict(launch.params["defines"])["SPLIT"] for launch in compiled.plan.launches if launch.kernel == "matmul"]
    assert splits and max(splits) > 1, splits
    if source == "depthwise":
        assert compiled.describe()["kernels"] == 1
    assert_close(run_compiled(backend, g, compiled, inputs), litert_run(b.to_bytes(), inputs),
                 rtol=FP16_RTOL if fp16 else RTOL, atol=1e-5)


def test_depthwise_over_many_channels_stays_its_own_kernel(backend):
    """Past DEPTHWISE_FOLD_MAX_CHANNELS the product's kernel would recompute the depthwise convolution
    channel after channel: it runs as its own kernel, before the product, with the same results."""
    from delegate.passes import DEPTHWISE_FOLD_MAX_CHANNELS

    rng = np.random.default_rng(3)
    c = DEPTHWISE_FOLD_MAX_CHANNELS + 32
    b = GraphBuilder()
    x = b.input("x", (1, 9, 9, c))
    dw = b.op("DEPTHWISE_CONV_2D", [x, b.const("dw", normal(rng, (1, 3, 3, c))), b.const("db", normal(rng, c))],
              options={"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1})
    b.output(b.op("CONV_2D", [dw, b.const("pw", normal(rng, (8, 1, 1, c))), b.const("pb", normal(rng, 8))],
                  options={"padding": "VALID", "stride_h": 1, "stride_w": 1}))
    _, compiled = compile_whole(backend, b)
    assert compiled.describe()["kernels"] == 2
    check(b, [normal(rng, (1, 9, 9, c))])


@settings(max_examples=10)
@given(shape=image(), units=st.integers(1, 9), per_image=st.booleans(), swapped=st.booleans(),
       const=st.booleans(), seed=st.integers(0, 2**16))
def test_gate_then_1x1_is_one_kernel(backend, shape, units, per_image, swapped, const, seed):
    """A product by one value per channel (a squeeze-and-excitation gate) read only by a 1x1 convolution
    is applied where the product's kernel stages its input."""
    n, h, w, c = shape
    assume(n * h * w > MATVEC_ROWS)
    rng = np.random.default_rng(seed)
    gate_shape = (n if per_image else 1, 1, 1, c)
    b = GraphBuilder()
    x = b.input("x", shape)
    gate = b.const("g", normal(rng, gate_shape)) if const else b.input("g", gate_shape)
    y = b.op("MUL", [gate, x] if swapped else [x, gate], options={"fused_activation_function": "NONE"})
    b.output(b.op("CONV_2D", [y, b.const("w", normal(rng, (units, 1, 1, c))), b.const("b", normal(rng, units))],
                  options={"padding": "SAME", "stride_h": 1, "stride_w": 1}))
    _, compiled = compile_whole(backend, b)
    assert compiled.describe()["kernels"] == 1
    check(b, [normal(rng, shape)] + ([] if const else [normal(rng, gate_shape)]))


def test_depthwise_read_by_a_single_input_op(backend):
    rng = np.random.default_rng(12)
    b = GraphBuilder()
    x = b.input("x", (1, 6, 5, 8))
    dw = b.op("DEPTHWISE_CONV_2D", [x, b.const("w", normal(rng, (1, 3, 3, 8))), b.const("b", normal(rng, 8))],
              options={"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1})
    b.output(b.op("SOFTMAX", [dw], options={"beta": 1.0}))
    check(b, [normal(rng, (1, 6, 5, 8))])


@settings(max_examples=10)
@given(case=conv_case(), depthwise=st.booleans(), pads=st.lists(st.integers(0, 2), min_size=4, max_size=4),
       seed=st.integers(0, 2**16))
def test_pad_then_convolution_is_one_kernel(backend, case, depthwise, pads, seed):
    """A zero PAD of H and W read only by a convolution becomes part of the convolution's padding."""
    n, h, w, c = case["shape"]
    padded = (n, h + pads[0] + pads[1], w + pads[2] + pads[3], c)
    assume(_fits(case | {"shape": padded}))
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", case["shape"])
    y = b.op("PAD", [x, b.const("pads", np.array([[0, 0], pads[:2], pads[2:], [0, 0]], np.int32))])
    out = c if depthwise else case["out"]
    weights = normal(rng, (1, case["kh"], case["kw"], c) if depthwise else (out, case["kh"], case["kw"], c))
    options = _conv_options(case) | ({"depth_multiplier": 1} if depthwise else {})
    b.output(b.op("DEPTHWISE_CONV_2D" if depthwise else "CONV_2D", [y, b.const("w", weights),
                                                                    b.const("b", normal(rng, out))],
                  options=options, version=2 if depthwise and case["dilation"] != (1, 1) else 1))
    g, compiled = compile_whole(backend, b)
    product = not depthwise and is_matmul(g.ops[-1])  # a product reads no padding: the PAD runs its own kernel
    assert compiled.describe()["kernels"] == 1 + product
    check(b, [normal(rng, case["shape"])])


def fp16_weight_conv(rng):
    b = GraphBuilder()
    x = b.input("x", (1, 5, 5, 3))
    w = b.op("DEQUANTIZE", [b.const("w16", normal(rng, (4, 3, 3, 3)).astype(np.float16))], version=2,
             dtype="float32")
    bias = b.op("DEQUANTIZE", [b.const("b16", normal(rng, 4).astype(np.float16))], version=2, dtype="float32")
    b.output(b.op("CONV_2D", [x, w, bias], options={"padding": "VALID", "stride_w": 1, "stride_h": 1}))
    return b


def test_dequantize_of_constants_is_folded_at_compile(backend):
    rng = np.random.default_rng(3)
    b = fp16_weight_conv(rng)
    _, compiled = compile_whole(backend, b)
    assert compiled.describe()["kernels"] == 1  # the DEQUANTIZE ops never run
    check(b, [normal(rng, (1, 5, 5, 3))])


def test_folded_weights_from_a_cpu_partition(backend):
    """The DEQUANTIZEs placed on the CPU: the GPU partition still folds the weights at compile time."""
    rng = np.random.default_rng(4)
    data = fp16_weight_conv(rng).to_bytes()
    g = read_model(data).main
    cpu = default_manager().backend_info("cpu").factory({})
    parts = [make_partition(g, g.ops[:2], "cpu", 0), make_partition(g, g.ops[2:], "opencl", 1)]
    x = normal(rng, (1, 5, 5, 3))
    out = Executor(g, parts, {"cpu": cpu, "opencl": backend}, CompileOptions()).run({g.inputs[0].index: x})
    assert_close([out[g.outputs[0].index]], litert_run(data, [x]), rtol=RTOL, atol=1e-5)


def test_values_stay_on_the_device_between_partitions(backend):
    rng = np.random.default_rng(9)
    b = residual_block(rng)
    data = b.to_bytes()
    g = read_model(data).main
    parts = [make_partition(g, g.ops[:2], "opencl", 0), make_partition(g, g.ops[2:], "opencl", 1)]
    inputs = [normal(rng, (1, 6, 5, 7)), normal(rng, (1, 6, 5, 6))]
    executor = Executor(g, parts, {"opencl": backend}, CompileOptions())
    out = executor.run({t.index: x for t, x in zip(g.inputs, inputs)})
    assert executor.transfers_last_run == 3  # two inputs up, one output down: the ADD result never leaves
    assert_close([out[g.outputs[0].index]], litert_run(data, inputs), rtol=RTOL, atol=1e-5)


def test_every_kernel_takes_one_buffer_the_arena(backend):
    """A buffer argument costs the driver per launch: no template, mapping or generated epilogue declares one
    besides ARENA (tensors are AT offsets into it)."""
    sources = {name: template(name) for name in templates() if name not in MAPPINGS}
    for name, source in sources.items():
        signature = re.search(r"KERNEL_NAME\((.*?)\)\s*\{", source, re.S).group(1)
        assert signature.startswith("ARENA, ") and "__global" not in signature, name
        macros = [line for line in source.splitlines() if line.startswith("#define") and "PARAMS" in line]
        assert not any("__global" in line for line in macros), name
    _, compiled = compile_whole(backend, residual_block(np.random.default_rng(3)))  # an ADD of a tensor fused
    params, _ = epilogue_code(variant_of(compiled.plan.launches[0]).epilogue)
    assert "__global" not in params and "AT(e1)" in params
    gathered = dict(variant("concat", constants=(("views", 1),), inputs=3).defines)
    assert "__global" not in gathered["GATHER_INPUTS"] and "AT(in2)" in gathered["GATHER_INPUTS"]


def test_arena_ranges_are_aligned_and_disjoint(backend):
    rng = np.random.default_rng(3)
    _, compiled = compile_whole(backend, residual_block(rng))
    regions = sorted(compiled.buffers, key=lambda r: r.offset)
    assert len({r.buffer.int_ptr for r in regions}) == 1 and len(regions) == len(compiled.plan.buffers)
    assert all(r.offset % ALIGN == 0 for r in regions)
    assert all(a.offset + a.nbytes <= b.offset for a, b in zip(regions, regions[1:]))
    assert regions[-1].offset + regions[-1].nbytes <= compiled.arena.size == compiled.describe()["device_bytes"]
    assert offsets([0, 1, ALIGN, ALIGN + 1]) == ([0, ALIGN, 2 * ALIGN, 3 * ALIGN], 5 * ALIGN)
    assert make_arena(pyopencl, None, None, None, [], b"") == []  # a plan without buffers allocates none


def test_arena_larger_than_one_buffer_may_be_is_a_compile_error():
    class Small:  # the device, allowing single buffers of 1 KiB
        name, max_mem_alloc_size = "small device", 1024
    spec = BufferSpec(4096, "scratch")
    with pytest.raises(CompileError, match="need 4096 bytes in one OpenCL buffer and small device allows at most 1024"):
        make_arena(pyopencl, None, None, Small(), [spec], b"")


def test_a_copy_larger_than_its_range_is_refused(backend):
    """Past its range lie other tensors of the arena: an upload or read that would not fit is an error."""
    rng = np.random.default_rng(4)
    g, compiled = compile_whole(backend, residual_block(rng))
    boundary = compiled.inputs[0]
    target = boundary.buffer if boundary.kernel is None else boundary.staging
    too_big = np.zeros(target.nbytes // 4 + 1, np.float32)
    with pytest.raises(ValueError, match="does not fit its"):
        boundary.upload(pyopencl, compiled.device.queue, too_big)


@given(shape=st.lists(st.integers(1, 7), min_size=0, max_size=4).map(tuple),
       dtype=st.sampled_from([np.float32, np.bool_, np.int8]), seed=st.integers(0, 2**16))
def test_boundary_conversion_round_trip(backend, shape, dtype, seed):
    x = (np.random.default_rng(seed).standard_normal(shape) * 50).astype(dtype)
    back = backend.to_host(backend.to_device(x))
    assert back.dtype == x.dtype
    np.testing.assert_array_equal(back, x)


@given(shape=image(max_channels=9), precision=st.sampled_from(["fp32", "fp16"]), seed=st.integers(0, 2**16))
def test_device_buffers_round_trip(backend, shape, precision, seed):
    """Host NHWC -> device PHWC4 -> host through a partition whose only op is a free reshape: the layout
    changes are kernels on the device, skipped where the NHWC bytes are the start of the PHWC4 ones."""
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op("RESHAPE", [x, b.const("s", np.array((shape[0], 1, shape[1] * shape[2], shape[3]), np.int32))]))
    g, compiled = compile_whole(backend, b, CompileOptions(precision=precision))
    assert compiled.describe()["kernels"] == 0
    n, h, w, c = shape
    same_bytes = precision == "fp32" and (c == 4 or (h * w == 1 and (c % 4 == 0 or n == 1)))
    assert [boundary.kernel is None for boundary in compiled.inputs + compiled.outputs] == [same_bytes] * 2
    data = np.random.default_rng(seed).integers(-1000, 1000, shape).astype(np.float32)  # exact in half too
    np.testing.assert_array_equal(run_compiled(backend, g, compiled, [data])[0], data.reshape(g.outputs[0].shape))


def test_per_op_profile_from_event_timestamps(backend):
    rng = np.random.default_rng(8)
    g, compiled = compile_whole(backend, residual_block(rng, extra_output=True))
    inputs = [normal(rng, (1, 6, 5, 7)), normal(rng, (1, 6, 5, 6))]
    compiled.set_profiling(True)
    started = time.perf_counter()
    for _ in range(3):
        run_compiled(backend, g, compiled, inputs)
    wall_ms = (time.perf_counter() - started) * 1e3
    times = compiled.profile()
    assert set(times) == {0, 2}  # each kernel's time is booked on its first op: the conv, and the MUL
    assert all(ms >= 0 for ms in times.values()) and sum(times.values()) * 3 <= wall_ms
    compiled.set_profiling(False)
    assert compiled.profile() == {}


# -- kernel cache and tuning ---------------------------------------------------------------
def fresh_builder(backend):
    """What a new process sees: the same device, nothing built yet."""
    s = backend.state
    return ProgramBuilder(s.cl, s.context, s.device, s.facts)


def test_second_compile_loads_binaries(backend, tmp_path):
    source = program_source([Variant("conv2d"), Variant("pool2d", (("unary", "RELU6", None, False, ()),))], ())
    cache = EntryStore(tmp_path, "opencl", "model-a")
    first = fresh_builder(backend).build(source, cache)
    second = fresh_builder(backend).build(source, cache)
    assert (first.origin, second.origin) == ("source", "cache")


def test_programs_built_earlier_reach_a_new_cache_directory(backend, tmp_path):
    source = program_source([Variant("elementwise", (("unary", "RELU", None, False, ()),))], ())
    builder = fresh_builder(backend)
    assert builder.build(source, None).origin == "source"
    cache = EntryStore(tmp_path, "opencl", "late")
    assert builder.build(source, cache).origin == "memory"
    assert fresh_builder(backend).build(source, cache).origin == "cache"


def test_compile_uses_the_cache_and_gives_the_same_answers(backend, tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    b = residual_block(rng)
    inputs = [normal(rng, (1, 6, 5, 7)), normal(rng, (1, 6, 5, 6))]
    options = CompileOptions(cache_dir=str(tmp_path), model_token="residual")
    results = []
    for expected in ("source", "cache"):
        monkeypatch.setattr(backend.state, "builder", fresh_builder(backend))
        g, compiled = compile_whole(backend, b, options)
        assert compiled.describe()["program"] == expected
        results.append(run_compiled(backend, g, compiled, inputs))
    np.testing.assert_array_equal(results[0][0], results[1][0])


@pytest.mark.parametrize("damage,why", [
    (lambda raw: raw[:-7] + bytes(b ^ 0xFF for b in raw[-7:]), "checksum"),
    (lambda raw: raw[: raw.index(b"\n") + 20], "checksum"),
    (lambda raw: b"garbage", "not an entry of this format"),
])
def test_damaged_entries_are_rebuilt_with_a_warning(backend, tmp_path, damage, why):
    source = program_source([Variant("elementwise", (("unary", "EXP", None, False, ()),))], ())
    cache = EntryStore(tmp_path, "opencl", "m")
    built = fresh_builder(backend).build(source, cache)
    path = cache.path(built.key, "bin")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.warns(CacheWarning, match=why):
        again = fresh_builder(backend).build(source, cache)
    assert again.origin == "source"
    assert fresh_builder(backend).build(source, cache).origin == "cache"  # rewritten whole


def test_entry_for_other_source_is_not_trusted(backend, tmp_path):
    cache = EntryStore(tmp_path, "opencl", "m")
    sources = [program_source([Variant("elementwise", ((("unary", op, None, False, ())),))], ())
               for op in ("EXP", "TANH")]
    builders = [fresh_builder(backend) for _ in sources]
    keys = [builders[0].key(s) for s in sources]
    builders[0].build(sources[0], cache)
    cache.path(keys[1], "bin").write_bytes(cache.path(keys[0], "bin").read_bytes())
    with pytest.warns(CacheWarning, match="another device, source or options"):
        assert builders[1].build(sources[1], cache).origin == "source"


def test_cache_directory_is_private(tmp_path):
    cache = EntryStore(tmp_path / "new" / "dir", "opencl", "m")
    for path in (tmp_path / "new" / "dir", cache.directory):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    cache.store("k" * 64, "bin", b"payload")
    assert cache.load("k" * 64, "bin") == b"payload"
    assert [p.name for p in cache.directory.iterdir() if p.name.startswith(".tmp")] == []


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_writable_cache_directory_is_refused(backend, tmp_path, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(CacheError, match="writable by group or others"):
        compile_whole(backend, residual_block(np.random.default_rng(0)), CompileOptions(cache_dir=str(shared)))


def test_sustained_speed_tunes_work_groups_once(backend, tmp_path, monkeypatch):
    rng = np.random.default_rng(6)
    b = residual_block(rng)
    inputs = [normal(rng, (1, 6, 5, 7)), normal(rng, (1, 6, 5, 6))]
    options = CompileOptions(inference_preference="sustained_speed", cache_dir=str(tmp_path), model_token="tuned")
    g, first = compile_whole(backend, b, options)
    assert first.describe()["work_group_sizes"] == "tuned"
    assert list((tmp_path / "opencl").glob("tuned-*.tune"))
    monkeypatch.setattr(ClCompiled, "_fastest", lambda *args: pytest.fail("tuned again despite the cache"))
    g, second = compile_whole(backend, b, options)
    assert [l for _, _, l in second.launches] == [l for _, _, l in first.launches]
    assert_close(run_compiled(backend, g, second, inputs), litert_run(b.to_bytes(), inputs), rtol=RTOL, atol=1e-5)
    _, default = compile_whole(backend, b, CompileOptions())
    assert default.describe()["work_group_sizes"].startswith("default")


# -- device selection ----------------------------------------------------------------------
def test_missing_device_lists_what_exists(backend):
    from delegate_opencl.backend import OpenCLBackend
    with pytest.raises(PluginError) as info:
        OpenCLBackend({"device": "no-such-device-anywhere"})
    message = str(info.value)
    assert "devices found" in message and backend.device_info()["device"] in message


def test_device_type_selects_and_filters(backend):
    from delegate_opencl.backend import OpenCLBackend
    kind = backend.device_info()["device_type"]
    assert OpenCLBackend({"device_type": kind}).device_info()["device"] == backend.device_info()["device"]
    import pyopencl as cl
    from delegate_opencl.device import device_kind
    present = {device_kind(cl, d) for p in cl.get_platforms() for d in p.get_devices()}
    for missing in {"gpu", "cpu", "accelerator"} - present:
        with pytest.raises(PluginError, match=f"device_type={missing}"):
            OpenCLBackend({"device_type": missing})


@pytest.mark.parametrize("options,needle", [({"device_type": "fpga"}, "gpu, cpu, accelerator, any"),
                                            ({"colour": "blue"}, "valid options: platform, device, device_type")])
def test_invalid_device_options(options, needle):
    from delegate_opencl.backend import OpenCLBackend
    with pytest.raises(PluginError, match=needle):
        OpenCLBackend(options)


def test_device_info_keys_caches_and_reports_fp16(backend):
    import delegate_opencl
    info = backend.device_info()
    for key in ("platform", "device", "driver_version", "plugin_version", "extensions", "fp16"):
        assert key in info
    assert info["plugin_version"] == delegate_opencl.__version__
    assert info["fp16"] == ("cl_khr_fp16" in info["extensions"])
    _, compiled = compile_whole(backend, residual_block(np.random.default_rng(0)), FP16)
    facts = compiled.describe()
    assert facts["precision"] == ("fp16" if info["fp16"] else "fp16 storage")
    assert "cl_khr_fp16" in facts["precision_reason"]


# -- partitions with the CPU: the float view and whole models ---------------------------------
def split_by_support(g, backend, options, deny=()):
    """Consecutive ops in model order grouped by where they run: opencl when it says yes, else the CPU."""
    runs = []
    for op in g.ops:
        where = "opencl" if op.opcode not in deny and backend.supports(op, options) else "cpu"
        if runs and runs[-1][0] == where:
            runs[-1][1].append(op)
        else:
            runs.append((where, [op]))
    return [make_partition(g, ops, where, i) for i, (where, ops) in enumerate(runs)]


def run_split(backend, data, inputs, options, deny=()):
    g = read_model(data).main
    parts = split_by_support(g, backend, options, deny)
    cpu = default_manager().backend_info("cpu").factory({})
    executor = Executor(g, parts, {"cpu": cpu, "opencl": backend}, options)
    out = executor.run({t.index: x for t, x in zip(g.inputs, inputs)})
    return [out[t.index] for t in g.outputs], parts, executor


def quantized_conv_model(rng):
    """float -> QUANTIZE -> int8 CONV_2D (per-channel weights) -> int8 MAX_POOL -> DEQUANTIZE -> float."""
    b = GraphBuilder()
    x = b.input("x", (1, 7, 6, 3))
    q = b.op("QUANTIZE", [x], dtype="int8", quant=(0.02, -3))
    w_scale = rng.uniform(0.005, 0.02, 5).astype(np.float32)
    w = b.const("w", rng.integers(-127, 128, (5, 3, 3, 3)).astype(np.int8), quant=(w_scale, np.zeros(5), 0))
    bias = b.const("b", rng.integers(-500, 500, 5).astype(np.int32), quant=(0.02 * w_scale, np.zeros(5), 0))
    y = b.op("CONV_2D", [q, w, bias], version=3, dtype="int8", quant=(0.05, 4),
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"})
    m = b.op("MAX_POOL_2D", [y], version=2, dtype="int8", quant=(0.05, 4),
             options={"padding": "VALID", "filter_height": 2, "filter_width": 2, "stride_h": 2, "stride_w": 2})
    b.output(b.op("DEQUANTIZE", [m], version=2, dtype="float32"))
    return b.to_bytes()


def test_quantized_model_runs_on_the_float_view(backend):
    rng = np.random.default_rng(7)
    data = quantized_conv_model(rng)
    x = rng.uniform(-2, 2, (1, 7, 6, 3)).astype(np.float32)
    options = CompileOptions(allow_quantized=True)
    out, parts, _ = run_split(backend, data, [x], options)
    assert [(p.backend, [op.opcode for op in p.ops]) for p in parts] == [
        ("opencl", ["QUANTIZE", "CONV_2D", "MAX_POOL_2D", "DEQUANTIZE"])]
    # Constants dequantized once, activations rounded onto their int8 grid after each op: within one
    # output step of LiteRT's integer kernels.
    assert_close(out, litert_run(data, [x]), rtol=0, atol=0.05 * 1.001)
    refused = split_by_support(read_model(data).main, backend, CompileOptions())
    assert [p.backend for p in refused] == ["cpu"]


MEDIAPIPE = ("selfie_segmentation", "face_detection_short_range", "pose_landmark_full", "hand_landmark_lite")
MEDIAPIPE_TOLERANCE = 5e-4  # of each output's range


@pytest.mark.parametrize("name,deny", [pytest.param(name, (), id=name) for name in MEDIAPIPE] + [
    pytest.param("face_detection_short_range", ("RESHAPE", "CONCATENATION"), id="face_detection_split_with_cpu")])
def test_mediapipe_models_match_litert(backend, name, deny):
    """Every op opencl supports runs there, the rest on the CPU; outputs within 5e-4 of their range."""
    from tests.mediapipe import mediapipe_models
    data = mediapipe_models()[f"{name}.tflite"].read_bytes()
    g = read_model(data).main
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, t.shape).astype(np.float32) for t in g.inputs]
    out, parts, executor = run_split(backend, data, inputs, CompileOptions(), deny)
    on_gpu = sum(len(p.ops) for p in parts if p.backend == "opencl")
    assert on_gpu == len(g.ops) - sum(op.opcode in deny for op in g.ops)
    if deny:
        assert len(parts) > 1 and executor.transfers_last_run > 0
    for actual, expected in zip(out, litert_run(data, inputs)):
        error = float(np.abs(actual.astype(np.float64) - expected).max()) / max(float(np.abs(expected).max()), 1e-6)
        assert error <= MEDIAPIPE_TOLERANCE, f"{name}: error {error:.3g} of the output range"


def test_build_chunks_split_in_order_with_enough_variants_each():
    from delegate_opencl.program import MIN_CHUNK, build_chunks
    variants = list(range(10))
    assert build_chunks(variants, 1) == [variants]
    assert build_chunks(variants, 2) == [variants[:5], variants[5:]]
    assert build_chunks(variants, 16) == [variants[:5], variants[5:]]  # never under MIN_CHUNK each
    assert build_chunks(variants[:MIN_CHUNK * 2 - 1], 4) == [variants[:MIN_CHUNK * 2 - 1]]
    assert build_chunks(list(range(12)), 3) == [list(range(4)), list(range(4, 8)), list(range(8, 12))]


def test_kernels_built_as_several_programs_at_once_give_the_same_results(monkeypatch):
    """zoo:mobilenet_v2's kernels (14 variants) as one program and as two built on two threads: the same
    outputs; a second compile in the process takes every program from memory."""
    from delegate import zoo
    from delegate_opencl.backend import OpenCLBackend
    g = read_model(zoo.from_spec("zoo:mobilenet_v2")).main
    x = np.random.default_rng(8).random(g.inputs[0].shape, dtype=np.float32)
    results, facts = [], []
    for threads in (1, 2):
        backend = OpenCLBackend({"build_threads": threads})
        monkeypatch.setattr(backend.state, "builder", fresh_builder(backend))
        compiled = backend.compile(make_partition(g, g.ops, "opencl", 0), CompileOptions())
        results.append(run_compiled(backend, g, compiled, [x])[0].copy())
        facts.append(compiled.describe())
        again = backend.compile(make_partition(g, g.ops, "opencl", 0), CompileOptions()).describe()
        assert again["programs"] == facts[-1]["programs"] and again["program"] == "memory"
    assert [f["programs"] for f in facts] == [1, 2]
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)


def test_kernels_are_reused_variant_by_variant_in_the_process_and_from_the_cache(backend, tmp_path):
    """A second set of kernels that shares variants with the first builds only the new ones; a new process
    finds each variant in the stored binary of whichever program built it, and loads that binary once."""
    relu = Variant("elementwise", (("unary", "RELU", None, False, ()),))
    shared, first_only, second_only = Variant("conv2d"), Variant("pool2d"), relu
    cache = EntryStore(tmp_path, "opencl", "variants")
    builder = fresh_builder(backend)
    first = builder.kernels([shared, first_only], (), cache)
    assert [b.origin for b in first.programs] == ["source"]
    second = builder.kernels([shared, second_only], (), cache)
    assert sorted(b.origin for b in second.programs) == ["memory", "source"]
    assert second.found[shared] == first.found[shared]
    assert second.found[second_only][0] is not first.found[shared][0]
    later = fresh_builder(backend).kernels([first_only, shared, second_only], (), cache)
    assert [b.origin for b in later.programs] == ["cache", "cache"]  # two binaries, each loaded once
    assert {name for _, name in later.found.values()} == {name for _, name in
                                                          [*first.found.values(), second.found[second_only]]}
    other_precision = fresh_builder(backend).kernels([shared], ("HALF_STORAGE",), cache)
    assert [b.origin for b in other_precision.programs] == ["source"]  # another variant: not the fp32 one


def test_kernels_built_without_a_cache_reach_one_given_later(backend, tmp_path):
    """Kernels built while no cache directory was set, then asked for with one: the directory gets their
    binary and entries, and a new process loads them from it."""
    variant = Variant("pool2d", (("unary", "RELU", None, False, ()),))
    builder = fresh_builder(backend)
    assert [b.origin for b in builder.kernels([variant], (), None).programs] == ["source"]
    cache = EntryStore(tmp_path, "opencl", "late-kernels")
    assert [b.origin for b in builder.kernels([variant], (), cache).programs] == ["memory"]
    assert [b.origin for b in fresh_builder(backend).kernels([variant], (), cache).programs] == ["cache"]


@pytest.mark.parametrize("threads", [0, -1, 1.5, "2", True])
def test_build_threads_must_be_a_positive_integer(threads):
    from delegate_opencl.backend import OpenCLBackend
    with pytest.raises(PluginError, match=f"build_threads must be a positive integer, got {threads!r}"):
        OpenCLBackend({"build_threads": threads})


def test_build_threads_default_one_program_per_core_on_a_gpu_one_on_a_cpu_device(monkeypatch):
    """By default a GPU's kernels build as one program per core of the process, up to 16 (cold on the H100:
    MobileNetV2's first load 6.0-6.4 s with one program, 4.9-5.9 s with 16); a CPU device (PoCL) builds on
    the cores that would build the others, so one program; a given ``build_threads`` is kept."""
    import delegate_opencl.backend as module
    from delegate_opencl.backend import OpenCLBackend

    backend = OpenCLBackend({})
    monkeypatch.setattr(module, "available_cores", lambda: 32)
    monkeypatch.setitem(backend.facts, "device_type", "gpu")
    assert backend.programs_at_once() == 16
    monkeypatch.setattr(module, "available_cores", lambda: 6)
    assert backend.programs_at_once() == 6
    monkeypatch.setitem(backend.facts, "device_type", "cpu")
    assert backend.programs_at_once() == 1
    assert OpenCLBackend({"build_threads": 3}).programs_at_once() == 3
