"""Dynamic-range ("hybrid") kernels: float activations, int8 weights, computed as LiteRT computes them.

LiteRT does not dequantize such weights.  At run time it quantizes the float
input to int8, per batch row (FULLY_CONNECTED, BATCH_MATMUL: each row of the
depth; convolutions: each image), symmetrically or, where the op asks for it or
the kernel always does, asymmetrically with a zero point; it sums integer
products exactly, takes the input's zero point out through the weights' row sums,
and scales the integer sum back in float32 before adding the float bias.  Using
the dequantized weights instead differs by the input's rounding, over 1% of the
output range on real models.  Integer sums here are float64 products of integers,
exact at every depth these ops have.
"""

from __future__ import annotations

import math

import numpy as np

from delegate.plugin_api import Op, Tensor

from ..registry import kernel
from .common import CLAMPS, fused, fused_name, window_view
from .native import PER_THREAD_MACS, HybridFcCall, kernel_loops, team_for
from .conv import conv_pads
from .quant_util import round_half_away


def quantize_rows(rows: np.ndarray, asymmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values less their zero point as float64, float32 scale, zero point) per row of a 2-D float32 array.

    Symmetric: scale max|x| / 127, values in [-127, 127].  Asymmetric: the range
    [min(x, 0), max(x, 0)] over 255 steps (in double), the zero point nudged onto
    the grid from whichever end errs less.  A row of zeros gets scale 1.
    """
    low = np.minimum(rows.min(axis=1, initial=0), 0).astype(np.float32)
    high = np.maximum(rows.max(axis=1, initial=0), 0).astype(np.float32)
    empty = low == high
    if not asymmetric:
        reach = np.maximum(-low, high)
        step = np.where(empty, np.float32(1), reach / np.float32(127)).astype(np.float32)
        inverse = np.where(empty, np.float32(0), np.float32(127) / np.where(empty, np.float32(1), reach))
        q = np.clip(round_half_away(rows * inverse.astype(np.float32)[:, None]), -127, 127)
        return q.astype(np.float64), step, np.zeros(len(rows), np.int64)
    lo, hi = low.astype(np.float64), high.astype(np.float64)
    step64 = np.where(empty, 1.0, (hi - lo) / 255.0)
    from_min, from_max = -128 - lo / step64, 127 - hi / step64
    nearer_min = 128 + np.abs(lo / step64) < 127 + np.abs(hi / step64)
    zero = np.where(nearer_min, from_min, from_max)
    zero = np.where(zero <= -128, -128, np.where(zero >= 127, 127, round_half_away(zero))).astype(np.int64)
    zero = np.where(empty, 0, zero)
    step = np.where(empty, np.float32(1), step64.astype(np.float32)).astype(np.float32)
    inverse = (np.float32(1) / step).astype(np.float32)
    shifted = (zero.astype(np.float32)[:, None] + rows * inverse[:, None]).astype(np.float32)
    q = np.clip(round_half_away(shifted), -128, 127)
    q = np.where(empty[:, None], 0, q)
    return q.astype(np.float64) - zero[:, None], step, zero


def _weight_scales(w: Tensor, channels: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(w.quantization.scale, np.float32), (channels,))


def _bias(op: Op, index: int) -> np.ndarray | None:
    t = op.input(index)
    return None if t is None else np.asarray(t.data, np.float32).reshape(-1)


def _finish(acc: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, act, out: np.ndarray) -> None:
    """out = bias + float32(acc) * scale in float32, then the fused activation."""
    value = acc.astype(np.float32) * scale
    if bias is not None:
        value += bias
    np.copyto(out, value.reshape(out.shape))
    act(out)


@kernel("FULLY_CONNECTED", hybrid=True)
def fully_connected(op: Op):
    """Per row of the depth: quantized as the op's ``asymmetric_quantize_inputs`` says, scale
    row scale x weight scale (per unit where the weights are per channel)."""
    w = op.inputs[1]
    units, depth = w.shape
    weights = np.asarray(w.data, np.float64)
    scales = _weight_scales(w, units)
    asymmetric, bias, act = bool(op.options.get("asymmetric_quantize_inputs")), _bias(op, 2), fused(op)

    def numpy_run(ins, outs):
        q, step, _ = quantize_rows(np.asarray(ins[0], np.float32).reshape(-1, depth), asymmetric)
        _finish(q @ weights.T, step[:, None] * scales[None, :], bias, act, outs[0])
    loops, rows = kernel_loops(), math.prod(op.outputs[0].shape) // max(units, 1)
    if loops is None or fused_name(op) not in ("NONE", *CLAMPS) or op.inputs[0].dtype.numpy != np.float32 \
            or not 1 <= depth <= HybridFcCall.MOST_DEPTH or rows < 1 or units < 1:
        return numpy_run
    call = HybridFcCall(np.asarray(w.data, np.int8), scales, bias, rows, asymmetric,
                        CLAMPS.get(fused_name(op), (-np.inf, np.inf)), team_for(rows * units * depth, PER_THREAD_MACS))

    def run(ins, outs):
        """The native loops' pass, or numpy's formulation for inputs holding a value that is not finite."""
        if not loops.finite_only(call, np.ascontiguousarray(ins[0], np.float32), outs[0]):
            numpy_run(ins, outs)
    return run


@kernel("BATCH_MATMUL", hybrid=True)
def batch_matmul(op: Op):
    """As FULLY_CONNECTED, the lhs quantized per row of its depth against constant int8 rhs."""
    adj_x, adj_y = bool(op.options.get("adj_x")), bool(op.options.get("adj_y"))
    rhs = np.asarray(op.inputs[1].data, np.float64)
    rhs = np.swapaxes(rhs, -1, -2) if adj_y else rhs
    w_scale = np.float32(op.inputs[1].quantization.scale[0])
    asymmetric = bool(op.options.get("asymmetric_quantize_inputs"))

    def run(ins, outs):
        a = np.asarray(ins[0], np.float32)
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2)) if adj_x else a
        q, step, _ = quantize_rows(a.reshape(-1, a.shape[-1]), asymmetric)
        acc = np.matmul(q.reshape(a.shape), rhs)
        scale = (step * w_scale).reshape(a.shape[:-1] + (1,))
        np.copyto(outs[0], acc.astype(np.float32) * np.broadcast_to(scale, acc.shape[:-1] + (1,)))
    return run


def _padded_images(op: Op, x: np.ndarray, asymmetric: bool, kernel_hw) -> tuple[np.ndarray, np.ndarray]:
    """(each image quantized, less its zero point, zero-padded as the op pads; its float32 scale)."""
    n, h, w, c = x.shape
    out_hw = op.outputs[0].shape[1:3]
    top, bottom, left, right = conv_pads(op, (h, w), kernel_hw, out_hw)
    q, step, _ = quantize_rows(np.asarray(x, np.float32).reshape(n, -1), asymmetric)
    return np.pad(q.reshape(x.shape), ((0, 0), (top, bottom), (left, right), (0, 0))), step


def _windows(op: Op, padded: np.ndarray, kernel_hw) -> np.ndarray:
    o = op.options
    return window_view(np.ascontiguousarray(padded), op.outputs[0].shape[1:3], kernel_hw,
                       (o.get("stride_h", 1), o.get("stride_w", 1)),
                       (o.get("dilation_h_factor", 1), o.get("dilation_w_factor", 1)))


def _per_channel(w: Tensor) -> bool:
    """LiteRT takes the per-channel (asymmetric) path only when the channels' scales differ."""
    s = np.asarray(w.quantization.scale)
    return s.size > 1 and bool(np.any(s != s[0]))


