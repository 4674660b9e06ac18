"""Output-shape inference per builtin op.

Used by the builder (so tests need not spell output shapes) and by the runtime
when an input is resized.  Rules follow the TFLite kernels' Prepare steps;
constant operands (axes, shapes, paddings) are read from the tensors' data, or,
while ``propagate`` runs, from the values of shape arithmetic (see shape_values).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable

import numpy as np

from .errors import UnsupportedOpError
from .ir import STATE_OPS, Op

Shape = tuple[int, ...]
ShapeFn = Callable[[Op], list[Shape]]
_RULES: dict[str, ShapeFn] = {}


def rule(*opcodes: str):
    """Register a shape function for one or more op codes."""
    def register(fn: ShapeFn) -> ShapeFn:
        for code in opcodes:
            _RULES[code] = fn
        return fn
    return register


# Ops whose output shapes are what the model declares: a variable's or a called subgraph's, not a
# function of the op's own inputs (so there is no rule to check them against).
DECLARED_SHAPES = STATE_OPS


def has_rule(opcode: str) -> bool:
    return opcode in _RULES


def infer_output_shapes(op: Op, num_outputs: int = 1) -> list[Shape]:
    """Shapes of ``op``'s outputs from its inputs' shapes, options and constant operands."""
    fn = _RULES.get(op.opcode)
    if fn is None:
        raise UnsupportedOpError(f"{op.describe()}: no shape rule; give the output shape explicitly",
                                 op_index=op.index, opcode=op.opcode)
    shapes = fn(op)
    if len(shapes) == 1 and num_outputs > 1:
        shapes = shapes * num_outputs
    return shapes


# Values of shape arithmetic computed by ``propagate``, by tensor index.
_KNOWN: ContextVar[dict[int, np.ndarray] | None] = ContextVar("shape_values", default=None)


def const_values(op: Op, i: int) -> np.ndarray:
    t = op.input(i)
    known = _KNOWN.get()
    if t is not None and t.data is None and known is not None and t.index in known:
        return known[t.index]
    if t is None or t.data is None:
        raise UnsupportedOpError(f"{op.describe()}: input {i} must be constant to infer shapes",
                                 op_index=op.index, opcode=op.opcode)
    return np.asarray(t.data)


def broadcast(*shapes: Shape) -> Shape:
    return tuple(np.broadcast_shapes(*shapes))


def conv_out(size: int, kernel: int, stride: int, dilation: int, padding: str) -> int:
    effective = (kernel - 1) * dilation + 1
    if padding == "SAME":
        return (size + stride - 1) // stride
    return (size - effective + stride) // stride


ELEMENTWISE_BINARY = ("ADD", "SUB", "MUL", "DIV", "SQUARED_DIFFERENCE", "POW", "MAXIMUM", "MINIMUM",
                      "FLOOR_DIV", "FLOOR_MOD", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL",
                      "NOT_EQUAL", "LOGICAL_AND", "LOGICAL_OR", "PRELU")
ELEMENTWISE_UNARY = ("RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "LEAKY_RELU", "HARD_SWISH", "LOGISTIC",
                     "TANH", "GELU", "ELU", "SOFTMAX", "LOG_SOFTMAX", "EXP", "LOG", "SQRT", "RSQRT", "SQUARE",
                     "ABS", "NEG", "SIN", "COS", "FLOOR", "CEIL", "ROUND", "LOGICAL_NOT", "CAST", "DEQUANTIZE",
                     "QUANTIZE", "L2_NORMALIZATION", "CUMSUM", "SIGN", "ZEROS_LIKE", "LOCAL_RESPONSE_NORMALIZATION",
                     "COMPLEX_ABS", "REAL", "IMAG")


@rule(*ELEMENTWISE_BINARY)
def _binary(op: Op) -> list[Shape]:
    return [broadcast(op.inputs[0].shape, op.inputs[1].shape)]


@rule(*ELEMENTWISE_UNARY)
def _unary(op: Op) -> list[Shape]:
    return [op.inputs[0].shape]


@rule("ADD_N")
def _add_n(op: Op) -> list[Shape]:
    return [op.inputs[0].shape]


@rule("SELECT", "SELECT_V2")
def _select(op: Op) -> list[Shape]:
    if op.opcode == "SELECT":  # v1: same-shaped values; the condition matches them or picks rows
        return [op.inputs[1].shape]
    return [broadcast(*(t.shape for t in op.inputs))]


@rule("DENSIFY")
def _densify(op: Op) -> list[Shape]:
    return [op.inputs[0].shape]


@rule("CONV_2D", "DEPTHWISE_CONV_2D")
def _conv(op: Op) -> list[Shape]:
    n, h, w, _ = op.inputs[0].shape
    f = op.inputs[1].shape
    o = op.options
    kh, kw = f[1], f[2]
    out_c = f[0] if op.opcode == "CONV_2D" else f[3]
    return [(n, conv_out(h, kh, o.get("stride_h", 1), o.get("dilation_h_factor", 1), o.get("padding", "SAME")),
             conv_out(w, kw, o.get("stride_w", 1), o.get("dilation_w_factor", 1), o.get("padding", "SAME")),
             out_c)]


@rule("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D")
def _pool(op: Op) -> list[Shape]:
    n, h, w, c = op.inputs[0].shape
    o = op.options
    return [(n, conv_out(h, o["filter_height"], o["stride_h"], 1, o.get("padding", "SAME")),
             conv_out(w, o["filter_width"], o["stride_w"], 1, o.get("padding", "SAME")), c)]


@rule("TRANSPOSE_CONV")
def _transpose_conv(op: Op) -> list[Shape]:
    return [tuple(int(v) for v in const_values(op, 0))]


@rule("FULLY_CONNECTED")
def _fully_connected(op: Op) -> list[Shape]:
    x, w = op.inputs[0].shape, op.inputs[1].shape
    units = w[0]
    if op.options.get("keep_num_dims"):
        return [x[:-1] + (units,)]
    batch = int(np.prod(x, dtype=np.int64)) // w[1]
    return [(batch, units)]


@rule("BATCH_MATMUL")
def _batch_matmul(op: Op) -> list[Shape]:
    a, b = op.inputs[0].shape, op.inputs[1].shape
    m = a[-1] if op.options.get("adj_x") else a[-2]
    n = b[-2] if op.options.get("adj_y") else b[-1]
    return [broadcast(a[:-2], b[:-2]) + (m, n)]


@rule("RESHAPE")
def _reshape(op: Op) -> list[Shape]:
    total = op.inputs[0].size
    shape_input = op.input(1)
    if shape_input is not None and (shape_input.data is not None or not op.options.get("new_shape")):
        target = [int(v) for v in const_values(op, 1).ravel()]  # a shape computed at run time raises
    else:
        target = list(op.options.get("new_shape", []))
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1], dtype=np.int64)) or 1
        target[target.index(-1)] = total // known
    return [tuple(target)]


@rule("SQUEEZE")
def _squeeze(op: Op) -> list[Shape]:
    shape = op.inputs[0].shape
    dims = [d % len(shape) for d in op.options.get("squeeze_dims", [])]
    return [tuple(d for i, d in enumerate(shape) if not ((i in dims) if dims else d == 1))]


@rule("EXPAND_DIMS")
def _expand_dims(op: Op) -> list[Shape]:
    shape = list(op.inputs[0].shape)
    axis = int(const_values(op, 1).ravel()[0])
    if axis < 0:
        axis += len(shape) + 1
    shape.insert(axis, 1)
    return [tuple(shape)]


@rule("CONCATENATION")
def _concat(op: Op) -> list[Shape]:
    shape = list(op.inputs[0].shape)
    axis = op.options.get("axis", 0) % len(shape)
    shape[axis] = sum(t.shape[axis] for t in op.inputs)
    return [tuple(shape)]


@rule("RFFT2D")
def _rfft2d(op: Op) -> list[Shape]:
    """The two innermost dimensions become fft_length's rows and half its columns, plus one."""
    rows, columns = (int(v) for v in const_values(op, 1).ravel())
    return [op.inputs[0].shape[:-2] + (rows, columns // 2 + 1)]


@rule("TRANSPOSE")
def _transpose(op: Op) -> list[Shape]:
    perm = const_values(op, 1).ravel()
    return [tuple(op.inputs[0].shape[int(p)] for p in perm)]


@rule("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "REDUCE_ANY", "REDUCE_ALL")
def _reduce(op: Op) -> list[Shape]:
    shape = op.inputs[0].shape
    axes = {int(a) % len(shape) for a in const_values(op, 1).ravel()}
    if op.options.get("keep_dims"):
        return [tuple(1 if i in axes else d for i, d in enumerate(shape))]
    return [tuple(d for i, d in enumerate(shape) if i not in axes)]


@rule("ARG_MAX", "ARG_MIN")
def _arg(op: Op) -> list[Shape]:
    shape = op.inputs[0].shape
    axis = int(const_values(op, 1).ravel()[0]) % len(shape)
    return [tuple(d for i, d in enumerate(shape) if i != axis)]


@rule("PAD", "PADV2", "MIRROR_PAD")
def _pad(op: Op) -> list[Shape]:
    pads = const_values(op, 1).reshape(-1, 2)
    return [tuple(int(d + p[0] + p[1]) for d, p in zip(op.inputs[0].shape, pads))]


@rule("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")
def _resize(op: Op) -> list[Shape]:
    n, _, _, c = op.inputs[0].shape
    h, w = (int(v) for v in const_values(op, 1).ravel())
    return [(n, h, w, c)]


@rule("DEPTH_TO_SPACE")
def _depth_to_space(op: Op) -> list[Shape]:
    n, h, w, c = op.inputs[0].shape
    b = op.options["block_size"]
    return [(n, h * b, w * b, c // (b * b))]


@rule("SPACE_TO_DEPTH")
def _space_to_depth(op: Op) -> list[Shape]:
    n, h, w, c = op.inputs[0].shape
    b = op.options["block_size"]
    return [(n, h // b, w // b, c * b * b)]


@rule("SLICE")
def _slice(op: Op) -> list[Shape]:
    begin = const_values(op, 1).ravel()
    size = const_values(op, 2).ravel()
    shape = op.inputs[0].shape
    return [tuple(int(shape[i] - begin[i]) if size[i] == -1 else int(size[i]) for i in range(len(shape)))]


@rule("STRIDED_SLICE")
def _strided_slice(op: Op) -> list[Shape]:
    from .strided import strided_slice_plan  # shared with the kernels
    return [strided_slice_plan(op.inputs[0].shape, const_values(op, 1), const_values(op, 2),
                               const_values(op, 3), op.options).output_shape]


@rule("GATHER")
def _gather(op: Op) -> list[Shape]:
    shape = op.inputs[0].shape
    axis = op.options.get("axis", 0) % len(shape)
    batch = op.options.get("batch_dims", 0)
    idx = op.inputs[1].shape
    return [shape[:axis] + idx[batch:] + shape[axis + 1:]]


@rule("ONE_HOT")
def _one_hot(op: Op) -> list[Shape]:
    shape = op.inputs[0].shape
    axis = op.options.get("axis", -1) % (len(shape) + 1)
    return [shape[:axis] + (int(const_values(op, 1).ravel()[0]),) + shape[axis:]]


@rule("GATHER_ND")
def _gather_nd(op: Op) -> list[Shape]:
    params, idx = op.inputs[0].shape, op.inputs[1].shape
    return [idx[:-1] + params[idx[-1]:]]


@rule("TILE")
def _tile(op: Op) -> list[Shape]:
    reps = const_values(op, 1).ravel()
    return [tuple(int(d * r) for d, r in zip(op.inputs[0].shape, reps))]


@rule("BROADCAST_TO")
def _broadcast_to(op: Op) -> list[Shape]:
    return [broadcast(op.inputs[0].shape, tuple(int(v) for v in const_values(op, 1).ravel()))]


@rule("FILL")
def _fill(op: Op) -> list[Shape]:
    return [tuple(int(v) for v in const_values(op, 0).ravel())]


@rule("SHAPE")
def _shape(op: Op) -> list[Shape]:
    return [(len(op.inputs[0].shape),)]


@rule("PACK")
def _pack(op: Op) -> list[Shape]:
    shape = list(op.inputs[0].shape)
    axis = op.options.get("axis", 0)
    if axis < 0:
        axis += len(shape) + 1
    shape.insert(axis, len(op.inputs))
    return [tuple(shape)]


@rule("UNPACK")
def _unpack(op: Op) -> list[Shape]:
    shape = list(op.inputs[0].shape)
    axis = op.options.get("axis", 0) % len(shape)
    count = shape.pop(axis)
    return [tuple(shape)] * count


@rule("SPLIT")
def _split(op: Op) -> list[Shape]:
    shape = list(op.inputs[1].shape)
    axis = int(const_values(op, 0).ravel()[0]) % len(shape)
    n = op.options["num_splits"]
    shape[axis] //= n
    return [tuple(shape)] * n


@rule("SPLIT_V")
def _split_v(op: Op) -> list[Shape]:
    shape = list(op.inputs[0].shape)
    sizes = [int(s) for s in const_values(op, 1).ravel()]
    axis = int(const_values(op, 2).ravel()[0]) % len(shape)
    if -1 in sizes:
        sizes[sizes.index(-1)] = shape[axis] - (sum(sizes) + 1)
    out = []
    for s in sizes:
        part = list(shape)
        part[axis] = s
        out.append(tuple(part))
    return out


def transpose_conv_bias_geometry(in_shape: Shape, weight_shape: Shape, custom_options: bytes | None):
    """MediaPipe's Convolution2DTransposeBias: (output shape, (top, left) padding, (stride_h, stride_w)).

    Its custom options are a packed C struct of three int32: padding (1 SAME,
    2 VALID), stride_w, stride_h.  SAME trims the overlap a forward SAME
    convolution would have added, half of it before.
    """
    import struct

    padding, stride_w, stride_h = struct.unpack_from("<iii", custom_options or bytes(12))
    n, ih, iw, _ = in_shape
    o, kh, kw, _ = weight_shape
    trim_h = trim_w = 0
    if padding == 1:
        trim_h = max(0, kh - (ih - 1) % stride_h - 1)
        trim_w = max(0, kw - (iw - 1) % stride_w - 1)
    out = (n, stride_h * (ih - 1) + kh - trim_h, stride_w * (iw - 1) + kw - trim_w, o)
    return out, (trim_h // 2, trim_w // 2), (stride_h, stride_w)


@rule("Convolution2DTransposeBias")
def _transpose_conv_bias(op: Op) -> list[Shape]:
    return [transpose_conv_bias_geometry(op.inputs[0].shape, op.inputs[1].shape, op.custom_options)[0]]


# TfLiteFusedActivation, by value.
FUSED_ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6", "TANH", "SIGN_BIT", "SIGMOID")


def mediapipe_pool_params(custom_options: bytes | None) -> tuple[int, int, int, int, int, str]:
    """MediaPipe's MaxPoolingWithArgmax2D and MaxUnpooling2D options: the raw C struct TfLitePoolParams, of
    which the first six int32 count: (padding 1 SAME 2 VALID, stride_w, stride_h, filter_w, filter_h,
    activation), the activation given by name.  Its kernels clamp as TFLite's CalculateActivationRange
    does: the RELU family (``passes.CLAMPS``), the other activations not at all."""
    import struct

    raw = custom_options or b""
    if len(raw) < 24:
        raise ValueError(f"custom options hold {len(raw)} bytes, not the 24 of (padding, stride_w, stride_h, "
                         "filter_w, filter_h, activation)")
    *params, activation = struct.unpack_from("<6i", raw)
    if not 0 <= activation < len(FUSED_ACTIVATIONS):
        raise ValueError(f"activation {activation} is not a TfLiteFusedActivation")
    return (*params, FUSED_ACTIVATIONS[activation])


def _centred_padding(stride: int, in_size: int, kernel: int, out_size: int) -> int:
    """TFLite's ComputePadding (dilation 1): half the overlap, never negative."""
    return max(((out_size - 1) * stride + kernel - in_size) // 2, 0)


def pool_argmax_geometry(in_shape: Shape, custom_options: bytes | None):
    """MaxPoolingWithArgmax2D: (output shape, (top, left) padding) as TFLite's MAX_POOL_2D sizes it."""
    padding, stride_w, stride_h, filter_w, filter_h, _ = mediapipe_pool_params(custom_options)
    n, h, w, c = in_shape
    same = padding == 1
    oh = -(-h // stride_h) if same else (h - filter_h + stride_h) // stride_h
    ow = -(-w // stride_w) if same else (w - filter_w + stride_w) // stride_w
    return (n, oh, ow, c), (_centred_padding(stride_h, h, filter_h, oh), _centred_padding(stride_w, w, filter_w, ow))


def max_unpooling_geometry(in_shape: Shape, custom_options: bytes | None):
    """MaxUnpooling2D: (output shape, (top, left) padding); the output is the input times the filter size
    (not the stride), as MediaPipe sizes it."""
    _, stride_w, stride_h, filter_w, filter_h, _ = mediapipe_pool_params(custom_options)
    n, h, w, c = in_shape
    oh, ow = h * filter_h, w * filter_w
    return (n, oh, ow, c), (_centred_padding(stride_h, oh, filter_h, h), _centred_padding(stride_w, ow, filter_w, w))


@rule("MaxPoolingWithArgmax2D")
def _pool_argmax(op: Op) -> list[Shape]:
    shape = pool_argmax_geometry(op.inputs[0].shape, op.custom_options)[0]
    return [shape, shape]


@rule("MaxUnpooling2D")
def _max_unpooling(op: Op) -> list[Shape]:
    return [max_unpooling_geometry(op.inputs[0].shape, op.custom_options)[0]]


@rule("LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM")
def _lstm(op: Op) -> list[Shape]:
    """The input's shape with its feature dimension replaced by the output state's; the BASIC kernel's
    four outputs (activation, state, the concatenated input and the gates' pre-activations)."""
    if op.options.get("kernel_type") == "BASIC":
        *batch, depth = op.inputs[0].shape
        units = op.inputs[1].shape[-1]
        return [(*batch, units), (*batch, units), (*batch, depth + units), (*batch, 4 * units)]
    n_output = op.inputs[18].shape[-1]
    return [op.inputs[0].shape[:-1] + (n_output,)]


def detection_postprocess_options(custom_options: bytes | None) -> dict:
    """TFLite_Detection_PostProcess's flexbuffer options, with TFLite's defaults filled in."""
    from flatbuffers import flexbuffers

    options = dict(flexbuffers.Loads(custom_options)) if custom_options else {}
    options.setdefault("max_classes_per_detection", 1)
    options.setdefault("detections_per_class", 100)
    options.setdefault("use_regular_nms", False)
    return options


@rule("TFLite_Detection_PostProcess")
def _detection_postprocess(op: Op) -> list[Shape]:
    """Boxes (1, D, 4), classes (1, D), scores (1, D) and the count (1,), D = detections x classes each."""
    o = detection_postprocess_options(op.custom_options)
    count = int(o["max_detections"]) * int(o["max_classes_per_detection"])
    return [(1, count, 4), (1, count), (1, count), (1,)]


def settle(op: Op) -> None:
    """Give ``op``'s outputs the shapes its rule derives from its inputs, whatever the file declares
    (as LiteRT's Prepare resizes them: converters leave placeholders such as [] or [1] on
    intermediates), and record the values of its shape arithmetic.  Call inside ``shape_values``.
    Raises UnsupportedOpError where the op has no rule or its shapes depend on run-time values."""
    shapes = infer_output_shapes(op, len(op.outputs))
    if len(shapes) != len(op.outputs):
        raise ValueError(f"has {len(op.outputs)} outputs, its operands give {len(shapes)}")
    for out, shape in zip(op.outputs, shapes):
        out.shape = tuple(int(d) for d in shape)
    _evaluate_shape_arithmetic(op, _KNOWN.get())


def propagate(graph, strict: bool = True) -> None:
    """Recompute every op's output shapes from the graph inputs' (after an input was resized).

    Shapes computed in the graph (SHAPE of a tensor, sliced, packed, multiplied) are
    evaluated on the way, so FILL, BROADCAST_TO, RESHAPE and the like fed by them get
    their shapes too.  ``strict=False`` keeps the declared shapes of ops without a rule
    instead of refusing.
    """
    with shape_values():
        for op in graph.topological_order():
            if not has_rule(op.opcode):
                if not strict:
                    continue
                raise UnsupportedOpError(f"cannot change shapes: {op.describe()} has no shape rule",
                                         op_index=op.index, opcode=op.opcode)
            try:
                settle(op)
            except UnsupportedOpError:
                if strict:
                    raise
                # depends on values computed at run time: the declared shapes stand


@contextmanager
def shape_values():
    """Collect the values of shape arithmetic (a dict by tensor index) for the rules run inside."""
    known = _KNOWN.get()
    if known is not None:
        yield known
        return
    token = _KNOWN.set({})
    try:
        yield _KNOWN.get()
    finally:
        _KNOWN.reset(token)


# Integer ops that compute shapes from shapes, as numpy computes them on small int vectors;
# each takes (op, input values) and gives its one output's value.
_SHAPE_ARITHMETIC: dict[str, Callable[[Op, list[np.ndarray]], np.ndarray]] = {
    "SHAPE": lambda op, v: np.asarray(op.inputs[0].shape),
    "CAST": lambda op, v: v[0],
    "PACK": lambda op, v: np.stack(v, axis=op.options.get("axis", 0)),
    "CONCATENATION": lambda op, v: np.concatenate([np.atleast_1d(x) for x in v], axis=op.options.get("axis", 0)),
    "RESHAPE": lambda op, v: v[0].reshape(op.outputs[0].shape),
    "SQUEEZE": lambda op, v: v[0].reshape(op.outputs[0].shape),
    "EXPAND_DIMS": lambda op, v: v[0].reshape(op.outputs[0].shape),
    "GATHER": lambda op, v: np.take(v[0], v[1], axis=op.options.get("axis", 0)),
    "SLICE": lambda op, v: v[0][tuple(slice(int(b), None if int(n) == -1 else int(b) + int(n))
                                      for b, n in zip(v[1].ravel(), v[2].ravel()))],
    "STRIDED_SLICE": lambda op, v: _strided(op, v),
    "ADD": lambda op, v: v[0] + v[1], "SUB": lambda op, v: v[0] - v[1], "MUL": lambda op, v: v[0] * v[1],
    "FLOOR_DIV": lambda op, v: v[0] // v[1], "MAXIMUM": lambda op, v: np.maximum(v[0], v[1]),
    "MINIMUM": lambda op, v: np.minimum(v[0], v[1]),
    "REDUCE_PROD": lambda op, v: np.prod(v[0], axis=tuple(int(a) for a in v[1].ravel()),
                                         keepdims=bool(op.options.get("keep_dims"))),
    "FILL": lambda op, v: np.full(_small(int(d) for d in v[0].ravel()), v[1]),
    "RANGE": lambda op, v: _range(*(x.item() for x in v)),
}
_SHAPE_VALUE_LIMIT = 64  # elements: shape vectors, never activations


def static_value(t) -> np.ndarray | None:
    """The value of integer tensor ``t`` where shape arithmetic computes it from the static shapes the graph
    has now and from constants (``static_op``), else None (None too where computing it fails: the model's
    error, which the kernel reports)."""
    if t is None or (t.data is None and (t.producer is None or not static_op(t.producer))):
        return None
    return _computed(t, {})


def _computed(t, values: dict[int, np.ndarray | None]) -> np.ndarray | None:
    """The value of ``t``, a constant or the output of a static op, each tensor's computed once (``values``)."""
    if t.data is not None:
        return np.asarray(t.data) if t.quantization is None else None
    if t.index not in values:
        values[t.index] = _arithmetic(t.producer, lambda x: _computed(x, values))
    return values[t.index]


# shape arithmetic more ops deep than this is not computed at compile time (a crafted chain of thousands)
STATIC_DEPTH = 64


def static_op(op: Op) -> bool:
    """Whether ``op`` is shape arithmetic on static shapes and constants: a SHAPE of a tensor whose shape is
    known, then integer ops of _SHAPE_ARITHMETIC reading only such values and constants, at most STATIC_DEPTH
    deep (a converter's SHAPE -> STRIDED_SLICE -> PACK giving a RESHAPE its shape, where the source graph read
    the batch size at run time).  The numpy engine and the GPU lowerings compute such ops once a compile, for
    the shapes the graph has then (a resized input makes a new compile); LiteRT's interpreter runs them."""
    return _static_depth(op, {}, 1) <= STATIC_DEPTH


def _static_depth(op: Op, depths: dict[int, int], level: int) -> int:
    """How many ops deep ``op``'s shape arithmetic reaches (SHAPE: 1), or more than STATIC_DEPTH where it is not
    static or sits ``level`` > STATIC_DEPTH below the op asked about; each op's found once (``depths``, by id),
    so a graph reading one value twice at every step (a crafted MAXIMUM(s, s) chain: 2^n paths) costs one visit
    an op, and the search never goes deeper than STATIC_DEPTH."""
    found = depths.get(id(op))
    if found is not None:
        return found
    if level > STATIC_DEPTH:
        return STATIC_DEPTH + 1
    depths[id(op)] = deepest = STATIC_DEPTH + 1  # until found: a cycle or a chain too deep is not static
    if _shape_vector(op) is None or min(op.outputs[0].shape, default=0) < 0:
        return deepest
    if op.opcode == "SHAPE":
        x = op.input(0)
        deepest = 1 if x is not None and min(x.shape, default=0) >= 0 else deepest
    else:
        reads = [0 if t.data is not None and t.quantization is None else
                 _static_depth(t.producer, depths, level + 1) if t.data is None and t.producer is not None
                 else STATIC_DEPTH + 1
                 for t in op.inputs if t is not None]
        deepest = max(reads, default=0) + 1
    depths[id(op)] = min(deepest, STATIC_DEPTH + 1)
    return depths[id(op)]


def _arithmetic(op: Op, value_of: Callable[[object], np.ndarray | None]) -> np.ndarray | None:
    """The output of ``op`` when it is integer shape arithmetic whose operands ``value_of`` knows, else None."""
    out = _shape_vector(op)
    if out is None:
        return None
    values = [] if op.opcode == "SHAPE" else [value_of(t) for t in op.inputs if t is not None]
    if any(v is None for v in values):
        return None
    try:
        return np.asarray(_SHAPE_ARITHMETIC[op.opcode](op, values)).astype(out.dtype.numpy).reshape(out.shape)
    except (ValueError, IndexError, TypeError, ZeroDivisionError, OverflowError):
        return None  # operands that do not fit: the kernel's checks report it at run time


def _shape_vector(op: Op):
    """``op``'s one output where ``op`` is of _SHAPE_ARITHMETIC and it is a small unquantized integer vector."""
    out = op.outputs[0] if len(op.outputs) == 1 else None
    if op.custom or op.opcode not in _SHAPE_ARITHMETIC or out is None or out.dtype.numpy is None \
            or out.dtype.numpy.kind not in "iu" or out.quantization is not None or out.size > _SHAPE_VALUE_LIMIT:
        return None
    return out


def _small(dims) -> tuple[int, ...]:
    """``dims`` of a value shape arithmetic may compute: non-negative, at most _SHAPE_VALUE_LIMIT elements."""
    dims = tuple(dims)
    if min(dims, default=0) < 0 or int(np.prod(dims, dtype=np.float64)) > _SHAPE_VALUE_LIMIT:
        _too_large()
    return dims


def _range(start, limit, delta) -> np.ndarray:
    if not delta or abs(limit - start) / abs(delta) > _SHAPE_VALUE_LIMIT:
        _too_large()
    return np.arange(start, limit, delta)


def _too_large():
    raise ValueError("not a shape vector")


def _strided(op: Op, v: list[np.ndarray]) -> np.ndarray:
    from .strided import strided_slice_plan
    return strided_slice_plan(v[0].shape, v[1], v[2], v[3], op.options).apply(v[0])


def _evaluate_shape_arithmetic(op: Op, known: dict[int, np.ndarray]) -> None:
    """Record the value of ``op``'s output when it is integer shape arithmetic on known values."""
    value = _arithmetic(op, lambda t: (np.asarray(t.data) if t.quantization is None else None) if t.data is not None
                        else known.get(t.index))
    if value is not None:
        known[op.outputs[0].index] = value


def with_batch(graph, batch: int) -> None:
    """Set the leading dimension of every graph input to ``batch`` and propagate."""
    for t in graph.inputs:
        if not t.shape:
            raise UnsupportedOpError(f"input {t.name!r} is a scalar; it has no batch dimension")
        t.shape = (batch,) + tuple(t.shape[1:])
    propagate(graph)


@rule("SPACE_TO_BATCH_ND")
def _space_to_batch(op: Op) -> list[Shape]:
    shape = op.inputs[0].shape
    block = [int(b) for b in const_values(op, 1).ravel()]
    pads = const_values(op, 2).reshape(-1, 2)
    spatial = [(shape[1 + i] + int(p[0]) + int(p[1])) // b for i, (b, p) in enumerate(zip(block, pads))]
    return [(shape[0] * int(np.prod(block)),) + tuple(spatial) + tuple(shape[1 + len(block):])]


@rule("BATCH_TO_SPACE_ND")
def _batch_to_space(op: Op) -> list[Shape]:
    shape = op.inputs[0].shape
    block = [int(b) for b in const_values(op, 1).ravel()]
    crops = const_values(op, 2).reshape(-1, 2)
    spatial = [shape[1 + i] * b - int(c[0]) - int(c[1]) for i, (b, c) in enumerate(zip(block, crops))]
    return [(shape[0] // int(np.prod(block)),) + tuple(spatial) + tuple(shape[1 + len(block):])]
