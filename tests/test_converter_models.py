"""Models made by TensorFlow's own converter: reader, writer and CPU backend against LiteRT.

The fixtures (tests/fixtures/converter/, built by tests/fixtures/make_converter_models.py)
carry what only the converter produces: fp16 weights behind DEQUANTIZE, full-integer and
16x8 quantization with per-channel scales, atrous convolution as SPACE_TO_BATCH_ND,
fused UNIDIRECTIONAL_SEQUENCE_LSTM, decomposed LayerNorm, and buffers after the flatbuffer.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from tflite.Model import Model as FbModel

from delegate import DelegateError, read_model
from delegate.session import RunSettings, Session
from tests.oputil import assert_round_trip, assert_close, litert, litert_run

FIXTURES = Path(__file__).parent / "fixtures" / "converter"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["models"]
NAMES = sorted(MANIFEST)
FLOAT = [n for n in NAMES if MANIFEST[n]["mode"] in ("fp32", "fp16", "dynamic")]  # float outputs
QUANTIZED = [n for n in NAMES if MANIFEST[n]["mode"] in ("int8", "int16x8")]
# Converter output that LiteRT itself cannot run: its error, and what delegate's CPU backend must say instead.
LITERT_REFUSES = {"transformer_block_int16x8.tflite": (
    "SquaredDifference only supports FLOAT32 and INT32", "no int16 SQUARED_DIFFERENCE kernel")}
RUNNABLE = [n for n in NAMES if n not in LITERT_REFUSES]
# Float models: within this fraction of the output range of each LiteRT kernel set.
TOLERANCE = 1e-4


def load(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def random_inputs(model, seed: int = 0) -> list[np.ndarray]:
    """Images in [-1, 1] (the calibration range), integers over their whole range, token ids below the vocabulary."""
    rng = np.random.default_rng(seed)
    inputs = []
    for t in model.main.inputs:
        dtype = t.dtype.numpy
        lookups = [op for op in t.uses if op.opcode == "GATHER" and op.inputs[1] is t]
        if lookups:
            x = rng.integers(0, lookups[0].inputs[0].shape[0], t.shape)
        elif dtype.kind == "f":
            x = rng.uniform(-1, 1, t.shape)
        else:
            info = np.iinfo(dtype)
            x = rng.integers(info.min, info.max, t.shape, endpoint=True)
        inputs.append(x.astype(dtype))
    return inputs


def relative_error(actual, expected) -> float:
    worst = 0.0
    for a, e in zip(actual, expected):
        scale = max(float(np.abs(e).max()), 1e-6)
        worst = max(worst, float(np.abs(a.astype(np.float64) - e).max()) / scale)
    return worst


def test_fixture_set_is_complete_and_small():
    files = sorted(p.name for p in FIXTURES.glob("*.tflite"))
    assert files == NAMES
    assert sum((FIXTURES / n).stat().st_size for n in NAMES) < 8_000_000
    modes = {MANIFEST[n]["mode"] for n in NAMES}
    assert modes == {"fp32", "fp16", "dynamic", "int8", "int16x8"}


@pytest.mark.parametrize("name", NAMES)
def test_tensors_match_litert(name):
    data = load(name)
    g = read_model(data).main
    it = litert.Interpreter(model_content=data)
    details = {d["index"]: d for d in it.get_tensor_details()}
    assert len(g.tensors) == len(details)
    for t in g.tensors:
        d = details[t.index]
        assert d["name"] == t.name
        assert tuple(d["shape"]) == t.shape
        assert tuple(d["shape_signature"]) == (t.shape if t.shape_signature is None else t.shape_signature)
        assert np.dtype(d["dtype"]) == t.dtype.numpy, t.name
        qp = d["quantization_parameters"]
        if t.quantization is None:
            assert qp["scales"].size == 0, t.name
        else:
            np.testing.assert_array_equal(qp["scales"], t.quantization.scale)
            np.testing.assert_array_equal(qp["zero_points"], t.quantization.zero_point)
            assert qp["quantized_dimension"] == t.quantization.axis
    assert [t.index for t in g.inputs] == [d["index"] for d in it.get_input_details()]
    assert [t.index for t in g.outputs] == [d["index"] for d in it.get_output_details()]


@pytest.mark.parametrize("name", NAMES)
def test_ops_match_litert(name):
    data = load(name)
    g = read_model(data).main
    ops = litert.Interpreter(model_content=data)._get_ops_details()
    assert [op.opcode for op in g.ops] == [o["op_name"] for o in ops]
    for op, o in zip(g.ops, ops):
        assert [-1 if t is None else t.index for t in op.inputs] == list(o["inputs"])
        assert [t.index for t in op.outputs] == list(o["outputs"])


def test_quantized_fixtures_carry_per_channel_weights():
    for name in QUANTIZED:
        g = read_model(load(name)).main
        weights = [op.inputs[1] for op in g.ops if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")]
        assert weights and all(w.dtype.numpy == np.int8 for w in weights), name
        assert any(w.quantization.per_channel for w in weights), name
        activation = np.int16 if MANIFEST[name]["mode"] == "int16x8" else np.int8
        assert all(t.dtype.numpy == activation for t in g.inputs + g.outputs), name


def test_fp16_fixture_keeps_half_precision_weights():
    """fp16 weights reach the convolutions through DEQUANTIZE ops, as the converter lays them out."""
    for name in (n for n in NAMES if MANIFEST[n]["mode"] == "fp16"):
        g = read_model(load(name)).main
        convs = [op for op in g.ops if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")]
        assert convs
        for op in convs:
            producer = op.inputs[1].producer
            assert producer is not None and producer.opcode == "DEQUANTIZE", f"{name}: {op.describe()}"
            assert producer.inputs[0].dtype.numpy == np.float16 and producer.inputs[0].data is not None


def test_buffer_offset_fixture_reads_like_the_inline_one():
    """The converter stored every constant after the flatbuffer; the reader finds the same data there."""
    offset_name = next(n for n in NAMES if MANIFEST[n]["buffer_offset"])
    inline_name = offset_name.replace("_buffer_offset", "")
    data = load(offset_name)
    fb = FbModel.GetRootAs(data, 0)
    offsets = [fb.Buffers(i).Offset() for i in range(fb.BuffersLength())]
    offset_graph, inline_graph = read_model(data).main, read_model(load(inline_name)).main
    assert str(offset_graph) == str(inline_graph)
    constants = [(a, b) for a, b in zip(offset_graph.tensors, inline_graph.tensors) if b.data is not None]
    assert len(constants) > 10
    assert all(offsets[a.buffer] > 1 for a, _ in constants)  # only the metadata stays inline
    for a, b in constants:
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))


@pytest.mark.parametrize("external", [False, True], ids=["inline", "offset-buffers"])
@pytest.mark.parametrize("name", NAMES)
def test_round_trip_runs_identically(name, external):
    data = load(name)
    model = read_model(data)
    rewritten = assert_round_trip(data, external)
    inputs = random_inputs(model)
    if name in LITERT_REFUSES:
        for blob in (data, rewritten):
            with pytest.raises(RuntimeError, match=LITERT_REFUSES[name][0]):
                litert_run(blob, inputs)
        return
    for x, y in zip(litert_run(data, inputs), litert_run(rewritten, inputs)):
        np.testing.assert_array_equal(x, y)


def cpu_outputs(model, inputs) -> list[np.ndarray]:
    session = Session(model, RunSettings(backends=[("cpu", {"engine": "numpy"})]))
    assert {p.backend for p in session.plan.partitions} == {"cpu"}
    out = session.run(inputs)
    return [out[t.name] for t in session.graph.outputs]


@pytest.mark.parametrize("name", FLOAT)
def test_float_model_on_cpu_matches_litert(name):
    """Within 1e-4 of the output range of XNNPACK and of the builtin kernels, or, where those two
    disagree more, no further from either than they are from each other."""
    data = load(name)
    model = read_model(data)
    inputs = random_inputs(model)
    actual = cpu_outputs(model, inputs)
    references = {"xnnpack": litert_run(data, inputs), "builtin": litert_run(data, inputs, builtin=True)}
    bound = max(TOLERANCE, relative_error(references["xnnpack"], references["builtin"]))
    for label, reference in references.items():
        assert [a.shape for a in actual] == [r.shape for r in reference]
        error = relative_error(actual, reference)
        assert error <= bound, f"{name}: max error {error:.3g} of the output range vs {label} > {bound:.3g}"


@pytest.mark.parametrize("name", [n for n in QUANTIZED if n in RUNNABLE])
def test_quantized_model_on_cpu_matches_litert(name):
    """Within one quantization step of LiteRT's builtin (reference integer) kernels."""
    data = load(name)
    model = read_model(data)
    inputs = random_inputs(model)
    expected = litert_run(data, inputs, builtin=True)
    assert_close(cpu_outputs(model, inputs), expected, lsb=1)


