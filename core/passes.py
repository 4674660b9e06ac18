"""Graph passes shared by every backend, run before placement: constants computed at compile time, and
the ops that run inside a neighbour's kernel, found as *groups*.

A group is an anchor op and the ops that travel with it (ONNX Runtime's fusable subgraphs, ExecuTorch's
op with the ops that must go along): the DEQUANTIZE and DENSIFY ops that make its constant operands, the
PAD its convolution reads past the borders, the gate MUL or depthwise convolution a 1x1 convolution
applies while reading its input, the first of two one-pixel 1x1 convolutions run as one kernel, the
reshapes a concatenation reads through, the activations and elementwise ops its kernel applies before
storing, the residual ADD a convolution applies to what it stores (with the clamp or PReLU after it, as that
ADD's own activation), and the product of an 8- or 16-bit lookup
table op's result with its own input (a swish: one table of the input's 256 or 65536 values).  Each backend declares the kinds of fusion its kernels do (``Backend.fusions``, kinds from
``FUSIONS``); ``find_groups`` looks only for those.  The planner places a group as a unit and costs it
as one kernel: its folded ops cost nothing.

The passes do not rewrite the graph: the backend that runs a group does the fusion (the CPU numpy engine
from these groups; LiteRT folds constants itself).  A backend whose lowering plans its own kernels gives
the planner those instead (``Backend.placement_groups``: the GPU kit's epilogues fuse more than these).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Iterable, Sequence

import numpy as np

from .ir import Op, Sparsity, Tensor

FUSIONS = frozenset({"constant", "pad", "quantized_pad", "clamp", "activation", "epilogue", "gate",
                     "depthwise_pointwise", "chain", "reshape", "residual", "table"})

# Activations that clamp: (low, high); what "clamp" fuses into its producer, and with PRELU what "activation" does.
CLAMPS = {"RELU": (0.0, np.inf), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0), "RELU_0_TO_1": (0.0, 1.0)}
# Kernels applying a clamp or a per-channel PReLU to their results ("activation").
ACTIVATION_HOSTS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD", "SUB", "MUL"})
# Kernels applying elementwise ops to their results before storing them ("epilogue").
EPILOGUE_HOSTS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"})
EPILOGUE_UNARY = frozenset(CLAMPS) | {"LOGISTIC", "TANH", "HARD_SWISH", "ELU", "LEAKY_RELU", "GELU"}
EPILOGUE_BINARY = frozenset({"ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM"})
CONVOLUTIONS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D"})
# Kernels adding a residual to their results ("residual"): int8 ones after requantizing, float ones
# after their activation.
RESIDUAL_HOSTS = frozenset({"CONV_2D"})
# Lookup-table kernels of an 8- or 16-bit input whose product with that same input ("table": a swish, x *
# LOGISTIC(x)) is one table too, of the same 256 or 65536 input values.
TABLE_HOSTS = frozenset({"LOGISTIC", "TANH"})


# -- constants ---------------------------------------------------------------------

def densify(values: np.ndarray, shape: tuple[int, ...], sparsity: Sparsity) -> np.ndarray:
    """Expand TFLite's sparse storage (per-level DENSE / CSR, optional blocks) into a dense array.

    The traversal dims are walked level by level, keeping for every stored
    element its position at the current level; CSR levels expand a parent
    position into the child range its segments name.
    """
    rank = len(shape)
    levels = sparsity.dim_metadata
    block_sizes = {d: levels[rank + k].dense_size for k, d in enumerate(sparsity.block_map)}
    positions = np.zeros(1, np.int64)
    coords: dict[int, np.ndarray] = {}
    for level, meta in zip(sparsity.traversal_order, levels):
        if meta.format == "DENSE":
            n = meta.dense_size
            within = np.tile(np.arange(n, dtype=np.int64), positions.size)
            parents = np.repeat(np.arange(positions.size), n)
            positions = positions[parents] * n + within
        else:
            seg = meta.array_segments.astype(np.int64)
            counts = seg[positions + 1] - seg[positions]
            parents = np.repeat(np.arange(positions.size), counts)
            first = np.repeat(np.cumsum(counts) - counts, counts)
            positions = seg[positions][parents] + np.arange(parents.size) - first
            within = meta.array_indices.astype(np.int64)[positions]
        coords = {k: v[parents] for k, v in coords.items()}
        coords[level] = within
    dense = np.zeros(shape, values.dtype)
    index = []
    for d in range(rank):
        if d in block_sizes:
            k = rank + sparsity.block_map.index(d)
            index.append(coords[d] * block_sizes[d] + coords[k])
        else:
            index.append(coords[d])
    dense[tuple(index)] = values[positions]
    return dense


def dequantize_array(values: np.ndarray, tensor: Tensor) -> np.ndarray:
    """float32 values of a float16 or affinely quantized integer array (per tensor or per channel)."""
    if values.dtype.kind == "f" or tensor.quantization is None:
        return values.astype(np.float32)
    q = tensor.quantization
    shape = [1] * values.ndim
    if q.per_channel:
        shape[q.axis] = -1
    scale = q.scale.astype(np.float32).reshape(shape)
    zero = q.zero_point.astype(np.float32).reshape(shape)
    return ((values.astype(np.float32) - zero) * scale).astype(np.float32)


def folds_constant(op: Op) -> bool:
    """A DEQUANTIZE or DENSIFY whose input is known at compile time: computed once, never run."""
    return (op.opcode in ("DEQUANTIZE", "DENSIFY") and not op.custom and len(op.inputs) == 1
            and len(op.outputs) == 1 and known_at_compile_time(op.inputs[0]))


def known_at_compile_time(t: Tensor | None) -> bool:
    """Whether ``constant(t)`` has a value: cheap, computes nothing."""
    if t is None:
        return False
    return t.is_constant or (t.producer is not None and folds_constant(t.producer))


def constant(t: Tensor | None) -> np.ndarray | None:
    """The value of ``t`` when known at compile time: a constant (dense, as DENSIFY would make it), or
    DEQUANTIZE/DENSIFY of one; in ``t``'s own type (quantized integers stay integers)."""
    if not known_at_compile_time(t):
        return None
    if t.is_constant:
        data = np.asarray(t.data)
        return densify(data, t.shape, t.sparsity) if t.sparsity is not None else data
    source = t.producer.inputs[0]
    value = constant(source)
    return dequantize_array(value, source) if t.producer.opcode == "DEQUANTIZE" else value


