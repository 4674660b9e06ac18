"""2-D pooling kernels (MAX_POOL_2D, AVERAGE_POOL_2D, L2_POOL_2D, and MediaPipe's MaxPoolingWithArgmax2D and
MaxUnpooling2D).

Pooling windows are separable: reducing along W, then along H, costs
KW + KH passes instead of KH * KW.  Tiling windows (stride == filter, no
padding, the common 2x2/2 and global pools) reduce a reshaped view at once.
"""

from __future__ import annotations

import math

import numpy as np

from delegate.plugin_api import Op, max_unpooling_geometry, mediapipe_pool_params, pool_argmax_geometry

from ..registry import kernel
from .common import CLAMPS, Padded, contiguous_layout, fused, fused_name, same_padding, scratch
from .native import PER_THREAD_ITEMS, Epilogue, Geometry, MeanCall, PoolCall, float_loops, prepared_run, team_for

# opcode -> (reduce ufunc, padding fill, average over the valid window, square first / sqrt after)
_POOLS = {"MAX_POOL_2D": (np.maximum, -np.inf, False, False),
          "AVERAGE_POOL_2D": (np.add, 0.0, True, False),
          "L2_POOL_2D": (np.add, 0.0, True, True)}


def _valid_counts(size: int, out: int, kernel: int, stride: int, before: int) -> np.ndarray:
    """How many input positions each output window covers along one axis (padding excluded)."""
    start = np.arange(out) * stride - before
    return np.minimum(start + kernel, size) - np.maximum(start, 0)


@kernel(*_POOLS)
def pool_2d(op: Op):
    reduce, fill, average, l2 = _POOLS[op.opcode]
    n, h, w, c = op.inputs[0].shape
    _, oh, ow, _ = op.outputs[0].shape
    o = op.options
    kh, kw, sh, sw = o["filter_height"], o["filter_width"], o["stride_h"], o["stride_w"]
    pads = (0, 0, 0, 0)
    if o.get("padding", "SAME") == "SAME":
        pads = same_padding(h, kh, sh, 1, oh) + same_padding(w, kw, sw, 1, ow)
    native = _native_pool(op, pads)
    if native is not None:
        return native
    pad = Padded((n, h, w, c), pads, fill)
    act = fused(op)
    tiled = (kh, kw) == (sh, sw) and not pad.any
    divisor = None
    if average:
        counts = _valid_counts(h, oh, kh, sh, pads[0])[:, None] * _valid_counts(w, ow, kw, sw, pads[2])[None, :]
        divisor = np.ascontiguousarray(np.broadcast_to(counts[:, :, None], (oh, ow, c)), np.float32)
    rows_shape = (n, oh, w * c) if tiled else (n, h + pads[0] + pads[1], ow, c)

    def run(ins, outs):
        x, out = ins[0], outs[0]
        rows = scratch(0, rows_shape)
        if l2:
            x = np.square(x, out=scratch(1, x.shape))
        if tiled:
            # Whole windows: reduce each band of kh rows, then each run of kw columns.
            _reduce_axis(reduce, x[:, :oh * kh].reshape(n, oh, kh, w * c), 2, rows)
            _reduce_axis(reduce, rows[:, :, :ow * kw * c].reshape(n, oh, ow, kw, c), 3, out)
        else:
            xp = pad(x)
            np.copyto(rows, xp[:, :, 0:sw * (ow - 1) + 1:sw, :])
            for kx in range(1, kw):
                reduce(rows, xp[:, :, kx:kx + sw * (ow - 1) + 1:sw, :], out=rows)
            np.copyto(out, rows[:, 0:sh * (oh - 1) + 1:sh])
            for ky in range(1, kh):
                reduce(out, rows[:, ky:ky + sh * (oh - 1) + 1:sh], out=out)
        if divisor is not None:
            out /= divisor
        if l2:
            np.sqrt(out, out=out)
        act(out)
    return run


def _native_pool(op: Op, pads: tuple[int, int, int, int]):
    """A float MAX_POOL_2D or AVERAGE_POOL_2D (with a clamp or no fused activation) in the native loops,
    on all the kernel's threads; None where those do not serve."""
    activation = fused_name(op)
    shape = op.outputs[0].shape
    loops = float_loops(op)
    if loops is None or op.opcode == "L2_POOL_2D" or not (activation == "NONE" or activation in CLAMPS):
        return None
    team = team_for(math.prod(shape) * op.options["filter_height"] * op.options["filter_width"], PER_THREAD_ITEMS)
    where = Geometry.of(op, contiguous_layout(op.inputs[0].shape), contiguous_layout(shape), pads)
    average, finish = op.opcode == "AVERAGE_POOL_2D", Epilogue(None, CLAMPS.get(activation))
    if average and activation == "NONE" and (where.kh, where.kw) == (where.h, where.w) \
            and (where.oh, where.ow) == (1, 1):
        # one window over each whole image: its mean over the pixels
        n, h, w, c = op.inputs[0].shape
        return prepared_run(loops, MeanCall(n, h * w, c, team))
    return prepared_run(loops, PoolCall(where, average, finish, team))


