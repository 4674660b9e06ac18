"""Native loops (native.c) for the CPU kernels, built on first use with the machine's C compiler.

numpy runs a depthwise convolution's tap sums with short vectors, copies padded
and im2col inputs, makes a pass per bias, clamp or elementwise step, and cannot
share one op between cores without handing chunks to Python threads, which costs
tens of microseconds a chunk.  native.c runs those ops (convolutions read in place,
products against weights packed once, shared BLAS products, elementwise ops, pooling,
resizing, the quantized output stage) in one pass each on an OpenMP team.  It is built
once per machine (``-march=native``) into the user cache; without a C compiler with OpenMP, or
with ``cpu: {native: false}``, the kernels keep their numpy formulations, which
agree up to float rounding (sums run in another order).
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import shlex
import threading
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np

from delegate.plugin_api import ExecutionError, aligned_zeros, load_library

from .parallel import available_cores, loaded_openblas, native_allowed, native_team

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native.c")
# Flag sets tried in order: x86 compilers take -march=native, some ARM ones only -mcpu=native.
# -Werror=vla: scratch lives on the heap (a window's tap lists may be megabytes), never on the stack.
FLAG_SETS = (["-O3", "-march=native", "-fopenmp", "-Werror=vla"], ["-O3", "-mcpu=native", "-fopenmp", "-Werror=vla"])
# DELEGATE_NATIVE_SANITIZE=address builds the loops with AddressSanitizer, under a cache key of their
# own (the host process then needs libasan preloaded: tests/test_native_asan.py runs them so).
SANITIZE_ENV = "DELEGATE_NATIVE_SANITIZE"
SANITIZE_FLAGS = {"address": ["-fsanitize=address", "-fno-omit-frame-pointer", "-g"]}
# DELEGATE_NATIVE_CFLAGS: compiler flags added after the others (under a cache key of their own): tests
# build the loops with "-mno-avx2" to run the portable integer products on a machine with AVX2.
EXTRA_FLAGS_ENV = "DELEGATE_NATIVE_CFLAGS"
# How long (spin iterations) OpenMP threads spin for the next kernel before they sleep: long enough
# to bridge the gaps between a run's kernels, short enough not to take a core from whatever runs
# after it (libgomp's default spins for milliseconds).
SPIN_COUNT = "10000"

# Least work a native loop gives each thread when it shares among them: multiply-adds of products and
# convolutions, items of elementwise loops.  Less runs on the calling thread alone: on 16 cores small
# elementwise ops split 16 ways ran at half the speed of 2 ways.  Products and convolutions share from 8K
# multiply-adds a thread: at 32K MobileNetV2's late depthwise convolutions (7x7x960: 423K) ran alone at
# 16 threads, 71 us where LiteRT's took 10 (H200, numpy engine / LiteRT at 16 threads, two rounds each:
# MobileNetV2 224 fp32 1.52 / 1.52 at 32K, 1.39 / 1.16 at 8K; over six models 1.29 -> 1.14 on average).
PER_THREAD_MACS = 1 << 13
PER_THREAD_ITEMS = 1 << 12
# Most threads a native loop runs on.
MAX_TEAM = 16
# Least multiply-adds a partition's large ops (see partition_team) give each thread of its team.
# Measured on 16 cores, 16 threads (teams then from the median op): iris_landmark (median and upper
# quartile 2.1M) ran 1.09-1.24 ms on a team of 8 and 1.43 on 16; pose_landmark_full (median 8.0M) 4.9 ms
# on 8 and 4.2 on 16.
TEAM_SHARE = 1 << 18
# The elementwise kernels of native.c, in the order of its enums.
BINARY_KINDS = ("ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM", "DIV", "SQUARED_DIFFERENCE")
# How each operand of a binary call covers the output viewed as (rows, columns) (native.c's binary_form).
BINARY_FORMS = ("WHOLE", "PER_COLUMN", "PER_ROW", "ONE")
UNARY_KINDS = ("COPY", "HARD_SWISH", "LOGISTIC", "GELU", "GELU_TANH", "RSQRT")

# The integer products native.c was built with, by its integer_isa().
INTEGER_ISAS = ("portable", "avx2", "avx512vnni")

# Output types of rescale_rows, in the order of its out_kind.
_RESCALED = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))

_INT64 = ctypes.c_int64
_PTR = ctypes.c_void_p


def own_address(call: ctypes.Structure):
    """The pointer a prepared call passes for itself.  Not ``ctypes.byref``: kept on the call, a byref object
    references the call, and the garbage collector cannot see through it, so every call (and the packed
    weights and tables it keeps) outlived its session (a numpy-engine session of an int8 MobileNet left
    1.4 MB behind at each load and close)."""
    return ctypes.cast(ctypes.c_void_p(ctypes.addressof(call)), ctypes.POINTER(type(call)))
_F32 = np.dtype(np.float32)


def fits(condition: bool, what: str) -> None:
    """The ctypes boundary: a native call whose arrays do not hold what its loops address is refused
    (validation should have refused the model first; this keeps a gap there from reading or writing
    past a buffer)."""
    if not condition:
        raise ExecutionError(f"cpu native loops refused a call: {what}")


def _laid_out(a: np.ndarray, layout: tuple[tuple[int, ...], tuple[int, ...]], dtype=_F32) -> bool:
    """Whether ``a`` is of ``dtype`` and the layout's shape and strides in items (those of unit
    dimensions aside: numpy leaves them arbitrary)."""
    shape, strides = layout
    if a.dtype != dtype or a.shape != shape:
        return False
    strides = tuple(a.itemsize * s for s in strides)
    return a.strides == strides or all(s == t for d, s, t in zip(shape, a.strides, strides) if d > 1)


def _contiguous(a: np.ndarray, size: int | None = None, dtype=_F32) -> bool:
    return a.dtype == dtype and a.flags.c_contiguous and (size is None or a.size == size)


def _done(status: int, what: str) -> None:
    if status:
        raise MemoryError(f"cpu native {what}: no memory for its scratch")


class Epilogue(ctypes.Structure):
    """What a float kernel's output rows get once computed: a bias (per column; None for none) and its
    fused activation: a clamp (RELU, RELU6, RELU_N1_TO_1) or a PReLU slope (per column).  Where the
    call of a product or convolution holds a residual operand (a residual ADD fused in), the kernel
    adds it next, then applies the ADD's activation: a clamp to ``add_bounds`` or a PReLU by ``add_slope``
    (per column; None for none)."""

    _fields_ = [("bias", _PTR), ("clamp", ctypes.c_int), ("low", ctypes.c_float), ("high", ctypes.c_float),
                ("slope", _PTR), ("add_clamp", ctypes.c_int), ("add_low", ctypes.c_float),
                ("add_high", ctypes.c_float), ("residual", _INT64), ("adds", _INT64), ("add_slope", _PTR)]

    def __init__(self, bias: np.ndarray | None = None, bounds: tuple[float, float] | None = None,
                 slope: np.ndarray | None = None, add_bounds: tuple[float, float] | None = None,
                 add_slope: np.ndarray | None = None):
        self.kept = None if bias is None else np.ascontiguousarray(bias, np.float32)
        self.kept_slope = None if slope is None else np.ascontiguousarray(slope, np.float32)
        self.kept_add_slope = None if add_slope is None else np.ascontiguousarray(add_slope, np.float32)
        self.bounds, self.add_bounds = bounds, add_bounds
        low, high = bounds or (0.0, 0.0)
        super().__init__(None if self.kept is None else self.kept.ctypes.data, bounds is not None, low, high,
                         None if self.kept_slope is None else self.kept_slope.ctypes.data, add_bounds is not None,
                         *(add_bounds or (0.0, 0.0)), 0, 0,
                         None if self.kept_add_slope is None else self.kept_add_slope.ctypes.data)

    def covers(self, columns: int) -> bool:
        """Whether its per-column arrays hold ``columns`` values (what the loops read of them)."""
        return all(v is None or v.size >= columns for v in (self.kept, self.kept_slope, self.kept_add_slope))

    def _with(self, change) -> "Epilogue":
        """This epilogue with ``change`` applied to its per-column arrays."""
        def changed(values):
            return None if values is None else change(values)
        return Epilogue(changed(self.kept), self.bounds, changed(self.kept_slope), self.add_bounds,
                        changed(self.kept_add_slope))

    def columns(self, first: int, end: int) -> "Epilogue":
        """The epilogue of columns first..end (itself when that is all of them, or it has none)."""
        per_column = next((v for v in (self.kept, self.kept_slope, self.kept_add_slope) if v is not None), None)
        if per_column is None or (first, end) == (0, len(per_column)):
            return self
        return self._with(lambda values: values[first:end])

    def tiled(self, times: int) -> "Epilogue":
        """The epilogue of rows holding ``times`` pixels of these columns each (a depthwise output row)."""
        return self._with(lambda v: np.tile(v, times))

    def padded(self, columns: int) -> "Epilogue":
        """The epilogue of ``columns`` columns, zero past these (a packed operand's whole panels)."""
        def pad(v):
            padded = np.zeros(columns, np.float32)
            padded[:len(v)] = v
            return padded
        return self._with(pad)


NO_EPILOGUE = Epilogue()


class Geometry(ctypes.Structure):
    """Where a native convolution reads and writes (native.c's geometry): ``images`` inputs of
    (h, w, c), image_in floats apart; their (oh, ow) outputs, rows out_stride and images image_out
    floats apart; the filter's window, strides, dilations and top and left padding."""

    _fields_ = [(name, ctypes.c_int64) for name in (
        "images", "h", "w", "c", "image_in", "oh", "ow", "out_stride", "image_out",
        "kh", "kw", "stride_h", "stride_w", "dh", "dw", "top", "left")]

    @classmethod
    def of(cls, op, x: np.ndarray | tuple, out: np.ndarray | tuple, pads: tuple[int, ...], top: int | None = None):
        """The geometry of ``op`` (a convolution, or a pool with its filter size in the options) from
        input images x (N, H, W, C) to output rows out (N, OH, OW, units), arrays or their (shape,
        float strides); ``top`` overrides the top padding (a band of the input rows)."""
        opts = op.options
        kh, kw = (opts["filter_height"], opts["filter_width"]) if "filter_height" in opts else op.inputs[1].shape[1:3]
        steps = (opts.get("stride_h", 1), opts.get("stride_w", 1), opts.get("dilation_h_factor", 1),
                 opts.get("dilation_w_factor", 1))
        return cls.around(x, out, (kh, kw), steps, (pads[0] if top is None else top, pads[2]))

    @classmethod
    def around(cls, x, out, window: tuple[int, int], steps: tuple[int, int, int, int], before: tuple[int, int]):
        """The geometry of a (kh, kw) window with (stride_h, stride_w, dh, dw) steps and (top, left)
        padding from x to out (arrays or their (shape, float strides)), checked against both."""
        (n, h, w, c), x_strides = _shape_and_strides(x)
        out_shape, out_strides = _shape_and_strides(out)
        _, oh, ow, _ = out_shape
        where = cls(n, h, w, c, x_strides[0], oh, ow, out_strides[1], out_strides[0], *window, *steps, *before)
        where.check((n, h, w, c), x_strides, out_shape, out_strides)
        return where

    def check(self, x_shape, x_strides, out_shape, out_strides) -> None:
        """What the loops assume (positive windows, strides and dilations, no left padding < 0 (rows
        are each checked against the image, a band may start inside it), pixels of contiguous
        channels), and the layouts a call's arrays must have (``x_layout``, ``out_layout``)."""
        fits(min(self.kh, self.kw, self.stride_h, self.stride_w, self.dh, self.dw) >= 1
             and min(self.left, self.images, self.h, self.oh, self.ow) >= 0 and min(self.w, self.c) >= 1,
             f"geometry {[getattr(self, f) for f, _ in self._fields_]} is out of range")
        fits(tuple(x_strides[1:]) == (self.w * self.c, self.c, 1) and x_strides[0] >= self.h * self.w * self.c,
             f"input strides {list(x_strides)} are not of whole (h, w, c) images")
        fits(len(out_shape) == 4 and tuple(out_shape[:3]) == (self.images, self.oh, self.ow) and
             out_strides[3] == 1 and out_strides[2] == out_shape[3] and out_strides[1] >= self.ow * out_shape[3]
             and out_strides[0] >= self.oh * out_strides[1], f"output layout {list(out_shape)} {list(out_strides)}")
        self.x_layout = (tuple(x_shape), tuple(x_strides))
        self.out_layout = (tuple(out_shape), tuple(out_strides))

    def placed(self, x: np.ndarray, out: np.ndarray, dtype=_F32) -> None:
        """Refuse arrays other than those this geometry was checked for (of ``dtype``)."""
        fits(_laid_out(x, self.x_layout, dtype) and _laid_out(out, self.out_layout, dtype),
             f"arrays {x.shape} -> {out.shape} differ from the geometry's {self.x_layout[0]} -> {self.out_layout[0]}")


def _shape_and_strides(a) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """An array's (shape, strides in items), those of unit dimensions (arbitrary in numpy) made the
    contiguous ones; or the pair itself."""
    if not isinstance(a, np.ndarray):
        return a
    strides, inner = [], 1
    for d, s in zip(reversed(a.shape), reversed(a.strides)):
        strides.append(inner if d == 1 else s // a.itemsize)
        inner = strides[-1] * d
    return a.shape, tuple(reversed(strides))


_ADDRESSES: dict[int, tuple] = {}  # id(array) -> (weak reference to it, its data address)


def address(array: np.ndarray) -> int:
    """The data address of ``array``.  Kernels hand the native loops the same arena buffers and
    constants run after run, so each is looked up once (``array.ctypes`` costs ~1 us a call)."""
    known = _ADDRESSES.get(id(array))
    if known is not None and known[0]() is array:
        return known[1]
    if len(_ADDRESSES) > 4096:  # arrays come and go (views): start over now and then
        _ADDRESSES.clear()
    value = array.ctypes.data
    _ADDRESSES[id(array)] = (weakref.ref(array), value)
    return value


class NativeLoops:
    """The loaded library, with the BLAS sgemm it shares out (None where no known BLAS is loaded)."""

    def __init__(self, library: ctypes.CDLL, flags: list[str] = ()):
        self.library = library
        self.flags = list(flags)  # what it was built with (a sanitizer, say)
        finish = ctypes.POINTER(Epilogue)
        library.depthwise_prepared.argtypes = [ctypes.POINTER(DepthwiseCall)]
        library.depthwise_prepared.restype = ctypes.c_int
        library.binary_prepared.argtypes = [ctypes.POINTER(BinaryCall)]
        library.binary_prepared.restype = ctypes.c_int
        library.rescale_rows.argtypes = [_PTR, ctypes.c_int, _INT64, _PTR, _PTR, _PTR, ctypes.c_int, _PTR, _PTR,
                                         _INT64, _INT64, _PTR, ctypes.c_int, *[_INT64] * 3, ctypes.c_int]
        library.rescale_rows.restype = None
        library.shared_product.argtypes = [_PTR, ctypes.c_int, ctypes.c_int, _INT64, _INT64, _INT64, _PTR, _INT64,
                                           _PTR, _INT64, _PTR, _INT64, finish, ctypes.c_int]
        library.shared_product.restype = None
        library.run_prepared.argtypes = [_PTR, _PTR, _INT64]
        library.run_prepared.restype = ctypes.c_int
        library.run_prepared_timed.argtypes = [_PTR, _PTR, _INT64, _PTR]
        library.run_prepared_timed.restype = ctypes.c_int
        library.set_team_limit.argtypes = [ctypes.c_int]
        library.set_team_limit.restype = None
        library.get_team_limit.restype = ctypes.c_int
        for call in (ProductCall, ConvCall, CopyCall, MeanCall, SoftmaxCall, UnaryCall, PadCall, PoolCall, PreluCall,
                     ResizeCall, TransposeCall, BatchProductCall, HybridFcCall):
            getattr(library, call.symbol).argtypes = [ctypes.POINTER(call)]
            getattr(library, call.symbol).restype = ctypes.c_int
        calls = [(call.symbol, call) for call in (QProductCall, QConvCall, QDepthwiseCall, QBinaryCall, QPoolCall,
                                                         LookupCall, QMeanCall, QSoftmaxCall, QLstmCall, QuantizeCall)]
        for symbol, call in calls + [(symbol, WideCall) for symbol in WideCall.symbols.values()]:
            getattr(library, symbol).argtypes = [ctypes.POINTER(call)]
            getattr(library, symbol).restype = ctypes.c_int
        self.panel_lanes = library.panel_lanes()
        self.integer_isa = INTEGER_ISAS[library.integer_isa()]
        self.integer_group = library.integer_group()
        library.integer_panel_groups.argtypes = [_INT64]
        library.integer_panel_groups.restype = _INT64
        self.integer_amx = bool(library.integer_amx())  # asks the kernel once; panels are packed for it after
        self.integer_panel_groups = library.integer_panel_groups
        self.sgemm = _find_sgemm()

    def depthwise(self, x: np.ndarray, taps: "DepthwiseTaps", out: np.ndarray, where: "Geometry", threads: int,
                  finish: Epilogue = NO_EPILOGUE) -> None:
        """A depthwise convolution of the images at ``x``, read in place, into ``out`` (both arrays or
        views starting at the first image, laid out as ``where`` says); ``finish`` with its bias
        tiled along the output rows (see native.c)."""
        self.prepared(DepthwiseCall(taps, where, finish, threads), x, out)

    def prepared(self, call, *arrays: np.ndarray) -> None:
        """A call built at compile time, on the contiguous arrays it was built for (their shapes; the
        arrays themselves may differ from run to run): a depthwise convolution's (x, out), a binary
        op's (a, b, out), an integer kernel's (x, out)."""
        self.bind(call, *arrays)
        _done(getattr(self.library, call.symbol)(call.reference), call.symbol)

    def bind(self, call, *arrays: np.ndarray) -> None:
        """Place a prepared call's arrays (as prepared() does) without running it."""
        call.placed(*arrays)
        for name, array in zip(call.places, arrays):
            setattr(call, name, address(array))

    def finite_only(self, call, *arrays: np.ndarray) -> bool:
        """prepared() for a call that declines inputs holding a value that is not finite (its status
        NOT_FINITE, nothing written): False then, for the caller's other formulation."""
        self.bind(call, *arrays)
        status = getattr(self.library, call.symbol)(call.reference)
        if status == NOT_FINITE:
            return False
        _done(status, call.symbol)
        return True

    def conv(self, x: np.ndarray, weights: "PackedOperand", out: np.ndarray, where: "Geometry", threads: int,
             finish: Epilogue = NO_EPILOGUE) -> None:
        """A convolution read in place: ``weights`` its (KH*KW*C, units) matrix packed, ``finish`` padded
        to its panels, the rest as for depthwise."""
        self.prepared(ConvCall(weights, where, finish, threads), x, out)

    def pool(self, x: np.ndarray, out: np.ndarray, where: "Geometry", average: bool, threads: int,
             finish: Epilogue = NO_EPILOGUE) -> None:
        """MAX_POOL_2D, or AVERAGE_POOL_2D when ``average``, of the images at x into out, as ``where``
        says, padding left out; then ``finish``'s clamp (see PoolCall)."""
        self.prepared(PoolCall(where, average, finish, threads), x, out)

    def rescale(self, acc: np.ndarray, constants: tuple, bounds: tuple[int, int], out: np.ndarray,
                threads: int) -> bool:
        """A quantized output stage (see native.c's rescale_rows; ``constants``: multiplier, offset,
        shift and, where ties round away from zero, tie_below and tie, int64 per channel or a
        scalar shift); False (nothing done) where the arrays' types or layouts do not allow it."""
        if acc.dtype not in (np.float32, np.float64) or out.dtype not in _RESCALED or acc.shape != out.shape:
            return False
        acc_stride, out_stride = row_stride(acc), row_stride(out)
        if acc_stride is None or out_stride is None:
            return False
        # np.asarray keeps a scalar shift 0-d (ascontiguousarray would make it 1-d): shared by all channels.
        multiplier, offset, shift, *ties = (np.asarray(v, np.int64) for v in constants)
        channels = acc.shape[-1] if acc.ndim else 1
        fits(multiplier.size == offset.size == channels and (shift.ndim == 0 or shift.size == channels)
             and all(t.size == channels for t in ties) and len(ties) in (0, 2),
             f"rescale constants do not fit {channels} channels")
        self.library.rescale_rows(acc.ctypes.data, acc.dtype == np.float64, acc_stride, multiplier.ctypes.data,
                                  offset.ctypes.data, shift.ctypes.data, shift.ndim > 0,
                                  ties[0].ctypes.data if ties else None, ties[1].ctypes.data if ties else None,
                                  bounds[0], bounds[1], out.ctypes.data, _RESCALED.index(out.dtype), out_stride,
                                  acc.size // max(channels, 1), channels, share_among(threads, acc.size, PER_THREAD_ITEMS))
        return True

    def pad_rows(self, x: np.ndarray, out: np.ndarray, before: int, after: int, value: float, threads: int) -> None:
        """out = x with ``before`` and ``after`` values of ``value`` around each run along its last axis
        (see PadCall)."""
        self.prepared(PadCall(x.shape, before, after, value, threads), x, out)

    def product(self, lhs: np.ndarray, rhs: np.ndarray, out: np.ndarray, threads: int,
                finish: Epilogue = NO_EPILOGUE) -> bool:
        """out = lhs @ rhs in float32, then ``finish``, shared among ``threads``; False (nothing done)
        when the operands' layout or the BLAS does not allow it."""
        if self.sgemm is None or not (lhs.dtype == rhs.dtype == out.dtype == np.float32):
            return False
        trans = _row_major(lhs)
        if trans is None or _row_major(rhs) is not False or _row_major(out) is not False:
            return False
        (m, k), n = lhs.shape, rhs.shape[1]
        fits(rhs.shape[0] == k and out.shape == (m, n) and finish.covers(n), f"product {lhs.shape} @ {rhs.shape} "
                                                                         f"into {out.shape}")
        lda = (lhs.strides[1] if trans else lhs.strides[0]) // 4
        sgemm, int64 = self.sgemm
        # lhs and out are views of a block, new each run: only the operand (a constant) is looked up.
        self.library.shared_product(sgemm, int64, trans, m, n, k, lhs.ctypes.data, lda, address(rhs),
                                    rhs.strides[0] // 4, out.ctypes.data, out.strides[0] // 4, ctypes.byref(finish),
                                    threads)
        return True

    def packed_product(self, lhs: np.ndarray, rhs: "PackedOperand", out: np.ndarray, threads: int,
                       finish: Epilogue = NO_EPILOGUE) -> bool:
        """out = lhs @ rhs (lhs any float32 matrix view, out with contiguous rows), then ``finish`` (its
        bias padded to rhs's panels), shared among ``threads``; False (nothing done) when ``out``'s
        layout does not allow it."""
        if lhs.dtype != np.float32 or _row_major(out) is not False:
            return False
        fits(lhs.ndim == 2 and lhs.shape[1] == rhs.depth and out.shape == (lhs.shape[0], rhs.columns) and
             out.dtype == _F32 and finish.covers(rhs.padded_columns), f"product {lhs.shape} @ packed "
             f"({rhs.depth}, {rhs.columns}) into {out.shape}")
        call = ProductCall(lhs.shape, lhs.strides, rhs, out.strides[0] // 4, finish, threads)
        call.a, call.c = lhs.ctypes.data, out.ctypes.data
        self.library.packed_product(ctypes.byref(call))
        return True


def _adding(call, residual: bool) -> None:
    """Have a float product or convolution ``call`` add a residual operand to its outputs (its epilogue's
    ADD): a run then places that operand between the input and the output."""
    if residual:
        call.places = (call.places[0], "residual", call.places[1])


def _placed_operand(call, arrays: tuple) -> np.ndarray:
    """The output among a run's ``arrays`` (input, [residual operand,] output), a residual operand checked
    to be laid out as the output (both contiguous, of one size)."""
    fits(len(arrays) == len(call.places), f"{len(arrays)} arrays for {call.symbol}")
    if len(arrays) == 3:
        fits(_contiguous(arrays[1], arrays[2].size) and _contiguous(arrays[2]),
             f"residual operand {arrays[1].shape} for {arrays[2].shape}")
    return arrays[-1]


class ProductCall(ctypes.Structure):
    """The arguments of native.c's packed_product, kept together so that a run sets only where the
    matrices are (``a``, ``c``; with ``residual``, the operand the epilogue adds) and makes a
    one-argument call."""

    _fields_ = [("m", _INT64), ("n", _INT64), ("k", _INT64), ("a", _PTR), ("row_step", _INT64),
                ("column_step", _INT64), ("packed", _PTR), ("c", _PTR), ("ldc", _INT64),
                ("finish", ctypes.POINTER(Epilogue)), ("threads", _INT64), ("residual", _PTR)]
    symbol, places = "packed_product", ("a", "c")

    def __init__(self, shape: tuple[int, int], strides: tuple[int, int], rhs: "PackedOperand", ldc: int,
                 finish: Epilogue, threads: int, residual: bool = False):
        (m, k), (row_step, column_step) = shape, strides
        fits(k == rhs.depth and ldc >= rhs.columns and finish.covers(rhs.padded_columns),
             f"product ({m}, {k}) @ packed ({rhs.depth}, {rhs.columns}), ldc {ldc}")
        self.kept = (rhs, finish)
        super().__init__(m, rhs.columns, k, None, row_step // 4, column_step // 4, rhs.panels.ctypes.data, None,
                         ldc, ctypes.pointer(finish), threads)
        _adding(self, residual)
        self.reference = own_address(self)

    def placed(self, lhs: np.ndarray, *rest: np.ndarray) -> None:
        """Contiguous arrays of (m, k) and (m, n) items (a prepared call's rows are contiguous)."""
        out = _placed_operand(self, (lhs, *rest))
        fits(_contiguous(lhs, self.m * self.k) and self.row_step == self.k and self.column_step == 1 and
             _contiguous(out, self.m * self.n) and self.ldc == self.n, f"product arrays {lhs.shape} -> {out.shape}")


class ConvCall(ctypes.Structure):
    """The arguments of native.c's conv_rows (conv_call): a convolution of the images read in place
    against ``weights``, its (KH*KW*C, units) matrix packed, ``finish`` padded to its panels (with
    ``residual``, adding the operand a run places between the images and the output); built once, a
    run places the arrays."""

    _fields_ = [("images", _PTR), ("packed", _PTR), ("units", _INT64), ("out", _PTR),
                ("where", ctypes.POINTER(Geometry)), ("finish", ctypes.POINTER(Epilogue)), ("threads", _INT64),
                ("residual", _PTR)]
    symbol, places = "conv_prepared", ("images", "out")

    def __init__(self, weights: "PackedOperand", where: Geometry, finish: Epilogue, threads: int,
                 residual: bool = False):
        fits(weights.depth == where.kh * where.kw * where.c and weights.columns == where.out_layout[0][3],
             f"packed weights ({weights.depth}, {weights.columns}) do not fit the geometry")
        fits(finish.covers(weights.padded_columns), "the epilogue does not cover the packed columns")
        self.kept = (weights, where, finish)
        super().__init__(None, weights.panels.ctypes.data, weights.columns, None, ctypes.pointer(where),
                         ctypes.pointer(finish), threads)
        _adding(self, residual)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, *rest: np.ndarray) -> None:
        self.kept[1].placed(x, _placed_operand(self, (x, *rest)))


class DepthwiseCall(ctypes.Structure):
    """The arguments of native.c's depthwise_rows (depthwise_call): built once, a run places the images
    and the output."""

    _fields_ = [("images", _PTR), ("weights", _PTR), ("repeated", _PTR), ("period", _INT64), ("out", _PTR),
                ("where", ctypes.POINTER(Geometry)), ("finish", ctypes.POINTER(Epilogue)), ("threads", _INT64),
                ("finite", _INT64)]
    symbol, places = "depthwise_prepared", ("images", "out")

    def __init__(self, taps: "DepthwiseTaps", where: "Geometry", finish: Epilogue, threads: int):
        taps.check(where)
        fits(where.out_layout[0][3] == where.c, "depthwise output channels differ from the (spread) input's")
        fits(finish.covers(where.ow * where.c), "the epilogue does not cover a depthwise output row")
        self.kept = (taps, where, finish)
        super().__init__(None, taps.weights.ctypes.data, taps.repeated.ctypes.data, taps.period, None,
                         ctypes.pointer(where), ctypes.pointer(finish), threads, taps.finite)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        self.kept[1].placed(x, out)


class BinaryCall(ctypes.Structure):
    """The arguments of native.c's binary_flat (binary_call): an output of ``shape`` (viewed as rows of its
    last axis) from two operands, each covering it as ``forms`` say (BINARY_FORMS): built once, a run places
    the operands and the output."""

    _fields_ = [("kind", _INT64), ("a", _PTR), ("b", _PTR), ("out", _PTR), ("n", _INT64), ("columns", _INT64),
                ("a_form", _INT64), ("b_form", _INT64), ("finish", ctypes.POINTER(Epilogue)), ("threads", _INT64)]
    symbol, places = "binary_prepared", ("a", "b", "out")

    def __init__(self, kind: str, shape: tuple[int, ...], forms: tuple[str, str], finish: Epilogue, threads: int):
        n = math.prod(shape)
        columns = shape[-1] if shape else 1
        fits(finish.covers(columns), "the epilogue does not cover a row")
        sizes = {"WHOLE": n, "PER_COLUMN": columns, "PER_ROW": n // columns if columns else 0, "ONE": 1}
        self.kept = finish
        self.sizes = (sizes[forms[0]], sizes[forms[1]], n)
        super().__init__(BINARY_KINDS.index(kind), None, None, None, n, columns, BINARY_FORMS.index(forms[0]),
                         BINARY_FORMS.index(forms[1]), ctypes.pointer(finish), threads)
        self.reference = own_address(self)

    def placed(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        fits(all(_contiguous(x, size) for x, size in zip((a, b, out), self.sizes)),
             f"binary arrays {a.shape}, {b.shape} -> {out.shape}")


class CopyCall(ctypes.Structure):
    """The arguments of native.c's copy_prepared: ``nbytes`` bytes from one contiguous array to another
    (a RESHAPE's values in their new shape); a run places both."""

    _fields_ = [("x", _PTR), ("out", _PTR), ("bytes", _INT64)]
    symbol, places = "copy_prepared", ("x", "out")

    def __init__(self, nbytes: int):
        super().__init__(None, None, nbytes)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        fits(x.flags.c_contiguous and out.flags.c_contiguous and x.nbytes == out.nbytes == self.bytes
             and x.dtype == out.dtype, f"copy of {x.shape} {x.dtype} into {out.shape} {out.dtype}")


class BatchProductCall(ctypes.Structure):
    """The arguments of native.c's batch_product_prepared: a float32 BATCH_MATMUL of contiguous operands, ``batch``
    products of (m x k) by (k x n) (each operand stored transposed where ``trans`` says), the second the same
    matrix for all where ``shared_b``, through the BLAS sgemm numpy loaded (``sgemm``: its address and whether its
    integers are 64-bit); a run places a, b and out.  ``uses_blas``: runs hold BLAS to one thread."""

    _fields_ = [("a", _PTR), ("b", _PTR), ("out", _PTR), ("sgemm", _PTR), ("int64", _INT64), ("batch", _INT64),
                ("m", _INT64), ("n", _INT64), ("k", _INT64), ("trans_a", _INT64), ("trans_b", _INT64),
                ("b_step", _INT64), ("threads", _INT64)]
    symbol, places = "batch_product_prepared", ("a", "b", "out")
    uses_blas = True

    def __init__(self, sgemm: tuple[int, int], batch: int, m: int, n: int, k: int, trans: tuple[bool, bool],
                 shared_b: bool, threads: int):
        fits(min(batch, m, n, k) >= 1, f"a batch product of {batch} x ({m} x {k}) @ ({k} x {n})")
        self.sizes = (batch * m * k, (1 if shared_b else batch) * k * n, batch * m * n)
        super().__init__(None, None, None, sgemm[0], sgemm[1], batch, m, n, k, trans[0], trans[1],
                         0 if shared_b else k * n, threads)
        self.reference = own_address(self)

    def placed(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        fits(all(_contiguous(x, size) for x, size in zip((a, b, out), self.sizes)),
             f"batch product arrays {a.shape} @ {b.shape} -> {out.shape}")


NOT_FINITE = 2  # native.c's status of a call that declines inputs holding a value that is not finite


class HybridFcCall(ctypes.Structure):
    """The arguments of native.c's hybrid_fc_prepared: a dynamic-range FULLY_CONNECTED of ``rows`` float rows
    of ``depth`` against int8 ``weights`` (units x depth, kept transposed as int16) with per-unit ``scales``,
    float ``bias`` (or None) and a clamp to ``bounds``, each row quantized symmetrically or ``asymmetric``ally as
    numpy's formulation (hybrid.py) does; a run places x and out (see NativeLoops.finite_only)."""

    _fields_ = [("x", _PTR), ("out", _PTR), ("weights", _PTR), ("scales", _PTR), ("bias", _PTR), ("rows", _INT64),
                ("depth", _INT64), ("units", _INT64), ("asymmetric", _INT64), ("low", ctypes.c_float),
                ("high", ctypes.c_float), ("threads", _INT64)]
    symbol, places = "hybrid_fc_prepared", ("x", "out")
    # integer sums of products of at most 255 x 128 stay in int32 up to this depth
    MOST_DEPTH = (2**31 - 1) // (255 * 128)

    def __init__(self, weights: np.ndarray, scales: np.ndarray, bias: np.ndarray | None, rows: int, asymmetric: bool,
                 bounds: tuple[float, float], threads: int):
        units, depth = weights.shape
        fits(rows >= 1 and 1 <= depth <= self.MOST_DEPTH and units >= 1, f"hybrid rows of {depth} into {units}")
        self.kept = (np.ascontiguousarray(np.asarray(weights, np.int8).T, np.int16),
                     np.ascontiguousarray(scales, np.float32),
                     None if bias is None else np.ascontiguousarray(bias, np.float32))
        fits(self.kept[1].shape == (units,) and (bias is None or self.kept[2].shape == (units,)),
             "hybrid scales or bias not one per unit")
        super().__init__(None, None, self.kept[0].ctypes.data, self.kept[1].ctypes.data,
                         None if bias is None else self.kept[2].ctypes.data, rows, depth, units, asymmetric,
                         bounds[0], bounds[1], threads)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        fits(_contiguous(x, self.rows * self.depth) and _contiguous(out, self.rows * self.units),
             f"hybrid arrays {x.shape} -> {out.shape}")


TRANSPOSE_AXES = 6  # native.c's


class TransposeCall(ctypes.Structure):
    """The arguments of native.c's transpose_prepared: a contiguous array of ``shape`` and ``dtype`` (items
    of 1, 2, 4 or 8 bytes) with its axes in the order ``perm`` (out's axis k is x's axis perm[k]), up to
    TRANSPOSE_AXES of them; a run places x and out.  A matrix transposed (x's last axis out's second last)
    goes by blocks in registers for 4-byte items and by a gather per row for others."""

    _fields_ = [("x", _PTR), ("out", _PTR), ("rank", _INT64), ("item", _INT64),
                ("shape", _INT64 * TRANSPOSE_AXES), ("step", _INT64 * TRANSPOSE_AXES), ("threads", _INT64)]
    symbol, places = "transpose_prepared", ("x", "out")

    def __init__(self, shape: tuple[int, ...], perm: tuple[int, ...], dtype, threads: int):
        fits(1 <= len(shape) <= TRANSPOSE_AXES and sorted(perm) == list(range(len(shape))),
             f"a permutation {perm} of {len(shape)} axes")
        self.dtype = np.dtype(dtype)
        fits(self.dtype.itemsize in (1, 2, 4, 8), f"items of {self.dtype.itemsize} bytes")
        strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
        self.in_shape, self.out_shape = tuple(shape), tuple(shape[k] for k in perm)
        super().__init__(None, None, len(shape), self.dtype.itemsize, (_INT64 * TRANSPOSE_AXES)(*self.out_shape),
                         (_INT64 * TRANSPOSE_AXES)(*(strides[k] for k in perm)), threads)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        fits(x.shape == self.in_shape and out.shape == self.out_shape and x.flags.c_contiguous
             and out.flags.c_contiguous and x.dtype == out.dtype == self.dtype,
             f"transpose of {x.shape} {x.dtype} into {out.shape} {out.dtype}")


class UnaryCall(ctypes.Structure):
    """The arguments of native.c's unary_prepared: out = kind(x) (COPY: x itself; ``kind`` one of
    UNARY_KINDS) over ``size`` floats, then the epilogue's clamp; a run places x and out."""

    _fields_ = [("kind", _INT64), ("x", _PTR), ("out", _PTR), ("n", _INT64), ("finish", ctypes.POINTER(Epilogue)),
                ("threads", _INT64)]
    symbol, places = "unary_prepared", ("x", "out")

    def __init__(self, kind: str, size: int, finish: Epilogue, threads: int):
        fits(finish.bias is None and finish.slope is None, "a unary op's epilogue is a clamp")
        self.kept = finish
        super().__init__(UNARY_KINDS.index(kind), None, None, size, ctypes.pointer(finish), threads)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        fits(_contiguous(x, self.n) and _contiguous(out, self.n), f"unary arrays {x.shape} -> {out.shape}")


class PadCall(ctypes.Structure):
    """The arguments of native.c's pad_prepared: contiguous float32 ``shape`` with ``before`` and
    ``after`` values of ``value`` around each run along its last axis; a run places x and out."""

    _fields_ = [("x", _PTR), ("out", _PTR), ("rows", _INT64), ("columns", _INT64), ("before", _INT64),
                ("after", _INT64), ("value", ctypes.c_float), ("threads", _INT64)]
    symbol, places = "pad_prepared", ("x", "out")

    def __init__(self, shape: tuple[int, ...], before: int, after: int, value: float, threads: int):
        columns = shape[-1] if shape else 1
        fits(before >= 0 and after >= 0 and columns >= 1, f"pad of {tuple(shape)} by ({before}, {after})")
        super().__init__(None, None, math.prod(shape) // columns, columns, before, after, value, threads)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        fits(_contiguous(x, self.rows * self.columns) and
             _contiguous(out, self.rows * (self.before + self.columns + self.after)),
             f"pad of {x.shape} by ({self.before}, {self.after}) into {out.shape} {out.dtype}")


class PoolCall(ctypes.Structure):
    """The arguments of native.c's pool_prepared: MAX_POOL_2D, or AVERAGE_POOL_2D when ``average``, as
    ``where`` says (padding left out), then ``finish``'s clamp; a run places the images and out."""

    _fields_ = [("x", _PTR), ("out", _PTR), ("where", ctypes.POINTER(Geometry)), ("average", _INT64),
                ("finish", ctypes.POINTER(Epilogue)), ("threads", _INT64)]
    symbol, places = "pool_prepared", ("x", "out")

    def __init__(self, where: "Geometry", average: bool, finish: Epilogue, threads: int):
        channels = where.out_layout[0][3]
        fits(channels == where.c, f"pool output channels {channels} differ from the input's {where.c}")
        fits(finish.bias is None and finish.slope is None, "a pool's epilogue is a clamp")
        self.kept = (where, finish)
        super().__init__(None, None, ctypes.pointer(where), average, ctypes.pointer(finish), threads)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        self.kept[0].placed(x, out)


class PreluCall(ctypes.Structure):
    """The arguments of native.c's prelu_prepared: out = x where x >= 0, else x * slope, over contiguous
    float32 ``shape``, ``slope`` one per channel (the last axis); a run places x and out."""

    _fields_ = [("x", _PTR), ("slope", _PTR), ("out", _PTR), ("rows", _INT64), ("channels", _INT64),
                ("threads", _INT64)]
    symbol, places = "prelu_prepared", ("x", "out")

    def __init__(self, slope: np.ndarray, shape: tuple[int, ...], threads: int):
        slope = aligned_copy(np.asarray(slope, np.float32).reshape(-1))
        fits(bool(shape) and shape[-1] == slope.size, f"prelu of {tuple(shape)} by {slope.size} slopes")
        self.kept = slope
        super().__init__(None, slope.ctypes.data, None, math.prod(shape) // slope.size, slope.size, threads)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        size = self.rows * self.channels
        fits(_contiguous(x, size) and _contiguous(out, size), f"prelu arrays {x.shape} -> {out.shape}")


class ResizeCall(ctypes.Structure):
    """The arguments of native.c's resize_prepared: RESIZE_BILINEAR of contiguous (N, H, W, C) ``shape``
    to (N, OH, OW, C), ``rows`` and ``columns`` (lower index, upper index, weight of the upper) per output
    row and column (int64, int64, float32 arrays); a run places x and out."""

    _fields_ = [("x", _PTR), ("out", _PTR), *((name, _INT64) for name in ("images", "h", "w", "c")),
                *((name, _PTR) for name in ("y0", "y1", "wy", "x0", "x1", "wx")), ("oh", _INT64), ("ow", _INT64),
                ("threads", _INT64)]
    symbol, places = "resize_prepared", ("x", "out")

    def __init__(self, shape: tuple[int, int, int, int], rows: tuple, columns: tuple, threads: int):
        n, h, w, c = shape
        taps = []
        for (lower, upper, weight), extent in ((rows, h), (columns, w)):
            lower, upper = (np.ascontiguousarray(v, np.int64) for v in (lower, upper))
            weight = np.ascontiguousarray(weight, np.float32)
            fits(lower.size == upper.size == weight.size and
                 (lower.size == 0 or (min(lower.min(), upper.min()) >= 0 and max(lower.max(), upper.max()) < extent)),
                 f"resize taps do not fit {extent} -> {lower.size}")
            taps += [lower, upper, weight]
        self.kept = taps
        super().__init__(None, None, n, h, w, c, *(t.ctypes.data for t in taps), taps[0].size, taps[3].size, threads)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        fits(_contiguous(x, self.images * self.h * self.w * self.c) and
             _contiguous(out, self.images * self.oh * self.ow * self.c), f"resize of {x.shape} into {out.shape}")


class MeanCall(ctypes.Structure):
    """The arguments of native.c's mean_pixels (mean_call): the mean of a contiguous float array viewed as
    (outer, count, inner) over its middle axis into (outer, inner): a global average pool's (N, H * W, C),
    or any MEAN over consecutive axes; a run places both arrays."""

    _fields_ = [("x", _PTR), ("out", _PTR), ("images", _INT64), ("pixels", _INT64), ("c", _INT64),
                ("threads", _INT64)]
    symbol, places = "mean_prepared", ("x", "out")

    def __init__(self, outer: int, count: int, inner: int, threads: int):
        fits(count >= 1 and outer >= 1 and inner >= 1, f"mean of ({outer}, {count}, {inner}) over its middle")
        super().__init__(None, None, outer, count, inner, threads)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        fits(_contiguous(x, self.images * self.pixels * self.c) and _contiguous(out, self.images * self.c),
             f"mean of {x.shape} into {out.shape}")


class SoftmaxCall(ctypes.Structure):
    """The arguments of native.c's softmax_prepared: a float SOFTMAX over rows of ``depth`` (``size``
    items in all), with ``beta``, the rows shared among ``threads``; a run places the input and output."""

    _fields_ = [("x", _PTR), ("out", _PTR), ("rows", _INT64), ("depth", _INT64), ("beta", ctypes.c_float),
                ("threads", _INT64)]
    symbol, places = "softmax_prepared", ("x", "out")

    def __init__(self, size: int, depth: int, beta: float, threads: int):
        fits(depth >= 1 and size % depth == 0, f"softmax rows of {depth} in {size} items")
        super().__init__(None, None, size // depth, depth, beta, threads)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        size = self.rows * self.depth
        fits(_contiguous(x, size) and _contiguous(out, size), f"softmax arrays {x.shape} -> {out.shape}")


class PackedOperand:
    """A constant (depth, units) float32 GEMM operand laid out once for native.c's packed_product:
    panels of two vectors of ``lanes`` units, each its depth's rows (zero past the last unit); the
    last panel one vector wide where the units left fit in one."""

    def __init__(self, matrix: np.ndarray, lanes: int):
        self.depth, self.columns = matrix.shape
        widths = [2 * lanes] * (self.columns // (2 * lanes))
        left = self.columns % (2 * lanes)
        if left:
            widths.append(lanes if left <= lanes else 2 * lanes)
        self.padded_columns = sum(widths)
        self.panels = aligned_zeros(self.depth * self.padded_columns, np.float32)
        start = 0
        for first, width in zip(np.cumsum([0, *widths[:-1]]), widths):
            block = matrix[:, first:first + width]
            self.panels[start:start + self.depth * width].reshape(self.depth, width)[:, :block.shape[1]] = block
            start += self.depth * width
        self.widths = widths

    def block(self, first: int, end: int) -> np.ndarray:
        """Units first..end as a plain (depth, units) matrix, for a product numpy runs."""
        parts, start = [], 0
        for width in self.widths:
            parts.append(self.panels[start:start + self.depth * width].reshape(self.depth, width))
            start += self.depth * width
        return np.concatenate(parts, axis=1)[:, first:end]


class DepthwiseTaps:
    """A depthwise filter as the native loops take it: ``weights`` (KH*KW, C), and each tap's weights
    ``repeated`` along a run of pixels with a period of whole pixels and whole vectors of 16, plus
    the 64 values a group of outputs starting anywhere in it reads on."""

    def __init__(self, weights: np.ndarray):
        self.weights = aligned_copy(np.asarray(weights, np.float32))
        channels = self.weights.shape[1]
        self.period = math.lcm(channels, 16)
        repeats = -(-(self.period + 64) // channels)
        self.repeated = aligned_copy(np.tile(self.weights, (1, repeats))[:, :self.period + 64])
        self.finite = bool(np.isfinite(self.weights).all())  # else a tap outside the image is skipped, not zeroed

    def check(self, where: "Geometry") -> None:
        """Whether these taps are the geometry's window over its channels."""
        fits(self.weights.shape == (where.kh * where.kw, where.c) and self.period % where.c == 0 and
             self.repeated.shape == (where.kh * where.kw, self.period + 64),
             f"depthwise taps {self.weights.shape} do not fit a {where.kh}x{where.kw} window of {where.c} channels")


class QStage(ctypes.Structure):
    """An integer kernel's output stage (native.c's qstage), TFLite's fixed-point requantization per
    output channel: int32 ``bias`` added to the sums, the rescale's Q31 ``fixed`` significand and its
    ``exponent`` (quant_util.quantize_multiplier), ties of the final shift away from zero where ``away``
    (else up), then the output ``zero`` point and the clamp to ``bounds``; ``headroom`` more bits of left
    shift (ADD's operands).  Padded to whole vectors of 16 channels; with whether any channel shifts
    left or rounds ties away (the products' register path leaves out the steps no channel needs), and
    whether all take their steps after the bias as one rounding shift (native.c's single_shift)."""

    _fields_ = [(name, _PTR) for name in ("bias", "multiplier", "left", "right", "mask", "threshold", "away",
                                          "nudge", "nudge_away", "wide_multiplier", "single_right")] + \
        [(name, ctypes.c_int32) for name in ("zero", "low", "high", "shifts_left", "rounds_away", "single_shift")]

    def __init__(self, fixed, exponent, bias: np.ndarray, away, zero: int, bounds: tuple[int, int], headroom: int = 0):
        self.channels = bias.size
        fixed, exponent = (np.broadcast_to(v, self.channels) for v in (fixed, exponent))
        right = np.maximum(-exponent, 0)
        mask = (np.int64(1) << right) - 1
        away = np.broadcast_to(np.asarray(away, bool), self.channels)
        left = np.maximum(exponent, 0) + headroom
        columns = (bias, fixed, left, right, mask, mask >> 1, -away.astype(np.int64))
        padded = -(-self.channels // 16) * 16
        self.kept = [self._padded(values, padded, np.int32) for values in columns]
        # single_shift's constants (the padding's too: shifts it may take without overflow), where the nudges
        # stay below 2**61 (their sums with products of up to 2**62 fit int64)
        single = bool(self.channels) and not left.any() and bool(((right >= 1) & (right <= 22)).all()) and \
            abs(int(zero)) <= 1 << 7
        single_right = self._padded(np.where(single, right, 1), padded, np.int64, fill=1)
        nudge = (1 << 30) + (1 << (30 + single_right)) + (np.int64(zero) << (31 + single_right))
        nudge_away = nudge + (self.kept[6].astype(np.int64) << 31)  # 2**31 less where away (-1)
        self.kept += [aligned_copy(v.reshape(-1, 4, 2).transpose(0, 2, 1).reshape(-1))  # each 8's even, then odd
                      for v in (nudge, nudge_away, self.kept[1].astype(np.int64))]
        self.kept.append(aligned_copy((single_right - 1).astype(np.int32)))
        super().__init__(*(column.ctypes.data for column in self.kept), zero, *bounds, bool(self.kept[2].any()),
                         bool(self.kept[6].any()), single)

    def _padded(self, values, padded: int, dtype, fill: int = 0) -> np.ndarray:
        """One column of per-channel values padded to ``padded``: one channel repeated (elementwise ops
        read it 8 at a time), else ``fill``."""
        values = np.asarray(values)
        column = np.full(padded, values[0] if self.channels == 1 else fill, dtype)
        column[:self.channels] = values
        return column


class Requant(ctypes.Structure):
    """A 16-bit kernel's output stage in int64 (native.c's requant): per channel clamp((acc * multiplier +
    offset - (acc < tie_below ? tie : 0)) >> shift), ``constants`` (multiplier, offset, shift and, where
    ties round away from zero, tie_below and tie; a scalar shift serves every channel) as
    quant_util.Rescale folds them, or the 64-bit reference rescale's."""

    _fields_ = [("multiplier", _PTR), ("offset", _PTR), ("shift", _PTR), ("shifts", _INT64), ("tie_below", _PTR),
                ("tie", _PTR), ("low", _INT64), ("high", _INT64)]

    def __init__(self, constants: tuple, bounds: tuple[int, int]):
        multiplier, offset, shift, *ties = (np.ascontiguousarray(np.atleast_1d(v), np.int64) for v in constants)
        self.channels = multiplier.size
        fits(offset.size == self.channels and shift.size in (1, self.channels) and len(ties) in (0, 2) and
             all(t.size == self.channels for t in ties), f"rescale constants do not fit {self.channels} channels")
        self.kept = (multiplier, offset, shift, *ties)
        super().__init__(multiplier.ctypes.data, offset.ctypes.data, shift.ctypes.data, shift.size > 1,
                         ties[0].ctypes.data if ties else None, ties[1].ctypes.data if ties else None, *bounds)


_I16 = np.dtype(np.int16)


class WideCall(ctypes.Structure):
    """The arguments of native.c's 16x8 products (wide_call): int16 activations against int8 ``weights``
    as stored, (units, depth) for a product (``rows`` of the input) or a CONV_2D (``where``; taps outside
    the image hold ``zero``); a run places the input and the output.  (Depthwise: QDepthwiseCall.)"""

    _fields_ = [("m", _INT64), ("n", _INT64), ("k", _INT64), ("a", _PTR), ("weights", _PTR), ("out", _PTR),
                ("where", ctypes.POINTER(Geometry)), ("zero", _INT64), ("stage", ctypes.POINTER(Requant)),
                ("threads", _INT64)]
    symbols = {"product": "wide_product", "conv": "wide_conv"}
    places = ("a", "out")

    def __init__(self, kind: str, weights: np.ndarray, stage: Requant, threads: int, rows: int = 0,
                 where: Geometry | None = None, zero: int = 0):
        weights = np.ascontiguousarray(weights, np.int8)
        units, depth = weights.shape
        fits(stage.channels == units and (kind == "product" or where is not None and
                                          depth == where.kh * where.kw * where.c and where.out_layout[0][3] == units),
             f"16x8 {kind} of {weights.shape} weights does not fit its stage or geometry")
        self.symbol, self.kept = self.symbols[kind], (weights, stage, where)
        super().__init__(rows, units, depth, None, weights.ctypes.data, None,
                         None if where is None else ctypes.pointer(where), zero, ctypes.pointer(stage), threads)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        where = self.kept[2]
        if where is not None:
            return where.placed(x, out, _I16)
        fits(_contiguous(x, self.m * self.k, _I16) and _contiguous(out, self.m * self.n, _I16),
             f"16x8 product arrays {x.shape} -> {out.shape}")


class PackedInt8:
    """A constant (units, depth) int8 operand laid out once for native.c's integer products: panels of
    16 units, the depth in ``loops``' groups (its integer_group of depths; as many groups as its
    integer_panel_groups, zero past the last depth), each group the group's depths of every unit in turn;
    with each unit's weight sum (padded to whole panels)."""

    def __init__(self, matrix: np.ndarray, loops: "NativeLoops"):
        self.units, self.depth = matrix.shape
        group = loops.integer_group
        panels, groups = -(-self.units // 16), int(loops.integer_panel_groups(self.depth))
        fits(groups * group >= self.depth, f"{groups} groups of {group} for a depth of {self.depth}")
        padded = np.zeros((panels * 16, groups * group), np.int8)
        padded[:self.units, :self.depth] = matrix
        self.panels = aligned_copy(padded.reshape(panels, 16, groups, group).transpose(0, 2, 1, 3)).reshape(-1)
        self.sums = padded.sum(axis=1, dtype=np.int32)


_I8 = np.dtype(np.int8)


class QBinaryCall(ctypes.Structure):
    """The arguments of native.c's qbinary: int8 ADD / SUB or MUL of two operands of one shape (``size``
    items; for MUL the second may be one row of ``period`` items along the first's rows), with the
    stages and constants it describes; a run places a, b and out."""

    _fields_ = [("a", _PTR), ("b", _PTR), ("out", _PTR),
                *[(name, _INT64) for name in ("n", "period", "kind", "head", "zero_a", "zero_b")],
                ("tables", _PTR), ("head_factors", _INT64 * 4), ("head_formula", _INT64),
                ("output", ctypes.POINTER(QStage)), ("threads", _INT64)]
    symbol, places = "qbinary", ("a", "b", "out")

    def __init__(self, kind: str, size: int, output: QStage, threads: int, head: int = 0,
                 tables: np.ndarray | None = None, zeros=(0, 0), period: int | None = None,
                 head_factors: Sequence[tuple[int, int]] | None = None):
        """ADD / SUB: ``tables`` (4, 256), each operand's value on the common scale for each int8 value
        (-128 first): a's and b's for the first ``head`` items, then a's and b's for the rest (SUB's b
        negated); ``head_factors``: a's and b's (factor, offset) of the first ones' formula,
        (v * factor + offset) >> 31 (the tables' first two rows), computed in vectors on AVX2 and AVX-512
        (where a gather of each table entry costs more); MUL: the operands' ``zeros``."""
        mul = kind == "MUL"
        period = size if period is None else period
        tables = None if mul else np.ascontiguousarray(tables, np.int32)
        factors = [int(v) for pair in head_factors or () for v in pair]
        fits(0 <= head <= size and head % 16 == 0 and output.channels == 1 and period >= 1 and
             size % period == 0 and (mul or period == size and tables.shape == (4, 256)) and
             len(factors) in (0, 4) and all(abs(v) < 1 << 52 for v in factors[0::2]) and
             all(abs(v) < 1 << 61 for v in factors[1::2]), "binary stages or operands do not fit")
        self.kept = (output, tables)
        super().__init__(None, None, None, size, period, int(mul), head, *zeros,
                         None if mul else tables.ctypes.data, (_INT64 * 4)(*(factors or [0] * 4)),
                         int(bool(factors)), ctypes.pointer(output), threads)
        self.reference = own_address(self)

    def placed(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        fits(all(_contiguous(v, n, _I8) for v, n in ((a, self.n), (b, self.period), (out, self.n))),
             f"binary arrays {a.shape}, {b.shape} -> {out.shape}")


def _with_residual(call, residual: "QBinaryCall | None", items: int) -> None:
    """Have an integer convolution's ``call`` (of ``items`` contiguous outputs) take its stored results
    through ``residual``, an ADD whose first operand they are; a run then places the ADD's other operand
    between the input and the output."""
    call.kept += (residual,)
    if residual is None:
        return
    fits(residual.kind == 0 and residual.n == residual.period == items, "the residual ADD does not fit the outputs")
    call.residual = ctypes.pointer(residual)
    call.places = (call.places[0], "residual_b", call.places[1])


def _placed_residual(call, arrays: tuple) -> np.ndarray:
    """The output among a run's ``arrays`` (input, [residual operand,] output), the residual operand checked."""
    if len(arrays) == 3:
        fits(_contiguous(arrays[1], arrays[2].size, _I8), f"residual operand {arrays[1].shape} for {arrays[2].shape}")
    fits(len(arrays) == len(call.places), f"{len(arrays)} arrays for {call.symbol}")
    return arrays[-1]


_RESIDUAL_FIELDS = [("residual_b", _PTR), ("residual", ctypes.POINTER(QBinaryCall))]


class QProductCall(ctypes.Structure):
    """The arguments of native.c's qproduct: a (rows, depth) int8 input against a packed operand,
    requantized into a (rows, units) int8 output, optionally through a residual ADD; built once, a run
    places the input (the residual operand) and output."""

    _fields_ = [("m", _INT64), ("n", _INT64), ("k", _INT64), ("a", _PTR), ("lda", _INT64), ("packed", _PTR),
                ("sums", _PTR), ("c", _PTR), ("ldc", _INT64), ("stage", ctypes.POINTER(QStage)), ("threads", _INT64),
                *_RESIDUAL_FIELDS]
    symbol, places = "qproduct", ("a", "c")

    def __init__(self, rows: int, rhs: PackedInt8, stage: QStage, threads: int, residual: "QBinaryCall | None" = None):
        fits(stage.channels == rhs.units, f"requantization of {stage.channels} channels for {rhs.units} units")
        self.kept = (rhs, stage)
        super().__init__(rows, rhs.units, rhs.depth, None, rhs.depth, rhs.panels.ctypes.data, rhs.sums.ctypes.data,
                         None, rhs.units, ctypes.pointer(stage), threads)
        _with_residual(self, residual, rows * rhs.units)
        self.reference = own_address(self)

    def placed(self, lhs: np.ndarray, *rest: np.ndarray) -> None:
        out = _placed_residual(self, (lhs, *rest))
        fits(_contiguous(lhs, self.m * self.k, _I8) and _contiguous(out, self.m * self.n, _I8),
             f"integer product arrays {lhs.shape} -> {out.shape}")


class QConvCall(ctypes.Structure):
    """The arguments of native.c's qconv: int8 images, as ``where`` says, against a packed (KH*KW*C,
    units) filter, taps outside the image holding the input zero point ``zero``; a residual ADD as for
    QProductCall (the output contiguous)."""

    _fields_ = [("images", _PTR), ("packed", _PTR), ("sums", _PTR), ("units", _INT64), ("out", _PTR),
                ("where", ctypes.POINTER(Geometry)), ("zero", _INT64), ("stage", ctypes.POINTER(QStage)),
                ("threads", _INT64), *_RESIDUAL_FIELDS]
    symbol, places = "qconv", ("images", "out")

    def __init__(self, rhs: PackedInt8, where: Geometry, zero: int, stage: QStage, threads: int,
                 residual: "QBinaryCall | None" = None):
        fits(rhs.depth == where.kh * where.kw * where.c and rhs.units == where.out_layout[0][3] == stage.channels,
             f"packed weights ({rhs.units}, {rhs.depth}) do not fit the geometry")
        contiguous = where.out_stride == where.ow * rhs.units and where.image_out == where.oh * where.out_stride
        fits(residual is None or contiguous, "a residual ADD needs a contiguous output")
        self.kept = (rhs, where, stage)
        super().__init__(None, rhs.panels.ctypes.data, rhs.sums.ctypes.data, rhs.units, None, ctypes.pointer(where),
                         zero, ctypes.pointer(stage), threads)
        _with_residual(self, residual, where.images * where.image_out)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, *rest: np.ndarray) -> None:
        self.kept[1].placed(x, _placed_residual(self, (x, *rest)), _I8)


class QDepthwiseCall(ctypes.Structure):
    """The arguments of native.c's qdepthwise: int8 images (``stage`` a QStage) or int16 ones (a Requant),
    as ``where`` says, against (KH*KW, C) int16 taps (their zero point taken out), less the input zero
    point ``zero``.  Its sums are int32: refused where they could overflow (see ``sums_fit``)."""

    _fields_ = [("images", _PTR), ("taps", _PTR), ("out", _PTR), ("where", ctypes.POINTER(Geometry)),
                ("zero", _INT64), ("wide", _INT64), ("stage", ctypes.POINTER(QStage)),
                ("wide_stage", ctypes.POINTER(Requant)), ("threads", _INT64), ("paired", _PTR), ("paired_bias", _PTR),
                ("zeros", _PTR)]
    symbol, places = "qdepthwise", ("images", "out")

    def __init__(self, taps: np.ndarray, where: Geometry, zero: int, stage: "QStage | Requant", threads: int):
        taps = np.ascontiguousarray(taps, np.int16)
        wide = isinstance(stage, Requant)
        self.dtype = _I16 if wide else _I8
        fits(taps.shape == (where.kh * where.kw, where.c) and where.out_layout[0][3] == where.c == stage.channels,
             f"depthwise taps {taps.shape} do not fit a {where.kh}x{where.kw} window of {where.c} channels")
        fits(self.sums_fit(taps, self.dtype, zero), "depthwise sums could overflow int32")
        # int8 sums by pairs of taps (native.c's paired_row): each channel's two in turn, 16 values past the last
        # pair; the taps outside the image read the zero point, whose share the biases take back (sums_fit: int32)
        window, channels = taps.shape
        paired = np.zeros(-(-window // 2) * 2 * channels + 16, np.int16)
        paired[:window * channels] = taps.reshape(-1)
        pairs = paired[:-16].reshape(-1, 2, channels).transpose(0, 2, 1).reshape(-1)
        paired = aligned_copy(np.concatenate([pairs, paired[-16:]]))
        paired_bias = np.zeros(1, np.int32) if wide else np.array(stage.kept[0])  # int32 sums: wrapped alike
        if not wide:
            paired_bias[:channels] = (paired_bias[:channels] - zero * taps.sum(axis=0, dtype=np.int64)).astype(np.int32)
        zeros = np.full(channels + 16, 0 if wide else zero, np.int8)
        self.kept = (taps, where, stage, paired, paired_bias, zeros)
        super().__init__(None, taps.ctypes.data, None, ctypes.pointer(where), zero, int(wide),
                         None if wide else ctypes.pointer(stage), ctypes.pointer(stage) if wide else None, threads,
                         paired.ctypes.data, paired_bias.ctypes.data, zeros.ctypes.data)
        self.reference = own_address(self)

    @staticmethod
    def sums_fit(taps: np.ndarray, dtype, zero: int) -> bool:
        """Whether every channel's sum of (x - zero) * taps over a window stays in int32 for any input."""
        info = np.iinfo(dtype)
        spread = max(info.max - zero, zero - info.min)
        return spread * int(np.abs(taps.astype(np.int64)).sum(axis=0).max(initial=0)) < 2 ** 31

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        self.kept[1].placed(x, out, self.dtype)


class QPoolCall(ctypes.Structure):
    """The arguments of native.c's qpool: MAX_POOL_2D or AVERAGE_POOL_2D of int8 images as ``where``
    says, clamped to ``bounds``; a run places the images and the output."""

    _fields_ = [("images", _PTR), ("out", _PTR), ("where", ctypes.POINTER(Geometry)), ("average", _INT64),
                ("low", _INT64), ("high", _INT64), ("threads", _INT64)]
    symbol, places = "qpool", ("images", "out")

    def __init__(self, where: Geometry, average: bool, bounds: tuple[int, int], threads: int):
        fits(where.out_layout[0][3] == where.c, "pool output channels differ from the input's")
        self.kept = where
        super().__init__(None, None, ctypes.pointer(where), average, *bounds, threads)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        self.kept.placed(x, out, _I8)


class LookupCall(ctypes.Structure):
    """The arguments of native.c's qlookup: ``size`` 8-bit items (``signed``: int8, else uint8) through a
    256-entry ``table`` of one-byte outputs, or int16 items through a 65536-entry one of two-byte outputs,
    indexed from the type's minimum; a run places the input and output."""

    _fields_ = [("x", _PTR), ("out", _PTR), ("n", _INT64), ("table", _PTR), ("flip", _INT64), ("threads", _INT64),
                ("wide", _INT64)]
    symbol, places = "qlookup", ("x", "out")

    def __init__(self, table: np.ndarray, size: int, signed: bool, threads: int):
        fits((table.size, table.itemsize) in ((256, 1), (65536, 2)), f"a lookup table of {table.size} {table.dtype}")
        self.kept = np.ascontiguousarray(table)
        self.itemsize = table.itemsize
        flip = (1 << (8 * table.itemsize - 1)) if signed else 0
        super().__init__(None, None, size, self.kept.ctypes.data, flip, threads, int(table.itemsize == 2))
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        fits(all(a.itemsize == self.itemsize and a.flags.c_contiguous and a.size == self.n for a in (x, out)),
             f"lookup arrays {x.shape} {x.dtype} -> {out.shape} {out.dtype}")


class QuantizeCall(ctypes.Structure):
    """The arguments of native.c's quantize_prepared: ``size`` float32 values to int8, uint8 or int16 (``bytes``
    1 or 2), LiteRT's vector loop over the first ``whole`` (times ``reciprocal``) and its scalar tail over the
    rest (divided by ``divisor``), onto ``zero`` within ``bounds``; a run places the input and output."""

    _fields_ = [("x", _PTR), ("out", _PTR), ("n", _INT64), ("whole", _INT64), ("reciprocal", ctypes.c_float),
                ("divisor", ctypes.c_double), ("zero", _INT64), ("low", _INT64), ("high", _INT64), ("bytes", _INT64),
                ("threads", _INT64)]
    symbol, places = "quantize_prepared", ("x", "out")

    def __init__(self, size: int, whole: int, reciprocal: float, divisor: float, zero: int, bounds: tuple[int, int],
                 dtype: np.dtype, threads: int):
        fits(0 <= whole <= size and dtype in (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))
             and np.iinfo(dtype).min <= bounds[0] <= bounds[1] <= np.iinfo(dtype).max,
             f"quantize of {size} values to {dtype} within {bounds}")
        self.dtype = np.dtype(dtype)
        super().__init__(None, None, size, whole, reciprocal, divisor, zero, bounds[0], bounds[1], self.dtype.itemsize,
                         threads)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        fits(_contiguous(x, self.n) and _contiguous(out, self.n, self.dtype),
             f"quantize arrays {x.shape} {x.dtype} -> {out.shape} {out.dtype}")


class QSoftmaxCall(ctypes.Structure):
    """The arguments of native.c's qsoftmax: int8 rows of ``depth`` (``size`` items) through the 256-entry
    float32 ``table`` of exp(-scale * beta * distance), onto the output's ``scale``, ``zero`` and
    ``bounds``; a run places the input and output."""

    _fields_ = [("x", _PTR), ("out", _PTR), ("rows", _INT64), ("depth", _INT64), ("table", _PTR),
                ("scale", ctypes.c_float), ("zero", ctypes.c_int32), ("low", ctypes.c_int32), ("high", ctypes.c_int32)]
    symbol, places = "qsoftmax", ("x", "out")

    def __init__(self, table: np.ndarray, size: int, depth: int, scale: float, zero: int, bounds: tuple[int, int]):
        fits(table.shape == (256,) and table.dtype == np.float32 and depth >= 1 and size % depth == 0,
             f"softmax table {table.shape} {table.dtype} or rows of {depth} in {size} items")
        self.kept = np.ascontiguousarray(table)
        super().__init__(None, None, size // depth, depth, self.kept.ctypes.data, scale, zero, *bounds)
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        size = self.rows * self.depth
        fits(_contiguous(x, size, _I8) and _contiguous(out, size, _I8), f"softmax arrays {x.shape} -> {out.shape}")


class QLstmGate(ctypes.Structure):
    """One gate of native.c's qlstm: int8 weights, zero-point-folded biases, rescales (Q31 multiplier,
    exponent), peephole and layer norm (NULL where absent) and its squash table (65536 int16)."""

    _fields_ = [("w_in", _PTR), ("w_rec", _PTR), ("bias_in", _PTR), ("bias_rec", _PTR),
                *[(name, _INT64) for name in ("m_in", "s_in", "m_rec", "s_rec")], ("peephole", _PTR),
                ("m_peep", _INT64), ("s_peep", _INT64), ("norm", _PTR), ("norm_bias", _PTR),
                *[(name, _INT64) for name in ("m_norm", "s_norm", "variance_guard")], ("table", _PTR)]


class QLstmCall(ctypes.Structure):
    """The arguments of native.c's qlstm: LiteRT's integer LSTM over a whole sequence of ``steps`` (x and y
    addressed by step and row strides, in items), the states updated in place; a run places x, the
    output state h, the cell state c and y.  ``gates``: (input or None for CIFG, forget, cell, output),
    each a dict of QLstmGate's fields as arrays and ints; ``cell``: the rest of the call's fields."""

    _fields_ = [("x", _PTR), ("h", _PTR), ("c", _PTR), ("y", _PTR),
                *[(name, _INT64) for name in ("steps", "batch", "n_input", "n_cell", "n_output", "x_step",
                                              "x_row", "y_step", "y_row", "rows_together")],
                ("gates", QLstmGate * 4), ("cell_shift", _INT64), ("cell_bound", _INT64), ("tanh_cell", _PTR),
                *[(name, _INT64) for name in ("hidden_zp", "m_hidden", "s_hidden")], ("projection", _PTR),
                ("projection_bias", _PTR), *[(name, _INT64) for name in ("m_proj", "s_proj", "proj_bound", "state_zp")],
                ("scratch", _PTR)]
    symbol, places = "qlstm", ("x", "h", "c", "y")
    ARRAYS = {"w_in": (np.int8, "weights"), "w_rec": (np.int8, "weights"), "bias_in": (np.int64, "n_cell"),
              "bias_rec": (np.int64, "n_cell"), "peephole": (np.int64, "n_cell"), "norm": (np.int64, "n_cell"),
              "norm_bias": (np.int64, "n_cell"), "table": (np.int16, 65536), "tanh_cell": (np.int16, 65536),
              "projection": (np.int8, "projection"), "projection_bias": (np.int64, "n_output")}

    def __init__(self, sizes: dict[str, int], gates: list[dict | None], cell: dict):
        super().__init__()
        n_input, n_cell, n_output = sizes["n_input"], sizes["n_cell"], sizes["n_output"]
        self.kept = []
        expected = {"n_cell": (n_cell,), "n_output": (n_output,), "projection": (n_output, n_cell)}

        def pointer(name: str, value, shape=None):
            if value is None:
                return None
            dtype, size = self.ARRAYS[name]
            a = np.ascontiguousarray(value, dtype)
            want = shape or ((size,) if isinstance(size, int) else expected[size])
            fits(a.shape == tuple(want), f"lstm {name} {a.shape} for {want}")
            self.kept.append(a)
            return a.ctypes.data
        for name, value in sizes.items():
            setattr(self, name, int(value))
        fits(min(n_input, n_cell, n_output, sizes["batch"], sizes["steps"]) >= 1, f"lstm sizes {sizes}")
        fits(gates[1] is not None and gates[2] is not None and gates[3] is not None, "lstm gates")
        for slot, gate in enumerate(gates):
            if gate is None:
                continue
            target = self.gates[slot]
            for name, value in gate.items():
                if name in self.ARRAYS:
                    shape = {"w_in": (n_cell, n_input), "w_rec": (n_cell, n_output)}.get(name)
                    setattr(target, name, pointer(name, value, shape))
                else:
                    setattr(target, name, int(value))
        for name, value in cell.items():
            setattr(self, name, pointer(name, value) if name in self.ARRAYS else int(value))
        for slot, gate in enumerate(self.gates):  # what qlstm reads of every gate it runs, and of the pairs
            if slot == 0 and not gate.w_in:
                continue  # CIFG: no input gate
            fits(all(getattr(gate, f) for f in ("w_in", "w_rec", "bias_in", "bias_rec", "table"))
                 and bool(gate.norm) == bool(gate.norm_bias), f"lstm gate {slot}'s arrays")
        fits(bool(self.projection) == bool(self.projection_bias), "lstm projection and its bias")
        fits(0 <= self.cell_shift <= 62 and min(self.x_step, self.x_row, self.y_step, self.y_row) >= 0,
             f"cell shift {self.cell_shift}, strides {sizes}")
        scratch = np.zeros(6 * sizes["batch"] * n_cell, np.int64)
        self.kept.append(scratch)
        self.scratch = scratch.ctypes.data
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, h: np.ndarray, c: np.ndarray, y: np.ndarray) -> None:
        rows = self.batch
        fits(_contiguous(h, rows * self.n_output, _I8) and _contiguous(c, rows * self.n_cell, _I16),
             f"lstm states {h.shape} {h.dtype}, {c.shape} {c.dtype}")
        last_x = (self.steps - 1) * self.x_step + (rows - 1) * self.x_row + self.n_input
        last_y = (self.steps - 1) * self.y_step + (rows - 1) * self.y_row + self.n_output
        fits(_contiguous(x, None, _I8) and x.size >= last_x and _contiguous(y, None, _I8) and y.size >= last_y
             and x.size == self.steps * rows * self.n_input and y.size == self.steps * rows * self.n_output,
             f"lstm sequence {x.shape} -> {y.shape}")


class QMeanCall(ctypes.Structure):
    """The arguments of native.c's qmean: the MEAN of int8 (N, H, W, C) images over their pixels through
    ``stage``; a run places the input and output."""

    _fields_ = [("x", _PTR), ("out", _PTR), ("images", _INT64), ("pixels", _INT64), ("c", _INT64),
                ("stage", ctypes.POINTER(QStage))]
    symbol, places = "qmean", ("x", "out")

    def __init__(self, shape: tuple[int, int, int, int], stage: QStage):
        n, h, w, c = shape
        fits(stage.channels == c, f"a mean's stage of {stage.channels} channels for {c}")
        self.kept = stage
        super().__init__(None, None, n, h * w, c, ctypes.pointer(stage))
        self.reference = own_address(self)

    def placed(self, x: np.ndarray, out: np.ndarray) -> None:
        fits(_contiguous(x, self.images * self.pixels * self.c, _I8) and _contiguous(out, self.images * self.c, _I8),
             f"mean arrays {x.shape} -> {out.shape}")


def prepared_run(loops: NativeLoops, call, inputs: int | tuple[int, ...] = 1):
    """run() of a kernel that is one prepared call on its first ``inputs`` inputs (or the inputs of those
    slots) and its output, marked (``prepared``, ``inputs``: the slots) for batched_steps."""
    slots = tuple(range(inputs)) if isinstance(inputs, int) else inputs

    def run(ins, outs):
        loops.prepared(call, *(np.ascontiguousarray(ins[slot]) for slot in slots), outs[0])
    run.prepared, run.inputs = call, slots
    return run


def batched_steps(steps: list[tuple]) -> list[tuple]:
    """A partition's (op, run, sources, outputs) steps with each stretch of consecutive prepared calls
    (see prepared_run) made one step: one native call runs their list (native.c's run_prepared), every
    array bound once here but the partition inputs, which change from run to run: the step's sources
    are those, bound per run (see _one_call).  A native op costs ~5 us of Python a call; small models
    run dozens of them."""
    loops = _LOADED[0] if _LOADED else None
    batched, stretch = [], []

    def close() -> None:
        if stretch:
            batched.append(_one_call(loops, stretch))
        stretch.clear()

    for step in steps:
        op, run, sources, outs = step
        call = getattr(run, "prepared", None)
        bound = None if loops is None or call is None else _bound(loops, call, op, run.inputs, sources, outs[0])
        if bound is not None:
            stretch.append((step, call, bound))
        else:
            close()
            batched.append(step)
    close()
    return batched


def _bound(loops: NativeLoops, call, op, slots: tuple[int, ...], sources: list, out: np.ndarray) -> list | None:
    """Bind prepared ``call`` to its arrays: its contiguous buffers, and in place of each partition input
    (an int source) a contiguous stand-in of the input's shape and dtype, checked by the call as it checks
    arrays (dtype, shape, contiguity: any such array passes as the stand-in did).  Returns the partition
    inputs as (tensor index, field, shape, dtype) for _one_call to place per run; None where the call
    cannot be bound here."""
    arrays, inputs = [], []
    for position, slot in enumerate(slots):
        a = sources[slot]
        if isinstance(a, int):
            t = op.inputs[slot]
            if t.dtype.numpy is None or min(t.shape, default=0) < 0:
                return None
            inputs.append((a, call.places[position], tuple(t.shape), np.dtype(t.dtype.numpy)))
            a = np.zeros(t.shape, t.dtype.numpy)
        elif not (isinstance(a, np.ndarray) and a.flags.c_contiguous):
            return None
        arrays.append(a)
    if not out.flags.c_contiguous:
        return None
    try:
        loops.bind(call, *arrays, out)
    except ExecutionError:
        return None
    return inputs


def _one_call(loops: NativeLoops, stretch: list) -> tuple:
    """The step running a stretch of bound prepared calls in one native call.  Its sources are the
    partition inputs the calls read (see _bound): a run sets their addresses, of contiguous copies
    where they are not contiguous."""
    calls = [call for _, call, _ in stretch]
    placing = [(call, field, shape, dtype) for _, call, inputs in stretch for _, field, shape, dtype in inputs]
    kernels = (_PTR * len(calls))(*(ctypes.cast(getattr(loops.library, c.symbol), _PTR).value for c in calls))
    references = (_PTR * len(calls))(*(ctypes.addressof(c) for c in calls))
    run_prepared, run_prepared_timed = loops.library.run_prepared, loops.library.run_prepared_timed
    seconds = np.zeros(len(calls))

    def place(ins) -> list:
        kept = []  # copies made contiguous, alive until the native call returns
        for x, (call, field, shape, dtype) in zip(ins, placing):
            if not (isinstance(x, np.ndarray) and x.flags.c_contiguous):
                x = np.ascontiguousarray(x)
                kept.append(x)
            if x.dtype != dtype or x.shape != shape:  # the message formatted only then: this runs every run
                fits(False, f"input {x.shape} {x.dtype} for {shape} {dtype}")
            setattr(call, field, address(x))
        return kept

    def run(ins, outs):
        kept = place(ins)
        _done(run_prepared(kernels, references, len(calls)), "run_prepared")
        del kept  # the contiguous copies lived until the call returned

    def timed(ins, outs) -> list[tuple]:
        """run(), returning (op, seconds) of each op as the native loop measured it."""
        kept = place(ins)
        _done(run_prepared_timed(kernels, references, len(calls), seconds.ctypes.data), "run_prepared_timed")
        del kept
        return list(zip(run.ops, seconds.tolist()))
    run.kept = (calls, kernels, references, seconds)
    run.ops, run.timed = [step[0] for step, _, _ in stretch], timed
    return stretch[0][0][0], run, [index for _, _, inputs in stretch for index, *_ in inputs], []


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A contiguous copy of ``a`` starting on a cache line (see aligned_zeros): constants the loops read
    a vector at a time."""
    out = aligned_zeros(a.shape, a.dtype)
    out[...] = a
    return out


def row_stride(a: np.ndarray) -> int | None:
    """The distance in items between consecutive rows (runs along the last axis) of ``a`` when it is a
    uniform stack of contiguous rows; None otherwise."""
    if a.ndim == 0:
        return 1
    if a.shape[-1] > 1 and a.strides[-1] != a.itemsize:
        return None
    leading = [(d, st // a.itemsize) for d, st in zip(a.shape[:-1], a.strides[:-1]) if d > 1]
    if any(outer != inner * size for (_, outer), (size, inner) in zip(leading, leading[1:])):
        return None
    return leading[-1][1] if leading else a.shape[-1]


def _row_major(a: np.ndarray) -> bool | None:
    """False: rows of contiguous items; True: a transposed such matrix; None: neither."""
    if a.strides[1] == a.itemsize and a.strides[0] >= a.shape[1] * a.itemsize:
        return False
    if a.strides[0] == a.itemsize and a.strides[1] >= a.shape[0] * a.itemsize:
        return True
    return None


# CBLAS sgemm entry points, with whether their integers are 64-bit, as numpy's bundled OpenBLAS
# (scipy-openblas, 64-bit) and system OpenBLAS builds name them.
_SGEMM_SYMBOLS = (("scipy_cblas_sgemm64_", 1), ("cblas_sgemm64_", 1), ("scipy_cblas_sgemm", 0), ("cblas_sgemm", 0))


def _find_sgemm() -> tuple[int, int] | None:
    for library in loaded_openblas():
        for symbol, int64 in _SGEMM_SYMBOLS:
            function = getattr(library, symbol, None)
            if function is not None:
                return ctypes.cast(function, ctypes.c_void_p).value, int64
    return None


_LOCK = threading.Lock()
_LOADED: list = []  # [NativeLoops | None] once tried


def native_loops() -> NativeLoops | None:
    """The native loops, built and loaded on the first call; None where they cannot be."""
    with _LOCK:
        if not _LOADED:
            _LOADED.append(_load())
        return _LOADED[0]


def _load() -> NativeLoops | None:
    sanitize = os.environ.get(SANITIZE_ENV, "")
    if sanitize and sanitize not in SANITIZE_FLAGS:
        log.warning("cpu: %s=%s is not one of %s; building without a sanitizer", SANITIZE_ENV, sanitize,
                    ", ".join(SANITIZE_FLAGS))
    extra = [*SANITIZE_FLAGS.get(sanitize, []), *shlex.split(os.environ.get(EXTRA_FLAGS_ENV, ""))]
    os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)  # read when libgomp loads with the library
    built = load_library(SOURCE, [[*flags, *extra] for flags in FLAG_SETS], "cpu")
    return None if built.library is None else NativeLoops(built.library, built.flags)


def share_among(threads: int, work: int, per_thread: int) -> int:
    """How many of ``threads`` a native loop of ``work`` is shared among (see PER_THREAD_MACS): all or
    none, since OpenMP teams of changing sizes put the threads left out to sleep, and waking them
    costs more than the loop (measured: palm_detection_full 5.8 -> 19.9 ms on 16 cores)."""
    threads = min(threads, MAX_TEAM)
    return threads if work >= threads * per_thread else 1


def team_for(work: int, per_thread: int) -> int:
    """At compile time: share_among the kernel's team."""
    return share_among(native_team(), work, per_thread)


def limit_team(threads: int) -> None:
    """For the runs that follow: no native loop's team takes more than ``threads`` (at least 1), whatever
    it was built for (native.c's team_limit)."""
    loops = _LOADED[0] if _LOADED else None
    if loops is not None:
        loops.library.set_team_limit(threads)


def partition_team(ops, threads: int) -> int:
    """At compile time: how many of ``threads`` a partition's native loops share (one team for all its
    kernels, each op on all of it or on one thread, see share_among): enough for its large ops, the
    work-weighted upper quartile of its convolutions, products and ops built on e^x (a quarter of their
    multiply-adds are in ops at least that big, see _multiply_adds), to give each TEAM_SHARE; all of them (up to MAX_TEAM) when it has
    none; never more than the cores of the process's affinity (a team larger waits on threads without
    a core).  The median op would leave models of many small ops and a few large ones (MobileNetV2 at
    96x96: 221k multiply-adds, upper quartile 885k) on one thread while LiteRT splits every op."""
    threads = min(threads, available_cores())
    works = sorted(work for work in map(_multiply_adds, ops) if work)
    if not works:
        return min(threads, MAX_TEAM)
    total, running = sum(works), 0
    for large in works:
        running += large
        if 4 * running >= 3 * total:
            break
    return max(1, min(threads, MAX_TEAM, large // TEAM_SHARE))


# What one value of an op built on e^x costs the native loops, in the multiply-adds of a packed product that take
# as long: MobileNetV2's 1x1 products at 56x56 ran 73 GMAC/s on one thread of the 2-core VM, and a transformer
# block's 2 x 197 x 197 SOFTMAX took 67 us there (63 a value) before its exp went native, 36 us after (~34).
EXP_VALUE_MACS = 32
EXP_OPS = frozenset({"SOFTMAX", "LOGISTIC", "TANH", "GELU", "EXP", "ELU", "LOG_SOFTMAX"})


def _multiply_adds(op) -> int:
    """Multiply-adds of a convolution or fully connected op, and what a float op built on e^x costs as many
    (EXP_VALUE_MACS a value); 0 for others (a BATCH_MATMUL goes through numpy's BLAS on one thread, not the
    team: counted, it put a quantized ViT block's partition on two threads, 3% slower than one)."""
    out = math.prod(op.outputs[0].shape) if op.outputs and op.outputs[0].shape is not None else 0
    if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        _, kh, kw, depth = op.inputs[1].shape
        return out * kh * kw * (depth if op.opcode == "CONV_2D" else 1)
    if op.opcode == "FULLY_CONNECTED":
        return out * op.inputs[1].shape[-1]
    if op.opcode in EXP_OPS and op.outputs[0].dtype.numpy == np.float32:
        return out * EXP_VALUE_MACS
    return 0


def kernel_loops() -> NativeLoops | None:
    """At compile time: the native loops, if the kernel being built may use them."""
    return native_loops() if native_allowed() else None


def float_loops(op) -> NativeLoops | None:
    """At compile time: the native loops for a kernel of a float input, at any size: inside a stretch of
    prepared calls an op costs the loops almost nothing, where a numpy step between stretches costs a
    Python call and splits the stretch (face_detection_short_range's small ADDs and RELUs took 10-12 us
    each through numpy on a 2-core machine)."""
    if op.inputs[0].dtype.numpy != np.float32:
        return None
    return kernel_loops()


def elementwise_loops(op) -> NativeLoops | None:
    """At compile time: float_loops for an elementwise kernel whose operands are all float and of the
    output's shape."""
    shape = op.outputs[0].shape
    if any(t is None or t.shape != shape or t.dtype.numpy != np.float32 for t in [*op.inputs, *op.outputs]):
        return None
    return float_loops(op)
