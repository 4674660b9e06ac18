"""Estimated against measured whole-plan time, per model and configuration, planning from estimates alone (the
profiles as they are: run `delegate calibrate` first; nothing here refits them).

    python3 docs/benchmarks/plan_estimates.py OUT.jsonl MODEL... [--seconds S]

Configurations: the CPU alone; OpenCL and WebGPU with the CPU at fp32 and fp16 (the cost model's choice);
OpenCL and WebGPU greedy; the shipped defaults.  One JSON line per model and configuration (estimated_ms,
measured_ms: p50 of 30 runs after 5, on one input; the chosen candidate, partitions, copies, the candidates'
estimates, the profiles used), written as it goes; stops starting new models after --seconds."""

import argparse
import json
import time

import numpy as np

import delegate
from delegate.inputs import make_inputs
from delegate.tools.measure import samples_ms

CONFIGS = [("cpu", "fp32"), ("opencl", "fp32"), ("opencl", "fp16"), ("wgpu", "fp32"), ("wgpu", "fp16"),
           ("greedy-opencl", "fp32"), ("greedy-wgpu", "fp16"), ("defaults", "fp16")]


def overrides(config: str, precision: str) -> dict:
    if config == "defaults":
        return {"precision": precision}
    extra = {"precision": precision, "placement.search": "estimate"}
    if config.startswith("greedy-"):
        return {**extra, "backends": f"[{config[7:]},cpu]", "partitioner": "greedy"}
    return {**extra, "backends": "[cpu]" if config == "cpu" else f"[{config},cpu]"}


def measure(model: str, config: str, precision: str) -> dict:
    row = {"model": model.rsplit("/", 1)[-1], "backend": config, "precision": precision}
    try:
        session = delegate.load(model, **overrides(config, precision))
        inputs = session.normalize_inputs(make_inputs(session.graph, None))
        times = samples_ms(lambda: session.run_indexed(inputs), 30, warmup=5)
        plan = session.plan
        row.update(estimated_ms=round(plan.estimated_ms, 4), measured_ms=round(float(np.median(times)), 4),
                   chosen=plan.chosen, partitions=len(plan.partitions), copies=len(plan.copies),
                   candidates={c.name: round(c.estimated_ms, 4) for c in plan.candidates}, profiles=plan.profiles)
        session.close()
    except Exception as exc:  # a model a configuration cannot run is a row saying why
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


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
            for config, precision in CONFIGS:
                out.write(json.dumps(measure(model, config, precision)) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
