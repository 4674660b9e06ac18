"""Golden tests of the data-movement kernels (reshapes, joins, splits, slices, gathers, padding) against LiteRT."""

import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from delegate import CompileOptions
from delegate.tflite.builder import GraphBuilder
from tests.oputil import check_against_litert

SHAPES = st.sampled_from([(5,), (3, 4), (2, 3, 4), (2, 4, 3, 2), (1, 3, 2, 2, 3)])
DTYPES = st.sampled_from(["float32", "int32", "int64", "bool"])


def _values(rng, shape, dtype):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    return (rng.standard_normal(shape) * 10).astype(dtype)


def _single(opcode, x_shape, dtype, consts=(), options=None, out_dtype=None, **kwargs):
    """One op on input ``x`` followed by constant operands; returns the model bytes."""
    b = GraphBuilder()
    x = b.input("x", x_shape, dtype)
    inputs = [x] + [b.const(f"c{i}", np.asarray(c)) for i, c in enumerate(consts)]
    out = b.op(opcode, inputs, options=options, dtype=out_dtype, **kwargs)
    b.output(*(out if isinstance(out, list) else [out]))
    return b.to_bytes()


@given(shape=SHAPES, dtype=DTYPES, seed=st.integers(0, 2**16), use_minus_one=st.booleans())
def test_reshape(shape, dtype, seed, use_minus_one):
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    target = [size // shape[0], shape[0]]
    if use_minus_one:
        target[0] = -1
    check_against_litert(_single("RESHAPE", shape, dtype, [np.array(target, np.int32)]),
                         [_values(rng, shape, dtype)], lsb=0)


@given(shape=st.sampled_from([(1, 3, 1, 2), (2, 1, 1), (1, 1)]), which=st.sampled_from(["all", "first", "neg"]),
       seed=st.integers(0, 2**16))
def test_squeeze(shape, which, seed):
    ones = [i for i, d in enumerate(shape) if d == 1]
    dims = {"all": [], "first": ones[:1], "neg": [ones[-1] - len(shape)]}[which]
    rng = np.random.default_rng(seed)
    check_against_litert(_single("SQUEEZE", shape, "float32", options={"squeeze_dims": dims}),
                         [_values(rng, shape, "float32")])


@given(shape=SHAPES, axis_seed=st.integers(0, 100), seed=st.integers(0, 2**16))
def test_expand_dims(shape, axis_seed, seed):
    rank = len(shape)
    axis = axis_seed % (2 * rank + 2) - (rank + 1)
    rng = np.random.default_rng(seed)
    check_against_litert(_single("EXPAND_DIMS", shape, "float32", [np.array([axis], np.int32)]),
                         [_values(rng, shape, "float32")])


@given(shape=SHAPES, dtype=DTYPES, seed=st.integers(0, 2**16))
def test_transpose(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(shape)).astype(np.int32)
    check_against_litert(_single("TRANSPOSE", shape, dtype, [perm]), [_values(rng, shape, dtype)], lsb=0)


@given(shape=SHAPES, count=st.integers(1, 4), axis_seed=st.integers(0, 100), seed=st.integers(0, 2**16))
def test_concatenation(shape, count, axis_seed, seed):
    rank = len(shape)
    axis = axis_seed % (2 * rank) - rank
    rng = np.random.default_rng(seed)
    shapes = []
    for _ in range(count):
        s = list(shape)
        s[axis] = int(rng.integers(1, 4))
        shapes.append(tuple(s))
    b = GraphBuilder()
    xs = [b.input(f"x{i}", s) for i, s in enumerate(shapes)]
    b.output(b.op("CONCATENATION", xs, options={"axis": axis}))
    check_against_litert(b.to_bytes(), [_values(rng, s, "float32") for s in shapes])


@given(shape=SHAPES, count=st.integers(1, 4), axis_seed=st.integers(0, 100),
       dtype=st.sampled_from(["float32", "int32", "int64"]), seed=st.integers(0, 2**16))
def test_pack(shape, count, axis_seed, dtype, seed):
    rank = len(shape) + 1
    axis = axis_seed % (2 * rank) - rank
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    xs = [b.input(f"x{i}", shape, dtype) for i in range(count)]
    b.output(b.op("PACK", xs, options={"axis": axis, "values_count": count}))
    check_against_litert(b.to_bytes(), [_values(rng, shape, dtype) for _ in range(count)], lsb=0)


@given(shape=SHAPES, axis_seed=st.integers(0, 100), seed=st.integers(0, 2**16))
def test_unpack(shape, axis_seed, seed):
    rank = len(shape)
    axis = axis_seed % (2 * rank) - rank
    rng = np.random.default_rng(seed)
    model = _single("UNPACK", shape, "float32", options={"axis": axis, "num": shape[axis]},
                    num_outputs=shape[axis])
    check_against_litert(model, [_values(rng, shape, "float32")])


@given(shape=SHAPES, axis_seed=st.integers(0, 100), seed=st.integers(0, 2**16))
def test_split(shape, axis_seed, seed):
    rank = len(shape)
    axis = axis_seed % (2 * rank) - rank
    size = shape[axis]
    splits = max(d for d in range(1, size + 1) if size % d == 0 and d <= 3)
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    outs = b.op("SPLIT", [b.const("axis", np.array(axis, np.int32)), x], options={"num_splits": splits},
                num_outputs=splits, dtype="float32")
    b.output(*(outs if isinstance(outs, list) else [outs]))
    check_against_litert(b.to_bytes(), [_values(rng, shape, "float32")])


@given(parts=st.lists(st.integers(0, 3), min_size=1, max_size=4), minus_one=st.booleans(),
       axis=st.sampled_from([0, 1, -1]), seed=st.integers(0, 2**16))
def test_split_v(parts, minus_one, axis, seed):
    shape = [2, 3, 2]
    shape[axis] = sum(parts)
    assume(shape[axis] > 0)
    sizes = list(parts)
    if minus_one:
        sizes[0] = -1
    rng = np.random.default_rng(seed)
    model = _single("SPLIT_V", tuple(shape), "float32",
                    [np.array(sizes, np.int32), np.array(axis, np.int32)],
                    options={"num_splits": len(sizes)}, num_outputs=len(sizes))
    check_against_litert(model, [_values(rng, tuple(shape), "float32")])


@given(shape=SHAPES, dtype=DTYPES, data=st.data())
def test_slice(shape, dtype, data):
    begin = [data.draw(st.integers(0, d - 1)) for d in shape]
    size = [data.draw(st.sampled_from([-1, d - b])) if d - b > 0 else -1 for b, d in zip(begin, shape)]
    size = [s if s == -1 else data.draw(st.integers(1, s)) for s in size]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    model = _single("SLICE", shape, dtype, [np.array(begin, np.int32), np.array(size, np.int32)])
    check_against_litert(model, [_values(rng, shape, dtype)], lsb=0)


@st.composite
def strided_slice_case(draw):
    shape = draw(SHAPES)
    rank = len(shape)
    if draw(st.booleans()):
        # ``offset``: end is a length from begin.  LiteRT sizes the output from ``end`` alone, so it is only
        # well defined with one in-range entry per dimension and no masks.
        begin = [draw(st.integers(0, d - 1)) for d in shape]
        end = [draw(st.integers(0, d - b)) for b, d in zip(begin, shape)]
        return shape, begin, end, [1] * rank, {"offset": True}
    count = draw(st.integers(1, rank + 1))
    bits = st.integers(0, 2 ** count - 1)
    ellipsis = draw(st.sampled_from([0] + [1 << i for i in range(count)]))
    new_axis = draw(bits) & ~ellipsis
    shrink = draw(bits) & ~ellipsis & ~new_axis
    consuming = sum(1 for i in range(count) if not (ellipsis | new_axis) >> i & 1)
    assume(consuming <= rank)
    begin, end, strides = [], [], []
    for i in range(count):
        if shrink >> i & 1:
            begin.append(draw(st.sampled_from([0, -1])))
            end.append(0)
            strides.append(1)
        else:
            begin.append(draw(st.integers(-6, 6)))
            end.append(draw(st.integers(-6, 6)))
            strides.append(draw(st.sampled_from([-3, -2, -1, 1, 2, 3])))
    options = {"begin_mask": draw(bits), "end_mask": draw(bits), "ellipsis_mask": ellipsis,
               "new_axis_mask": new_axis, "shrink_axis_mask": shrink}
    return shape, begin, end, strides, options


@given(case=strided_slice_case(), seed=st.integers(0, 2**16))
def test_strided_slice(case, seed):
    """Against LiteRT's reference kernel: its XNNPACK path returns whole dimensions for empty slices."""
    shape, begin, end, strides, options = case
    rng = np.random.default_rng(seed)
    model = _single("STRIDED_SLICE", shape, "float32",
                    [np.array(v, np.int32) for v in (begin, end, strides)], options=options)
    check_against_litert(model, [_values(rng, shape, "float32")], builtin=True)


@given(shape=SHAPES, idx_shape=st.sampled_from([(), (3,), (2, 2)]), axis_seed=st.integers(0, 100),
       batch_dims=st.integers(0, 1), idx_dtype=st.sampled_from(["int32", "int64"]), dtype=DTYPES,
       seed=st.integers(0, 2**16))
def test_gather(shape, idx_shape, axis_seed, batch_dims, idx_dtype, dtype, seed):
    rank = len(shape)
    axis = axis_seed % rank
    if batch_dims:
        assume(axis >= 1 and len(idx_shape) >= 1)
        idx_shape = (shape[0],) + idx_shape[1:]
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, shape[axis], idx_shape).astype(idx_dtype)
    model = _single("GATHER", shape, dtype, [indices], options={"axis": axis - rank * (axis_seed % 2),
                                                               "batch_dims": batch_dims})
    check_against_litert(model, [_values(rng, shape, dtype)], lsb=0)


