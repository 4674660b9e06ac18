"""Spectral kernels: RFFT2D (float32 to complex64) and the complex parts, COMPLEX_ABS, REAL, IMAG."""

from __future__ import annotations

import numpy as np

from delegate.plugin_api import Op

from ..registry import kernel


@kernel("RFFT2D")
def rfft2d(op: Op):
    """The real 2-D FFT of the two innermost dimensions, cropped or zero-padded to fft_length; in
    double precision, as LiteRT's kernel computes it, then rounded to complex64.  A single column
    is refused: LiteRT's real transform needs two and returns garbage for one."""
    t = op.inputs[1]
    if t.data is None:
        raise ValueError("RFFT2D needs a constant fft_length")
    size = tuple(int(v) for v in np.asarray(t.data).ravel())
    if len(size) != 2 or min(size) < 1 or any(v & (v - 1) for v in size):
        raise ValueError(f"fft_length {list(size)} must be two powers of two")
    if size[1] < 2:
        raise ValueError(f"fft_length {list(size)}: the real transform needs at least 2 columns")

    def run(ins, outs):
        np.copyto(outs[0], np.fft.rfft2(np.asarray(ins[0], np.float64), s=size), casting="same_kind")
    return run


_PARTS = {"COMPLEX_ABS": np.abs, "REAL": np.real, "IMAG": np.imag}


@kernel(*_PARTS)
def complex_part(op: Op):
    fn = _PARTS[op.opcode]

    def run(ins, outs):
        np.copyto(outs[0], fn(ins[0]), casting="same_kind")
    return run
