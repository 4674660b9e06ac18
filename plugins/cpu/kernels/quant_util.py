"""Fixed-point arithmetic of TFLite's integer kernels, vectorised over numpy int64 arrays.

TFLite rescales integer accumulators by a real factor encoded as a Q31
significand and a power-of-two exponent (``QuantizeMultiplier``).  Its scalar
code applies it with gemmlowp's two roundings (a saturating rounding doubling
high multiply, then a rounding right shift, ties away from zero), while its
vectorised loops (NEON, which LiteRT's x86 build emulates with SSE) and the
GEMM library behind CONV_2D and FULLY_CONNECTED (ruy) round the final shift's
ties upward.  Matching LiteRT to the last bit means reproducing those exact
steps, not computing ``round(x * scale)``; every helper here takes int64 arrays
holding int32-range values, so no step can overflow.  Scale arithmetic that
LiteRT does in float32 is done in float32 too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from delegate.plugin_api import Op, Tensor

from .common import scratch
from .native import kernel_loops
from .parallel import native_team

INT32_MAX = (1 << 31) - 1


def round_half_away(x):
    """C's ``round``: halves go away from zero (numpy's ``rint`` goes to even)."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def int32_conversion_plus(values: np.ndarray, offset: int) -> np.ndarray:
    """``static_cast<int32_t>(value) + offset`` as LiteRT's kernels compute it on x86, for rounded float
    ``values``: NaN, infinities and values outside int32 convert to int32's least value, and the sum wraps
    (int64 results, to be clamped)."""
    wild = ~(np.abs(values) < 2.0 ** 31)
    total = np.where(wild, -2.0 ** 31, values).astype(np.int64) + offset
    return (total + 2 ** 31) % 2 ** 32 - 2 ** 31


