"""Quantized (int8 / uint8 / int16) kernels with LiteRT's integer semantics, bit for bit.

Each factory derives the fixed-point parameters once, from the tensors'
scales and zero points, exactly as the matching LiteRT kernel's Prepare does
(including where it computes in float32 rather than double), so that ``run``
is pure integer numpy.  This module holds conversions, elementwise arithmetic
and activations; the accumulating kernels (convolutions, matmuls), the
windowed/reducing kernels and data movement live in the sibling
``quant_*`` modules, imported here so one import registers them all, and
the 16-bit table activations in ``quant_int16``.
"""

from __future__ import annotations

import numpy as np

from delegate.plugin_api import Op

from ..registry import kernel
from .elementwise import COMPARE, arithmetic
from .native import (PER_THREAD_ITEMS, LookupCall, QBinaryCall, QSoftmaxCall, QStage, QuantizeCall, kernel_loops,
                     prepared_run, team_for)
from . import quant_conv, quant_data, quant_reduce  # noqa: F401  (registration side effects)
from . import quant_int16
from .quant_util import (
    INT32_MAX, RELU_BOUNDS, Rescale, Requantize, activation_bounds, c_math, clamp_bounds, int32_conversion_plus,
    lane_rounding, leading_zeros, lookup_table, multiply_by_quantized_multiplier, power_of_two_exponent, qrange,
    quantize_multiplier, round_half_away, rounding_divide_by_pot, saturating_rounding_doubling_high_mul, scale, store,
    table_index, trunc_div, vector_lanes, zero_point)


# --- conversions ----------------------------------------------------------------------------

# Rounded values below this magnitude, plus an 8- or 16-bit zero point, stay inside int32, exactly in float32.
EXACT_IN_FLOAT32 = np.float32(2.0 ** 31 - 65536)


@kernel("QUANTIZE", quantized=True)
def quantize(op: Op):
    src, dst = op.inputs[0], op.outputs[0]
    bounds = qrange(dst)
    if src.dtype.is_float:
        # LiteRT's vector loop (the leading whole blocks of 8 of the flat tensor) multiplies by a float32
        # reciprocal and rounds ties to even; its scalar tail divides in double and rounds ties away from
        # zero.  Each is computed only where it applies (both over every element, selected after, took
        # 0.86 ms of MobileNetV2 int8's 224x224x3 input on one thread, its every other op 2-320 us).
        whole = src.size - src.size % 8
        divisor = np.float64(scale(dst))
        reciprocal = np.float32(1.0 / divisor)
        offset, (low, high) = zero_point(dst), bounds
        loops = kernel_loops() if src.dtype.numpy == np.float32 else None
        if loops is not None:
            call = QuantizeCall(src.size, whole, float(reciprocal), float(divisor), offset, bounds, dst.dtype.numpy,
                                team_for(src.size, PER_THREAD_ITEMS))
            return prepared_run(loops, call)

        def run_float(ins, outs):
            x = np.ascontiguousarray(ins[0]).reshape(-1)
            contiguous = outs[0].flags.c_contiguous
            out = outs[0].reshape(-1) if contiguous else np.empty(src.size, dst.dtype.numpy)
            v = x[:whole] * reciprocal
            np.rint(v, out=v)
            # in float32 where the sum cannot leave int32 (the largest magnitude says; NaN makes it NaN), the
            # rest (NaN, infinities, values near or beyond int32's range) as the conversion goes
            wild = np.flatnonzero(~(np.abs(v) < EXACT_IN_FLOAT32)) if whole and \
                not np.abs(v).max() < EXACT_IN_FLOAT32 else None
            exact = None if wild is None else int32_conversion_plus(v[wild], offset)
            v += np.float32(offset)
            np.clip(v, low, high, out=v)
            with np.errstate(invalid="ignore"):  # NaN's place is written over below
                np.copyto(out[:whole], v, casting="unsafe")
            if wild is not None:
                out[wild] = np.clip(exact, low, high)
            tail = round_half_away(x[whole:].astype(np.float64) / divisor)
            store(out[whole:], int32_conversion_plus(tail, offset), low, high)
            if not contiguous:
                np.copyto(outs[0], out.reshape(outs[0].shape))
        return run_float
    # Between 8-bit types LiteRT vectorises over whole blocks of 16 elements; 16-bit runs scalar code.
    eight_bit = {src.dtype.numpy, dst.dtype.numpy} <= {np.dtype(np.int8), np.dtype(np.uint8)}
    rounding = lane_rounding(vector_lanes(src.size, 16, src.shape)) if eight_bit else multiply_by_quantized_multiplier
    requantize = Requantize.of(np.float64(scale(src)) / np.float64(scale(dst)), zero_point(dst), bounds, rounding)
    offset = zero_point(src)

    def run(ins, outs):
        requantize(ins[0].astype(np.int64) - offset, outs[0])
    return run


