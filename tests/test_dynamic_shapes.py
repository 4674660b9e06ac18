"""Models whose input is [-1, -1] and whose shapes are computed in the graph (SHAPE, sliced and
multiplied, FILL, BROADCAST_TO, RESHAPE to a computed shape), resized and run on both CPU
engines against LiteRT, with allocation after each resize."""

from pathlib import Path

import numpy as np
import pytest

import delegate
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


def squeeze_excite_model() -> bytes:
    """x [-1, 4, 4, 8]: x * RESHAPE(MEAN(x), PACK(SHAPE(x)[0], 1, 1, 8)): a converter's squeeze-and-excite block
    where the source graph read the batch size at run time."""
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 8), shape_signature=(-1, 4, 4, 8))
    mean = b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": False}, shape=(1, 8))
    shape = b.op("SHAPE", [x], dtype="int32", shape=(4,), options={"out_type": 2})
    batch = b.op("STRIDED_SLICE", [shape, b.const("b", np.array([0], np.int32)), b.const("e", np.array([1], np.int32)),
                                   b.const("s", np.array([1], np.int32))],
                 options={"shrink_axis_mask": 1}, dtype="int32", shape=())
    ones = [b.const(f"d{i}", np.array(v, np.int32)) for i, v in enumerate((1, 1, 8))]
    target = b.op("PACK", [batch, *ones], options={"axis": 0, "values_count": 4}, dtype="int32", shape=(4,))
    gate = b.op("RESHAPE", [mean, target], shape=(1, 1, 1, 8))
    b.output(b.op("MUL", [x, gate], shape=(1, 4, 4, 8)))
    return b.to_bytes()


@pytest.mark.parametrize("backend", ["opencl", "wgpu"])
def test_static_shape_arithmetic_stays_on_the_gpu_and_follows_a_resize(backend):
    """Shape arithmetic on static shapes is computed when a GPU partition is compiled, so the plan is one GPU
    partition (before, SHAPE -> STRIDED_SLICE -> PACK went to the CPU: three partitions and their copies); an
    input resized makes a new plan with the new values, against LiteRT."""
    from tests.oputil import require_backend

    require_backend(backend)
    data = squeeze_excite_model()
    config = load_config(CONFIG, overrides=[f"backends=[{backend}, cpu]", "partitioner=greedy", "precision=fp32",
                                            "placement.search=estimate", "placement.host_first=false"])
    ours = Interpreter(model_content=data, config=config)
    theirs = litert.Interpreter(model_content=data)
    rng = np.random.default_rng(0)
    for batch in (1, 3, 2):
        x = rng.standard_normal((batch, 4, 4, 8)).astype(np.float32)
        results = []
        for it in (ours, theirs):
            index = it.get_input_details()[0]["index"]
            it.resize_tensor_input(index, x.shape)
            it.allocate_tensors()
            it.set_tensor(index, x)
            it.invoke()
            results.append(it.get_tensor(it.get_output_details()[0]["index"]))
        np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)
        assert results[0].shape == (batch, 4, 4, 8)
        plan = ours._sessions[0].plan
        assert [p.backend for p in plan.partitions] == [backend] and len(plan.partitions[0].ops) == 6


@pytest.mark.parametrize("backend", ["opencl", "wgpu"])
def test_static_shape_arithmetic_follows_a_reader_pinned_elsewhere(backend):
    """With its RESHAPE pinned to the CPU, the shape arithmetic goes to the CPU with it: a GPU partition computes
    no value for it (it gave the CPU's RESHAPE zeros for its shape), and compiling one that would is an error."""
    from delegate.errors import CompileError
    from delegate.gpu.fusion import plan_groups
    from tests.oputil import litert_run, require_backend

    require_backend(backend)
    data = squeeze_excite_model()
    session = delegate.load(data, backends=f"[{backend}, cpu]", partitioner="greedy", pin=[{"op": "RESHAPE", "backend": "cpu"}],
                            **{"placement.search": "estimate", "placement.host_first": False, "precision": "fp32"})
    on_gpu = [op.opcode for p in session.plan.partitions if p.backend == backend for op in p.ops]
    assert on_gpu == ["MEAN", "MUL"]
    x = np.random.default_rng(1).standard_normal((1, 4, 4, 8)).astype(np.float32)
    np.testing.assert_allclose(list(session.run([x]).values())[0], litert_run(data, [x])[0], rtol=1e-5, atol=1e-6)
    graph = read_model(data).main
    pack = next(op for op in graph.ops if op.opcode == "PACK")
    with pytest.raises(CompileError, match="partition output"):
        plan_groups(graph.ops, {pack.outputs[0].index})
