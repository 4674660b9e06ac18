"""The CPU backend's LiteRT engine: a whole model as read goes to LiteRT as its own bytes, anything
else (a part of it, a graph changed since) written out; both give LiteRT's outputs."""

import numpy as np
import pytest

from delegate import CompileOptions, read_model, zoo
from delegate.partition import make_partition
from delegate.plugins import default_manager
from delegate.runtime import Executor
from tests.oputil import litert_run

pytest.importorskip("ai_edge_litert.interpreter")


def _compile(graph, ops):
    backend = default_manager().backend_info("cpu").factory({"engine": "litert"})
    return Executor(graph, [make_partition(graph, ops, "cpu", 0)], {"cpu": backend}, CompileOptions())


def test_whole_model_goes_as_read_and_parts_are_written():
    data = zoo.mobilenet_v1(alpha=0.25, size=96)
    graph = read_model(data).main
    x = np.random.default_rng(0).standard_normal(graph.inputs[0].shape).astype(np.float32)
    whole = _compile(graph, graph.ops)
    assert whole.compiled[0].describe() == {"engine": "litert", "model": "as read"}
    out = whole.run({graph.inputs[0].index: x})[graph.outputs[0].index]
    np.testing.assert_array_equal(out, litert_run(data, [x])[0])
    part = _compile(graph, graph.ops[:5])
    assert part.compiled[0].describe()["model"] == "written"


def test_graph_changed_since_it_was_read_is_written():
    data = zoo.mobilenet_v1(alpha=0.25, size=96)
    graph = read_model(data).main
    graph.serialized = (graph.serialized[0], graph.serialized[1] + 1)  # as if an op had been added or removed
    assert _compile(graph, graph.ops).compiled[0].describe()["model"] == "written"