def quantize_multiplier(real) -> tuple[np.ndarray, np.ndarray]:
    """(Q31 significand, exponent) with real == significand * 2**(exponent - 31), elementwise."""
    real = np.asarray(real, np.float64)
    fraction, exponent = np.frexp(real)
    fixed = round_half_away(fraction * (1 << 31)).astype(np.int64)
    exponent = exponent.astype(np.int64)
    carry = fixed == (1 << 31)
    fixed = np.where(carry, fixed // 2, fixed)
    exponent = exponent + carry
    tiny = exponent < -31  # flushed to zero rather than shifted out completely
    return np.where(tiny, 0, fixed), np.where(tiny, 0, exponent)


def leading_zeros(x) -> np.ndarray:
    """Leading zero bits of non-negative int32 values held in int64 (32 for zero)."""
    return 32 - np.frexp(np.asarray(x).astype(np.float64))[1].astype(np.int64)


def trunc_div(a, b):
    """C integer division (rounds toward zero) of int64 arrays."""
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


def saturating_rounding_doubling_high_mul(a, b, bits: int = 32):
    """High half of 2*a*b rounded to nearest (ties up), for ``bits``-wide a and b.

    gemmlowp nudges the product by half or by 1 - half, by its sign, then truncates
    toward zero: in both cases that is floor((a*b + half) / 2**(bits-1)), one shift.
    Only lowest * lowest saturates.
    """
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    result = (a * b + (1 << (bits - 2))) >> (bits - 1)
    lowest = -(1 << (bits - 1))
    small, large = sorted((a, b), key=np.size)
    if np.any(small == lowest) and np.any(large == lowest):
        result = np.where((a == lowest) & (b == lowest), -lowest - 1, result)
    return result


def rounding_divide_by_pot(x, exponent):
    """x / 2**exponent rounded to nearest, ties away from zero: floor((x + half - [x < 0]) / 2**exponent)
    for positive exponents (half = 2**(exponent-1)), x itself for zero."""
    x = np.asarray(x, np.int64)
    exponent = np.asarray(exponent, np.int64)
    negative = x < 0
    if exponent.ndim or exponent == 0:
        negative &= exponent > 0
    return (x + ((np.int64(1) << exponent) >> 1) - negative) >> exponent


def multiply_by_quantized_multiplier(x, multiplier, shift):
    """TFLite's ``MultiplyByQuantizedMultiplier``: x * M * 2**shift with gemmlowp's double rounding."""
    shift = np.asarray(shift, np.int64)
    left = np.maximum(shift, 0)
    scaled = saturating_rounding_doubling_high_mul(np.asarray(x, np.int64) << left, multiplier)
    return rounding_divide_by_pot(scaled, np.maximum(-shift, 0))


def multiply_half_up(x, multiplier, shift):
    """The vector form (NEON ``vqrdmulh`` + ``vrshl``, ruy's x86 kernels): the final shift rounds ties up."""
    shift = np.asarray(shift, np.int64)
    scaled = saturating_rounding_doubling_high_mul(np.asarray(x, np.int64) << np.maximum(shift, 0), multiplier)
    right = np.maximum(-shift, 0)
    return (scaled + ((np.int64(1) << right) >> 1)) >> right


def vector_lanes(length: int, lanes: int, shape=None) -> np.ndarray:
    """Which of ``length`` positions a vector loop of ``lanes`` covers (whole blocks only; the rest
    fall to the scalar tail), optionally reshaped onto the tensor they index."""
    covered = np.arange(length) < length - length % lanes
    return covered if shape is None else covered.reshape(shape)


def lane_rounding(vector: np.ndarray):
    """Rescale as LiteRT's vectorised output loops do: positions in ``vector`` (broadcast against
    the accumulators) take the vector rounding, the scalar tail gemmlowp's."""
    def rounding(x, multiplier, shift):
        return np.where(vector, multiply_half_up(x, multiplier, shift),
                        multiply_by_quantized_multiplier(x, multiplier, shift))
    return rounding


def multiply_wide(x, multiplier, shift):
    """The 64-bit-accumulator variant (16x8 kernels): the significand is first cut to Q15, and the result is
    LiteRT's int32 (its cast wraps a result past int32: an int64 bias of 2^40 made a 16x8 convolution's outputs
    wrap there)."""
    multiplier = np.asarray(multiplier, np.int64)
    reduced = np.where(multiplier < 0x7FFF0000, (multiplier + (1 << 15)) >> 16, 0x7FFF)
    total = 15 - np.asarray(shift, np.int64)
    return wrap32((np.asarray(x, np.int64) * reduced + (np.int64(1) << (total - 1))) >> total)


# --- tensor parameters ----------------------------------------------------------------------

def scale(t: Tensor) -> np.float32:
    return np.float32(t.quantization.scale[0])


def scales(t: Tensor) -> np.ndarray:
    """Per-channel (or one-element) float32 scales."""
    return np.asarray(t.quantization.scale, np.float32)


def zero_point(t: Tensor | None) -> int:
    q = None if t is None else t.quantization
    return 0 if q is None or q.zero_point.size == 0 else int(q.zero_point[0])


def qrange(t: Tensor) -> tuple[int, int]:
    info = np.iinfo(t.dtype.numpy)
    return int(info.min), int(info.max)


def quantize_scalar(value: float, t: Tensor) -> int:
    """A real value in ``t``'s quantized domain, rounded the way TFLite rounds it (float32)."""
    return zero_point(t) + int(round_half_away(np.float32(value) / scale(t)))


def power_of_two_exponent(t: Tensor) -> int | None:
    """log2 of ``t``'s scale when it is a power of two (within LiteRT's float32 tolerance), else None."""
    log2 = np.log(scale(t)) * np.float32(1.0 / np.log(2.0))
    rounded = round_half_away(log2)
    return int(rounded) if abs(log2 - rounded) < 1e-3 else None


# Real-valued clamps of the ReLU family, as ops and as fused activations.
RELU_BOUNDS = {"RELU": (0.0, None), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0), "RELU_0_TO_1": (0.0, 1.0)}


