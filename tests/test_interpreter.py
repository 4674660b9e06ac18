"""delegate.interpreter.Interpreter behaves like ai_edge_litert's: same details, same outputs."""

import threading

import numpy as np
import pytest

from delegate.errors import ExecutionError
from delegate.interpreter import Interpreter
from delegate.tflite.builder import GraphBuilder
from tests.mediapipe import mediapipe_models
from tests.models import conv_then_relu
from tests.oputil import litert

CPU = "configs/cpu.yaml"


def dynamic_model():
    b = GraphBuilder()
    x = b.input("x", (1, 4), shape_signature=(-1, 4))
    y = b.op("FULLY_CONNECTED", [x, b.const("w", np.arange(12, dtype=np.float32).reshape(3, 4) / 10)],
             options={"fused_activation_function": "RELU"})
    b.output(b.op("SOFTMAX", [y], options={"beta": 1.0}))
    return b.to_bytes()


def same_details(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        for key in ("name", "index", "dtype", "quantization"):
            assert a[key] == b[key], key
        for key in ("shape", "shape_signature"):
            np.testing.assert_array_equal(a[key], b[key])
        for key in ("scales", "zero_points"):
            np.testing.assert_array_equal(a["quantization_parameters"][key], b["quantization_parameters"][key])


@pytest.mark.parametrize("name", ["hand_recrop.tflite", "selfie_segmentation.tflite"])
def test_same_details_and_outputs_as_litert(name):
    path = str(mediapipe_models()[name])
    ours, theirs = Interpreter(model_path=path, config=CPU), litert.Interpreter(model_path=path)
    ours.allocate_tensors()
    theirs.allocate_tensors()
    same_details(ours.get_input_details(), theirs.get_input_details())
    same_details(ours.get_output_details(), theirs.get_output_details())
    x = np.random.default_rng(0).random(ours.get_input_details()[0]["shape"]).astype(np.float32)
    for it in (ours, theirs):
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
    for a, b in zip(ours.get_output_details(), theirs.get_output_details()):
        np.testing.assert_allclose(ours.get_tensor(a["index"]), theirs.get_tensor(b["index"]), atol=2e-4)


def test_quantized_details():
    b = GraphBuilder()
    x = b.input("x", (1, 3), "int8", quant=(0.5, -2))
    b.output(b.op("DEQUANTIZE", [x], dtype="float32"))
    data = b.to_bytes()
    same_details(Interpreter(model_content=data).get_input_details(),
                 litert.Interpreter(model_content=data).get_input_details())


def test_signature_runner_and_resize():
    data = dynamic_model()
    ours, theirs = Interpreter(model_content=data, config=CPU), litert.Interpreter(model_content=data)
    assert ours.get_signature_list() == theirs.get_signature_list()
    for it in (ours, theirs):
        it.resize_tensor_input(it.get_input_details()[0]["index"], [3, 4])
        it.allocate_tensors()
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    a = ours.get_signature_runner("serving_default")(x=x)
    b = theirs.get_signature_runner("serving_default")(x=x)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5)
    same_details(ours.get_output_details(), theirs.get_output_details())


def test_misuse_is_a_clear_error():
    it = Interpreter(model_content=dynamic_model(), config=CPU)
    with pytest.raises(ExecutionError, match="allocate_tensors"):
        it.invoke()
    it.allocate_tensors()
    index = it.get_input_details()[0]["index"]
    with pytest.raises(ExecutionError, match="shape"):
        it.set_tensor(index, np.zeros((2, 4), np.float32))
    with pytest.raises(ExecutionError, match="expected float32"):
        it.set_tensor(index, np.array([["a"] * 4]))


def test_one_interpreter_two_threads_refused_or_correct():
    it = Interpreter(model_content=dynamic_model(), config=CPU)
    it.allocate_tensors()
    index = it.get_input_details()[0]["index"]
    it.set_tensor(index, np.ones((1, 4), np.float32))
    it.invoke()
    expected = it.get_tensor(it.get_output_details()[0]["index"])
    errors, results = [], []

    def worker():
        for _ in range(200):
            try:
                it.invoke()
                results.append(it.get_tensor(it.get_output_details()[0]["index"]))
            except ExecutionError as exc:
                errors.append(str(exc))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all("another thread" in e for e in errors)
    for r in results:
        np.testing.assert_array_equal(r, expected)


def test_outputs_a_run_made_for_itself_become_the_output_buffers():
    """LiteRT's engine copies each output out of its interpreter for that run alone: the Interpreter keeps
    that array as its output buffer, not a second copy of it.  Run after run the values are LiteRT's,
    get_tensor still hands out copies, and a view held across invoke is still refused."""
    rng = np.random.default_rng(8)
    data = conv_then_relu(rng)
    ours, theirs = Interpreter(model_content=data, config=CPU), litert.Interpreter(model_content=data)
    for it in (ours, theirs):
        it.allocate_tensors()
    i, o = ours.get_input_details()[0]["index"], ours.get_output_details()[0]["index"]
    buffers = []
    for _ in range(3):
        value = rng.standard_normal((1, 6, 5, 3)).astype(np.float32)
        for it in (ours, theirs):
            it.set_tensor(i, value)
            it.invoke()
        got = ours.get_tensor(o)
        np.testing.assert_allclose(got, theirs.get_tensor(o), rtol=1e-5, atol=1e-5)
        got += 1  # a copy: the buffer is untouched
        np.testing.assert_allclose(ours.get_tensor(o), theirs.get_tensor(o), rtol=1e-5, atol=1e-5)
        buffers.append(id(ours.tensor(o)().base))
    assert len(set(buffers)) > 1  # each run's own array taken, not copied into one kept buffer
    held = ours.tensor(o)()
    with pytest.raises(ExecutionError, match="at least 1 reference"):
        ours.invoke()
    del held
    ours.invoke()


def test_input_buffers_start_on_a_cache_line():
    """An input buffer starts on a 64-byte line, as LiteRT's tensors do (kernels read it in place, and a vector
    read across two lines costs two loads), and views of it still make invoke unsafe, as LiteRT's rule says."""
    b = GraphBuilder()
    x = b.input("x", (1, 5, 5, 24))
    b.output(b.op("RELU", [x]))
    for config in (CPU, None):
        it = Interpreter(model_content=b.to_bytes(), config=config)
        it.allocate_tensors()
        i = it.get_input_details()[0]["index"]
        it.set_tensor(i, np.full((1, 5, 5, 24), -1.0, np.float32))
        assert it.tensor(i)().ctypes.data % 64 == 0
        held = it.tensor(i)()[0, :2]
        assert not it._safe_to_run()
        with pytest.raises(ExecutionError, match="at least 1 reference"):
            it.invoke()
        del held
        it.invoke()
        np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), 0.0)
