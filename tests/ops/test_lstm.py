"""Golden tests of the float LSTM kernels (one-step LSTM and UNIDIRECTIONAL_SEQUENCE_LSTM) against LiteRT."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from delegate.tflite.builder import GraphBuilder
from tests.oputil import check_against_litert, delegate_run, litert

VARIANTS = st.fixed_dictionaries({"cifg": st.booleans(), "peephole": st.booleans(), "projection": st.booleans(),
                                  "projection_bias": st.booleans(), "layer_norm": st.booleans()})


def _lstm_operands(b, rng, n_input, n_cell, n_output, batch, variant, make=None, states=None):
    """The 24 LSTM inputs after the data input: weights per the variant (None where absent), then states.

    ``make(kind, name, *shape)`` builds each constant (kind: weights, bias, layer_norm, peephole), float32
    by default; ``states`` are the (output, cell) state tensors, float32 variables by default."""
    def w(kind, name, *shape):
        return b.const(name, (rng.standard_normal(shape) * 0.5).astype(np.float32))

    make = make or w
    gates = ["forget", "cell", "output"] if variant["cifg"] else ["input", "forget", "cell", "output"]
    ops = [None] * 23
    for k, gate in enumerate(["input", "forget", "cell", "output"]):
        if gate in gates:
            ops[k] = make("weights", f"{gate}_w", n_cell, n_input)
            ops[4 + k] = make("weights", f"{gate}_r", n_cell, n_output)
            ops[11 + k] = make("bias", f"{gate}_b", n_cell)
            if variant["layer_norm"]:
                ops[19 + k] = make("layer_norm", f"{gate}_ln", n_cell)
    if variant["peephole"]:
        for k, gate in enumerate(["input", "forget", "output"]):
            if gate in gates:
                ops[8 + k] = make("peephole", f"{gate}_peephole", n_cell)
    if variant["projection"]:
        ops[15] = make("weights", "projection", n_output, n_cell)
        if variant["projection_bias"]:
            ops[16] = make("bias", "projection_b", n_output)
    ops[17], ops[18] = states or (b.tensor("output_state", (batch, n_output), is_variable=True),
                                  b.tensor("cell_state", (batch, n_cell), is_variable=True))
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


def _integer_lstm(rng, variant, time_major, steps, n_input, n_cell, n_output, batch, clips, op, cell_exponent=-11):
    """A fully integer LSTM as the converter lays it out: int8 activations and weights, int32 biases,
    int16 peepholes, layer norm coefficients and cell state (scale 2**cell_exponent), and the five intermediates
    of LiteRT's 8x8->16 kernel (the gate scales, used with layer norm, and the hidden value)."""
    b = GraphBuilder()
    x_quant, h_quant = (float(rng.uniform(0.01, 0.05)), int(rng.integers(-20, 20))), \
        (float(rng.uniform(0.005, 0.02)), int(rng.integers(-10, 10)))
    shape = ((steps, batch, n_input) if time_major else (batch, steps, n_input)) if op != "LSTM" \
        else (batch, n_input)
    x = b.input("x", shape, "int8", quant=x_quant)

    ranges = {"layer_norm": (2e-5, 6e-5), "peephole": (1e-5, 5e-5)}

    def make(kind, name, *shape):
        if kind == "weights":
            return b.const(name, rng.integers(-127, 128, shape).astype(np.int8),
                           quant=(float(rng.uniform(0.002, 0.02)), 0))
        if kind == "bias":
            return b.const(name, rng.integers(-3000, 3000, shape).astype(np.int32), quant=(1e-4, 0))
        return b.const(name, rng.integers(-20000, 20000, shape).astype(np.int16),
                       quant=(float(rng.uniform(*ranges[kind])), 0))

    states = (b.tensor("output_state", (batch, n_output), "int8", quant=h_quant, is_variable=True),
              b.tensor("cell_state", (batch, n_cell), "int16", quant=(2.0 ** cell_exponent, 0), is_variable=True))
    ops = _lstm_operands(b, rng, n_input, n_cell, n_output, batch, variant, make, states)
    options = {"fused_activation_function": "TANH", "cell_clip": clips[0], "proj_clip": clips[1]}
    if op != "LSTM":
        options["time_major"] = time_major
    y = b.op(op, [x] + ops, options=options, dtype="int8", quant=h_quant)
    b.ops[-1].intermediates = [b.tensor(f"gate_{g}", (), "int16", quant=(float(rng.uniform(2e-4, 1e-3)), 0))
                               for g in range(4)] + \
        [b.tensor("hidden", (), "int8", quant=(float(rng.uniform(0.005, 0.01)), int(rng.integers(-5, 5))))]
    b.output(y)
    return b.to_bytes(), rng.integers(-128, 128, shape).astype(np.int8)


