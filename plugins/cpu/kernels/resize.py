"""Image resizing: RESIZE_BILINEAR (separable: rows, then columns) and RESIZE_NEAREST_NEIGHBOR.

Source indices and weights per output row/column are computed once, in
float32 like TFLite, so that boundary cases round the same way.
"""

from __future__ import annotations

import numpy as np

from delegate.plugin_api import Op

from ..registry import kernel
from .common import along_rows, scratch
from .native import PER_THREAD_ITEMS, ResizeCall, float_loops, prepared_run, team_for


def _scale(in_size: int, out_size: int, align_corners: bool) -> np.float32:
    if align_corners and out_size > 1:
        return np.float32(in_size - 1) / np.float32(out_size - 1)
    return np.float32(in_size) / np.float32(out_size)


def bilinear_taps(in_size: int, out_size: int, align_corners: bool, half_pixel: bool):
    """(lower index, upper index, weight of the upper one) for every output position."""
    scale = _scale(in_size, out_size, align_corners)
    pos = np.arange(out_size, dtype=np.float32)
    src = (pos + np.float32(0.5)) * scale - np.float32(0.5) if half_pixel else pos * scale
    low = np.maximum(np.floor(src).astype(np.int64), 0)
    high = np.minimum(np.ceil(src).astype(np.int64), in_size - 1)
    return low, high, (src - low).astype(np.float32)


def nearest_index(in_size: int, out_size: int, align_corners: bool, half_pixel: bool) -> np.ndarray:
    scale = _scale(in_size, out_size, align_corners)
    pos = np.arange(out_size, dtype=np.float32) + np.float32(0.5 if half_pixel else 0.0)
    src = pos * scale
    # align_corners rounds half away from zero (all values here are >= 0).
    idx = np.floor(src + np.float32(0.5)) if align_corners else np.floor(src)
    idx = np.minimum(idx.astype(np.int64), in_size - 1)
    return np.maximum(idx, 0) if half_pixel else idx


def _flags(op: Op) -> tuple[bool, bool]:
    return bool(op.options.get("align_corners")), bool(op.options.get("half_pixel_centers"))


def _lerp(src, low, high, weight, axis, lo_buf, hi_buf):
    """src[low] + (src[high] - src[low]) * weight along ``axis``, computed in ``lo_buf``."""
    np.take(src, low, axis=axis, out=lo_buf)
    np.take(src, high, axis=axis, out=hi_buf)
    hi_buf -= lo_buf
    hi_buf *= weight
    lo_buf += hi_buf
    return lo_buf


@kernel("RESIZE_BILINEAR")
def resize_bilinear(op: Op):
    n, h, w, c = op.inputs[0].shape
    _, oh, ow, _ = op.outputs[0].shape
    flags = _flags(op)
    y0, y1, wy = bilinear_taps(h, oh, *flags)
    x0, x1, wx = bilinear_taps(w, ow, *flags)
    wy = wy.reshape(1, oh, 1, 1)
    wx = along_rows(wx[:, None], (ow, c))  # per-column weights repeated over channels: long inner loops
    doubles = flags == (False, True) and (oh, ow) == (2 * h, 2 * w) and h > 1 and w > 1
    # One native call (its tables built here) beats numpy's passes at any size.
    loops, team = float_loops(op), team_for(n * oh * ow * c, PER_THREAD_ITEMS)
    if loops is not None:
        return prepared_run(loops, ResizeCall((n, h, w, c), (y0, y1, wy.ravel()), bilinear_taps(w, ow, *flags), team))

    def run(ins, outs):
        # Columns first: the channel-strided gathers then run over the input's rows, not the output's.
        cols = scratch(0, (n, h, ow, c))
        if doubles:
            _double(ins[0], 2, cols)
            _double(cols, 1, outs[0])
            return
        cols = _lerp(ins[0], x0, x1, wx, 2, cols, scratch(1, (n, h, ow, c)))
        _lerp(cols, y0, y1, wy, 1, outs[0], scratch(1, (n, oh, ow, c)))
    return run


def _double(src: np.ndarray, axis: int, out: np.ndarray) -> None:
    """Doubling with half-pixel centres along ``axis``: output 2i+1 is 3/4 of input i plus 1/4 of input
    i+1, output 2i 3/4 of input i plus 1/4 of input i-1, and the two ends copy the end inputs.
    Views of the input replace the generic gathers."""
    def part(array, start, stop, step=1):
        index = [slice(None)] * array.ndim
        index[axis] = slice(start, stop, step)
        return array[tuple(index)]

    three = np.multiply(src, np.float32(0.75), out=scratch(2, src.shape))
    quarter = np.multiply(src, np.float32(0.25), out=scratch(3, src.shape))
    even, odd = part(out, 0, None, 2), part(out, 1, None, 2)
    np.add(part(three, 1, None), part(quarter, 0, -1), out=part(even, 1, None))
    np.add(part(three, 0, -1), part(quarter, 1, None), out=part(odd, 0, -1))
    np.copyto(part(even, 0, 1), part(src, 0, 1))
    np.copyto(part(odd, -1, None), part(src, -1, None))


@kernel("RESIZE_NEAREST_NEIGHBOR")
def resize_nearest_neighbor(op: Op):
    _, h, w, _ = op.inputs[0].shape
    _, oh, ow, _ = op.outputs[0].shape
    rows = nearest_index(h, oh, *_flags(op))
    cols = nearest_index(w, ow, *_flags(op))

    def run(ins, outs):
        np.copyto(outs[0], ins[0][:, rows][:, :, cols])
    return run
