"""Convolution and matrix-product kernels: CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV, FULLY_CONNECTED,
BATCH_MATMUL, and MediaPipe's Convolution2DTransposeBias.

Weights are laid out once at compile time as GEMM operands, packed for the
native loops where those run.  There a float convolution reads its input in
place (no im2col copy) and a 1x1 convolution or fully connected layer is one
product on the whole input, bias and activation applied in registers.  Else a
convolution runs one BLAS product per block of output rows (on a view of the
input for 1x1 filters, else on the block's sliding windows copied into scratch)
and adds bias and activation while the block is in cache.  A depthwise
convolution accumulates one multiply per filter tap.  Work is shared among the
threads.
"""

from __future__ import annotations

import math

import numpy as np

from delegate.plugin_api import Op, transpose_conv_bias_geometry

from ..registry import kernel, laid_out
from .common import (CLAMPS, Padded, PaddedRows, activation, along_rows, contiguous_layout, convert, float_constant,
                     fused, fused_name, same_padding, scratch, strided, window_view)
from .native import (NO_EPILOGUE, PER_THREAD_MACS, BatchProductCall, ConvCall, DepthwiseCall, DepthwiseTaps, Epilogue,
                     Geometry, PackedOperand, ProductCall, float_loops, kernel_loops, prepared_run, team_for)
from .parallel import chunks_for, even_chunks, kernel_threads, spread


def conv_pads(op: Op, in_hw, kernel_hw, out_hw) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) zero padding: SAME's, none for VALID, or a pad op's absorbed (see
    fusion.py)."""
    o = op.options
    if "explicit_padding" in o:
        return o["explicit_padding"]
    if o.get("padding", "SAME") != "SAME":
        return 0, 0, 0, 0
    top, bottom = same_padding(in_hw[0], kernel_hw[0], o.get("stride_h", 1), o.get("dilation_h_factor", 1),
                               out_hw[0])
    left, right = same_padding(in_hw[1], kernel_hw[1], o.get("stride_w", 1), o.get("dilation_w_factor", 1),
                               out_hw[1])
    return top, bottom, left, right


def _bias(op: Op, index: int, channels: int) -> np.ndarray | None:
    bias = float_constant(op.input(index))
    return None if bias is None else bias.reshape(channels)


def _gemm_layout(w: np.ndarray) -> np.ndarray:
    """OHWI filter (or O x depth matrix) -> contiguous (depth, O) GEMM operand in im2col column order."""
    return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)


# Smallest product (multiply-adds) worth a chunk of its own on another thread.
GEMM_CHUNK_WORK = 1 << 23
# Most scratch memory (im2col rows, accumulators) one block of a product may use: bounds the memory
# (every thread keeps its own), while much smaller blocks cost more numpy calls than they save.
BLOCK_SCRATCH = 1 << 21


def spread_gemm(batch: int, rows: int, row_pixels: int, units: int, depth: int, row_scratch: int = 0,
                unit_scratch: int = 0, shared: bool = True):
    """spread() over gemm_blocks: shared among the kernel threads, or as few blocks as possible alone
    (always alone when not ``shared``: the products themselves run on every thread)."""
    with kernel_threads(1):
        alone = gemm_blocks(batch, rows, row_pixels, units, depth, row_scratch, unit_scratch)
        if not shared:
            return spread(alone)
    return spread(gemm_blocks(batch, rows, row_pixels, units, depth, row_scratch, unit_scratch), alone)


# Fewest multiply-adds a product on views made per run needs to go through the native loops: a call
# there costs ~7 us (argument checks and conversions), numpy's product with its bias and clamp passes
# ~3.  A product on a whole input prepares its call at compile time (~1.5 us) and always goes.
NATIVE_PRODUCT_WORK = 1 << 18


class NativeProduct:
    """A kernel's products through the native loops, each on all the kernel's threads (no hand-over
    per block), with a float kernel's bias and clamp applied there: its finish's ``epilogue``
    (see bias_activation); ``finishes`` says whether that leaves nothing for the finish to do.
    A constant float32 operand is packed once (see pack) for native.c's own product; others go to
    numpy's BLAS."""

    def __init__(self, loops, epilogue: Epilogue | None, work: int):
        self.loops, self.threads, self.epilogue = loops, team_for(work, PER_THREAD_MACS), epilogue
        self.finishes = epilogue is not None
        self.packed: PackedOperand | None = None
        self.panel_epilogue = NO_EPILOGUE

    @classmethod
    def of(cls, finish, depth_parts, work: int, whole_operand=None) -> "NativeProduct | None":
        """At compile time: the products (``work`` multiply-adds in all) of a kernel with this finish;
        None where numpy's run, among them products on views too small to repay a native call's
        overhead.  ``whole_operand``: the kernel's operand where it may be one product on the whole
        input, which goes native at any size when packed with the finish's epilogue (see whole_input)."""
        loops = kernel_loops()
        if loops is None or depth_parts is not None:
            return None
        epilogue = getattr(finish, "epilogue", None)
        prepared = epilogue is not None and _packable(whole_operand)
        if work < NATIVE_PRODUCT_WORK and not prepared:
            return None
        return cls(loops, epilogue, work)

    def pack(self, matrix: np.ndarray):
        """At compile time: the constant operand as the products take it."""
        if not _packable(matrix):
            return matrix
        self.packed = PackedOperand(matrix, self.loops.panel_lanes)
        if self.epilogue is not None:
            self.panel_epilogue = self.epilogue.padded(self.packed.padded_columns)
        return self.packed

    def whole_input(self, rows: int, residual: int | None = None):
        """At compile time: run() of the kernel as one prepared native call on its whole input, (rows,
        depth) in place, into its contiguous output, epilogue included (with the residual operand of
        input slot ``residual`` added, where given); None where the operand is not packed or the
        finish does more than the epilogue."""
        if self.packed is None or not self.finishes:
            return None
        depth = self.packed.depth
        call = ProductCall((rows, depth), (depth * 4, 4), self.packed, self.packed.columns, self.panel_epilogue,
                           self.threads, residual is not None)
        return prepared_run(self.loops, call, 1 if residual is None else (0, residual))

    def __call__(self, lhs: np.ndarray, rhs, out: np.ndarray, u0: int, u1: int) -> bool:
        """out = lhs @ rhs for units u0..u1 (and their epilogue); False (nothing done) where the
        operands' layout or the BLAS does not allow it."""
        if isinstance(rhs, PackedOperand):
            return (u0, u1) == (0, rhs.columns) and self.loops.packed_product(lhs, rhs, out, self.threads,
                                                                               self.panel_epilogue)
        if self.loops.sgemm is None:
            return False
        epilogue = NO_EPILOGUE if self.epilogue is None else self.epilogue.columns(u0, u1)
        return self.loops.product(lhs, _operand_block(rhs, u0, u1), out, self.threads, epilogue)