@kernel("DEQUANTIZE", quantized=True)
def dequantize(op: Op):
    """LiteRT's vector loop (whole blocks of 8) computes in float32, its scalar tail in double."""
    src = op.inputs[0]
    factor, offset = np.float64(scale(src)), zero_point(src)
    whole = src.size - src.size % 8  # the vector loop's: the leading whole blocks of the flat tensor
    vector_offset = np.float32(-offset * factor)

    def run(ins, outs):
        q = np.ascontiguousarray(ins[0]).reshape(-1)
        contiguous = outs[0].flags.c_contiguous  # written in place, else through one copy
        out = outs[0].reshape(-1) if contiguous else np.empty(src.size, np.float32)
        np.multiply(q[:whole], np.float32(factor), out=out[:whole], dtype=np.float32)
        out[:whole] += vector_offset
        out[whole:] = factor * (q[whole:].astype(np.float64) - offset)
        if not contiguous:
            np.copyto(outs[0], out.reshape(outs[0].shape))
    return run


# --- elementwise arithmetic -----------------------------------------------------------------

_SCALAR, _VECTOR, _BROADCAST_VECTOR = 0, 1, 2


def _int8_add_loops(shape_a, shape_b, out_shape) -> np.ndarray:
    """Which of LiteRT's int8 ADD loops computes each output element; their roundings differ.

    Same shapes run one flat loop whose whole 16-element blocks are vectorised.  A
    broadcast is folded into at most five nested dimensions (ProcessBroadcastShapes); the
    innermost run is then either an elementwise loop (16-wide vector blocks) or, when it
    has length one, a scalar-broadcast loop (8-wide vector blocks).  Leftovers, and
    broadcasts that do not fold, run the scalar code.
    """
    rank = len(out_shape)
    a = (1,) * (rank - len(shape_a)) + tuple(shape_a)
    b = (1,) * (rank - len(shape_b)) + tuple(shape_b)
    flat = np.arange(int(np.prod(out_shape, dtype=np.int64))).reshape(out_shape)

    def blocks(length: int, lanes: int, code: int) -> np.ndarray:
        return np.where(flat % length < length - length % lanes, code, _SCALAR)

    if a == b:
        return blocks(max(flat.size, 1), 16, _VECTOR)
    differing = [i for i in range(rank) if a[i] != b[i]]
    slow, fast = (a, b) if a[differing[-1]] == 1 else (b, a)  # ``slow`` is broadcast along the inner dim
    folded, i = [1] * 5, rank - 1
    for slot, keeps in ((4, lambda j: slow[j] == fast[j]), (3, lambda j: slow[j] == 1),
                        (2, lambda j: slow[j] == fast[j]), (1, lambda j: fast[j] == 1),
                        (0, lambda j: slow[j] == fast[j])):
        while i >= 0 and keeps(i):
            folded[slot] *= max(slow[i], fast[i])
            i -= 1
    if i >= 0:
        return np.full(out_shape, _SCALAR)
    if folded[4] > 1:
        return blocks(folded[4], 16, _VECTOR)
    return blocks(folded[3], 8, _BROADCAST_VECTOR)


def _common_scale(a, b):
    """Multipliers taking both operands onto the scale 2 * max(s_a, s_b), and that scale: the
    shared preparation of LiteRT's quantized ADD, SUB and SQUARED_DIFFERENCE."""
    twice_max = np.float32(2) * max(scale(a), scale(b))
    return [quantize_multiplier(np.float64(scale(t)) / np.float64(twice_max)) for t in (a, b)], np.float64(twice_max)


def _power_of_two_add_sub(op: Op, exponents: list[int]):
    """LiteRT's legacy int16 path when every scale is a power of two: shift one operand onto the
    output scale (rounding), then add or subtract with int16 saturation."""
    shifts = [exponents[2] - e for e in exponents[:2]]
    if min(shifts) < 0:
        raise ValueError("power-of-two int16 ADD/SUB needs input scales no finer than the output's")
    sign = -1 if op.opcode == "SUB" else 1
    bounds = activation_bounds(op)

    def run(ins, outs):
        x, y = (rounding_divide_by_pot(v.astype(np.int64), s) for v, s in zip(ins, shifts))
        store(outs[0], np.clip(x + sign * y, -(1 << 15), (1 << 15) - 1), *bounds)
    return run


