"""The integer LSTM: int8 activations and weights, int16 cell state (LiteRT's "8x8_16" kernel).

What the converter emits for a fully integer-quantized LSTM or UNIDIRECTIONAL_SEQUENCE_LSTM.  Each
gate sums int8 x int8 products with the zero points folded into precomputed biases, rescales the
input and recurrent sums separately onto the gate's int16 scale (Q3.12, or the calibrated scale
of intermediates 0-3 when the gates are layer-normalised), adds the peephole term, and squashes
with gemmlowp's fixed-point logistic or tanh into Q0.15.  The cell state's scale is a power of
two; the hidden value (output gate x tanh(cell)) is requantized to intermediate 4's scale, then
optionally projected.  Every step follows LiteRT's portable tensor_utils, rounding for rounding.
"""

from __future__ import annotations

import numpy as np

from delegate.plugin_api import Op

from ..registry import kernel
from .common import constant
from .native import QLstmCall, kernel_loops, prepared_run
from .lstm import BIASES, CELL_STATE, GATES, INPUT_WEIGHTS, LAYER_NORMS, OUTPUT_STATE, PEEPHOLES, \
    PROJECTION_BIAS, PROJECTION_WEIGHTS, RECURRENT_WEIGHTS
from .quant_util import gemmlowp_logistic16, gemmlowp_tanh16, multiply_by_quantized_multiplier, \
    power_of_two_exponent, quantize_multiplier, rounding_divide_by_pot, scale, trunc_div, wrap16, wrap32, zero_point
from .quantized import inverse_sqrt

HIDDEN = 4  # the intermediate tensor that holds output gate x tanh(cell)


def _multiplier(real) -> tuple[int, int]:
    significand, exponent = quantize_multiplier(np.float32(real))
    return int(significand), int(exponent)


