"""Quantized accumulating kernels: CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, TRANSPOSE_CONV, BATCH_MATMUL.

int8 and 16x8 convolutions and fully connected layers with weights of zero point 0
run native.c's integer kernels where the native loops serve: integer sums, the input
zero point folded into the bias, requantized in the same pass as the LiteRT kernel
does.  Otherwise products of zero-point-centred integers are summed exactly by the
float kernels' engines (float32 while every partial sum stays below 2**24, else over
ranges of the depth, or in float64), then rescaled per output channel with the bias and the
output zero point folded in (quant_util.Rescale).  Which rescaling rounding
applies follows the LiteRT kernel that runs the op: CONV_2D and
FULLY_CONNECTED go through ruy, depthwise and transpose conv through TFLite's
vectorised output loop (ties rounded up on whole groups of 8 channels, gemmlowp's
rounding on the rest), BATCH_MATMUL through the scalar reference, and 16-bit
activations with 64-bit biases through the 64-bit variant.
"""

from __future__ import annotations

import numpy as np

from delegate.plugin_api import DType, Op, Tensor

from ..registry import find_kernel, kernel
from .common import contiguous_layout, same_padding
from .conv import (STORED_OPERAND_ROWS, StoredOperand, conv_gemm, conv_pads, depthwise_taps, matrix_gemm,
                   residual_parts)
from .native import (PER_THREAD_MACS, Geometry, PackedInt8, QBinaryCall, QConvCall, QDepthwiseCall, QProductCall,
                     QStage, Requant, WideCall, kernel_loops, prepared_run, team_for)
from .quant_util import (
    Rescale, RescaleInDouble, Requantize, activation_bounds, lane_rounding, multiply_by_quantized_multiplier,
    multiply_half_up, multiply_wide, qrange, quantize_multiplier, scale, scales, vector_lanes, wrap32, zero_point)


def _weights(t: Tensor) -> np.ndarray:
    if t is None or t.data is None:
        raise ValueError("quantized kernels need constant weights")
    # int16 holds any 8-bit weight less its zero point: large layers are copied at compile time.
    data = np.asarray(t.data)
    return np.subtract(data, zero_point(t), dtype=np.int16 if data.dtype.itemsize == 1 else np.int32)


def _bias(op: Op, index: int, channels: int) -> np.ndarray:
    t = op.input(index)
    return np.zeros(channels, np.int64) if t is None else np.asarray(t.data, np.int64).reshape(channels)


def _real_multiplier(op: Op, x: Tensor, w: Tensor, channels: int, float_product: bool) -> np.ndarray:
    """Per-channel real rescale s_in * s_w[c] / s_out: in double, or with the float32 product first."""
    out = op.outputs[0]
    if float_product:
        real = np.float64(scale(x) * scales(w)[0]) / np.float64(scale(out))
    else:
        real = np.float64(scale(x)) * scales(w).astype(np.float64) / np.float64(scale(out))
    return np.broadcast_to(real, (channels,))


def _output_stage(op: Op, x: Tensor, w: Tensor, channels: int, rounding) -> Requantize:
    """The fixed-point output stage, its multiplier derived as the LiteRT kernel derives it:
    per-tensor uint8 weights (and per-tensor FULLY_CONNECTED) multiply the float32 scales first."""
    return Requantize.of(_stage_multiplier(op, x, w, channels), zero_point(op.outputs[0]), activation_bounds(op),
                         rounding)


def _stage_multiplier(op: Op, x: Tensor, w: Tensor, channels: int) -> np.ndarray:
    float_product = w.quantization.scale.size == 1 and (
        x.dtype.numpy == np.uint8 or op.opcode == "FULLY_CONNECTED")
    return _real_multiplier(op, x, w, channels, float_product)


