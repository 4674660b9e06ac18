"""Golden tests of elementwise kernels (arithmetic, comparisons, logic, select, unary math, conversions)."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from delegate import CompileOptions
from delegate.tflite.builder import GraphBuilder
from tests.models import csr_encode
from tests.oputil import check_against_litert

BROADCASTS = st.sampled_from([((1, 5, 4, 3), (1, 1, 4, 1)), ((2, 3), (2, 3)), ((4, 1), (3,)), ((6,), ()),
                              ((), (2, 2))])


def _binary_model(op, shapes, dtype="float32", options=None, out_dtype=None):
    b = GraphBuilder()
    x = b.input("x", shapes[0], dtype)
    y = b.input("y", shapes[1], dtype)
    b.output(b.op(op, [x, y], options=options, dtype=out_dtype))
    return b.to_bytes()


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


@given(op=st.sampled_from(["ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM"]),
       act=st.sampled_from(["NONE", "RELU", "RELU6", "RELU_N1_TO_1"]), native=st.booleans(),
       seed=st.integers(0, 2**16))
def test_large_same_shape_binary(op, act, native, seed):
    """Operands large enough for the native loops (on two threads), or numpy's with them off."""
    rng = np.random.default_rng(seed)
    shape = (1, 48, 44, 32)  # shared between two threads
    opts = {} if op in ("MAXIMUM", "MINIMUM") else {"fused_activation_function": act}
    check_against_litert(_binary_model(op, (shape, shape), options=opts),
                         [rng.standard_normal(shape) * 4, rng.standard_normal(shape) * 4],
                         options=CompileOptions(num_threads=2), backend_options={"native": native})


@given(op=st.sampled_from(["ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM"]),
       act=st.sampled_from(["NONE", "RELU6"]), row_first=st.booleans(), constant_row=st.booleans(),
       shape=st.sampled_from([(1, 6, 5, 24), (1, 40, 36, 16), (2, 9, 7)]), native=st.booleans(),
       seed=st.integers(0, 2**16))
def test_channel_row_binary(op, act, row_first, constant_row, shape, native, seed):
    """One operand a row along the last axis (a per-channel scale, offset or squeeze-and-excite gate),
    at run time or constant, first or second; small and shared between two threads."""
    rng = np.random.default_rng(seed)
    row_shape = (1,) * (len(shape) - 1) + shape[-1:]
    b = GraphBuilder()
    x = b.input("x", shape)
    inputs = [rng.standard_normal(shape) * 4]
    if constant_row:
        row = b.const("row", (rng.standard_normal(row_shape) * 4).astype(np.float32))
    else:
        row = b.input("row", row_shape)
        inputs.append(rng.standard_normal(row_shape) * 4)
    opts = {} if op in ("MAXIMUM", "MINIMUM") else {"fused_activation_function": act}
    b.output(b.op(op, [row, x] if row_first else [x, row], options=opts, shape=shape))
    check_against_litert(b.to_bytes(), inputs, options=CompileOptions(num_threads=2),
                         backend_options={"native": native})