# -- groups ------------------------------------------------------------------------

@dataclass(frozen=True)
class Group:
    """An anchor op and the ops folded into its kernel (``kinds[i]``: which fusion folded ``folded[i]``)."""

    anchor: Op
    folded: tuple[Op, ...]
    kinds: tuple[str, ...]


def find_groups(ops: Sequence[Op], fusions: Collection[str], keep: Collection[int] = ()) -> list[Group]:
    """The groups among ``ops`` (topologically ordered) for a backend doing the fusions ``fusions``, in
    the order of their anchors; an op is in one group at most.  ``keep``: tensors that must stay visible
    (partition outputs), so whatever produces them is never folded."""
    members = {id(op) for op in ops}
    found: dict[int, list[tuple[Op, str]]] = {}  # id(anchor) -> [(anchor, ""), (folded op, kind)...]
    owner: dict[int, int] = {}  # id(op) -> id(its group's anchor)
    tail: dict[int, Op] = {}  # id(anchor) -> the op whose result the group stores

    def take(anchor: Op, op: Op, kind: str) -> None:
        found.setdefault(id(anchor), [(anchor, "")]).append((op, kind))
        owner[id(op)] = owner[id(anchor)] = id(anchor)

    position = {id(op): i for i, op in enumerate(ops)}
    for anchor in ops:
        if id(anchor) in owner:
            continue
        if "constant" in fusions and not folds_constant(anchor):
            for op in constant_chains(anchor, keep):
                if id(op) in members and id(op) not in owner:
                    take(anchor, op, "constant")
        if "reshape" in fusions:
            for op in _reshaped_inputs(anchor, keep):
                if id(op) in members and id(op) not in owner:
                    take(anchor, op, "reshape")
        source = _single_source(anchor, keep)
        if source is not None and id(source) in members:
            # a source already grouped comes with its group when that group stores what ``anchor`` reads
            key = owner.get(id(source), id(source))
            group = found.get(key, [(source, "")])
            kind = _folds_into(group, anchor, fusions) if tail.get(key, source) is source else None
            if kind is not None:
                found.pop(key, None)
                for op, inner in group:
                    take(anchor, op, inner or kind)
        value = anchor

        def ready(t: Tensor, before: int = position[id(anchor)]) -> bool:
            """Whether ``t`` is computed before the anchor runs (or comes from outside ``ops``)."""
            return t.producer is None or position.get(id(t.producer), -1) < before
        while (follower := _follower(value, fusions, keep, ready)) is not None and id(follower[0]) in members \
                and id(follower[0]) not in owner:
            take(anchor, *follower)
            value = follower[0]
            if follower[1] == "residual":  # a clamp or PReLU after a float residual ADD: that ADD's activation
                after = _follower(value, fusions, keep, ready)
                if after is not None and after[1] == "activation" and id(after[0]) in members \
                        and id(after[0]) not in owner:
                    take(anchor, *after)
                    value = after[0]
            if follower[1] in ("activation", "residual", "table"):
                break
        tail[id(anchor)] = value
    return [Group(entries[0][0], tuple(op for op, _ in entries[1:]), tuple(kind for _, kind in entries[1:]))
            for entries in found.values()]


