"""``delegate eval`` and ``delegate map`` over datasets: in-process against LiteRT, and on a local Ray."""

import json
import sys

import numpy as np
import pytest
from PIL import Image

from delegate.batchmap import batch_map, read_outputs
from delegate.cli import main
from delegate.config import load_config
from delegate.errors import DatasetError
from delegate.evaluate import evaluate, sample_metrics, summarize
from delegate.executor import INSTALL_RAY, RayOptions
from delegate.inputs import load_image
from delegate.tflite.builder import GraphBuilder
from delegate.tflite.reader import read_model
from delegate.tools.reference import litert_cpu

CLASSES = 16
SAMPLES = 22  # not a multiple of the batches below: the last batch is short


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A classifier that batches: conv, flatten (-1), fully connected, softmax."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("image", (1, 8, 8, 3))
    y = b.op("CONV_2D", [x, b.const("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
                         b.const("b", np.zeros(4, np.float32))],
             options={"padding": "SAME", "stride_w": 2, "stride_h": 2, "fused_activation_function": "RELU"})
    y = b.op("RESHAPE", [y, b.const("shape", np.array([-1, 64], np.int32))], options={"new_shape": [-1, 64]})
    y = b.op("FULLY_CONNECTED", [y, b.const("fc", rng.standard_normal((CLASSES, 64)).astype(np.float32)),
                                 b.const("fb", np.zeros(CLASSES, np.float32))])
    b.output(b.op("SOFTMAX", [y], options={"beta": 1.0}, name="scores"))
    path = tmp_path_factory.mktemp("model") / "classifier.tflite"
    path.write_bytes(b.to_bytes())
    return str(path)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1)
    for i in range(SAMPLES):
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(root / f"img{i:02d}.png")
    return root


@pytest.fixture(scope="module")
def config():
    return load_config("configs/cpu.yaml")


def _litert_outputs(model, images, config):
    """Each image through LiteRT's interpreter at batch 1: the expectation, computed apart from eval and map."""
    t = read_model(open(model, "rb").read()).main.inputs[0]
    run = litert_cpu(open(model, "rb").read())
    return {p.name: run([load_image(p, t, dict(config.input))])[0] for p in sorted(images.iterdir())}


def test_eval_agrees_with_litert_per_sample(model, images, config, tmp_path):
    doc, rows = evaluate(model, str(images), config, ["cpu-numpy", "cpu-litert"], batch=4)
    assert doc["samples"] == SAMPLES and doc["batch"] == 4 and not doc["notes"]
    assert len(rows["id"]) == SAMPLES * 2
    litert = doc["configs"]["cpu-litert"]["outputs"]["scores"]
    assert litert["max_abs_error"]["max"] == 0.0 and litert["top1"] == litert["top5"] == 1.0  # LiteRT vs itself
    numpy_rows = rows["config"] == "cpu-numpy"
    assert list(rows["id"][numpy_rows]) == sorted(p.name for p in images.iterdir())
    assert rows["max_rel_error"][numpy_rows].max() < 1e-5 and (rows["top1"][numpy_rows] == 1.0).all()
    # the reported error is the one computed by hand against LiteRT at batch 1
    from delegate.session import Session
    from delegate.suite import CONFIGS
    session = Session(read_model(open(model, "rb").read()), CONFIGS[0].settings(1, None, "sustained_speed"))
    expected = _litert_outputs(model, images, config)
    t = session.graph.inputs[0]
    for j, sample in enumerate(rows["id"][numpy_rows][:3]):
        ours = session.run([load_image(images / sample, t, dict(config.input))])["scores"]
        assert rows["max_abs_error"][numpy_rows][j] == pytest.approx(float(np.abs(ours - expected[sample]).max()),
                                                                     abs=1e-7)


def test_eval_reports_and_reference_configuration(model, images, config, tmp_path):
    assert main(["eval", model, str(images), "--config", "configs/cpu.yaml", "--configs", "cpu-numpy,cpu-litert",
                 "--reference", "cpu-litert", "--out", str(tmp_path), "--json", "--worst", "2"]) == 0
    doc = json.loads((tmp_path / "eval.json").read_text())
    assert doc["reference"] == "cpu-litert" and list(doc["configs"]) == ["cpu-numpy"]
    assert doc["configs"]["cpu-numpy"]["backends"] == "cpu"
    assert len(doc["configs"]["cpu-numpy"]["worst"]) == 2
    worst = doc["configs"]["cpu-numpy"]["worst"][0]
    lines = (tmp_path / "eval.csv").read_text().splitlines()
    assert len(lines) == 1 + SAMPLES and lines[0].startswith("id,config,backends,output,max_abs_error")
    assert max(float(line.split(",")[6]) for line in lines[1:]) == pytest.approx(worst["max_rel_error"])
    try:
        import matplotlib  # noqa: F401  (the PNG is drawn when it is installed)
    except ImportError:
        assert not (tmp_path / "eval.png").exists()
    else:
        assert (tmp_path / "eval.png").stat().st_size > 0


