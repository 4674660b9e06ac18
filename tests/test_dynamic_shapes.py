"""Models whose input is [-1, -1] and whose shapes are computed in the graph (SHAPE, sliced and
multiplied, FILL, BROADCAST_TO, RESHAPE to a computed shape), resized and run on both CPU
engines against LiteRT, with allocation after each resize."""

from pathlib import Path

import numpy as np
import pytest

from delegate import Interpreter, read_model
from delegate.config import load_config
from delegate.shapes import propagate
from delegate.tflite.builder import GraphBuilder
from delegate.validate import validate_graph
from tests.oputil import litert

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "cpu.yaml"


def shape_arithmetic_model() -> bytes:
    """x [-1, -1]: (x + FILL(shape(x), 2) * BROADCAST_TO(3, shape(x)), RESHAPE(x, [rows * cols]))."""
    b = GraphBuilder()
    x = b.input("x", (1, 1), shape_signature=(-1, -1))
    shape = b.op("SHAPE", [x], dtype="int32", shape=(2,), options={"out_type": 2})

    def dim(i):
        return b.op("STRIDED_SLICE", [shape, b.const(f"b{i}", np.array([i], np.int32)),
                                      b.const(f"e{i}", np.array([i + 1], np.int32)),
                                      b.const(f"s{i}", np.array([1], np.int32))],
                    options={"shrink_axis_mask": 1}, dtype="int32", shape=())
    size = b.op("MUL", [dim(0), dim(1)], dtype="int32", shape=())
    flat = b.op("PACK", [size], options={"axis": 0, "values_count": 1}, dtype="int32", shape=(1,))
    two = b.tensor("two", (), "float32", data=np.array(2.0, np.float32))
    filled = b.op("FILL", [shape, two], dtype="float32", shape=(1, 1))
    spread = b.op("BROADCAST_TO", [b.const("three", np.array([3.0], np.float32)), shape], dtype="float32",
                  shape=(1, 1), version=2)
    b.output(b.op("ADD", [x, b.op("MUL", [filled, spread], shape=(1, 1))], shape=(1, 1)),
             b.op("RESHAPE", [x, flat], dtype="float32", shape=(1,)))
    return b.to_bytes()


@pytest.mark.parametrize("engine", ["numpy", "litert"])
def test_resized_runs_match_litert(engine):
    data = shape_arithmetic_model()
    ours = Interpreter(model_content=data, config=load_config(CONFIG, overrides=[f"cpu.engine={engine}"]))
    theirs = litert.Interpreter(model_content=data)
    rng = np.random.default_rng(0)
    for shape in [(2, 3), (4, 5), (1, 7), (2, 3)]:
        x = rng.standard_normal(shape).astype(np.float32)
        results = []
        for it in (ours, theirs):
            index = it.get_input_details()[0]["index"]
            it.resize_tensor_input(index, shape)
            it.allocate_tensors()
            it.set_tensor(index, x)
            it.invoke()
            results.append([it.get_tensor(d["index"]) for d in it.get_output_details()])
            assert [tuple(d["shape"]) for d in it.get_output_details()] == [shape, (x.size,)]
        for a, b in zip(*results):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(results[0][0], x + 6)


def test_declared_shapes_follow_from_the_input():
    """Validation recomputes the file's placeholder shapes through the shape arithmetic."""
    graph = read_model(shape_arithmetic_model()).main
    graph.inputs[0].shape = (3, 4)
    propagate(graph)
    assert [t.shape for t in graph.outputs] == [(3, 4), (12,)]
    validate_graph(graph)
