"""How much each invocation of a tiled kernel computes, and how invocations form workgroups.

A batch-1 network has layers of every shape: 112x112 pixels of 16 channels, 7x7 pixels of 1280,
one row of 1280.  On a CPU adapter each kernel is given enough invocations to keep the cores busy
and, within that, as many outputs per invocation as possible, since every value an invocation
loads is then reused for several outputs; layers too small for that split their reduction.  On a
GPU an invocation computes one output vector (blocks of outputs made the kernels slower there),
its reduction split by depth, in workgroups of 128 (``DeviceShape.blocks``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

WORKGROUP = 64
MIN_SLICES_PER_SPLIT = 4  # input slices each part of a split reduction adds up at least
ROW_LANES = 8


@dataclass(frozen=True)
class DeviceShape:
    """What tiling needs to know of an adapter."""

    invocations: int  # how many invocations keep it busy
    workgroup_bytes: int  # workgroup memory one workgroup may use
    most_workgroups: int  # along one dimension of a dispatch
    subgroups: bool  # reductions may use subgroup operations
    # whether an invocation computes a block of outputs (a CPU adapter: they fill its SIMD lanes).  Not on a
    # GPU: there, timing every candidate (sustained_speed) on an H100 (Vulkan) chose one output vector per
    # invocation for 48 of MobileNetV2's 53 tiled layers, workgroups of 128 for 33, and the reduction split
    # 16 ways from 64 input slices, 4 from 16: its kernels took 0.80 ms against 1.32 ms with the blocks
    # chosen before.  The rule below gives exactly the tuned tiling for 29 of the 53 (the blocks: 7), most
    # of the others differing in the workgroup's size alone (docs/benchmarks.md)
    blocks: bool = True

    @classmethod
    def of(cls, adapter_type: str, limits: dict[str, int], subgroups: bool) -> "DeviceShape":
        """A GPU wants thousands of invocations in flight (about four warps on each multiprocessor of a
        large one); a CPU adapter runs a few SIMD lanes per core and prefers fewer, longer invocations."""
        cpu = adapter_type == "CPU"
        return cls(256 if cpu else 8192, limits["max-compute-workgroup-storage-size"],
                   limits["max-compute-workgroups-per-dimension"], subgroups, blocks=cpu)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _up_to_4(n: int) -> int:
    return min(_pow2_at_least(n), 4)


@dataclass(frozen=True)
class MatmulTiling:
    """``rows`` x ``slices`` outputs per invocation; ``split`` invocations share one reduction."""

    rows: int
    slices: int
    split: int
    workgroup: int = WORKGROUP

    def __str__(self) -> str:
        return f"{self.rows} rows x {self.slices} slices, split {self.split}, workgroup {self.workgroup}"

    def constants(self) -> dict[str, str]:
        return {"RM": str(self.rows), "RN": str(self.slices), "KT": str(self.split)}

    def layout(self, rows: int, slices: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(workgroup shape, workgroup counts): row groups along x, slice groups along y, split along z."""
        row_groups, slice_groups = _ceil(rows, self.rows), _ceil(slices, self.slices)
        across = self.workgroup // self.split
        wx = min(_pow2_at_least(row_groups), across)
        wy = max(min(_pow2_at_least(slice_groups), across // wx), 1)
        return (wx, wy, self.split), (_ceil(row_groups, wx), _ceil(slice_groups, wy), 1)


def _blocks(device: DeviceShape, count, most_rows: int, most_slices: int) -> tuple[int, int]:
    """The largest rows x slices block per invocation (halving the larger side) that still leaves the
    device ``count(rows, slices)`` invocations to keep it busy, or 1 x 1."""
    rm, rn = most_rows, most_slices
    while count(rm, rn) < device.invocations and rm * rn > 1:
        if rm >= rn:
            rm //= 2
        else:
            rn //= 2
    return rm, rn


def _can_split(device: DeviceShape, depth: int, rows: int, slices: int, split: int, size: int = WORKGROUP) -> bool:
    """Whether ``split`` parts each still add up a few input slices, with the partial sums of a
    workgroup of ``size`` in workgroup memory."""
    return (split <= size and depth // split >= MIN_SLICES_PER_SPLIT
            and size * rows * slices * 16 <= device.workgroup_bytes)


def matmul_tiling(device: DeviceShape, rows: int, slices: int, depth: int) -> MatmulTiling:
    """Tiling of a product of ``rows`` pixel rows, ``slices`` output slices, ``depth`` input slices: with
    blocks, the largest that leaves the device busy, split while invocations are short; without, one output
    vector each, split 16 or 4 ways wherever each part still adds up a few input slices, and further
    while invocations are short."""
    size = WORKGROUP if device.blocks else 2 * WORKGROUP
    if device.blocks:
        rm, rn = _blocks(device, lambda m, n: _ceil(rows, m) * _ceil(slices, n), _up_to_4(rows), _up_to_4(slices))
        split = 1
    else:
        rm = rn = 1
        split = next((s for s in (16, 4) if _can_split(device, depth, 1, 1, s, size)), 1)
    while (_ceil(rows, rm) * _ceil(slices, rn) * split < device.invocations
           and _can_split(device, depth, rm, rn, split * 2, size)):
        split *= 2
    tiling = MatmulTiling(rm, rn, split, size)
    while not _fits(device, tiling.layout(rows, slices)[1]) and tiling.split > 1:  # fewer parts, wider groups
        tiling = MatmulTiling(rm, rn, tiling.split // 2, size)
    if not device.blocks and not _fits(device, tiling.layout(rows, slices)[1]):
        return matmul_tiling(replace(device, blocks=True), rows, slices, depth)
    return tiling


def _fits(device: DeviceShape, workgroups: tuple[int, int, int]) -> bool:
    """Whether a dispatch of ``workgroups`` stays within the adapter's count along each dimension."""
    return max(workgroups) <= device.most_workgroups


def matmul_candidates(device: DeviceShape, rows: int, slices: int, depth: int) -> list[MatmulTiling]:
    """What tuning tries: every block up to 4 x 4, unsplit or split 4 or 16 ways, in workgroups of 64 or 128."""
    return [MatmulTiling(m, n, split, size)
            for m in _powers(_up_to_4(rows)) for n in _powers(_up_to_4(slices)) for split in (1, 4, 16)
            for size in (WORKGROUP, 2 * WORKGROUP) if split == 1 or _can_split(device, depth, m, n, split, size)]


@dataclass(frozen=True)
class SpatialTiling:
    """``pixels`` horizontally adjacent output pixels x ``slices`` output slices per invocation."""

    pixels: int
    slices: int
    workgroup: int = WORKGROUP

    def __str__(self) -> str:
        return f"{self.pixels} pixels x {self.slices} slices, workgroup {self.workgroup}"

    def constants(self) -> dict[str, str]:
        return {"RM": str(self.pixels), "RN": str(self.slices)}

    def layout(self, shape: tuple[int, int, int, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(workgroup shape, workgroup counts) over an NHWC output: pixel groups along x, rows along y,
        (image, slice group) along z."""
        n, h, w, c = shape
        columns = _ceil(w, self.pixels)
        wx = min(_pow2_at_least(columns), self.workgroup)
        wy = min(_pow2_at_least(h), self.workgroup // wx)
        return (wx, wy, 1), (_ceil(columns, wx), _ceil(h, wy), n * _ceil(_ceil(c, 4), self.slices))


def spatial_tiling(device: DeviceShape, shape: tuple[int, int, int, int], most_slices: int,
                   most_pixels: int = 4) -> SpatialTiling:
    """Tiling of a convolution producing NHWC ``shape``, up to ``most_pixels`` pixels by ``most_slices``
    slices per invocation.

    Rows keep at least ``ROW_LANES`` invocations side by side, so neighbouring lanes still read
    neighbouring pixels (and a CPU adapter's SIMD lanes stay filled).  Without blocks (a GPU), one output
    vector per invocation, in workgroups of 128."""
    n, h, w, c = shape
    if not device.blocks:
        tiling = SpatialTiling(1, 1, 2 * WORKGROUP)
        if _fits(device, tiling.layout(shape)[1]):
            return tiling
        device = replace(device, blocks=True)
    most_pixels = min(most_pixels, 1 << (max(w // ROW_LANES, 1).bit_length() - 1))
    pixels, slices = _blocks(device, lambda m, s: n * h * _ceil(w, m) * _ceil(_ceil(c, 4), s), most_pixels,
                             min(most_slices, _up_to_4(_ceil(c, 4))))
    return SpatialTiling(pixels, slices)


def spatial_candidates(shape: tuple[int, int, int, int], most_slices: int,
                       most_pixels: int = 4) -> list[SpatialTiling]:
    """What tuning tries: up to ``most_pixels`` by ``most_slices`` slices (1, 2 or 4 each), in workgroups
    of 64 or 128."""
    _, _, w, c = shape
    return [SpatialTiling(m, n, size) for m in _powers(min(most_pixels, _up_to_4(w)))
            for n in _powers(min(most_slices, _up_to_4(_ceil(c, 4)))) for size in (WORKGROUP, 2 * WORKGROUP)]


def _powers(most: int) -> list[int]:
    return [1 << i for i in range(most.bit_length())]


def reduction_workgroup(length: int) -> int:
    """Invocations sharing a reduction over ``length`` vectors: about two vectors each, 32 to 256."""
    return min(max(_pow2_at_least(length // 2), 32), 256)
