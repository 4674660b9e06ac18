"""16-bit LOGISTIC, TANH, SOFTMAX (and GELU, RSQRT): LiteRT's interpolated lookup tables.

int16 inputs have too many values for a direct table, so LiteRT interpolates
linearly between table entries: sigmoid (which also gives tanh, as
2*sigmoid(2x) - 1) from a 256-entry Q0.16 table, softmax's exp and 1/(1+x)
and other unary functions from 513-entry tables; all tables nudge their
samples so that the interpolation error is balanced between the entries and
the midpoints.
"""

from __future__ import annotations

import numpy as np

from delegate.plugin_api import Op, Tensor

from .quant_util import (
    c_math, leading_zeros, multiply_by_quantized_multiplier, power_of_two_exponent, quantize_multiplier, round_half_away, scale,
    zero_point)


def _sigmoid_table() -> np.ndarray:
    """sigmoid(i / 24) in Q0.16 for i in [0, 256), each sample raised by half the error that linear
    interpolation makes at the midpoint to the next one; the last entry is the saturated 1.0."""
    def sampled(i):
        return 65536.0 / (1.0 + np.exp(-i / 24.0))
    i = np.arange(256.0)
    midpoint_error = sampled(i + 0.5) - (sampled(i) + sampled(i + 1)) / 2
    table = round_half_away(sampled(i) + midpoint_error / 2)
    table[-1] = 65535
    return table.astype(np.int64)


_SIGMOID_Q16 = _sigmoid_table()


def _input_rescale(t: Tensor, pot_shifts: tuple[int, ...]) -> tuple[int, int]:
    """(multiplier, right shift) taking int16 inputs to the table's 1/(3 * 4096) units.

    LiteRT keeps a 15-bit multiplier with as much shift as keeps it above 2**14.  Input
    scales of 2**-(12 - k) for k in ``pot_shifts`` instead run gemmlowp's fixed-point
    routine, which this module does not reproduce.
    """
    exponent = power_of_two_exponent(t)
    if exponent is not None and 12 + exponent in pot_shifts:
        raise ValueError("int16 inputs with a power-of-two scale take LiteRT's gemmlowp path, "
                         "which the quantized cpu kernels do not implement")
    multiplier, shift = np.float64(scale(t)) * 4096.0 * 3.0, 0
    while multiplier <= 32767.0 / 2.0 and shift <= 30:
        shift, multiplier = shift + 1, multiplier * 2.0
    return int(multiplier), shift


def _scaled_input(x: np.ndarray, multiplier: int, shift: int) -> np.ndarray:
    rounding = (1 << (shift - 1)) if shift > 0 else 0
    return (x.astype(np.int64) * multiplier + rounding) >> shift


def _sigmoid_interpolated(magnitude: np.ndarray, fraction_bits: int, saturated: int) -> np.ndarray:
    """Table value at ``magnitude`` (fixed point with ``fraction_bits``), scaled by 2**fraction_bits;
    ``saturated`` past the table's end."""
    index = magnitude >> fraction_bits
    inside = index < 255
    safe = np.where(inside, index, 0)
    low, high = _SIGMOID_Q16[safe], _SIGMOID_Q16[safe + 1]
    frac = magnitude & ((1 << fraction_bits) - 1)
    return np.where(inside, (low << fraction_bits) + frac * (high - low), saturated)


def logistic(op: Op):
    multiplier, shift = _input_rescale(op.inputs[0], (0,))

    def run(ins, outs):
        v = _scaled_input(ins[0], multiplier, shift)
        table = _sigmoid_interpolated(np.abs(v), 9, 0x7FFF << 10)
        result = np.where(v >= 0, table + (1 << 9), (1 << 25) - table + (1 << 9) - 1)
        np.copyto(outs[0], result >> 10, casting="unsafe")
    return run


