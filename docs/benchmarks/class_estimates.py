"""Where a backend's estimate of a model goes wrong: per cost class, the planner's estimate of the class's ops
against their measured share of the partition (each op timed as the backend's op timer does, scaled to the
partition's measured time where the timer times ops alone), on the profiles as they are (nothing is refitted).

    python3 docs/benchmarks/class_estimates.py OUT.jsonl MODEL... [--backend cpu] [--set KEY=VALUE ...]

One JSON line per model: the plan's estimate and measured p50 (30 runs after 5), the partition's own time,
and per class the op count, estimated ms and measured ms."""

import argparse
import json

import numpy as np

import delegate
from delegate.inputs import make_inputs
from delegate.tools.measure import profile_partitions, samples_ms


def classes(session, timings) -> dict:
    folded = {name: session.planner.folded(session.graph, name) for name in session.backends}
    rows: dict = {}
    for part, timing in zip(session.executor.partitions, timings):
        timed = sum(timing.op_ms.values())
        # as the refit takes them (cost.refit): ops timed alone, or timers adding up past the partition, give shares
        share = timing.ms / timed if (timing.ops_alone and timed > 0) or timed > timing.ms > 0 else 1.0
        for op in part.ops:
            if op.index in folded[part.backend]:
                continue
            klass = session.backends[part.backend].cost_class(op)  # the class the planner costs it by
            row = rows.setdefault(f"{part.backend}:{klass}", {"ops": 0, "estimated_ms": 0.0, "measured_ms": 0.0})
            row["ops"] += 1
            row["estimated_ms"] += session.planner.op_cost(op, part.backend)
            row["measured_ms"] += timing.op_ms.get(op.index, 0.0) * share
    return {k: {**v, "estimated_ms": round(v["estimated_ms"], 4), "measured_ms": round(v["measured_ms"], 4)}
            for k, v in sorted(rows.items(), key=lambda kv: -kv[1]["measured_ms"])}


def measure(model: str, backend: str, settings: dict) -> dict:
    row = {"model": model.rsplit("/", 1)[-1], "backend": backend}
    try:
        backends = "[cpu]" if backend == "cpu" else f"[{backend},cpu]"
        session = delegate.load(model, backends=backends, partitioner="greedy", **{"placement.search": "estimate"},
                                **settings)
        session.wait_until_ready()  # the plan measured, not the CPU answering while the accelerator starts
        inputs = session.normalize_inputs(make_inputs(session.graph, None))
        times = samples_ms(lambda: session.run_indexed(inputs), 30, warmup=5)
        timings = profile_partitions(session.executor, inputs, 15)
        row.update(estimated_ms=round(session.plan.estimated_ms, 4), measured_ms=round(float(np.median(times)), 4),
                   partitions_ms=round(sum(t.ms for t in timings), 4), op_sources=sorted({t.op_source for t in timings}),
                   classes=classes(session, timings))
        session.close()
    except Exception as exc:  # a model the configuration cannot run is a row saying why
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("models", nargs="+")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.set)
    with open(args.out, "a") as out:
        for model in args.models:
            out.write(json.dumps(measure(model, args.backend, settings)) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
