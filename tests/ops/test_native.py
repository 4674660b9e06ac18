"""The CPU kernels' native loops: built with the machine's compiler, exact against numpy on awkward
layouts and widths, and absent (the numpy formulations run) when they cannot be built."""

import shutil

import numpy as np
import pytest

from delegate_cpu.kernels import native

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                    reason="no C compiler on this machine")


@pytest.fixture(scope="module")
def loops():
    built = native.native_loops()
    assert built is not None, "a C compiler is installed but the native loops did not build"
    return built


@needs_compiler
@pytest.mark.parametrize("taps, rows, width", [(9, 5, 96 * 7), (25, 3, 64 * 3 + 16 + 5), (1, 4, 3), (4, 2, 17)])
def test_tap_sum_matches_numpy(loops, taps, rows, width):
    rng = np.random.default_rng(0)
    src = rng.standard_normal(rows * width * 4 + 1000).astype(np.float32)
    starts = np.arange(rows, dtype=np.int64) * (width + 7)
    offsets = rng.integers(0, 300, taps).astype(np.int64)
    filt = rng.standard_normal((taps, width)).astype(np.float32)
    out = np.full((rows, width + 3), np.nan, np.float32)[:, :width]  # rows further apart than their width
    loops.tap_sum(src, starts, offsets, filt, out, threads=2)
    expected = np.zeros((rows, width))
    for r in range(rows):
        for t in range(taps):
            start = starts[r] + offsets[t]
            expected[r] += src[start:start + width].astype(np.float64) * filt[t]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


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


def test_no_compiler_leaves_the_numpy_kernels(monkeypatch):
    monkeypatch.setattr(native, "_compiler", lambda: None)
    assert native._load() is None


def test_failing_compiler_leaves_the_numpy_kernels(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_compiler", lambda: ["false"])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert native._load() is None
    assert not list(tmp_path.rglob("*.so"))