def folded_into(groups: Iterable[Group]) -> dict[int, tuple[int, str]]:
    """Op index -> (anchor index, kind) of every folded op of ``groups``."""
    return {op.index: (g.anchor.index, kind) for g in groups for op, kind in zip(g.folded, g.kinds)}


def is_quantized_op(op: Op) -> bool:
    """True when the op computes on quantized integers (its activations are int8/uint8/int16 + scale)."""
    return any(t is not None and t.quantization is not None and not t.is_constant and t.dtype.numpy is not None
               and t.dtype.numpy.type in (np.int8, np.uint8, np.int16) for t in list(op.inputs) + list(op.outputs))


def _sole_use(t: Tensor, keep: Collection[int]) -> Op | None:
    """The one op reading ``t``, when nothing else (nor the partition's caller) needs it."""
    return t.uses[0] if len(t.uses) == 1 and t.index not in keep and not t.uses[0].custom else None


def constant_chains(op: Op, keep: Collection[int]) -> list[Op]:
    """The DEQUANTIZE/DENSIFY ops making ``op``'s compile-time operands that only ``op`` reads, first first."""
    chain: list[Op] = []
    for t in op.inputs:
        links = []
        while t is not None and t.producer is not None and folds_constant(t.producer) and _sole_use(t, keep) is not None:
            links.append(t.producer)
            t = t.producer.inputs[0]
        chain += reversed(links)
    return chain


def _reshaped_inputs(op: Op, keep: Collection[int]) -> list[Op]:
    """The float reshapes making inputs of concatenation ``op`` that only ``op`` reads: it reads their
    inputs through their views."""
    if op.opcode != "CONCATENATION" or op.custom:
        return []
    return [t.producer for t in op.inputs if t is not None and t.producer is not None
            and t.producer.opcode in ("RESHAPE", "EXPAND_DIMS", "SQUEEZE") and not t.producer.custom
            and not is_quantized_op(t.producer) and _sole_use(t, keep) is op]


def _single_source(op: Op, keep: Collection[int]) -> Op | None:
    """The producer of ``op``'s input 0 when ``op`` is its only reader."""
    t = op.input(0)
    if t is None or t.producer is None or len(t.producer.outputs) != 1 or _sole_use(t, keep) is not op:
        return None
    return t.producer if not t.producer.custom else None


def _folds_into(group: list[tuple[Op, str]], conv: Op, fusions: Collection[str]) -> str | None:
    """Which fusion has convolution ``conv`` do ``group`` (its anchor, then what is folded into it; its last
    op produces the input of ``conv``) as it reads its input."""
    source = group[0][0]
    if conv.custom or conv.opcode not in CONVOLUTIONS:
        return None
    if len(group) == 1 and conv.options.get("padding") == "VALID" and (
            ("pad" in fusions and _zero_pad(source) and _float_kernel(conv))
            or ("quantized_pad" in fusions and _zero_point_pad(source) and is_quantized_op(conv))):
        return "pad"
    if conv.opcode != "CONV_2D" or not _pointwise(conv):
        return None
    if "gate" in fusions and len(group) == 1 and source.opcode == "MUL" and len(source.inputs) == 2 \
            and (source.options.get("fused_activation_function") or "NONE") == "NONE" and gate_operands(source):
        return "gate"
    unary_after = all(op.opcode in EPILOGUE_UNARY or kind == "constant" for op, kind in group[1:])
    if "depthwise_pointwise" in fusions and source.opcode == "DEPTHWISE_CONV_2D" and depthwise_fold_fits(conv) \
            and unary_after:
        return "depthwise_pointwise"
    if "chain" in fusions and chain_link(source) and chain_link(conv) and unary_after:
        return "chain"
    return None


