"""The command line as a person uses it: real subprocesses, their output and exit codes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

CPU = ["--config", "configs/cpu.yaml"]


def delegate(*args, check=True, env=None):
    proc = subprocess.run([sys.executable, "-m", "delegate.cli", *args], capture_output=True, text=True, timeout=300,
                          env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {proc.stderr}")
    return proc


def as_json(*args):
    return json.loads(delegate(*args, "--json").stdout)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from delegate.tflite.builder import GraphBuilder
    b = GraphBuilder()
    x = b.input("image", (1, 8, 8, 3))
    y = b.op("CONV_2D", [x, b.const("w", np.random.default_rng(0).standard_normal((4, 3, 3, 3))),
                         b.const("b", np.zeros(4))],
             options={"padding": "SAME", "stride_w": 2, "stride_h": 2, "fused_activation_function": "RELU"})
    y = b.op("RESHAPE", [y, b.const("shape", np.array([1, 64], np.int32))], options={"new_shape": [1, 64]})
    b.output(b.op("SOFTMAX", [y], options={"beta": 1.0}, name="scores"))
    path = tmp_path_factory.mktemp("models") / "tiny.tflite"
    path.write_bytes(b.to_bytes())
    return str(path)


def test_main_job_default_model_json():
    doc = as_json(*CPU, "--runs", "2")
    assert doc["model"] == "zoo:mobilenet_v1"
    assert doc["plan"]["partitions"] and doc["plan"]["partitions"][0]["backend"] == "cpu"
    out = doc["outputs"][0]
    assert out["shape"] == [1, 1001] and len(out["top5"]) == 5 and out["max"] > out["min"]
    assert {"init", "first_run", "median"} <= set(doc["timing_ms"])


def test_main_job_text_and_run_alias(tiny_model, tmp_path):
    text = delegate("run", *CPU, tiny_model, "--output", str(tmp_path / "out.npz")).stdout
    assert "No delegate in use" in text and "top-5 of scores" in text and "timing:" in text
    saved = np.load(tmp_path / "out.npz")
    assert saved["scores"].shape == (1, 64)


def test_inputs_from_npz_npy_and_image(tiny_model, tmp_path):
    x = np.random.default_rng(3).uniform(-1, 1, (1, 8, 8, 3)).astype(np.float32)
    np.savez(tmp_path / "in.npz", image=x)
    np.save(tmp_path / "x.npy", x)
    delegate(*CPU, tiny_model, "--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "a.npz"))
    delegate(*CPU, tiny_model, "--input", f"image={tmp_path / 'x.npy'}", "--output", str(tmp_path / "b.npz"))
    np.testing.assert_array_equal(np.load(tmp_path / "a.npz")["scores"], np.load(tmp_path / "b.npz")["scores"])
    from PIL import Image
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 30, 3), dtype=np.uint8)).save(tmp_path / "p.png")
    doc = as_json(*CPU, tiny_model, "--input", str(tmp_path / "p.png"))
    assert doc["outputs"][0]["shape"] == [1, 64]


def test_inspect(tiny_model):
    doc = as_json("inspect", tiny_model)
    assert doc["opcode_counts"] == {"CONV_2D": 1, "RESHAPE": 1, "SOFTMAX": 1}
    assert doc["inputs"][0]["name"] == "image" and doc["ops"][0]["version"] == 1
    assert "CONV_2D.v1" in delegate("inspect", tiny_model, "--ir").stdout


def test_plan_json_and_svg(tiny_model, tmp_path):
    svg = tmp_path / "plan.svg"
    doc = as_json("plan", *CPU, tiny_model, "--svg", str(svg))
    assert {"partitions", "copies", "estimated_ms", "summary", "ops"} <= set(doc)
    assert sorted(i for p in doc["partitions"] for i in p["ops"]) == [0, 1, 2]
    assert "<svg" in svg.read_text() and "CONV_2D" in svg.read_text()


def test_analyze_backends_and_zoo(tmp_path):
    doc = as_json("analyze", *CPU, "zoo:mobilenet_v1")
    cpu = next(b for b in doc["backends"] if b["backend"] == "cpu")
    assert cpu["op_share"] == 1.0 and cpu["compute_share"] == 1.0
    names = {b["name"] for b in as_json("backends")["backends"]}
    assert {"cpu", "opencl", "wgpu"} <= names
    out = tmp_path / "m.tflite"
    delegate("zoo", "mobilenet_v1", "-o", str(out))
    assert out.stat().st_size > 1_000_000


def test_bench_compare_litert(tiny_model, tmp_path):
    doc = as_json("bench", *CPU, tiny_model, "--runs", "5", "--warmup", "1", "--compare", "litert",
                  "--csv", str(tmp_path / "runs.csv"))
    assert {"median_ms", "reference_median_ms", "ratio", "peak_rss_mb", "p90_ms", "p99_ms"} <= set(doc)
    assert doc["ratio"] > 0
    # the LiteRT engine runs a partition as one call and times no op in it: each op row is that op run alone as a
    # one-op LiteRT model, and says so
    (part,) = doc["partition_times"]
    assert part["op_times"] == "each op alone, as a one-op LiteRT model" and part["measured_ms"] > 0
    assert doc["top_ops"] and all(r["source"] == part["op_times"] and r["ms"] > 0 for r in doc["top_ops"])
    assert doc["estimated_ms"] > 0 and doc["estimate_ratio"] == pytest.approx(doc["estimated_ms"] / doc["median_ms"],
                                                                             rel=1e-2)
    assert doc["reference_alone_median_ms"] > 0 and doc["reference_slowed"] is False
    # both alone, back to back, beside the alternating ratio
    assert doc["alone_median_ms"] > 0 and doc["alone_ratio"] == pytest.approx(
        doc["alone_median_ms"] / doc["reference_alone_median_ms"], rel=1e-2)
    assert len((tmp_path / "runs.csv").read_text().splitlines()) == 6


def test_bench_per_op_rows_are_measured(tiny_model):
    # medians of 15 runs: the kernel timers and the partition are timed in different runs, and one run
    # disturbed by other work on the machine must not decide the comparisons below
    doc = as_json("bench", *CPU, tiny_model, "--runs", "15", "--warmup", "2", "--set", "cpu.engine=numpy")
    (part,) = doc["partition_times"]
    assert part["op_times"] == "numpy engine kernel timers"
    # the CPU computes inside run(): the time until it returns is (up to timer noise) the partition's
    assert 0 < part["host_ms"] <= part["measured_ms"] * 1.5 + 0.05
    assert doc["top_ops"] and all(r["source"] == "numpy engine kernel timers" and r["ms"] > 0 for r in doc["top_ops"])
    # kernel timers sit inside the partition's run: their sum cannot exceed it by more than timer noise
    assert sum(r["ms"] for r in doc["top_ops"]) <= part["ops_ms"] + 1e-4 <= part["measured_ms"] * 1.5 + 0.05


@pytest.mark.parametrize("backend", ["opencl", "wgpu"])
def test_bench_reports_the_device_resident_time_next_to_host_to_host(tiny_model, backend):
    """A GPU partition has a resident run (inputs and outputs left on the device); OpenCL also times its host
    copies and conversions by profiling events.  The CPU has neither, and says so with nulls."""
    from tests.oputil import require_backend
    require_backend(backend)
    doc = as_json("bench", "--backends", f"{backend},cpu", "--set", "partitioner=greedy", "--set", "precision=fp32",
                  tiny_model, "--runs", "3", "--warmup", "1")
    (part,) = doc["partition_times"]
    assert part["backend"] == backend and part["resident_ms"] > 0 and doc["resident_ms"] == part["resident_ms"]
    assert (part["boundary_ms"] > 0) if backend == "opencl" else part["boundary_ms"] is None
    assert part["ops_ms"] > 0  # the kernels' device time: profiling events, timestamp queries
    text = delegate("bench", "--backends", f"{backend},cpu", "--set", "partitioner=greedy", tiny_model, "--runs",
                    "2", "--warmup", "0").stdout
    assert "device-resident:" in text and "resident ms" in text
    cpu = as_json("bench", *CPU, tiny_model, "--runs", "2", "--warmup", "0")
    assert cpu["resident_ms"] is None and cpu["partition_times"][0]["resident_ms"] is None


def test_validate_against_litert_and_expected(tiny_model, tmp_path):
    doc = as_json("validate", *CPU, tiny_model, "--samples", "2")
    assert doc["passed"] and doc["outputs"]["scores"]["cosine"] > 0.9999
    assert {"max_abs_error", "max_rel_error", "cosine"} <= set(doc["outputs"]["scores"])
    np.savez(tmp_path / "wrong.npz", scores=np.zeros((1, 64), np.float32))
    proc = delegate("validate", *CPU, tiny_model, "--expected", str(tmp_path / "wrong.npz"), check=False)
    assert proc.returncode == 10 and "FAIL" in proc.stdout


def test_validate_takes_litert_builtin_kernels_where_they_are_nearer():
    """LiteRT's two kernel sets differ on quantized models (vit_tiny_block_int8: XNNPACK 8 steps of the output's
    grid from the builtin kernels); the numpy engine, bit-exact against the builtin kernels, passes against them."""
    model = str(Path(__file__).parent / "fixtures" / "converter" / "vit_tiny_block_int8.tflite")
    doc = as_json("validate", "--backends", "cpu", "--set", "cpu.engine=numpy", model)
    assert doc["passed"] and doc["reference"] == "litert builtin kernels"
    assert all(r["max_abs_error"] == 0 for r in doc["outputs"].values())
    doc = as_json("validate", "--backends", "cpu", "--set", "cpu.engine=numpy", model, "--samples", "1",
                  "--max-abs-error", "0")
    assert doc["passed"]


@pytest.mark.parametrize("args, code, words", [
    (["run", "missing.tflite"], 3, "no such model file"),
    (["run", "--backends", "tpu9000"], 5, "unknown backend 'tpu9000'"),
    (["run", "--set", "precision=fp64"], 4, "precision"),
    (["inspect", "zoo:nope"], 3, "unknown zoo model"),
])
def test_errors_are_one_line_with_distinct_codes(args, code, words):
    proc = delegate(*args, check=False)
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr


def test_bad_yaml_names_file_and_line(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("precision: fp16\npartitoner: cost\n")
    proc = delegate("run", "--config", str(cfg), check=False)
    assert proc.returncode == 4 and "bad.yaml:2" in proc.stderr and "partitioner" in proc.stderr


def test_corrupt_model_and_debug_traceback(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x10\x00\x00\x00TFL3" + b"\xff" * 40)
    proc = delegate("inspect", str(bad), check=False)
    assert proc.returncode == 3 and len(proc.stderr.strip().splitlines()) == 1
    proc = delegate("--debug", "inspect", str(bad), check=False)
    assert "Traceback" in proc.stderr


def test_calibrate_stores_a_profile_that_plans_use(tmp_path, monkeypatch):
    monkeypatch.setenv("DELEGATE_PROFILE_DIR", str(tmp_path))
    for _ in range(3):  # a refusal (exit 11: the machine was busy) says to retry when it is quiet
        proc = delegate("calibrate", "--backends", "cpu", "--set", "cpu.engine=numpy", "--json", check=False)
        if proc.returncode != 11:
            break
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)["profiles"][0]
    assert row["backend"] == "cpu" and row["gflops"] > 0 and row["gbytes_per_s"] > 0 and row["launch_us"] > 0
    assert row["partition_us"] >= 0
    saved = json.loads(open(row["profile"]).read())
    assert saved["device_info"]["engine"] == "numpy" and saved["calibrated_at"]
    from delegate.cost import load_profile
    from delegate_cpu.plugin import DEFAULT_PROFILES as CPU_DEFAULTS
    assert load_profile(saved["device_info"], CPU_DEFAULTS["numpy"]).source == row["profile"]
    # the plan says which profile it used
    plan = as_json("plan", "--backends", "cpu", "--set", "cpu.engine=numpy", "zoo:mobilenet_v1")
    assert row["profile"] in plan["profiles"]["cpu"] and "calibrated" in plan["profiles"]["cpu"]


def test_cache_ls_and_clear(tmp_path):
    from delegate.cache import EntryStore
    cache = tmp_path / "kernels"
    EntryStore(cache, "opencl", "m").store("k" * 64, "bin", b"x" * 10)
    (cache / "opencl" / "notes.txt").write_text("not an entry")
    doc = as_json("cache", "ls", "--set", f"serialization.dir={cache}")
    assert [(e["path"], e["kind"]) for e in doc["entries"]] == [(f"opencl/m-{'k' * 32}.bin", "bin")]
    assert as_json("cache", "clear", "--set", f"serialization.dir={cache}")["removed"] == 1
    assert [p.name for p in (cache / "opencl").iterdir()] == ["notes.txt"]  # only what the cache wrote
    proc = delegate("cache", "ls", check=False)
    assert proc.returncode == 9 and "serialization.dir" in proc.stderr


def test_cache_clear_refuses_a_directory_it_did_not_create(tmp_path):
    """Issue 17 #13: `dir: .` in a project's config deleted the project."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "model.tflite").write_bytes(b"weights")
    (project / "src").mkdir()
    (project / "src" / "main.py").write_text("print()")
    proc = delegate("cache", "clear", "--set", f"serialization.dir={project}", check=False)
    assert proc.returncode == 9 and "is not a delegate cache" in proc.stderr, proc.stderr
    link = tmp_path / "link"
    link.symlink_to(project)
    proc = delegate("cache", "clear", "--set", f"serialization.dir={link}", check=False)
    assert proc.returncode == 9 and "symbolic link" in proc.stderr, proc.stderr
    assert sorted(p.name for p in project.rglob("*")) == ["main.py", "model.tflite", "src"]


