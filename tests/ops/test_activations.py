"""Golden tests of the activation kernels against LiteRT."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from delegate import CompileOptions
from delegate.tflite.builder import GraphBuilder
from tests.oputil import check_against_litert

SHAPES = st.sampled_from([(7,), (2, 9), (1, 4, 5, 3), (2, 3, 1, 6)])


def _unary_model(opcode, shape, options=None):
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op(opcode, [x], options=options))
    return b.to_bytes()


@given(op=st.sampled_from(["RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "HARD_SWISH", "LOGISTIC", "TANH",
                           "ELU"]), shape=SHAPES, scale=st.sampled_from([1.0, 5.0, 60.0]),
       seed=st.integers(0, 2**16))
def test_pointwise_activation(op, shape, scale, seed):
    rng = np.random.default_rng(seed)
    check_against_litert(_unary_model(op, shape), [rng.standard_normal(shape) * scale])


@given(op=st.sampled_from(["RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "HARD_SWISH", "LOGISTIC"]),
       native=st.booleans(), scale=st.sampled_from([5.0, 60.0]), seed=st.integers(0, 2**16))
def test_large_pointwise_activation(op, native, scale, seed):
    """Tensors large enough for the native loops (on two threads), or numpy's with them off; LOGISTIC's
    native e^x also past its clamp (scale 60: |x| > 88)."""
    rng = np.random.default_rng(seed)
    shape = (1, 48, 44, 32)  # shared between two threads
    check_against_litert(_unary_model(op, shape), [rng.standard_normal(shape) * scale],
                         options=CompileOptions(num_threads=2), backend_options={"native": native})


@given(alpha=st.sampled_from([0.01, 0.2, 1.5, -0.3]), shape=SHAPES, seed=st.integers(0, 2**16))
def test_leaky_relu(alpha, shape, seed):
    rng = np.random.default_rng(seed)
    check_against_litert(_unary_model("LEAKY_RELU", shape, {"alpha": alpha}), [rng.standard_normal(shape) * 4])


@given(approximate=st.booleans(), shape=SHAPES, seed=st.integers(0, 2**16))
def test_gelu(approximate, shape, seed):
    rng = np.random.default_rng(seed)
    check_against_litert(_unary_model("GELU", shape, {"approximate": approximate}),
                         [rng.standard_normal(shape) * 3], builtin=True)


@given(alpha_shape=st.sampled_from([(3,), (1, 1, 3), (5, 1), (4, 5, 3), (1,)]), const_alpha=st.booleans(),
       wide=st.booleans(), native=st.booleans(), seed=st.integers(0, 2**16))
def test_prelu(alpha_shape, const_alpha, wide, native, seed):
    """``wide``: 40 channels and a tensor large enough for the native loop to share between threads."""
    rng = np.random.default_rng(seed)
    shape = (2, 4, 5, 3)
    if wide:
        shape, alpha_shape = (1, 60, 30, 40), tuple(40 if d == 3 else 60 if d == 4 else 30 if d == 5 else d
                                                   for d in alpha_shape)
    alpha = rng.standard_normal(alpha_shape).astype(np.float32)
    b = GraphBuilder()
    x = b.input("x", shape)
    a = b.const("alpha", alpha) if const_alpha else b.input("alpha", alpha_shape)
    b.output(b.op("PRELU", [x, a]))
    inputs = [rng.standard_normal(shape) * 3] + ([] if const_alpha else [alpha])
    check_against_litert(b.to_bytes(), inputs, builtin=not const_alpha, options=CompileOptions(num_threads=2),
                         backend_options={"native": native})


@given(beta=st.sampled_from([1.0, 0.5, 2.0]), shape=SHAPES, scale=st.sampled_from([1.0, 30.0]),
       seed=st.integers(0, 2**16))
def test_softmax(beta, shape, scale, seed):
    rng = np.random.default_rng(seed)
    check_against_litert(_unary_model("SOFTMAX", shape, {"beta": beta}), [rng.standard_normal(shape) * scale])


@given(rows=st.integers(1, 40), depth=st.sampled_from([1, 7, 16, 17, 33, 197]), beta=st.sampled_from([1.0, 0.7]),
       masked=st.booleans(), seed=st.integers(0, 2**16))
def test_softmax_rows_of_any_depth_shared_among_threads(rows, depth, beta, masked, seed):
    """The native SOFTMAX's rows (whole vectors, then the last few as one; the rows split between two threads),
    some entries at -inf as an attention mask writes them and some far above the rest."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, depth)) * 20).astype(np.float32)
    if masked and depth > 1:
        x[rng.random(x.shape) < 0.3] = -np.inf
        x[:, 0] = np.where(np.isinf(x[:, 0]), 0.0, x[:, 0])  # every row keeps a finite entry
        x[rng.random(x.shape) < 0.05] = 80.0
    check_against_litert(_unary_model("SOFTMAX", (rows, depth), {"beta": beta}), [x],
                         options=CompileOptions(num_threads=2), backend_options={"native": True})


