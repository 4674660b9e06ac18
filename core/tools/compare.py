"""The one error metric: how far outputs are from a reference."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..errors import ExecutionError


def error_of(actual: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    """Max absolute error, max error relative to the reference's largest magnitude, and cosine similarity."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    if a.shape != e.shape:
        raise ExecutionError(f"shape {list(a.shape)} differs from the reference's {list(e.shape)}")
    if not e.size:
        return {"max_abs_error": 0.0, "max_rel_error": 0.0, "cosine": 1.0}
    diff = float(np.abs(a - e).max())
    scale = float(np.abs(e).max()) or 1.0
    na, ne = np.linalg.norm(a), np.linalg.norm(e)
    cosine = float(np.dot(a.ravel(), e.ravel()) / (na * ne)) if na and ne else float(na == ne)
    return {"max_abs_error": diff, "max_rel_error": diff / scale, "cosine": cosine}


def compare_outputs(actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]
                    ) -> dict[str, dict[str, float]]:
    """``error_of`` per output name of ``expected``."""
    out = {}
    for name, e in expected.items():
        try:
            out[name] = error_of(actual[name], e)
        except ExecutionError as exc:
            raise ExecutionError(f"output {name!r}: {exc}") from None
    return out


def worst_relative_error(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> float:
    """The largest ``max_rel_error`` over numeric outputs (the suite's one-number summary)."""
    worst = 0.0
    for a, e in zip(actual, expected):
        if np.asarray(e).dtype.kind in "fiu":
            worst = max(worst, error_of(a, e)["max_rel_error"])
    return worst
