"""Convolution and matrix-product kernels: CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV, FULLY_CONNECTED,
BATCH_MATMUL, and MediaPipe's Convolution2DTransposeBias.

Weights are laid out once at compile time as GEMM operands; a convolution
copies its sliding windows into a preallocated im2col buffer and runs one
BLAS matmul, a depthwise convolution accumulates one multiply per filter tap.
"""

from __future__ import annotations

import numpy as np

from delegate import Op
from delegate.shapes import transpose_conv_bias_geometry

from ..registry import kernel
from .common import Padded, along_rows, float_constant, fused, same_padding, scratch, window_view
from .parallel import chunks_for, spread


def _conv_pads(op: Op, in_hw, kernel_hw, out_hw) -> tuple[int, int, int, int]:
    o = op.options
    if o.get("padding", "SAME") != "SAME":
        return 0, 0, 0, 0
    top, bottom = same_padding(in_hw[0], kernel_hw[0], o.get("stride_h", 1), o.get("dilation_h_factor", 1),
                               out_hw[0])
    left, right = same_padding(in_hw[1], kernel_hw[1], o.get("stride_w", 1), o.get("dilation_w_factor", 1),
                               out_hw[1])
    return top, bottom, left, right


def _bias(op: Op, index: int, channels: int) -> np.ndarray | None:
    bias = float_constant(op.input(index))
    return None if bias is None else bias.reshape(channels)


def _filter_layout(w: np.ndarray, groups: int) -> np.ndarray:
    """OHWI filter -> (groups, KH*KW*I, O/groups) GEMM operands matching the im2col column order."""
    o, kh, kw, ci = w.shape
    per_group = o // groups
    return np.ascontiguousarray(w.reshape(groups, per_group, kh * kw * ci).transpose(0, 2, 1))


@kernel("CONV_2D")
def conv_2d(op: Op):
    n, h, w, c = op.inputs[0].shape
    o, kh, kw, ci = op.inputs[1].shape
    _, oh, ow, _ = op.outputs[0].shape
    opts = op.options
    stride = (opts.get("stride_h", 1), opts.get("stride_w", 1))
    dilation = (opts.get("dilation_h_factor", 1), opts.get("dilation_w_factor", 1))
    groups = c // ci
    weights = float_constant(op.inputs[1])
    gemm = None if weights is None else _filter_layout(weights, groups)
    bias = _bias(op, 2, o)
    bias = None if bias is None else along_rows(bias, op.outputs[0].shape)
    act = fused(op)
    pad = Padded((n, h, w, c), _conv_pads(op, (h, w), (kh, kw), (oh, ow)))
    pointwise = kh == kw == 1 and not pad.any
    rows = n * oh * ow

    def run(ins, outs):
        x, out = ins[0], outs[0]
        operand = gemm if gemm is not None else _filter_layout(np.asarray(ins[1], np.float32), groups)
        if pointwise:
            cols = (x[:, ::stride[0], ::stride[1], :] if stride != (1, 1) else x).reshape(rows, c)
        else:
            columns = scratch(0, (n, oh, ow, kh, kw, c))
            np.copyto(columns, window_view(pad(x), (oh, ow), (kh, kw), stride, dilation))
            cols = columns.reshape(rows, kh * kw * c)
        out2d = out.reshape(rows, o)
        if groups == 1:
            np.matmul(cols, operand[0], out=out2d)
        else:
            per_group = o // groups
            grouped = cols.reshape(rows, kh * kw, groups, ci)
            for g in range(groups):
                np.matmul(grouped[:, :, g, :].reshape(rows, kh * kw * ci), operand[g],
                          out=out2d[:, g * per_group:(g + 1) * per_group])
        if bias is not None:
            out += bias
        act(out)
    return run


def _prefer_einsum(pixels: int, channels: int, taps: int) -> bool:
    """Whether one einsum beats per-tap passes for a depthwise convolution (microseconds, measured).

    Per-tap passes cost a fixed ~6 us per numpy call plus two passes over the
    output at ~8 elements/ns; einsum loops over channels innermost, so its rate
    grows with the channel count, to about 5 multiply-adds/ns from ~150 channels on.
    """
    per_tap = taps * (6.0 + 2 * pixels * channels / 8e3)
    einsum = pixels * channels * taps / (min(5.0, channels / 30) * 1e3)
    return einsum < per_tap


