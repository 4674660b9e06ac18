"""Session inputs at run time: wrong dtype, shape, names, missing inputs, NaN/Inf propagation."""

import numpy as np
import pytest

import delegate
from delegate.errors import ExecutionError
from delegate.tflite.builder import GraphBuilder


@pytest.fixture(scope="module")
def session():
    b = GraphBuilder()
    x = b.input("x", (1, 4))
    y = b.input("y", (1, 4))
    b.output(b.op("ADD", [x, y], options={"fused_activation_function": "RELU"}, name="sum"))
    return delegate.load(b.build(), "configs/cpu.yaml")


def test_inputs_by_name_position_and_index(session):
    x, y = np.ones((1, 4), np.float32), np.full((1, 4), 2, np.float32)
    expected = np.full((1, 4), 3, np.float32)
    for inputs in ({"x": x, "y": y}, {"input_0": x, "input_1": y}, [x, y], {0: x, 1: y}):
        np.testing.assert_array_equal(session.run(inputs)["sum"], expected)


@pytest.mark.parametrize("inputs, words", [
    ({"x": np.ones((1, 4), np.float32)}, "missing input"),
    ({"x": np.ones((1, 4), np.float32), "z": np.ones((1, 4), np.float32)}, "unknown input 'z'"),
    ([np.ones((1, 4), np.float32)], "2 input(s) but 1"),
    ({"x": np.ones((2, 4), np.float32), "y": np.ones((1, 4), np.float32)}, "expects shape [1, 4]"),
    ({"x": np.array([["a"] * 4]), "y": np.ones((1, 4), np.float32)}, "expects float32"),
])
def test_bad_inputs_are_clear_errors(session, inputs, words):
    with pytest.raises(ExecutionError) as info:
        session.run(inputs)
    assert words in str(info.value)


def test_nan_and_inf_propagate_as_in_ieee_arithmetic(session):
    x = np.array([[np.nan, np.inf, -np.inf, 1.0]], np.float32)
    out = session.run({"x": x, "y": np.zeros((1, 4), np.float32)})["sum"]
    assert np.isnan(out[0, 0]) and out[0, 1] == np.inf and out[0, 2] == 0 and out[0, 3] == 1