def clamp_bounds(t: Tensor, lower: float | None = None, upper: float | None = None) -> tuple[int, int]:
    """[min, max] of ``t``'s integer type, narrowed to the real bounds given (quantized first)."""
    lo, hi = qrange(t)
    if lower is not None:
        lo = max(lo, quantize_scalar(lower, t))
    if upper is not None:
        hi = min(hi, quantize_scalar(upper, t))
    return lo, hi


def activation_bounds(op: Op) -> tuple[int, int]:
    """The fused activation of ``op`` as a clamp on its output's quantized values."""
    name = op.options.get("fused_activation_function", "NONE")
    if name not in ("NONE", None) and name not in RELU_BOUNDS:
        raise ValueError(f"fused activation {name} has no quantized form")
    return clamp_bounds(op.outputs[0], *RELU_BOUNDS.get(name, (None, None)))


def store(out: np.ndarray, values: np.ndarray, lo: int, hi: int) -> None:
    """Clamp to [lo, hi] and write into the output buffer of the narrow integer type."""
    np.copyto(out, np.clip(values, lo, hi), casting="unsafe")


@dataclass(frozen=True)
class Requantize:
    """acc -> clamp(rescale(acc) + zero_point): the output stage of every accumulating kernel.

    ``multiplier``/``shift`` may be per-channel arrays over the last axis; ``rounding`` picks the
    multiply that the LiteRT kernel in question uses.
    """

    multiplier: np.ndarray
    shift: np.ndarray
    zero_point: int
    lo: int
    hi: int
    rounding: object = multiply_by_quantized_multiplier

    @classmethod
    def of(cls, real, zero_point: int, bounds: tuple[int, int], rounding=multiply_by_quantized_multiplier):
        multiplier, shift = quantize_multiplier(real)
        return cls(multiplier, shift, zero_point, bounds[0], bounds[1], rounding)

    def __call__(self, acc: np.ndarray, out: np.ndarray) -> None:
        store(out, self.rounding(acc, self.multiplier, self.shift) + self.zero_point, self.lo, self.hi)

    def channels(self, start: int, stop: int) -> Requantize:
        """The stage of output channels start..stop (for per-channel multipliers)."""
        if np.ndim(self.multiplier) == 0:
            return self
        return replace(self, multiplier=self.multiplier[start:stop], shift=self.shift[start:stop])


