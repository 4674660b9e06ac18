"""Float LSTM kernels: LSTM (one step) and UNIDIRECTIONAL_SEQUENCE_LSTM.

The full TFLite cell: optional CIFG (no input gate: i = 1 - f), peepholes,
layer normalisation of each gate, cell clipping and an output projection
with clipping.  The input contributions of every time step come from one
GEMM up front; each step then adds one recurrent GEMM for all gates.  With
int8 weights stored quantized (dynamic range) the GEMMs quantize their rows at
run time, as LiteRT's hybrid kernel does.  The
state tensors (inputs 18 and 19) are variable tensors updated in place, so
they carry over between invocations as in TFLite.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from delegate.plugin_api import Op

from ..registry import is_hybrid_weight, kernel, laid_out
from .common import activation, float_constant
from .hybrid import quantize_rows

GATES = ("input", "forget", "cell", "output")
# Input slots of the 24-input TFLite LSTM, per gate.
INPUT_WEIGHTS = {"input": 1, "forget": 2, "cell": 3, "output": 4}
RECURRENT_WEIGHTS = {"input": 5, "forget": 6, "cell": 7, "output": 8}
PEEPHOLES = {"input": 9, "forget": 10, "output": 11}
BIASES = {"input": 12, "forget": 13, "cell": 14, "output": 15}
LAYER_NORMS = {"input": 20, "forget": 21, "cell": 22, "output": 23}
PROJECTION_WEIGHTS, PROJECTION_BIAS, OUTPUT_STATE, CELL_STATE = 16, 17, 18, 19
STATES = (OUTPUT_STATE, CELL_STATE)
LAYER_NORM_EPSILON = 1e-8


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) in place.  (numpy 2.4's in-place ``negative`` misreads some column views.)"""
    with np.errstate(over="ignore"):
        np.multiply(x, -1.0, out=x)
        np.exp(x, out=x)
    x += 1
    return np.reciprocal(x, out=x)


def _layer_norm(x: np.ndarray) -> np.ndarray:
    """Normalise each row to zero mean and unit variance (in place)."""
    x -= x.mean(axis=-1, keepdims=True)
    x *= 1.0 / np.sqrt(np.square(x).mean(axis=-1, keepdims=True) + LAYER_NORM_EPSILON)
    return x


class _Product:
    """``rows @ W.T`` for the stacked weight matrices of ``slots`` (units x depth each).

    With int8 weights stored quantized (a dynamic-range LSTM) it is computed as LiteRT's hybrid
    kernel does: each row quantized (see hybrid.quantize_rows), integer sums, each matrix's sums
    scaled by row scale x its weight scale; otherwise in float32 on the values ``value`` gives.
    """

    def __init__(self, op: Op, slots: list[int], value: Callable[[int], np.ndarray | None]):
        tensors = [op.inputs[i] for i in slots]
        self.hybrid = all(is_hybrid_weight(t) for t in tensors)
        self.asymmetric = bool(op.options.get("asymmetric_quantize_inputs"))
        if self.hybrid:
            self.matrix = np.ascontiguousarray(np.concatenate([np.asarray(t.data, np.float64) for t in tensors]).T)
            self.scales = np.concatenate([np.full(t.shape[0], t.quantization.scale[0], np.float32) for t in tensors])
        else:
            self.matrix = np.ascontiguousarray(np.concatenate([value(i) for i in slots]).T)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        if not self.hybrid:
            return rows @ self.matrix
        q, step, _ = quantize_rows(np.asarray(rows, np.float32), self.asymmetric)
        return (q @ self.matrix).astype(np.float32) * (step[:, None] * self.scales)


class _Weights:
    """The op's weights, laid out for one input GEMM and one recurrent GEMM over all gates.

    ``value(i)`` gives input ``i`` as float32, or None when the optional input is absent.
    """

    def __init__(self, op: Op, value: Callable[[int], np.ndarray | None]):
        self.gates = [g for g in GATES if value(INPUT_WEIGHTS[g]) is not None]
        self.cifg = "input" not in self.gates
        self.n_cell = value(INPUT_WEIGHTS["forget"]).shape[0]
        self.input = _Product(op, [INPUT_WEIGHTS[g] for g in self.gates], value)
        # Diagonal recurrent weights are per-unit scales instead of matrices.
        self.diagonal = bool(op.options.get("diagonal_recurrent_tensors"))
        if self.diagonal:
            self.recurrent = np.concatenate([value(RECURRENT_WEIGHTS[g]) for g in self.gates])
        else:
            self.recurrent = _Product(op, [RECURRENT_WEIGHTS[g] for g in self.gates], value)
        self.peephole = {g: value(i) for g, i in PEEPHOLES.items() if g in self.gates and value(i) is not None}
        self.layer_norm = {g: value(LAYER_NORMS[g]) for g in self.gates if value(LAYER_NORMS[g]) is not None}
        zeros = np.zeros(self.n_cell, np.float32)
        self.bias = {g: zeros if value(BIASES[g]) is None else value(BIASES[g]) for g in self.gates}
        projection = value(PROJECTION_WEIGHTS) is not None
        self.projection = _Product(op, [PROJECTION_WEIGHTS], value) if projection else None
        self.projection_bias = value(PROJECTION_BIAS)