# Two 1x1 convolutions of one pixel per image (the bottleneck of a squeeze-and-excitation block) run as
# one kernel of one work group per image, the first's result kept in local memory: worth a launch while
# each layer's weights stay few enough for one work group to multiply quickly.
CHAIN_MAX_WEIGHTS = 1 << 17


def chain_link(conv: Op) -> bool:
    """Whether ``conv`` can be a layer of a chain: a float 1x1 convolution of one pixel per image with at
    most CHAIN_MAX_WEIGHTS weights."""
    x = conv.input(0)
    return (conv.opcode == "CONV_2D" and not conv.custom and _pointwise(conv) and x is not None
            and len(x.shape) == 4 and tuple(x.shape[1:3]) == (1, 1) and conv.inputs[1].size <= CHAIN_MAX_WEIGHTS)


# A depthwise convolution computed inside the 1x1 convolution reading it is worth it only over a short
# reduction: each work group recomputes it for every input channel, one after another (on the H200 a
# 7x7x1152 pair took 238 us fused against ~30 us as two kernels; at 64 channels, 14 us fused).
DEPTHWISE_FOLD_MAX_CHANNELS = 128


def depthwise_fold_fits(conv: Op) -> bool:
    """Whether 1x1 convolution ``conv`` reads few enough channels to compute its depthwise source itself."""
    x = conv.inputs[0]
    return x is not None and len(x.shape) == 4 and x.shape[3] <= DEPTHWISE_FOLD_MAX_CHANNELS


def _pads_rows_and_columns(op: Op, opcodes: tuple[str, ...]) -> bool:
    """Whether ``op`` (one of ``opcodes``) pads the rows and columns of a 4-d tensor only, by constant amounts."""
    if op.opcode not in opcodes or len(op.outputs) != 1 or len(op.outputs[0].shape) != 4:
        return False
    pads = constant(op.input(1))
    return pads is not None and pads.shape == (4, 2) and not pads[0].any() and not pads[3].any() and not (pads < 0).any()


def _zero_pad(op: Op) -> bool:
    """A PAD adding zeros around the rows and columns only (a convolution's own kind of padding)."""
    if not _pads_rows_and_columns(op, ("PAD", "PADV2")):
        return False
    fill = op.input(2)
    fill_value = constant(fill)
    return fill is None or (fill_value is not None and fill_value.size == 1 and float(fill_value.ravel()[0]) == 0.0
                            and fill.quantization is None)


def _zero_point_pad(op: Op) -> bool:
    """A quantized PAD of the rows and columns only, with its input's quantization and filled with its zero
    point (PAD's own fill): the real value 0, which a quantized convolution's implicit padding contributes
    too (each tap is taken less the input's zero point)."""
    if not _pads_rows_and_columns(op, ("PAD",)) or not is_quantized_op(op):
        return False
    x, out = op.inputs[0], op.outputs[0]
    q, r = x.quantization, out.quantization
    return (x.dtype == out.dtype and q is not None and r is not None and np.array_equal(q.scale, r.scale)
            and np.array_equal(q.zero_point, r.zero_point))


def _float_kernel(op: Op) -> bool:
    """A float32 kernel: float activations and float (or dequantized) weights."""
    return (not is_quantized_op(op) and op.inputs[0].dtype.numpy == np.float32 and op.outputs[0].dtype.numpy == np.float32
            and len(op.inputs) > 1 and op.inputs[1] is not None and op.inputs[1].dtype.numpy == np.float32)


def _pointwise(op: Op) -> bool:
    """A 1x1 convolution with stride 1 and constant weights: a matrix product over the pixels."""
    weights = op.input(1)
    return (weights is not None and known_at_compile_time(weights) and len(weights.shape) == 4
            and tuple(weights.shape[1:3]) == (1, 1) and op.options.get("stride_h", 1) == op.options.get("stride_w", 1) == 1)


def gate_operands(op: Op) -> tuple[Tensor, Tensor] | None:
    """(image, gate) of a MUL whose gate has one value per image and channel, as a squeeze-and-excitation
    block gates its input; else None."""
    for image, gate in (op.inputs, op.inputs[::-1]):
        if image is None or gate is None or len(image.shape) != 4 or len(gate.shape) > 4 \
                or tuple(image.shape) != tuple(op.outputs[0].shape):
            continue
        n, _, _, c = image.shape
        gate_nhwc = (1,) * (4 - len(gate.shape)) + tuple(gate.shape)
        if gate_nhwc[1:] == (1, 1, c) and gate_nhwc[0] in (1, n):
            return image, gate
    return None