class Rescale:
    """The output stage of the convolutions and fully connected layers in one multiply, add and shift.

    Both fixed-point rescalings LiteRT applies are a single rounded division: the
    doubling high multiply with its sign-dependent nudge and truncation is
    floor((acc * M + 2**30) / 2**31), a following rounding shift by r adds 2**(r-1)
    before its floor (less one for negative values where ties go away from zero),
    and nested floors of power-of-two divisions are one floor.  With the bias and the
    output zero point folded in, per output channel:

        out = clamp((acc * M + K - tie) >> S)

    where ``tie`` is nonzero only on the channels ``away`` marks (ties away from zero),
    for negative products.  Channels are brought to one shift (scaling M and K) when
    int64 has room for ``acc_bound`` (the largest accumulator magnitude) times M.  The
    constants of few channels are also laid out along rows of ``row_pixels`` pixels, so
    that whole output rows run as one long inner loop.
    """

    def __init__(self, real, zero_point: int, bounds: tuple[int, int], away, bias, acc_bound: int,
                 row_pixels: int = 1):
        fixed, exponent = quantize_multiplier(np.atleast_1d(real))
        channels = max(fixed.size, np.size(bias))
        bias = [int(b) for b in np.broadcast_to(np.asarray(bias, np.int64), channels)]
        rights = [max(-int(e), 0) for e in np.broadcast_to(exponent, channels)]
        multipliers = [int(f) << max(int(e), 0) for f, e in zip(np.broadcast_to(fixed, channels),
                                                                np.broadcast_to(exponent, channels))]
        away = np.broadcast_to(np.asarray(away, bool), channels)
        self.lo, self.hi, self.channels = bounds[0], bounds[1], channels

        def constants(scale_of):
            offsets = [((1 << 30) + (1 << (30 + r) if r else 0) + b * m + (zero_point << (31 + r))) * scale_of(r)
                       for r, m, b in zip(rights, multipliers, bias)]
            largest = max((acc_bound + abs(b)) * m * scale_of(r) + abs(k) + (1 << 31) * scale_of(r)
                          for r, m, b, k in zip(rights, multipliers, bias, offsets))
            return offsets, largest < 1 << 63

        common = max(rights)
        offsets, fits = constants(lambda r: 1 << (common - r))
        if fits:
            def scale_of(r):
                return 1 << (common - r)
            shift = np.int64(31 + common)
        else:
            offsets, fits = constants(lambda r: 1)
            if not fits:
                raise ValueError("accumulators too wide for an int64 rescale")

            def scale_of(r):
                return 1
            shift = np.array([31 + r for r in rights], np.int64)
        multiplier = np.array([m * scale_of(r) for r, m in zip(rights, multipliers)], np.int64)
        # A tie goes away from zero when acc * M < -2**30, i.e. acc below ceil(-2**30 / M).
        ties = [bool(a and m and r) for a, m, r in zip(away, multipliers, rights)]
        tie_below = np.array([-((1 << 30) // m) - b if t else -(1 << 62) for t, m, b in zip(ties, multipliers, bias)],
                             np.int64)
        tie = np.array([(1 << 31) * scale_of(r) if t else 0 for t, r in zip(ties, rights)], np.int64)
        self.rounds_away = any(ties)
        self.per_channel = (multiplier, np.array(offsets, np.int64), shift) + ((tie_below, tie) if any(ties) else ())
        self.row_pixels = row_pixels if channels < 128 else 1  # many channels: inner loops long enough
        self.per_row = tuple(np.tile(v, self.row_pixels) if v.ndim else v for v in self.per_channel)
        self.loops, self.threads = kernel_loops(), native_team()

    def __call__(self, acc: np.ndarray, out: np.ndarray, u0: int = 0, u1: int | None = None) -> None:
        """``acc`` (exact integers, any numeric dtype) for output channels u0..u1 -> ``out``: in the
        native loops where they serve, else in numpy."""
        u1 = self.channels if u1 is None else u1
        whole = (u0, u1) == (0, self.channels)
        if self.loops is not None and self.loops.rescale(
                acc, self.per_channel if whole else tuple(v[u0:u1] if v.ndim else v for v in self.per_channel),
                (self.lo, self.hi), out, self.threads):
            return
        if u1 - u0 == self.channels and acc.ndim > 1 and acc.shape[-2] == self.row_pixels:
            acc = acc.reshape(*acc.shape[:-2], -1)
            out = out.reshape(acc.shape)
            constants = self.per_row
        else:
            constants = tuple(v[u0:u1] if v.ndim else v for v in self.per_channel)
        multiplier, offset, shift = constants[:3]
        exact = scratch("rescale_acc", acc.shape, np.int32)
        np.copyto(exact, acc, casting="unsafe")
        product = scratch("rescale", acc.shape, np.int64)
        np.multiply(exact, multiplier, out=product)
        product += offset
        if self.rounds_away:
            tie_below, tie = constants[3:]
            product -= np.less(exact, tie_below) * tie
        np.right_shift(product, shift, out=product)
        np.clip(product, self.lo, self.hi, out=out, casting="unsafe")


@dataclass(frozen=True)
class RescaleInDouble:
    """acc -> clamp(round(acc * real) + zero_point) in double precision, as a few reference kernels do."""

    real: np.ndarray
    zero_point: int
    lo: int
    hi: int

    def __call__(self, acc: np.ndarray, out: np.ndarray) -> None:
        rescaled = round_half_away(acc.astype(np.float64) * self.real).astype(np.int64)
        store(out, rescaled + self.zero_point, self.lo, self.hi)

    def channels(self, start: int, stop: int) -> RescaleInDouble:
        """The stage of output channels start..stop."""
        return self if np.ndim(self.real) == 0 else replace(self, real=self.real[start:stop])


@lru_cache(maxsize=None)
def c_math(name: str, precision=np.float32):
    """The C library's ``name`` (its ``f`` variant for float32), elementwise over an array.

    LiteRT builds its lookup tables with these functions; calling the same ones keeps the
    tables identical, where numpy's own loops may differ in the last ulp.  Without a C
    math library, the double-precision result rounded to ``precision`` stands in.
    """
    library = ctypes.util.find_library("m")
    symbol = name + "f" if precision is np.float32 else name
    c_type = ctypes.c_float if precision is np.float32 else ctypes.c_double
    fn = getattr(ctypes.CDLL(library), symbol, None) if library else None
    if fn is None:
        fallback = getattr(np, name, None) or np.vectorize(getattr(math, name), otypes=[np.float64])
        return lambda v: fallback(np.asarray(v, np.float64)).astype(precision)
    fn.restype, fn.argtypes = c_type, [c_type]
    ufunc = np.frompyfunc(fn, 1, 1)
    return lambda v: ufunc(np.asarray(v, precision).astype(np.float64)).astype(precision)


def lookup_table(op: Op, fn) -> np.ndarray:
    """256-entry table of a unary op on int8/uint8, built in float32 like LiteRT's LUTPopulate."""
    src, dst = op.inputs[0], op.outputs[0]
    lo, hi = qrange(src)
    q = np.arange(lo, hi + 1, dtype=np.int64)
    real = scale(src) * (q - zero_point(src)).astype(np.float32)
    with np.errstate(over="ignore"):
        transformed = fn(real.astype(np.float32)).astype(np.float32)
    rescaled = round_half_away(transformed * (np.float32(1) / scale(dst)))
    values = (rescaled + np.float32(zero_point(dst))).astype(np.int64)
    return np.clip(values, *qrange(dst)).astype(dst.dtype.numpy)


def table_index(x: np.ndarray) -> np.ndarray:
    """Index of each int8/uint8 value into a table that starts at the type's minimum."""
    return x.astype(np.int64) - np.iinfo(x.dtype).min


# --- gemmlowp's int16 fixed-point logistic and tanh ------------------------------------------
# The integer LSTM squashes its int16 gates with gemmlowp's FixedPoint<int16_t, bits> functions
# (Q<bits>.<15-bits> in, Q0.15 out).  int16 sums and negations there wrap; with only 65536
# inputs each function is evaluated once over all of them and used as a table.

INT16_ONE = (1 << 15) - 1


def wrap16(x):
    """C's cast to int16: values wrap around (gemmlowp's int16 sums, CwiseMul's results)."""
    return ((np.asarray(x, np.int64) + (1 << 15)) & 0xFFFF) - (1 << 15)


def wrap32(x):
    """C's cast to int32, as int64: values wrap around (LiteRT's int32 sums and its 64-bit rescale's cast)."""
    return ((np.asarray(x, np.int64) + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def _mul16(a, b):
    return saturating_rounding_doubling_high_mul(a, b, bits=16)


def _constant16(raw32: int) -> int:
    """A gemmlowp constant written as a Q0.31-style int32, rounded to its int16 form."""
    return int(rounding_divide_by_pot(np.int64(raw32), 16))


def _saturating_shift_left16(x, exponent: int):
    if exponent == 0:
        return x
    limit = (1 << (15 - exponent)) - 1
    return np.where(x > limit, INT16_ONE, np.where(x < -limit, -(1 << 15), x << exponent))


def _exp_quarter16(a):
    """exp(a) for a in [-1/4, 0), Q0.15: gemmlowp's Taylor expansion around -1/8."""
    constant = _constant16(1895147668)
    x = wrap16(a + (1 << 12))
    x2 = _mul16(x, x)
    x3 = _mul16(x2, x)
    x4 = _mul16(x2, x2)
    poly = rounding_divide_by_pot(wrap16(_mul16(wrap16(rounding_divide_by_pot(x4, 2) + x3),
                                                 _constant16(715827883)) + x2), 1)
    return np.clip(constant + _mul16(constant, wrap16(x + poly)), -(1 << 15), INT16_ONE)


def _exp_negative16(a, bits: int):
    """exp(a) for a <= 0 given in Q<bits>: the quarter-interval part, then a barrel of exp(-2**k)."""
    fraction = 15 - bits
    quarter = 1 << (fraction - 2)
    offset = wrap16((a & (quarter - 1)) - quarter)
    result = _exp_quarter16(_saturating_shift_left16(offset, bits))
    remainder = wrap16(offset - a)
    for exponent, multiplier in ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
                                 (2, 39332535), (3, 720401), (4, 242)):
        if bits > exponent:
            hit = (remainder & (1 << (fraction + exponent))) != 0
            result = np.where(hit, _mul16(result, _constant16(multiplier)), result)
    if bits > 5:
        result = np.where(a < _constant16(-(1 << (36 - bits))), 0, result)
    return np.where(a == 0, INT16_ONE, result)


def _newton_reciprocal16(a):
    """x ~ 1 / (1 + a) in Q2.13 for a in (0, 1) in Q0.15: three Newton-Raphson steps from 48/17 - 32/17 d."""
    half_denominator = (a + INT16_ONE + 1) // 2  # RoundingHalfSum of non-negative values
    one = 1 << 13
    x = wrap16(_constant16(1515870810) + _mul16(half_denominator, _constant16(-1010580540)))
    for _ in range(3):
        x = wrap16(x + _saturating_shift_left16(_mul16(x, wrap16(one - _mul16(half_denominator, x))), 2))
    return x


def int16_table(values) -> np.ndarray:
    """``values(a)`` over every int16 a, as an int16 table indexed by a + 32768, computed a block at a time
    (the int64 temporaries of all 65536 at once, a dozen of them, set the peak memory of small models)."""
    table = np.empty(1 << 16, np.int16)
    for start in range(0, 1 << 16, TABLE_BLOCK):
        a = np.arange(start - (1 << 15), start + TABLE_BLOCK - (1 << 15), dtype=np.int64)
        table[start:start + TABLE_BLOCK] = values(a)
    return table


TABLE_BLOCK = 4096


@lru_cache(maxsize=None)
def gemmlowp_logistic16(bits: int) -> np.ndarray:
    """logistic over every int16 input in Q<bits>, as int16 Q0.15 indexed by value + 32768."""
    def values(a):
        positive = a > 0
        magnitude = np.where(positive, a, wrap16(-a))
        if_positive = _saturating_shift_left16(_newton_reciprocal16(_exp_negative16(wrap16(-magnitude), bits)), 1)
        result = np.where(positive, if_positive, wrap16(INT16_ONE - if_positive))
        return np.where(a == 0, 1 << 14, result)
    return int16_table(values)


@lru_cache(maxsize=None)
def gemmlowp_tanh16(bits: int) -> np.ndarray:
    """tanh over every int16 input in Q<bits>, as int16 Q0.15 indexed by value + 32768."""
    def values(a):
        negative = a < 0
        n = np.where(negative, a, wrap16(-a))
        t = _saturating_shift_left16(wrap16(_newton_reciprocal16(_exp_negative16(n, bits + 1)) - (1 << 13)), 2)
        return np.where(a == 0, 0, np.where(negative, wrap16(-t), t))
    return int16_table(values)
