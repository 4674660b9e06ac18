"""Activation kernels: ReLU family, PReLU, sigmoid-like functions, softmax and L2 normalisation."""

from __future__ import annotations

import math

import numpy as np

from delegate.plugin_api import Op

from ..registry import kernel, laid_out
from .common import CLAMPS, along_rows, float_constant, scratch
from .native import (NO_EPILOGUE, PER_THREAD_ITEMS, Epilogue, PreluCall, SoftmaxCall, UnaryCall,
                     elementwise_loops, kernel_loops, prepared_run, team_for)

@kernel(*CLAMPS)
def clip(op: Op):
    """Clamps in the native loops where they serve, else through np.clip, which runs a vector loop
    where maximum against a scalar does not."""
    low, high = CLAMPS[op.opcode]
    native = native_unary(op, "COPY", Epilogue(None, (low, high)))
    if native is not None:
        return native

    def run(ins, outs):
        ins[0].clip(low, high, out=outs[0])
    return run


def _scaled_negative_part(op: Op, slope):
    """Kernel for x>0 ? x : slope*x, with ``slope`` broadcast against x (PReLU, LeakyReLU).

    Computed as x + (slope - 1) * min(x, 0) in three passes, or, for slopes
    known to lie in [0, 1], as max(x, slope * x) in two.
    """
    shape = op.outputs[0].shape
    if slope is not None:
        slope = along_rows(slope, shape)
        if np.all((slope >= 0) & (slope <= 1)):
            def run_bounded(ins, outs):
                np.multiply(ins[0], slope, out=outs[0])
                np.maximum(ins[0], outs[0], out=outs[0])
            return run_bounded
    excess = None if slope is None else slope - np.float32(1)

    def run(ins, outs):
        negative = np.minimum(ins[0], 0, out=scratch(0, shape))
        np.multiply(negative, excess if excess is not None else ins[1] - np.float32(1), out=negative)
        np.add(ins[0], negative, out=outs[0])
    return run


@kernel("PRELU")
def prelu(op: Op):
    slope = float_constant(op.inputs[1])
    return laid_out(_native_prelu(op, slope) or _scaled_negative_part(op, slope), 1)


def _native_prelu(op: Op, slope: np.ndarray | None):
    """PReLU in one pass through the native loops, for a constant slope per channel (or one for all);
    None where those do not serve."""
    loops, shape = kernel_loops(), op.outputs[0].shape
    if loops is None or slope is None or op.inputs[0].shape != shape or not shape:
        return None
    slope = np.asarray(slope, np.float32)
    if any(d != 1 for d in slope.shape[:-1]) or (slope.ndim and slope.shape[-1] not in (1, shape[-1])):
        return None
    per_channel = np.broadcast_to(slope.reshape(-1), (shape[-1],))
    return prepared_run(loops, PreluCall(per_channel, shape, team_for(math.prod(shape), PER_THREAD_ITEMS)))


@kernel("LEAKY_RELU")
def leaky_relu(op: Op):
    return _scaled_negative_part(op, np.float32(op.options.get("alpha", 0.2)))


def native_unary(op: Op, kind: str, finish=NO_EPILOGUE):
    """The op in one pass through the native loops on all the kernel's threads; None where those do not
    serve."""
    loops, size = elementwise_loops(op), math.prod(op.outputs[0].shape)
    if loops is None:
        return None
    return prepared_run(loops, UnaryCall(kind, size, finish, team_for(size, PER_THREAD_ITEMS)))


@kernel("HARD_SWISH")
def hard_swish(op: Op):
    native = native_unary(op, "HARD_SWISH")
    if native is not None:
        return native
    shape = op.outputs[0].shape

    def run(ins, outs):
        gate = np.add(ins[0], 3, out=scratch(0, shape))
        np.clip(gate, 0, 6, out=gate)
        np.multiply(ins[0], gate, out=outs[0])
        outs[0] /= 6
    return run


@kernel("LOGISTIC")
def logistic(op: Op):
    native = native_unary(op, "LOGISTIC")
    if native is not None:
        return native

    def run(ins, outs):
        out = outs[0]
        with np.errstate(over="ignore"):  # exp overflow gives inf, and 1/(1+inf) is the right 0
            np.negative(ins[0], out=out)
            np.exp(out, out=out)
        out += 1
        np.reciprocal(out, out=out)
    return run


@kernel("TANH")
def tanh(op: Op):
    def run(ins, outs):
        np.tanh(ins[0], out=outs[0])
    return run


@kernel("ELU")
def elu(op: Op):
    def run(ins, outs):
        x = ins[0]
        np.copyto(outs[0], np.where(x < 0, np.expm1(np.minimum(x, 0)), x))
    return run


_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(x: np.ndarray) -> np.ndarray:
    """erf to ~1e-7 absolute (Abramowitz & Stegun 7.1.26), computed in float64; numpy has none."""
    x = np.asarray(x, np.float64)
    t = 1.0 / (1.0 + _ERF_P * np.abs(x))
    poly = t * (_ERF_A[0] + t * (_ERF_A[1] + t * (_ERF_A[2] + t * (_ERF_A[3] + t * _ERF_A[4]))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


@kernel("GELU")
def gelu(op: Op):
    approximate = bool(op.options.get("approximate", False))
    native = native_unary(op, "GELU_TANH" if approximate else "GELU")
    if native is not None:
        return native
    k = math.sqrt(2.0 / math.pi)

    def run(ins, outs):
        x = ins[0].astype(np.float64)
        if approximate:
            inner = np.tanh(k * (x + 0.044715 * x ** 3))
        else:
            inner = erf(x * math.sqrt(0.5))
        np.copyto(outs[0], 0.5 * x * (1.0 + inner), casting="same_kind")
    return run


def _shifted_exp(x: np.ndarray, beta: float, out: np.ndarray) -> np.ndarray:
    """exp(beta * (x - max(x))) along the last axis, written into ``out``; returns the row sums."""
    np.subtract(x, x.max(axis=-1, keepdims=True), out=out)
    if beta != 1.0:
        out *= beta
    np.exp(out, out=out)
    return out.sum(axis=-1, keepdims=True)


@kernel("SOFTMAX")
def softmax(op: Op):
    """Along the last axis: in the native loops one prepared call (batched with its neighbours'), else
    numpy's; the same steps (see _shifted_exp)."""
    beta = float(op.options.get("beta", 1.0))
    x = op.inputs[0]
    loops = kernel_loops() if x.dtype.numpy == np.float32 and x.shape and x.size else None
    if loops is not None:
        return prepared_run(loops, SoftmaxCall(x.size, x.shape[-1], beta, team_for(x.size, PER_THREAD_ITEMS)))

    def run(ins, outs):
        outs[0] /= _shifted_exp(ins[0], beta, outs[0])
    return run


@kernel("LOG_SOFTMAX")
def log_softmax(op: Op):
    def run(ins, outs):
        x = ins[0]
        shifted = x - x.max(axis=-1, keepdims=True)
        np.subtract(shifted, np.log(np.exp(shifted).sum(axis=-1, keepdims=True)), out=outs[0])
    return run


@kernel("L2_NORMALIZATION")
def l2_normalization(op: Op):
    def run(ins, outs):
        x = ins[0]
        norm = np.sqrt(np.einsum("...i,...i->...", x, x))[..., None]
        np.divide(x, np.maximum(norm, 1e-6), out=outs[0])
    return run