# Operand shapes against an output of (2, 197, 32) (rows of its last axis) in each way the native loops take
# them: whole, one value per column, per row (a layer norm's mean of each token), one value; and of one column.
FORMS = [((2, 197, 32), (2, 197, 1)), ((2, 197, 1), (2, 197, 32)), ((2, 197, 1), (32,)), ((1, 1, 32), (2, 197, 1)),
         ((2, 197, 32), ()), ((1,), (2, 197, 32)), ((32,), (2, 197, 32)), ((2, 197, 1), (1, 1, 1)), ((5, 1), (5, 1))]


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "DIV", "SQUARED_DIFFERENCE", "MAXIMUM", "MINIMUM"])
@pytest.mark.parametrize("shapes", FORMS)
@pytest.mark.parametrize("constant", [None, 0, 1])
def test_binary_operands_broadcast_by_rows_columns_or_one_value(op, shapes, constant):
    """Each operand of the output's shape, a value per column, a value per row or one value (either side,
    at run time or constant), on two threads; a layer norm's steps then join the batched native calls."""
    import delegate
    rng = np.random.default_rng(len(FORMS) * len(op) + FORMS.index(shapes))
    b, inputs = GraphBuilder(), []
    operands = []
    for i, shape in enumerate(shapes):
        values = _nonzero(rng, shape) if i == 1 and op == "DIV" else (rng.standard_normal(shape) * 4).astype(np.float32)
        if i == constant:
            operands.append(b.const(f"c{i}", values))
        else:
            operands.append(b.input(f"x{i}", shape))
            inputs.append(values)
    b.output(b.op(op, operands))
    check_against_litert(b.to_bytes(), inputs, options=CompileOptions(num_threads=2))
    session = delegate.load(b.to_bytes(), backends="[cpu]", num_threads=2, **{"cpu.engine": "numpy"})
    (_, run, _, _), = session.executor.compiled[0].steps
    assert getattr(run, "prepared", None) is not None  # a native prepared call, batched with its neighbours


def _nonzero(rng, shape, low=0.5):
    """Values bounded away from zero (denominators, bases)."""
    return (rng.uniform(low, 3, shape) * rng.choice([-1, 1], shape)).astype(np.float32)


@given(op=st.sampled_from(["DIV", "SQUARED_DIFFERENCE", "POW", "FLOOR_DIV", "FLOOR_MOD"]), shapes=BROADCASTS,
       seed=st.integers(0, 2**16))
def test_float_binary(op, shapes, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shapes[0]).astype(np.float32) * 4
    y = _nonzero(rng, shapes[1])
    if op == "POW":
        x = np.abs(x) + 0.1
    opts = {"fused_activation_function": "RELU"} if op == "DIV" else None
    check_against_litert(_binary_model(op, shapes, options=opts), [x, y], builtin=True)


@given(op=st.sampled_from(["ADD", "SUB", "MUL", "DIV", "FLOOR_DIV", "FLOOR_MOD", "MAXIMUM", "MINIMUM",
                           "SQUARED_DIFFERENCE", "POW"]), shapes=BROADCASTS, seed=st.integers(0, 2**16))
def test_int32_binary(op, shapes, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-50, 50, shapes[0]).astype(np.int32)
    y = (rng.integers(1, 9, shapes[1]) * rng.choice([-1, 1], shapes[1])).astype(np.int32)
    if op == "POW":
        x, y = np.clip(x, -6, 6), np.abs(y) % 5
    check_against_litert(_binary_model(op, shapes, "int32"), [x, y], lsb=0)


@given(op=st.sampled_from(["LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"]),
       dtype=st.sampled_from(["float32", "int32", "int64"]), shapes=BROADCASTS, seed=st.integers(0, 2**16))
def test_comparison(op, dtype, shapes, seed):
    rng = np.random.default_rng(seed)
    x, y = (rng.integers(-3, 3, s).astype(dtype) for s in shapes)  # small range, so ties occur
    check_against_litert(_binary_model(op, shapes, dtype, out_dtype="bool"), [x, y])


@given(op=st.sampled_from(["LOGICAL_AND", "LOGICAL_OR"]), shapes=BROADCASTS, seed=st.integers(0, 2**16))
def test_logical_binary(op, shapes, seed):
    rng = np.random.default_rng(seed)
    check_against_litert(_binary_model(op, shapes, "bool"), [rng.random(s) < 0.5 for s in shapes])


def test_logical_not():
    b = GraphBuilder()
    x = b.input("x", (3, 4), "bool")
    b.output(b.op("LOGICAL_NOT", [x]))
    check_against_litert(b.to_bytes(), [np.random.default_rng(1).random((3, 4)) < 0.5])


