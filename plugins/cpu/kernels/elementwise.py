"""Elementwise float kernels (binary with broadcasting, unary activations)."""

from __future__ import annotations

import numpy as np

from delegate import Op

from ..registry import kernel
from .common import activation

_BINARY = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide,
           "MAXIMUM": np.maximum, "MINIMUM": np.minimum}


@kernel(*_BINARY)
def binary(op: Op):
    fn = _BINARY[op.opcode]
    act = activation(op.options.get("fused_activation_function"))

    def run(ins, outs):
        fn(ins[0], ins[1], out=outs[0])
        if act:
            act(outs[0])
    return run


@kernel("RELU")
def relu(op: Op):
    def run(ins, outs):
        np.maximum(ins[0], 0, out=outs[0])
    return run
