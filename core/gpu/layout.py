"""PHWC4: how GPU partitions store tensors, and the index math around it.

A tensor of rank <= 4 is first read as 4-D NHWC by padding its shape with
ones on the left: ``(C,) -> (1,1,1,C)``, ``(B,C) -> (1,1,B,C)``,
``(A,B,C) -> (1,A,B,C)``; so the last axis is always the channel axis and an
axis ``k`` of a rank-``r`` tensor is axis ``k + 4 - r`` of the 4-D view.
Channels are then cut into slices of four and stored slice-major as
``[N, S, H, W, 4]`` with ``S = ceil(C / 4)``; the lanes past ``C`` in the last
slice hold zeros, an invariant every kernel keeps so that reductions over
channels and 4x4 weight blocks can read whole vectors without masks.

Why slice-major rather than ``[N, H, W, S*4]``: a work item that produces one
4-channel vector reads its horizontal neighbours from consecutive addresses,
one slice of an H x W plane is a contiguous block, and a reshape that keeps
N, C and H*W leaves the bytes unchanged (so it costs nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..ir import Op, Tensor
from ..strided import strided_slice_plan
from .constants import int_values
from .support import split_axis, transpose_conv_bias_params

Shape4 = tuple[int, int, int, int]


def as_nhwc(shape: Sequence[int]) -> Shape4:
    """The 4-D NHWC view of a tensor shape of rank 0..4."""
    shape = tuple(int(d) for d in shape)
    if len(shape) > 4:
        raise ValueError(f"shape {list(shape)} has rank {len(shape)}; the GPU layout holds rank <= 4")
    return (1,) * (4 - len(shape)) + shape  # type: ignore[return-value]


def nhwc_axis(axis: int, rank: int) -> int:
    """Axis of the 4-D view that axis ``axis`` (negative allowed) of a rank-``rank`` tensor becomes."""
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % max(rank, 1) + 4 - rank


def slices(channels: int) -> int:
    return -(-int(channels) // 4)


def phwc4_shape(shape: Sequence[int]) -> tuple[int, int, int, int, int]:
    n, h, w, c = as_nhwc(shape)
    return n, slices(c), h, w, 4


def phwc4_vectors(shape: Sequence[int]) -> int:
    """Number of 4-lane vectors a tensor of ``shape`` occupies."""
    n, s, h, w, _ = phwc4_shape(shape)
    return n * s * h * w


def same_storage(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether tensors of shapes ``a`` and ``b`` with the same elements in NHWC order share PHWC4 bytes."""
    na, ha, wa, ca = as_nhwc(a)
    nb, hb, wb, cb = as_nhwc(b)
    return na == nb and ca == cb and ha * wa == hb * wb


def host_order(shape: Sequence[int]) -> bool:
    """Whether the NHWC values of ``shape`` start its PHWC4 storage, so the host reads and writes them
    there without a conversion: a single slice of exactly four channels, whole slices of one pixel, or
    one pixel of one image (the padding lanes follow, zero from the buffer's creation)."""
    n, h, w, c = as_nhwc(shape)
    return c == 4 or (h * w == 1 and (c % 4 == 0 or n == 1))


def to_phwc4(array: np.ndarray, dtype=None) -> np.ndarray:
    """NHWC (or lower rank) array -> contiguous ``[N, S, H, W, 4]`` array with zero padding lanes."""
    array = np.asarray(array)
    n, h, w, c = as_nhwc(array.shape)
    out = np.zeros((n, slices(c) * 4, h, w), dtype or array.dtype)
    out[:, :c] = array.reshape(n, h, w, c).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(out.reshape(n, slices(c), 4, h, w).transpose(0, 1, 3, 4, 2))