@given(case=st.sampled_from([("SELECT", (2, 3), (2, 3), (2, 3)), ("SELECT", (4,), (4, 2), (4, 2)),
                              ("SELECT_V2", (2, 3), (2, 3), (2, 3)), ("SELECT_V2", (1, 3), (2, 3), (2, 1)),
                              ("SELECT_V2", (), (3,), (3,)), ("SELECT_V2", (4, 1), (3,), ())]),
       seed=st.integers(0, 2**16))
def test_select(case, seed):
    """SELECT (v1) picks whole rows with a rank-1 condition; SELECT_V2 broadcasts all three operands."""
    version, cond_shape, a_shape, b_shape = case
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    c = b.input("c", cond_shape, "bool")
    x, y = b.input("x", a_shape), b.input("y", b_shape)
    b.output(b.op(version, [c, x, y], dtype="float32"))
    check_against_litert(b.to_bytes(), [rng.random(cond_shape) < 0.5, rng.standard_normal(a_shape),
                                        rng.standard_normal(b_shape)])


@given(op=st.sampled_from(["EXP", "LOG", "SQRT", "RSQRT", "SQUARE", "ABS", "NEG", "SIN", "COS", "FLOOR",
                           "CEIL", "ROUND", "SIGN"]), seed=st.integers(0, 2**16))
def test_unary_math(op, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 3, 5)).astype(np.float32) * 3
    if op in ("LOG", "SQRT", "RSQRT"):
        x = np.abs(x) + 0.05
    if op == "ROUND":
        x[0, 0, :] = [0.5, 1.5, -2.5, 2.5, -0.5]  # ties round to even
    b = GraphBuilder()
    b.output(b.op(op, [b.input("x", x.shape)]))
    check_against_litert(b.to_bytes(), [x])


@given(pair=st.sampled_from([("float32", "int32"), ("int32", "float32"), ("float32", "int64"),
                             ("int64", "int32"), ("int32", "bool"), ("bool", "float32"), ("float32", "bool"),
                             ("int32", "int64")]), seed=st.integers(0, 2**16))
def test_cast(pair, seed):
    src, dst = pair
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, 7)) * 20)
    x[0, :3] = [-2.7, 2.7, 0.0]  # float -> int truncates toward zero
    x = (x > 0) if src == "bool" else x.astype(src)
    b = GraphBuilder()
    b.output(b.op("CAST", [b.input("x", x.shape, src)], dtype=dst))
    check_against_litert(b.to_bytes(), [x], lsb=0)


def test_dequantize_float16_and_int8_constants():
    rng = np.random.default_rng(3)
    half = rng.standard_normal((4, 6)).astype(np.float16)
    q = rng.integers(-128, 127, (4, 6)).astype(np.int8)
    b = GraphBuilder()
    x = b.input("x", (4, 6))
    w16 = b.op("DEQUANTIZE", [b.const("w16", half)], dtype="float32")
    w8 = b.op("DEQUANTIZE", [b.const("w8", q, quant=(0.05, 3))], dtype="float32")
    b.output(b.op("ADD", [x, w16]), b.op("MUL", [x, w8]))
    check_against_litert(b.to_bytes(), [rng.standard_normal((4, 6))])


@given(block=st.sampled_from([None, (1, 4), (2, 2)]), dtype=st.sampled_from(["float32", "float16"]),
       seed=st.integers(0, 2**16))
def test_densify(block, dtype, seed):
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((4, 8)).astype(dtype)
    if block is None:
        dense[rng.random(dense.shape) < 0.6] = 0
    else:
        mask = rng.random((4 // block[0], 8 // block[1])) < 0.5
        dense *= np.kron(mask, np.ones(block)).astype(dtype)
    values, sparsity = csr_encode(dense, block)
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    sparse = b.const("w", values)
    sparse.shape, sparse.sparsity = dense.shape, sparsity
    w = b.op("DENSIFY", [sparse], shape=dense.shape)
    if dtype == "float16":
        w = b.op("DEQUANTIZE", [w], dtype="float32")
    b.output(b.op("ADD", [x, w]))
    check_against_litert(b.to_bytes(), [rng.standard_normal((4, 8))])