def test_metrics_of_classifier_and_detector_outputs():
    ref = np.array([[0.1, 0.5, 0.2, 0.05, 0.05, 0.02, 0.02, 0.02, 0.02, 0.01, 0.01]])
    swapped = ref.copy()
    swapped[0, [1, 2]] = swapped[0, [2, 1]]
    m = sample_metrics(swapped, ref)
    assert m["top1"] == 0.0 and m["top5"] == 1.0
    assert m["max_abs_error"] == pytest.approx(0.3) and m["max_rel_error"] == pytest.approx(0.6)
    assert m["mean_abs_error"] == pytest.approx(0.6 / 11) and m["cosine"] < 1.0
    from delegate.evaluate import _top_box
    detector = {"boxes": "b", "classes": "c", "scores": "s"}
    expected = {"b": np.array([[[0, 0, 1, 1], [0, 0, 0.5, 0.5]]]), "c": np.array([[3.0, 4.0]]),
                "s": np.array([[0.9, 0.2]])}
    shifted = dict(expected, b=expected["b"] + np.array([0.05, 0, 0.05, 0]))
    assert _top_box(shifted, expected, detector, 0)["top_box"] == 1.0
    other_class = dict(expected, c=np.array([[5.0, 4.0]]))
    assert _top_box(other_class, expected, detector, 0)["top_box"] == 0.0
    far = dict(expected, b=expected["b"] + 0.8)
    assert _top_box(far, expected, detector, 0)["top_box"] == 0.0
    rows = {"id": np.array(["a", "b"], object), "config": np.array(["x", "x"], object),
            "backends": np.array(["cpu", "cpu"], object),
            "output": np.array(["o", "o"], object), "max_abs_error": np.array([1.0, 3.0]),
            "mean_abs_error": np.array([1.0, 1.0]), "max_rel_error": np.array([0.1, 0.3]),
            "mean_rel_error": np.array([0.1, 0.1]), "cosine": np.array([0.9, 0.5]),
            "top1": np.array([1.0, 0.0]), "top5": np.array([1.0, 1.0]), "top_box": np.array([np.nan, np.nan])}
    summary = summarize(rows, worst=1)["x"]
    assert summary["outputs"]["o"]["top1"] == 0.5 and "top_box" not in summary["outputs"]["o"]
    assert summary["outputs"]["o"]["cosine"]["min"] == 0.5 and summary["outputs"]["o"]["max_rel_error"]["max"] == 0.3
    assert summary["worst"] == [{"id": "b", "output": "o", "max_rel_error": 0.3, "max_abs_error": 3.0, "cosine": 0.5}]


def test_map_batches_outputs_into_shards(model, images, config, tmp_path):
    summary = batch_map(model, str(images), config, tmp_path / "out", batch=4, threads=1, shard_size=10)
    assert summary["samples"] == SAMPLES and summary["batch"] == 4 and summary["complete"]
    assert summary["files"] == ["part-00000.npz", "part-00001.npz", "part-00002.npz"]
    outputs = read_outputs(tmp_path / "out")
    expected = _litert_outputs(model, images, config)
    assert list(outputs["id"]) == list(expected)
    np.testing.assert_allclose(outputs["scores"], np.concatenate(list(expected.values())), rtol=1e-5, atol=1e-7)


def test_throughput_tells_work_from_the_gaps_between_calls():
    from delegate.executor import CALL, WORKER, Throughput
    clock = Throughput(rows_per_sample=2)
    # worker a: two calls of 1 s, 0.1 s apart; worker b: one call (start-up only, no gap); 2 rows per sample
    for worker, start, end, rows in [("a", 0.0, 1.0, 8), ("b", 0.2, 1.2, 8), ("a", 1.1, 2.1, 4)]:
        out = clock.take({"id": np.zeros(rows), WORKER: np.full(rows, worker, object),
                          CALL: np.tile([start, end], (rows, 1))})
        assert list(out) == ["id"]
    t = clock.report()
    assert (t["workers"], t["batches"], t["samples_per_batch"]) == (2, 3, 4)
    assert t["work_s"] == 3.0 and t["work_ms_per_batch"] == 1000.0 and t["overhead_ms_per_batch"] == 100.0
    assert t["overhead_share"] == pytest.approx(0.1)
    assert t["steady_samples_per_s"] == pytest.approx(6 / 2.1 + 4 / 1.0, abs=0.01)


