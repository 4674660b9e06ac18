"""Op fusion for the CPU kernels: ops that only pad a convolution's input or activate a float
kernel's result run inside that kernel.

Converters leave a CONV_2D, ADD or FULLY_CONNECTED followed by a separate PRELU or RELU where the
activation could not be folded into the op's options (PReLU has no fused form; an ADD's RELU often
comes out separate), and a zero PAD of the rows and columns before a VALID convolution where the
source framework padded explicitly.  Run as the producer's fused activation, the activation is
applied while the result is still in registers or cache; run as the convolution's own padding, the
pad costs nothing (its kernels read borders in place).  No separate op, no pass over memory, and
the same values: a clamp or PReLU of each result, zeros at the borders.
"""

from __future__ import annotations

from typing import Collection, Sequence

import numpy as np

from delegate.plugin_api import Op, Tensor

from .kernels.common import CLAMPS, constant, float_constant
from .registry import is_quantized_op

# Float kernels that apply any clamp or a per-channel PReLU as their fused activation.
HOSTS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD", "SUB", "MUL"})


def fuse_ops(ops: Sequence[Op], keep: Collection[int]) -> tuple[list[Op], dict[int, int]]:
    """``ops`` (in run order) with pads absorbed into the convolutions they feed and activations into
    the kernels whose result they activate (see fuse_paddings, fuse_activations); also returns
    fused op index -> index of the op it runs in.  ``keep`` holds the tensors that must stay visible
    (partition outputs)."""
    padded, pads = fuse_paddings(ops, keep)
    activated, activations = fuse_activations(padded, keep)
    return activated, {**pads, **activations}


# Convolutions whose kernels take any zero padding of the rows and columns (the option
# ``explicit_padding``: top, bottom, left, right), read in place at the borders.
PADDED = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D"})


def fuse_paddings(ops: Sequence[Op], keep: Collection[int]) -> tuple[list[Op], dict[int, int]]:
    """``ops`` with each zero PAD of rows and columns read only by a float VALID convolution dropped,
    and the convolution reading the pad's input with the padding as its own."""
    members = {id(op) for op in ops}
    consumers = {id(op): consumer for op in ops if (consumer := _padded_consumer(op, keep, members)) is not None}
    absorbed = {id(consumer): pad for pad in ops if (consumer := consumers.get(id(pad))) is not None}
    merged = [_with_padding(op, absorbed[id(op)]) if id(op) in absorbed else op for op in ops
              if id(op) not in consumers]
    return merged, {pad.index: consumers[id(pad)].index for pad in ops if id(pad) in consumers}


def absorbed(op: Op) -> bool:
    """Whether ``op`` runs inside a neighbour when both are in one CPU partition (so costs nothing
    of its own): a pad a convolution takes over, or an activation its producer applies.  XNNPACK,
    which the LiteRT engine runs, fuses the same pairs."""
    producer = op.inputs[0].producer if op.inputs and op.inputs[0] is not None else None
    return _padded_consumer(op, (), None) is not None or (
        producer is not None and _follower(producer, (), None) is op)


def _padded_consumer(op: Op, keep: Collection[int], members: set[int] | None) -> Op | None:
    """The convolution that can take over ``op``'s padding, if ``op`` is such a pad."""
    if op.custom or op.opcode not in ("PAD", "PADV2") or len(op.outputs) != 1:
        return None
    value = op.outputs[0]
    if value.index in keep or value.dtype.numpy != np.float32 or len(value.shape) != 4 or len(value.uses) != 1:
        return None
    pads, fill = _constant(op.input(1)), _constant(op.input(2))
    if pads is None or pads.shape != (4, 2) or pads[0].any() or pads[3].any() or (pads < 0).any():
        return None
    if op.input(2) is not None and (fill is None or fill.size != 1 or float(fill.ravel()[0]) != 0.0):
        return None
    consumer = value.uses[0]
    if (members is not None and id(consumer) not in members) or consumer.custom or consumer.opcode not in PADDED or is_quantized_op(consumer):
        return None
    if consumer.inputs[0] is not value or consumer.options.get("padding") != "VALID":
        return None
    return consumer


def _constant(t: Tensor | None) -> np.ndarray | None:
    return None if t is None else constant(t)


def _with_padding(conv: Op, pad: Op) -> Op:
    pads = _constant(pad.input(1)).astype(int)
    options = dict(conv.options, explicit_padding=(int(pads[1, 0]), int(pads[1, 1]), int(pads[2, 0]),
                                                   int(pads[2, 1])))
    return Op(conv.index, conv.opcode, [pad.inputs[0], *conv.inputs[1:]], list(conv.outputs),
              version=conv.version, options=options, options_type=conv.options_type)


def fuse_activations(ops: Sequence[Op], keep: Collection[int]) -> tuple[list[Op], dict[int, int]]:
    """``ops`` with each fusable (producer, activation) pair replaced by one op: the producer writing
    the activation's output with the activation as its fused one (PRELU carries its slope per
    channel as the option ``prelu_slope``)."""
    members = {id(op) for op in ops}
    followers = {id(op): follower for op in ops if (follower := _follower(op, keep, members)) is not None}
    dropped = {id(follower) for follower in followers.values()}
    merged = [_merge(op, followers[id(op)]) if id(op) in followers else op for op in ops if id(op) not in dropped]
    return merged, {followers[id(op)].index: op.index for op in ops if id(op) in followers}


def _follower(op: Op, keep: Collection[int], members: set[int] | None) -> Op | None:
    """The activation op fusable into ``op``, if any."""
    if op.custom or op.opcode not in HOSTS or len(op.outputs) != 1 or is_quantized_op(op):
        return None
    if (op.options.get("fused_activation_function") or "NONE") != "NONE":
        return None
    value = op.outputs[0]
    if value.index in keep or value.dtype.numpy != np.float32 or len(value.uses) != 1:
        return None
    follower = value.uses[0]
    if (members is not None and id(follower) not in members) or follower.custom or follower.inputs[0] is not value:
        return None
    out = follower.outputs[0]
    if out.shape != value.shape or out.dtype != value.dtype:
        return None
    if follower.opcode in CLAMPS and len(follower.inputs) == 1:
        return follower
    if follower.opcode == "PRELU" and _channel_slope(follower.input(1), value) is not None:
        return follower
    return None


def _channel_slope(slope: Tensor | None, value: Tensor) -> np.ndarray | None:
    """A constant PReLU slope as one value per channel (the last axis) of ``value``; None when it is
    not constant or varies along other axes."""
    values = None if slope is None else float_constant(slope)
    if values is None or not value.shape or values.ndim > len(value.shape):
        return None
    channels = value.shape[-1]
    if any(d != 1 for d in values.shape[:-1]) or (values.ndim and values.shape[-1] not in (1, channels)):
        return None
    return np.ascontiguousarray(np.broadcast_to(values.reshape(-1), (channels,)), np.float32)


def _merge(host: Op, follower: Op) -> Op:
    options = dict(host.options, fused_activation_function=follower.opcode)
    if follower.opcode == "PRELU":
        options["prelu_slope"] = _channel_slope(follower.input(1), host.outputs[0])
    return Op(host.index, host.opcode, list(host.inputs), list(follower.outputs), version=host.version,
              options=options, options_type=host.options_type)
