"""STRIDED_SLICE semantics, shared by the shape rule and the kernels.

TFLite first rewrites the slice spec onto an "effective" input: each
new_axis bit inserts a dimension of size 1, the ellipsis expands to the
dimensions the spec does not name, and dimensions past the spec are taken
whole.  Then every effective dimension gets a clamped start/stop; shrunk
dimensions keep one element and are dropped from the output.  ``offset``
makes ``end`` a length relative to ``begin``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class StridedSlicePlan:
    """``x.reshape(effective_shape)[index].reshape(output_shape)`` is the slice."""

    effective_shape: tuple[int, ...]
    index: tuple[slice, ...]
    output_shape: tuple[int, ...]

    def apply(self, x: np.ndarray) -> np.ndarray:
        return np.reshape(x, self.effective_shape)[self.index].reshape(self.output_shape)


def _bit(mask: int, i: int) -> bool:
    return bool(mask >> i & 1)


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


def strided_slice_plan(shape: Sequence[int], begin: Sequence[int], end: Sequence[int],
                       strides: Sequence[int], options: Mapping[str, Any]) -> StridedSlicePlan:
    """Plan a STRIDED_SLICE of an input of ``shape`` with the op's begin/end/strides and options."""
    begin = [int(v) for v in np.asarray(begin).ravel()]
    end = [int(v) for v in np.asarray(end).ravel()]
    strides = [int(v) for v in np.asarray(strides).ravel()]
    ellipsis = int(options.get("ellipsis_mask", 0))
    new_axis = int(options.get("new_axis_mask", 0))
    begin_mask = int(options.get("begin_mask", 0))
    end_mask = int(options.get("end_mask", 0))
    shrink_mask = int(options.get("shrink_axis_mask", 0))
    offset = bool(options.get("offset", False))
    rank, count = len(shape), len(begin)
    if any(s == 0 for s in strides):
        raise ValueError("STRIDED_SLICE stride must be non-zero")

    added = sum(1 for i in range(count) if _bit(new_axis, i) and not _bit(ellipsis, i))
    dims = rank + added
    # Effective dimension i is one of: part of the ellipsis, a new axis, a dimension past the spec
    # (taken whole), or the spec entry ``i - expanded`` where ``expanded`` counts the dimensions the
    # ellipsis stands for beyond its own entry.
    kinds: list[str] = []
    expanded = 0
    ellipsis_start = dims
    i = 0
    while i < dims:
        if _bit(ellipsis, i) and ellipsis_start == dims:
            ellipsis_start = i
            stop = max(i + 1, min(i + 1 + added + rank - count, dims))
            expanded = stop - i - 1
            kinds.extend(["ellipsis"] * (stop - i))
            i = stop
            continue
        kinds.append("new" if _bit(new_axis, i - expanded) else "spec")
        i += 1

    effective, index, out_shape = [], [], []
    source = 0  # next input dimension
    for i, kind in enumerate(kinds):
        spec = i - expanded if i > ellipsis_start else i
        if kind == "new":
            effective.append(1)
            index.append(slice(0, 1))
            out_shape.append(1)
            continue
        size = int(shape[source])
        source += 1
        effective.append(size)
        if kind == "ellipsis" or spec >= count:
            index.append(slice(None))
            out_shape.append(size)
            continue
        stride = strides[spec]
        start = begin[spec] + (size if begin[spec] < 0 else 0)
        start = _clamp(start, 0, size) if stride > 0 else _clamp(start, -1, size - 1)
        if _bit(begin_mask, spec):
            start = 0 if stride > 0 else size - 1
        if _bit(shrink_mask, spec):
            # LiteRT reads past the axis for an index beyond it (a negative one it clamps to the first), and its
            # builtin kernels and its default delegate disagree on a shrunk axis stepped backwards
            if stride < 0:
                raise ValueError(f"STRIDED_SLICE shrunk axis {spec} takes a positive stride, not {stride}")
            if not 0 <= start < size:
                raise ValueError(f"STRIDED_SLICE index {begin[spec]} of shrunk axis {spec} is outside its {size} "
                                 f"values")
            index.append(slice(start, start + 1))
            continue
        stop = end[spec] + (start if offset else 0)
        stop += size if stop < 0 else 0
        stop = _clamp(stop, 0, size) if stride > 0 else _clamp(stop, -1, size - 1)
        if _bit(end_mask, spec):
            stop = size if stride > 0 else -1
        length = max(0, -(-(stop - start) // stride))
        # -1 here means "before the first element", which Python slicing would read as the last one.
        index.append(slice(start, None if stop < 0 else stop, stride) if length else slice(0, 0))
        out_shape.append(length)
    return StridedSlicePlan(tuple(effective), tuple(index), tuple(out_shape))