@pytest.mark.parametrize("name", sorted(LITERT_REFUSES))
def test_cpu_refuses_what_litert_cannot_run(name):
    """The 16x8 converter emits int16 SQUARED_DIFFERENCE (from LayerNorm), which LiteRT has no kernel for;
    the CPU backend follows LiteRT and says so instead of inventing semantics."""
    data = load(name)
    model = read_model(data)
    with pytest.raises(RuntimeError, match=LITERT_REFUSES[name][0]):
        litert_run(data, random_inputs(model), builtin=True)
    with pytest.raises(DelegateError, match=LITERT_REFUSES[name][1]):
        cpu_outputs(model, random_inputs(model))


@pytest.mark.parametrize("name", RUNNABLE)
def test_outputs_depend_on_the_input(name):
    """Random weights must not give a saturated output that hardly moves with the input, or the
    comparisons above prove little: two inputs move it by far more than the tolerances."""
    data = load(name)
    model = read_model(data)
    first = litert_run(data, random_inputs(model, seed=1), builtin=True)
    second = litert_run(data, random_inputs(model, seed=2), builtin=True)
    for a, b in zip(first, second):
        change = np.abs(a.astype(np.float64) - b).max()
        if a.dtype.kind == "f":
            assert change >= 1e-2 * np.abs(a).max(), f"{name}: output moved {change:.3g}"
        else:
            assert change >= 2, f"{name}: output moved {change:.0f} LSB"


def test_integer_lstm_fixture_is_exact_over_invokes():
    """The converter's int8 LSTM bit-exact against LiteRT's builtin kernels, the states carried over
    three invokes."""
    from tests.ops.test_lstm import check_stateful
    data = load("lstm_sequence_int8.tflite")
    model = read_model(data)
    check_stateful(data, [random_inputs(model, seed)[0] for seed in range(3)])
