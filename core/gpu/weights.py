"""Weights rearranged for PHWC4 kernels: blocks of 4 output x 4 input channels, read as 4-lane vectors.

A kernel producing the output vector of slice ``so`` multiplies each input
vector ``v`` of slice ``si`` by a 4x4 block stored as four vectors: vector
``i`` holds the weights of input lane ``i`` for the four output channels, so
the product is ``w0 * v.x + w1 * v.y + w2 * v.z + w3 * v.w``.  Channels past
the real counts are zero, matching the zero padding lanes of the tensors.
All functions return float32 arrays of shape ``[..., 4]`` (one row per vector).
"""

from __future__ import annotations

import numpy as np

from .layout import slices


def _pad_channels(w: np.ndarray, out_axis: int, in_axis: int) -> np.ndarray:
    pad = [(0, 0)] * w.ndim
    pad[out_axis] = (0, slices(w.shape[out_axis]) * 4 - w.shape[out_axis])
    pad[in_axis] = (0, slices(w.shape[in_axis]) * 4 - w.shape[in_axis])
    return np.pad(np.asarray(w, np.float32), pad)


def dense_groups(weights: np.ndarray, in_channels: int) -> np.ndarray:
    """Grouped convolution weights ``[O, KH, KW, I/groups]`` as dense ``[O, KH, KW, I]`` (zeros off the groups)."""
    o, kh, kw, per_group = weights.shape
    if per_group == in_channels:
        return np.asarray(weights, np.float32)
    groups = in_channels // per_group
    dense = np.zeros((o, kh, kw, in_channels), np.float32)
    out_per_group = o // groups
    for g in range(groups):
        rows = slice(g * out_per_group, (g + 1) * out_per_group)
        dense[rows, :, :, g * per_group:(g + 1) * per_group] = weights[rows]
    return dense


def conv_blocks(weights: np.ndarray) -> np.ndarray:
    """``[O, KH, KW, I]`` -> vectors ordered ``[S_out][KH][KW][S_in][input lane]`` (4 output channels each)."""
    w = _pad_channels(weights, 0, 3)
    o4, kh, kw, i4 = w.shape
    blocks = w.reshape(o4 // 4, 4, kh, kw, i4 // 4, 4)  # so, o, ky, kx, si, i
    return np.ascontiguousarray(blocks.transpose(0, 2, 3, 4, 5, 1).reshape(-1, 4))


def matrix_blocks(weights: np.ndarray) -> np.ndarray:
    """Fully connected ``[O, I]`` -> vectors ordered ``[S_out][S_in][input lane]``."""
    o, i = weights.shape
    return conv_blocks(np.asarray(weights).reshape(o, 1, 1, i))


def depthwise_vectors(weights: np.ndarray) -> np.ndarray:
    """Depthwise ``[1, KH, KW, C*M]`` -> vectors ordered ``[S_out][KH][KW]`` of 4 output channels."""
    _, kh, kw, c = weights.shape
    w = _pad_channels(np.asarray(weights).reshape(kh, kw, c), 2, 2)
    return np.ascontiguousarray(w.reshape(kh, kw, -1, 4).transpose(2, 0, 1, 3).reshape(-1, 4))


def channel_vectors(values: np.ndarray | None, channels: int) -> np.ndarray:
    """A per-channel vector (bias) as slices of 4, zeros when absent."""
    out = np.zeros(slices(channels) * 4, np.float32)
    if values is not None:
        out[:channels] = np.asarray(values, np.float32).ravel()
    return out.reshape(-1, 4)
