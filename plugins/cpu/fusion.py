"""Op fusion for the CPU kernels: ops that only pad a convolution's input or activate a float
kernel's result run inside that kernel, as the shared pass groups them (``delegate.passes``: the
fusions in ``FUSIONS`` below).

Converters leave a CONV_2D, ADD or FULLY_CONNECTED followed by a separate PRELU or RELU where the
activation could not be folded into the op's options (PReLU has no fused form; an ADD's RELU often
comes out separate), and a zero PAD of the rows and columns before a VALID convolution where the
source framework padded explicitly.  Run as the producer's fused activation, the activation is
applied while the result is still in registers or cache; run as the convolution's own padding, the
pad costs nothing (its kernels read borders in place).  No separate op, no pass over memory, and
the same values: a clamp or PReLU of each result, zeros at the borders.  XNNPACK, which the LiteRT
engine runs, fuses the same pairs.

A residual ADD of a CONV_2D's result and a tensor computed before it (int8, or float32 from a float
kernel) runs inside that convolution too: the fused op reads the other operand as its last input and
carries the ADD (option ``residual``); its kernel requantizes each output row (int8) or applies bias
and activation to each tile (float), then adds as the ADD would, with the ADD's activation, while the
results are in cache.  A float ADD whose clamp came out as a separate RELU, or that a PRELU follows, takes
that activation as its own.

An 8- or 16-bit swish (LOGISTIC, or TANH, then the MUL of its result by its own input) is one function of
the input's 256 or 65536 values: the table op's kernel looks up the MUL's results directly (option
``times_input``), one pass over the tensor instead of two plus the MUL's requantization.
"""

from __future__ import annotations

from typing import Collection, Sequence

from delegate.plugin_api import Group, Op, channel_slope, constant, find_groups, folded_into

# What the CPU backend's kernels fold (both engines; the numpy engine computes constants at compile time).
FUSIONS = frozenset({"constant", "pad", "quantized_pad", "activation", "residual", "table"})


def fuse_ops(ops: Sequence[Op], keep: Collection[int]) -> tuple[list[Op], dict[int, int]]:
    """``ops`` (in run order, constants already computed) with each group of the shared pass run as one
    op: the anchor reading the pad's input with the padding as its own, and writing the activation's
    output with the activation as its fused one (PRELU carries its slope per channel as the option
    ``prelu_slope``).  Also returns fused op index -> index of the op it runs in.  ``keep`` holds the
    tensors that must stay visible (partition outputs)."""
    groups = find_groups(ops, FUSIONS - {"constant"}, keep)
    merged = {id(g.anchor): _merged(g) for g in groups}
    dropped = {id(op) for g in groups for op in g.folded}
    fused = [merged.get(id(op), op) for op in ops if id(op) not in dropped]
    return fused, {op: anchor for op, (anchor, _) in folded_into(groups).items()}


def _merged(group: Group) -> Op:
    """The group's anchor doing its folded pad, activation and residual ADD."""
    op = group.anchor
    inputs, outputs, options = list(op.inputs), list(op.outputs), dict(op.options)
    for folded, kind in zip(group.folded, group.kinds):
        if kind == "residual":
            inputs.append(folded.inputs[1] if folded.inputs[0] is op.outputs[0] else folded.inputs[0])
            options["residual"] = folded
            outputs = list(folded.outputs)
        elif kind == "table":  # the MUL of the table op's result by its input: one table (quantized.py)
            options["times_input"] = folded
            outputs = list(folded.outputs)
        elif kind == "pad":
            pads = constant(folded.input(1)).astype(int)
            inputs[0] = folded.inputs[0]
            options["explicit_padding"] = (int(pads[1, 0]), int(pads[1, 1]), int(pads[2, 0]), int(pads[2, 1]))
        elif kind == "activation" and "residual" in options:  # a clamp or PReLU after the residual ADD
            add = options["residual"]
            activation = {"fused_activation_function": folded.opcode}
            if folded.opcode == "PRELU":
                activation["prelu_slope"] = channel_slope(folded.input(1), add.outputs[0])
            options["residual"] = Op(add.index, add.opcode, add.inputs, add.outputs, version=add.version,
                                     options={**add.options, **activation}, options_type=add.options_type)
            outputs = list(folded.outputs)
        else:
            if folded.opcode == "PRELU":
                options["prelu_slope"] = channel_slope(folded.input(1), op.outputs[0])
            options["fused_activation_function"] = folded.opcode
            outputs = list(folded.outputs)
    return Op(op.index, op.opcode, inputs, outputs, version=op.version, options=options, options_type=op.options_type)
