"""Type conversions: CAST, DEQUANTIZE of float16/weight-only constants, DENSIFY of sparse constants."""

from __future__ import annotations

import numpy as np

from delegate.plugin_api import Op

from ..registry import kernel
from .common import dequantize_array


@kernel("CAST")
def cast(op: Op):
    def run(ins, outs):
        # C++ static_cast semantics: float -> int truncates toward zero, anything -> bool is "!= 0".
        np.copyto(outs[0], ins[0], casting="unsafe")
    return run


@kernel("DEQUANTIZE", "DENSIFY")
def materialize(op: Op):
    """For run-time inputs: a partition computes DEQUANTIZE/DENSIFY of constants once and never runs them."""
    if op.opcode == "DENSIFY":
        raise ValueError("DENSIFY needs a constant sparse input")
    source = op.inputs[0]

    def run(ins, outs):
        np.copyto(outs[0], dequantize_array(ins[0], source))
    return run
