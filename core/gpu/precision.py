"""The precision a GPU partition runs in: one choice for both backends, from the request and the device.

fp32 unless fp16 is requested; with fp16, half storage and half arithmetic where the device has
half arithmetic, else half storage alone where the dialect can convert on load and store (OpenCL's
vload_half), else fp32.  Each dialect says what its half arithmetic covers (``half_math``), and the
device feature that decides it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Precision:
    """Storage and arithmetic of a partition, and why they were chosen."""

    name: str  # "fp32" | "fp16" | "fp16 storage"
    storage: str  # "f32" | "f16": the plan's storage type
    half_math: bool
    reason: str

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float16 if self.storage == "f16" else np.float32)


def choose_precision(requested: str, feature: str, has_feature: bool, half_math: str,
                     storage_only: str | None = None) -> Precision:
    """The precision for ``requested`` on a device with (or without) ``feature``, its half arithmetic.

    ``half_math`` says what runs in half precision when the device has the feature; ``storage_only``,
    for a dialect that can store halves without it, how it does so (None: it cannot).
    """
    if requested == "fp16" and has_feature:
        return Precision("fp16", "f16", True, f"fp16 allowed and the device has {feature}: {half_math}")
    if requested == "fp16" and storage_only:
        return Precision("fp16 storage", "f16", False, f"fp16 allowed but the device lacks {feature}: {storage_only}")
    if requested == "fp16":
        return Precision("fp32", "f32", False, f"fp32: fp16 is allowed but the device lacks {feature}")
    if requested == "fp32":
        return Precision("fp32", "f32", False, "fp32: precision loss is not allowed (compile precision fp32)")
    return Precision("fp32", "f32", False, f"fp32: precision {requested!r} has no GPU kernels")
