"""RFFT2D (complex64 results) and COMPLEX_ABS / REAL / IMAG against LiteRT's builtin kernels."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from delegate.errors import CompileError
from delegate.tflite.builder import GraphBuilder
from tests.oputil import check_against_litert, delegate_run, litert_run


def spectrum_model(shape, fft_length) -> bytes:
    """RFFT2D of ``shape`` with its magnitude, real and imaginary parts; all four are outputs."""
    b = GraphBuilder()
    x = b.input("x", shape)
    spectrum = b.op("RFFT2D", [x, b.const("fft_length", np.array(fft_length, np.int32))], dtype="complex64")
    b.output(*(b.op(op, [spectrum], dtype="float32") for op in ("COMPLEX_ABS", "REAL", "IMAG")), spectrum)
    return b.to_bytes()


powers = st.sampled_from([1, 2, 4, 8, 16])


@given(batch=st.sampled_from([(), (1,), (2, 3)]), rows=st.integers(1, 12), columns=st.integers(1, 20),
       fft_rows=powers, fft_columns=powers.filter(lambda v: v > 1), seed=st.integers(0, 2**16))
def test_rfft2d(batch, rows, columns, fft_rows, fft_columns, seed):
    """Inputs larger than fft_length are cropped, smaller ones zero-padded."""
    shape = (*batch, rows, columns)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    check_against_litert(spectrum_model(shape, (fft_rows, fft_columns)), [x], builtin=True, rtol=1e-6, atol=1e-6)


def test_fft_length_not_a_power_of_two_is_refused():
    model = spectrum_model((4, 6), (4, 6))
    with pytest.raises(RuntimeError):
        litert_run(model, [np.zeros((4, 6), np.float32)], builtin=True)
    with pytest.raises(CompileError, match="powers of two"):
        delegate_run(model, [np.zeros((4, 6), np.float32)])


def test_single_column_is_refused():
    """LiteRT runs it but its result is not the transform; refusing beats a wrong answer."""
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    model = spectrum_model((3, 5), (2, 1))
    assert not np.allclose(litert_run(model, [x], builtin=True)[3], np.fft.rfft2(x, s=(2, 1)))
    with pytest.raises(CompileError, match="at least 2 columns"):
        delegate_run(model, [x])
