"""SPACE_TO_BATCH_ND / BATCH_TO_SPACE_ND against LiteRT (the converter's form of atrous convolutions)."""

import numpy as np
from hypothesis import given, strategies as st

from delegate.tflite.builder import GraphBuilder
from tests.oputil import check_against_litert


@given(bh=st.integers(1, 3), bw=st.integers(1, 3), height=st.integers(1, 9), width=st.integers(1, 9),
       c=st.integers(1, 5), n=st.integers(1, 2), top=st.integers(0, 2), left=st.integers(0, 2),
       seed=st.integers(0, 999))
def test_space_to_batch_then_back(bh, bw, height, width, c, n, top, left, seed):
    rng = np.random.default_rng(seed)
    pads = np.array([[top, (-(height + top)) % bh], [left, (-(width + left)) % bw]], np.int32)
    block = np.array([bh, bw], np.int32)
    b = GraphBuilder()
    x = b.input("x", (n, height, width, c))
    s2b = b.op("SPACE_TO_BATCH_ND", [x, b.const("block", block), b.const("pads", pads)])
    y = b.op("RELU", [s2b])
    b.output(s2b, b.op("BATCH_TO_SPACE_ND", [y, b.const("block2", block), b.const("crops", pads)]))
    check_against_litert(b.to_bytes(), [rng.standard_normal((n, height, width, c))])
