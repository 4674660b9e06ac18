"""The CPU kernels' native loops: built with the machine's compiler, exact against numpy on awkward
layouts and widths, and absent (the numpy formulations run) when they cannot be built."""

import shutil

import numpy as np
import pytest

from delegate import native as native_build
from delegate_cpu.kernels import native

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                    reason="no C compiler on this machine")


@pytest.fixture(scope="module")
def loops():
    built = native.native_loops()
    assert built is not None, "a C compiler is installed but the native loops did not build"
    return built


def _reference(x, out_hw, kernel, steps, before, tap, width):
    """(OH, OW, width) outputs in float64: each sums ``tap(input pixel, ky, kx)`` over its filter taps inside
    the (H, W, C) image."""
    (h, w, _), (oh, ow), (kh, kw), (sh, sw, dh, dw), (top, left) = x.shape, out_hw, kernel, steps, before
    expected = np.zeros((oh, ow, width))
    for oy in range(oh):
        for ox in range(ow):
            for ky in range(kh):
                for kx in range(kw):
                    iy, ix = oy * sh + ky * dh - top, ox * sw + kx * dw - left
                    if 0 <= iy < h and 0 <= ix < w:
                        expected[oy, ox] += tap(x[iy, ix].astype(np.float64), ky, kx)
    return expected