def test_verbose_logs_decisions(tiny_model):
    proc = delegate("-v", "plan", *CPU, tiny_model)
    assert "op #0 CONV_2D v1 -> cpu" in proc.stderr


def test_bench_profile_feeds_later_plans(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("DELEGATE_PROFILE_DIR", str(tmp_path))
    before = as_json("plan", *CPU, "--set", "cpu.engine=numpy", tiny_model)
    as_json("bench", *CPU, "--set", "cpu.engine=numpy", tiny_model, "--runs", "3", "--warmup", "1", "--profile")
    after = as_json("plan", *CPU, "--set", "cpu.engine=numpy", tiny_model)
    assert list(tmp_path.glob("*.json")), "bench --profile stored no profile"
    assert [op["estimates_ms"]["cpu"] for op in after["ops"]] != [op["estimates_ms"]["cpu"] for op in before["ops"]]


def test_bench_teaches_the_whole_plan_cost_that_plan_then_uses(tiny_model, tmp_path, monkeypatch):
    """bench times the plan and its partitions alone: the stored profile keeps the plan's point (what the run
    cost beyond its partition) and the host's run cost fitted to it, which the next plan's estimate carries."""
    monkeypatch.setenv("DELEGATE_PROFILE_DIR", str(tmp_path))
    bench = as_json("bench", *CPU, "--set", "cpu.engine=numpy", tiny_model, "--runs", "5", "--warmup", "1")
    (path,) = tmp_path.glob("*.json")
    stored = json.loads(path.read_text())
    (point,) = stored["fit_points"]["plan"]
    gap = bench["median_ms"] - bench["partition_times"][0]["measured_ms"]
    assert point[0] == pytest.approx(gap, abs=1e-3) and stored["run_us"] == pytest.approx(max(gap, 0.0) * 1e3, abs=1)
    assert stored["run_us"] > 0, "a whole run costs the executor's checks and staging beyond its partition"
    plan = as_json("plan", *CPU, "--set", "cpu.engine=numpy", tiny_model)
    ops_ms = sum(op["estimates_ms"]["cpu"] for op in plan["ops"] if op["fused_into"] is None)
    assert plan["estimated_ms"] == pytest.approx(ops_ms + (stored["partition_us"] + stored["run_us"]) * 1e-3, abs=2e-3)


def test_test_plugin_is_registered_for_the_run_only():
    """conftest puts tests/fake_plugin on PYTHONPATH as an entry-point distribution; nothing is installed."""
    rows = {row["name"]: row for row in as_json("backends")["backends"]}
    assert rows["fakegpu"]["available"] and rows["fakegpu"]["plugin"] == "fakegpu"
    fake = os.path.join("tests", "fake_plugin")
    outside = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in os.environ["PYTHONPATH"].split(os.pathsep) if fake not in p and "delegate-test-plugins-" not in p)}
    names = {row["name"] for row in json.loads(delegate("backends", "--json", env=outside).stdout)["backends"]}
    assert "fakegpu" not in names, "delegate-fakegpu is installed in this environment: pip uninstall delegate-fakegpu"