def _squash(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    return table[x + (1 << 15)].astype(np.int64)


class _Gate:
    """One gate's constants: weights, zero-point-folded biases, rescales, peephole, layer norm."""

    def __init__(self, op: Op, gate: str, gate_scale: np.float32, layer_norm: bool, rows_together: bool):
        self.rows_together = rows_together
        x, h = op.inputs[0], op.inputs[OUTPUT_STATE]
        w_in, w_rec = op.inputs[INPUT_WEIGHTS[gate]], op.inputs[RECURRENT_WEIGHTS[gate]]
        self.w_in = np.asarray(constant(w_in), np.int64)
        self.w_rec = np.asarray(constant(w_rec), np.int64)
        bias = None if layer_norm else constant(op.inputs[BIASES[gate]])
        self.bias_in = -zero_point(x) * self.w_in.sum(axis=1) + (0 if bias is None else np.asarray(bias, np.int64))
        self.bias_rec = -zero_point(h) * self.w_rec.sum(axis=1)
        self.rescale_in = _multiplier(scale(w_in) * scale(x) / gate_scale)
        self.rescale_rec = _multiplier(scale(w_rec) * scale(h) / gate_scale)
        peephole = op.input(PEEPHOLES[gate]) if gate in PEEPHOLES else None
        self.peephole = None
        if peephole is not None:
            cell_exponent = power_of_two_exponent(op.inputs[CELL_STATE])
            self.peephole = np.asarray(constant(peephole), np.int64)
            self.rescale_peephole = _multiplier(np.float32(2.0 ** cell_exponent * float(scale(peephole))
                                                           / float(gate_scale)))
        self.norm = None
        if layer_norm:
            coefficients = op.inputs[LAYER_NORMS[gate]]
            self.norm = np.asarray(constant(coefficients), np.int64)
            self.norm_bias = np.asarray(constant(op.inputs[BIASES[gate]]), np.int64)
            self.norm_rescale = _multiplier(scale(coefficients))
            self.variance_guard = max(1, int(np.float32(10000) * scale(coefficients)))

    def __call__(self, x: np.ndarray, h: np.ndarray, c: np.ndarray, table: np.ndarray) -> np.ndarray:
        gate = np.zeros((x.shape[0], self.w_in.shape[0]), np.int64)
        for rows, weights, bias, (m, s) in ((x, self.w_in, self.bias_in, self.rescale_in),
                                            (h, self.w_rec, self.bias_rec, self.rescale_rec)):
            total = multiply_by_quantized_multiplier(wrap32(rows @ weights.T + bias), m, s)  # LiteRT's int32 sums
            gate = np.clip(gate + total, -(1 << 15), (1 << 15) - 1)
        if self.peephole is not None:
            # LiteRT walks the peephole over n_output values per batch row (n_output == n_cell without a
            # projection) of the cell state and gate as flat arrays: all rows of a time-major step at
            # once, or one row at a time when it steps through a batch-major sequence row by row.
            n_output = h.shape[1]
            flat_gate, flat_cell = (gate.reshape(-1), c.reshape(-1)) if self.rows_together else (gate, c)
            n = h.shape[0] * n_output if self.rows_together else n_output
            weights = np.tile(self.peephole[:n_output], h.shape[0]) if self.rows_together else self.peephole[:n_output]
            product = multiply_by_quantized_multiplier(weights * flat_cell[..., :n], *self.rescale_peephole)
            flat_gate[..., :n] = np.clip(flat_gate[..., :n] + product, -(1 << 15), (1 << 15) - 1)
        if self.norm is not None:
            gate = self._layer_norm(gate)
        return _squash(table, gate)

    def native(self, table: np.ndarray) -> dict:
        """The gate's fields of native.c's qlstm (QLstmGate), squashed through ``table``."""
        fields = {"w_in": self.w_in, "w_rec": self.w_rec, "bias_in": self.bias_in, "bias_rec": self.bias_rec,
                  "m_in": self.rescale_in[0], "s_in": self.rescale_in[1], "m_rec": self.rescale_rec[0],
                  "s_rec": self.rescale_rec[1], "table": table}
        if self.peephole is not None:
            fields.update(peephole=self.peephole, m_peep=self.rescale_peephole[0], s_peep=self.rescale_peephole[1])
        if self.norm is not None:
            fields.update(norm=self.norm, norm_bias=self.norm_bias, m_norm=self.norm_rescale[0],
                          s_norm=self.norm_rescale[1], variance_guard=self.variance_guard)
        return fields

    def _layer_norm(self, gate: np.ndarray) -> np.ndarray:
        """LiteRT's integer layer norm: mean and variance with 10 extra bits, 1/sqrt in fixed point."""
        n = gate.shape[1]
        mean = trunc_div(gate.sum(axis=1) * 1024, n)
        variance = trunc_div((gate * gate).sum(axis=1) * ((1 << 20) // n) - mean * mean, 1 << 20)
        variance = np.where(variance < 1, self.variance_guard, variance)
        inv_a, inv_b = inverse_sqrt(variance)
        rescaled = multiply_by_quantized_multiplier(1024 * gate - mean[:, None], inv_a[:, None], inv_b[:, None])
        weighted = wrap32(rescaled * self.norm + self.norm_bias)
        rounded = trunc_div(np.where(weighted > 0, weighted + 512, weighted - 512), 1024)
        m, s = self.norm_rescale
        shift = s + 12
        if shift > 0:  # C's int32 left shift, then the multiply without one
            rounded, shift = wrap32(rounded << shift), 0
        return np.clip(multiply_by_quantized_multiplier(rounded, m, shift), -(1 << 15), (1 << 15) - 1)


def refusal(op: Op) -> str | None:
    """Why LiteRT's integer LSTM cannot run ``op`` (or reads memory it never wrote there), or None."""
    x = op.inputs[0]
    if x.dtype.numpy != np.int8:
        return f"an integer LSTM takes int8 activations (LiteRT has no {x.dtype.name} kernel for it)"
    if op.options.get("kernel_type", "FULL") != "FULL":
        return "only the FULL integer LSTM kernel exists"
    if len(op.intermediates) != 5:
        return (f"an integer LSTM needs the 5 intermediate tensors of LiteRT's 8x8->16 kernel "
                f"(it has {len(op.intermediates)})")
    weights = [i for i, t in enumerate(op.inputs) if t is not None and 0 < i and i not in (OUTPUT_STATE, CELL_STATE)]
    if any(constant(op.inputs[i]) is None for i in weights):
        return "an integer LSTM needs its weights, biases and coefficients as constants"
    cell_exponent = power_of_two_exponent(op.inputs[CELL_STATE])
    if cell_exponent is None:
        return "an integer LSTM needs a power-of-two cell state scale"
    n_cell, n_output = op.inputs[INPUT_WEIGHTS["forget"]].shape[0], op.inputs[OUTPUT_STATE].shape[-1]
    if op.input(PEEPHOLES["forget"]) is not None and n_output > n_cell:
        return (f"LiteRT's integer peephole reads {n_output} cell values of {n_cell} per row "
                "(a projection wider than the cell), past the cell state")
    if not 0 <= 15 + cell_exponent <= 6 and op.input(INPUT_WEIGHTS["input"]) is None:
        return (f"LiteRT's integer LSTM has no tanh for a cell state scale of 2**{cell_exponent} "
                "and reads an uninitialised buffer instead with CIFG")
    return None


@kernel("LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM", quantized=True, refuses=refusal)
def lstm(op: Op):
    why = refusal(op)
    if why is not None:
        raise ValueError(why)
    out = op.outputs[0]
    cell_exponent = power_of_two_exponent(op.inputs[CELL_STATE])
    layer_norm = op.input(LAYER_NORMS["forget"]) is not None
    sequence = op.opcode == "UNIDIRECTIONAL_SEQUENCE_LSTM"
    time_major = not sequence or bool(op.options.get("time_major", False))
    n_cell, n_output = op.inputs[INPUT_WEIGHTS["forget"]].shape[0], op.inputs[OUTPUT_STATE].shape[-1]
    if op.input(PEEPHOLES["forget"]) is not None and n_output > n_cell:
        raise ValueError(f"LiteRT's integer peephole reads {n_output} cell values of {n_cell} per row "
                         "(a projection wider than the cell), past the cell state")
    gates = {}
    for k, name in enumerate(GATES):
        if op.input(INPUT_WEIGHTS[name]) is not None:
            gate_scale = scale(op.intermediates[k]) if layer_norm else np.float32(2.0 ** -12)
            gates[name] = _Gate(op, name, gate_scale, layer_norm, time_major)
    hidden = op.intermediates[HIDDEN]
    hidden_zp = zero_point(hidden)
    hidden_rescale = _multiplier(np.float32(2.0 ** -15 / float(scale(hidden)) * 2.0 ** -15))
    cell_clip = float(op.options.get("cell_clip") or 0.0)
    proj_clip = float(op.options.get("proj_clip") or 0.0)
    cell_bound = int(min(max(np.float32(cell_clip) / scale(op.inputs[CELL_STATE]), -32768), 32767))
    state = op.inputs[OUTPUT_STATE]
    projection = None
    if op.input(PROJECTION_WEIGHTS) is not None:
        w = op.inputs[PROJECTION_WEIGHTS]
        projection = np.asarray(constant(w), np.int64)
        bias = constant(op.input(PROJECTION_BIAS))
        projection_bias = hidden_zp * projection.sum(axis=1) + (0 if bias is None else np.asarray(bias, np.int64))
        projection_rescale = _multiplier(scale(w) * scale(hidden) / scale(state))
        proj_bound = int(min(max(np.float32(proj_clip) / scale(out), -128), 127))
    sigmoid, tanh_gate = gemmlowp_logistic16(3), gemmlowp_tanh16(3)
    # tanh(cell) reads the cell state in Q<15 + exponent>; LiteRT has tables for 0..6 integer bits and
    # otherwise leaves its output buffer as it was: holding this step's input gate (the converter makes
    # cell scales of 2**-16 and below for small cell values).
    cell_bits = 15 + cell_exponent
    tanh_cell = gemmlowp_tanh16(cell_bits) if 0 <= cell_bits <= 6 else None
    state_zp = zero_point(state)
    loops = kernel_loops()
    static = all(d > 0 for t in (op.inputs[0], op.outputs[0], state, op.inputs[CELL_STATE]) for d in t.shape)
    if loops is not None and static and 0 <= 30 + cell_exponent <= 62:  # else numpy's, on run-time shapes
        tables = {"input": sigmoid, "forget": sigmoid, "cell": tanh_gate, "output": sigmoid}
        x_shape = op.inputs[0].shape if sequence else (1, *op.inputs[0].shape)
        steps, batch = (x_shape[0], x_shape[1]) if time_major else (x_shape[1], x_shape[0])
        n_input = x_shape[2]
        step_items = (batch * n_input, n_input, batch * n_output, n_output) if time_major else \
            (n_input, steps * n_input, n_output, steps * n_output)
        sizes = dict(zip(("steps", "batch", "n_input", "n_cell", "n_output", "x_step", "x_row", "y_step",
                          "y_row", "rows_together"), (steps, batch, n_input, n_cell, n_output, *step_items,
                                                     int(time_major))))
        cell = {"cell_shift": 30 + cell_exponent, "cell_bound": cell_bound, "tanh_cell": tanh_cell,
                "hidden_zp": hidden_zp, "m_hidden": hidden_rescale[0], "s_hidden": hidden_rescale[1],
                "state_zp": state_zp}
        if projection is not None:
            cell.update(projection=projection, projection_bias=projection_bias, m_proj=projection_rescale[0],
                        s_proj=projection_rescale[1], proj_bound=proj_bound)
        call = QLstmCall(sizes, [None if name not in gates else gates[name].native(tables[name])
                                 for name in GATES], cell)
        return prepared_run(loops, call, (0, OUTPUT_STATE, CELL_STATE))

    def step(xt, h, c):
        """One time step on int64 rows; returns the new (output state, cell state)."""
        forget = gates["forget"](xt, h, c, sigmoid)
        update = gates["cell"](xt, h, c, tanh_gate)
        input_gate = (1 << 15) - 1 - forget if "input" not in gates else gates["input"](xt, h, c, sigmoid)
        c = wrap16(rounding_divide_by_pot(forget * c, 15))
        c = np.clip(c + wrap16(rounding_divide_by_pot(input_gate * update, 30 + cell_exponent)),
                    -(1 << 15), (1 << 15) - 1)
        if cell_bound > 0:
            c = np.clip(c, -cell_bound, cell_bound)
        output_gate = gates["output"](xt, h, c, sigmoid)
        product = output_gate * (input_gate if tanh_cell is None else _squash(tanh_cell, c))
        if projection is None:
            return np.clip(multiply_by_quantized_multiplier(product, *hidden_rescale) + hidden_zp, -128, 127), c
        hidden_values = np.clip(multiply_by_quantized_multiplier(product, *hidden_rescale) - hidden_zp, -128, 127)
        projected = multiply_by_quantized_multiplier(wrap32(hidden_values @ projection.T + projection_bias),
                                                     *projection_rescale) + state_zp
        projected = np.clip(projected, -128, 127)
        if proj_bound > 0:
            projected = np.clip(projected, -proj_bound, proj_bound)
        return projected, c

    def run(ins, outs):
        xs, ys = ins[0], outs[0]
        if not sequence:
            xs, ys = xs[None], ys[None]
        elif not time_major:
            xs, ys = np.swapaxes(xs, 0, 1), np.swapaxes(ys, 0, 1)
        batch = xs.shape[1]
        h_buffer = ins[OUTPUT_STATE].reshape(batch, -1)
        c_buffer = ins[CELL_STATE].reshape(batch, -1)
        h, c = h_buffer.astype(np.int64), c_buffer.astype(np.int64)
        for t in range(xs.shape[0]):
            h, c = step(xs[t].astype(np.int64), h, c)
            ys[t] = h
        h_buffer[...] = h
        c_buffer[...] = c
    return run