@needs_compiler
@pytest.mark.parametrize("shape, kernel, steps, before, out_hw", [
    ((9, 11, 96), (3, 3), (1, 1, 1, 1), (1, 1), (9, 11)),   # SAME: 64 + 32 channels in registers
    ((9, 11, 24), (5, 5), (2, 2, 1, 1), (2, 2), (5, 6)),    # strides: 16 channels, then the last 16 again
    ((8, 9, 28), (3, 3), (2, 2, 1, 1), (0, 0), (3, 4)),     # strides, a tail of 12 channels
    ((6, 7, 5), (3, 2), (1, 3, 2, 2), (2, 1), (6, 3)),     # dilation, odd channels, asymmetric padding
    ((2, 2, 17), (5, 5), (1, 1, 1, 1), (2, 2), (2, 2)),     # every pixel a border pixel
    ((4, 4, 3), (3, 3), (1, 1, 1, 1), (-1, 0), (2, 2)),     # rows starting inside the input (a band)
])
def test_depthwise_matches_numpy(loops, shape, kernel, steps, before, out_hw):
    rng = np.random.default_rng(0)
    (h, w, c), (kh, kw), (sh, sw, dh, dw), (top, left), (oh, ow) = shape, kernel, steps, before, out_hw
    x = rng.standard_normal(shape).astype(np.float32)
    weights = rng.standard_normal((kh, kw, c)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    rows = np.full((oh, ow * c + 5), np.nan, np.float32)  # rows further apart than their width
    out = rows[:, :ow * c].reshape(1, oh, ow, c)
    where = native.Geometry.around(x[None], out, kernel, steps, before)
    finish = native.Epilogue(bias, (-1.0, 1.0)).tiled(ow)
    loops.depthwise(x[None], native.DepthwiseTaps(weights.reshape(kh * kw, c)), out, where, 2, finish)
    assert np.isnan(rows[:, ow * c:]).all()  # nothing written between the rows
    expected = _reference(x, out_hw, kernel, steps, before, lambda pixel, ky, kx: pixel * weights[ky, kx], c)
    expected = np.clip(expected + bias, -1, 1)
    np.testing.assert_allclose(out.reshape(oh, ow, c), expected, rtol=1e-5, atol=1e-5)


@needs_compiler
@pytest.mark.parametrize("width", [3, 5, 6, 13, 30])  # inner pixels: one by one, 4, 4 overlapping, 8 + 4 ...
@pytest.mark.parametrize("stride", [1, 2])
# vectors of 16 and one of 8 (AVX-512), vectors of 8 only; no multiple of 8: the last 8 channels again
@pytest.mark.parametrize("c", [24, 32, 12, 28, 42])
def test_depthwise_pixel_groups_match_numpy(loops, width, stride, c):
    """Channels in whole vectors: the pixels with every tap inside go in groups along the row, bias and
    PReLU applied in registers, the border pixels one by one."""
    _depthwise_3x3_against_numpy(loops, np.random.default_rng(width), 4, width, c, stride, 1)


def _depthwise_3x3_against_numpy(loops, rng, h: int, width: int, c: int, stride: int, threads: int) -> None:
    """A SAME 3x3 depthwise convolution of an (h, width, c) image on ``threads``, bias and PReLU in its
    epilogue, against numpy; the output starts as NaN, so a channel left unwritten shows."""
    x = rng.standard_normal((h, width, c)).astype(np.float32)
    weights = rng.standard_normal((3, 3, c)).astype(np.float32)
    bias, slope = rng.standard_normal(c).astype(np.float32), rng.uniform(-1, 2, c).astype(np.float32)
    oh, ow = -(-h // stride), -(-width // stride)
    out = np.full((1, oh, ow, c), np.nan, np.float32)
    where = native.Geometry.around(x[None], out, (3, 3), (stride, stride, 1, 1), (1, 1))
    finish = native.Epilogue(bias, slope=slope).tiled(ow)
    loops.depthwise(x[None], native.DepthwiseTaps(weights.reshape(9, c)), out, where, threads, finish)
    expected = _reference(x, (oh, ow), (3, 3), (stride, stride, 1, 1), (1, 1),
                          lambda pixel, ky, kx: pixel * weights[ky, kx], c) + bias
    expected = np.where(expected < 0, expected * slope, expected)
    np.testing.assert_allclose(out[0], expected, rtol=1e-5, atol=1e-5)


@needs_compiler
@pytest.mark.parametrize("h, c", [(1, 32), (2, 40), (3, 72), (7, 960), (2, 36), (16, 48), (14, 144)])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("threads", [2, 3, 8, 16])
def test_depthwise_channel_blocks_of_few_rows_match_numpy(loops, h, c, stride, threads):
    """Rows that do not share evenly among the team: each row's channels are split into blocks of whole
    vectors (channel_block), the last block taking what is left (every channel written once, the epilogue's
    per-channel bias and slope at each block's own channels)."""
    _depthwise_3x3_against_numpy(loops, np.random.default_rng(h * c), h, 9, c, stride, threads)


def _depthwise_rows_against_numpy(loops, rng, h: int, width: int, c: int, k: int, threads: int,
                                  weights: np.ndarray | None = None) -> None:
    """A SAME k x k stride-1 depthwise convolution of an (h, width, c) image (whole rows: the border pixels in
    groups with the others), bias in its epilogue, against numpy; the output starts as NaN."""
    x = rng.standard_normal((h, width, c)).astype(np.float32)
    weights = rng.standard_normal((k, k, c)).astype(np.float32) if weights is None else weights
    bias = rng.standard_normal(c).astype(np.float32)
    out = np.full((1, h, width, c), np.nan, np.float32)
    where = native.Geometry.around(x[None], out, (k, k), (1, 1, 1, 1), (k // 2, k // 2))
    loops.depthwise(x[None], native.DepthwiseTaps(weights.reshape(k * k, c)), out, where, threads,
                    native.Epilogue(bias).tiled(width))
    expected = _reference(x, (h, width), (k, k), (1, 1, 1, 1), (k // 2, k // 2),
                          lambda pixel, ky, kx: pixel * weights[ky, kx], c) + bias
    np.testing.assert_allclose(out[0], expected, rtol=1e-5, atol=1e-5)


@needs_compiler
@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 7, 9, 12, 14, 17])  # groups of 8, 4 and 1-3, edges on both
@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("c", [8, 24, 136, 300])  # one vector of 8; 16 + 8; blocks of 128 and a tail
def test_depthwise_whole_rows_match_numpy(loops, width, k, c):
    """At a stride of 1 a row goes whole: groups reaching past its ends read the columns outside as zeros."""
    _depthwise_rows_against_numpy(loops, np.random.default_rng(width * k + c), 3, width, c, k, 2)


@needs_compiler
def test_depthwise_taps_outside_the_image_are_skipped_whatever_the_weights():
    """A tap outside the image adds nothing, not zero times its weight: with an infinite weight in a filter's
    left column, the pixels at the left edge, whose left taps fall outside, stay finite (as LiteRT's kernels)."""
    loops = native.native_loops()
    weights = np.random.default_rng(0).standard_normal((3, 3, 16)).astype(np.float32)
    weights[1, 0, :5] = np.inf
    _depthwise_rows_against_numpy(loops, np.random.default_rng(1), 4, 9, 16, 3, 2, weights)


FLOAT_BUILD_RUN = """
import numpy as np
from delegate_cpu.kernels.native import native_loops
from tests.ops import test_native as t
loops = native_loops()
for width in (1, 3, 4, 7, 9, 14):
    for k in (3, 5):
        for c in (8, 24, 40):
            t._depthwise_rows_against_numpy(loops, np.random.default_rng(width), 3, width, c, k, 2)
from tests.ops import test_shape_ops
for shape in ((2, 197, 16), (3, 64, 96)):  # matrices transposed by blocks of 8 x 8 in registers
    test_shape_ops.test_transpose_in_the_native_loops_moves_every_item(shape, "float32")
print("matched")
"""


@needs_compiler
@pytest.mark.parametrize("flags", ["-mno-avx512f", "-mno-avx2 -mno-avx512f"], ids=["avx2", "portable"])
def test_depthwise_whole_rows_as_other_machines_build_them(tmp_path, flags):
    """The float depthwise rows built without AVX-512 (groups of 4 pixels by filter rows) and without AVX2, and
    the transposes' blocks in registers."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "DELEGATE_NATIVE_CFLAGS": flags, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", FLOAT_BUILD_RUN], cwd=Path(__file__).parents[2], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "matched" in done.stdout, done.stderr[-2000:]


@needs_compiler
@pytest.mark.parametrize("m, k, n, threads", [(300, 40, 70, 2), (5, 64, 1000, 2), (1, 8, 3, 4), (64, 16, 16, 1)])
def test_shared_product_matches_numpy(loops, m, k, n, threads):
    if loops.sgemm is None:
        pytest.skip("numpy's BLAS exports no sgemm the native loops know")
    rng = np.random.default_rng(1)
    lhs = rng.standard_normal((m, k)).astype(np.float32)
    rhs = rng.standard_normal((k, n + 9)).astype(np.float32)[:, 4:4 + n]  # rows of rhs and out strided
    out = np.zeros((m, n + 5), np.float32)[:, 2:2 + n]
    expected = lhs.astype(np.float64) @ rhs
    assert loops.product(lhs, rhs, out, threads)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    out[:] = 0
    assert loops.product(np.asfortranarray(lhs), rhs, out, threads)  # a transposed operand
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@needs_compiler
def test_shared_product_declines_what_it_cannot_run(loops):
    a = np.ones((8, 8), np.float32)
    assert not loops.product(a.astype(np.float64), a.astype(np.float64), np.empty((8, 8)), 2)
    assert not loops.product(a[::2, ::2], a[:4, :4], np.empty((4, 4), np.float32), 2)  # no unit stride


# Widths around the panels (two vectors of lanes, the last one vector where the units left fit) and
# row counts around the register tiles (6 rows; 12 in a panel one vector wide), on one thread and shared.
@needs_compiler
@pytest.mark.parametrize("m, k, n, threads", [
    (13, 40, 16, 1), (13, 40, 17, 2), (7, 3, 32, 2), (301, 70, 48, 2), (1, 512, 213, 2), (4, 64, 200, 4),
    (64, 1, 9, 2), (6, 128, 8, 1), (25, 16, 8, 1), (31, 20, 40, 2), (11, 9, 5, 1)])
def test_packed_product_matches_numpy(loops, m, k, n, threads):
    rng = np.random.default_rng(2)
    lhs = rng.standard_normal((m, k)).astype(np.float32)
    rhs = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    packed = native.PackedOperand(rhs, loops.panel_lanes)
    np.testing.assert_array_equal(packed.block(0, n), rhs)
    finish = native.Epilogue(bias, (-1.0, 2.0)).padded(packed.padded_columns)
    expected = np.clip(lhs.astype(np.float64) @ rhs + bias, -1, 2)
    for operand in (lhs, np.asfortranarray(lhs), np.zeros((m, k + 3), np.float32)[:, 1:1 + k]):
        operand[:] = lhs
        out = np.full((m, n + 5), np.nan, np.float32)
        assert loops.packed_product(operand, packed, out[:, :n], threads, finish)
        np.testing.assert_allclose(out[:, :n], expected, rtol=1e-4, atol=1e-4)
        assert np.isnan(out[:, n:]).all()  # nothing written past the units
    call = native.ProductCall((m, k), lhs.strides, packed, n, native.NO_EPILOGUE, threads)
    out = np.empty((m, n), np.float32)
    loops.prepared(call, lhs, out)
    np.testing.assert_allclose(out, lhs.astype(np.float64) @ rhs, rtol=1e-4, atol=1e-4)


@needs_compiler
@pytest.mark.parametrize("m, k, n", [(49, 96, 160), (49, 160, 960), (7, 32, 1000), (200, 24, 144), (3, 8, 40)])
def test_packed_product_is_the_same_on_every_team(loops, m, k, n):
    """However a team splits the row tiles and panels (by rows, by panels, or blocks of both: team_split), every
    output is computed once, over the depth in one order: the same result on 1 to 16 threads (up to the last
    bit where a split changes a tile's height, and with it the register tile that sums it)."""
    rng = np.random.default_rng(3)
    lhs = rng.standard_normal((m, k)).astype(np.float32)
    packed = native.PackedOperand(rng.standard_normal((k, n)).astype(np.float32), loops.panel_lanes)
    finish = native.Epilogue(rng.standard_normal(n).astype(np.float32), (-1.0, 2.0)).padded(packed.padded_columns)
    outs = []
    for threads in (1, 2, 3, 4, 6, 16):
        out = np.full((m, n), np.nan, np.float32)
        assert loops.packed_product(lhs, packed, out, threads, finish)
        outs.append(out)
    for out in outs[1:]:
        np.testing.assert_allclose(out, outs[0], rtol=1e-6, atol=1e-6)


def test_no_compiler_leaves_the_numpy_kernels(monkeypatch):
    monkeypatch.setattr(native_build, "find_compiler", lambda: None)
    assert native._load() is None


def test_failing_compiler_leaves_the_numpy_kernels(monkeypatch, tmp_path):
    monkeypatch.setattr(native_build, "find_compiler", lambda: ["false"])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert native._load() is None
    assert not list(tmp_path.rglob("*.so"))


def test_missing_source_leaves_the_numpy_kernels(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "SOURCE", tmp_path / "absent.c")
    assert native._load() is None


@needs_compiler
@pytest.mark.parametrize("shape, units, kernel, steps, before, out_hw", [
    ((9, 13, 3), 70, (3, 3), (1, 1, 1, 1), (1, 1), (9, 13)),  # two panels, then 6 units; groups of pixels, borders
    ((8, 9, 5), 20, (2, 3), (2, 2, 1, 1), (0, 1), (4, 5)),     # strides
    ((7, 7, 2), 8, (3, 3), (1, 1, 2, 2), (2, 2), (7, 7)),      # dilation
    ((8, 8, 40), 1, (2, 2), (2, 2, 1, 1), (0, 0), (4, 4)),     # one unit, a deep patch
    ((3, 20, 4), 33, (5, 5), (1, 1, 1, 1), (2, 2), (3, 20)),   # a filter taller than the image
])
def test_direct_conv_matches_numpy(loops, shape, units, kernel, steps, before, out_hw):
    rng = np.random.default_rng(1)
    (h, w, c), (kh, kw), (sh, sw, dh, dw), (top, left), (oh, ow) = shape, kernel, steps, before, out_hw
    x = rng.standard_normal((1, h, w, c)).astype(np.float32)
    weights = rng.standard_normal((kh, kw, c, units)).astype(np.float32)
    packed = native.PackedOperand(weights.reshape(kh * kw * c, units), loops.panel_lanes)
    out = np.full((1, oh, ow, units), np.nan, np.float32)
    where = native.Geometry.around(x, out, kernel, steps, before)
    loops.conv(x, packed, out, where, 2)
    expected = _reference(x[0], out_hw, kernel, steps, before, lambda pixel, ky, kx: pixel @ weights[ky, kx],
                          units)
    np.testing.assert_allclose(out[0], expected, rtol=1e-5, atol=1e-5)


def _conv_ops(sizes):
    """CONV_2D ops of 1x1 filters, 64 channels in and out, on square images of these sizes."""
    from delegate.tflite.builder import GraphBuilder
    b = GraphBuilder()
    weights = b.const("w", np.zeros((64, 1, 1, 64), np.float32))
    for i, size in enumerate(sizes):
        x = b.input(f"x{i}", (1, size, size, 64))
        b.op("CONV_2D", [x, weights], options={"padding": "VALID", "stride_h": 1, "stride_w": 1})
    return b.ops


def test_partition_team_follows_the_large_ops(monkeypatch):
    """One team per partition, from the op at the upper quartile of the work: big ops take every thread
    (up to MAX_TEAM), small ones fewer, none a partition with no convolutions or products; never more
    than the process's cores."""
    monkeypatch.setattr(native, "available_cores", lambda: 64)
    big, small = 64, 16  # 64x64x64x64 = 16.8M multiply-adds per op; 16x16x64x64 = 1.05M
    assert native.partition_team(_conv_ops([big, big]), 16) == 16
    assert native.partition_team(_conv_ops([big, big]), 32) == native.MAX_TEAM
    assert native.partition_team(_conv_ops([small] * 3), 16) == 4  # 1.05M / 2^18
    assert native.partition_team(_conv_ops([small] * 9 + [big]), 16) == 16  # the big op holds most work
    assert native.partition_team(_conv_ops([4]), 2) == 1
    # many small ops (262k: the median) and one of 1.05M holding a third of the work: a team of two
    assert native.partition_team(_conv_ops([8] * 8 + [small]), 2) == 2
    assert native.partition_team([], 6) == 6
    monkeypatch.setattr(native, "available_cores", lambda: 3)
    assert native.partition_team(_conv_ops([big, big]), 16) == 3


def test_partition_team_counts_ops_built_on_exp(monkeypatch):
    """A transformer block's attention SOFTMAX of 2 x 197 x 197 outweighs its small projections: a ViT block's
    partition ran on one thread of two, its SOFTMAX 70 us where two took 36.  Its BATCH_MATMULs go through
    BLAS on one thread whatever the team, and do not count."""
    from delegate.tflite.builder import GraphBuilder
    monkeypatch.setattr(native, "available_cores", lambda: 64)
    b = GraphBuilder()
    q, k = b.input("q", (1, 2, 197, 16)), b.input("k", (1, 2, 16, 197))
    scores = b.op("BATCH_MATMUL", [q, k])
    b.op("SOFTMAX", [scores], options={"beta": 1.0})
    attention = list(b.ops)
    assert native._multiply_adds(attention[0]) == 0
    assert native._multiply_adds(attention[1]) == 2 * 197 * 197 * native.EXP_VALUE_MACS
    assert native.partition_team(_conv_ops([8] * 4) + attention, 2) == 2
    assert native.partition_team(_conv_ops([8] * 4), 2) == 1


@needs_compiler
def test_calls_that_do_not_fit_their_arrays_are_refused(loops):
    """The ctypes boundary: a call whose arrays do not hold what its loops address never reaches C."""
    from delegate import ExecutionError
    x = np.ones((1, 4, 4, 3), np.float32)
    with pytest.raises(ExecutionError, match="pad"):
        loops.pad_rows(x, np.empty((1, 4, 4, 1), np.float32), 0, -2, 0.0, 1)  # a negative channel pad
    with pytest.raises(ExecutionError, match="pad"):
        loops.pad_rows(x, np.empty((1, 4, 4, 5), np.int8), 0, 2, 0.0, 1)  # floats into int8
    with pytest.raises(ExecutionError, match="geometry"):
        native.Geometry.around(x, ((1, 4, 4, 3), (48, 12, 3, 1)), (3, 3), (1, 1, 0, 1), (1, 1))  # dilation 0
    where = native.Geometry.around(x, np.empty((1, 4, 4, 3), np.float32), (3, 3), (1, 1, 1, 1), (1, 1))
    with pytest.raises(ExecutionError, match="differ"):
        loops.pool(x, np.empty((1, 2, 4, 3), np.float32), where, True, 1)  # fewer rows than the geometry
    with pytest.raises(ExecutionError, match="prelu"):
        loops.prepared(native.PreluCall(np.ones(3, np.float32), (1, 4, 4, 3), 1), x,
                       np.empty((1, 4, 4, 2), np.float32))  # an output of fewer channels
    with pytest.raises(ExecutionError, match="unary"):
        loops.prepared(native.UnaryCall("HARD_SWISH", x.size, native.NO_EPILOGUE, 1), x[..., :2].copy(),
                       np.empty_like(x))  # an input smaller than the call's
    with pytest.raises(ExecutionError, match="taps"):
        loops.depthwise(x, native.DepthwiseTaps(np.ones((9, 5), np.float32)), np.empty((1, 4, 4, 3), np.float32),
                        where, 1)  # a filter of 5 channels over 3


@needs_compiler
def test_partition_input_is_placed_in_the_batch_each_run(loops):
    """MobileNetV2-0.35 fp32 runs as one batched call, the partition input's address set per run: fresh,
    non-contiguous and badly shaped inputs give what the op-by-op path gives (or a refusal)."""
    from pathlib import Path

    from delegate import CompileOptions, ExecutionError, read_model
    from delegate.partition import make_partition
    from delegate.plugins import default_manager
    g = read_model(Path(__file__).parents[1] / "fixtures/converter/mobilenet_v2_035_96_fp32.tflite").main
    compiled = default_manager().backend_info("cpu").factory({"engine": "numpy"}).compile(
        make_partition(g, g.ops, "cpu", 0), CompileOptions())
    (x_tensor,), (y_tensor,) = g.inputs, g.outputs
    assert len(compiled.batched) == 1 and compiled.batched[0][2] == [x_tensor.index]
    rng = np.random.default_rng(3)
    wide = rng.standard_normal((*x_tensor.shape[:3], 2 * x_tensor.shape[3])).astype(np.float32)
    for x in (rng.standard_normal(x_tensor.shape).astype(np.float32), wide[..., ::2], wide[..., 1::2]):
        batched = compiled.run({x_tensor.index: x})[y_tensor.index].copy()
        compiled.set_profiling(True)  # the steps one by one, each binding its arrays itself
        stepped = compiled.run({x_tensor.index: x})[y_tensor.index].copy()
        compiled.set_profiling(False)
        np.testing.assert_array_equal(batched, stepped)
    assert not np.array_equal(compiled.run({x_tensor.index: wide[..., ::2]})[y_tensor.index], batched)
    with pytest.raises(ExecutionError, match="input"):
        compiled.run({x_tensor.index: np.zeros((1, 8, 8, 3), np.float32)})
    with pytest.raises(ExecutionError, match="input"):
        compiled.run({x_tensor.index: np.zeros(x_tensor.shape, np.float64)})


def test_a_dropped_session_leaves_no_prepared_call_behind():
    """A prepared call passes its own address, not a ctypes.byref kept on itself: that reference cycle runs
    through an object the garbage collector cannot see into, and every call, with the packed weights and
    tables it keeps, outlived its session (1.4 MB a load of an int8 MobileNet)."""
    import ctypes
    import gc

    import delegate
    from delegate.inputs import make_inputs

    def calls() -> int:
        gc.collect()
        return sum(isinstance(o, ctypes.Structure) and hasattr(o, "symbol") for o in gc.get_objects())

    model = "tests/fixtures/converter/mobilenet_v2_035_96_int8.tflite"
    before = calls()
    for _ in range(3):
        session = delegate.load(model, backends=["cpu"], **{"cpu.engine": "numpy"})
        session.run(make_inputs(session.graph, None))
        loaded = calls()
        session.close()
        del session
    assert loaded > before  # the model did prepare native calls
    assert calls() <= before
