"""Golden tests of the float LSTM kernels (one-step LSTM and UNIDIRECTIONAL_SEQUENCE_LSTM) against LiteRT."""

import numpy as np
from hypothesis import given, strategies as st

from delegate.tflite.builder import GraphBuilder
from tests.oputil import check_against_litert

VARIANTS = st.fixed_dictionaries({"cifg": st.booleans(), "peephole": st.booleans(), "projection": st.booleans(),
                                  "projection_bias": st.booleans(), "layer_norm": st.booleans()})


def _lstm_operands(b, rng, n_input, n_cell, n_output, batch, variant):
    """The 24 LSTM inputs after the data input: weights per the variant (None where absent), then states."""
    def w(name, *shape):
        return b.const(name, (rng.standard_normal(shape) * 0.5).astype(np.float32))

    gates = ["forget", "cell", "output"] if variant["cifg"] else ["input", "forget", "cell", "output"]
    ops = [None] * 23
    for k, gate in enumerate(["input", "forget", "cell", "output"]):
        if gate in gates:
            ops[k] = w(f"{gate}_w", n_cell, n_input)
            ops[4 + k] = w(f"{gate}_r", n_cell, n_output)
            ops[11 + k] = w(f"{gate}_b", n_cell)
            if variant["layer_norm"]:
                ops[19 + k] = w(f"{gate}_ln", n_cell)
    if variant["peephole"]:
        for k, gate in enumerate(["input", "forget", "output"]):
            if gate in gates:
                ops[8 + k] = w(f"{gate}_peephole", n_cell)
    if variant["projection"]:
        ops[15] = w("projection", n_output, n_cell)
        if variant["projection_bias"]:
            ops[16] = w("projection_b", n_output)
    ops[17] = b.tensor("output_state", (batch, n_output), is_variable=True)
    ops[18] = b.tensor("cell_state", (batch, n_cell), is_variable=True)
    return ops


def _sizes(variant, n_cell, n_output):
    return n_cell, (n_output if variant["projection"] else n_cell)


@given(variant=VARIANTS, n_input=st.integers(1, 5), n_cell=st.integers(1, 6), n_output=st.integers(1, 4),
       batch=st.integers(1, 3), clips=st.sampled_from([(0.0, 0.0), (0.5, 0.3)]), runtime_weights=st.booleans(),
       seed=st.integers(0, 2**16))
def test_lstm_step(variant, n_input, n_cell, n_output, batch, clips, runtime_weights, seed):
    """``runtime_weights`` feeds the input-to-forget weights as a graph input instead of a constant."""
    n_cell, n_output = _sizes(variant, n_cell, n_output)
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (batch, n_input))
    operands = _lstm_operands(b, rng, n_input, n_cell, n_output, batch, variant)
    inputs = [rng.standard_normal((batch, n_input))]
    if runtime_weights:
        inputs.append(operands[1].data)
        operands[1] = b.input("forget_w_input", operands[1].shape)
    options = {"fused_activation_function": "TANH", "cell_clip": clips[0], "proj_clip": clips[1]}
    b.output(b.op("LSTM", [x] + operands, options=options))
    check_against_litert(b.to_bytes(), inputs, builtin=True)


@given(variant=VARIANTS, time_major=st.booleans(), steps=st.integers(1, 5), n_input=st.integers(1, 4),
       n_cell=st.integers(1, 5), n_output=st.integers(1, 4), batch=st.integers(1, 3),
       act=st.sampled_from(["TANH", "RELU"]), clips=st.sampled_from([(0.0, 0.0), (0.8, 0.5)]),
       seed=st.integers(0, 2**16))
def test_unidirectional_sequence_lstm(variant, time_major, steps, n_input, n_cell, n_output, batch, act, clips,
                                      seed):
    n_cell, n_output = _sizes(variant, n_cell, n_output)
    rng = np.random.default_rng(seed)
    shape = (steps, batch, n_input) if time_major else (batch, steps, n_input)
    b = GraphBuilder()
    x = b.input("x", shape)
    operands = _lstm_operands(b, rng, n_input, n_cell, n_output, batch, variant)
    options = {"fused_activation_function": act, "cell_clip": clips[0], "proj_clip": clips[1],
               "time_major": time_major}
    b.output(b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", [x] + operands, options=options))
    check_against_litert(b.to_bytes(), [rng.standard_normal(shape)], builtin=True)


def _int8_weights(b, operands):
    """The variant's weight matrices and peepholes as int8 stored with a per-tensor scale (dynamic range)."""
    for k in [*range(11), 15]:
        t = operands[k]
        if t is not None:
            w = np.asarray(t.data)
            step = float(np.abs(w).max()) / 127 or 1.0
            operands[k] = b.const(f"{t.name}_int8", np.clip(np.round(w / step), -127, 127).astype(np.int8),
                                  quant=(step, 0))
    return operands


@given(variant=VARIANTS, asymmetric=st.booleans(), steps=st.integers(1, 4), n_input=st.integers(1, 6),
       n_cell=st.integers(1, 6), n_output=st.integers(1, 4), batch=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_hybrid_sequence_lstm(variant, asymmetric, steps, n_input, n_cell, n_output, batch, seed):
    """int8 weights, float activations: each GEMM quantizes its rows at run time, as LiteRT's hybrid kernel does
    (dequantized weights were 0.3-1.6% of the output range off)."""
    n_cell, n_output = _sizes(variant, n_cell, n_output)
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (batch, steps, n_input))
    operands = _int8_weights(b, _lstm_operands(b, rng, n_input, n_cell, n_output, batch, variant))
    options = {"fused_activation_function": "TANH", "time_major": False, "asymmetric_quantize_inputs": asymmetric}
    b.output(b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", [x] + operands, options=options))
    check_against_litert(b.to_bytes(), [rng.standard_normal((batch, steps, n_input))], builtin=True)