def _pair_lookup(op: Op, formulation, classes: np.ndarray | None = None):
    """At compile time: the run() of an elementwise op of two 8-bit operands as one lookup per item, in a
    table of its results for every pair of operand values, or None where an operand or the output is not
    8-bit or of a static shape.  ``formulation(values, out, kind)`` computes the op itself on any arrays
    (``kind``: the code among ``classes`` of the loop LiteRT runs there, where its loops round
    differently); it fills the table, so the lookup gives its results exactly.  Broadcast int8 arithmetic
    in numpy took ~100 us for 197 items (layer norms of a ViT) and ~60 ns an item beyond; the lookup ~5 ns."""
    a, b, out = op.inputs[0], op.inputs[1], op.outputs[0]
    if any(t.dtype.numpy not in (np.int8, np.uint8) for t in (a, b, out)) or \
            min((d for t in (a, b, out) for d in t.shape), default=0) < 0:  # a shape known only when run
        return None
    bits = np.arange(256, dtype=np.uint8)  # every operand value, indexed by its bit pattern
    codes = [None] if classes is None else sorted(int(c) for c in np.unique(classes))
    table = np.empty((len(codes), 256, 256), out.dtype.numpy)
    rows = 32  # values of a at a time: the formulation's int64 temporaries of all 65536 pairs set the peak memory
    for first in range(0, 256, rows):
        pairs = [np.broadcast_to(bits[first:first + rows].view(a.dtype.numpy)[:, None], (rows, 256)),
                 np.broadcast_to(bits.view(b.dtype.numpy)[None, :], (rows, 256))]
        for slot, code in enumerate(codes):
            formulation(pairs, table[slot, first:first + rows], code)
    flat = table.reshape(-1)
    # each item's place in the table: its class's block, then the operands' bit patterns
    base = None if classes is None else np.searchsorted(codes, classes).astype(np.int32) << 16
    index = np.empty(out.shape, np.int32)
    high = np.empty(a.shape, np.int32)

    def run(ins, outs):
        np.left_shift(ins[0].view(np.uint8), 8, out=high, dtype=np.int32)
        np.bitwise_or(high, ins[1].view(np.uint8), out=index, dtype=np.int32)
        if base is not None:
            np.add(index, base, out=index)
        np.take(flat, index, out=outs[0])
    return run


@kernel("ADD", "SUB", quantized=True)
def add_sub(op: Op):
    """Both operands are brought to a common scale with 20 (16-bit: 15) bits of headroom, then summed."""
    a, b, out = op.inputs[0], op.inputs[1], op.outputs[0]
    if out.dtype.numpy == np.int16 and op.options.get("pot_scale_int16", True):
        exponents = [power_of_two_exponent(t) for t in (a, b, out)]
        if None not in exponents:
            return _power_of_two_add_sub(op, exponents)
    left_shift = 15 if out.dtype.numpy == np.int16 else 20
    to_common, twice_max = _common_scale(a, b)
    output_real = twice_max / np.float64(np.float32(1 << left_shift) * scale(out))
    output = Requantize.of(output_real, zero_point(out), activation_bounds(op))
    offsets = (zero_point(a), zero_point(b))
    sign = -1 if op.opcode == "SUB" else 1
    # Only int8 ADD runs LiteRT's vectorised loops; SUB and the other types run scalar code.
    vectorised = op.opcode == "ADD" and out.dtype.numpy == np.int8
    loops = _int8_add_loops(a.shape, b.shape, out.shape) if vectorised else None

    def to_common_scale(v, multiplier, shift, loops):
        """``loops``: None (the scalar loop), one loop's code, or each position's."""
        def scalar():
            return multiply_by_quantized_multiplier(v << left_shift, multiplier, shift)

        # The 16-wide loop folds the right shift into the left shift before the high multiply;
        # the 8-wide loop shifts right afterwards, truncating.
        def vector():
            combined = left_shift + int(shift)
            return saturating_rounding_doubling_high_mul(v << combined if combined >= 0 else v >> -combined,
                                                         multiplier)

        def truncated():
            return saturating_rounding_doubling_high_mul(v << left_shift, multiplier) >> -int(shift)
        if loops is None:
            return scalar()
        formulas = (scalar, vector, truncated)
        if np.ndim(loops) == 0:
            return formulas[int(loops)]()
        return np.choose(loops, [f() for f in formulas])

    def combine(values, out, loops):
        x, y = (to_common_scale(v.astype(np.int64) - zp, *params, loops)
                for v, zp, params in zip(values, offsets, to_common))
        output(x + sign * y, out)

    factors = _head_factors(to_common, offsets, left_shift) if a.shape == b.shape else None
    call = int8_add_call(op) if factors is not None else None
    if call is not None:
        return prepared_run(_binary_loops(op), call, 2)
    same = vectorised and factors is not None
    final = Rescale(output_real, zero_point(out), activation_bounds(op), True, 0, 1 << 30) if same else None

    def vector_blocks(values, out):
        """LiteRT's flat int8 ADD loop over whole blocks of 16 (operands of one shape)."""
        x, y = ((v.astype(np.int64) * np.int64(factor) + offset) >> 31 for v, (factor, offset) in zip(values, factors))
        final(x + y, out)

    def formulation(values, out, kind):
        if not same:
            return combine(values, out, kind)
        if np.ndim(kind) == 0:  # one loop's code for every position
            return vector_blocks(values, out) if kind == _VECTOR else combine(values, out, None)
        blocks, rest = np.empty(out.shape, out.dtype), np.empty(out.shape, out.dtype)
        vector_blocks(values, blocks)
        combine(values, rest, None)
        np.copyto(out, np.where(kind == _VECTOR, blocks, rest))
    return _pair_lookup(op, formulation, loops) or (lambda ins, outs: formulation(ins, outs[0], loops))


