"""Kernel registry of the CPU backend.

A kernel is registered per op code as a *factory*: ``factory(op)`` runs once at
compile time (precomputing transposed weights, dequantized constants, index
maps) and returns ``run(inputs, outputs)``, which reads the input arrays and
writes into the preallocated output arrays.  Float and quantized variants of
one op are registered separately; the quantized one is chosen when the op's
first input carries quantization and an integer dtype, the hybrid one when float
activations meet int8 weights stored quantized (dynamic-range quantization).

A kernel that lays out inputs known at compile time itself (weights behind
DEQUANTIZE) marks them with ``laid_out``: the partition then passes None in
their place and neither computes nor keeps them.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from delegate.plugin_api import Op, is_quantized_op

Run = Callable[[list[np.ndarray], list[np.ndarray]], None]
Factory = Callable[[Op], Run]

FLOAT_KERNELS: dict[str, Factory] = {}
QUANT_KERNELS: dict[str, Factory] = {}
HYBRID_KERNELS: dict[str, Factory] = {}


def kernel(*opcodes: str, quantized: bool = False, hybrid: bool = False,
           refuses: Callable[[Op], str | None] | None = None):
    """Register a kernel factory for one or more op codes; ``refuses(op)`` says why the kernel cannot
    run a variant of them (None when it can), so that the support answer never claims it."""
    table = HYBRID_KERNELS if hybrid else QUANT_KERNELS if quantized else FLOAT_KERNELS

    def register(factory: Factory) -> Factory:
        factory.refuses = refuses
        for code in opcodes:
            table[code] = factory
        return factory
    return register


def refusal(factory: Factory, op: Op) -> str | None:
    """Why ``factory``'s kernel cannot run ``op``, or None (see ``kernel``'s ``refuses``)."""
    refuses = getattr(factory, "refuses", None)
    return None if refuses is None else refuses(op)


def laid_out(run: Run, *slots: int) -> Run:
    """Declare that ``run`` took inputs ``slots`` from ``common.constant`` at compile time wherever
    they are compile-time constants, and reads them at run time only where they are not."""
    run.laid_out = frozenset(slots)
    return run


def is_hybrid_weight(t) -> bool:
    """Whether ``t`` holds int8 weights stored quantized (not behind a DEQUANTIZE)."""
    return t is not None and t.data is not None and t.quantization is not None and t.dtype.numpy == np.int8


def is_hybrid_op(op: Op) -> bool:
    """True when float activations meet int8 weights stored quantized: LiteRT then quantizes the
    activations at run time instead of dequantizing the weights."""
    x = op.inputs[0] if op.inputs else None
    return x is not None and x.dtype.numpy == np.float32 and is_hybrid_weight(op.input(1))


# Ops that only move, select or reorder values: their float kernels are exact on quantized
# integers (input and output share one quantization), so they need no quantized twin.
VALUE_PRESERVING = frozenset({
    "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "SLICE", "STRIDED_SLICE", "GATHER", "GATHER_ND",
    "SPLIT", "SPLIT_V", "PACK", "UNPACK", "TILE", "BROADCAST_TO", "DEPTH_TO_SPACE", "SPACE_TO_DEPTH",
    "SPACE_TO_BATCH_ND", "BATCH_TO_SPACE_ND", "RESIZE_NEAREST_NEIGHBOR", "SHAPE", "ARG_MAX", "ARG_MIN",
    "MIRROR_PAD", "REVERSE_V2", "ZEROS_LIKE", "MAXIMUM", "MINIMUM", "REDUCE_MAX", "REDUCE_MIN",
    # they hand values to subgraphs or variables, whose own ops compute
    "IF", "WHILE", "CALL_ONCE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE",
})


def find_kernel(op: Op, custom: dict[str, Factory] | None = None) -> Factory | None:
    """The kernel for ``op``; a quantized op never silently gets a float kernel that would do
    arithmetic on raw integers."""
    if op.custom and custom and op.opcode in custom:
        return custom[op.opcode]
    if is_quantized_op(op):
        if op.opcode in QUANT_KERNELS:
            return QUANT_KERNELS[op.opcode]
        return FLOAT_KERNELS.get(op.opcode) if op.opcode in VALUE_PRESERVING else None
    if op.opcode in HYBRID_KERNELS and is_hybrid_op(op):
        return HYBRID_KERNELS[op.opcode]
    return FLOAT_KERNELS.get(op.opcode)


def load_all() -> None:
    """Import every kernel module so its registrations take effect."""
    from . import kernels  # noqa: F401