def from_phwc4(data: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Inverse of :func:`to_phwc4`: the tensor of ``shape`` held in a PHWC4 array (or its flat buffer)."""
    n, s, h, w, _ = phwc4_shape(shape)
    c = as_nhwc(shape)[3]
    planes = np.asarray(data).reshape(n, s, h, w, 4).transpose(0, 2, 3, 1, 4).reshape(n, h, w, s * 4)
    return np.ascontiguousarray(planes[..., :c]).reshape(tuple(shape))


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> int:
    """Leading padding TFLite applies for SAME (the larger half of the total goes after)."""
    out = -(-size // stride)
    total = (out - 1) * stride + (kernel - 1) * dilation + 1 - size
    return max(total, 0) // 2


def padding_before(padding: str, size: int, kernel: int, stride: int, dilation: int = 1) -> int:
    return same_padding(size, kernel, stride, dilation) if padding == "SAME" else 0


def window_padding(op: Op, in_shape: Sequence[int], kh: int, kw: int, dilated: bool = True) -> tuple[int, int]:
    """(pad_x, pad_y) before the input of a windowed op (convolution or pooling)."""
    o = op.options
    dh, dw = (o.get("dilation_h_factor", 1), o.get("dilation_w_factor", 1)) if dilated else (1, 1)
    padding = o.get("padding", "VALID")
    return (padding_before(padding, in_shape[2], kw, o.get("stride_w", 1), dw),
            padding_before(padding, in_shape[1], kh, o.get("stride_h", 1), dh))


def covers_input(op: Op, in_shape: Sequence[int], kh: int, kw: int) -> bool:
    """The window of ``op`` is the whole unpadded input: one output pixel per image."""
    return (kh, kw) == tuple(in_shape[1:3]) and tuple(op.outputs[0].shape[1:3]) == (1, 1) and \
        window_padding(op, in_shape, kh, kw, dilated=False) == (0, 0)


def transpose_conv_padding(padding: str, out_size: int, kernel: int, stride: int) -> int:
    """Leading padding of a transposed convolution producing ``out_size`` (TFLite's rule).

    The padding is the one the forward convolution from the output back to the
    input would use, so both directions agree on where the kernel sits.
    """
    if padding != "SAME":
        return 0
    forward = -(-out_size // stride)
    total = (forward - 1) * stride + kernel - out_size
    return max(total, 0) // 2


@dataclass(frozen=True)
class TransposeConv:
    """Where a transposed convolution's operands are and how its window sits, for both op forms."""

    x: Tensor
    weights: Tensor
    bias: Tensor | None
    padding: tuple[int, int]  # (top, left) rows and columns cut from the full output
    strides: tuple[int, int]  # (height, width)


def transpose_conv_geometry(op: Op) -> TransposeConv:
    """TRANSPOSE_CONV (output shape, weights, input, bias) or MediaPipe's Convolution2DTransposeBias
    (input, weights, bias; parameters in its custom options)."""
    weights, out = op.inputs[1], op.outputs[0].shape
    _, kh, kw, _ = weights.shape
    if op.custom:
        x, bias = op.inputs[0], op.input(2)
        padding, sw, sh = transpose_conv_bias_params(op)
    else:
        x, bias = op.inputs[2], op.input(3)
        o = op.options
        padding, sh, sw = o.get("padding", "VALID"), o.get("stride_h", 1), o.get("stride_w", 1)
    return TransposeConv(x, weights, bias, (transpose_conv_padding(padding, out[1], kh, sh),
                                            transpose_conv_padding(padding, out[2], kw, sw)), (sh, sw))


def resize_scales(op: Op) -> tuple[float, float]:
    """(x, y) input step per output pixel of RESIZE_BILINEAR or RESIZE_NEAREST_NEIGHBOR, with or without
    align_corners."""
    align = bool(op.options.get("align_corners"))
    (_, ih, iw, _), (_, oh, ow, _) = op.inputs[0].shape, op.outputs[0].shape

    def scale(size_in: int, size_out: int) -> float:
        return (size_in - 1) / (size_out - 1) if align and size_out > 1 else size_in / size_out
    return scale(iw, ow), scale(ih, oh)


def transpose_axes(op: Op) -> Shape4:
    """For each axis of a TRANSPOSE's input (NHWC view), the axis of the output holding it."""
    perm = [int(p) for p in int_values(op.inputs[1])]
    rank = len(op.inputs[0].shape)
    lead = 4 - rank
    full = list(range(lead)) + [lead + p % rank for p in perm]  # output axis k is input axis full[k]
    axes = [0] * 4
    for k, j in enumerate(full):
        axes[j] = k
    return tuple(axes)  # type: ignore[return-value]


def split_parts(op: Op) -> tuple[Tensor, int, list[tuple[Tensor, int]]]:
    """(input, NHWC axis, [(output, its offset along the axis)]) of a SPLIT or SPLIT_V."""
    x = op.inputs[1 if op.opcode == "SPLIT" else 0]
    axis = split_axis(op) % len(x.shape)
    offsets = np.cumsum([0] + [t.shape[axis] for t in op.outputs])
    return x, nhwc_axis(axis, len(x.shape)), [(t, int(o)) for t, o in zip(op.outputs, offsets)]


def pad_before(op: Op) -> Shape4:
    """The padding a PAD or MIRROR_PAD puts ahead of each axis of its NHWC view."""
    x = op.inputs[0]
    pads = int_values(op.input(1))
    return (0,) * (4 - len(x.shape)) + tuple(int(p) for p in pads[0::2])  # type: ignore[return-value]


def reduced_axes(op: Op) -> tuple[Shape4, Shape4]:
    """(the input's NHWC shape with reduced axes as 1, 1 for each reduced axis) of a reduction over input 1's
    axes (MEAN, SUM, REDUCE_*)."""
    x = op.inputs[0]
    axes = {nhwc_axis(int(a), len(x.shape)) for a in int_values(op.input(1))}
    shape = as_nhwc(x.shape)
    return (tuple(1 if a in axes else shape[a] for a in range(4)),  # type: ignore[return-value]
            tuple(int(a in axes) for a in range(4)))


def arg_axis(op: Op) -> tuple[int, Shape4]:
    """(NHWC axis, the input's NHWC shape with that axis as 1) of an ARG_MAX or ARG_MIN."""
    x = op.inputs[0]
    axis = nhwc_axis(int(int_values(op.inputs[1])[0]), len(x.shape))
    shape = as_nhwc(x.shape)
    return axis, tuple(1 if a == axis else shape[a] for a in range(4))  # type: ignore[return-value]


def batch_matmul_layout(op: Op) -> tuple[int, tuple[int, int, int, int]]:
    """(depth, axes) of a BATCH_MATMUL of a by b in the NHWC views of its inputs, where batches are (n, y) and
    each matrix is (x, c): axes = (a's row axis, a's depth axis, b's depth axis, b's column axis)."""
    a = op.inputs[0].shape
    adj_x, adj_y = bool(op.options.get("adj_x")), bool(op.options.get("adj_y"))
    depth = a[-2] if adj_x else a[-1]
    return depth, ((3, 2) if adj_x else (2, 3)) + ((3, 2) if adj_y else (2, 3))  # type: ignore[return-value]


def pack_axis(op: Op) -> int:
    """The axis of a PACK's output (NHWC view) along which its inputs follow each other."""
    return nhwc_axis(op.options.get("axis", 0), len(op.outputs[0].shape))


def unpack_parts(op: Op) -> tuple[int, list[tuple[Tensor, int]]]:
    """(NHWC axis of the input, [(output, its index along the axis)]) of an UNPACK."""
    rank = len(op.inputs[0].shape)
    return nhwc_axis(op.options.get("axis", 0), rank), [(t, i) for i, t in enumerate(op.outputs)]


def dense_groups(weights: np.ndarray, in_channels: int) -> np.ndarray:
    """Grouped convolution weights ``[O, KH, KW, I/groups]`` as dense ``[O, KH, KW, I]``, zero across groups,
    so one kernel computes grouped and ordinary convolutions."""
    o, kh, kw, per_group = weights.shape
    if per_group == in_channels:
        return weights
    groups = in_channels // per_group
    dense = np.zeros((o, kh, kw, in_channels), np.float32)
    out_per_group = o // groups
    for g in range(groups):
        rows = slice(g * out_per_group, (g + 1) * out_per_group)
        dense[rows, :, :, g * per_group:(g + 1) * per_group] = weights[rows]
    return dense


def pack_conv_weights(weights: np.ndarray) -> np.ndarray:
    """OHWI weights -> ``[S_out, KH, KW, S_in, 4 input lanes, 4 output lanes]``.

    A kernel producing output slice ``s`` multiplies each input vector lane
    ``k`` by one contiguous 4-vector (the weights of that input channel for
    the slice's 4 output channels), so it reads weights in order.
    """
    o, kh, kw, i = weights.shape
    so, si = slices(o), slices(i)
    padded = np.zeros((so * 4, kh, kw, si * 4), np.float32)
    padded[:o, :, :, :i] = weights
    return np.ascontiguousarray(padded.reshape(so, 4, kh, kw, si, 4).transpose(0, 2, 3, 4, 5, 1))


def pack_depthwise_weights(weights: np.ndarray) -> np.ndarray:
    """``[1, KH, KW, C]`` weights -> ``[S, KH, KW, 4]``: one vector per tap and slice."""
    _, kh, kw, c = weights.shape
    padded = np.zeros((kh, kw, slices(c) * 4), np.float32)
    padded[..., :c] = weights[0]
    return np.ascontiguousarray(padded.reshape(kh, kw, slices(c), 4).transpose(2, 0, 1, 3))


def pack_vector(values: np.ndarray | None, channels: int) -> np.ndarray:
    """Per-channel values (a bias) padded to whole slices; zeros when absent."""
    out = np.zeros(slices(channels) * 4, np.float32)
    if values is not None:
        out[:channels] = np.asarray(values, np.float32).ravel()
    return out


def natural_output_shape(op: Op) -> tuple[int, ...]:
    """The shape a kernel computes before any reshape: axes a MEAN reduces or a STRIDED_SLICE shrinks
    are kept with size 1.  When its storage differs from the output's, a relayout must follow."""
    x = op.inputs[0]
    if op.opcode == "MEAN":
        axes = {nhwc_axis(a, len(x.shape)) for a in int_values(op.inputs[1])}
        return tuple(1 if i in axes else d for i, d in enumerate(as_nhwc(x.shape)))
    if op.opcode == "STRIDED_SLICE":
        return tuple(len(r) for r in slice_ranges(op))
    return op.outputs[0].shape


def slice_ranges(op: Op) -> list[range]:
    """The input indices a STRIDED_SLICE (without ellipsis or new axes) takes along each axis."""
    x = op.inputs[0]
    plan = strided_slice_plan(x.shape, *(int_values(op.inputs[i]) for i in (1, 2, 3)), op.options)
    return [range(size)[index] for size, index in zip(x.shape, plan.index)]