def _reduce_axis(reduce, x: np.ndarray, axis: int, out: np.ndarray) -> None:
    """``reduce`` over one axis into ``out``: pairwise on slices when short, ufunc.reduce when long."""
    size = x.shape[axis]
    if size > 4:
        reduce.reduce(x, axis=axis, out=out)
        return
    part = [slice(None)] * x.ndim

    def at(i):
        part[axis] = i
        return x[tuple(part)]

    if size == 1:
        np.copyto(out, at(0))
        return
    reduce(at(0), at(1), out=out)
    for i in range(2, size):
        reduce(out, at(i), out=out)


# -- MediaPipe's pooling with indices (custom ops of its segmentation models) ---------------------


@kernel("MaxPoolingWithArgmax2D")
def max_pool_argmax(op: Op):
    """MAX_POOL_2D that also gives each maximum's place in its window, ky * filter_w + kx, as a float plus
    0.1 (so that truncating it back is exact); the first maximum in row-major window order wins, and the
    activation clamps the values only."""
    _, stride_w, stride_h, filter_w, filter_h, activation = mediapipe_pool_params(op.custom_options)
    (_, oh, ow, _), (pad_h, pad_w) = pool_argmax_geometry(op.inputs[0].shape, op.custom_options)
    clamp = CLAMPS.get(activation)

    def run(ins, outs):
        x = ins[0]
        _, h, w, _ = x.shape
        best = np.full(outs[0].shape, np.finfo(np.float32).min, np.float32)
        place = np.zeros(outs[0].shape, np.int32)
        for ky in range(filter_h):
            rows = np.arange(oh) * stride_h - pad_h + ky
            for kx in range(filter_w):
                cols = np.arange(ow) * stride_w - pad_w + kx
                inside = ((rows >= 0) & (rows < h))[:, None] & ((cols >= 0) & (cols < w))[None, :]
                taps = x[:, np.clip(rows, 0, h - 1)][:, :, np.clip(cols, 0, w - 1)]
                larger = inside[None, :, :, None] & (taps > best)
                best = np.where(larger, taps, best)
                place = np.where(larger, ky * filter_w + kx, place)
        np.copyto(outs[0], best if clamp is None else np.clip(best, *clamp))
        np.copyto(outs[1], place.astype(np.float32) + np.float32(0.1))
    return run


@kernel("MaxUnpooling2D")
def max_unpooling(op: Op):
    """Each input value written where its index (truncated, decoded as MediaPipe does with C's division)
    places it in its window; zeros elsewhere, and a later input pixel wins where windows overlap.
    Destinations outside the output are skipped."""
    _, stride_w, stride_h, filter_w, _, _ = mediapipe_pool_params(op.custom_options)
    (_, oh, ow, _), (pad_h, pad_w) = max_unpooling_geometry(op.inputs[0].shape, op.custom_options)

    def run(ins, outs):
        x, index = ins[0], np.trunc(ins[1]).astype(np.int64)
        n, h, w, c = x.shape
        dy = np.sign(index) * (np.abs(index) // filter_w)  # C's division truncates toward zero
        dx = index - dy * filter_w
        oy = (np.arange(h) * stride_h - pad_h)[None, :, None, None] + dy
        ox = (np.arange(w) * stride_w - pad_w)[None, None, :, None] + dx
        inside = ((oy >= 0) & (oy < oh) & (ox >= 0) & (ox < ow)).ravel()
        image = np.arange(n)[:, None, None, None]
        channel = np.arange(c)[None, None, None, :]
        target = (((image * oh + oy) * ow + ox) * c + channel).ravel()[inside]
        # in input order the last write to a destination stays: keep each destination's last source
        last, first_reversed = np.unique(target[::-1], return_index=True)
        sources = np.flatnonzero(inside)[::-1][first_reversed]
        flat = outs[0].reshape(-1)
        flat[:] = 0
        flat[last] = x.reshape(-1)[sources]
    return run
