"""Golden tests of RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR against LiteRT."""

import numpy as np
from hypothesis import given, strategies as st

from delegate import CompileOptions
from delegate.tflite.builder import GraphBuilder
from tests.oputil import check_against_litert

MODES = st.sampled_from([(False, False), (True, False), (False, True)])  # (align_corners, half_pixel_centers)


@given(op=st.sampled_from(["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"]), h=st.integers(1, 9),
       w=st.integers(1, 9), oh=st.integers(1, 20), ow=st.integers(1, 20), c=st.integers(1, 4), mode=MODES,
       batch=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_resize(op, h, w, oh, ow, c, mode, batch, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (batch, h, w, c))
    size = b.const("size", np.array([oh, ow], np.int32))
    b.output(b.op(op, [x, size], options={"align_corners": mode[0], "half_pixel_centers": mode[1]}))
    check_against_litert(b.to_bytes(), [rng.standard_normal((batch, h, w, c))], builtin=True)


@given(factor=st.sampled_from([2, 4]), mode=MODES, seed=st.integers(0, 2**16))
def test_integer_upsampling(factor, mode, seed):
    """The 2x/4x upsampling MediaPipe's decoders use, through LiteRT's default (XNNPACK) path."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, 6, 5, 8))
    size = b.const("size", np.array([6 * factor, 5 * factor], np.int32))
    b.output(b.op("RESIZE_BILINEAR", [x, size], options={"align_corners": mode[0], "half_pixel_centers": mode[1]}))
    check_against_litert(b.to_bytes(), [rng.standard_normal((1, 6, 5, 8))])


@given(size=st.sampled_from([((12, 10), (24, 20)), ((17, 9), (40, 33)), ((30, 30), (16, 16)), ((30, 31), (64, 64))]),
       mode=MODES,
       batch=st.integers(1, 2), native=st.booleans(), seed=st.integers(0, 2**16))
def test_large_resize_bilinear(size, mode, batch, native, seed):
    """Outputs large enough for the native loops (on two threads), or numpy's with them off."""
    (h, w), (oh, ow) = size
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (batch, h, w, 40))
    b.output(b.op("RESIZE_BILINEAR", [x, b.const("size", np.array([oh, ow], np.int32))],
                  options={"align_corners": mode[0], "half_pixel_centers": mode[1]}))
    check_against_litert(b.to_bytes(), [rng.standard_normal((batch, h, w, 40))], builtin=True,
                         options=CompileOptions(num_threads=2), backend_options={"native": native})