def _binary_loops(op: Op, row: bool = False):
    """At compile time: the native loops where an int8 binary op of operands of one shape (or, with
    ``row``, a second one of a row of the last axis or one item) may run in native.c's qbinary; None
    otherwise."""
    a, b, out = op.inputs[0], op.inputs[1], op.outputs[0]
    if any(t.dtype.numpy != np.int8 for t in (a, b, out)) or a.shape != out.shape or not (
            b.shape == out.shape or row and out.shape and _row_period(b, out) is not None):
        return None
    return kernel_loops()


def _row_period(b, out) -> int | None:
    """How many items ``b`` repeats along ``out``'s rows: 1 for one item, the last axis for one row of it."""
    size = int(np.prod(b.shape))
    if size == 1:
        return 1
    if b.shape and b.shape[-1] == out.shape[-1] and size == out.shape[-1]:
        return size
    return None


def _output_stage(real, op: Op) -> QStage:
    """qbinary's output stage: ``real`` rescaled with gemmlowp's rounding, onto the output's zero point
    and fused activation."""
    return QStage(*quantize_multiplier(real), np.zeros(1, np.int64), True, zero_point(op.outputs[0]),
                  activation_bounds(op))


def _head_factors(to_common, offsets, left_shift: int) -> list[tuple[int, int]] | None:
    """(factor, offset) of each operand in LiteRT's int8 ADD vector loop (whole blocks of 16 of a flat
    loop over operands of one shape), whose high multiply of the left-shifted operand is floor((v *
    M * 2**combined + 2**30) / 2**31), the zero point folded in; None where a combined shift is negative."""
    combined = [left_shift + int(shift) for _, shift in to_common]
    if min(combined) < 0:
        return None
    return [(int(m) << c, (1 << 30) - zp * (int(m) << c)) for (m, _), c, zp in zip(to_common, combined, offsets)]


def int8_add_call(op: Op, first: int = 0) -> QBinaryCall | None:
    """native.c's qbinary call of an int8 ADD / SUB of operands of one shape, input ``first`` taken as its
    operand a (a residual ADD's convolution result): each operand on the common scale looked up in tables
    of every int8 value, LiteRT's vector loop's formula for the first whole blocks of 16 (ADD only),
    its scalar loop's after them; None where the native loops do not serve."""
    a, b, out = op.inputs[0], op.inputs[1], op.outputs[0]
    if _binary_loops(op) is None or a.shape != b.shape:
        return None
    to_common, twice_max = _common_scale(a, b)
    offsets = (zero_point(a), zero_point(b))
    factors = _head_factors(to_common, offsets, 20)
    if factors is None:
        return None
    values = np.arange(-128, 128, dtype=np.int64)
    vector = [(values * factor + offset) >> 31 for factor, offset in factors]
    scalar = [multiply_by_quantized_multiplier((values - zp) << 20, m, shift)
              for (m, shift), zp in zip(to_common, offsets)]
    sign = -1 if op.opcode == "SUB" else 1
    order = (first, 1 - first)
    tables = np.stack([vector[order[0]], sign * vector[order[1]], scalar[order[0]], sign * scalar[order[1]]])
    size = int(np.prod(out.shape))
    head = size - size % 16 if op.opcode == "ADD" else 0
    output_real = twice_max / np.float64(np.float32(1 << 20) * scale(out))
    return QBinaryCall(op.opcode, size, _output_stage(output_real, op), team_for(size, PER_THREAD_ITEMS), head, tables,
                       head_factors=[factors[i] for i in order] if head else None)


def _squared_difference_refusal(op: Op) -> str | None:
    out = op.outputs[0]
    return None if out.dtype.numpy == np.int8 else f"LiteRT has no {out.dtype.name} SQUARED_DIFFERENCE kernel"


