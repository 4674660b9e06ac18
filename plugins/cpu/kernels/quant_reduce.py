"""Quantized windowed and reducing kernels: pooling, MEAN, SUM, REDUCE_PROD and RESIZE_BILINEAR.

LiteRT runs these through several different arithmetic paths (integer
averaging, fixed-point rescaling, float32 rescaling, 10-bit fixed-point
interpolation); each kernel here picks the same path under the same conditions.
"""

from __future__ import annotations

import numpy as np

from delegate.plugin_api import Op

from ..registry import kernel
from .common import Padded, contiguous_layout, normalize_axes, same_padding, window_view
from .native import PER_THREAD_ITEMS, Geometry, QMeanCall, QPoolCall, QStage, kernel_loops, prepared_run, team_for
from .quant_util import (
    activation_bounds, lane_rounding, multiply_by_quantized_multiplier, multiply_wide, qrange, quantize_multiplier,
    round_half_away, scale, store, trunc_div, vector_lanes, zero_point)


def _pool_pads(op: Op) -> tuple[int, int, int, int]:
    o = op.options
    shape, out_hw = op.inputs[0].shape, op.outputs[0].shape[1:3]
    if o.get("padding", "SAME") != "SAME":
        return 0, 0, 0, 0
    return (same_padding(shape[1], o["filter_height"], o["stride_h"], 1, out_hw[0])
            + same_padding(shape[2], o["filter_width"], o["stride_w"], 1, out_hw[1]))


def _pool_windows(op: Op, fill: int, dtype):
    """A function giving the (N, OH, OW, KH, KW, C) pooling windows of an input padded with ``fill``."""
    o = op.options
    kernel_hw, stride = (o["filter_height"], o["filter_width"]), (o["stride_h"], o["stride_w"])
    pad = Padded(op.inputs[0].shape, _pool_pads(op), fill, dtype)
    return lambda values: window_view(pad(values), op.outputs[0].shape[1:3], kernel_hw, stride)


def _native_pool(op: Op, average: bool):
    """run() of an int8 pool in native.c's qpool; None where the native loops do not serve."""
    x, out = op.inputs[0], op.outputs[0]
    loops = kernel_loops() if x.dtype.numpy == out.dtype.numpy == np.int8 else None
    if loops is None:
        return None
    where = Geometry.of(op, contiguous_layout(x.shape), contiguous_layout(out.shape), _pool_pads(op))
    return prepared_run(loops, QPoolCall(where, average, activation_bounds(op),
                                         team_for(int(np.prod(out.shape)), PER_THREAD_ITEMS)))


@kernel("AVERAGE_POOL_2D", quantized=True)
def average_pool(op: Op):
    """Raw values summed over the in-bounds part of each window, divided with rounding half away from 0."""
    native = _native_pool(op, True)
    if native is not None:
        return native
    windows = _pool_windows(op, 0, np.int64)
    inside = np.ones(op.inputs[0].shape, np.int64)
    counts = windows(inside).sum(axis=(3, 4))
    half = counts // 2
    bounds = activation_bounds(op)

    def run(ins, outs):
        acc = windows(ins[0]).sum(axis=(3, 4), dtype=np.int64)
        store(outs[0], trunc_div(np.where(acc > 0, acc + half, acc - half), counts), *bounds)
    return run


@kernel("MAX_POOL_2D", quantized=True)
def max_pool(op: Op):
    native = _native_pool(op, False)
    if native is not None:
        return native
    src = op.inputs[0]
    windows = _pool_windows(op, qrange(src)[0], src.dtype.numpy)
    bounds = activation_bounds(op)

    def run(ins, outs):
        store(outs[0], windows(ins[0]).max(axis=(3, 4)), *bounds)
    return run


