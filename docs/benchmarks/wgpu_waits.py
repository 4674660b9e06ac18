"""WebGPU's runs through a watchdog thread against runs on the calling thread with the bounded wait, per model.

    python3 docs/benchmarks/wgpu_waits.py OUT.jsonl MODEL... [--rounds 8]

Per model, in one process: the greedy WebGPU plan at fp32 twice (once with ``WgpuBackend.bound_waits`` answering
no, so the session gives the backend a watchdog thread as before, once as shipped), at fp16, and OpenCL's greedy
plan at fp32, loaded side by side and timed in rounds of 20 runs after 2, in a new shuffled order each round;
p50 and p10 ms host in and host out.  One JSON line per model and configuration."""

import argparse
import json

import numpy as np

import delegate
from delegate.inputs import make_inputs
from delegate.tools.measure import samples_ms
from delegate_wgpu.backend import WgpuBackend

RUNS = 20
CONFIGS = [("wgpu", "fp32", True), ("wgpu", "fp32", False), ("wgpu", "fp16", False), ("opencl", "fp32", False)]


def load(model: str, backend: str, precision: str, watchdog: bool):
    shipped = WgpuBackend.bound_waits
    if watchdog:
        WgpuBackend.bound_waits = lambda self, seconds: False
    try:
        session = delegate.load(model, None, precision=precision, backends=f"[{backend},cpu]", partitioner="greedy",
                                **{"placement.search": "estimate"})
        session.wait_until_ready()  # the backend starts and compiles behind the first runs: under the patch above
        return session
    finally:
        WgpuBackend.bound_waits = shipped


def measure(model: str, rounds: int) -> list[dict]:
    loaded = []
    for backend, precision, watchdog in CONFIGS:
        session = load(model, backend, precision, watchdog)
        inputs = session.normalize_inputs(make_inputs(session.graph, None))
        session.run_indexed(inputs)
        row = {"model": model.rsplit("/", 1)[-1], "backend": backend, "precision": precision,
               "watchdogs": sorted(session.executor.watchdogs)}
        loaded.append((row, session, inputs, []))
    order = np.random.default_rng(0)
    for _ in range(rounds):
        for j in order.permutation(len(loaded)):
            _, session, inputs, times = loaded[j]
            times.extend(samples_ms(lambda: session.run_indexed(inputs), RUNS, warmup=2))
    rows = []
    for row, session, _, times in loaded:
        row.update(p50_ms=round(float(np.median(times)), 4), p10_ms=round(float(np.percentile(times, 10)), 4))
        session.close()
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("models", nargs="+")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with open(args.out, "a") as out:
        for model in args.models:
            for row in measure(model, args.rounds):
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
