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
                 staging: float = 1.0) -> tuple[int, int, int, int]:
    """(WG_P, WG_S, CHUNK, SPLIT) of matmul.cl.  The tile width weighs the padding it adds to the output
    slices (4 multiply-adds per slice for each staged vector) against restaging the input once per tile
    (``staging``: the cost of producing one staged vector, ~1 load, more when a fused depthwise
    convolution computes it); the chunk is no longer than the input; then the tile keeps as many rows
    as give every compute unit two work groups (big tiles reuse more of what they load, small ones keep
    a large GPU busy at batch 1).  The kernel needs WG_S >= 2 and groups of at least 32 items.  Where
    the tiles are still fewer than the compute units and the sums long, SPLIT layers of the group share
    each sum (see split_layers)."""
    def cost(wg_s: int) -> float:
        tiles = -(-out_slices // (2 * wg_s))
        return 4 * tiles * 2 * wg_s + tiles * staging
    wg_s = min((8, 4, 2), key=cost)
    wg_p = MATMUL_GROUP // wg_s
    while wg_p * wg_s > 32 and -(-rows // (2 * wg_p)) * -(-out_slices // (2 * wg_s)) < 2 * compute_units:
        wg_p //= 2
    chunk = min(pow2_at_least(depth), MATMUL_CHUNK)
    tiles = -(-rows // (2 * wg_p)) * -(-out_slices // (2 * wg_s))
    split, chunk = split_layers(tiles, wg_p, wg_s, depth, chunk, compute_units)
    return wg_p, wg_s, chunk, split


MAX_SPLIT = 8
MIN_SPLIT_CHUNK = 4  # a layer's staged chunk, at least (each chunk costs two barriers)
SPLIT_LOCAL_BYTES = 32 << 10  # local memory every OpenCL device has (the full profile's minimum)


def split_layers(tiles: int, wg_p: int, wg_s: int, depth: int, chunk: int, compute_units: int) -> tuple[int, int]:
    """(SPLIT, CHUNK): how many layers of a matmul.cl work group share each tile's sums, up to MAX_SPLIT,
    while the tiles times the layers are fewer than two per compute unit and each layer still sums two
    chunks or more, within SPLIT_LOCAL_BYTES (halving the chunk, down to MIN_SPLIT_CHUNK, to make room).
    On a GPU of 132 compute units a 7x7 layer of 960 channels to 320 gives 35 tiles of 32 items, each
    item summing 240 vectors one after another: the device waits on memory, one load after another,
    with most of its units idle.  Tiles that few come from groups already down to 32 items, so a split
    group holds at most 256."""
    split = 1
    while split * 2 <= MAX_SPLIT and tiles * split < 2 * compute_units:
        fitting = chunk
        while fitting > MIN_SPLIT_CHUNK and matmul_local_bytes(wg_p, wg_s, fitting, split * 2) > SPLIT_LOCAL_BYTES:
            fitting //= 2
        if depth < 4 * fitting * split or matmul_local_bytes(wg_p, wg_s, fitting, split * 2) > SPLIT_LOCAL_BYTES:
            break
        split, chunk = split * 2, fitting
    return split, chunk


def matmul_local_bytes(wg_p: int, wg_s: int, chunk: int, split: int) -> int:
    """Local memory of a matmul.cl group (FLT4 values, 16 bytes at most): per layer a chunk of its tile's
    rows and of their weights; the 2 x 2 blocks of all layers but the first."""
    per_layer = chunk * 2 * wg_p + 2 * wg_s * chunk * 4
    return 16 * (split * per_layer + (split - 1) * 4 * wg_p * wg_s)


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