@given(size=st.sampled_from([1, 15, 16, 17, 4003, 12608]), approximate=st.booleans(), seed=st.integers(0, 2**16))
def test_gelu_spans_of_any_length_shared_among_threads(size, approximate, seed):
    """The native GELU over whole vectors and the last few, split between two threads, on values out to +-100."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((1, size)) * 4).astype(np.float32)
    x.ravel()[: min(size, 4)] = [100.0, -100.0, 88.0, -88.0][: min(size, 4)]
    check_against_litert(_unary_model("GELU", (1, size), {"approximate": approximate}), [x], builtin=True,
                         options=CompileOptions(num_threads=2), backend_options={"native": True})


@given(shape=SHAPES, scale=st.sampled_from([1.0, 30.0]), seed=st.integers(0, 2**16))
def test_log_softmax(shape, scale, seed):
    rng = np.random.default_rng(seed)
    check_against_litert(_unary_model("LOG_SOFTMAX", shape), [rng.standard_normal(shape) * scale])


@given(shape=SHAPES, tiny=st.booleans(), seed=st.integers(0, 2**16))
def test_l2_normalization(shape, tiny, seed):
    rng = np.random.default_rng(seed)
    scale = 1e-8 if tiny else 3.0  # tiny inputs exercise the epsilon floor of the norm
    check_against_litert(_unary_model("L2_NORMALIZATION", shape), [rng.standard_normal(shape) * scale])


@pytest.mark.parametrize("activation", ["TANH", "SIGN_BIT"])
@pytest.mark.parametrize("opcode", ["ADD", "MUL", "CONV_2D", "MAX_POOL_2D"])
@pytest.mark.parametrize("builtin", [False, True], ids=["xnnpack", "builtin"])
def test_fused_activations_litert_leaves_alone(opcode, activation, builtin):
    """LiteRT's kernels for these ops apply only their activation range: a fused TANH or SIGN_BIT
    leaves the results as they are, in both of its kernel sets, and so here."""
    rng = np.random.default_rng(7)
    b = GraphBuilder()
    x, y = b.input("x", (1, 6, 6, 8)), b.input("y", (1, 6, 6, 8))
    options = {"fused_activation_function": activation}
    if opcode == "CONV_2D":
        weights = b.const("w", rng.standard_normal((8, 3, 3, 8)).astype(np.float32))
        out = b.op(opcode, [x, weights, b.const("b", np.ones(8, np.float32))],
                   options=dict(options, padding="SAME", stride_h=1, stride_w=1))
    elif opcode == "MAX_POOL_2D":
        out = b.op(opcode, [x], options=dict(options, padding="VALID", stride_h=1, stride_w=1, filter_height=2,
                                             filter_width=2))
    else:
        out = b.op(opcode, [x, y], options=options)
    b.output(out)
    inputs = [rng.standard_normal((1, 6, 6, 8)) * 4 for _ in range(2 if opcode in ("ADD", "MUL") else 1)]
    check_against_litert(b.to_bytes(), inputs, builtin=builtin)