def test_every_command_takes_the_common_flags_and_global_flags_after_it(tmp_path):
    common = ["--config", "configs/cpu.yaml", "--backends", "cpu", "--set", "precision=fp32", "--json"]
    assert as_json("inspect", "zoo:posenet", *common[:-1])["inputs"][0]["name"] == "image"
    assert "posenet" in json.loads(delegate("zoo", *common).stdout)["models"]
    assert [r["name"] for r in json.loads(delegate("backends", *common).stdout)["backends"]][0] == "cpu"
    proc = delegate("plan", "zoo:mobilenet_v1", "--backends", "cpu", "--debug", "-v")
    assert "INFO delegate.session: op #0 CONV_2D" in proc.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("precision: fp64\n")
    proc = delegate("inspect", "zoo:posenet", "--config", str(broken), check=False)
    assert proc.returncode == 4 and "precision" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, message", [
    (["run", "--runs", "-1"], "argument --runs: -1 is less than 1"),
    (["run", "--runs", "0"], "argument --runs: 0 is less than 1"),
    (["run", "--seed", "-3"], "argument --seed: -3 is less than 0"),
    (["bench", "--warmup", "-1"], "argument --warmup: -1 is less than 0"),
    (["validate", "--samples", "zero"], "argument --samples: 'zero' is not an integer"),
])
def test_counts_refuse_values_out_of_range(args, message):
    proc = delegate(*args, check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_count_flags_have_help():
    text = delegate("bench", "--help").stdout
    for flag, words in [("--runs RUNS", "timed runs"), ("--warmup WARMUP", "untimed runs"),
                        ("--seed SEED", "seed of the random inputs")]:
        assert any(line.strip().startswith(flag) and words in line for line in text.splitlines()), flag


def test_python_dash_m_and_an_empty_cache_listing(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "delegate", "cache", "ls", "--json",
                           "--set", f"serialization.dir={tmp_path / 'not-yet'}"], capture_output=True, text=True)
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"dir": str(tmp_path / "not-yet"), "entries": []}


