"""The GPU backends against LiteRT's GPU accelerator at batch 1, per model: host input in and host output out,
and with inputs and outputs left on the device.

    python3 docs/benchmarks/gpu_floor.py OUT.jsonl MODEL... [--threads 16] [--rounds 10] [--torch]

Per model, in one process: each configuration (OpenCL and WebGPU taking every op they support, at fp32 and
fp16, and the shipped defaults) and LiteRT's CPU interpreter are loaded side by side and timed in rounds, in a
new shuffled order each round (so drift is shared), each settling first (``measure.settle``), then each
alone, back to back (``alone_p50_ms``); each configuration's device-resident time is its
partitions run on inputs already on the device (`measure.profile_partitions`), summed.  Init: the session's
construction and first run with a new serialization dir (cold), then again from that dir (cached): to the first
answer (the CPU's while the chosen plan compiles, ``placement.host_first``) and to the chosen plan's first run.  LiteRT's
GPU accelerator runs in a child process (it can abort the process on ops it lacks): write + run + read, and
run only (buffers left on the device).  ``--torch``: torchvision's MobileNetV2 in a CUDA graph, with and
without the host copies, where torch and CUDA exist.  One JSON line per model and configuration."""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import delegate
from delegate.inputs import make_inputs
from delegate.tools.measure import profile_partitions, samples_ms, settle
from delegate.tools.reference import litert_cpu

CONFIGS = [("opencl", "fp32"), ("opencl", "fp16"), ("wgpu", "fp32"), ("wgpu", "fp16"), ("defaults", "fp16")]
RUNS_PER_ROUND = 4
ALONE_RUNS = 40  # each configuration's back-to-back runs after the rounds

LITERT_GPU_CHILD = """
import json, os, sys, tempfile, time
import numpy as np
from ai_edge_litert.compiled_model import CompiledModel
from ai_edge_litert.hardware_accelerator import HardwareAccelerator
from ai_edge_litert.interpreter import Interpreter
path, runs = sys.argv[1], int(sys.argv[2])
it = Interpreter(model_path=path)
outs = [(d["shape"], d["dtype"]) for d in it.get_output_details()]
rng = np.random.default_rng(0)
xs = [rng.uniform(-1, 1, d["shape"]).astype(d["dtype"]) if np.issubdtype(d["dtype"], np.floating)
      else rng.integers(-5, 5, d["shape"]).astype(d["dtype"]) for d in it.get_input_details()]
t = time.perf_counter()
model = CompiledModel.from_file(path, hardware_accel=HardwareAccelerator.GPU | HardwareAccelerator.CPU)
ins, outb = model.create_input_buffers(0), model.create_output_buffers(0)
def full():
    for b, x in zip(ins, xs):
        b.write(x)
    model.run_by_index(0, ins, outb)
    return [b.read(int(np.prod(s)), d) for b, (s, d) in zip(outb, outs)]
full()
init = (time.perf_counter() - t) * 1e3
def timed(f):
    f(); f(); f()
    ts = []
    for _ in range(runs):
        t = time.perf_counter(); f(); ts.append((time.perf_counter() - t) * 1e3)
    return float(np.median(ts))
print(json.dumps({"init_ms": init, "write_run_read_ms": timed(full),
                  "run_only_ms": timed(lambda: model.run_by_index(0, ins, outb))}))
"""

TORCH_CHILD = """
import json, time, torch, torchvision
m = torchvision.models.mobilenet_v2().eval().cuda()
x_host = torch.randn(1, 3, 224, 224).pin_memory()
x = torch.empty(1, 3, 224, 224, device="cuda")
with torch.no_grad():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            y = m(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = m(x)
def timed(f, runs=200):
    for _ in range(20):
        f()
    ts = []
    for _ in range(runs):
        t = time.perf_counter(); f(); ts.append((time.perf_counter() - t) * 1e3)
    ts.sort(); return ts[len(ts) // 2]
def resident():
    g.replay(); torch.cuda.synchronize()
def with_copies():
    x.copy_(x_host, non_blocking=True); g.replay(); y.cpu()
print(json.dumps({"cuda_graph_ms": timed(resident), "cuda_graph_with_copies_ms": timed(with_copies)}))
"""


def overrides(config: str, precision: str) -> dict:
    if config == "defaults":
        return {"precision": precision}
    return {"precision": precision, "backends": f"[{config},cpu]", "partitioner": "greedy",
            "placement.search": "estimate"}


