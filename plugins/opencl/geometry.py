"""Work sizes and window geometry of the opencl kernels: pure functions of shapes, chosen at compile time."""

from __future__ import annotations

from typing import Sequence

from delegate.gpu.layout import as_nhwc, slices

MATMUL_GROUP = 128  # most work items of a matmul.cl group; each computes 2 rows x 2 output slices
MATMUL_CHUNK = 8  # most input vectors staged per step
MATVEC_ROWS = 4  # products with at most this many rows spread their sums over a work group instead
MATVEC_GROUP = 64


def pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def matmul_shape(rows: int, out_slices: int, depth: int, compute_units: int,
                 staging: float = 1.0) -> tuple[int, int, int]:
    """(WG_P, WG_S, CHUNK) of matmul.cl.  The tile width weighs the padding it adds to the output slices
    (4 multiply-adds per slice for each staged vector) against restaging the input once per tile
    (``staging``: the cost of producing one staged vector, ~1 load, more when a fused depthwise
    convolution computes it); the chunk is no longer than the input; then the tile keeps as many rows
    as give every compute unit two work groups (big tiles reuse more of what they load, small ones keep
    a large GPU busy at batch 1).  The kernel needs WG_S >= 2 and groups of at least 32 items."""
    def cost(wg_s: int) -> float:
        tiles = -(-out_slices // (2 * wg_s))
        return 4 * tiles * 2 * wg_s + tiles * staging
    wg_s = min((8, 4, 2), key=cost)
    wg_p = MATMUL_GROUP // wg_s
    while wg_p * wg_s > 32 and -(-rows // (2 * wg_p)) * -(-out_slices // (2 * wg_s)) < 2 * compute_units:
        wg_p //= 2
    return wg_p, wg_s, min(pow2_at_least(depth), MATMUL_CHUNK)


REDUCTION_GROUP = 128  # work-group size of the reduction kernels (mean, softmax)


def reduction_shape(count: int) -> tuple[int, int]:
    """(items per reduction, reductions per work group) for reductions over ``count`` vectors each:
    up to the whole group shares one reduction, and small ones share a group instead."""
    items = min(REDUCTION_GROUP, pow2_at_least(count))
    return items, REDUCTION_GROUP // items


def round_to(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def grid(shape: Sequence[int]) -> tuple[int, int, int]:
    """One work item per output vector: (W, H, N * S)."""
    n, h, w, c = as_nhwc(shape)
    return w, h, n * slices(c)
