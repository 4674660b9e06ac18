import numpy as np
from hypothesis import given, strategies as st

from delegate.tflite.builder import GraphBuilder
from tests.oputil import check_against_litert


@given(op=st.sampled_from(["ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM"]),
       act=st.sampled_from(["NONE", "RELU", "RELU6"]), seed=st.integers(0, 2**16))
def test_binary_broadcast(op, act, seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, 5, 4, 3))
    y = b.input("y", (1, 1, 4, 1))
    opts = {} if op in ("MAXIMUM", "MINIMUM") else {"fused_activation_function": act}
    b.output(b.op(op, [x, y], options=opts))
    check_against_litert(b.to_bytes(), [rng.standard_normal((1, 5, 4, 3)) * 4,
                                        rng.standard_normal((1, 1, 4, 1)) * 4])
