"""Arena planning: intermediate tensors share one buffer wherever their lifetimes do not overlap.

The greedy-by-size strategy of TFLite's arena planner: place the largest tensor
first, each at the lowest offset that does not collide with an already placed
tensor alive at the same time.  Planned once per compiled partition, so
inference allocates no intermediates.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .ir import Op, Tensor

ALIGNMENT = 64


def lifetimes(ops: Sequence[Op], tensors: Sequence[Tensor]) -> dict[int, tuple[int, int]]:
    """tensor index -> (first op position writing it, last op position reading it)."""
    wanted = {t.index for t in tensors}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for pos, op in enumerate(ops):
        for t in op.outputs:
            if t.index in wanted:
                first.setdefault(t.index, pos)
                last.setdefault(t.index, pos)
        for t in op.inputs:
            if t is not None and t.index in wanted:
                last[t.index] = pos
    return {i: (first.get(i, 0), last.get(i, len(ops))) for i in wanted}


def plan_offsets(sizes: dict[int, int], spans: dict[int, tuple[int, int]]) -> tuple[dict[int, int], int]:
    """Offsets per tensor and the arena size, greedy by size."""
    placed: list[tuple[int, int, int, int]] = []  # offset, end, first, last
    offsets: dict[int, int] = {}
    for idx in sorted(sizes, key=lambda i: (-sizes[i], i)):
        size = -(-max(sizes[idx], 1) // ALIGNMENT) * ALIGNMENT
        first, last = spans[idx]
        live = sorted((o, e) for o, e, f, l in placed if not (l < first or f > last))
        offset = 0
        for o, e in live:
            if offset + size <= o:
                break
            offset = max(offset, e)
        offsets[idx] = offset
        placed.append((offset, offset + size, first, last))
    total = max((e for _, e, _, _ in placed), default=0)
    return offsets, total


def plan_arena(ops: Sequence[Op], tensors: Sequence[Tensor]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Allocate one arena and return typed views for ``tensors`` (each written by one of ``ops``)."""
    sizes = {t.index: t.nbytes for t in tensors}
    offsets, total = plan_offsets(sizes, lifetimes(ops, tensors))
    arena = np.zeros(max(total, ALIGNMENT), np.uint8)
    views = {}
    for t in tensors:
        views[t.index] = np.ndarray(t.shape, t.dtype.numpy, buffer=arena, offset=offsets[t.index])
    return arena, views