@given(variant=VARIANTS, time_major=st.booleans(), steps=st.integers(1, 5), n_input=st.integers(1, 6),
       n_cell=st.sampled_from([1, 2, 4, 8]), n_output=st.integers(1, 5), batch=st.integers(1, 3),
       clips=st.sampled_from([(0.0, 0.0), (0.6, 0.3)]), op=st.sampled_from(["UNIDIRECTIONAL_SEQUENCE_LSTM", "LSTM"]),
       cell_exponent=st.sampled_from([-11, -15, -17]), seed=st.integers(0, 2**16), native=st.booleans())
def test_integer_lstm(variant, time_major, steps, n_input, n_cell, n_output, batch, clips, op, cell_exponent, seed,
                      native):
    """int8 activations, int16 cell state: bit-exact against LiteRT's 8x8->16 kernel, over three invokes
    (the states carry over).  Layer norm takes power-of-two cell counts only, as LiteRT's does; with
    peepholes the projection is at most as wide as the cell (LiteRT reads past the cell state otherwise).
    Below 2**-15 LiteRT has no tanh for the cell and uses the input gate in its place (see
    test_integer_lstm_refusals for CIFG there).  ``native``: native.c's qlstm, or the numpy formulation."""
    n_cell, n_output = _sizes(variant, n_cell, n_output)
    if variant["peephole"]:
        n_output = min(n_output, n_cell)
    if variant["cifg"]:
        cell_exponent = max(cell_exponent, -15)
    model, x = _integer_lstm(np.random.default_rng(seed), variant, time_major, steps, n_input, n_cell, n_output,
                             batch, clips, op, cell_exponent)
    check_stateful(model, [x, x[::-1].copy(), x // 2], native)


def check_stateful(model: bytes, inputs: list[np.ndarray], native: bool = True) -> None:
    """The same model invoked once per input on one LiteRT builtin interpreter and one delegate interpreter
    (the numpy engine; ``native``: with its native loops, else the numpy formulations alone)."""
    from delegate.config import load_config
    from delegate.interpreter import Interpreter

    ref = litert.Interpreter(model_content=model,
                             experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    overrides = ["cpu.engine=numpy", f"cpu.native={str(native).lower()}"]
    ours = Interpreter(model_content=model, config=load_config("configs/cpu.yaml", overrides=overrides))
    for it in (ref, ours):
        it.allocate_tensors()
    for x in inputs:
        results = []
        for it in (ref, ours):
            it.set_tensor(it.get_input_details()[0]["index"], x)
            it.invoke()
            results.append(it.get_tensor(it.get_output_details()[0]["index"]))
        np.testing.assert_array_equal(results[1], results[0])


@pytest.mark.parametrize("case, message", [
    ({"cifg": True, "cell_exponent": -17}, "reads an uninitialised buffer"),
    ({"peephole": True, "projection": True, "n_output": 5}, "past the cell state"),
])
def test_integer_lstm_refusals(case, message):
    """Where LiteRT's integer LSTM reads memory it never wrote, the CPU backend's numpy engine refuses
    it in its support answer, saying why."""
    variant = {"cifg": False, "peephole": False, "projection": False, "projection_bias": False, "layer_norm": False}
    variant.update({k: v for k, v in case.items() if k in variant})
    model, x = _integer_lstm(np.random.default_rng(0), variant, False, 2, 3, 4, case.get("n_output", 4), 1,
                             (0.0, 0.0), "UNIDIRECTIONAL_SEQUENCE_LSTM", case.get("cell_exponent", -11))
    with pytest.raises(AssertionError, match=message):
        delegate_run(model, [x])
