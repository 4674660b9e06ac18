"""Data-movement kernels: reshapes, transposes, joins and splits, slices, gathers, padding, fills.

Index arithmetic (slices, permutations, border regions) is worked out at
compile time from constant operands; runtime operands fall back to the same
planning per run.
"""

from __future__ import annotations

import math

import numpy as np

from delegate.plugin_api import Op, strided_slice_plan

from ..registry import kernel, laid_out
from .common import constant, fused
from .native import (PER_THREAD_ITEMS, TRANSPOSE_AXES, CopyCall, PadCall, TransposeCall, float_loops,
                     kernel_loops, prepared_run, team_for)


def _operand(fixed, ins, i):
    """A compile-time constant operand, or the runtime value of input ``i``."""
    return fixed if fixed is not None else np.asarray(ins[i])


def _int_list(values) -> list[int]:
    return [int(v) for v in np.asarray(values).ravel()]


@kernel("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
def reshape(op: Op):
    """The input's values in the output's shape: with the native loops one prepared copy (batched with
    its neighbours' calls), else numpy's."""
    x, out = op.inputs[0], op.outputs[0]
    loops = kernel_loops()
    if loops is not None and out.dtype.numpy is not None and out.dtype.numpy.kind in "biuf" \
            and x.dtype == out.dtype and x.nbytes == out.nbytes:
        return prepared_run(loops, CopyCall(out.nbytes))

    def run(ins, outs):
        np.copyto(outs[0], np.reshape(ins[0], outs[0].shape))
    return run


_BY_INT_LIST = {"TRANSPOSE": np.transpose, "TILE": np.tile}


@kernel(*_BY_INT_LIST)
def by_int_list(op: Op):
    """TRANSPOSE (permutation) and TILE (multiples): numpy's function of the input and an int list; a
    TRANSPOSE by a constant permutation with the native loops one prepared call (batched with its
    neighbours': a transformer's attention transposes its heads five times between its products)."""
    fn, fixed = _BY_INT_LIST[op.opcode], constant(op.inputs[1])
    native = _native_transpose(op, fixed) if op.opcode == "TRANSPOSE" and fixed is not None else None
    if native is not None:
        return native

    def run(ins, outs):
        np.copyto(outs[0], fn(ins[0], _int_list(_operand(fixed, ins, 1))))
    return run


def _native_transpose(op: Op, perm):
    """TRANSPOSE through the native loops, or None where they do not serve."""
    x, out, loops = op.inputs[0], op.outputs[0], kernel_loops()
    dtype = out.dtype.numpy
    if loops is None or dtype is None or dtype.kind not in "biuf" or x.dtype != out.dtype \
            or not 1 <= len(x.shape) <= TRANSPOSE_AXES or min(x.shape) < 0:
        return None
    perm = tuple(int(k) % len(x.shape) for k in np.asarray(perm).ravel())
    if sorted(perm) != list(range(len(x.shape))) or tuple(x.shape[k] for k in perm) != tuple(out.shape):
        return None
    rank = len(perm)
    if rank >= 2 and perm[-2] == rank - 1 != perm[-1] and dtype.itemsize != 4:
        return None  # a matrix transposed: native.c does 4-byte items by blocks, numpy others faster than a gather
    return prepared_run(loops, TransposeCall(tuple(x.shape), perm, dtype, team_for(math.prod(x.shape), PER_THREAD_ITEMS)))


@kernel("CONCATENATION")
def concatenation(op: Op):
    axis = op.options.get("axis", 0) % max(len(op.outputs[0].shape), 1)
    act = fused(op)

    def run(ins, outs):
        np.concatenate(ins, axis=axis, out=outs[0])
        act(outs[0])
    return run


@kernel("PACK")
def pack(op: Op):
    axis = op.options.get("axis", 0) % len(op.outputs[0].shape)

    def run(ins, outs):
        np.stack(ins, axis=axis, out=outs[0])
    return run


@kernel("UNPACK")
def unpack(op: Op):
    axis = op.options.get("axis", 0) % len(op.inputs[0].shape)

    def run(ins, outs):
        for i, out in enumerate(outs):
            np.copyto(out, np.take(ins[0], i, axis=axis))
    return run


def _split_into(x: np.ndarray, axis: int, outs) -> None:
    start = 0
    for out in outs:
        size = out.shape[axis]
        np.copyto(out, x[(slice(None),) * axis + (slice(start, start + size),)])
        start += size


@kernel("SPLIT", "SPLIT_V")
def split(op: Op):
    """SPLIT reads (axis, data), SPLIT_V (data, sizes, axis); the outputs' shapes give the sizes."""
    data_slot, axis_slot = (1, 0) if op.opcode == "SPLIT" else (0, 2)
    fixed = constant(op.inputs[axis_slot])
    rank = len(op.inputs[data_slot].shape)

    def run(ins, outs):
        _split_into(ins[data_slot], int(_operand(fixed, ins, axis_slot).ravel()[0]) % rank, outs)
    return run


def _slice_index(shape, begin, size) -> tuple[slice, ...]:
    return tuple(slice(b, d if s == -1 else b + s) for b, s, d in zip(_int_list(begin), _int_list(size), shape))


@kernel("SLICE")
def slice_op(op: Op):
    shape = op.inputs[0].shape
    begin, size = constant(op.inputs[1]), constant(op.inputs[2])
    fixed = _slice_index(shape, begin, size) if begin is not None and size is not None else None

    def run(ins, outs):
        index = fixed if fixed is not None else _slice_index(shape, ins[1], ins[2])
        np.copyto(outs[0], ins[0][index])
    return run


@kernel("STRIDED_SLICE")
def strided_slice(op: Op):
    shape = op.inputs[0].shape
    spec = [constant(op.inputs[i]) for i in (1, 2, 3)]
    fixed = strided_slice_plan(shape, *spec, op.options) if all(s is not None for s in spec) else None

    def run(ins, outs):
        plan = fixed or strided_slice_plan(shape, ins[1], ins[2], ins[3], op.options)
        np.copyto(outs[0], plan.apply(ins[0]).reshape(outs[0].shape))
    return run


@kernel("GATHER")
def gather(op: Op):
    rank = len(op.inputs[0].shape)
    axis = op.options.get("axis", 0) % rank
    batch_dims = op.options.get("batch_dims", 0)
    if batch_dims < 0:
        batch_dims += len(op.inputs[1].shape)

    def run(ins, outs):
        x, idx = ins[0], np.asarray(ins[1]).astype(np.intp)
        if batch_dims == 0:
            np.take(x, idx, axis=axis, out=outs[0])
            return
        batch = int(np.prod(x.shape[:batch_dims]))
        xb = x.reshape(batch, *x.shape[batch_dims:])
        ib = idx.reshape(batch, *idx.shape[batch_dims:])
        ob = outs[0].reshape(batch, *outs[0].shape[batch_dims:])
        for j in range(batch):
            ob[j] = np.take(xb[j], ib[j], axis=axis - batch_dims)
    return run


@kernel("ONE_HOT")
def one_hot(op: Op):
    """``on_value`` where the index equals the position along the new axis, else ``off_value`` (an index
    outside [0, depth) matches nothing)."""
    rank = len(op.inputs[0].shape)
    axis = op.options.get("axis", -1) % (rank + 1)

    def run(ins, outs):
        depth = int(np.asarray(ins[1]).ravel()[0])
        classes = np.arange(depth).reshape((depth,) + (1,) * (rank - axis))
        hit = np.expand_dims(np.asarray(ins[0]), axis) == classes
        np.copyto(outs[0], np.where(hit, np.asarray(ins[2]).ravel()[0], np.asarray(ins[3]).ravel()[0]))
    return run


@kernel("GATHER_ND")
def gather_nd(op: Op):
    def run(ins, outs):
        idx = np.asarray(ins[1]).astype(np.intp)
        np.copyto(outs[0], ins[0][tuple(np.moveaxis(idx, -1, 0))])
    return run


def _pad_regions(pads, out_shape) -> tuple[tuple[slice, ...], list[tuple[slice, ...]]]:
    """The interior slice and the border slabs that together cover a padded output exactly once."""
    rank = len(out_shape)
    interior = tuple(slice(int(b), int(d - a)) for (b, a), d in zip(pads, out_shape))
    borders = []
    for axis, (before, after) in enumerate(pads):
        lead = interior[:axis]
        rest = (slice(None),) * (rank - axis - 1)
        if before:
            borders.append(lead + (slice(0, int(before)),) + rest)
        if after:
            borders.append(lead + (slice(int(out_shape[axis] - after), None),) + rest)
    return interior, borders


@kernel("PAD", "PADV2")
def pad(op: Op):
    native = _native_channel_pad(op, constant(op.inputs[1]), constant(op.input(2)))
    if native is not None:
        return native
    return region_pad(op, 0)


def region_pad(op: Op, default_fill):
    """run() of a PAD/PADV2 that fills the borders (PADV2's value, else ``default_fill``) and copies the input
    into the interior, in place: one pass over the output."""
    out_shape = op.outputs[0].shape
    fixed = constant(op.inputs[1])
    fill_value = constant(op.input(2))

    def regions(pads):
        return _pad_regions(np.asarray(pads).reshape(-1, 2), out_shape)

    planned = regions(fixed) if fixed is not None else None

    def run(ins, outs):
        interior, borders = planned or regions(ins[1])
        value = default_fill if op.input(2) is None else _operand(fill_value, ins, 2).ravel()[0]
        out = outs[0]
        for region in borders:
            out[region] = value
        out[interior] = ins[0]
    return run


def _native_channel_pad(op: Op, pads, fill_value):
    """A float pad of the last axis alone (channels appended for a residual ADD) in the native loops,
    one pass; None where those do not serve."""
    shape = op.outputs[0].shape
    if pads is None or op.inputs[0].dtype.numpy != np.float32 or not shape:
        return None
    pads = np.asarray(pads).reshape(-1, 2)
    if pads[:-1].any() or (op.input(2) is not None and fill_value is None):
        return None
    loops = float_loops(op)
    if loops is None:
        return None
    before, after = (int(v) for v in pads[-1])
    value = 0.0 if fill_value is None else float(np.asarray(fill_value).ravel()[0])
    call = PadCall(op.inputs[0].shape, before, after, value, team_for(math.prod(shape), PER_THREAD_ITEMS))
    return laid_out(prepared_run(loops, call), 1, 2)


@kernel("MIRROR_PAD")
def mirror_pad(op: Op):
    mode = "reflect" if op.options.get("mode", "REFLECT") == "REFLECT" else "symmetric"
    fixed = constant(op.inputs[1])

    def run(ins, outs):
        pads = np.asarray(_operand(fixed, ins, 1)).reshape(-1, 2).astype(int)
        np.copyto(outs[0], np.pad(ins[0], pads, mode=mode))
    return run


@kernel("DEPTH_TO_SPACE")
def depth_to_space(op: Op):
    b = op.options["block_size"]
    n, h, w, c = op.inputs[0].shape
    depth = c // (b * b)

    def run(ins, outs):
        blocks = ins[0].reshape(n, h, w, b, b, depth).transpose(0, 1, 3, 2, 4, 5)
        np.copyto(outs[0].reshape(n, h, b, w, b, depth), blocks)
    return run


@kernel("SPACE_TO_DEPTH")
def space_to_depth(op: Op):
    b = op.options["block_size"]
    n, h, w, c = op.inputs[0].shape

    def run(ins, outs):
        blocks = ins[0].reshape(n, h // b, b, w // b, b, c).transpose(0, 1, 3, 2, 4, 5)
        np.copyto(outs[0].reshape(n, h // b, w // b, b, b, c), blocks)
    return run


@kernel("BROADCAST_TO")
def broadcast_to(op: Op):
    def run(ins, outs):
        np.copyto(outs[0], ins[0])
    return run


@kernel("SHAPE")
def shape(op: Op):
    dims = np.asarray(op.inputs[0].shape)

    def run(ins, outs):
        outs[0][...] = dims
    return run


@kernel("FILL")
def fill(op: Op):
    def run(ins, outs):
        outs[0].fill(np.asarray(ins[1]).ravel()[0])
    return run
