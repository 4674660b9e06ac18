"""The float view: how a GPU partition sees constants and quantized tensors.

GPU kernels compute in floating point.  Constants are turned into float32
once, at compile time: float16 weights are widened, quantized weights and
biases are dequantized (per tensor or per channel), and a DEQUANTIZE or
DENSIFY whose input is a constant is folded away (``delegate.passes``
computes it), so its output is just another constant.
Quantized activations (int8/uint8/int16 with a scale) are represented by the
real values they stand for; the GPU rounds them back onto their quantization
grid after each op (see :func:`activation_quant`) so results track the
integer kernels, and the partition boundary converts to and from the integers.
"""

from __future__ import annotations

import numpy as np

from ..ir import DType, Op, Quantization, Tensor
from ..passes import constant, folds_constant, known_at_compile_time

_QUANT_TYPES = (DType.int8, DType.uint8, DType.int16)
_QUANT_BIAS_TYPES = (DType.int32, DType.int64)
_FOLDABLE_TYPES = (DType.float16, DType.float32) + _QUANT_TYPES


def dequantize(data: np.ndarray, quant: Quantization) -> np.ndarray:
    """Real values of quantized ``data``: ``scale * (q - zero_point)``, per channel along ``quant.axis``."""
    data = np.asarray(data)
    scale = np.asarray(quant.scale, np.float32)
    zero = np.asarray(quant.zero_point, np.float32)
    if quant.per_channel:
        shape = [1] * data.ndim
        shape[quant.axis] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return ((data.astype(np.float32) - zero) * scale).astype(np.float32)


def is_quantized(t: Tensor | None) -> bool:
    """An integer tensor standing for real values through a scale and zero point."""
    return t is not None and t.quantization is not None and t.dtype in _QUANT_TYPES


def is_folded_dequantize(op: Op) -> bool:
    """A DEQUANTIZE or DENSIFY of a constant (or of another such op): computed once at compile time, never run."""
    return folds_constant(op) and op.inputs[0].dtype in _FOLDABLE_TYPES


def needs_quantized_support(t: Tensor) -> bool:
    """Whether reading ``t`` as float needs the float view of quantized data (not just widening)."""
    if t.is_constant:
        return t.dtype in _QUANT_TYPES or (t.quantization is not None and t.dtype in _QUANT_BIAS_TYPES)
    src = t.producer
    if src is not None and is_folded_dequantize(src):
        return needs_quantized_support(src.inputs[0])
    return is_quantized(t)


def has_constant_value(t: Tensor | None) -> bool:
    """Whether ``constant_value(t)`` has a value, computing none (support checks asked for the value and
    dequantized every weight: 34 of pose_landmark_full's 153 ms of capabilities here)."""
    if not known_at_compile_time(t):
        return False
    return (t.quantization is not None and t.dtype in _QUANT_TYPES + _QUANT_BIAS_TYPES) or t.dtype.is_float


def constant_value(t: Tensor | None) -> np.ndarray | None:
    """float32 value of a constant operand (weights, bias, alpha), or None when it is computed at run time.

    Follows folded DEQUANTIZE and DENSIFY ops, so weights stored as float16, int8 or sparse come
    back as dense float32 whichever partition those ops were placed in.
    """
    data = constant(t)
    if data is None:
        return None
    if t.quantization is not None and t.dtype in _QUANT_TYPES + _QUANT_BIAS_TYPES:
        return dequantize(data, t.quantization)
    return data.astype(np.float32) if t.dtype.is_float else None


def int_values(t: Tensor | None) -> list[int] | None:
    """Integer parameters held in a constant (axes, paddings, sizes), or None when not constant."""
    if t is None or not t.is_constant or t.dtype not in (DType.int32, DType.int64):
        return None
    return [int(v) for v in np.asarray(t.data).ravel()]


def activation_quant(t: Tensor) -> tuple[float, float, float, float] | None:
    """(scale, zero point, qmin, qmax) of a per-tensor quantized activation, else None.

    The float view rounds such a tensor onto its grid after the op that
    produces it, the way an integer kernel would.
    """
    if not is_quantized(t) or t.quantization.per_channel:
        return None
    info = np.iinfo(t.dtype.numpy)
    return (float(t.quantization.scale[0]), float(t.quantization.zero_point[0]), float(info.min),
            float(info.max))


def to_float_view(array: np.ndarray, t: Tensor) -> np.ndarray:
    """Host value of ``t`` -> the float32 values the GPU computes on."""
    if is_quantized(t):
        return dequantize(array, t.quantization)
    return np.asarray(array, np.float32)


def from_float_view(values: np.ndarray, dtype: DType, quant: Quantization | None) -> np.ndarray:
    """float32 values computed on the GPU -> the host value of a tensor of ``dtype``."""
    if dtype in _QUANT_TYPES and quant is not None:
        info = np.iinfo(dtype.numpy)
        scaled = values / quant.scale[0]
        q = np.trunc(scaled + np.copysign(0.5, scaled)) + quant.zero_point[0]  # ties away from zero, as TFLite
        return np.clip(q, info.min, info.max).astype(dtype.numpy)
    if dtype is DType.bool:
        return values != 0
    return values.astype(dtype.numpy)
