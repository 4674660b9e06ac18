"""Helpers shared by the CPU kernels: fused activations, compile-time constants, axes, padding, scratch."""

from __future__ import annotations

import math
import threading
from typing import Callable

import numpy as np

from delegate.plugin_api import CLAMPS, Op, Sparsity, Tensor, constant, dequantize_array, known_at_compile_time  # noqa: F401


def activation(name: str | None, slope: np.ndarray | None = None) -> Callable[[np.ndarray], None] | None:
    """In-place fused activation (TFLite ``fused_activation_function``), or None for NONE.  PRELU (an
    activation op fused into its producer, see fusion.py) takes its ``slope`` per channel."""
    if name in (None, "NONE"):
        return None
    if name == "PRELU":
        excess = np.asarray(slope, np.float32) - np.float32(1)

        def prelu(x):  # x + (slope - 1) * min(x, 0)
            negative = np.minimum(x, 0, out=scratch("activation", x.shape, x.dtype))
            np.multiply(negative, excess, out=negative)
            np.add(x, negative, out=x)
        return prelu
    # clip runs a vector loop where maximum against a scalar does not; the method skips np.clip's
    # dispatch, microseconds a call.
    if name in CLAMPS:
        low, high = CLAMPS[name]
        return lambda x: x.clip(low, high, out=x)
    if name == "TANH":
        return lambda x: np.tanh(x, out=x)
    if name == "SIGN_BIT":
        return lambda x: np.copyto(x, np.signbit(x).astype(x.dtype))
    raise ValueError(f"unsupported fused activation {name!r}")


def fused_name(op: Op) -> str:
    """The fused activation LiteRT's kernel for ``op`` applies: its activation range (a clamp), and no
    TANH or SIGN_BIT, which only recurrent kernels apply (measured: LiteRT's ADD, MUL, CONV_2D and
    MAX_POOL_2D leave results as they are under either); or a PRELU fused here (see fusion.py)."""
    name = op.options.get("fused_activation_function") or "NONE"
    return "NONE" if name in ("TANH", "SIGN_BIT") else name


def fused(op: Op) -> Callable[[np.ndarray], None]:
    """The op's fused activation (see fused_name) as an in-place callable (a no-op when there is none)."""
    act = activation(fused_name(op), op.options.get("prelu_slope"))
    return act if act is not None else (lambda x: None)


def float_constant(t: Tensor | None) -> np.ndarray | None:
    """A compile-time constant as float32, dequantizing weight-only quantized integers."""
    value = constant(t)
    if value is None:
        return None
    return dequantize_array(value, t) if value.dtype.kind in "iu" else value.astype(np.float32)