@kernel("SQUARED_DIFFERENCE", quantized=True, refuses=_squared_difference_refusal)
def squared_difference(op: Op):
    """int8 only, as in LiteRT: operands on a common scale with 7 bits of headroom, the squared
    difference rescaled to the output."""
    a, b, out = op.inputs[0], op.inputs[1], op.outputs[0]
    to_common, twice_max = _common_scale(a, b)
    output = Requantize.of(twice_max * twice_max / np.float64(np.float32(1 << 14) * scale(out)),
                           zero_point(out), qrange(out))
    offsets = (zero_point(a), zero_point(b))

    def run(ins, outs):
        x, y = (multiply_by_quantized_multiplier((v.astype(np.int64) - zp) << 7, *params)
                for v, zp, params in zip(ins, offsets, to_common))
        output((x - y) * (x - y), outs[0])
    return _pair_lookup(op, lambda values, out, _: run(values, [out])) or run


def _mul_formula(op: Op):
    """run(ins, outs) of an int8 MUL in numpy, as TFLite computes it."""
    a, b, out = op.inputs[0], op.inputs[1], op.outputs[0]
    offsets = (zero_point(a), zero_point(b))
    output = Requantize.of(scale(a) * scale(b) / scale(out), zero_point(out), activation_bounds(op))

    def run(ins, outs):
        output((ins[0].astype(np.int64) - offsets[0]) * (ins[1].astype(np.int64) - offsets[1]), outs[0])
    return run


@kernel("MUL", quantized=True)
def mul(op: Op):
    a, b, out = op.inputs[0], op.inputs[1], op.outputs[0]
    loops = _binary_loops(op, row=True)
    if loops is not None:
        size = int(np.prod(out.shape))
        call = QBinaryCall("MUL", size, _output_stage(scale(a) * scale(b) / scale(out), op),
                           team_for(size, PER_THREAD_ITEMS), zeros=(zero_point(a), zero_point(b)),
                           period=size if b.shape == out.shape else _row_period(b, out))
        return prepared_run(loops, call, 2)
    run = _mul_formula(op)
    return _pair_lookup(op, lambda values, out, _: run(values, [out])) or run


# --- activations ----------------------------------------------------------------------------

@kernel(*RELU_BOUNDS, quantized=True)
def relu(op: Op):
    """Rescale to the output's parameters, then clamp at the quantized bounds."""
    src, dst = op.inputs[0], op.outputs[0]
    output = Requantize.of(scale(src) / scale(dst), zero_point(dst), clamp_bounds(dst, *RELU_BOUNDS[op.opcode]))
    offset = zero_point(src)

    def run(ins, outs):
        output(ins[0].astype(np.int64) - offset, outs[0])
    return run


def _negative_slope_kernel(op: Op, identity_real, slope_real, slope_values):
    """x >= 0 ? x * identity : x * slope, where slope_values(ins) gives the integer slope factor."""
    src, dst = op.inputs[0], op.outputs[0]
    identity = quantize_multiplier(identity_real)
    slope_multiplier, slope_shift = quantize_multiplier(slope_real)
    # MultiplyByQuantizedMultiplier needs a non-negative significand; a negative slope flips the result.
    sign = np.where(slope_multiplier < 0, -1, 1)
    slope = (np.abs(slope_multiplier), slope_shift)
    offset, out_offset, bounds = zero_point(src), zero_point(dst), qrange(dst)

    def run(ins, outs):
        x = ins[0].astype(np.int64) - offset
        positive = multiply_by_quantized_multiplier(x, *identity)
        negative = sign * multiply_by_quantized_multiplier(x * slope_values(ins), *slope)
        store(outs[0], np.where(x >= 0, positive, negative) + out_offset, *bounds)
    return run


@kernel("LEAKY_RELU", quantized=True)
def leaky_relu(op: Op):
    src, dst = op.inputs[0], op.outputs[0]
    alpha = np.float32(op.options.get("alpha", 0.2))
    return _negative_slope_kernel(op, scale(src) / scale(dst), scale(src) * alpha / scale(dst), lambda ins: 1)


@kernel("PRELU", quantized=True)
def prelu(op: Op):
    src, alpha, dst = op.inputs[0], op.inputs[1], op.outputs[0]
    alpha_offset = zero_point(alpha)
    return _negative_slope_kernel(op, scale(src) / scale(dst), scale(src) * scale(alpha) / scale(dst),
                                  lambda ins: ins[1].astype(np.int64) - alpha_offset)


def _q15_multiplier(real: np.float32) -> tuple[int, int]:
    """A Q15 significand (the Q31 one rounded down to 16 bits) and its exponent."""
    multiplier, exponent = quantize_multiplier(np.float64(real))
    q15 = 0x7FFF if multiplier >= INT32_MAX - (1 << 15) else (int(multiplier) + (1 << 15)) >> 16
    return q15, int(exponent)