def _reduction(op: Op):
    """(axes, number of reduced elements, summing function) of a MEAN/SUM op."""
    src = op.inputs[0]
    axes = normalize_axes(np.asarray(op.inputs[1].data), len(src.shape))
    count = int(np.prod([src.shape[a] for a in axes], dtype=np.int64))
    out_shape = op.outputs[0].shape

    def total(x):
        return x.astype(np.int64).sum(axis=axes).reshape(out_shape)
    return axes, count, total


@kernel("MEAN", quantized=True)
def mean(op: Op):
    src, dst = op.inputs[0], op.outputs[0]
    axes, count, total = _reduction(op)
    bounds = qrange(dst)
    in_offset, out_offset = zero_point(src), zero_point(dst)
    spatial = (src.dtype.numpy in (np.int8, np.uint8) and len(src.shape) == 4 and axes == (1, 2)
               and op.options.get("keep_dims", False))
    pixels = len(src.shape) == 4 and axes == (1, 2)
    loops = kernel_loops() if pixels and src.dtype.numpy == dst.dtype.numpy == np.int8 else None
    channels = src.shape[-1]
    if spatial:
        # LiteRT's dedicated HxW path: float32 parameters, the input zero point folded into a bias.
        shift_back = np.float32(in_offset) * scale(src) / scale(dst)
        bias = out_offset - int(shift_back + np.float32(0.5) if shift_back > 0 else shift_back - np.float32(0.5))
        multiplier, shift = quantize_multiplier(scale(src) / (np.float32(count) * scale(dst)))
        vector = vector_lanes(channels, 16)  # vectorised over 16 channels at a time
        if loops is not None:
            stage = QStage(multiplier, shift, np.zeros(channels, np.int64), ~vector, bias, bounds)
            return prepared_run(loops, QMeanCall(src.shape, stage))
        rescale = lane_rounding(vector)

        def run_spatial(ins, outs):
            store(outs[0], rescale(total(ins[0]), multiplier, shift) + bias, *bounds)
        return run_spatial
    # Generic path: 1/count folded into the fixed-point multiplier, keeping as many bits as fit.
    multiplier, shift = quantize_multiplier(np.float64(scale(src)) / np.float64(scale(dst)))
    extra = min(count.bit_length() - 1, 32, 31 + int(shift))
    multiplier = (int(multiplier) << extra) // count
    shift = shift - extra
    if loops is not None:
        stage = QStage(multiplier, shift, np.full(channels, -in_offset * count, np.int64), True, out_offset, bounds)
        return prepared_run(loops, QMeanCall(src.shape, stage))

    def run(ins, outs):
        centred = total(ins[0]) - in_offset * count
        store(outs[0], multiply_by_quantized_multiplier(centred, multiplier, shift) + out_offset, *bounds)
    return run


@kernel("SUM", quantized=True)
def reduce_sum(op: Op):
    """LiteRT rescales quantized sums in float32."""
    src, dst = op.inputs[0], op.outputs[0]
    _, count, total = _reduction(op)
    factor = scale(src) / scale(dst)
    bias = np.float32(-zero_point(src)) * factor * np.float32(count)
    out_offset, bounds = zero_point(dst), qrange(dst)

    def run(ins, outs):
        rescaled = total(ins[0]).astype(np.float32) * factor + bias
        store(outs[0], round_half_away(rescaled).astype(np.int64) + out_offset, *bounds)
    return run


def _source_positions(op: Op, axis: int):
    """Per output row/column: LiteRT's (in_size, out_size, align_corners, half_pixel_centers)."""
    return (op.inputs[0].shape[axis], op.outputs[0].shape[axis],
            bool(op.options.get("align_corners", False)), bool(op.options.get("half_pixel_centers", False)))