@kernel("DEPTHWISE_CONV_2D")
def depthwise_conv_2d(op: Op):
    """One multiply-accumulate per filter tap over the whole output, or one einsum over all taps.

    numpy is fast only on long contiguous inner loops.  With many channels (or
    few pixels) einsum over the sliding-window view wins.  Otherwise every tap
    is arranged to read rows contiguous over (width, channels):
    the filter taps are tiled along the output width, and with strides the
    padded input is first split into stride_h * stride_w phase images (every
    stride-th row and column), in which each tap's window is a contiguous-row slice.
    """
    n, h, w, c = op.inputs[0].shape
    _, kh, kw, oc = op.inputs[1].shape
    _, oh, ow, _ = op.outputs[0].shape
    opts = op.options
    sh, sw = opts.get("stride_h", 1), opts.get("stride_w", 1)
    dh, dw = opts.get("dilation_h_factor", 1), opts.get("dilation_w_factor", 1)
    multiplier = oc // c
    weights = float_constant(op.inputs[1])
    bias = _bias(op, 2, oc)
    act = fused(op)
    top, bottom, left, right = _conv_pads(op, (h, w), (kh, kw), (oh, ow))
    hp, wp = h + top + bottom, w + left + right
    # Padding and the channel multiplier go into one buffer: input channel i fills outputs i*m .. i*m+m-1.
    buffered = multiplier > 1 or top or bottom or left or right
    buffer = np.zeros((n, hp, wp, oc), np.float32) if buffered else None
    inside = None if buffer is None else buffer[:, top:top + h, left:left + w, :].reshape(n, h, w, c, multiplier)
    wide = _prefer_einsum(n * oh * ow, oc, kh * kw)
    taps = [((ky * dh % sh, kx * dw % sw), ky * dh // sh, kx * dw // sw, ky, kx)
            for ky in range(kh) for kx in range(kw)]
    phases = {} if (sh, sw) == (1, 1) or wide else {
        key: (n, -(-(hp - key[0]) // sh), -(-(wp - key[1]) // sw), oc) for key in sorted({t[0] for t in taps})}
    tiled = None if weights is None or wide else _tile_taps(weights, ow)
    bias_row = None if bias is None else along_rows(bias, op.outputs[0].shape)
    split = spread(chunks_for(oh, n * oh * ow * oc * len(taps)))

    def run(ins, outs):
        x, out = ins[0], outs[0]
        if buffer is not None:
            np.copyto(inside, x[..., None])
            x = buffer
        if wide:
            filt = (weights if weights is not None else np.asarray(ins[1], np.float32))[0]
            windows = window_view(x, (oh, ow), (kh, kw), (sh, sw), (dh, dw))
        else:
            filt = tiled if tiled is not None else _tile_taps(np.asarray(ins[1], np.float32), ow)
            source = {(0, 0): x}
            for slot, ((py, px), shape) in enumerate(phases.items(), start=1):
                image = source[py, px] = scratch(slot, shape)
                np.copyto(image, x[:, py::sh, px::sw, :])
            partial = scratch(0, out.shape)

        def rows(start, stop):
            part = out[:, start:stop]
            if wide:
                np.einsum("nhwijc,ijc->nhwc", windows[:, start:stop], filt, out=part)
            else:
                _accumulate_taps(source, filt, taps, start, stop, part, partial[:, start:stop])
            if bias_row is not None:
                part += bias_row
            act(part)
        split(rows)
    return run


def _accumulate_taps(source, filt, taps, start, stop, out, scratch):
    """Output rows start..stop: the sum over taps of each window times its tiled filter tap."""
    ow = out.shape[2]
    for i, (key, y0, x0, ky, kx) in enumerate(taps):
        window = source[key][:, y0 + start:y0 + stop, x0:x0 + ow, :]
        if i == 0:
            np.multiply(window, filt[ky, kx], out=out)
        else:
            np.multiply(window, filt[ky, kx], out=scratch)
            out += scratch


def _tile_taps(weights: np.ndarray, width: int) -> np.ndarray:
    """(1, KH, KW, C) depthwise filter -> (KH, KW, width, C), each tap repeated along the output width."""
    _, kh, kw, oc = weights.shape
    return np.ascontiguousarray(np.broadcast_to(weights[0, :, :, None, :], (kh, kw, width, oc)))


def transpose_conv(op: Op, slots: tuple[int, int, int], stride: tuple[int, int], pad_before: tuple[int, int],
                   act):
    """Transposed convolution: one GEMM to per-tap contributions, then strided accumulation.

    ``slots`` are the input indices of data, weights (OHWI) and bias.  Each input
    pixel adds ``x . w[:, ky, kx, :]`` at output position
    ``(iy * stride - pad + ky, ix * stride - pad + kx)``; bias is added once.
    Returns ``run(x, w, out)`` (``w`` is only read when the weights are not constant).
    """
    data_index, weight_index, bias_index = slots
    n, ih, iw, ci = op.inputs[data_index].shape
    _, oh, ow, o = op.outputs[0].shape
    _, kh, kw, _ = op.inputs[weight_index].shape
    sh, sw = stride
    top, left = pad_before
    bias = _bias(op, bias_index, o)
    bias = None if bias is None else along_rows(bias, op.outputs[0].shape)

    def layout(w):
        return np.ascontiguousarray(w.transpose(3, 1, 2, 0).reshape(ci, kh * kw * o))

    weights = float_constant(op.inputs[weight_index])
    gemm = None if weights is None else layout(weights)
    full = (n, max((ih - 1) * sh + kh, top + oh), max((iw - 1) * sw + kw, left + ow), o)

    def run(x, w, out):
        acc, contrib = scratch(0, full), scratch(1, (n * ih * iw, kh * kw * o))
        np.matmul(x.reshape(n * ih * iw, ci), gemm if gemm is not None else layout(np.asarray(w, np.float32)),
                  out=contrib)
        parts = contrib.reshape(n, ih, iw, kh, kw, o)
        acc.fill(0)
        for ky in range(kh):
            for kx in range(kw):
                acc[:, ky:ky + sh * (ih - 1) + 1:sh, kx:kx + sw * (iw - 1) + 1:sw, :] += parts[:, :, :, ky, kx, :]
        np.copyto(out, acc[:, top:top + oh, left:left + ow, :])
        if bias is not None:
            out += bias
        act(out)
    return run


@kernel("TRANSPOSE_CONV")
def transpose_conv_2d(op: Op):
    out_shape = op.outputs[0].shape
    _, kh, kw, _ = op.inputs[1].shape
    opts = op.options
    stride = (opts.get("stride_h", 1), opts.get("stride_w", 1))
    pads = (0, 0)
    if opts.get("padding", "SAME") == "SAME":
        # Padding as for a forward convolution from the output size back to the input size.
        pads = tuple(same_padding(out_shape[1 + i], (kh, kw)[i], stride[i], 1,
                                  -(-out_shape[1 + i] // stride[i]))[0] for i in range(2))
    run_tc = transpose_conv(op, (2, 1, 3), stride, pads, fused(op))

    def run(ins, outs):
        run_tc(ins[2], ins[1], outs[0])
    return run


@kernel("Convolution2DTransposeBias")
def convolution_2d_transpose_bias(op: Op):
    _, pads, stride = transpose_conv_bias_geometry(op.inputs[0].shape, op.inputs[1].shape, op.custom_options)
    run_tc = transpose_conv(op, (0, 1, 2), stride, pads, lambda x: None)

    def run(ins, outs):
        run_tc(ins[0], ins[1], outs[0])
    return run


@kernel("FULLY_CONNECTED")
def fully_connected(op: Op):
    units, depth = op.inputs[1].shape
    weights = float_constant(op.inputs[1])
    gemm = None if weights is None else np.ascontiguousarray(weights.T)
    bias = _bias(op, 2, units)
    act = fused(op)

    def run(ins, outs):
        operand = gemm if gemm is not None else np.asarray(ins[1], np.float32).T
        out2d = outs[0].reshape(-1, units)
        np.matmul(ins[0].reshape(-1, depth), operand, out=out2d)
        if bias is not None:
            out2d += bias
        act(out2d)
    return run


@kernel("BATCH_MATMUL")
def batch_matmul(op: Op):
    adj_x, adj_y = bool(op.options.get("adj_x")), bool(op.options.get("adj_y"))
    rhs = float_constant(op.inputs[1])
    if rhs is not None:
        rhs = np.ascontiguousarray(np.swapaxes(rhs, -1, -2) if adj_y else rhs)

    def run(ins, outs):
        a = np.swapaxes(ins[0], -1, -2) if adj_x else ins[0]
        b = rhs if rhs is not None else (np.swapaxes(ins[1], -1, -2) if adj_y else ins[1])
        np.matmul(a, b, out=outs[0])
    return run