@kernel("HARD_SWISH", quantized=True)
def hard_swish(op: Op):
    """x * relu6(x + 3) / 6 in LiteRT's 16-bit fixed point: a 'reluish' factor in [0, 1] times x."""
    src, dst = op.inputs[0], op.outputs[0]
    hires_scale = np.float32(1.0 / 128.0) * scale(src)
    out_multiplier, out_exponent = _q15_multiplier(hires_scale / scale(dst))
    relu_multiplier, relu_exponent = _q15_multiplier(hires_scale / np.float32(3.0 / 32768.0))
    offset, out_offset, bounds = zero_point(src), zero_point(dst), qrange(dst)

    def saturating_left_shift(v, amount):
        return np.clip(v << amount, -(1 << 15), (1 << 15) - 1)

    def run(ins, outs):
        hires = (ins[0].astype(np.int64) - offset) * 128
        preshift_output = saturating_rounding_doubling_high_mul(hires, out_multiplier, bits=16)
        reluish = hires
        if relu_exponent > 0:
            reluish = saturating_left_shift(reluish, relu_exponent - 1)
        reluish = saturating_rounding_doubling_high_mul(reluish, relu_multiplier, bits=16)
        if relu_exponent > 0:
            reluish = saturating_left_shift(reluish, 1)
        elif relu_exponent < 0:
            reluish = rounding_divide_by_pot(reluish, -relu_exponent)
        reluish = (reluish + (1 << 15)) >> 1  # from [-1, 1] to [0, 1]
        product = trunc_div(reluish * preshift_output, np.int64(1 << 15))
        store(outs[0], rounding_divide_by_pot(product, -out_exponent) + out_offset, *bounds)
    return run


_TRANSCENDENTAL = {
    "LOGISTIC": lambda v: np.float32(1) / (np.float32(1) + c_math("exp")(-v)),
    "TANH": lambda v: c_math("tanh")(v),
}
_INT16_KERNELS = {"LOGISTIC": quant_int16.logistic, "TANH": quant_int16.tanh, "SOFTMAX": quant_int16.softmax}


@kernel(*_TRANSCENDENTAL, quantized=True)
def transcendental(op: Op):
    """8- and 16-bit inputs have 256 and 65536 values: the function is tabulated once (8 bits: LiteRT's own
    table; int16: LiteRT's interpolation evaluated at every input) and each item looked up."""
    x = op.inputs[0]
    product = op.options.get("times_input")  # a swish's MUL fused in (fusion.py): one composite table
    activation = op.outputs[0] if product is None else next(t for t in product.inputs if t is not x)
    alone = Op(op.index, op.opcode, [x], [activation])
    if x.dtype.numpy == np.int16:
        activated = every_int16(alone, _INT16_KERNELS[op.opcode](alone))
    else:
        activated = lookup_table(alone, _TRANSCENDENTAL[op.opcode])
    if product is None:
        return _table_run(op, activated)
    lowest = int(np.iinfo(x.dtype.numpy).min)
    values = np.arange(lowest, lowest + activated.size).astype(x.dtype.numpy)  # every input, in table order
    composite = np.empty(activated.size, product.outputs[0].dtype.numpy)
    _mul_formula(product)([values if t is x else activated for t in product.inputs], [composite])
    return _table_run(op, composite)


def every_int16(op: Op, run) -> np.ndarray:
    """An elementwise int16 op's results for every input value, in table order (from -32768), by its
    formulation ``run`` once at compile time: a run then looks each item up (_table_run).  LOGISTIC's
    formulation took ~13 ns an item in numpy (a 32x32x64 tensor 0.83 ms on the 2-core VM)."""
    values = np.arange(-32768, 32768).astype(np.int16)
    table = np.empty(values.size, op.outputs[0].dtype.numpy)
    run([values], [table])
    return table


def _table_run(op: Op, table: np.ndarray):
    """run() taking each int8 / uint8 / int16 input through ``table`` (indexed as table_index does): in
    native.c's qlookup where the native loops serve."""
    src = op.inputs[0]
    same_width = table.itemsize == np.dtype(src.dtype.numpy).itemsize  # qlookup maps items to items as wide
    loops = kernel_loops() if src.shape == op.outputs[0].shape and same_width else None
    if loops is not None:
        size = int(np.prod(src.shape))
        call = LookupCall(table, size, src.dtype.numpy != np.uint8, team_for(size, PER_THREAD_ITEMS))
        return prepared_run(loops, call)

    def run(ins, outs):
        np.take(table, table_index(ins[0]), out=outs[0])
    return run


_SQRT_2_OVER_PI = np.float32(2 / np.sqrt(np.pi) * np.sqrt(0.5))