def _basic_lstm(op: Op):
    """LSTM's BASIC kernel: one GEMM over [input, previous activation] gives the input, candidate, forget
    and output gates (in that order); its outputs are the activation, the state, and the concatenation
    and pre-activations it computed on the way."""
    def run(ins, outs):
        x, previous, weights, bias, state = ins
        activation, new_state, concat, gates = outs
        concat[...] = np.concatenate([x, previous], axis=-1)
        np.matmul(concat, np.asarray(weights, np.float32).T, out=gates)
        gates += bias
        units = state.shape[-1]
        part = [gates[..., k * units:(k + 1) * units].copy() for k in range(4)]
        new_state[...] = _sigmoid(part[0]) * np.tanh(part[1]) + _sigmoid(part[2]) * state
        activation[...] = _sigmoid(part[3]) * np.tanh(new_state)
    return run


@kernel("LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM")
def lstm(op: Op):
    if op.opcode == "LSTM" and op.options.get("kernel_type") == "BASIC":
        return _basic_lstm(op)
    sequence = op.opcode == "UNIDIRECTIONAL_SEQUENCE_LSTM"
    time_major = not sequence or bool(op.options.get("time_major", False))  # the schema default
    # The cell's activation, TANH as a rule (recurrent kernels apply it, unlike the others: fused_name).
    cell_activation = activation(op.options.get("fused_activation_function")) or (lambda x: None)
    cell_clip = float(op.options.get("cell_clip") or 0.0)
    proj_clip = float(op.options.get("proj_clip") or 0.0)
    weight_slots = [i for i, t in enumerate(op.inputs) if t is not None and i > 0 and i not in STATES]
    constants = {i: float_constant(op.inputs[i]) for i in weight_slots}
    fixed = _Weights(op, constants.get) if all(v is not None for v in constants.values()) else None

    def squash(x):
        cell_activation(x)
        return x

    def step(w: _Weights, gates: np.ndarray, h: np.ndarray, c: np.ndarray) -> np.ndarray:
        """One time step from the input GEMM of all gates; updates the cell state ``c`` in place."""
        gates += np.tile(h, len(w.gates)) * w.recurrent if w.diagonal else w.recurrent(h)
        gate = {g: gates[:, k * w.n_cell:(k + 1) * w.n_cell] for k, g in enumerate(w.gates)}

        def value(name, fn):
            x = gate[name]
            if w.layer_norm:  # with layer norm the bias comes after the normalisation
                _layer_norm(x)
                x *= w.layer_norm[name]
                x += w.bias[name]
            return fn(x)

        for name in ("input", "forget"):
            if name in w.peephole:
                gate[name] += w.peephole[name] * c
        forget = value("forget", _sigmoid)
        update = value("cell", squash)
        update *= (1.0 - forget) if w.cifg else value("input", _sigmoid)
        c *= forget
        c += update
        if cell_clip > 0:
            np.clip(c, -cell_clip, cell_clip, out=c)
        if "output" in w.peephole:
            gate["output"] += w.peephole["output"] * c
        hidden = value("output", _sigmoid) * squash(c.copy())
        if w.projection is None:
            return hidden
        projected = w.projection(hidden)
        if w.projection_bias is not None:
            projected += w.projection_bias
        if proj_clip > 0:
            np.clip(projected, -proj_clip, proj_clip, out=projected)
        return projected

    def run(ins, outs):
        w = fixed or _Weights(op, lambda i: None if op.input(i) is None else np.asarray(ins[i], np.float32))
        x, out = ins[0], outs[0]
        if not sequence:
            x, out = x[None], out[None]
        elif not time_major:
            x, out = np.swapaxes(x, 0, 1), np.swapaxes(out, 0, 1)
        steps, batch, depth = x.shape
        h = ins[OUTPUT_STATE].reshape(batch, -1)
        c = ins[CELL_STATE].reshape(batch, -1)
        gates = w.input(x.reshape(steps * batch, depth)).reshape(steps, batch, -1)
        if not w.layer_norm:
            gates += np.concatenate([w.bias[g] for g in w.gates])
        for t in range(steps):
            h[...] = step(w, gates[t], h, c)
            out[t] = h
    return laid_out(run, *weight_slots) if fixed is not None else run