def tanh(op: Op):
    multiplier, shift = _input_rescale(op.inputs[0], (0, 1))

    def run(ins, outs):
        v = _scaled_input(ins[0], multiplier, shift)
        table = _sigmoid_interpolated(np.abs(v), 8, 0xFFFF << 8)
        result = np.where(v >= 0, table - (1 << 23) + (1 << 7), -table + (1 << 23) + (1 << 7) - 1)
        np.copyto(outs[0], result >> 8, casting="unsafe")
    return run


def interpolation_table(fn, input_scale: float, input_zero_point: int, output_scale: float,
                        output_zero_point: int = 0, precision=np.float64) -> np.ndarray:
    """LiteRT's 513-entry int16 table of ``fn``: samples nudged by half their midpoint error.

    ``precision`` is the float type LiteRT builds that table in (double for softmax's tables,
    float32 for the per-op ones); ``fn`` receives and returns arrays of it.
    """
    f = precision
    input_min = f(input_scale) * f(-32768 - input_zero_point)
    input_max = f(input_scale) * f(32767 - input_zero_point)
    output_range = f(output_scale) * f(32767 - output_zero_point) - f(output_scale) * f(-32768 - output_zero_point)
    inverse = f(65536) / output_range
    steps = 512
    step = (input_max - input_min) / f(steps)
    i = np.arange(steps).astype(f)
    value = fn(input_min + i * step).astype(f)
    middle = fn(input_min + i * step + step / f(2)).astype(f)
    following = fn(input_min + (i + f(1)) * step).astype(f)
    sample = round_half_away(value * inverse)
    interpolated = round_half_away((following * inverse + sample) / f(2))
    bias = round_half_away((interpolated - round_half_away(middle * inverse)) / f(2))
    last = round_half_away(fn(np.atleast_1d(input_max)).astype(f) * inverse)
    return np.clip(np.append(sample - bias, last), -32768, 32767).astype(np.int64)


def table_kernel(op: Op, fn):
    """A unary int16 op computed through LiteRT's float32 interpolation table of ``fn``."""
    src, dst = op.inputs[0], op.outputs[0]
    table = interpolation_table(fn, scale(src), zero_point(src), scale(dst), zero_point(dst), np.float32)

    def run(ins, outs):
        np.copyto(outs[0], table_lookup(ins[0].astype(np.int64), table), casting="unsafe")
    return run


def table_lookup(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Interpolated lookup: the high 9 bits pick the entry, the low 7 the position to the next."""
    index = 256 + (x >> 7)
    base = table[index]
    return base + (((table[index + 1] - base) * (x & 0x7F) + 64) >> 7)


_RANGE = 65535.0
# exp over [-10, 0] and 1/(1+x) over [0, 1], both onto a symmetric [-1, 1] output range.
_EXP_TABLE = interpolation_table(c_math("exp", np.float64), 10.0 / _RANGE, 32767, 2.0 / _RANGE)
_RECIPROCAL_TABLE = interpolation_table(lambda v: 1.0 / (1.0 + v), 1.0 / _RANGE, -32768, 2.0 / _RANGE)


def softmax(op: Op):
    """exp of the distance to the row maximum over [-10, 0], normalised by a 1/(1+x) table."""
    beta = np.float32(op.options.get("beta", 1.0))
    multiplier, shift = quantize_multiplier(np.float64(scale(op.inputs[0]) * beta) / (10.0 / _RANGE))

    def run(ins, outs):
        x = ins[0].astype(np.int64)
        diff = multiply_by_quantized_multiplier(x - x.max(axis=-1, keepdims=True), multiplier, shift)
        exps = table_lookup(np.clip(diff + 32767, -32768, 32767), _EXP_TABLE)
        total = exps.sum(axis=-1, keepdims=True)
        headroom = leading_zeros(total)
        normalised = ((total << (headroom - 1)) + (1 << 13)) >> 14
        centred = np.clip(normalised - (1 << 15) - (1 << 16), -32768, 32767)
        reciprocal = table_lookup(centred, _RECIPROCAL_TABLE)
        right = 31 - headroom
        result = (exps * reciprocal + (np.int64(1) << (right - 1))) >> right
        np.copyto(outs[0], np.clip(result, 0, 32767), casting="unsafe")
    return run