def test_batches_of_a_model_that_runs_one_sample(tmp_path, images, config):
    """A model whose batch dimension is fixed still takes --batch samples per worker call, one run each."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input("image", (1, 8, 8, 3))
    y = b.op("RESHAPE", [x, b.const("shape", np.array([1, 192], np.int32))], options={"new_shape": [1, 192]})
    b.output(b.op("FULLY_CONNECTED", [y, b.const("fc", rng.standard_normal((CLASSES, 192)).astype(np.float32)),
                                      b.const("fb", np.zeros(CLASSES, np.float32))], name="scores"))
    fixed = tmp_path / "fixed.tflite"
    fixed.write_bytes(b.to_bytes())
    summary = batch_map(str(fixed), str(images), config, tmp_path / "out", batch=8)
    assert summary["batch"] == 1 and "one sample per run" in summary["notes"][0]
    assert (summary["throughput"]["batches"], summary["throughput"]["samples_per_batch"]) == (3, 8)
    expected = _litert_outputs(str(fixed), images, config)
    np.testing.assert_allclose(read_outputs(tmp_path / "out")["scores"], np.concatenate(list(expected.values())),
                               rtol=1e-5, atol=1e-6)


def test_map_never_overwrites_files_it_did_not_write(model, images, config, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["map", model, str(images), "--config", "configs/cpu.yaml", "--out", str(out), "--shard-size", "100"]
    assert main(args) == 0
    assert main(args) == 12 and "add --overwrite" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0
    (out / "notes.txt").write_text("mine")
    assert main(args + ["--overwrite"]) == 12
    assert "holds files map did not write (notes.txt)" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"
    assert main(["map", model, str(images), "--out", str(images), "--overwrite"]) == 12
    assert len(list(images.iterdir())) == SAMPLES


def test_npy_and_npz_shards(model, tmp_path, config):
    rng = np.random.default_rng(2)
    data = rng.uniform(-1, 1, (5, 8, 8, 3)).astype(np.float32)
    np.save(tmp_path / "a.npy", data[:3])
    np.save(tmp_path / "b.npy", data[3:])
    doc, rows = evaluate(model, str(tmp_path), config, ["cpu-numpy"], batch=2)
    assert list(rows["id"]) == [f"{tmp_path / 'a.npy'}:{i}" for i in range(3)] + \
        [f"{tmp_path / 'b.npy'}:{i}" for i in range(2)]
    np.savez(tmp_path / "one.npz", input_0=data)
    out = batch_map(model, str(tmp_path / "one.npz"), config, tmp_path / "mapped")
    expected = litert_cpu(open(model, "rb").read())
    np.testing.assert_allclose(read_outputs(tmp_path / "mapped")["scores"],
                               np.concatenate([expected([data[i:i + 1]])[0] for i in range(5)]), rtol=1e-5, atol=1e-7)
    assert out["outputs"] == [{"name": "scores", "shape": [CLASSES], "dtype": "float32"}]


@pytest.mark.parametrize("make, words", [
    (lambda d: None, "no images"),
    (lambda d: (d / "x.png").write_bytes(b"not a png"), "x.png: cannot read image"),
    (lambda d: (np.save(d / "a.npy", np.zeros((2, 8, 8, 3))), Image.new("RGB", (4, 4)).save(d / "b.png")),
     "mixes array and image files"),
    (lambda d: np.save(d / "a.npy", np.zeros((2, 8, 8))),
     "has shape [2, 8, 8]; samples of this model are [n, 8, 8, 3]"),
    (lambda d: np.savez(d / "a.npz", other=np.zeros((2, 8, 8, 3))), "nothing for input 'image'"),
    (lambda d: (d / "a.npy").write_bytes(b"garbage!"), "not a readable .npy"),
    (lambda d: np.save(d / "a.npy", np.zeros((0, 8, 8, 3))), "hold no samples"),
    (lambda d: (d / "a.parquet").write_bytes(b"PAR1"), "Parquet datasets are read through Ray Data: add --ray"),
])
def test_bad_datasets_are_one_line_errors(model, tmp_path, capsys, make, words):
    make(tmp_path)
    assert main(["eval", model, str(tmp_path), "--config", "configs/cpu.yaml", "--configs", "cpu-numpy",
                 "--out", str(tmp_path / "results")]) == DatasetError.exit_code
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err


@pytest.mark.parametrize("command", [["eval", "{model}", "{images}", "--configs", "cpu-numpy", "--ray"],
                                     ["eval", "{model}", "{images}", "--configs", "cpu-numpy", "--set", "executor=ray"],
                                     ["calibrate", "--backends", "cpu", "--ray"],
                                     ["bench", "--suite", "--models", "{model}", "--ray-address", "auto"]])
def test_ray_missing_says_how_to_install(model, images, monkeypatch, capsys, command):
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main([a.format(model=model, images=images) for a in command]) == 1
    assert capsys.readouterr().err.strip() == f"delegate: error: {INSTALL_RAY}"


def test_bench_ray_needs_the_suite(model, capsys):
    assert main(["bench", model, "--ray"]) == 1
    assert capsys.readouterr().err.strip() == "delegate: error: bench --ray runs the suite on every node of the " \
                                              "cluster: add --suite"


# -- on a local Ray: the same results as in-process ------------------------------------------------

@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    import logging
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield ray
    ray.shutdown()


def test_ray_eval_and_map_equal_the_in_process_runs(local_ray, model, images, config, tmp_path):
    configs = ["cpu-numpy", "cpu-litert"]
    here, here_rows = evaluate(model, str(images), config, configs, batch=4)
    there, there_rows = evaluate(model, str(images), config, configs, batch=4, ray=RayOptions())
    assert there["executor"] == "ray" and there["configs"] == here["configs"]
    assert set(there_rows) == set(here_rows)  # the executor's timing columns are its own
    for key, column in here_rows.items():
        assert np.array_equal(there_rows[key], column, equal_nan=column.dtype != object), key
    for doc in (here, there):  # each batch of 4 (the last of 2) timed by the worker that ran it
        t = doc["throughput"]
        assert t["batches"] == 6 and t["samples_per_batch"] == 4 and t["work_s"] > 0
        assert 0 < t["first_batch_s"] <= t["wall_s"] == doc["seconds"] and t["steady_samples_per_s"] > 0
    assert here["throughput"]["workers"] == 1 and there["throughput"]["workers"] in (1, 2)  # actors take what comes
    # the same images, preprocessed, as a Parquet dataset with an id column
    from delegate.batchmap import _write_parquet
    t = read_model(open(model, "rb").read()).main.inputs[0]
    names = sorted(p.name for p in images.iterdir())
    (tmp_path / "table").mkdir()
    _write_parquet(tmp_path / "table" / "images.parquet", {
        "id": np.array(names, object), "image": np.concatenate([load_image(images / n, t, dict(config.input))
                                                                for n in names])})
    _, table_rows = evaluate(model, str(tmp_path / "table"), config, configs, batch=4, ray=RayOptions())
    for key, column in here_rows.items():
        assert np.array_equal(table_rows[key], column, equal_nan=column.dtype != object), key
    batch_map(model, str(images), config, tmp_path / "npz", batch=8, threads=1, shard_size=16)
    on_ray = batch_map(model, str(images), config, tmp_path / "parquet", batch=8, threads=1, shard_size=16,
                       ray=RayOptions())
    assert on_ray["files"] == ["part-00000.parquet", "part-00001.parquet"] and on_ray["samples"] == SAMPLES
    a, b = read_outputs(tmp_path / "npz"), read_outputs(tmp_path / "parquet")
    assert list(a["id"]) == list(b["id"]) and np.array_equal(a["scores"], b["scores"])


def test_eval_compares_the_ray_run_with_an_in_process_run(local_ray, model, images, config, capsys, tmp_path):
    assert main(["eval", model, str(images), "--config", "configs/cpu.yaml", "--configs", "cpu-numpy", "--batch", "8",
                 "--threads", "1", "--ray", "--compare-in-process", "--out", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["in_process"]["identical"] and doc["in_process"]["throughput"]["workers"] == 1
    assert doc["throughput"]["workers"] in (1, 2) and doc["throughput"]["batches"] == 3  # actors take what comes
    assert doc["speedup"] == pytest.approx(doc["samples_per_s"] / doc["in_process"]["samples_per_s"], rel=1e-2, abs=1e-3)
    assert main(["eval", model, str(images), "--configs", "cpu-numpy", "--compare-in-process"]) == 1
    assert "needs a Ray run to compare: add --ray" in capsys.readouterr().err


def test_ray_actor_errors_come_back_as_one_line(local_ray, model, tmp_path, config):
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(DatasetError, match=r"bad.png: cannot read image") as caught:
        evaluate(model, str(tmp_path), config, ["cpu-numpy"], ray=RayOptions())
    assert "\n" not in str(caught.value)


# -- fleet sweeps: one task per node of the local Ray (one node) ------------------------------------

def _numpy_cpu_fingerprint(threads=None):
    """The key of the numpy CPU profile a session at ``threads`` (default: every usable core) loads: the
    host's profile is keyed by its thread count too."""
    from delegate.config import available_cores
    from delegate.cost import fingerprint, profile_info
    from delegate.plugins import default_manager
    backend = default_manager().create("cpu", {"engine": "numpy"})
    return fingerprint(profile_info(backend, threads or available_cores()))