@given(shape=SHAPES, depth_seed=st.integers(0, 100), lead=st.sampled_from([(), (3,), (2, 2)]),
       seed=st.integers(0, 2**16))
def test_gather_nd(shape, depth_seed, lead, seed):
    depth = depth_seed % len(shape) + 1
    rng = np.random.default_rng(seed)
    indices = np.stack([rng.integers(0, d, lead) for d in shape[:depth]], axis=-1).astype(np.int32)
    check_against_litert(_single("GATHER_ND", shape, "float32", [indices]), [_values(rng, shape, "float32")])


@given(shape=SHAPES, dtype=DTYPES, seed=st.integers(0, 2**16))
def test_tile(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    reps = rng.integers(1, 3, len(shape)).astype(np.int32)
    check_against_litert(_single("TILE", shape, dtype, [reps]), [_values(rng, shape, dtype)], lsb=0)


@given(shape=SHAPES, op=st.sampled_from(["PAD", "PADV2"]), dtype=st.sampled_from(["float32", "int32"]),
       seed=st.integers(0, 2**16))
def test_pad(shape, op, dtype, seed):
    rng = np.random.default_rng(seed)
    pads = rng.integers(0, 3, (len(shape), 2)).astype(np.int32)
    consts = [pads] + ([np.array(7, dtype)] if op == "PADV2" else [])
    check_against_litert(_single(op, shape, dtype, consts), [_values(rng, shape, dtype)], lsb=0)


@given(shape=st.sampled_from([(1, 9, 7, 24), (3, 5), (7,)]), op=st.sampled_from(["PAD", "PADV2"]),
       before=st.integers(0, 3), after=st.integers(0, 9), native=st.booleans(), seed=st.integers(0, 2**16))
def test_pad_of_the_last_axis(shape, op, before, after, native, seed):
    """Channels appended or prepended (a residual's channel pad): one native pass, or numpy's."""
    rng = np.random.default_rng(seed)
    pads = np.zeros((len(shape), 2), np.int32)
    pads[-1] = before, after
    consts = [pads] + ([np.array(-2.5, np.float32)] if op == "PADV2" else [])
    check_against_litert(_single(op, shape, "float32", consts), [_values(rng, shape, "float32")], lsb=0,
                         options=CompileOptions(num_threads=2), backend_options={"native": native})


@given(shape=SHAPES, mode=st.sampled_from(["REFLECT", "SYMMETRIC"]), seed=st.integers(0, 2**16))
def test_mirror_pad(shape, mode, seed):
    rng = np.random.default_rng(seed)
    limit = np.array(shape) - (1 if mode == "REFLECT" else 0)
    pads = np.stack([rng.integers(0, limit + 1), rng.integers(0, limit + 1)], axis=1).astype(np.int32)
    check_against_litert(_single("MIRROR_PAD", shape, "float32", [pads], options={"mode": mode}),
                         [_values(rng, shape, "float32")])


@given(block=st.integers(1, 3), h=st.integers(1, 3), w=st.integers(1, 3), c=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_depth_to_space_and_back(block, h, w, c, seed):
    rng = np.random.default_rng(seed)
    shape = (2, h, w, c * block * block)
    check_against_litert(_single("DEPTH_TO_SPACE", shape, "float32", options={"block_size": block}),
                         [_values(rng, shape, "float32")])
    shape = (1, h * block, w * block, c)
    check_against_litert(_single("SPACE_TO_DEPTH", shape, "float32", options={"block_size": block}),
                         [_values(rng, shape, "float32")])


@given(case=st.sampled_from([((3,), (2, 3)), ((1, 4), (3, 4)), ((2, 1, 3), (2, 4, 3)), ((), (2, 2)),
                             ((3, 1), (1, 2, 3, 5))]), dtype=DTYPES, seed=st.integers(0, 2**16))
def test_broadcast_to(case, dtype, seed):
    shape, target = case
    rng = np.random.default_rng(seed)
    model = _single("BROADCAST_TO", shape, dtype, [np.array(target, np.int32)], version=2)  # LiteRT has no v1
    check_against_litert(model, [_values(rng, shape, dtype)], lsb=0)


@given(shape=SHAPES, out_type=st.sampled_from(["int32", "int64"]))
def test_shape(shape, out_type):
    model = _single("SHAPE", shape, "float32", options={"out_type": 2 if out_type == "int32" else 4},
                    out_dtype=out_type)
    check_against_litert(model, [np.zeros(shape, np.float32)], lsb=0)


@given(dims=st.sampled_from([(3,), (2, 3), (1, 2, 2)]), dtype=st.sampled_from(["float32", "int32", "bool"]))
def test_fill(dims, dtype):
    b = GraphBuilder()
    value = b.input("value", (), dtype)
    b.output(b.op("FILL", [b.const("dims", np.array(dims, np.int32)), value], dtype=dtype))
    check_against_litert(b.to_bytes(), [np.array(True if dtype == "bool" else 3.5).astype(dtype)], lsb=0)


def test_shape_arithmetic_runs_at_compile_time():
    """SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE (a converter's reshape by a shape read at run time): the
    shape arithmetic is computed once when the partition compiles, only the RESHAPE runs; a SHAPE whose
    result a caller reads still runs."""
    from delegate import read_model
    from delegate.partition import make_partition
    from delegate.plugins import default_manager
    from delegate.runtime import Executor

    b = GraphBuilder()
    x = b.input("x", (2, 3, 4), "float32")
    dims = b.op("SHAPE", [x], options={"out_type": 2}, dtype="int32")
    batch = b.op("STRIDED_SLICE", [dims, *(b.const(name, np.array([v], np.int32)) for name, v in
                                           (("begin", 0), ("end", 1), ("strides", 1)))],
                 options={"shrink_axis_mask": 1}, dtype="int32")
    shape = b.op("PACK", [batch, b.const("rest", np.array(12, np.int32))], options={"axis": 0, "values_count": 2},
                 dtype="int32")
    b.output(b.op("RESHAPE", [x, shape], shape=(2, 12)), b.op("SHAPE", [x], options={"out_type": 2}, dtype="int32"))
    model = b.to_bytes()
    values = _values(np.random.default_rng(0), (2, 3, 4), "float32")
    check_against_litert(model, [values], lsb=0)
    g = read_model(model).main
    ex = Executor(g, [make_partition(g, g.ops, "cpu", 0)], {"cpu": default_manager().backend_info("cpu").factory({})},
                  CompileOptions())
    assert ex.compiled[0].describe()["computed_at_compile_time"] == [0, 1, 2]
    out = ex.run({g.inputs[0].index: values})
    np.testing.assert_array_equal(out[g.outputs[0].index], values.reshape(2, 12))
    np.testing.assert_array_equal(out[g.outputs[1].index], [2, 3, 4])


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 197, 16), (3, 64, 96), (1, 2, 197, 16), (2, 3, 1, 4, 5), (2, 1, 3, 2, 2, 3)])
@pytest.mark.parametrize("dtype", ["float32", "int8", "int16", "int64", "bool"])
def test_transpose_in_the_native_loops_moves_every_item(shape, dtype):
    """TRANSPOSE by a constant permutation is one prepared native call (batched with its neighbours): every
    permutation of up to six axes, items of 1 to 8 bytes (a matrix transposed: 4-byte items, by blocks of 8 x 8
    and the ragged edges), shared among two threads, exactly numpy's."""
    import itertools
    import delegate
    rng = np.random.default_rng(len(shape))
    perms = list(itertools.permutations(range(len(shape))))
    for perm in [perms[i] for i in rng.choice(len(perms), min(len(perms), 6), replace=False)]:
        data = _single("TRANSPOSE", shape, dtype, [np.array(perm, np.int32)],
                       shape=tuple(shape[k] for k in perm))
        x = _values(rng, shape, dtype)
        session = delegate.load(data, backends="[cpu]", num_threads=2, **{"cpu.engine": "numpy"})
        (_, run, _, _), = session.executor.compiled[0].steps
        matrix = len(shape) > 1 and perm[-2] == len(shape) - 1 != perm[-1]  # numpy's for items not of 4 bytes
        assert (getattr(run, "prepared", None) is not None) == (not matrix or np.dtype(dtype).itemsize == 4)
        out = next(iter(session.run_indexed({session.graph.inputs[0].index: x}).values()))
        np.testing.assert_array_equal(out, np.transpose(x, perm))
