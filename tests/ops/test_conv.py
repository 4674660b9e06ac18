"""Golden tests of the convolution and matrix-product kernels against LiteRT."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from delegate import CompileOptions
from delegate.tflite.builder import GraphBuilder
from tests.models import transpose_conv_model
from tests.oputil import check_against_litert

ACTIVATIONS = st.sampled_from(["NONE", "RELU", "RELU6", "RELU_N1_TO_1"])


def _check_conv(opcode, x, w, bias, op_options, runtime_weights=False, **check):
    """One convolution against LiteRT; ``runtime_weights`` feeds the filter as a graph input."""
    b = GraphBuilder()
    inputs = [b.input("x", x.shape)]
    inputs.append(b.input("w", w.shape) if runtime_weights else b.const("w", w))
    b.output(b.op(opcode, inputs + [b.const("b", bias)], options=op_options))
    check_against_litert(b.to_bytes(), [x, w] if runtime_weights else [x], **check)


@given(h=st.integers(3, 12), w=st.integers(3, 12), cin=st.integers(1, 6), cout=st.sampled_from([1, 3, 8, 20, 40, 70]),
       k=st.sampled_from([(1, 1), (3, 3), (2, 3), (5, 5)]), stride=st.integers(1, 3),
       dilation=st.integers(1, 2), padding=st.sampled_from(["SAME", "VALID"]), act=ACTIVATIONS,
       batch=st.integers(1, 2), runtime_weights=st.booleans(), threads=st.sampled_from([1, 2]),
       native=st.booleans(), seed=st.integers(0, 2**16))
def test_conv_2d(h, w, cin, cout, k, stride, dilation, padding, act, batch, runtime_weights, threads, native, seed):
    """Few units and a short depth run in the native loops directly (without im2col), unless off."""
    kh, kw = k
    if padding == "VALID" and ((kh - 1) * dilation + 1 > h or (kw - 1) * dilation + 1 > w):
        padding = "SAME"
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((cout, kh, kw, cin)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    opts = {"padding": padding, "stride_h": stride, "stride_w": stride, "dilation_h_factor": dilation,
            "dilation_w_factor": dilation, "fused_activation_function": act}
    _check_conv("CONV_2D", rng.standard_normal((batch, h, w, cin)), weights, bias, opts, runtime_weights,
                builtin=dilation > 1 or runtime_weights, options=CompileOptions(num_threads=threads),
                backend_options={"native": native})


@given(groups=st.integers(2, 3), per_group=st.integers(1, 3), cout_per_group=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_grouped_conv_2d(groups, per_group, cout_per_group, seed):
    rng = np.random.default_rng(seed)
    cin, cout = groups * per_group, groups * cout_per_group
    weights = rng.standard_normal((cout, 3, 3, per_group)).astype(np.float32)
    _check_conv("CONV_2D", rng.standard_normal((1, 6, 7, cin)), weights, rng.standard_normal(cout).astype(np.float32),
                {"padding": "SAME", "stride_h": 1, "stride_w": 1}, builtin=True)


@given(h=st.integers(3, 12), w=st.integers(3, 12), c=st.sampled_from([1, 3, 6, 100]), multiplier=st.integers(1, 3),
       k=st.sampled_from([(1, 1), (3, 3), (5, 5), (2, 3)]), stride=st.integers(1, 2),
       dilation=st.integers(1, 2), padding=st.sampled_from(["SAME", "VALID"]), act=ACTIVATIONS,
       threads=st.sampled_from([1, 2]), runtime_weights=st.booleans(), native=st.booleans(),
       seed=st.integers(0, 2**16))
def test_depthwise_conv_2d(h, w, c, multiplier, k, stride, dilation, padding, act, threads, runtime_weights, native,
                           seed):
    """Also with two kernel threads, which split large outputs into row bands, and with the numpy
    formulation instead of the native tap sums."""
    kh, kw = k
    if padding == "VALID" and ((kh - 1) * dilation + 1 > h or (kw - 1) * dilation + 1 > w):
        padding = "SAME"
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((1, kh, kw, c * multiplier)).astype(np.float32)
    bias = rng.standard_normal(c * multiplier).astype(np.float32)
    opts = {"padding": padding, "stride_h": stride, "stride_w": stride, "depth_multiplier": multiplier,
            "dilation_h_factor": dilation, "dilation_w_factor": dilation, "fused_activation_function": act}
    _check_conv("DEPTHWISE_CONV_2D", rng.standard_normal((1, h, w, c)), weights, bias, opts, runtime_weights,
                builtin=dilation > 1 or runtime_weights, options=CompileOptions(num_threads=threads),
                backend_options={"native": native})


@pytest.mark.parametrize("w", range(4, 22))
@pytest.mark.parametrize("k, c", [(3, 16), (3, 40), (5, 24)])
def test_depthwise_rows_at_every_width(w, k, c):
    """A stride-1 row's interior pixels go by filter rows in groups of 8, then of 4, the last few as a group of 4
    overlapping pixels already summed: every width from 4 to 21, channels in whole vectors of 16 and with a tail
    of 8."""
    rng = np.random.default_rng(w * k + c)
    weights = rng.standard_normal((1, k, k, c)).astype(np.float32)
    opts = {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1,
            "fused_activation_function": "RELU6"}
    bias = rng.standard_normal(c).astype(np.float32)
    _check_conv("DEPTHWISE_CONV_2D", rng.standard_normal((1, 5, w, c)), weights, bias, opts, False, builtin=False,
                backend_options={"native": True})


@given(h=st.integers(1, 7), w=st.integers(1, 7), cin=st.integers(1, 5), cout=st.integers(1, 5),
       k=st.sampled_from([(1, 1), (2, 2), (3, 3), (4, 3)]), stride=st.integers(1, 3),
       padding=st.sampled_from(["SAME", "VALID"]), with_bias=st.booleans(), seed=st.integers(0, 2**16))
def test_transpose_conv(h, w, cin, cout, k, stride, padding, with_bias, seed):
    rng = np.random.default_rng(seed)
    model = transpose_conv_model(h, w, cin, cout, k, stride, padding, with_bias, rng)
    check_against_litert(model, [rng.standard_normal((1, h, w, cin))], builtin=True)


@pytest.mark.parametrize("k, padding, cout", [((2, 2), "VALID", 1), ((2, 2), "SAME", 8), ((3, 3), "VALID", 3)])
def test_transpose_conv_upsampling_by_the_stride(k, padding, cout):
    """Taps as far apart as the stride: every output pixel takes one tap of one input pixel."""
    rng = np.random.default_rng(11)
    model = transpose_conv_model(6, 5, 4, cout, k, k[0], padding, True, rng)
    check_against_litert(model, [rng.standard_normal((1, 6, 5, 4))], builtin=True)


@given(batch=st.sampled_from([(1,), (3,), (2, 3)]), depth=st.integers(1, 20), units=st.integers(1, 12),
       keep=st.booleans(), with_bias=st.booleans(), act=ACTIVATIONS, runtime_weights=st.booleans(),
       seed=st.integers(0, 2**16))
def test_fully_connected(batch, depth, units, keep, with_bias, act, runtime_weights, seed):
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((units, depth)).astype(np.float32)
    b = GraphBuilder()
    x = b.input("x", batch + (depth,))
    inputs = [x, b.input("w", weights.shape) if runtime_weights else b.const("w", weights)]
    inputs.append(b.const("b", rng.standard_normal(units).astype(np.float32)) if with_bias else None)
    b.output(b.op("FULLY_CONNECTED", inputs, options={"keep_num_dims": keep, "fused_activation_function": act}))
    data = [rng.standard_normal(batch + (depth,))] + ([weights] if runtime_weights else [])
    check_against_litert(b.to_bytes(), data, builtin=runtime_weights)


def test_fully_connected_float16_weights_through_dequantize():
    """MediaPipe stores FC/conv weights as float16 constants behind DEQUANTIZE; they fold at compile time."""
    rng = np.random.default_rng(7)
    b = GraphBuilder()
    x = b.input("x", (2, 16))
    w = b.op("DEQUANTIZE", [b.const("w16", rng.standard_normal((5, 16)).astype(np.float16))], dtype="float32")
    bias = b.op("DEQUANTIZE", [b.const("b16", rng.standard_normal(5).astype(np.float16))], dtype="float32")
    b.output(b.op("FULLY_CONNECTED", [x, w, bias]))
    check_against_litert(b.to_bytes(), [rng.standard_normal((2, 16))])


def test_batch_matmul_without_a_known_sgemm_is_a_numpy_step(monkeypatch):
    """Where no BLAS sgemm the loops know is loaded, a float BATCH_MATMUL runs as numpy, still LiteRT's answer."""
    import delegate
    from delegate_cpu.kernels.native import native_loops
    loops = native_loops()
    if loops is not None:
        monkeypatch.setattr(loops, "sgemm", None)
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    a, rhs = b.input("a", (2, 37, 16)), b.input("b", (2, 16, 29))
    b.output(b.op("BATCH_MATMUL", [a, rhs], options={"adj_x": False, "adj_y": False}))
    inputs = [rng.standard_normal((2, 37, 16)).astype(np.float32), rng.standard_normal((2, 16, 29)).astype(np.float32)]
    check_against_litert(b.to_bytes(), inputs, options=CompileOptions(num_threads=2))
    session = delegate.load(b.to_bytes(), backends="[cpu]", num_threads=1, **{"cpu.engine": "numpy"})
    (_, run, _, _), = session.executor.compiled[0].steps
    assert getattr(run, "prepared", None) is None