def test_dependencies_print_nothing_on_stderr(tiny_model):
    """Mesa's Wayland probe without XDG_RUNTIME_DIR and LiteRT's XNNPACK line were printed on every run."""
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    for args in (["run", "--backends", "wgpu,cpu", "--set", "cpu.engine=litert", "--runs", "1"],
                 ["validate", "--backends", "cpu"], ["bench", "--backends", "cpu", "--compare", "litert", "--runs", "2"]):
        proc = delegate(args[0], tiny_model, *args[1:], env=env)
        assert "XDG_RUNTIME_DIR" not in proc.stderr and "XNNPACK" not in proc.stderr, (args, proc.stderr)


@pytest.mark.parametrize("args, message", [
    (["run", "--backends", "cpu", "-o", "{tmp}/missing/out.npz"], "--output {tmp}/missing/out.npz: directory "
                                                                  "{tmp}/missing does not exist"),
    (["plan", "--backends", "cpu", "--svg", "{tmp}"], "--svg {tmp}: is a directory"),
    (["bench", "--backends", "cpu", "--csv", "{tmp}/missing/times.csv"],
     "--csv {tmp}/missing/times.csv: directory {tmp}/missing does not exist"),
    (["zoo", "posenet", "-o", "{tmp}/missing/p.tflite"], "--output {tmp}/missing/p.tflite: directory "
                                                         "{tmp}/missing does not exist"),
])
def test_an_unwritable_output_is_refused_before_the_run(tiny_model, tmp_path, args, message):
    args = [a.format(tmp=tmp_path) for a in args]
    proc = delegate(*args[:1], *([tiny_model] if args[0] != "zoo" else []), *args[1:], check=False)
    assert proc.returncode == 2 and proc.stderr == f"delegate: error: {message.format(tmp=tmp_path)}\n", proc.stderr


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no file can be created")
def test_a_write_refused_after_the_checks_is_one_line():
    proc = delegate("zoo", "posenet", "-o", "/proc/delegate-test.tflite", check=False)
    assert proc.returncode == 1 and proc.stderr == "delegate: error: /proc/delegate-test.tflite: No such file or directory\n"