def along_rows(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``values`` (broadcast against arrays of ``shape``) laid out over the last two dims of ``shape``.

    A per-channel vector against an NHWC tensor makes numpy loop over the
    channels for every pixel; repeated along the width it can run one long
    inner loop per row instead.  Values that vary over leading dims are returned as they are.
    """
    values = np.asarray(values)
    if len(shape) < 2 or any(d != 1 for d in values.shape[:-2]):
        return values
    trailing = values.reshape(values.shape[-2:]) if values.ndim > 2 else values
    return np.ascontiguousarray(np.broadcast_to(trailing, shape[-2:]))


def contiguous_layout(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, strides in items) of a contiguous array of ``shape``."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(shape), tuple(reversed(strides))


def normalize_axes(axes, rank: int) -> tuple[int, ...]:
    """Sorted, de-duplicated non-negative axes."""
    return tuple(sorted({int(a) % rank for a in np.asarray(axes).ravel()})) if rank else ()


def same_padding(size: int, kernel: int, stride: int, dilation: int, out: int) -> tuple[int, int]:
    """(before, after) padding TFLite uses for SAME; the extra odd pixel goes after."""
    effective = (kernel - 1) * dilation + 1
    total = max((out - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def window_view(x: np.ndarray, out_hw: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int],
                dilation: tuple[int, int] = (1, 1)) -> np.ndarray:
    """Zero-copy (N, OH, OW, KH, KW, C) view of the sliding windows over an NHWC array."""
    n, _, _, c = x.shape
    sn, sh, sw, sc = x.strides
    return strided(x, (n, out_hw[0], out_hw[1], kernel[0], kernel[1], c),
                   (sn, sh * stride[0], sw * stride[1], sh * dilation[0], sw * dilation[1], sc))


def strided(x: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A view of ``x``'s memory with other shape and strides, staying within ``x``: built directly
    on contiguous arrays (as_strided costs several microseconds a call)."""
    if x.flags.c_contiguous:
        return np.ndarray(shape, x.dtype, x, 0, strides)
    return np.lib.stride_tricks.as_strided(x, shape, strides, writeable=False)


class Padded:
    """The NHWC input inside a border of a fill value, built in scratch memory on each call.

    Scratch rather than a buffer per kernel, so a model holds one padded image at a time;
    the border is rewritten every call since other kernels share that memory.  Without
    padding it hands the input through unchanged, so callers need not special-case it.
    """

    def __init__(self, shape: tuple[int, ...], pads: tuple[int, int, int, int], fill: float = 0.0,
                 dtype=np.float32, slot="padded"):
        n, h, w, c = shape
        top, bottom, left, right = pads
        self.any = any(pads)
        self.shape = (n, h + top + bottom, w + left + right, c)
        self.dtype, self.fill, self.slot = dtype, fill, slot
        rows, cols = slice(top, top + h), slice(left, left + w)
        self.inside = (slice(None), rows, cols)
        self.border = [(slice(None), slice(0, top)), (slice(None), slice(top + h, None)),
                       (slice(None), rows, slice(0, left)), (slice(None), rows, slice(left + w, None))]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if not self.any:
            return x
        buffer = scratch(self.slot, self.shape, self.dtype)
        for strip in self.border:
            buffer[strip] = self.fill
        np.copyto(buffer[self.inside], x)
        return buffer


class PaddedRows:
    """Bands of rows of the padded NHWC input, built in scratch, optionally split into column phases.

    Phase p holds the padded columns p, p + s, p + 2s, ... (s = ``column_stride``): in it,
    a filter tap's window under that column stride has contiguous rows again.  Values
    are converted to ``dtype`` less ``offset`` (quantized inputs less their zero point,
    so that padding adds nothing).  A band is built by the thread that consumes it,
    while it is in that thread's cache.  With nothing to pad, split or convert, a band
    is a view of the input.
    """

    def __init__(self, shape: tuple[int, ...], pads: tuple[int, int, int, int], column_stride: int = 1,
                 dtype=np.float32, source_dtype=np.float32, offset: float = 0):
        n, h, w, c = shape
        top, _, left, right = pads
        self.top, self.height, self.stride, self.offset = top, h, column_stride, offset
        self.columns = [_phase_span(w, left, right, p, column_stride) for p in range(column_stride)]
        self.shape = (column_stride, n, max(length for length, *_ in self.columns), c)
        self.dtype = np.dtype(dtype)
        self.gathers = column_stride > 1 or any(pads)
        self.converts = self.dtype != source_dtype or bool(offset)

    def band(self, x: np.ndarray, first: int, end: int) -> np.ndarray:
        """Padded rows first..end as (phases, N, rows, phase width, C)."""
        if not self.converts:
            return self._gather(x, first, end, 0) if self.gathers else x[None, :, first:end]
        # Gathered in the input's own type (padding with the offset), then converted contiguously.
        raw = self._gather(x, first, end, self.offset) if self.gathers else x[None, :, first:end]
        band = scratch("padded", raw.shape, self.dtype)
        convert(raw, self.offset, band)
        return band

    def _gather(self, x: np.ndarray, first: int, end: int, fill) -> np.ndarray:
        phases, n, width, c = self.shape
        band = scratch("gathered", (phases, n, end - first, width, c), x.dtype)
        r0 = min(max(self.top, first), end) - first
        r1 = min(max(self.top + self.height, first), end) - first
        if r0:
            band[:, :, :r0] = fill
        if r1 < end - first:
            band[:, :, r1:] = fill
        s = self.stride
        for image, (_, j0, j1, x0) in zip(band, self.columns):
            if j0:
                image[:, r0:r1, :j0] = fill
            if j1 < width:
                image[:, r0:r1, j1:] = fill
            rows = slice(first + r0 - self.top, first + r1 - self.top)
            np.copyto(image[:, r0:r1, j0:j1], x[:, rows, x0:x0 + (j1 - j0 - 1) * s + 1:s])
        return band


def convert(x: np.ndarray, offset: float, out: np.ndarray) -> None:
    """``out`` = x - offset in ``out``'s type (a plain copy without an offset)."""
    if offset:
        np.subtract(x, offset, out=out, dtype=out.dtype, casting="unsafe")
    else:
        np.copyto(out, x, casting="unsafe")


def _phase_span(size: int, before: int, after: int, phase: int, stride: int) -> tuple[int, int, int, int]:
    """Along one axis of a phase image: (length, first and end index inside the input, first input index)."""
    length = -(-(size + before + after - phase) // stride)
    first = min(length, max(0, -(-(before - phase) // stride)))
    end = max(first, min(length, -(-(size + before - phase) // stride)))
    return length, first, end, first * stride + phase - before


class _Scratch:
    """One thread's scratch memory: the requests of each op packed into one buffer from its start.

    Every slot an op asks for gets its own region, so the memory is the largest total any single
    op needs rather than the sum over slots of their largest sizes.  ``start_op`` frees the
    regions for the next op; without it, regions are only ever added (always safe).  Views are
    cached, since ops make the same requests on every run.
    """

    ALIGN = 64

    def __init__(self) -> None:
        self.buffer = np.empty(0, np.uint8)
        self.regions: dict = {}  # slot -> (offset, bytes) for the current op
        self.top = 0
        self.views: dict = {}  # (offset, shape, dtype) -> view into the current buffer

    def start_op(self) -> None:
        self.regions.clear()
        self.top = 0

    def take(self, slot, shape: tuple[int, ...], dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        size = math.prod(shape) * dtype.itemsize
        region = self.regions.get(slot)
        if region is None or region[1] < size:
            region = self.regions[slot] = (self.top, size)
            self.top += -(-max(size, 1) // self.ALIGN) * self.ALIGN
            if self.top > self.buffer.nbytes:
                # Views already handed out keep the old buffer alive for as long as they are used.
                self.buffer = np.empty(self.top, np.uint8)
                self.views.clear()
        key = (region[0], shape, dtype)
        view = self.views.get(key)
        if view is None:
            view = self.views[key] = self.buffer[region[0]:region[0] + size].view(dtype).reshape(shape)
        return view


_SCRATCH = threading.local()


def _thread_scratch() -> _Scratch:
    state = getattr(_SCRATCH, "state", None)
    if state is None:
        state = _SCRATCH.state = _Scratch()
    return state


def scratch(slot, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    """A temporary array for the duration of one kernel run, from the calling thread's scratch memory.

    Kernels take it at run time; distinct arrays of one kernel need distinct slots (any
    hashable), asking for a slot again in the same op returns the same memory, and nothing
    in them outlives the op (see start_scratch_op).  Sharing keeps a model's temporaries to
    the size of its largest op, warm in cache.
    """
    return _thread_scratch().take(slot, tuple(shape), dtype)


def start_scratch_op() -> None:
    """The calling thread begins another op (or another op's share of work): earlier scratch is free."""
    _thread_scratch().start_op()
