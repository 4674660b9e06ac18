"""Golden tests of the 2-D pooling kernels against LiteRT."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from delegate import CompileOptions
from delegate.tflite.builder import GraphBuilder
from tests.models import pool_model
from tests.oputil import check_against_litert


@given(op=st.sampled_from(["MAX_POOL_2D", "AVERAGE_POOL_2D", "L2_POOL_2D"]), h=st.integers(1, 12),
       w=st.integers(1, 12), c=st.integers(1, 5), kh=st.integers(1, 4), kw=st.integers(1, 4),
       sh=st.integers(1, 3), sw=st.integers(1, 3), padding=st.sampled_from(["SAME", "VALID"]),
       act=st.sampled_from(["NONE", "RELU", "RELU6"]), batch=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_pool_2d(op, h, w, c, kh, kw, sh, sw, padding, act, batch, seed):
    rng = np.random.default_rng(seed)
    model = pool_model(op, batch, h, w, c, kh, kw, sh, sw, padding, act)
    check_against_litert(model, [rng.standard_normal((batch, h, w, c)) * 3])


@given(op=st.sampled_from(["MAX_POOL_2D", "AVERAGE_POOL_2D"]), h=st.integers(40, 56), w=st.integers(40, 56),
       kh=st.integers(1, 4), kw=st.integers(1, 4), sh=st.integers(1, 2), sw=st.integers(1, 2),
       padding=st.sampled_from(["SAME", "VALID"]), act=st.sampled_from(["NONE", "RELU6"]), batch=st.integers(1, 2),
       native=st.booleans(), seed=st.integers(0, 2**16))
def test_large_pool_2d(op, h, w, kh, kw, sh, sw, padding, act, batch, native, seed):
    """Outputs large enough for the native loops (on two threads), or numpy's with them off."""
    rng = np.random.default_rng(seed)
    model = pool_model(op, batch, h, w, 32, kh, kw, sh, sw, padding, act)
    check_against_litert(model, [rng.standard_normal((batch, h, w, 32)) * 3], options=CompileOptions(num_threads=2),
                         backend_options={"native": native})


@given(op=st.sampled_from(["MAX_POOL_2D", "AVERAGE_POOL_2D"]), size=st.sampled_from([(2, 8), (4, 8), (16, 16), (3, 9)]),
       c=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_tiling_and_global_pools(op, size, c, seed):
    """Windows that tile the input exactly (2x2/2 and whole-image pools, as in MediaPipe models)."""
    k, h = size
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, h, h, c))
    b.output(b.op(op, [x], options={"padding": "VALID", "filter_height": k, "filter_width": k,
                                    "stride_h": k, "stride_w": k}))
    check_against_litert(b.to_bytes(), [rng.standard_normal((1, h, h, c))])


@pytest.mark.parametrize("opcode", ["AVERAGE_POOL_2D", "MEAN"])
@pytest.mark.parametrize("shape", [(1, 37, 29, 16), (2, 9, 7, 40), (1, 3, 1, 5)])
@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
def test_global_average(opcode, shape, native):
    """One window over the whole image (a global average pool), and MEAN over the pixels: the
    pixels shared between two threads, four sums at a time."""
    rng = np.random.default_rng(3)
    n, h, w, c = shape
    b = GraphBuilder()
    x = b.input("x", shape)
    if opcode == "MEAN":
        out = b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": True})
    else:
        out = b.op(opcode, [x], options={"padding": "VALID", "filter_height": h, "filter_width": w, "stride_h": 1,
                                         "stride_w": 1, "fused_activation_function": "NONE"})
    b.output(out)
    check_against_litert(b.to_bytes(), [rng.standard_normal(shape) * 3 + 1], options=CompileOptions(num_threads=2),
                         backend_options={"native": native})