def fleet_json(capsys, argv):
    """The command's exit code and JSON document; a calibration the busy machine refused (exit 11) is retried."""
    for _ in range(3):
        code = main(argv + ["--json"])
        out = capsys.readouterr().out
        if code != 11:
            break
    return code, json.loads(out)


def test_fleet_calibration_stores_each_node_profile_by_fingerprint(local_ray, model, tmp_path, monkeypatch, capsys):
    here = tmp_path / "profiles"  # this machine's store; the node's task writes to the run's own (conftest)
    monkeypatch.setenv("DELEGATE_PROFILE_DIR", str(here))
    code, doc = fleet_json(capsys, ["calibrate", "--ray", "--backends", "cpu", "--set", "cpu.engine=numpy"])
    assert code == 0, doc
    (node,) = local_ray.nodes()
    assert doc["nodes"] == [{"node": node["NodeManagerHostname"], "node_id": node["NodeID"]}]
    (row,) = doc["profiles"]
    fingerprint = _numpy_cpu_fingerprint()
    assert (row["node"], row["node_id"], row["backend"], row["fingerprint"]) == \
        (node["NodeManagerHostname"], node["NodeID"], "cpu", fingerprint)
    assert row["device"].endswith("(numpy)") and row["gflops"] > 0 and row["launch_us"] > 0
    assert row["profile"] == str(here / f"{fingerprint}.json") and row["node_profile"] != row["profile"]
    stored = json.loads((here / f"{fingerprint}.json").read_text())
    assert stored == json.loads(open(row["node_profile"]).read())  # the node's profile, refitted, as it stored it
    assert {w["workload"] for w in doc["workloads"]} and all(w["node_id"] == node["NodeID"] for w in doc["workloads"])
    # a plan here uses the stored profile and names its file
    assert main(["plan", "--backends", "cpu", "--set", "cpu.engine=numpy", model, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert row["profile"] in plan["profiles"]["cpu"] and "calibrated" in plan["profiles"]["cpu"]


def test_fleet_suite_table_is_keyed_by_node_and_device(local_ray, model, tmp_path, capsys):
    out = tmp_path / "suite"
    code, doc = fleet_json(capsys, ["bench", "--suite", "--ray", "--models", model, "--configs", "cpu-numpy",
                                     "--runs", "2", "--threads", "1", "--out", str(out)])
    assert code == 0, doc
    (node,) = local_ray.nodes()
    rows = {r["config"]: r for r in doc["rows"]}
    assert set(rows) == {"cpu-numpy", "litert-gpu"}  # LiteRT's accelerator: a row whether it runs here or not
    ours = rows["cpu-numpy"]
    assert (ours["node"], ours["node_id"], ours["backend"], ours["fingerprint"]) == \
        (node["NodeManagerHostname"], node["NodeID"], "cpu", _numpy_cpu_fingerprint(threads=1))
    assert ours["status"] == "ok" and ours["p50_ms"] > 0 and ours["max_error"] < 1e-4
    reports = out / f"{node['NodeManagerHostname']}-{node['NodeID'][:8]}"
    assert sorted(doc["files"])[:2] == [str(reports / "suite.csv"), str(reports / "suite.md")]
    assert "Command: `delegate " in (reports / "suite.md").read_text()
