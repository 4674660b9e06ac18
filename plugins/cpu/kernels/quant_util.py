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
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from delegate import Op, Tensor

INT32_MAX = (1 << 31) - 1


def round_half_away(x):
    """C's ``round``: halves go away from zero (numpy's ``rint`` goes to even)."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


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


def trunc_div(a, b):
    """C integer division (rounds toward zero) of int64 arrays."""
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


def saturating_rounding_doubling_high_mul(a, b, bits: int = 32):
    """High half of 2*a*b rounded to nearest (ties away from zero), for ``bits``-wide a and b."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    product = a * b
    half = 1 << (bits - 2)
    nudged = product + np.where(product >= 0, half, 1 - half)
    result = trunc_div(nudged, np.int64(1 << (bits - 1)))
    lowest = -(1 << (bits - 1))
    return np.where((a == lowest) & (b == lowest), -lowest - 1, result)


def rounding_divide_by_pot(x, exponent):
    """x / 2**exponent rounded to nearest, ties away from zero."""
    x = np.asarray(x, np.int64)
    exponent = np.asarray(exponent, np.int64)
    mask = (np.int64(1) << exponent) - 1
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + ((x & mask) > threshold)


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
    """The 64-bit-accumulator variant (16x8 kernels): the significand is first cut to Q15."""
    multiplier = np.asarray(multiplier, np.int64)
    reduced = np.where(multiplier < 0x7FFF0000, (multiplier + (1 << 15)) >> 16, 0x7FFF)
    total = 15 - np.asarray(shift, np.int64)
    return (np.asarray(x, np.int64) * reduced + (np.int64(1) << (total - 1))) >> total


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
