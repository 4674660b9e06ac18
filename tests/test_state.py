"""Stateful execution as LiteRT does it: variable tensors start at zero, persist across invoke() and
come back with reset_all_variables(); nothing (compile-time runs, the accuracy guard) runs a user's
partition before the user does."""

import numpy as np
import pytest

from delegate.config import load_config
from delegate.interpreter import Interpreter
from delegate.tflite.builder import GraphBuilder
from tests.ops.test_lstm import _lstm_operands
from tests.oputil import litert

ENGINES = ["numpy", "litert"]
PLAIN = {"cifg": False, "peephole": False, "projection": False, "projection_bias": False, "layer_norm": False}


def lstm_model(seed: int = 0) -> bytes:
    """UNIDIRECTIONAL_SEQUENCE_LSTM (variable output and cell state) followed by a dense layer."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, 3, 2))
    operands = _lstm_operands(b, rng, 2, 4, 4, 1, PLAIN)
    y = b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", [x] + operands,
             options={"fused_activation_function": "TANH", "time_major": False})
    w = b.const("w", rng.standard_normal((3, 4)).astype(np.float32))
    b.output(b.op("FULLY_CONNECTED", [y, w], options={"fused_activation_function": "NONE"}, name="logits"))
    return b.to_bytes()


def sequence(it, inputs):
    """Outputs of one invoke per input, on one interpreter (state carried between them)."""
    out = it.get_output_details()[0]["index"]
    results = []
    for x in inputs:
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        results.append(it.get_tensor(out))
    return results


def inputs(n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3, 2)).astype(np.float32) for _ in range(n)]


def reference(model: bytes, xs):
    it = litert.Interpreter(model_content=model)
    it.allocate_tensors()
    return sequence(it, xs)


def config(engine: str):
    return load_config("configs/cpu.yaml", overrides=[f"cpu.engine={engine}"])


@pytest.mark.parametrize("engine", ENGINES)
def test_fresh_interpreters_start_from_zero_state(engine):
    model, xs = lstm_model(), inputs(1)
    expected = reference(model, xs)[0]
    cfg = config(engine)
    for _ in range(30):
        it = Interpreter(model_content=model, config=cfg)
        it.allocate_tensors()
        np.testing.assert_allclose(sequence(it, xs)[0], expected, rtol=1e-5, atol=1e-6)


def test_default_config_starts_from_zero_state():
    """The default config brings the accelerators and the accuracy guard; neither may advance the state."""
    model, xs = lstm_model(), inputs(1)
    expected = reference(model, xs)[0]
    for _ in range(2):
        it = Interpreter(model_content=model)
        it.allocate_tensors()
        np.testing.assert_allclose(sequence(it, xs)[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_state_persists_across_invokes_and_resets(engine):
    model, xs = lstm_model(2), inputs(4, seed=3)
    expected = reference(model, xs)
    assert not np.allclose(expected[0], expected[1])  # the state matters in this model
    it = Interpreter(model_content=model, config=config(engine))
    it.allocate_tensors()
    for _ in range(2):
        for ours, theirs in zip(sequence(it, xs), expected):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
        it.reset_all_variables()


@pytest.mark.parametrize("engine", ENGINES)
def test_signature_runner_carries_state(engine):
    model, xs = lstm_model(4), inputs(3, seed=5)
    expected = reference(model, xs)
    runner = Interpreter(model_content=model, config=config(engine)).get_signature_runner()
    for x, theirs in zip(xs, expected):
        np.testing.assert_allclose(runner(x=x)["logits"], theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_converter_lstm_classifier(engine):
    """A Keras LSTM as the converter writes it (embedding GATHER, UNIDIRECTIONAL_SEQUENCE_LSTM with
    variable state): fresh interpreters agree with LiteRT on the first run, one agrees on a sequence."""
    path = "tests/fixtures/converter/lstm_classifier_fp32.tflite"
    data = open(path, "rb").read()
    rng = np.random.default_rng(0)
    shape = litert.Interpreter(model_content=data).get_input_details()[0]["shape"]
    xs = [rng.integers(0, 50, shape).astype(np.int32) for _ in range(3)] + [None]
    xs[3] = xs[0]
    expected = reference(data, xs)
    cfg = config(engine)
    for _ in range(10):
        it = Interpreter(model_content=data, config=cfg)
        it.allocate_tensors()
        np.testing.assert_allclose(sequence(it, xs[:1])[0], expected[0], rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(sequence(it, xs[1:]), expected[1:]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
