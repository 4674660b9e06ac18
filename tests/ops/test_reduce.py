"""Golden tests of reductions, ARG_MAX/ARG_MIN and CUMSUM against LiteRT."""

import numpy as np
import pytest

import delegate
from hypothesis import given, strategies as st

from delegate import CompileOptions
from delegate.tflite.builder import GraphBuilder
from tests.oputil import check_against_litert

SHAPES = st.sampled_from([(6,), (3, 4), (2, 3, 4), (1, 5, 4, 3), (2, 2, 3, 2)])


@st.composite
def shape_and_axes(draw):
    shape = draw(SHAPES)
    rank = len(shape)
    axes = draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank))
    return shape, axes


@given(op=st.sampled_from(["MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"]), case=shape_and_axes(),
       keep_dims=st.booleans(), seed=st.integers(0, 2**16))
def test_float_reduce(op, case, keep_dims, seed):
    shape, axes = case
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op(op, [x, b.const("axes", np.array(axes, np.int32))], options={"keep_dims": keep_dims}))
    check_against_litert(b.to_bytes(), [rng.standard_normal(shape) + (1.0 if op == "REDUCE_PROD" else 0.0)])


@given(shape=st.sampled_from([(1, 40, 30, 24), (2, 20, 20, 100), (1, 9, 9, 300)]), keep_dims=st.booleans(),
       native=st.booleans(), seed=st.integers(0, 2**16))
def test_global_average_pool(shape, keep_dims, native, seed):
    """MEAN over the pixels of images large enough for the native loops (on two threads), or numpy's."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": keep_dims}))
    check_against_litert(b.to_bytes(), [rng.standard_normal(shape) + 0.5], options=CompileOptions(num_threads=2),
                         backend_options={"native": native})


@pytest.mark.parametrize("opcode, native", [("MEAN", True), ("MEAN", False), ("AVERAGE_POOL_2D", True)])
def test_a_mean_over_a_million_pixels_sums_in_litert_order(opcode, native):
    """One float32 sum per channel over the pixels in order, as LiteRT's builtin kernels sum (a global average
    pool in the native loops too): partial sums in another order drifted 0.5% from LiteRT's over a million
    pixels (a fuzzed resize's)."""
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    x = b.input("x", (1, 1024, 1024, 3))
    if opcode == "MEAN":
        b.output(b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": True}))
    else:
        b.output(b.op("AVERAGE_POOL_2D", [x], options={"padding": "VALID", "stride_h": 1, "stride_w": 1,
                                                       "filter_height": 1024, "filter_width": 1024}))
    check_against_litert(b.to_bytes(), [rng.standard_normal((1, 1024, 1024, 3)).astype(np.float32) + 0.5],
                         rtol=2e-7, atol=0, lsb=0, builtin=True, options=CompileOptions(num_threads=2),
                         backend_options={"native": native})



@given(shape=st.sampled_from([(1, 197, 32), (3, 5, 7, 2), (2, 1, 300), (40, 3)]), last=st.integers(1, 2),
       native=st.booleans(), seed=st.integers(0, 2**16))
def test_a_mean_over_consecutive_axes_sums_each_in_order(shape, last, native, seed):
    """MEAN over the last axes (a transformer's layer norm takes the mean of each token's channels) in the native
    loops, several rows to a thread's block: each mean is one float32 sum over its values in order, divided by
    their count, as LiteRT's builtin kernels compute it (bit-exact against that order)."""
    rng = np.random.default_rng(seed)
    axes = list(range(len(shape) - min(last, len(shape) - 1), len(shape)))
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op("MEAN", [x, b.const("axes", np.array(axes, np.int32))], options={"keep_dims": True}))
    data = (rng.standard_normal(shape) * 3 + 0.5).astype(np.float32)
    check_against_litert(b.to_bytes(), [data], options=CompileOptions(num_threads=2), backend_options={"native": native})
    if native:
        session = delegate.load(b.to_bytes(), None, backends="[cpu]", num_threads=2,
                                **{"cpu.engine": "numpy", "placement.search": "estimate"})
        ours = next(iter(session.run_indexed({session.graph.inputs[0].index: data}).values()))
        rows = data.reshape(-1, int(np.prod([shape[a] for a in axes])))
        expected = np.zeros(rows.shape[0], np.float32)
        for column in rows.T:  # one float32 sum per row, its values in order
            expected += column
        np.testing.assert_array_equal(ours.ravel(), expected / np.float32(rows.shape[1]))

@given(op=st.sampled_from(["SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "MEAN"]), case=shape_and_axes(),
       keep_dims=st.booleans(), seed=st.integers(0, 2**16))
def test_int32_reduce(op, case, keep_dims, seed):
    shape, axes = case
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape, "int32")
    b.output(b.op(op, [x, b.const("axes", np.array(axes, np.int32))], options={"keep_dims": keep_dims}))
    check_against_litert(b.to_bytes(), [rng.integers(-4, 5, shape).astype(np.int32)], lsb=0)


@given(op=st.sampled_from(["REDUCE_ANY", "REDUCE_ALL"]), case=shape_and_axes(), keep_dims=st.booleans(),
       seed=st.integers(0, 2**16))
def test_bool_reduce(op, case, keep_dims, seed):
    shape, axes = case
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape, "bool")
    b.output(b.op(op, [x, b.const("axes", np.array(axes, np.int32))], options={"keep_dims": keep_dims}))
    check_against_litert(b.to_bytes(), [rng.random(shape) < 0.7])


@given(op=st.sampled_from(["ARG_MAX", "ARG_MIN"]), shape=SHAPES, axis_seed=st.integers(0, 100),
       out_type=st.sampled_from(["int32", "int64"]), dtype=st.sampled_from(["float32", "int32"]),
       seed=st.integers(0, 2**16))
def test_arg_extreme(op, shape, axis_seed, out_type, dtype, seed):
    rng = np.random.default_rng(seed)
    axis = axis_seed % (2 * len(shape)) - len(shape)
    b = GraphBuilder()
    x = b.input("x", shape, dtype)
    code = 2 if out_type == "int32" else 4  # TensorType codes
    b.output(b.op(op, [x, b.const("axis", np.array([axis], np.int32))], options={"output_type": code},
                  dtype=out_type))
    values = rng.integers(-3, 4, shape).astype(dtype)  # few distinct values: ties pick the first index
    check_against_litert(b.to_bytes(), [values], lsb=0)


@given(shape=SHAPES, axis_seed=st.integers(0, 100), exclusive=st.booleans(), reverse=st.booleans(),
       dtype=st.sampled_from(["float32", "int32"]), seed=st.integers(0, 2**16))
def test_cumsum(shape, axis_seed, exclusive, reverse, dtype, seed):
    rng = np.random.default_rng(seed)
    axis = axis_seed % (2 * len(shape)) - len(shape)
    b = GraphBuilder()
    x = b.input("x", shape, dtype)
    b.output(b.op("CUMSUM", [x, b.const("axis", np.array(axis, np.int32))],
                  options={"exclusive": exclusive, "reverse": reverse}))
    check_against_litert(b.to_bytes(), [(rng.standard_normal(shape) * 5).astype(dtype)], lsb=0)