def load_timed(model: str, config: str, precision: str, cache_dir: str) -> tuple:
    """A session built and run once with ``cache_dir`` as its serialization dir: the ms to that first answer
    (the CPU's where it serves while the chosen plan compiles, ``placement.host_first``), and to the chosen
    plan's first run (its compile waited for)."""
    start = time.perf_counter()
    kwargs = {**overrides(config, precision), "serialization.dir": cache_dir}
    session = delegate.load(model, None, **kwargs)  # the built-in config is configs/edge.yaml
    inputs = session.normalize_inputs(make_inputs(session.graph, None))
    session.run_indexed(inputs)
    first = (time.perf_counter() - start) * 1e3
    session.wait_until_ready()
    session.run_indexed(inputs)
    return session, inputs, first, (time.perf_counter() - start) * 1e3


def child_json(script: str, args: list[str], timeout: float) -> dict:
    try:
        done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("INFO:")]
        return {"error": f"exit {done.returncode}: " + (said or [""])[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(model: str, threads: int, rounds: int) -> list[dict]:
    name = model.rsplit("/", 1)[-1]
    rows, loaded = [], []
    for config, precision in CONFIGS:
        row = {"model": name, "config": config, "precision": precision}
        try:
            with tempfile.TemporaryDirectory() as cache_dir:
                cold, inputs, row["first_answer_cold_ms"], row["init_cold_ms"] = \
                    load_timed(model, config, precision, cache_dir)
                cold.close()
                session, inputs, row["first_answer_cached_ms"], row["init_cached_ms"] = \
                    load_timed(model, config, precision, cache_dir)
            row.update(partitions=len(session.plan.partitions), copies=len(session.plan.copies),
                       backends=sorted({p.backend for p in session.plan.partitions}),
                       kernels=sum(int(d.get("kernels", 0) if isinstance(d.get("kernels", 0), int)
                                       else len(d["kernels"])) for d in (c.describe() for c in
                                                                         session.executor.compiled)))
            loaded.append((row, lambda s=session, i=inputs: s.run_indexed(i), session, inputs, []))
        except Exception as exc:  # a model a configuration cannot run is a row saying why
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    from delegate import zoo
    data = zoo.from_spec(model) if model.startswith(zoo.PREFIX) else Path(model).read_bytes()
    litert = {"model": name, "config": "litert-cpu", "threads": threads}
    if loaded:
        session, inputs = loaded[0][2], loaded[0][3]
        host = [inputs[t.index] for t in session.graph.inputs]
        run_cpu = litert_cpu(data, threads)
        loaded.append((litert, lambda: run_cpu(host), None, None, []))
    rows.append(litert)
    order = np.random.default_rng(0)
    for _ in range(rounds):
        for j in order.permutation(len(loaded)):
            row, run, *_, times = loaded[j]
            if "error" in row:
                continue
            try:
                settle(run)
                times.extend(samples_ms(run, RUNS_PER_ROUND))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    for row, run, session, inputs, times in loaded:
        if "error" in row:
            continue
        row["p50_ms"] = round(float(np.median(times)), 4)
        settle(run)  # and back to back, as it runs when nothing else does (no other configuration between)
        row["alone_p50_ms"] = round(float(np.median(samples_ms(run, ALONE_RUNS))), 4)
        if session is not None:
            timings = profile_partitions(session.executor, inputs, runs=15)
            if all(t.resident_ms is not None for t in timings if t.backend != "cpu"):
                row["resident_ms"] = round(sum(t.resident_ms if t.resident_ms is not None else t.ms
                                               for t in timings), 4)
            session.close()
    with tempfile.NamedTemporaryFile(suffix=".tflite") as f:
        f.write(data)
        f.flush()
        gpu = child_json(LITERT_GPU_CHILD, [f.name, str(RUNS_PER_ROUND * rounds)], 120)
    rows.append({"model": name, "config": "litert-gpu", **gpu})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("models", nargs="+")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--torch", action="store_true")
    args = parser.parse_args()
    with open(args.out, "a") as out:
        if args.torch:
            out.write(json.dumps({"model": "torchvision mobilenet_v2", "config": "torch",
                                  **child_json(TORCH_CHILD, [], 180)}) + "\n")
        for model in args.models:
            for row in measure(model, args.threads, args.rounds):
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