def _exact_gemm(op: Op, weights: np.ndarray):
    """(float type, depth ranges, accumulator bound) for exact products of the zero-point-centred
    input with ``weights`` (units x depth).

    float32 sums are exact while every partial sum stays below 2**24; a depth whose sums may
    not is cut into ranges that each stay below (their sums then added in float64), and into
    float64 throughout when that would take more than a few ranges.
    """
    spread, bound = _product_bound(op, weights)
    if bound < 1 << 24:
        return np.float32, None, bound
    magnitude = np.abs(weights)
    limit = ((1 << 24) - 1) // spread  # the largest weight sum one range may have, per unit
    parts, start, running = [], 0, np.zeros(len(weights), np.int64)
    for k, column in enumerate(magnitude.T):
        running += column
        if running.max() > limit and k > start:
            parts.append((start, k))
            start, running[:] = k, column
            if len(parts) > 4:
                return np.float64, None, bound
    parts.append((start, magnitude.shape[1]))
    return (np.float32, parts, bound) if len(parts) <= 4 else (np.float64, None, bound)


def _product_bound(op: Op, weights: np.ndarray) -> tuple[int, int]:
    """(largest input magnitude less its zero point, largest sum of products over a unit's depth)."""
    x = op.inputs[0]
    lo, hi = qrange(x)
    spread = max(hi - zero_point(x), zero_point(x) - lo)
    return spread, spread * int(np.abs(weights).sum(axis=1, dtype=np.int64).max(initial=0))


def _finish(op: Op, away, bias: np.ndarray, bound: int, reference=None):
    """finish(acc, out, u0, u1) for the GEMM engines: the exact fixed-point output stage.

    ``away`` marks the output channels whose ties round away from zero; ``reference``, an
    output stage (Requantize / RescaleInDouble) for the rounding variants Rescale does not
    cover, applied to the int64 accumulators instead.
    """
    x, w, out = op.inputs[0], op.inputs[1], op.outputs[0]
    channels = bias.size
    # LiteRT sums int8 products and the bias in int32: a sum past its range wraps around (a bias of -2^31
    # made a channel's output 127 there), so where the bias may take it past, the sum wraps here too
    wraps = x.dtype.numpy in (np.int8, np.uint8) and bound + int(np.abs(bias).max(initial=0)) >= 1 << 31
    if reference is None and not wraps and bound < 1 << 31:
        try:
            return Rescale(_stage_multiplier(op, x, w, channels), zero_point(out), activation_bounds(op), away,
                           bias, bound, out.shape[-2] if len(out.shape) == 4 else 1)
        except ValueError:
            pass
    stage = reference or _output_stage(op, x, w, channels, multiply_half_up if not np.any(away)
                                       else multiply_by_quantized_multiplier if np.all(away)
                                       else lane_rounding(~np.asarray(away)))

    def finish(acc, dst, u0, u1):
        total = acc.astype(np.int64) + bias[u0:u1]
        stage.channels(u0, u1)(wrap32(total) if wraps else total, dst)
    return finish


def _integer_loops(op: Op, activations=np.int8):
    """At compile time: the native loops where ``op`` may run in their integer kernels (input and output
    of ``activations``, constant int8 weights of zero point 0); None otherwise."""
    x, w, out = op.inputs[0], op.inputs[1], op.outputs[0]
    if x.dtype.numpy != activations or out.dtype.numpy != activations or w.dtype.numpy != np.int8 or \
            w.data is None or np.any(w.quantization.zero_point) or not x.shape or not out.shape:
        return None
    return kernel_loops()