def _follower(op: Op, fusions: Collection[str], keep: Collection[int],
              ready: Callable[[Tensor], bool]) -> tuple[Op, str] | None:
    """The op applied to ``op``'s result inside ``op``'s kernel, with the fusion that does it (``ready``:
    whether a tensor is computed before ``op``'s group runs)."""
    if op.custom or len(op.outputs) != 1:
        return None
    value = op.outputs[0]
    follower = _sole_use(value, keep)
    if follower is None or follower.inputs[0] is not value and follower.opcode not in EPILOGUE_BINARY:
        return None
    out = follower.outputs[0] if len(follower.outputs) == 1 else None
    if "residual" in fusions and _residual(op, follower, ready):
        return follower, "residual"
    if "table" in fusions and _table_product(op, follower):
        return follower, "table"
    if out is None or out.shape != value.shape or out.dtype != value.dtype or value.dtype.numpy != np.float32:
        return None
    if (("activation" in fusions or "clamp" in fusions) and op.opcode in ACTIVATION_HOSTS and not is_quantized_op(op)
            and (op.options.get("fused_activation_function") or "NONE") == "NONE" and follower.inputs[0] is value
            and ((follower.opcode in CLAMPS and len(follower.inputs) == 1)
                 or ("activation" in fusions and follower.opcode == "PRELU"
                     and channel_slope(follower.input(1), value) is not None))):
        return follower, "activation"
    if "epilogue" not in fusions or not (op.opcode in EPILOGUE_HOSTS or op.opcode in EPILOGUE_BINARY | EPILOGUE_UNARY):
        return None
    if follower.opcode in EPILOGUE_UNARY and len(follower.inputs) == 1:
        return follower, "epilogue"
    if follower.opcode in EPILOGUE_BINARY and len(follower.inputs) == 2 and not (
            follower.inputs[0] is value and follower.inputs[1] is value):
        return follower, "epilogue"
    return None


def _table_product(op: Op, follower: Op) -> bool:
    """Whether ``follower`` multiplies the 8- or 16-bit table op ``op``'s result by ``op``'s own input, every
    tensor of one element type with one scale (a function of the input's 256 or 65536 values)."""
    if op.opcode not in TABLE_HOSTS or follower.opcode != "MUL" or len(follower.inputs) != 2:
        return False
    x, value = op.inputs[0], op.outputs[0]
    if {id(t) for t in follower.inputs} != {id(x), id(value)}:
        return False
    tensors = (x, value, follower.outputs[0])
    return all(t.dtype.numpy is not None and t.dtype.numpy.type in (np.int8, np.uint8, np.int16) and t.dtype == x.dtype
               and t.quantization is not None and np.size(t.quantization.scale) == 1 and t.shape == x.shape
               for t in tensors) and (follower.options.get("fused_activation_function") or "NONE") == "NONE"


def _residual(op: Op, follower: Op, ready: Callable[[Tensor], bool]) -> bool:
    """An ADD of a convolution's result and another tensor of its shape, computed before it (a residual
    connection), that the convolution's kernel adds as it stores: all int8, or all float32 from a
    float kernel."""
    if op.opcode not in RESIDUAL_HOSTS or follower.opcode != "ADD" or len(follower.inputs) != 2 \
            or len(follower.outputs) != 1 or follower.inputs[0] is follower.inputs[1]:
        return False
    value = op.outputs[0]
    other = follower.inputs[1] if follower.inputs[0] is value else follower.inputs[0]
    tensors = (value, other, follower.outputs[0])
    if other is None or other.is_constant or not ready(other) or any(t.shape != value.shape for t in tensors):
        return False
    if all(t.dtype.numpy == np.int8 and t.quantization is not None for t in tensors):
        return True
    return _float_kernel(op) and all(t.dtype.numpy == np.float32 and t.quantization is None for t in tensors)


def channel_slope(slope: Tensor | None, value: Tensor) -> np.ndarray | None:
    """A constant PReLU slope as one value per channel (the last axis) of ``value``; None when it is
    not constant or varies along other axes."""
    raw = constant(slope)
    if raw is None or not value.shape or raw.ndim > len(value.shape):
        return None
    values = dequantize_array(raw, slope) if raw.dtype.kind in "iu" else raw.astype(np.float32)
    channels = value.shape[-1]
    if any(d != 1 for d in values.shape[:-1]) or (values.ndim and values.shape[-1] not in (1, channels)):
        return None
    return np.ascontiguousarray(np.broadcast_to(values.reshape(-1), (channels,)), np.float32)
