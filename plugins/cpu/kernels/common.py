"""Helpers shared by the CPU kernels."""

from __future__ import annotations

from typing import Callable

import numpy as np


def activation(name: str | None) -> Callable[[np.ndarray], None] | None:
    """In-place fused activation (TFLite ``fused_activation_function``), or None for NONE."""
    if name in (None, "NONE"):
        return None
    if name == "RELU":
        return lambda x: np.maximum(x, 0, out=x)
    if name == "RELU6":
        return lambda x: np.clip(x, 0, 6, out=x)
    if name == "RELU_N1_TO_1":
        return lambda x: np.clip(x, -1, 1, out=x)
    if name == "TANH":
        return lambda x: np.tanh(x, out=x)
    if name == "SIGN_BIT":
        return lambda x: np.copyto(x, np.signbit(x).astype(x.dtype))
    raise ValueError(f"unsupported fused activation {name!r}")
