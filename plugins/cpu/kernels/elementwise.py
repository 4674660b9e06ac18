"""Elementwise kernels: arithmetic and comparisons with broadcasting, logic, select, unary math."""

from __future__ import annotations

import math

import numpy as np

from delegate.plugin_api import Op

from ..registry import kernel, laid_out
from .activations import native_unary
from .common import CLAMPS, along_rows, constant, fused, fused_name
from .native import (BINARY_KINDS, PER_THREAD_ITEMS, BinaryCall, Epilogue, float_loops, prepared_run,
                     team_for)


def _divide(a, b, out):
    """TFLite integer DIV truncates toward zero; float DIV is true division."""
    if out.dtype.kind == "f":
        return np.divide(a, b, out=out)
    np.floor_divide(a, b, out=out)
    out += (out < 0) & (out * b != a)
    return out


def _floor_div(a, b, out):
    if out.dtype.kind == "f":
        np.divide(a, b, out=out)
        return np.floor(out, out=out)
    return np.floor_divide(a, b, out=out)


def _squared_difference(a, b, out):
    np.subtract(a, b, out=out)
    return np.multiply(out, out, out=out)


_ARITHMETIC = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": _divide,
               "MAXIMUM": np.maximum, "MINIMUM": np.minimum, "POW": np.power,
               "SQUARED_DIFFERENCE": _squared_difference, "FLOOR_DIV": _floor_div, "FLOOR_MOD": np.mod}
COMPARE = {"LESS": np.less, "LESS_EQUAL": np.less_equal, "GREATER": np.greater,
            "GREATER_EQUAL": np.greater_equal, "EQUAL": np.equal, "NOT_EQUAL": np.not_equal,
            "LOGICAL_AND": np.logical_and, "LOGICAL_OR": np.logical_or}


@kernel("ADD_N")
def add_n(op: Op):
    """The inputs summed in order, as LiteRT adds them."""
    def run(ins, outs):
        np.copyto(outs[0], ins[0])
        for x in ins[1:]:
            outs[0] += x
    return run


@kernel(*_ARITHMETIC)
def arithmetic(op: Op):
    native = _native_arithmetic(op)
    if native is not None:
        return native
    fn = _ARITHMETIC[op.opcode]
    act = fused(op)
    # Constant operands (per-channel scales and offsets) are laid out once for long inner loops.
    fixed = [None if v is None else along_rows(v, op.outputs[0].shape) for v in map(constant, op.inputs[:2])]

    def run(ins, outs):
        fn(ins[0] if fixed[0] is None else fixed[0], ins[1] if fixed[1] is None else fixed[1], out=outs[0])
        act(outs[0])
    return laid_out(run, 0, 1)


def _native_arithmetic(op: Op):
    """The op in one pass through the native loops on all the kernel's threads, with a fused clamp or
    PReLU: each operand of the output's shape or broadcast to it as one value per element of its last axis
    (a per-channel scale, offset or gate), one value per row of it (a layer norm's mean and deviation of each
    token), or one value, runtime or constant; None where those do not serve."""
    activation, shape = fused_name(op), op.outputs[0].shape
    if op.opcode not in BINARY_KINDS or activation not in ("NONE", "PRELU", *CLAMPS) or not shape:
        return None
    first, second = op.inputs[:2]
    forms = (_form(first.shape, shape), _form(second.shape, shape))
    loops = float_loops(op)
    if None in forms or loops is None or any(t.dtype.numpy != np.float32 for t in (first, second, op.outputs[0])):
        return None
    finish = Epilogue(None, CLAMPS.get(activation), op.options.get("prelu_slope"))
    call = BinaryCall(op.opcode, shape, forms, finish, team_for(math.prod(shape), PER_THREAD_ITEMS))
    return prepared_run(loops, call, 2)  # a constant operand comes as its buffer, bound once (batched_steps)


def _form(operand: tuple[int, ...], shape: tuple[int, ...]) -> str | None:
    """How an operand of ``operand``'s shape covers an output of ``shape`` viewed as rows of its last axis
    (native.BINARY_FORMS), or None where it broadcasts another way."""
    if len(operand) > len(shape):
        return None
    padded = (1,) * (len(shape) - len(operand)) + tuple(operand)
    columns = shape[-1]
    if padded == tuple(shape):
        return "WHOLE"
    if math.prod(padded) == 1:
        return "ONE"
    if padded[-1] == columns and all(d == 1 for d in padded[:-1]):
        return "PER_COLUMN"
    if padded[-1] == 1 and padded[:-1] == tuple(shape[:-1]):
        return "WHOLE" if columns == 1 else "PER_ROW"
    return None


@kernel(*COMPARE)
def compare(op: Op):
    fn = COMPARE[op.opcode]

    def run(ins, outs):
        fn(ins[0], ins[1], out=outs[0])
    return run


@kernel("SELECT", "SELECT_V2")
def select(op: Op):
    cond_rank = len(op.inputs[0].shape)
    out_rank = len(op.outputs[0].shape)
    # SELECT (v1) takes a rank-1 condition that picks whole rows of the first dimension.
    row_select = op.opcode == "SELECT" and cond_rank == 1 and out_rank > 1

    def run(ins, outs):
        cond = ins[0].reshape(-1, *([1] * (out_rank - 1))) if row_select else ins[0]
        np.copyto(outs[0], np.where(cond, ins[1], ins[2]))
    return run


def _rsqrt(x, out):
    np.sqrt(x, out=out)
    return np.divide(1, out, out=out)


_UNARY = {"EXP": np.exp, "LOG": np.log, "SQRT": np.sqrt, "RSQRT": _rsqrt, "SQUARE": np.square,
          "ABS": np.abs, "NEG": np.negative, "SIN": np.sin, "COS": np.cos, "FLOOR": np.floor,
          "CEIL": np.ceil, "ROUND": np.rint, "LOGICAL_NOT": np.logical_not, "SIGN": np.sign}


@kernel(*_UNARY)
def unary(op: Op):
    native = native_unary(op, "RSQRT") if op.opcode == "RSQRT" else None
    if native is not None:  # a layer norm's step, in the batched native calls with the ops around it
        return native
    fn = _UNARY[op.opcode]

    def run(ins, outs):
        fn(ins[0], out=outs[0])
    return run
