"""Estimated against measured whole-plan time, per model and configuration, planning from estimates alone (the
profiles as they are: run `delegate calibrate` first; nothing here refits them).

    python3 docs/benchmarks/plan_estimates.py OUT.jsonl MODEL... [--seconds S]
    python3 docs/benchmarks/plan_estimates.py --summary OUT.jsonl

Configurations: the CPU alone; OpenCL and WebGPU with the CPU at fp32 and fp16 (the cost model's choice);
OpenCL and WebGPU greedy; the shipped defaults; the shipped defaults with `placement.search: estimate` (the
plan chosen from estimates alone) and with `placement.search: measure` (chosen by measurement).  One JSON line per model and configuration (estimated_ms,
measured_ms: p50 of 10 rounds of at least 3 runs and ROUND_MS each, after 5, on one input, the configurations of a model alternating, each settling
before its runs of a round (``measure``); the
chosen candidate, partitions, copies, the candidates' estimates, the profiles used), written model by model;
stops starting new models after --seconds."""

import argparse
import json
import time

import numpy as np

import delegate
from delegate.inputs import make_inputs
from delegate.tools.measure import samples_ms, settle

CONFIGS = [("cpu", "fp32"), ("opencl", "fp32"), ("opencl", "fp16"), ("wgpu", "fp32"), ("wgpu", "fp16"),
           ("greedy-opencl", "fp32"), ("greedy-wgpu", "fp16"), ("defaults", "fp16"), ("estimate", "fp16"),
           ("measure", "fp16")]
SINGLES = ("cpu", "greedy-opencl", "greedy-wgpu")  # the CPU alone and each accelerator taking all it can
ACCELERATED = ("opencl", "wgpu")  # the cost plans whose estimates the goal counts


def overrides(config: str, precision: str) -> dict:
    if config == "defaults":
        return {"precision": precision}
    if config in ("measure", "estimate"):  # the shipped defaults, the plan chosen one way only
        return {"precision": precision, "placement.search": config}
    extra = {"precision": precision, "placement.search": "estimate"}
    if config.startswith("greedy-"):
        return {**extra, "backends": f"[{config[7:]},cpu]", "partitioner": "greedy"}
    return {**extra, "backends": "[cpu]" if config == "cpu" else f"[{config},cpu]"}


ROUNDS, RUNS_PER_ROUND, WARMUP = 10, 3, 5
# a configuration's runs of one round last at least this long (more than RUNS_PER_ROUND where runs are short):
# 30 runs of a 0.03-0.3 ms plan left one plan 0.75-1.15x itself in the configurations that chose it (this 2-core
# machine; an H100 host)
ROUND_MS = 5.0


def measure(model: str) -> list[dict]:
    """Every configuration of ``model`` loaded side by side, then timed in alternating rounds (RUNS_PER_ROUND
    runs or ROUND_MS, whichever is more, each per round after it settles (``measure.settle``), ROUNDS rounds, after WARMUP, in a new shuffled
    order each round):
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
            warm = samples_ms(lambda: session.run_indexed(inputs), WARMUP)
            runs = int(np.clip(np.ceil(ROUND_MS / max(float(np.median(warm)), 1e-3)), RUNS_PER_ROUND, 200))
            loaded.append((row, session, inputs, [], runs))
        except Exception as exc:  # a model a configuration cannot run is a row saying why
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    order = np.random.default_rng(0)
    for _ in range(ROUNDS):
        for j in order.permutation(len(loaded)):
            row, session, inputs, times, runs = loaded[j]
            if "error" in row:
                continue
            try:
                run = lambda: session.run_indexed(inputs)  # noqa: E731
                settle(run)
                times.extend(samples_ms(run, runs))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    for row, session, _, times, _ in loaded:
        if "error" not in row:
            plan = session.plan
            row.update(estimated_ms=round(plan.estimated_ms, 4), measured_ms=round(float(np.median(times)), 4),
                       chosen=plan.chosen, choice=plan.choice, partitions=len(plan.partitions), copies=len(plan.copies),
                       candidates={c.name: round(c.estimated_ms, 4) for c in plan.candidates},
                       profiles=plan.profiles)
        session.close()
    return rows


def summary(path: str) -> None:
    """Per model, each chosen plan's measured time over the best single backend's (CPU alone, each accelerator
    greedy) and over the best of every configuration measured; then the goals' counts: the defaults and
    ``measure`` against the best single backend (<= 1.05x, <= 1.02x), the estimates-alone pick against the
    measured best (<= 1.10x), and the accelerated cost plans whose estimate is within 25% of their time."""
    models: dict[str, dict[str, dict]] = {}
    for line in open(path):
        row = json.loads(line)
        if "measured_ms" in row:
            models.setdefault(row["model"], {})[f"{row['backend']}/{row['precision']}"] = row
    counts = {"defaults": [0, 0], "measure": [0, 0], "estimate": [0, 0], "within25": [0, 0]}
    print(f"{'model':34} {'best single':>14} {'defaults':>9} {'measure':>8} {'estimate':>9}  (x best single;"
          " estimate: x best measured)")
    for model, rows in models.items():
        singles = [r["measured_ms"] for key, r in rows.items() if key.split("/")[0] in SINGLES]
        best_single, best = min(singles, default=None), min(r["measured_ms"] for r in rows.values())
        cells = []
        for config, bound, against in (("defaults", 1.05, best_single), ("measure", 1.02, best_single),
                                       ("estimate", 1.10, best)):
            row = rows.get(f"{config}/fp16")
            if row is None or against is None:
                cells.append("-")
                continue
            ratio = row["measured_ms"] / against
            counts[config][0] += ratio <= bound
            counts[config][1] += 1
            cells.append(f"{ratio:.2f}")
        for key, row in rows.items():
            if key.split("/")[0] in ACCELERATED:
                counts["within25"][0] += abs(row["estimated_ms"] / row["measured_ms"] - 1) <= 0.25
                counts["within25"][1] += 1
        single = f"{best_single:.3f} ms" if best_single is not None else "-"
        print(f"{model:34} {single:>14} {cells[0]:>9} {cells[1]:>8} {cells[2]:>9}")
    for name, goal in (("defaults", "<= 1.05x best single"), ("measure", "<= 1.02x best single"),
                       ("estimate", "<= 1.10x best measured"), ("within25", "accelerated cost-plan estimates within 25%")):
        hit, total = counts[name]
        print(f"{name}: {hit} of {total} {goal}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("models", nargs="*")
    parser.add_argument("--seconds", type=float, default=float("inf"))
    parser.add_argument("--summary", action="store_true", help="print the goals' counts from OUT and stop")
    args = parser.parse_args()
    if args.summary:
        summary(args.out)
        return
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
