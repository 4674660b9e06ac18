"""Estimated against measured whole-plan time, per model and configuration, planning from estimates alone (the
profiles as they are: run `delegate calibrate` first; nothing here refits them).

    python3 docs/benchmarks/plan_estimates.py OUT.jsonl MODEL... [--seconds S]

Configurations: the CPU alone; OpenCL and WebGPU with the CPU at fp32 and fp16 (the cost model's choice);
OpenCL and WebGPU greedy; the shipped defaults; and the shipped defaults with `placement.search: measure`
(chosen by measurement, not from estimates alone).  One JSON line per model and configuration (estimated_ms,
measured_ms: p50 of 30 runs after 5, on one input, the configurations of a model alternating (``measure``); the
chosen candidate, partitions, copies, the candidates' estimates, the profiles used), written model by model;
stops starting new models after --seconds."""

import argparse
import json
import time

import numpy as np

import delegate
from delegate.inputs import make_inputs
from delegate.tools.measure import samples_ms

CONFIGS = [("cpu", "fp32"), ("opencl", "fp32"), ("opencl", "fp16"), ("wgpu", "fp32"), ("wgpu", "fp16"),
           ("greedy-opencl", "fp32"), ("greedy-wgpu", "fp16"), ("defaults", "fp16"), ("measure", "fp16")]


def overrides(config: str, precision: str) -> dict:
    if config == "defaults":
        return {"precision": precision}
    if config == "measure":  # the shipped defaults with the measured search
        return {"precision": precision, "placement.search": "measure"}
    extra = {"precision": precision, "placement.search": "estimate"}
    if config.startswith("greedy-"):
        return {**extra, "backends": f"[{config[7:]},cpu]", "partitioner": "greedy"}
    return {**extra, "backends": "[cpu]" if config == "cpu" else f"[{config},cpu]"}


ROUNDS, RUNS_PER_ROUND, WARMUP = 10, 3, 5


def measure(model: str) -> list[dict]:
    """Every configuration of ``model`` loaded side by side, then timed in alternating rounds (RUNS_PER_ROUND
    runs each per round after one untimed, ROUNDS rounds, after WARMUP, in a new shuffled order each round):
    the machine's drift, and what one configuration leaves behind for the next, are shared, so two
    configurations that chose one plan measure alike.  Timed one after the other in fresh sessions, one plan
    on the H200's OpenCL measured 0.75-1.68x itself; in a fixed order, a CPU plan timed right after an OpenCL
    one measured 1.2x itself (the device's threads still busy)."""
    rows, loaded = [], []
    for config, precision in CONFIGS:
        row = {"model": model.rsplit("/", 1)[-1], "backend": config, "precision": precision}
        try:
            session = delegate.load(model, **overrides(config, precision))
            session.wait_until_ready()  # the plan chosen, where it is measured or compiled behind the first runs
            inputs = session.normalize_inputs(make_inputs(session.graph, None))
            samples_ms(lambda: session.run_indexed(inputs), 0, warmup=WARMUP)
            loaded.append((row, session, inputs, []))
        except Exception as exc:  # a model a configuration cannot run is a row saying why
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    order = np.random.default_rng(0)
    for _ in range(ROUNDS):
        for j in order.permutation(len(loaded)):
            row, session, inputs, times = loaded[j]
            if "error" in row:
                continue
            try:
                times.extend(samples_ms(lambda: session.run_indexed(inputs), RUNS_PER_ROUND, warmup=1))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    for row, session, _, times in loaded:
        if "error" not in row:
            plan = session.plan
            row.update(estimated_ms=round(plan.estimated_ms, 4), measured_ms=round(float(np.median(times)), 4),
                       chosen=plan.chosen, choice=plan.choice, partitions=len(plan.partitions), copies=len(plan.copies),
                       candidates={c.name: round(c.estimated_ms, 4) for c in plan.candidates},
                       profiles=plan.profiles)
        session.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("models", nargs="+")
    parser.add_argument("--seconds", type=float, default=float("inf"))
    args = parser.parse_args()
    deadline = time.time() + args.seconds
    with open(args.out, "a") as out:
        for model in args.models:
            if time.time() > deadline:
                break
            for row in measure(model):
                out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