@kernel("CONV_2D", hybrid=True)
def conv_2d(op: Op):
    """Per image: symmetric with the weights' one scale folded into the image's, or, with scales
    differing per channel, asymmetric, the integer sum times the channel's scale, then the image's."""
    w = op.inputs[1]
    out_c, kh, kw, in_c = w.shape
    matrix = np.asarray(w.data, np.float64).reshape(out_c, -1).T
    per_channel = _per_channel(w)
    scales = _weight_scales(w, out_c)
    bias, act = _bias(op, 2), fused(op)

    def run(ins, outs):
        padded, step = _padded_images(op, ins[0], per_channel, (kh, kw))
        windows = _windows(op, padded, (kh, kw))
        acc = windows.reshape(windows.shape[:3] + (-1,)) @ matrix
        if per_channel:
            scaled = (acc.astype(np.float32) * scales) * step[:, None, None, None]
            _finish(scaled, np.float32(1), bias, act, outs[0])
        else:
            _finish(acc, (step * scales[0])[:, None, None, None], bias, act, outs[0])
    return run


@kernel("DEPTHWISE_CONV_2D", hybrid=True)
def depthwise_conv_2d(op: Op):
    """Per image, asymmetric; each channel's sum times its weight scale, then the image's scale."""
    w = op.inputs[1]
    _, kh, kw, out_c = w.shape
    in_c = op.inputs[0].shape[3]
    multiplier = out_c // in_c
    weights = np.asarray(w.data, np.float64).reshape(kh, kw, in_c, multiplier)
    scales = _weight_scales(w, out_c)
    bias, act = _bias(op, 2), fused(op)

    def run(ins, outs):
        padded, step = _padded_images(op, ins[0], True, (kh, kw))
        windows = _windows(op, padded, (kh, kw))
        acc = np.einsum("nyxijc,ijcm->nyxcm", windows, weights).reshape(windows.shape[:3] + (out_c,))
        scaled = (acc.astype(np.float32) * scales) * step[:, None, None, None]
        _finish(scaled, np.float32(1), bias, act, outs[0])
    return run

