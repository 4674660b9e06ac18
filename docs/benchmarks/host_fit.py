"""The host's fit, replayed away from the machine it describes: collect raw CPU timings once on that machine,
then refit its calibrated profile here as `calibrate` would, and compare the estimates of models the fit never
saw with their measured time.  For changing the cost model's fit without a run on the device per change.

    # on the machine (after `delegate calibrate`; copy its profile directory back with RAW.jsonl)
    python3 docs/benchmarks/host_fit.py collect THREADS RAW.jsonl MODEL...
    # anywhere with the same models
    python3 docs/benchmarks/host_fit.py refit PROFILE_DIR RAW.jsonl [-v] [-c]
    # or, without RAW.jsonl: from the fit points the profile keeps, against plan_estimates.py's CPU plans
    python3 docs/benchmarks/host_fit.py replay PROFILE_DIR THREADS PLANS.jsonl MODEL... [-v]

collect: the CPU alone (the configured engine) at THREADS on `calibrate`'s example networks and on each MODEL;
per model the plan's p50 (60 runs after 10) and each partition as `measure.profile_partitions` times it.
refit: takes PROFILE_DIR's host profile for that thread count (its measured figures; the fit is redone),
refits it to the example networks' timings with `measure.learn_from`, as `calibrate` does, then prints each
model's estimate against its measured p50, the networks and the other models apart (-v: each; -c: and its
classes' estimates against their ops' measured share of the time, est/meas ms, largest gaps first).
replay: refits PROFILE_DIR's host profile for THREADS from the measurements it keeps (``fit_points``: every op
share and partition `calibrate` fitted to), then prints each MODEL's estimate against the p50 of its CPU plan in
PLANS.jsonl (`plan_estimates.py`'s output, from the same call): a fit change tried on a host's own data."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np


def _model(name: str) -> bytes:
    from delegate import zoo

    if "|" in name:  # an example network: name|arguments
        net, kwargs = name.split("|", 1)
        return zoo.build(net, **json.loads(kwargs))
    return Path(name).read_bytes()


def _session(data: bytes, threads: int):
    import delegate

    return delegate.load(data, backends="[cpu]", num_threads=threads, **{"placement.search": "estimate"})


def collect(threads: int, out: str, models: list[str]) -> None:
    from delegate.inputs import make_inputs
    from delegate.tools.calibrate import WORKLOADS
    from delegate.tools.measure import profile_partitions, samples_ms

    names = [f"{net}|{json.dumps(kwargs, sort_keys=True)}" for net, kwargs in WORKLOADS] + models
    with open(out, "w") as f:
        for name in names:
            session = _session(_model(name), threads)
            inputs = session.normalize_inputs(make_inputs(session.graph, None))
            plan_ms = float(np.median(samples_ms(lambda: session.run_indexed(inputs), 60, warmup=10)))
            timings = [dataclasses.asdict(t) for t in profile_partitions(session.executor, inputs, 25)]
            f.write(json.dumps({"model": name, "threads": threads, "plan_ms": plan_ms, "timings": timings}) + "\n")
            session.close()


def _class_gaps(session, row) -> str:
    """Per cost class, the estimate against the measured ops' share of the partitions' time (ops timed alone,
    scaled to their partition's measured time), largest gaps first."""
    cost_class = session.backends[session.host].cost_class  # the class the planner costs each op by
    ops = {op.index: op for op in session.graph.ops}
    folded = session.planner.folded(session.graph, session.host)
    estimated, measured = {}, {}
    for op in session.graph.ops:
        if op.index not in folded:
            k = cost_class(op)
            estimated[k] = estimated.get(k, 0.0) + session.planner.op_cost(op, session.host)
    for t in row["timings"]:  # the ops the engine folds take no part (alone they cost what they never do inside)
        timed = {int(i): ms for i, ms in t["op_ms"].items() if int(i) not in folded}
        for i, ms in timed.items():
            k = cost_class(ops[i])
            measured[k] = measured.get(k, 0.0) + ms * t["ms"] / sum(timed.values())
    keys = sorted(set(estimated) | set(measured), key=lambda k: -abs(estimated.get(k, 0) - measured.get(k, 0)))
    return ", ".join(f"{k} {estimated.get(k, 0):.3f}/{measured.get(k, 0):.3f}" for k in keys[:4])


def _stored_host(profiles: str, backend, threads: int) -> dict:
    engine = backend.device_info().get("engine")
    found = [json.loads(p.read_text()) for p in Path(profiles).glob("*.json")]
    stored = next((d for d in found if d.get("device_info", {}).get("backend") == "cpu"
                   and d["device_info"].get("engine") == engine and d["device_info"].get("threads") == threads), None)
    if stored is None:
        sys.exit(f"no {engine} host profile at {threads} threads in {profiles}")
    return stored


def replay(profiles: str, threads: int, plans: str, models: list[str], verbose: bool) -> None:
    os.environ["DELEGATE_PROFILE_DIR"] = here = tempfile.mkdtemp(prefix="delegate-profiles-")
    from delegate.cost import DeviceProfile, fingerprint, profile_info, refit

    measured = {}
    for line in open(plans):
        row = json.loads(line)
        if row["backend"] == "cpu":
            measured[row["model"]] = row["measured_ms"]
    probe = _session(_model(models[0]), threads)
    backend = probe.backends[probe.host]
    probe.close()
    stored = _stored_host(profiles, backend, threads)
    default = backend.default_profile()
    profile = DeviceProfile(**{k: v for k, v in stored.items() if k in DeviceProfile.__dataclass_fields__})
    profile = dataclasses.replace(profile, class_scale=dict(default.class_scale),
                                  class_floor_us=dict(default.class_floor_us),
                                  class_reach_ms=dict(default.class_reach_ms), kind_scale=default.kind_scale,
                                  serial_kinds=default.serial_kinds)
    refit(profile, [], lambda op: False)  # no new measurement: the fit redone over the kept ones
    fields = {k: v for k, v in dataclasses.asdict(profile).items() if k not in ("kind_scale", "serial_kinds")}
    Path(here, fingerprint(profile_info(backend, threads)) + ".json").write_text(json.dumps(fields))
    ratios = []
    for path in models:
        name = Path(path).name
        if name not in measured:
            continue
        session = _session(_model(path), threads)
        ratios.append(session.plan.estimated_ms / measured[name])
        if verbose:
            print(f"  {name[:60]:60s} estimated {session.plan.estimated_ms:8.4f} measured {measured[name]:8.4f}  "
                  f"{ratios[-1]:.2f}")
        session.close()
    r = np.array(ratios)
    print(f"models: {int(((r >= 0.75) & (r <= 1.25)).sum())} of {len(r)} within ±25%, median {np.median(r):.2f}, "
          f"range {r.min():.2f}-{r.max():.2f}")
    shutil.rmtree(here, ignore_errors=True)


def refit_and_compare(profiles: str, raw: str, verbose: bool, by_class: bool = False) -> None:
    rows = [json.loads(line) for line in open(raw)]
    threads = rows[0]["threads"]
    os.environ["DELEGATE_PROFILE_DIR"] = here = tempfile.mkdtemp(prefix="delegate-profiles-")
    from delegate.cost import DeviceProfile, fingerprint, profile_info
    from delegate.tools.measure import PartitionTiming, learn_from

    probe = _session(_model(rows[0]["model"]), threads)
    backend = probe.backends[probe.host]
    probe.close()
    stored = _stored_host(profiles, backend, threads)
    # calibrate's starting point: the measured figures, the backend's own class figures, nothing fitted yet
    default = backend.default_profile()
    start = DeviceProfile(**{k: v for k, v in stored.items() if k in DeviceProfile.__dataclass_fields__})
    start = dataclasses.replace(start, class_scale=dict(default.class_scale), class_floor_us=dict(default.class_floor_us),
                                class_reach_ms=dict(default.class_reach_ms), fit_points={}, measured_op_ms={},
                                run_us=0.0, fitted_at="", fit_samples=0)
    fields = {k: v for k, v in dataclasses.asdict(start).items() if k not in ("kind_scale", "serial_kinds")}
    Path(here, fingerprint(profile_info(backend, threads)) + ".json").write_text(json.dumps(fields))
    networks = [r for r in rows if "|" in r["model"]]
    for row in networks:
        session = _session(_model(row["model"]), threads)
        learn_from(session, session.executor, [PartitionTiming(**{**t, "op_ms": {int(k): v for k, v in t["op_ms"].items()}})
                                               for t in row["timings"]], plan_ms=row["plan_ms"])
        session.close()
    for group, members in (("networks", networks), ("other models", [r for r in rows if "|" not in r["model"]])):
        ratios = []
        for row in members:
            session = _session(_model(row["model"]), threads)
            ratios.append(session.plan.estimated_ms / row["plan_ms"])
            if verbose:
                print(f"  {row['model'][:60]:60s} estimated {session.plan.estimated_ms:8.4f} measured "
                      f"{row['plan_ms']:8.4f}  {ratios[-1]:.2f}")
            if by_class:
                print("    " + _class_gaps(session, row))
            session.close()
        if ratios:
            r = np.array(ratios)
            print(f"{group}: {int(((r >= 0.75) & (r <= 1.25)).sum())} of {len(r)} within ±25%, median "
                  f"{np.median(r):.2f}, range {r.min():.2f}-{r.max():.2f}")
    shutil.rmtree(here, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "collect":
        collect(int(sys.argv[2]), sys.argv[3], sys.argv[4:])
    elif len(sys.argv) >= 6 and sys.argv[1] == "replay":
        replay(sys.argv[2], int(sys.argv[3]), sys.argv[4], [a for a in sys.argv[5:] if a != "-v"], "-v" in sys.argv[5:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "refit":
        refit_and_compare(sys.argv[2], sys.argv[3], "-v" in sys.argv[4:], "-c" in sys.argv[4:])
    else:
        sys.exit(__doc__)