def _fixed_point_axis(in_size: int, out_size: int, align: bool, half: bool):
    """Source positions in 1/1024 units with the two neighbours (the int8/int16 kernel)."""
    if align and out_size > 1:
        step = ((1 << 10) * (in_size - 1) + (out_size - 1) // 2) // (out_size - 1)
    else:
        step = ((1 << 10) * in_size + out_size // 2) // out_size
    pos = np.arange(out_size, dtype=np.int64) * step
    if half:
        pos = pos + step // 2 - (1 << 9)
    low = np.maximum(trunc_div(pos, np.int64(1 << 10)), 0)
    high = np.minimum(trunc_div(pos + (1 << 10) - 1, np.int64(1 << 10)), in_size - 1)
    frac = pos - (low << 10)
    return low, high, (1 << 10) - frac, frac


def _float_axis(in_size: int, out_size: int, align: bool, half: bool):
    """Source positions as float32 fractions with the two neighbours (the uint8 kernel)."""
    if align and out_size > 1:
        step = np.float32(in_size - 1) / np.float32(out_size - 1)
    else:
        step = np.float32(in_size) / np.float32(out_size)
    index = np.arange(out_size, dtype=np.float32)
    pos = (index + np.float32(0.5)) * step - np.float32(0.5) if half else index * step
    low = np.maximum(np.floor(pos), 0).astype(np.int64)
    high = np.minimum(np.ceil(pos).astype(np.int64), in_size - 1)
    frac = pos - low.astype(np.float32)
    return low, high, np.float32(1) - frac, frac


@kernel("RESIZE_BILINEAR", quantized=True)
def resize_bilinear(op: Op):
    """int8/int16 interpolate in 10-bit fixed point; uint8 in float32 with +0.5 truncation."""
    integer = op.inputs[0].dtype.numpy != np.uint8
    axis_fn = _fixed_point_axis if integer else _float_axis
    y0, y1, wy0, wy1 = axis_fn(*_source_positions(op, 1))
    x0, x1, wx0, wx1 = axis_fn(*_source_positions(op, 2))
    # Weights broadcast over (N, OH, OW, C): rows along OH, columns along OW.
    wy0, wy1 = wy0[:, None, None], wy1[:, None, None]
    wx0, wx1 = wx0[:, None], wx1[:, None]

    def run(ins, outs):
        x = ins[0].astype(np.int64 if integer else np.float32)
        corners = [x[:, ys][:, :, xs] for ys, xs in ((y0, x0), (y0, x1), (y1, x0), (y1, x1))]
        weights = (wy0 * wx0, wy0 * wx1, wy1 * wx0, wy1 * wx1)
        if integer:
            acc = sum(c * w for c, w in zip(corners, weights))
            half = np.where(acc > 0, 1 << 19, -(1 << 19))
            np.copyto(outs[0], trunc_div(acc + half, np.int64(1 << 20)), casting="unsafe")
        else:
            acc = corners[0] * weights[0]
            for c, w in zip(corners[1:], weights[1:]):
                acc = acc + c * w
            np.copyto(outs[0], acc + np.float32(0.5), casting="unsafe")
    return run


@kernel("REDUCE_PROD", quantized=True)
def reduce_prod(op: Op):
    """LiteRT's product of n offset values: each step's product, and the result once more, rescaled
    by s_in / s_out**(1/n) with the 64-bit multiplier (so the running product stays in range),
    the values of each output taken in the input's order; a step that leaves the int32 range wraps,
    as LiteRT's cast does."""
    src, dst = op.inputs[0], op.outputs[0]
    axes, count, _ = _reduction(op)
    order = [a for a in range(len(src.shape)) if a not in axes] + list(axes)
    multiplier, shift = quantize_multiplier(np.float64(scale(src)) / np.float64(scale(dst)) ** (1.0 / max(count, 1)))
    in_offset, out_offset, bounds = zero_point(src), zero_point(dst), qrange(dst)

    def run(ins, outs):
        values = ins[0].transpose(order).reshape(-1, count).astype(np.int64) - in_offset
        acc = values[:, 0]
        for k in range(1, count):
            acc = multiply_wide(acc * values[:, k], multiplier, shift)
        store(outs[0], (multiply_wide(acc, multiplier, shift) + out_offset).reshape(dst.shape), *bounds)
    return run