def test_inputs_that_would_change_or_are_not_arrays_are_refused(tiny_model, tmp_path):
    exact = np.arange(192, dtype=np.int32).reshape(1, 8, 8, 3)
    np.savez(tmp_path / "exact.npz", image=exact)
    delegate(*CPU, tiny_model, "--input", str(tmp_path / "exact.npz"), "--output", str(tmp_path / "a.npz"))
    np.savez(tmp_path / "b.npz", image=exact.astype(np.float32))
    delegate(*CPU, tiny_model, "--input", str(tmp_path / "b.npz"), "--output", str(tmp_path / "b_out.npz"))
    np.testing.assert_array_equal(np.load(tmp_path / "a.npz")["scores"], np.load(tmp_path / "b_out.npz")["scores"])
    np.savez(tmp_path / "ids.npz", image=exact + 16_777_217)  # 2**24 + 1: float32 holds every other one
    proc = delegate(*CPU, tiny_model, "--input", str(tmp_path / "ids.npz"), check=False)
    assert proc.returncode == 8 and ("input 'image' is float32 and 96 of the 192 int32 values given are not exactly "
                                     "representable in it (the first: 16777217 at [0, 0, 0, 0])") in proc.stderr
    from PIL import Image
    Image.new("RGB", (8, 8)).save(tmp_path / "photo.jpg")
    (tmp_path / "x.npy").write_bytes((tmp_path / "photo.jpg").read_bytes())
    proc = delegate(*CPU, tiny_model, "--input", str(tmp_path / "x.npy"), check=False)
    assert proc.returncode == 8 and "x.npy: a JPEG image, not a .npy array" in proc.stderr, proc.stderr
    assert "allow_pickle" not in proc.stderr


