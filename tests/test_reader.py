"""The reader against LiteRT's own view of real models, and read -> write -> read round trips."""

import numpy as np
import pytest

from delegate import read_model
from delegate.tflite.builder import GraphBuilder
from delegate.tflite.writer import write_model
from tests.mediapipe import NEEDS_MEDIAPIPE_OPS, mediapipe_models
from tests.oputil import assert_round_trip, litert, litert_run

MODELS = mediapipe_models()


def test_all_fourteen_models_present():
    assert len(MODELS) == 14


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tensors_match_litert(name):
    data = MODELS[name].read_bytes()
    model = read_model(data)
    it = litert.Interpreter(model_content=data)
    details = {d["index"]: d for d in it.get_tensor_details()}
    g = model.main
    assert len(g.tensors) == len(details)
    for t in g.tensors:
        d = details[t.index]
        assert d["name"] == t.name
        assert tuple(d["shape"]) == t.shape
        if t.dtype.numpy is not None:
            assert np.dtype(d["dtype"]) == t.dtype.numpy
        qp = d["quantization_parameters"]
        if t.quantization is None:
            assert qp["scales"].size == 0
        else:
            np.testing.assert_array_equal(qp["scales"], t.quantization.scale)
            np.testing.assert_array_equal(qp["zero_points"], t.quantization.zero_point)
            assert qp["quantized_dimension"] == t.quantization.axis
    assert [t.index for t in g.inputs] == [d["index"] for d in it.get_input_details()]
    assert [t.index for t in g.outputs] == [d["index"] for d in it.get_output_details()]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_ops_match_litert(name):
    data = MODELS[name].read_bytes()
    model = read_model(data)
    it = litert.Interpreter(model_content=data)
    ops = it._get_ops_details()
    assert [op.opcode for op in model.main.ops] == [o["op_name"] for o in ops]
    for op, o in zip(model.main.ops, ops):
        assert [-1 if t is None else t.index for t in op.inputs] == list(o["inputs"])
        assert [t.index for t in op.outputs] == list(o["outputs"])


@pytest.mark.parametrize("external", [False, True], ids=["inline", "offset-buffers"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_round_trip_runs_identically(name, external):
    data = MODELS[name].read_bytes()
    model = read_model(data)
    rewritten = assert_round_trip(data, external)
    if name in NEEDS_MEDIAPIPE_OPS:
        return
    rng = np.random.default_rng(0)
    inputs = [rng.random(t.shape).astype(t.dtype.numpy) for t in model.main.inputs]
    for x, y in zip(litert_run(data, inputs), litert_run(rewritten, inputs)):
        np.testing.assert_array_equal(x, y)


def test_sparse_models_keep_sparsity():
    model = read_model(MODELS["face_detection_full_range_sparse.tflite"].read_bytes())
    sparse = [t for t in model.main.tensors if t.sparsity is not None]
    assert sparse and all(t.uses and t.uses[0].opcode == "DENSIFY" for t in sparse)


def test_custom_op_and_options_decoded():
    model = read_model(MODELS["selfie_segmentation.tflite"].read_bytes())
    custom = [op for op in model.main.ops if op.custom]
    assert custom and custom[0].opcode == "Convolution2DTransposeBias" and custom[0].custom_options
    conv = next(op for op in model.main.ops if op.opcode == "CONV_2D")
    assert conv.options["padding"] in ("SAME", "VALID")
    assert conv.options["fused_activation_function"] in ("NONE", "RELU", "RELU6")


def test_quantized_and_dynamic_tensors_round_trip():
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 2), "int8", quant=(0.05, -3), shape_signature=(-1, 4, 4, 2))
    w = b.const("w", np.arange(16, dtype=np.int8).reshape(2, 2, 2, 2), quant=([0.1, 0.2], [0, 0], 0))
    bias = b.const("bias", np.array([1, -1], np.int32), quant=([0.005, 0.01], [0, 0], 0))
    b.output(b.op("CONV_2D", [x, w, bias], options={"padding": "VALID", "stride_w": 1, "stride_h": 1},
                  quant=(0.1, 2)))
    model = read_model(b.to_bytes())
    g = model.main
    assert g.inputs[0].shape_signature == (-1, 4, 4, 2) and g.inputs[0].is_dynamic
    assert g.tensors[1].quantization.per_channel and g.tensors[1].quantization.axis == 0
    assert g.outputs[0].shape == (1, 3, 3, 2)
    assert str(read_model(write_model(model))) == str(model)
    assert "x" in litert.Interpreter(model_content=b.to_bytes()).get_signature_list()["serving_default"]["inputs"]