def _gelu(approximate: bool):
    """LiteRT's float32 GELU: the tanh approximation, or the erfc form that avoids cancellation."""
    half = np.float32(0.5)
    if approximate:
        tanh = c_math("tanh")

        def gelu(v):
            cubic = v + np.float32(0.044715) * v * v * v
            return half * v * (np.float32(1) + tanh(_SQRT_2_OVER_PI * cubic))
        return gelu
    erfc = c_math("erfc")

    def gelu(v):
        return half * v * erfc(v * np.float32(-np.sqrt(0.5)))
    return gelu


@kernel("GELU", quantized=True)
def gelu(op: Op):
    fn = _gelu(bool(op.options.get("approximate", False)))
    if op.inputs[0].dtype.numpy == np.int16:
        return _table_run(op, every_int16(op, quant_int16.table_kernel(op, fn)))
    return _table_run(op, lookup_table(op, fn))


def inverse_sqrt(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """1/sqrt(values) as (Q31 significand, exponent), by LiteRT's five fixed-point Newton steps."""
    v = np.maximum(values.astype(np.int64), 1)
    shift = np.full(v.shape, 11, np.int64)
    while (v >= 1 << 29).any():
        large = v >= 1 << 29
        v, shift = np.where(large, v // 4, v), shift + large
    pairs = (31 - np.frexp(v.astype(np.float64))[1]) // 2 - 1  # normalise into [2**27, 2**29)
    shift -= pairs
    v <<= 2 * pairs

    def times_pot(a, exponent):
        return np.clip(a << exponent, -(1 << 31), INT32_MAX)

    mul = saturating_rounding_doubling_high_mul
    half_input = rounding_divide_by_pot(v >> 1, 1)  # Q3.28
    x = np.full(v.shape, 1 << 28, np.int64)  # 1.0 in Q3.28
    for _ in range(5):
        cube = times_pot(mul(mul(x, x), x), 6)
        x = times_pot(mul((1 << 28) + (1 << 27), x) - mul(half_input, cube), 3)
    x = mul(x, 1518500250)  # times sqrt(2) / 2
    x, shift = np.where(shift < 0, x << np.maximum(-shift, 0), x), np.maximum(shift, 0)
    trivial = values <= 1  # 1/sqrt(1), and 0 treated like it
    return np.where(trivial, INT32_MAX, x), np.where(trivial, 0, -shift)


@kernel("RSQRT", quantized=True)
def rsqrt(op: Op):
    """int8: a 256-entry table of LiteRT's fixed-point inverse square root; int16: its float table."""
    src, dst = op.inputs[0], op.outputs[0]
    if src.dtype.numpy == np.int16:
        ceiling = np.float32(32767) * scale(dst)  # what non-positive inputs map to

        def float_inverse_sqrt(v):
            positive = v > 0
            return np.where(positive, np.float32(1) / np.sqrt(np.where(positive, v, np.float32(1))), ceiling)
        return _table_run(op, every_int16(op, quant_int16.table_kernel(op, float_inverse_sqrt)))
    multiplier, shift = quantize_multiplier(1.0 / np.float64(np.sqrt(scale(src)) * scale(dst)))
    offset, out_offset = zero_point(src), zero_point(dst)
    lo, hi = qrange(dst)
    centred = np.arange(qrange(src)[0], qrange(src)[1] + 1) - offset  # indexed like table_index
    inv_multiplier, inv_shift = inverse_sqrt(centred)
    data = multiply_by_quantized_multiplier(1, inv_multiplier, inv_shift + 20)
    values = multiply_by_quantized_multiplier(data, multiplier, shift - 20) + out_offset
    # A zero input (and below, which LiteRT rejects) saturates.
    table = np.clip(np.where(centred > 0, values, hi), lo, hi).astype(dst.dtype.numpy)

    def run(ins, outs):
        if (ins[0] < offset).any():
            raise ValueError("RSQRT is only defined for inputs at or above the zero point")
        np.take(table, table_index(ins[0]), out=outs[0])
    return run


@kernel("SOFTMAX", quantized=True)
def softmax(op: Op):
    """LiteRT's table softmax: exp of (x - row max) looked up, summed in float32 in order, normalised."""
    src, dst = op.inputs[0], op.outputs[0]
    if src.dtype.numpy == np.int16:
        return _INT16_KERNELS["SOFTMAX"](op)
    beta = np.float32(op.options.get("beta", 1.0))
    # exp_table[d] = exp(input_scale * beta * -d) for a distance d = max - x in [0, 255]
    exp_table = c_math("exp")(-scale(src) * beta * np.arange(256, dtype=np.float32))
    out_scale, out_offset, bounds = scale(dst), zero_point(dst), qrange(dst)
    # LiteRT rounds uint8 probabilities by adding 0.5 and truncating (ignoring the zero point).
    truncate = dst.dtype.numpy == np.uint8
    loops = kernel_loops() if src.dtype.numpy == dst.dtype.numpy == np.int8 and dst.shape else None
    if loops is not None:
        call = QSoftmaxCall(exp_table, int(np.prod(dst.shape)), dst.shape[-1], out_scale, out_offset, bounds)
        return prepared_run(loops, call)

    def run(ins, outs):
        x = ins[0].astype(np.int64)
        exps = exp_table[x.max(axis=-1, keepdims=True) - x]
        total = np.cumsum(exps, axis=-1, dtype=np.float32)[..., -1:]
        inverse = np.float32(1) / (total * out_scale)
        prob = exps * inverse
        if truncate:
            q = (prob + np.float32(0.5)).astype(np.int64)
        else:
            q = round_half_away(prob).astype(np.int64) + out_offset
        store(outs[0], q, *bounds)
    return run


# --- comparisons and integer-only arithmetic -----------------------------------------------

@kernel(*COMPARE, quantized=True)
def compare(op: Op):
    """Operands are compared on a common real scale, as LiteRT does: each offset value, shifted left
    by 8, times its own scale in fixed point (so values that scale to the same number compare equal).
    LiteRT orders int16 operands as stored, whatever their scales; only its int16 EQUAL and
    NOT_EQUAL rescale."""
    fn, (a, b) = COMPARE[op.opcode], op.inputs[:2]
    if a.dtype.numpy == np.int16 and op.opcode not in ("EQUAL", "NOT_EQUAL"):
        return lambda ins, outs: fn(ins[0], ins[1], out=outs[0])
    params = [(zero_point(t), *quantize_multiplier(np.float64(scale(t)))) for t in (a, b)]

    def run(ins, outs):
        x, y = (multiply_by_quantized_multiplier((v.astype(np.int64) - zp) << 8, m, s)
                for v, (zp, m, s) in zip(ins, params))
        fn(x, y, out=outs[0])
    return run


@kernel("FLOOR_DIV", "FLOOR_MOD", quantized=True)
def floor_div_mod(op: Op):
    """LiteRT computes these on the stored integers, whatever their quantization."""
    return arithmetic(op)


def _reciprocal(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LiteRT's GetReciprocal of positive int32 ``x``: (Q0.31 significand of 1 / x normalised, bits over
    one), by gemmlowp's three Newton-Raphson steps from 48/17 - 32/17 d on d = x normalised to [0.5, 1)."""
    over = leading_zeros(x)
    fraction = ((x << over) & 0xFFFFFFFF) - (1 << 31)
    total = fraction + INT32_MAX
    half = trunc_div(total + np.where(total >= 0, 1, -1), 2)
    estimate = 1515870810 + saturating_rounding_doubling_high_mul(half, -1010580540)
    for _ in range(3):
        error = (1 << 29) - saturating_rounding_doubling_high_mul(half, estimate)
        estimate = estimate + np.clip(saturating_rounding_doubling_high_mul(estimate, error) << 2, -(1 << 31), INT32_MAX)
    return np.clip(estimate << 1, -(1 << 31), INT32_MAX), 31 - over


@kernel("DIV", quantized=True)
def div(op: Op):
    """LiteRT's quantized DIV: the offset divisor's fixed-point reciprocal (signs moved onto the
    dividend), times the dividend shifted to full headroom, rescaled by s_a / (s_b * s_out)."""
    a, b, out = op.inputs[0], op.inputs[1], op.outputs[0]
    multiplier, shift = quantize_multiplier(np.float64(scale(a) / (scale(b) * scale(out))))
    offsets, bounds = (zero_point(a), zero_point(b)), activation_bounds(op)

    def run(ins, outs):
        x, y = (v.astype(np.int64) - zp for v, zp in zip(ins, offsets))
        x, y = np.broadcast_arrays(np.where(y < 0, -x, x), np.abs(y))
        if np.any(y == 0):
            raise ValueError("quantized DIV by a value at the divisor's zero point")
        inverse, over = _reciprocal(y)
        headroom = np.where(x >= 0, leading_zeros(x) - 1, leading_zeros(2 * np.abs(x) - 1))  # redundant sign bits
        quotient = saturating_rounding_doubling_high_mul(saturating_rounding_doubling_high_mul(x << headroom, inverse),
                                                         multiplier)
        right = np.maximum(over + headroom - shift, 0)
        # A small dividend needs a right shift of 32 bits or more, which LiteRT's int32 code takes
        # modulo 32 (its rounding mask becomes all ones): reproduced, as the specification.
        wide = right >= 32
        result = np.where(wide, (quotient >> (right & 31)) + (quotient >= 0),
                          rounding_divide_by_pot(quotient, np.where(wide, 0, right)))
        store(outs[0], result + zero_point(out), *bounds)
    return run