def _wide(op: Op, kind: str, bias: np.ndarray, reference: bool):
    """run() of a 16x8 op in native.c's wide kernels (``kind``: product, conv or depthwise), its output
    stage ``reference`` (LiteRT's 64-bit reference rescale) or ruy's; None where they do not serve."""
    loops = _integer_loops(op, np.int16)
    if loops is None:
        return None
    x, w, out = op.inputs[0], op.inputs[1], op.outputs[0]
    stored = np.asarray(w.data)
    matrix = stored.reshape(-1, stored.shape[-1]) if kind == "depthwise" else stored.reshape(stored.shape[0], -1)
    units = matrix.shape[1] if kind == "depthwise" else matrix.shape[0]
    zx = zero_point(x)
    if kind != "depthwise":
        bias = bias - zx * matrix.sum(axis=1, dtype=np.int64)  # taps hold zx: sum(x * w) less zx * sum(w)
    spread = 32768 + abs(zx)
    bound = spread * int(np.abs(matrix.astype(np.int64)).sum(axis=1 if kind != "depthwise" else 0).max(initial=0))
    constants = _wide_constants(op, bias, bound, reference)
    if constants is None:
        return None
    stage = Requant(constants, activation_bounds(op))
    team = team_for(int(np.prod(out.shape)) * matrix.size // units, PER_THREAD_MACS)
    if kind == "product":
        call = WideCall(kind, matrix, stage, team, rows=int(np.prod(out.shape)) // units)
    else:
        n, h, width, _ = x.shape
        kh, kw = stored.shape[1:3]
        where = Geometry.of(op, contiguous_layout(x.shape), contiguous_layout(out.shape),
                            conv_pads(op, (h, width), (kh, kw), out.shape[1:3]))
        if kind == "depthwise":
            if not QDepthwiseCall.sums_fit(matrix, np.int16, zx):
                return None
            call = QDepthwiseCall(matrix, where, zx, stage, team)
        else:
            call = WideCall(kind, matrix, stage, team, where=where, zero=zx)
    return prepared_run(loops, call)


def _wide_constants(op: Op, bias: np.ndarray, bound: int, reference: bool) -> tuple | None:
    """Requant's constants for sums bounded by ``bound`` (less ``bias`` per channel): LiteRT's 64-bit
    reference rescale (multiply_wide, the output zero point folded in) or Rescale's (ties up); None
    where int64 could overflow."""
    x, w, out = op.inputs[0], op.inputs[1], op.outputs[0]
    real = _stage_multiplier(op, x, w, bias.size)
    if not reference:
        try:
            return Rescale(real, zero_point(out), activation_bounds(op), False, bias, bound).per_channel
        except ValueError:
            return None
    if np.max((bound + np.abs(bias.astype(np.float64))) * np.asarray(real, np.float64), initial=0.0) >= 1 << 31:
        return None  # a result past int32 wraps in LiteRT's cast: multiply_wide's, on the numpy path
    fixed, exponent = (np.broadcast_to(v, bias.size) for v in quantize_multiplier(real))
    reduced = np.where(fixed < 0x7FFF0000, (fixed + (1 << 15)) >> 16, 0x7FFF)
    total = 15 - exponent
    if total.min(initial=1) < 1 or total.max(initial=1) > 62:
        return None
    offsets = [int(b) * int(r) + (1 << (int(t) - 1)) + (zero_point(out) << int(t))
               for b, r, t in zip(bias, reduced, total)]
    if max(((bound + abs(int(b))) * int(r) + abs(k) for b, r, k in zip(bias, reduced, offsets)), default=0) >= 1 << 62:
        return None
    return reduced, np.array(offsets, np.int64), total


def _integer_stage(op: Op, away, bias: np.ndarray) -> QStage | None:
    """The integer kernels' output stage with int32 ``bias`` per channel (the zero point folded in);
    None where that bias leaves the int32 range."""
    if bias.size and (bias.min() < -(1 << 31) or bias.max() >= 1 << 31):
        return None
    fixed, exponent = quantize_multiplier(_stage_multiplier(op, op.inputs[0], op.inputs[1], bias.size))
    return QStage(fixed, exponent, bias, away, zero_point(op.outputs[0]), activation_bounds(op))


def _integer_product(op: Op, matrix: np.ndarray, bias: np.ndarray, loops):
    """(packed operand, output stage) of the int8 products x @ matrix.T (matrix: units x depth, as
    stored) in ``loops``: sum((x - zx) * w) is sum(x * w) - zx * sum(w), so the zero point joins the bias."""
    stage = _integer_stage(op, False, bias - zero_point(op.inputs[0]) * matrix.sum(axis=1, dtype=np.int64))
    return (None, None) if stage is None else (PackedInt8(matrix, loops), stage)


def _native_conv2d(op: Op, bias: np.ndarray, residual: QBinaryCall | None = None):
    """run() of an int8 CONV_2D in the integer kernels (a 1x1 filter of stride 1 one product on the
    input in place), its results through ``residual`` (an ADD of the input after the last) when given;
    None where they do not serve."""
    loops = _integer_loops(op)
    if loops is None:
        return None
    x, out = op.inputs[0], op.outputs[0]
    o, kh, kw, c = op.inputs[1].shape
    n, h, w, _ = x.shape
    _, oh, ow, _ = out.shape
    packed, stage = _integer_product(op, np.asarray(op.inputs[1].data).reshape(o, -1), bias, loops)
    if packed is None:
        return None
    team = team_for(n * oh * ow * o * kh * kw * c, PER_THREAD_MACS)
    pads = conv_pads(op, (h, w), (kh, kw), (oh, ow))
    if kh == kw == 1 and (op.options.get("stride_h", 1), op.options.get("stride_w", 1)) == (1, 1) and not any(pads):
        call = QProductCall(n * h * w, packed, stage, team, residual)
    else:
        where = Geometry.of(op, contiguous_layout(x.shape), contiguous_layout(out.shape), pads)
        call = QConvCall(packed, where, zero_point(x), stage, team, residual)
    return prepared_run(loops, call, 1 if residual is None else (0, len(op.inputs)))


def _with_residual(conv: Op, add: Op, first: int):
    """run() of an int8 CONV_2D whose results go through a residual ADD: in the integer kernel as it
    stores each row where the native loops serve, else the convolution's kernel and the ADD's in turn."""
    from .quantized import int8_add_call  # quantized imports this module to register its kernels

    residual = int8_add_call(add, first)
    native = None if residual is None else _native_conv2d(conv, _bias(conv, 2, conv.inputs[1].shape[0]), residual)
    if native is not None:
        return native
    conv_run, add_run = conv2d(conv), find_kernel(add)(add)
    result = np.empty(conv.outputs[0].shape, np.int8)

    def run(ins, outs):
        conv_run(ins[:-1], [result])
        add_run([result, ins[-1]] if first == 0 else [ins[-1], result], outs)
    return run


def _reference_16x8(op: Op, x: Tensor) -> bool:
    """Whether LiteRT runs a 16-bit-activation CONV_2D / FULLY_CONNECTED through its reference
    kernel rather than ruy: always for int64 biases, and whenever a zero point is not 0."""
    if x.dtype.numpy != np.int16:
        return False
    bias = op.input(2)
    declared = op.options.get("quantized_bias_type", DType.float32.value)
    if any(zero_point(t) for t in (x, op.inputs[1], op.outputs[0])):
        return True
    if op.opcode == "CONV_2D":  # the optimized 16x8 conv runs only when declared with int32 biases
        return declared != DType.int32.value
    return (bias is not None and bias.dtype is DType.int64) or declared == DType.int64.value


def _vector_loop_rounding(op: Op, x: Tensor):
    """The output rounding of LiteRT's depthwise / transpose conv for the input type.

    int8 vectorises over whole groups of 8 channels; uint8 transpose conv over whole blocks of
    16 flat elements, while uint8 depthwise rounds ties away from zero even in its vector code;
    16-bit activations run the 64-bit reference.
    """
    out = op.outputs[0]
    if x.dtype.numpy == np.int16:
        return multiply_wide
    if x.dtype.numpy == np.int8:
        return lane_rounding(vector_lanes(out.shape[-1], 8))
    if op.opcode == "DEPTHWISE_CONV_2D":
        return multiply_by_quantized_multiplier
    return lane_rounding(vector_lanes(out.size, 16, out.shape))


def _operand(op: Op, w: Tensor, matrix: np.ndarray, dtype):
    """The GEMM operand of ``matrix`` (units x depth, zero point taken out): a float copy, or for
    products of few rows the stored weights themselves, converted block by block as they are used."""
    rows = int(np.prod(op.outputs[0].shape[:-1]))
    if rows < STORED_OPERAND_ROWS and dtype == np.float32:
        return StoredOperand(np.asarray(w.data).reshape(matrix.shape).T, zero_point(w), dtype)
    return np.ascontiguousarray(matrix.T, dtype)


@kernel("CONV_2D", quantized=True)
def conv2d(op: Op):
    """One exact float GEMM per block of output rows on the zero-point-centred input (see conv_gemm)."""
    parts = residual_parts(op)
    if parts is not None:
        return _with_residual(*parts)
    x, w = op.inputs[0], op.inputs[1]
    weights = _weights(w)
    out_c, kh, kw, in_c = weights.shape
    if x.shape[3] != in_c:
        raise ValueError("grouped quantized CONV_2D is not supported")
    native = _native_conv2d(op, _bias(op, 2, out_c)) or _wide(op, "conv", _bias(op, 2, out_c), _reference_16x8(op, x))
    if native is not None:
        return native
    matrix = weights.reshape(out_c, -1)
    dtype, parts, bound = _exact_gemm(op, matrix)
    reference = _output_stage(op, x, w, out_c, multiply_wide) if _reference_16x8(op, x) else None
    finish = _finish(op, False, _bias(op, 2, out_c), bound, reference)
    return conv_gemm(op, _operand(op, w, matrix, dtype), finish, dtype, zero_point(x), parts)


@kernel("DEPTHWISE_CONV_2D", quantized=True)
def depthwise_conv2d(op: Op):
    """Exact float sums on the zero-point-centred input (see depthwise_taps).

    LiteRT's int8 kernel rounds ties up in its vector loop over whole groups of 8 channels and
    away from zero on the rest; uint8 rounds away from zero throughout; 16-bit runs the 64-bit
    reference.
    """
    x, w = op.inputs[0], op.inputs[1]
    weights = _weights(w)
    _, kh, kw, out_c = weights.shape
    _, bound = _product_bound(op, weights.reshape(-1, out_c).T)
    away = ~vector_lanes(out_c, 8) if x.dtype.numpy == np.int8 else x.dtype.numpy == np.uint8
    taps = weights.reshape(kh * kw, out_c)
    fit = x.shape[-1] == out_c and QDepthwiseCall.sums_fit(taps, x.dtype.numpy, zero_point(x))
    loops = _integer_loops(op) if fit else None
    stage = None if loops is None else _integer_stage(op, away, _bias(op, 2, out_c))
    if stage is not None:
        n, h, width, _ = x.shape
        _, oh, ow, _ = op.outputs[0].shape
        where = Geometry.of(op, contiguous_layout(x.shape), contiguous_layout(op.outputs[0].shape),
                            conv_pads(op, (h, width), (kh, kw), (oh, ow)))
        team = team_for(n * oh * ow * out_c * kh * kw, PER_THREAD_MACS)
        return prepared_run(loops, QDepthwiseCall(taps, where, zero_point(x), stage, team))
    native = _wide(op, "depthwise", _bias(op, 2, out_c), True) if x.shape[-1] == out_c else None
    if native is not None:
        return native
    dtype = np.float32 if bound < 1 << 24 else np.float64
    reference = _output_stage(op, x, w, out_c, multiply_wide) if x.dtype.numpy == np.int16 else None
    finish = _finish(op, away, _bias(op, 2, out_c), bound, reference)
    return depthwise_taps(op, weights, finish, dtype, zero_point(x))


@kernel("FULLY_CONNECTED", quantized=True)
def fully_connected(op: Op):
    x, w = op.inputs[0], op.inputs[1]
    weights = _weights(w)
    units, _ = weights.shape
    bias = _bias(op, 2, units)
    loops = _integer_loops(op)
    packed, stage = (None, None) if loops is None else _integer_product(op, np.asarray(w.data), bias, loops)
    if packed is not None:
        rows = int(np.prod(op.outputs[0].shape)) // units
        return prepared_run(loops, QProductCall(rows, packed, stage, team_for(rows * weights.size, PER_THREAD_MACS)))
    # LiteRT's reference 16x8 FULLY_CONNECTED rescales in double precision: numpy's (below) only.
    native = None if _reference_16x8(op, x) else _wide(op, "product", bias, False)
    if native is not None:
        return native
    dtype, parts, bound = _exact_gemm(op, weights)
    reference = None
    if _reference_16x8(op, x):
        real = _real_multiplier(op, x, w, units, float_product=False)
        reference = RescaleInDouble(real, zero_point(op.outputs[0]), *activation_bounds(op))
    return matrix_gemm(op, _operand(op, w, weights, dtype), _finish(op, False, bias, bound, reference), dtype,
                       zero_point(x), parts)


@kernel("TRANSPOSE_CONV", quantized=True)
def transpose_conv(op: Op):
    """Each input pixel scatters its (KH, KW, O) patch into the output at stride spacing."""
    w, x = op.inputs[1], op.inputs[2]
    weights = _weights(w)
    out_c, kh, kw, in_c = weights.shape
    matrix = np.ascontiguousarray(weights.transpose(3, 1, 2, 0).reshape(in_c, -1), np.float64)
    bias = _bias(op, 3, out_c)
    n, in_h, in_w, _ = x.shape
    out_h, out_w = op.outputs[0].shape[1:3]
    sh, sw = op.options.get("stride_h", 1), op.options.get("stride_w", 1)
    top = same_padding(out_h, kh, sh, 1, in_h)[0]
    left = same_padding(out_w, kw, sw, 1, in_w)[0]
    full_h = max((in_h - 1) * sh + kh, top + out_h)
    full_w = max((in_w - 1) * sw + kw, left + out_w)
    output = _output_stage(op, x, w, out_c, _vector_loop_rounding(op, x))
    offset = zero_point(x)

    def run(ins, outs):
        patches = (ins[2].reshape(-1, in_c).astype(np.float64) - offset) @ matrix
        patches = patches.astype(np.int64).reshape(n, in_h, in_w, kh, kw, out_c)
        full = np.zeros((n, full_h, full_w, out_c), np.int64)
        for i in range(kh):
            for j in range(kw):
                full[:, i:i + (in_h - 1) * sh + 1:sh, j:j + (in_w - 1) * sw + 1:sw] += patches[:, :, :, i, j]
        output(full[:, top:top + out_h, left:left + out_w] + bias, outs[0])
    return run


@kernel("BATCH_MATMUL", quantized=True)
def batch_matmul(op: Op):
    lhs, rhs = op.inputs[0], op.inputs[1]
    adj_x, adj_y = op.options.get("adj_x", False), op.options.get("adj_y", False)
    rounding = multiply_wide if lhs.dtype.numpy == np.int16 else multiply_by_quantized_multiplier
    out = op.outputs[0]
    real = np.float64(scale(lhs) * scale(rhs)) / np.float64(scale(out))
    output = Requantize.of(real, zero_point(out), qrange(out), rounding)
    offsets = (zero_point(lhs), zero_point(rhs))

    rows = out.shape[-2]
    # output rows a product at a time: the int64 sums and the rescale's temporaries of a whole attention
    # map (2 x 197 x 197 in a ViT block) set the peak memory of a small model
    step = max(1, BATCH_MATMUL_ITEMS // max(1, int(np.prod(out.shape)) // max(rows, 1)))

    def run(ins, outs):
        a, b = (v.astype(np.float64) - zp for v, zp in zip(ins, offsets))
        if adj_x:
            a = np.ascontiguousarray(np.swapaxes(a, -1, -2))
        if adj_y:
            b = np.ascontiguousarray(np.swapaxes(b, -1, -2))
        for first in range(0, rows, step):
            output(np.matmul(a[..., first:first + step, :], b).astype(np.int64), outs[0][..., first:first + step, :])
    return run


BATCH_MATMUL_ITEMS = 1 << 15
