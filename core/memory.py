"""Arena planning: intermediate tensors share one buffer wherever their lifetimes do not overlap.

The greedy-by-size strategy of TFLite's arena planner: place the largest tensor
first, each at the lowest offset that does not collide with an already placed
tensor alive at the same time.  Planned once per compiled partition, so
inference allocates no intermediates.
"""

from __future__ import annotations

from typing import Sequence

import math

import numpy as np

from .ir import Op, Subgraph, Tensor

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


def aligned_zeros(shape, dtype) -> np.ndarray:
    """np.zeros starting on an ALIGNMENT-byte boundary (a cache line): numpy aligns to 16 bytes, and a
    vector of 64 bytes read across two cache lines costs two loads."""
    dtype, shape = np.dtype(dtype), tuple(int(d) for d in shape) if np.iterable(shape) else (int(shape),)
    if min(shape, default=0) < 0:
        raise ValueError(f"negative dimensions are not allowed: {shape}")  # as np.zeros says
    count = math.prod(shape)
    raw = np.zeros(count * dtype.itemsize + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def plan_arena(ops: Sequence[Op], tensors: Sequence[Tensor]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Allocate one arena (aligned as its offsets) and return typed views for ``tensors`` (each written
    by one of ``ops``)."""
    sizes = {t.index: t.nbytes for t in tensors}
    offsets, total = plan_offsets(sizes, lifetimes(ops, tensors))
    arena = aligned_zeros(max(total, ALIGNMENT), np.uint8)
    views = {}
    for t in tensors:
        views[t.index] = np.ndarray(t.shape, t.dtype.numpy, buffer=arena, offset=offsets[t.index])
    return arena, views


def peak_bytes(graph: Subgraph) -> int:
    """Most bytes of non-constant tensors alive at once when ``graph`` runs in order: what its arenas need at
    least.  Sizes are exact integers (a tensor's own size may overflow int64 for absurd shapes)."""
    def nbytes(t: Tensor) -> int:
        return math.prod(max(d, 0) for d in t.shape) * t.dtype.itemsize

    values = {t.index: t for op in graph.ops for t in [*op.inputs, *op.outputs]
              if t is not None and not t.is_constant}
    values.update((t.index, t) for t in graph.inputs)
    spans = lifetimes(graph.ops, list(values.values()))
    for t in graph.inputs:
        spans[t.index] = (0, spans[t.index][1])
    for t in graph.outputs:
        if t.index in spans:
            spans[t.index] = (spans[t.index][0], len(graph.ops))
    events: dict[int, int] = {}
    for index, (first, last) in spans.items():
        size = nbytes(values[index])
        events[first] = events.get(first, 0) + size
        events[last + 1] = events.get(last + 1, 0) - size
    peak = live = 0
    for position in sorted(events):
        live += events[position]
        peak = max(peak, live)
    return peak


# glibc mallopt parameters: past M_MMAP_THRESHOLD an allocation is its own mapping, unmapped when freed;
# past M_TRIM_THRESHOLD of free space at the heap's top, the heap is shrunk.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEPT_HEAP_BYTES, _MMAP_FROM_BYTES = 256 << 20, 32 << 20
_allocator_set = False


def keep_freed_host_memory() -> bool:
    """Have glibc keep freed memory for reuse instead of returning it to the system at once.

    Each run hands the caller fresh output arrays and the caller drops the last ones: with glibc's defaults a
    megabytes-large output is unmapped when dropped and faulted in again by the next run, page by page, with a
    TLB shootdown on every core the process's threads run on (measured: a 5.5 MB segmentation output made a
    7 ms LiteRT run take 17 ms on 2 cores).  Once per process; False where the C library is not glibc."""
    global _allocator_set
    if _allocator_set:
        return True
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        _allocator_set = bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_FROM_BYTES)
                              and libc.mallopt(_M_TRIM_THRESHOLD, _KEPT_HEAP_BYTES))
    except (OSError, AttributeError):
        _allocator_set = False
    return _allocator_set