def test_small_model_and_config_errors_say_what_happened(tiny_model, tmp_path):
    data = open(tiny_model, "rb").read()
    (tmp_path / "cut.tflite").write_bytes(data[:len(data) // 2])
    proc = delegate("inspect", str(tmp_path / "cut.tflite"), check=False)
    assert proc.returncode == 3 and "truncated model" in proc.stderr, proc.stderr
    plan = as_json("plan", tiny_model, "--backends", "cpu", "--set", "placement.budget_s=1e-9")
    assert plan["partitions"]
    from delegate.config import load_config
    assert load_config(None, overrides=["placement.budget_s=1e-9"]).placement.budget_s == 1e-9
    from delegate.tflite.builder import GraphBuilder
    b = GraphBuilder()
    b.output(b.op("MyCustomOp", [b.input("x", (1, 4))], custom=True, shape=(1, 4)))
    (tmp_path / "custom.tflite").write_bytes(b.to_bytes())
    proc = delegate("run", str(tmp_path / "custom.tflite"), "--backends", "cpu", check=False)
    assert proc.returncode == 6 and "delegate_custom_kernels hook" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [["zoo"], ["inspect", "zoo:posenet"], ["inspect", "zoo:posenet", "--json"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(args):
    """``delegate ... | head``: the pipe's reader is gone before the first write; exit as SIGPIPE would, no trace."""
    proc = subprocess.Popen([sys.executable, "-m", "delegate", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and stderr == "", stderr


def _stderr_on_a_terminal(*args) -> tuple[str, str]:
    """(stdout, stderr) of the CLI run with stderr on a pseudo-terminal, every step long enough to draw."""
    import pty
    code = ("import sys, delegate.stdio as s; s.SHOW_AFTER_S = 0; from delegate.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    out = proc.stdout.read().decode()
    assert proc.wait(timeout=300) == 0
    os.close(master)
    return out, b"".join(chunks).decode(errors="replace")


def test_progress_is_drawn_on_a_terminal_only(tiny_model):
    args = ["bench", tiny_model, "--backends", "cpu", "--runs", "300"]
    out, err = _stderr_on_a_terminal(*args)
    assert "timed runs" in err and "compiling 1 partition(s)" in err and "timed runs" not in out
    out, err = _stderr_on_a_terminal(*args, "--json")
    assert err == "" and json.loads(out)["runs"] == 300
    piped = delegate(*args)
    assert "timed runs" not in piped.stderr + piped.stdout and "compiling" not in piped.stderr


def test_the_suite_writes_a_fresh_directory_each_time_with_the_fast_preference(tiny_model, tmp_path):
    args = [sys.executable, "-m", "delegate", "bench", "--suite", "--models", tiny_model, "--configs", "cpu-numpy",
            "--runs", "2", "--json"]
    written = []
    for _ in range(2):
        proc = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        written.append({os.path.dirname(f) for f in json.loads(proc.stdout)["files"]})
    assert len(written[0]) == len(written[1]) == 1 and written[0] != written[1]
    assert sorted(p.name for p in (tmp_path / "bench-results").iterdir()) == sorted(
        os.path.basename(d) for w in written for d in w)
    from delegate.cli import build_parser
    assert build_parser().parse_args(["bench", "--suite"]).preference == "fast_single_answer"


@pytest.fixture(scope="module")
def regression_model(tmp_path_factory):
    """Coordinates, not class scores: a convolution reshaped to one row of 64 values."""
    from delegate.tflite.builder import GraphBuilder
    b = GraphBuilder()
    x = b.input("image", (1, 8, 8, 3))
    y = b.op("CONV_2D", [x, b.const("w", np.random.default_rng(1).standard_normal((4, 3, 3, 3))),
                         b.const("b", np.zeros(4))], options={"padding": "SAME", "stride_w": 2, "stride_h": 2})
    b.output(b.op("RESHAPE", [y, b.const("shape", np.array([1, 64], np.int32))], options={"new_shape": [1, 64]},
                  name="coords"))
    path = tmp_path_factory.mktemp("models") / "coords.tflite"
    path.write_bytes(b.to_bytes())
    return str(path)


def test_run_names_only_backends_that_run_ops_and_no_classes_for_a_regression(regression_model):
    """fakegpu runs only elementwise ops: configured, it runs none of these, so it is not in use."""
    args = ["run", regression_model, "--backends", "fakegpu,cpu", "--runs", "1"]
    doc = as_json(*args)
    assert doc["backends_in_use"] == ["cpu"] and "top5" not in doc["outputs"][0]
    text = delegate(*args).stdout
    assert "backends in use: cpu\n" in text and "top-5" not in text


def test_class_scores_are_one_row_of_a_softmax_or_a_distribution():
    from delegate.cli import class_scores
    scores = np.array([[0.1, 0.7, 0.2]], np.float32)
    assert class_scores(scores, None) and class_scores(np.array([[3, 1]], np.uint8), "SOFTMAX")
    assert not class_scores(scores * 2, None) and not class_scores(scores - 0.1, "RESHAPE")
    assert not class_scores(scores[0], "SOFTMAX") and not class_scores(np.ones((1, 1), np.float32), "SOFTMAX")


def test_plan_explain_says_what_every_column_means(tiny_model):
    from delegate.cli import LEGEND, PARTITION_COLUMNS, PLACEMENT_COLUMNS, op_ranges
    explained = {name.strip() for names, _ in LEGEND for name in names.split(",")}
    assert set(PLACEMENT_COLUMNS) | set(PARTITION_COLUMNS) - {"#"} <= explained
    text = delegate("plan", tiny_model, *CPU, "--explain").stdout
    assert all(meaning in text for _, meaning in LEGEND) and "partition 0 (cpu) compiled as: engine" in text
    assert "delegate plan --explain" in delegate("plan", tiny_model, *CPU).stdout
    assert op_ranges([4, 2, 3]) == "#2..#4"
    assert op_ranges([0, 1, 2, 5, 7, 8, 9, 12, 14]) == "#0..#2, #5, #7..#9 +2 more ranges"


def _svg_facts(path):
    """(width px, height px, cluster titles, box texts, red dashed edges, every text) of a plan SVG from dot."""
    import xml.etree.ElementTree as ET
    root = ET.parse(path).getroot()
    svg = "{http://www.w3.org/2000/svg}"
    texts = ["".join(t.itertext()) for t in root.iter(svg + "text")]

    def first_text(g):
        return next(("".join(t.itertext()) for t in g.iter(svg + "text")), "")
    clusters = [first_text(g) for g in root.iter(svg + "g") if g.get("class") == "cluster"]
    boxes = [first_text(g) for g in root.iter(svg + "g") if g.get("class") == "node"]
    copies = [p for g in root.iter(svg + "g") if g.get("class") == "edge" for p in g.iter(svg + "path")
              if p.get("stroke") == "#d62728" and p.get("stroke-dasharray")]
    return float(root.get("width")[:-2]), float(root.get("height")[:-2]), clusters, boxes, copies, texts


def test_plan_svg_groups_partitions_folds_weights_and_has_a_legend(tmp_path):
    """fp16 weights behind a DEQUANTIZE: drawn inside the convolution; the greedy plan puts the TANH and ADD on
    fakegpu, so the picture has two partitions and red dashed copies between them."""
    from delegate.tflite.builder import GraphBuilder
    b = GraphBuilder()
    x = b.input("image", (1, 8, 8, 3))
    w = b.op("DEQUANTIZE", [b.const("w16", np.ones((4, 3, 3, 3), np.float16))])
    y = b.op("CONV_2D", [x, w, b.const("b", np.zeros(4, np.float32))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1})
    y = b.op("TANH", [y])
    b.output(b.op("ADD", [y, b.const("one", np.ones((1, 8, 8, 4), np.float32))], name="result"))
    model = tmp_path / "m.tflite"
    model.write_bytes(b.to_bytes())
    svg = tmp_path / "plan.svg"
    doc = as_json("plan", str(model), "--backends", "fakegpu,cpu", "--set", "partitioner=greedy", "--svg", str(svg))
    width, height, clusters, boxes, copies, texts = _svg_facts(svg)
    assert [p["backend"] for p in doc["partitions"]] == ["cpu", "fakegpu"]
    assert clusters == ["P0 · cpu · 2 ops", "P1 · fakegpu · 2 ops"]
    assert "#1 CONV_2D" in boxes and not any("DEQUANTIZE" in box for box in boxes)
    assert "+ DEQUANTIZE on weights" in texts and "#2 TANH … #3 ADD" in boxes
    assert len(copies) == 2  # the convolution's result to fakegpu, the sum back to the host
    legend = [t.strip() for t in texts]
    assert doc["summary"] in texts and "- - - a copy between devices" in legend and {"cpu", "fakegpu"} <= set(legend)
    assert width <= 1600


def test_the_plan_of_a_real_model_is_drawn_to_fit_a_screen(tmp_path):
    from tests.mediapipe import mediapipe_models
    model = mediapipe_models()["pose_landmark_full.tflite"]
    svg = tmp_path / "pose.svg"
    delegate("plan", str(model), "--backends", "cpu", "--svg", str(svg))
    width, height, clusters, boxes, copies, texts = _svg_facts(svg)
    assert clusters == ["P0 · cpu · 332 ops"] and not any("DEQUANTIZE" in box for box in boxes)
    assert width <= 1600 and height < 4000 and len(boxes) < 120 + 6  # runs of ops in one box; inputs, outputs


def test_plan_svg_without_graphviz_is_refused_before_the_run(tiny_model, tmp_path):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}
    proc = delegate("plan", tiny_model, *CPU, "--svg", str(tmp_path / "p.svg"), check=False, env=env)
    assert proc.returncode == 2 and proc.stderr == (
        f"delegate: error: --svg {tmp_path / 'p.svg'}: drawing needs Graphviz's dot program on PATH "
        "(Debian/Ubuntu: apt-get install graphviz)\n"), proc.stderr


def test_the_readme_test_command_is_what_ci_runs():
    """The README's fresh-machine steps and .ci/run install the same packages and run the same command."""
    from pathlib import Path
    root = Path(__file__).parent.parent
    readme, ci = (root / "README.md").read_text().splitlines(), (root / ".ci" / "run").read_text().splitlines()
    apt = next(line for line in readme if line.startswith("apt-get update && apt-get install -y "))
    ci_apt = next(line for line in ci if line.startswith("apt-get install "))
    assert set(apt.split("-y ")[1].split()) == {w for w in ci_apt.split()[2:] if not w.startswith(("-", ">"))}
    command = 'python3 -m pip install -q -e ".[all]" && python3 -m pytest -q'
    assert command in readme and command in ci