@pytest.mark.parametrize("batches", [((2, 3), (2, 3)), ((4,), ()), ((4,), (1,)), ((), ()), ((1, 2), (1, 2))])
@pytest.mark.parametrize("adj", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("const_rhs", [False, True])
def test_batch_matmul_in_the_native_loops(batches, adj, const_rhs):
    """A float32 BATCH_MATMUL whose operands' batches are the output's (or the second one matrix for all) is a
    prepared native call, each product by BLAS's sgemm on a thread of the team, every transposition; runs hold
    BLAS to one thread even in a partition of native calls only.  Where the loops or a BLAS sgemm they know are
    missing, the op is a numpy step, as right."""
    import contextlib
    import delegate
    import delegate_cpu.plugin as plugin
    from delegate_cpu.kernels.native import native_loops
    rng = np.random.default_rng(len(batches[0]) + 2 * adj[0] + adj[1])
    m, k, n = 37, 16, 29
    a_shape = batches[0] + ((k, m) if adj[0] else (m, k))
    b_shape = batches[1] + ((n, k) if adj[1] else (k, n))
    b = GraphBuilder()
    a = b.input("a", a_shape)
    rhs_value = rng.standard_normal(b_shape).astype(np.float32)
    rhs = b.const("b", rhs_value) if const_rhs else b.input("b", b_shape)
    b.output(b.op("BATCH_MATMUL", [a, rhs], options={"adj_x": adj[0], "adj_y": adj[1]}))
    inputs = [rng.standard_normal(a_shape).astype(np.float32)] + ([] if const_rhs else [rhs_value])
    check_against_litert(b.to_bytes(), inputs, options=CompileOptions(num_threads=2))
    held = []

    @contextlib.contextmanager
    def recording(count):
        held.append(count)
        yield
    session = delegate.load(b.to_bytes(), backends="[cpu]", num_threads=1, **{"cpu.engine": "numpy"})
    (_, run, _, _), = session.executor.compiled[0].steps
    loops = native_loops()
    if loops is None or loops.sgemm is None:
        assert getattr(run, "prepared", None) is None
        return
    assert getattr(run, "prepared", None) is not None
    original = plugin.blas_threads
    plugin.blas_threads = recording
    try:
        blas_held = delegate.load(b.to_bytes(), backends="[cpu]", num_threads=1, **{"cpu.engine": "numpy"})
        blas_held.run_indexed(blas_held.normalize_inputs({t.name: v for t, v in zip(blas_held.graph.inputs, inputs)}))
    finally:
        plugin.blas_threads = original
    assert held == [1]


@given(m=st.integers(1, 5), k=st.integers(1, 6), n=st.integers(1, 5), adj_x=st.booleans(), adj_y=st.booleans(),
       batches=st.sampled_from([((2,), (2,)), ((1,), (3,)), ((2, 1), (3,)), ((), (2,))]),
       const_rhs=st.booleans(), seed=st.integers(0, 2**16))
def test_batch_matmul(m, k, n, adj_x, adj_y, batches, const_rhs, seed):
    rng = np.random.default_rng(seed)
    a_shape = batches[0] + ((k, m) if adj_x else (m, k))
    b_shape = batches[1] + ((n, k) if adj_y else (k, n))
    b = GraphBuilder()
    a = b.input("a", a_shape)
    rhs_value = rng.standard_normal(b_shape).astype(np.float32)
    rhs = b.const("b", rhs_value) if const_rhs else b.input("b", b_shape)
    b.output(b.op("BATCH_MATMUL", [a, rhs], options={"adj_x": adj_x, "adj_y": adj_y}))
    inputs = [rng.standard_normal(a_shape)] + ([] if const_rhs else [rhs_value])
    check_against_litert(b.to_bytes(), inputs, builtin=True)
