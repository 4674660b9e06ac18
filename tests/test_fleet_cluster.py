"""Fleet sweeps on a Ray cluster of two nodes (a head and a second raylet on this machine): one task per node,
pinned to it, a node's failure a row of the table, and ``executor: ray`` in the config asking for the sweep."""

import logging

import numpy as np
import pytest

from tests.test_datasets import fleet_json
from delegate.errors import DelegateError
from delegate.tflite.builder import GraphBuilder

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.ERROR)
    yield [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    ray.shutdown()
    cluster.shutdown()


def _where_am_i(tag: str) -> dict:
    return {"tag": tag, "node_id": ray.get_runtime_context().get_node_id()}


def _fails_on(node_id: str) -> str:
    here = ray.get_runtime_context().get_node_id()
    if here == node_id:
        raise DelegateError("this node cannot measure")
    return here


def test_one_task_runs_on_each_node(two_nodes):
    from delegate.fleet import on_every_node

    entries = on_every_node(_where_am_i, ("x",))
    assert len(two_nodes) == 2 and sorted(e["node_id"] for e in entries) == sorted(two_nodes)
    for entry in entries:  # each task ran on the node its row names
        assert entry["result"] == {"tag": "x", "node_id": entry["node_id"]}


def test_a_failing_node_is_a_row_and_the_others_report(two_nodes):
    from delegate.fleet import failure, on_every_node

    bad, good = two_nodes
    entries = {e["node_id"]: e for e in on_every_node(_fails_on, (bad,))}
    assert entries[good]["result"] == good and "result" not in entries[bad]
    assert entries[bad]["error"] == {"kind": "DelegateError", "message": "this node cannot measure"}
    error = failure(list(entries.values()))
    assert isinstance(error, DelegateError) and "this node cannot measure" in str(error)


@pytest.fixture
def ray_config(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("executor: ray\nbackends: [{name: cpu, options: {engine: numpy}}]\n")
    return str(path)


@pytest.fixture
def tiny_model(tmp_path):
    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 4))
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 4)).astype(np.float32)
    b.output(b.op("CONV_2D", [x, b.const("w", w), b.const("b", np.zeros(4, np.float32))],
                  options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"}))
    path = tmp_path / "conv.tflite"
    path.write_bytes(b.to_bytes())
    return str(path)


def test_executor_ray_in_the_config_calibrates_every_node(two_nodes, ray_config, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DELEGATE_PROFILE_DIR", str(tmp_path / "here"))
    code, doc = fleet_json(capsys, ["calibrate", "--config", ray_config])
    assert code == 0, doc
    assert sorted(n["node_id"] for n in doc["nodes"]) == sorted(two_nodes)
    rows = doc["profiles"]
    assert sorted(r["node_id"] for r in rows) == sorted(two_nodes)  # each node measured its own CPU
    assert len({r["fingerprint"] for r in rows}) == 1  # the same machine: one device, stored once here
    assert all(r["backend"] == "cpu" and r["gflops"] > 0 and r["node_profile"] != r["profile"] for r in rows)


def test_executor_ray_in_the_config_runs_the_suite_on_every_node(two_nodes, ray_config, tiny_model, tmp_path,
                                                                 capsys):
    code, doc = fleet_json(capsys, ["bench", "--suite", "--config", ray_config, "--models", tiny_model,
                                   "--configs", "cpu-numpy", "--runs", "2", "--threads", "1",
                                   "--out", str(tmp_path / "suite")])
    assert code == 0, doc
    ours = [r for r in doc["rows"] if r["config"] == "cpu-numpy"]
    assert sorted(r["node_id"] for r in ours) == sorted(two_nodes)
    assert all(r["status"] == "ok" and r["p50_ms"] > 0 and r["max_error"] < 1e-4 for r in ours), [(r["status"], r["p50_ms"], r["max_error"]) for r in ours]
    assert len([f for f in doc["files"] if f.endswith("suite.md")]) == 2  # one report per node
