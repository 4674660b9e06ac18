"""SPACE_TO_BATCH_ND and BATCH_TO_SPACE_ND: how converters express atrous (dilated) convolutions."""

from __future__ import annotations

import numpy as np

from delegate.plugin_api import Op

from ..registry import kernel


def _blocks(op: Op, index: int) -> np.ndarray:
    return np.asarray(op.inputs[index].data, np.int64).ravel()


@kernel("SPACE_TO_BATCH_ND")
def space_to_batch(op: Op):
    block = _blocks(op, 1)
    pads = np.asarray(op.inputs[2].data, np.int64).reshape(-1, 2)
    m = len(block)

    def run(ins, outs):
        x = ins[0]
        width = [(0, 0)] + [tuple(p) for p in pads] + [(0, 0)] * (x.ndim - 1 - m)
        padded = np.pad(x, width)
        n, spatial, rest = padded.shape[0], padded.shape[1:1 + m], padded.shape[1 + m:]
        split = [n]
        for size, b in zip(spatial, block):
            split += [size // b, b]
        y = padded.reshape(split + list(rest))
        # block offsets to the front, then batch, then the reduced spatial dims
        order = [2 + 2 * i for i in range(m)] + [0] + [1 + 2 * i for i in range(m)] + \
            list(range(1 + 2 * m, y.ndim))
        outs[0][...] = y.transpose(order).reshape(outs[0].shape)
    return run


@kernel("BATCH_TO_SPACE_ND")
def batch_to_space(op: Op):
    block = _blocks(op, 1)
    crops = np.asarray(op.inputs[2].data, np.int64).reshape(-1, 2)
    m = len(block)

    def run(ins, outs):
        x = ins[0]
        n = x.shape[0] // int(np.prod(block))
        spatial, rest = x.shape[1:1 + m], x.shape[1 + m:]
        y = x.reshape(list(block) + [n] + list(spatial) + list(rest))
        order = [m]
        for i in range(m):
            order += [m + 1 + i, i]
        order += list(range(1 + 2 * m, y.ndim))
        full = y.transpose(order).reshape([n] + [s * b for s, b in zip(spatial, block)] + list(rest))
        index = (slice(None),) + tuple(slice(c[0], full.shape[1 + i] - c[1]) for i, c in enumerate(crops))
        outs[0][...] = full[index]
    return run