def _packable(operand) -> bool:
    """Whether a GEMM operand is a constant float32 matrix: packed at any width.  Narrow panels waste lanes,
    but a packed product is prepared and batched with its neighbours, its bias and clamp in the epilogue:
    MobileNetV2-0.35's 8-unit projections ran the whole model 13% faster (AVX-512), and BlazeFace's 2-unit
    1x1 head 7 us where numpy's product with its bias took 27-28 (a 2-core machine, 1 and 2 threads)."""
    return isinstance(operand, np.ndarray) and operand.dtype == np.float32


def operand_source(operand, native: NativeProduct | None):
    """``operand(ins)`` of a GEMM operand given as a constant matrix (packed for native products) or
    as that function already."""
    if not isinstance(operand, np.ndarray):
        return operand
    constant = operand if native is None else native.pack(operand)
    return lambda ins: constant


def gemm_blocks(batch: int, rows: int, row_pixels: int, units: int, depth: int, row_scratch: int = 0,
                unit_scratch: int = 0) -> list[tuple[int, int, int, int, int]]:
    """(image, first row, end row, first unit, end unit) blocks of an (N, rows, row_pixels, units)
    product output, to share among the kernel threads.

    Row bands normally, few enough that each row band takes less than BLOCK_SCRATCH of
    scratch (``row_scratch`` bytes per row); slices of the output units for short, wide
    products (the last layers of a network), where bands would be too thin for BLAS, and
    for short products whose operand is converted per block (``unit_scratch`` bytes per unit).
    """
    work = rows * row_pixels * units * depth
    short = rows * row_pixels < 256 and rows * row_scratch <= BLOCK_SCRATCH
    if short and (units >= 256 or units * unit_scratch > BLOCK_SCRATCH):
        groups = -(-units // 16)
        slices = max(len(chunks_for(groups, work, GEMM_CHUNK_WORK)), -(-units * unit_scratch // BLOCK_SCRATCH))
        return [(b, 0, rows, 16 * u0, min(units, 16 * u1)) for b in range(batch)
                for u0, u1 in even_chunks(groups, slices)]
    bands = max(len(chunks_for(rows, work, GEMM_CHUNK_WORK)), -(-rows * row_scratch // BLOCK_SCRATCH))
    return [(b, y0, y1, 0, units) for b in range(batch) for y0, y1 in even_chunks(rows, bands)]


# Products with fewer output rows than this read each weight only a few times per run: converting a
# block of the stored integer weights as it is needed costs little next to the product, and saves
# keeping a float copy of every weight (4 bytes each).
STORED_OPERAND_ROWS = 256


class StoredOperand:
    """A constant GEMM operand kept as stored (integers less ``offset``), handed to the product one
    block of units at a time, converted into scratch (see STORED_OPERAND_ROWS)."""

    def __init__(self, stored: np.ndarray, offset: int, dtype):
        self.stored, self.offset, self.dtype = stored, offset, np.dtype(dtype)
        self.unit_bytes = stored.shape[0] * self.dtype.itemsize

    def __call__(self, ins) -> "StoredOperand":
        return self

    def block(self, u0: int, u1: int) -> np.ndarray:
        out = scratch("operand", (self.stored.shape[0], u1 - u0), self.dtype)
        convert(self.stored[:, u0:u1], self.offset, out)
        return out


def _operand_block(rhs, u0: int, u1: int) -> np.ndarray:
    return rhs.block(u0, u1) if isinstance(rhs, (StoredOperand, PackedOperand)) else rhs[:, u0:u1]


def _block_scratch(copied: int, accumulated: int, dtype) -> int:
    """Scratch bytes per output pixel: ``copied`` input values converted to ``dtype`` (im2col), and
    ``accumulated`` products kept apart from the output, with the 12 bytes each the rescale adds."""
    return copied * np.dtype(dtype).itemsize + accumulated * (np.dtype(dtype).itemsize + 12)


def bias_activation(op: Op, bias: np.ndarray | None, out_shape: tuple[int, ...], add: Op | None = None):
    """``finish(acc, out, u0, u1)`` of float kernels: bias and fused activation on a block of output
    rows holding units u0..u1, in place (``acc`` is ``out``), while the block is still in cache.

    Its ``epilogue`` is the same for the native loops, where the activation is none, a clamp or PReLU;
    with ``add`` (a residual ADD fused in), the epilogue also adds the ADD's other operand and applies
    its clamp or PReLU (the numpy ``finish`` does not: see conv_2d).
    """
    act = fused(op)
    units = out_shape[-1]
    row = None if bias is None else along_rows(bias, out_shape)
    name, slope = fused_name(op), op.options.get("prelu_slope")

    def finish(acc: np.ndarray, out: np.ndarray, u0: int, u1: int) -> None:
        whole = u1 - u0 == units
        if bias is not None:
            np.add(out, row if whole else bias[u0:u1], out=out)
        if whole or slope is None:
            act(out)
        else:
            activation(name, slope[u0:u1])(out)
    add_name = "NONE" if add is None else fused_name(add)
    add_slope = None if add is None else add.options.get("prelu_slope")
    native = name in ("NONE", "PRELU", *CLAMPS) and add_name in ("NONE", "PRELU", *CLAMPS)
    finish.epilogue = Epilogue(bias, CLAMPS.get(name), slope, CLAMPS.get(add_name), add_slope) if native else None
    return finish


def residual_parts(op: Op) -> tuple[Op, Op, int] | None:
    """Of a CONV_2D with a residual ADD fused in (fusion.py: the ADD's other operand its last input): the
    convolution alone, the ADD, and which of the ADD's inputs the convolution's result is."""
    add = op.options.get("residual")
    if add is None:
        return None
    first = 0 if add.inputs[0].producer is not None and add.inputs[0].producer.index == op.index else 1
    options = {key: value for key, value in op.options.items() if key != "residual"}
    conv = Op(op.index, op.opcode, op.inputs[:-1], [add.inputs[first]], version=op.version, options=options,
              options_type=op.options_type)
    return conv, add, first


@kernel("CONV_2D")
def conv_2d(op: Op):
    """A float CONV_2D; with a residual ADD fused in, the ADD's other operand added by the native loops'
    epilogue as each tile is stored, else added (and the ADD's activation applied) after the
    convolution, in place on its output (which never shares memory with the operand: the arena keeps
    an op's inputs and outputs apart)."""
    parts = residual_parts(op)
    if parts is None:
        return laid_out(_conv_2d(op), 1, 2)
    conv, add, _ = parts
    native = _conv_2d(conv, add)
    if native is not None:
        return laid_out(native, 1, 2)
    conv_run, act = _conv_2d(conv), fused(add)

    def run(ins, outs):
        conv_run(ins[:-1], outs)
        np.add(outs[0], ins[-1], out=outs[0])
        act(outs[0])
    return laid_out(run, 1, 2)


def _conv_2d(op: Op, add: Op | None = None):
    """run() of a float CONV_2D; with ``add``, of the convolution adding the ADD's other operand (the
    input after the op's last) in the native loops' epilogue, or None where they do not serve."""
    n, h, w, c = op.inputs[0].shape
    o, kh, kw, ci = op.inputs[1].shape
    if c != ci:
        return None if add is not None else _grouped_conv_2d(op)
    weights = float_constant(op.inputs[1])
    finish = bias_activation(op, _bias(op, 2, o), op.outputs[0].shape[1:], add)
    residual = None if add is None else len(op.inputs)
    if add is not None and finish.epilogue is None:
        return None
    if kh * kw > 1:
        direct = _direct_conv(op, weights, finish, residual)
        if direct is not None or residual is not None:
            return direct
    operand = _gemm_layout(weights) if weights is not None else \
        (lambda ins: _gemm_layout(np.asarray(ins[1], np.float32)))
    return conv_gemm(op, operand, finish, residual=residual)


def _direct_conv(op: Op, weights: np.ndarray | None, finish, residual: int | None = None):
    """run() of a float CONV_2D with a filter wider than one pixel in the native loops, read in place
    (no im2col copy) on all the kernel's threads (with the residual operand of input slot ``residual``
    added, where given); None where those do not serve.  With the finish's epilogue it is one prepared
    call."""
    n, h, w, c = op.inputs[0].shape
    o, kh, kw, _ = op.inputs[1].shape
    _, oh, ow, _ = op.outputs[0].shape
    loops = kernel_loops()
    if loops is None or weights is None:
        return None
    packed = PackedOperand(_gemm_layout(weights), loops.panel_lanes)
    where = Geometry.of(op, contiguous_layout((n, h, w, c)), contiguous_layout((n, oh, ow, o)),
                        conv_pads(op, (h, w), (kh, kw), (oh, ow)))
    epilogue, team = finish.epilogue, team_for(n * oh * ow * o * kh * kw * c, PER_THREAD_MACS)
    if epilogue is not None:
        call = ConvCall(packed, where, epilogue.padded(packed.padded_columns), team, residual is not None)
        return prepared_run(loops, call, 1 if residual is None else (0, residual))

    def run(ins, outs):
        loops.conv(np.ascontiguousarray(ins[0]), packed, outs[0], where, team)
        finish(outs[0], outs[0], 0, o)
    return run


def conv_gemm(op: Op, operand, finish, dtype=np.float32, offset: float = 0, depth_parts=None,
              residual: int | None = None):
    """run() of a CONV_2D as one GEMM per block of output rows, on a view of the input for 1x1
    convolutions, else on the block's sliding windows copied into scratch (im2col).  With ``residual``
    (an input slot), only as the one native product on the whole input adding that operand (see
    NativeProduct.whole_input), or None.

    ``operand`` is the constant (KH*KW*C, units) GEMM operand in ``dtype``, or ``operand(ins)`` gives it
    (or a StoredOperand); the input enters the
    GEMM converted to ``dtype`` less ``offset`` (a quantized input's zero point).
    ``finish(acc, out, u0, u1)`` turns a block of products for units u0..u1 into the output
    block: in place when the output has the GEMM's type, else from a scratch block.  With
    ``depth_parts`` the products are summed per range of the depth, then in float64 (see product).
    """
    n, h, w, c = op.inputs[0].shape
    o, kh, kw, _ = op.inputs[1].shape
    _, oh, ow, _ = op.outputs[0].shape
    opts = op.options
    stride = (opts.get("stride_h", 1), opts.get("stride_w", 1))
    dilation = (opts.get("dilation_h_factor", 1), opts.get("dilation_w_factor", 1))
    depth = kh * kw * c
    pads = conv_pads(op, (h, w), (kh, kw), (oh, ow))
    source = op.inputs[0].dtype.numpy
    pointwise = kh == kw == 1 and stride == (1, 1) and not any(pads)
    view = pointwise and source == dtype and not offset
    padded = PaddedRows((1, h, w, c), pads, dtype=dtype, source_dtype=source, offset=offset)
    reach = (kh - 1) * dilation[0] + 1
    few_channels = kw * c < 16
    in_place = op.outputs[0].dtype.numpy == dtype
    accumulator = dtype if depth_parts is None else np.float64
    native = NativeProduct.of(finish, depth_parts, n * oh * ow * o * depth, operand if view and in_place else None)
    operand = operand_source(operand, native)
    whole = native.whole_input(n * h * w, residual) if native is not None and view and in_place else None
    if whole is not None or residual is not None:
        return whole
    split = spread_gemm(n, oh, ow, o, depth, ow * _block_scratch(0 if view else depth, 0 if in_place else o, dtype),
                        getattr(operand, "unit_bytes", 0), native is None)

    def run(ins, outs):
        x, out = ins[0], outs[0]
        rhs = operand(ins)
        pixels, flat = x.reshape(n, h * w, c), out.reshape(n, oh * ow, o)

        def block(b, y0, y1, u0, u1):
            rows = (y1 - y0) * ow
            if view:
                lhs = pixels[b, y0 * ow:y1 * ow]
            elif pointwise:
                lhs = scratch(0, (rows, c), dtype)
                convert(pixels[b, y0 * ow:y1 * ow], offset, lhs)
            else:
                band = padded.band(x[b:b + 1], y0 * stride[0], (y1 - 1) * stride[0] + reach)[0]
                windows = window_view(band, (y1 - y0, ow), (kh, kw), stride, dilation)
                if few_channels:
                    # Window rows of a few channels are short runs: copy each (tap, channel) along
                    # the pixels instead, into the transposed im2col matrix.
                    columns = scratch(0, (depth, rows), dtype)
                    np.copyto(columns.reshape(kh, kw, c, 1, y1 - y0, ow).transpose(3, 4, 5, 0, 1, 2), windows)
                    lhs = columns.T
                else:
                    lhs = scratch(0, (rows, depth), dtype)
                    np.copyto(lhs.reshape(1, y1 - y0, ow, kh, kw, c), windows)
            acc = flat[b, y0 * ow:y1 * ow, u0:u1] if in_place else scratch(1, (rows, u1 - u0), accumulator)
            if native is None or not native(lhs, rhs, acc, u0, u1):
                product(lhs, _operand_block(rhs, u0, u1), acc, depth_parts)
            elif native.finishes:
                return
            finish(acc.reshape(y1 - y0, ow, u1 - u0), out[b, y0:y1, :, u0:u1], u0, u1)
        split(block)
    return run


def product(lhs: np.ndarray, rhs: np.ndarray, out: np.ndarray, depth_parts=None) -> None:
    """``out`` = lhs @ rhs; with ``depth_parts`` (ranges of the depth) as the float64 sum of the
    ranges' products, each exact in the operands' float32 where the whole sum would not be."""
    if depth_parts is None:
        np.matmul(lhs, rhs, out=out)
        return
    piece = scratch("piece", out.shape, lhs.dtype)
    for i, (k0, k1) in enumerate(depth_parts):
        np.matmul(lhs[:, k0:k1], rhs[k0:k1], out=piece if i else out)
        if i:
            out += piece


def _grouped_conv_2d(op: Op):
    """Grouped convolution (input channels a multiple of the filter's): one GEMM per group."""
    n, h, w, c = op.inputs[0].shape
    o, kh, kw, ci = op.inputs[1].shape
    _, oh, ow, _ = op.outputs[0].shape
    opts = op.options
    stride = (opts.get("stride_h", 1), opts.get("stride_w", 1))
    dilation = (opts.get("dilation_h_factor", 1), opts.get("dilation_w_factor", 1))
    groups, per_group, rows = c // ci, o // (c // ci), n * oh * ow
    pad = Padded((n, h, w, c), conv_pads(op, (h, w), (kh, kw), (oh, ow)))
    weights = float_constant(op.inputs[1])
    finish = bias_activation(op, _bias(op, 2, o), (oh, ow, o))

    def layout(w):
        return [_gemm_layout(w[g * per_group:(g + 1) * per_group]) for g in range(groups)]
    gemms = None if weights is None else layout(weights)

    def run(ins, outs):
        operands = gemms if gemms is not None else layout(np.asarray(ins[1], np.float32))
        columns = scratch(0, (n, oh, ow, kh, kw, c))
        np.copyto(columns, window_view(pad(ins[0]), (oh, ow), (kh, kw), stride, dilation))
        grouped = columns.reshape(rows, kh * kw, groups, ci)
        out2d = outs[0].reshape(rows, o)
        for g in range(groups):
            np.matmul(grouped[:, :, g, :].reshape(rows, kh * kw * ci), operands[g],
                      out=out2d[:, g * per_group:(g + 1) * per_group])
        finish(outs[0], outs[0], 0, o)
    return laid_out(run, 1, 2)


# Smallest depthwise work (tap multiply-adds) worth a chunk of its own on another thread.
DEPTHWISE_CHUNK_WORK = 1 << 20


@kernel("DEPTHWISE_CONV_2D")
def depthwise_conv_2d(op: Op):
    finish = bias_activation(op, _bias(op, 2, op.outputs[0].shape[-1]), op.outputs[0].shape)
    return laid_out(depthwise_taps(op, float_constant(op.inputs[1]), finish), 1, 2)


def _depthwise_tiling(op: Op):
    """``tile(filter)``: the (1, KH, KW, C) depthwise filter as the einsum's operand (phases, KH,
    grid columns, OW * C), each tap repeated along the output width."""
    _, kh, kw, oc = op.inputs[1].shape
    ow = op.outputs[0].shape[2]
    sw, dw = op.options.get("stride_w", 1), op.options.get("dilation_w_factor", 1)
    grid = _depthwise_grid(kw, sw, dw)
    span = max(j for _, j in grid) + 1

    def tile(weights: np.ndarray, dtype=np.float32) -> np.ndarray:
        tiled = np.zeros((sw, kh, span, ow, oc), dtype)
        for kx, (phase, j) in enumerate(grid):
            tiled[phase, :, j] = weights[0, :, kx, None, :]
        return tiled.reshape(sw, kh, span, ow * oc)
    return tile


def _depthwise_grid(kw: int, sw: int, dw: int) -> list[tuple[int, int]]:
    """Per filter column: (column phase, column offset in the phase) it reads."""
    return [(kx * dw % sw, kx * dw // sw) for kx in range(kw)] if sw > 1 else [(0, kx) for kx in range(kw)]


def depthwise_taps(op: Op, weights: np.ndarray | None, finish, dtype=np.float32, offset: float = 0):
    """run() of a DEPTHWISE_CONV_2D: in the native loops (see _native_depthwise), else as one einsum
    per band of output rows.

    ``weights`` is the constant (1, KH, KW, C) filter (less its zero point), or None for a
    filter read from the run's inputs.  The einsum multiply-accumulates each tap along
    whole output rows, one long contiguous multiply-add over a row's (width, channels) at
    once, where separate numpy passes would cost a multiply and an add pass each, with
    the filter tiled to match (see _depthwise_tiling).  Row strides are views; under a
    column stride the padded input is split into column phases, with the taps laid out
    per phase on one grid (zero where a phase has fewer taps).  Inputs are converted as
    in conv_gemm, and ``finish(acc, out, 0, C)`` completes each band (or the native loops
    do, for a bias and clamp).
    """
    n, h, w, c = op.inputs[0].shape
    _, kh, kw, oc = op.inputs[1].shape
    _, oh, ow, _ = op.outputs[0].shape
    opts = op.options
    sh, sw = opts.get("stride_h", 1), opts.get("stride_w", 1)
    dh, dw = opts.get("dilation_h_factor", 1), opts.get("dilation_w_factor", 1)
    spread_channels = _ChannelSpread((n, h, w, c), oc // c, op.inputs[0].dtype.numpy)
    pads = conv_pads(op, (h, w), (kh, kw), (oh, ow))
    bands = PaddedRows((n, h, w, oc), pads, sw, dtype, op.inputs[0].dtype.numpy, offset)
    column_step = 1 if sw > 1 else dw
    span = max(j for _, j in _depthwise_grid(kw, sw, dw)) + 1
    in_place = op.outputs[0].dtype.numpy == dtype
    # Per output row: its share of the band (with its conversion), and the accumulators kept apart.
    row_scratch = n * sh * bands.shape[2] * oc * (np.dtype(dtype).itemsize + 1) + _block_scratch(
        0, 0 if in_place else n * ow * oc, dtype)
    least = -(-oh * row_scratch // BLOCK_SCRATCH)
    loops = kernel_loops() if np.dtype(dtype) == np.float32 else None
    if loops is not None:
        taps = None if weights is None else DepthwiseTaps(weights.reshape(kh * kw, oc))
        epilogue = getattr(finish, "epilogue", None)
        return _native_depthwise(
            loops, op, pads, [(0, oh)] if not bands.converts else even_chunks(oh, least), spread_channels,
            taps if taps is not None else (lambda ins: DepthwiseTaps(np.reshape(ins[1], (kh * kw, oc)))),
            finish, None if epilogue is None else epilogue.tiled(ow), dtype, offset)
    tile = _depthwise_tiling(op)
    tiled = None if weights is None else tile(weights, dtype)
    shared = chunks_for(oh, n * oh * ow * oc * kh * kw, DEPTHWISE_CHUNK_WORK)
    split = spread(even_chunks(oh, max(len(shared), least)), even_chunks(oh, least))

    def run(ins, outs):
        x, out = spread_channels(ins[0]), outs[0]
        filt = tiled if tiled is not None else tile(np.asarray(ins[1], np.float32))

        def rows(start, stop):
            band = bands.band(x, start * sh, (stop - 1) * sh + (kh - 1) * dh + 1)
            s_phase, s_image, s_row, s_col, s_item = band.strides
            windows = strided(band, (n, stop - start, sw, kh, span, ow * oc),
                              (s_image, sh * s_row, s_phase, dh * s_row, column_step * s_col, s_item))
            part = out[:, start:stop]
            acc = part if in_place else scratch(1, part.shape, dtype)
            np.einsum("nhpijm,pijm->nhm", windows, filt, out=acc.reshape(n, stop - start, ow * oc))
            finish(acc, part, 0, oc)
        split(rows)
    return run


def _native_depthwise(loops, op: Op, pads: tuple[int, int, int, int], chunks: list[tuple[int, int]],
                      spread_channels, operand, finish, epilogue: Epilogue | None, dtype, offset: float):
    """run() of a DEPTHWISE_CONV_2D in the native loops, on all the kernel's threads: they read a float
    input in place, padding included; an input to convert (less its zero point) is converted one
    band of the rows that ``chunks`` of output rows read at a time, into scratch.  ``operand`` is the
    filter as DepthwiseTaps, or ``operand(ins)`` gives it."""
    n, h, w, _ = op.inputs[0].shape
    _, kh, kw, oc = op.inputs[1].shape
    _, oh, ow, _ = op.outputs[0].shape
    sh, reach = op.options.get("stride_h", 1), (kh - 1) * op.options.get("dilation_h_factor", 1) + 1
    team, finishes = team_for(n * oh * ow * oc * kh * kw, PER_THREAD_MACS), epilogue or NO_EPILOGUE
    if op.inputs[0].dtype.numpy == dtype and not offset:
        where = Geometry.of(op, contiguous_layout((n, h, w, oc)), contiguous_layout(op.outputs[0].shape), pads)
        # A constant filter's call is built here: a run only places the input and output.
        call = DepthwiseCall(operand, where, finishes, team) if isinstance(operand, DepthwiseTaps) else None
        if call is not None and epilogue is not None and spread_channels.multiplier == 1:
            return prepared_run(loops, call)

        def run_float(ins, outs):
            x = np.ascontiguousarray(spread_channels(ins[0]))
            if call is not None:
                loops.prepared(call, x, outs[0])
            else:
                loops.depthwise(x, operand(ins), outs[0], where, team, finishes)
            if epilogue is None:
                finish(outs[0], outs[0], 0, oc)
        return run_float

    in_place = op.outputs[0].dtype.numpy == dtype
    bands = []  # per chunk of output rows: the input rows it reads, and where it reads and writes
    for start, stop in chunks:
        first, end = min(max(start * sh - pads[0], 0), h), min(max((stop - 1) * sh - pads[0] + reach, 0), h)
        rows = (n, end - first, w, oc)
        out = ((n, stop - start, ow, oc), (oh * ow * oc, ow * oc, oc, 1)) if in_place else \
            contiguous_layout((n, stop - start, ow, oc))
        bands.append((start, stop, first, end,
                      Geometry.of(op, contiguous_layout(rows), out, pads, top=pads[0] + first - start * sh)))

    def run(ins, outs):
        x, out = spread_channels(ins[0]), outs[0]
        filt = operand if isinstance(operand, DepthwiseTaps) else operand(ins)
        for start, stop, first, end, where in bands:
            rows = scratch("converted", (n, end - first, w, oc), dtype)
            convert(x[:, first:end], offset, rows)
            part = out[:, start:stop]
            acc = part if in_place else scratch(1, part.shape, dtype)
            loops.depthwise(rows, filt, acc, where, team, finishes)
            finish(acc, part, 0, oc)
    return run


class _ChannelSpread:
    """The depthwise input with each channel repeated ``multiplier`` times, so that input channel i
    feeds outputs i*m .. i*m+m-1 (the input itself for a multiplier of 1)."""

    def __init__(self, shape: tuple[int, ...], multiplier: int, dtype):
        self.shape, self.multiplier, self.dtype = shape, multiplier, dtype

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.multiplier == 1:
            return x
        n, h, w, c = self.shape
        spread_x = scratch("spread", (n, h, w, c, self.multiplier), self.dtype)
        np.copyto(spread_x, x[..., None])
        return spread_x.reshape(n, h, w, c * self.multiplier)


def transpose_conv(op: Op, slots: tuple[int, int, int], stride: tuple[int, int], pad_before: tuple[int, int],
                   act):
    """Transposed convolution: one GEMM to per-tap contributions, then strided accumulation.

    ``slots`` are the input indices of data, weights (OHWI) and bias.  Each input
    pixel adds ``x . w[:, ky, kx, :]`` at output position
    ``(iy * stride - pad + ky, ix * stride - pad + kx)``; bias is added once.
    Returns ``run(x, w, out)`` (``w`` is only read when the weights are not constant).
    """
    data_index, weight_index, bias_index = slots
    n, ih, iw, ci = op.inputs[data_index].shape
    _, oh, ow, o = op.outputs[0].shape
    _, kh, kw, _ = op.inputs[weight_index].shape
    sh, sw = stride
    top, left = pad_before
    bias = _bias(op, bias_index, o)
    bias = None if bias is None else along_rows(bias, op.outputs[0].shape)

    def layout(w):
        return np.ascontiguousarray(w.transpose(3, 1, 2, 0).reshape(ci, kh * kw * o))

    weights = float_constant(op.inputs[weight_index])
    gemm = None if weights is None else layout(weights)
    full = (n, max((ih - 1) * sh + kh, top + oh), max((iw - 1) * sw + kw, left + ow), o)
    # Taps as far apart as the stride, nothing cropped (upsampling by the stride): each output pixel
    # takes one tap of one input pixel, so the contributions only need moving into place.
    tiles = (kh, kw) == (sh, sw) and (top, left) == (0, 0) and (oh, ow) == (ih * sh, iw * sw)

    def run(x, w, out):
        taps = gemm if gemm is not None else layout(np.asarray(w, np.float32))
        if tiles:
            # every tap's products at once, each row of taps then copied to its output rows in blocks of kw * o
            # values (MediaPipe selfie's 128x128x16 -> 256x256x1 on a 2-core machine: a product per row of taps,
            # 2 columns each, 80 us a product against 41 for one of 4 columns, and 100 for the native packed
            # product, whose panels a product this narrow leaves mostly empty)
            rows, flat = out.reshape(n * ih, kh, iw, kw * o), x.reshape(n * ih * iw, ci)
            part = scratch(1, (n * ih * iw, kh * kw * o))
            np.matmul(flat, taps, out=part)
            parts = part.reshape(n * ih, iw, kh, kw * o)
            np.copyto(_wide(rows), _wide(parts).transpose(0, 2, 1, 3))
            if bias is not None:
                out += bias
            act(out)
            return
        acc, contrib = scratch(0, full), scratch(1, (n * ih * iw, kh * kw * o))
        np.matmul(x.reshape(n * ih * iw, ci), taps, out=contrib)
        parts = contrib.reshape(n, ih, iw, kh, kw, o)
        acc.fill(0)
        for ky in range(kh):
            for kx in range(kw):
                acc[:, ky:ky + sh * (ih - 1) + 1:sh, kx:kx + sw * (iw - 1) + 1:sw, :] += parts[:, :, :, ky, kx, :]
        np.copyto(out, acc[:, top:top + oh, left:left + ow, :])
        if bias is not None:
            out += bias
        act(out)
    return run


def _wide(a: np.ndarray) -> np.ndarray:
    """A float32 array whose rows hold an even number of values, as float64 pairs: numpy moves strided 8-byte
    values about ten times faster than pairs of 4-byte ones (selfie's 256x256x1 output in rows of 2: 127 us
    against 9 on a 2-core machine)."""
    return a.view(np.float64) if a.shape[-1] % 2 == 0 and a.strides[-1] == 4 else a


@kernel("TRANSPOSE_CONV")
def transpose_conv_2d(op: Op):
    out_shape = op.outputs[0].shape
    _, kh, kw, _ = op.inputs[1].shape
    opts = op.options
    stride = (opts.get("stride_h", 1), opts.get("stride_w", 1))
    pads = (0, 0)
    if opts.get("padding", "SAME") == "SAME":
        # Padding as for a forward convolution from the output size back to the input size.
        pads = tuple(same_padding(out_shape[1 + i], (kh, kw)[i], stride[i], 1,
                                  -(-out_shape[1 + i] // stride[i]))[0] for i in range(2))
    run_tc = transpose_conv(op, (2, 1, 3), stride, pads, fused(op))

    def run(ins, outs):
        run_tc(ins[2], ins[1], outs[0])
    return laid_out(run, 1, 3)


@kernel("Convolution2DTransposeBias")
def convolution_2d_transpose_bias(op: Op):
    _, pads, stride = transpose_conv_bias_geometry(op.inputs[0].shape, op.inputs[1].shape, op.custom_options)
    run_tc = transpose_conv(op, (0, 1, 2), stride, pads, lambda x: None)

    def run(ins, outs):
        run_tc(ins[0], ins[1], outs[0])
    return laid_out(run, 1, 2)


@kernel("FULLY_CONNECTED")
def fully_connected(op: Op):
    units, _ = op.inputs[1].shape
    weights = float_constant(op.inputs[1])
    operand = _gemm_layout(weights) if weights is not None else (lambda ins: np.asarray(ins[1], np.float32).T)
    finish = bias_activation(op, _bias(op, 2, units), (units,))
    run = matrix_gemm(op, operand, finish)
    return laid_out(run, 1, 2)


def matrix_gemm(op: Op, operand, finish, dtype=np.float32, offset: float = 0, depth_parts=None):
    """run() of a FULLY_CONNECTED as GEMMs over blocks of rows or units; arguments as for conv_gemm."""
    units, depth = op.inputs[1].shape
    rows = int(np.prod(op.outputs[0].shape)) // units
    view = op.inputs[0].dtype.numpy == dtype and not offset
    in_place = op.outputs[0].dtype.numpy == dtype
    accumulator = dtype if depth_parts is None else np.float64
    native = NativeProduct.of(finish, depth_parts, rows * units * depth, operand if view and in_place else None)
    operand = operand_source(operand, native)
    whole = native.whole_input(rows) if native is not None and view and in_place else None
    if whole is not None:
        return whole
    split = spread_gemm(1, rows, 1, units, depth, _block_scratch(0 if view else depth, 0 if in_place else units, dtype),
                        getattr(operand, "unit_bytes", 0), native is None)

    def run(ins, outs):
        rhs = operand(ins)
        lhs, out2d = ins[0].reshape(rows, depth), outs[0].reshape(rows, units)

        def block(_, r0, r1, u0, u1):
            if view:
                a = lhs[r0:r1]
            else:
                a = scratch(0, (r1 - r0, depth), dtype)
                convert(lhs[r0:r1], offset, a)
            acc = out2d[r0:r1, u0:u1] if in_place else scratch(1, (r1 - r0, u1 - u0), accumulator)
            if native is None or not native(a, rhs, acc, u0, u1):
                product(a, _operand_block(rhs, u0, u1), acc, depth_parts)
            elif native.finishes:
                return
            finish(acc, out2d[r0:r1, u0:u1], u0, u1)
        split(block)
    return run


def _native_batch_matmul(op: Op, adj_x: bool, adj_y: bool):
    """A float32 BATCH_MATMUL through the native loops (each product by BLAS's sgemm on a thread of the team,
    batched with the calls around it), where its operands' batches are the output's (the second's may be one
    matrix for all) and numpy's BLAS is one the loops know; else None."""
    lhs, rhs, out = op.inputs[0], op.inputs[1], op.outputs[0]
    loops = float_loops(op)
    if loops is None or loops.sgemm is None or any(t.dtype.numpy != np.float32 for t in (lhs, rhs, out)) \
            or min(len(lhs.shape), len(rhs.shape), len(out.shape)) < 2:
        return None
    m, k = (lhs.shape[-1], lhs.shape[-2]) if adj_x else (lhs.shape[-2], lhs.shape[-1])
    k_b, n = (rhs.shape[-1], rhs.shape[-2]) if adj_y else (rhs.shape[-2], rhs.shape[-1])
    batches = tuple(out.shape[:-2])

    def padded(t):  # a batch shape as the output's
        dims = tuple(t.shape[:-2])
        return (1,) * (len(batches) - len(dims)) + dims if len(dims) <= len(batches) else None
    shared_b = padded(rhs) == (1,) * len(batches)
    if k != k_b or tuple(out.shape[-2:]) != (m, n) or padded(lhs) != batches or not (shared_b or padded(rhs) == batches):
        return None
    batch = math.prod(batches)
    if min(batch, m, n, k) < 1:  # an empty product: numpy's
        return None
    call = BatchProductCall(loops.sgemm, batch, m, n, k, (adj_x, adj_y), shared_b,
                            team_for(batch * m * n * k, PER_THREAD_MACS))
    return prepared_run(loops, call, 2)


@kernel("BATCH_MATMUL")
def batch_matmul(op: Op):
    adj_x, adj_y = bool(op.options.get("adj_x")), bool(op.options.get("adj_y"))
    native = _native_batch_matmul(op, adj_x, adj_y)
    if native is not None:
        return native
    rhs = float_constant(op.inputs[1])
    if rhs is not None:
        rhs = np.ascontiguousarray(np.swapaxes(rhs, -1, -2) if adj_y else rhs)

    def run(ins, outs):
        a = np.swapaxes(ins[0], -1, -2) if adj_x else ins[0]
        b = rhs if rhs is not None else (np.swapaxes(ins[1], -1, -2) if adj_y else ins[1])
        np.matmul(a, b, out=outs[0])
    return laid_out(run, 1)
