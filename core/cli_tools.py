"""The measuring subcommands: analyze, bench, validate, calibrate, cache."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .backend import Support, asked_support
from .errors import CacheError, DelegateError, ExecutionError, MeasurementError
from .stdio import native_stderr, progress
from .tools.compare import compare_outputs
from .tools.measure import (alone_median, learn_from, peak_rss_mb, reference_slowed, separate_peak_rss,
                            time_alternating)
from .tools.reference import litert_cpu

ANALYZE_WARN_BELOW = 0.80
log = logging.getLogger(__name__)


# -- analyze ---------------------------------------------------------------------

def cmd_analyze(args) -> int:
    from .cli import console, emit_json, load_cli_config, read_model_arg, table
    from .cost import op_flops
    from .plugins import default_manager
    from .session import run_settings

    config = load_cli_config(args)
    settings = run_settings(config.for_model(args.model))
    model, _, label = read_model_arg(args.model)
    g = model.main
    total_flops = sum(op_flops(op) for op in g.ops) or 1.0
    report = []
    manager = default_manager(settings.disable_plugins)
    for status in manager.status():
        name = status.name
        if not status.available:
            report.append({"backend": name, "available": False, "reason": status.reason})
            continue
        options = dict(settings.backends).get(name, {})
        try:
            backend = manager.backend_info(name).factory(options)
        except Exception as exc:  # a broken plugin is reported, not fatal
            report.append({"backend": name, "available": False, "reason": f"failed to start: {exc}"})
            continue
        supported, flops, blockers = 0, 0.0, {}
        for op in g.ops:
            try:
                answer = asked_support(backend, op, settings.compile)
            except Exception as exc:  # a plugin bug blocks that op, as it would in a plan
                answer = Support.no(f"support query failed: {type(exc).__name__}: {exc}")
            if answer:
                supported += 1
                flops += op_flops(op)
            else:
                key = f"{op.opcode} v{op.version}"
                entry = blockers.setdefault(key, {"count": 0, "reason": answer.reason, "ops": []})
                entry["count"] += 1
                entry["ops"].append(op.index)
        share = supported / max(len(g.ops), 1)
        entry = {"backend": name, "available": True, "ops_supported": supported, "ops_total": len(g.ops),
                 "op_share": round(share, 4), "compute_share": round(flops / total_flops, 4), "blockers": blockers}
        if share < ANALYZE_WARN_BELOW:
            entry["warning"] = (f"only {share:.0%} of ops run on {name} (below {ANALYZE_WARN_BELOW:.0%}): "
                                f"expect partitions and copies")
        report.append(entry)
        backend.close()
    if args.json:
        emit_json({"model": label, "backends": report})
        return 0
    c = console()
    rows = [[r["backend"], f"{r['ops_supported']}/{r['ops_total']} ({r['op_share']:.0%})",
             f"{r['compute_share']:.0%}", ", ".join(f"{k} x{v['count']}" for k, v in r["blockers"].items()) or "-"]
            if r["available"] else [r["backend"], "unavailable", "-", r["reason"]] for r in report]
    c.print(table(f"op support for {label}", ["backend", "ops", "compute", "blocked by"], rows))
    for r in report:
        if r.get("warning"):
            c.print(f"WARNING: {r['warning']}")
        for key, b in (r.get("blockers") or {}).items():
            c.print(f"  {r['backend']}: {key}: {b['reason']}")
    return 0


# -- bench -----------------------------------------------------------------------


def cmd_suite(args) -> int:
    """The whole corpus on every configuration; see delegate.suite."""
    from . import zoo
    from .cli import console, emit_json, load_cli_config, read_model_arg
    from .executor import ray_requested
    from .suite import CONFIGS, fresh_out, run_suite

    specs = args.models or [f"zoo:{name}" for name in sorted(zoo.ZOO)]
    for directory in args.models_dir or []:
        specs += sorted(str(p) for p in Path(directory).glob("*.tflite"))
    models = [(Path(s).stem if not s.startswith("zoo:") else s, read_model_arg(s)[1]) for s in specs]
    configs = args.configs.split(",") if args.configs else None
    unknown = set(configs or []) - {c.name for c in CONFIGS}
    if unknown:
        raise DelegateError(f"unknown suite config(s) {sorted(unknown)}; known: {[c.name for c in CONFIGS]}")
    out = Path(args.out) if args.out else fresh_out()
    if ray_requested(args, load_cli_config(args)):  # a fleet sweep: every node of the cluster
        from . import fleet
        command = "delegate " + " ".join(sys.argv[1:])
        return render_fleet_suite(args, fleet.suite(models, configs, args.runs, args.threads, args.preference, out,
                                                    command, args.ray_address))
    with progress("suite", len(models) * (len(configs or CONFIGS) + 1)) as advance:
        rows, files = run_suite(models, configs, args.runs, args.threads, out, advance, args.preference)
    if args.json:
        emit_json({"rows": [r.__dict__ for r in rows], "files": [str(f) for f in files]})
        return 0
    c = console()
    c.print(Path(files[0]).read_text())
    c.print("written: " + ", ".join(str(f) for f in files))
    return 0


def render_fleet_suite(args, doc: dict[str, Any]) -> int:
    """The suite's rows of every node: one table keyed by node and device (delegate.fleet)."""
    from .cli import console, emit_json, table
    from .fleet import failure

    problem = failure(doc["nodes"])
    if args.json:
        emit_json(doc)
        return problem.exit_code if problem else 0
    c = console()
    c.print(table("suite per node and device", ["node", "backend", "device", "fingerprint", "model", "config",
                                                "p50 ms", "LiteRT ms", "ratio", "status"],
                  [[r["node"], r["backend"], r["device"], r["fingerprint"] or "-", r["model"], r["config"],
                    _fmt_ms(r["p50_ms"]), _fmt_ms(r["litert_ms"]), _fmt_ms(r["ratio"], 2), r["status"]]
                   for r in doc["rows"]]))
    _print_node_errors(c, doc["nodes"])
    c.print("written: " + ", ".join(doc["files"]))
    return problem.exit_code if problem else 0


def render_fleet_calibration(args, doc: dict[str, Any]) -> int:
    """Every node's calibration: one table keyed by node and device, the profiles stored here (delegate.fleet)."""
    from .cli import console, emit_json, table
    from .fleet import failure

    problem = failure(doc["nodes"])
    code = problem.exit_code if problem else MeasurementError.exit_code if doc["refused"] else 0
    if args.json:
        emit_json(doc)
        return code
    c = console()
    c.print(table("calibration per node and device", ["node", "backend", "device", "fingerprint", "GFLOP/s", "GB/s",
                                                      "launch us", "partition us", "stored here as"],
                  [[r["node"], r["backend"], r["device"], r["fingerprint"], r["gflops"], r["gbytes_per_s"],
                    r["launch_us"], r["partition_us"], r["profile"]] for r in doc["profiles"]]))
    c.print(table("fit to workloads", ["node", "backend", "workload", "estimated ms", "measured ms"],
                  [[w["node"], w["backend"], w["workload"], w["estimated_ms"], w["measured_ms"]]
                   for w in doc["workloads"]]))
    for key in ("skipped", "refused"):
        for r in doc[key]:
            c.print(f"{key} {r['backend']} on {r['node']}: {r['reason']}")
    _print_node_errors(c, doc["nodes"])
    return code


def _print_node_errors(c, nodes: list[dict[str, Any]]) -> None:
    for node in nodes:
        if "error" in node:
            c.print(f"node {node['node']} ({node['node_id'][:8]}) failed: {node['error']['message']}")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _fmt_ms(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cmd_bench(args) -> int:
    from .cli import console, emit_json, load_cli_config, read_model_arg, table

    if args.suite:
        return cmd_suite(args)
    if args.ray or args.ray_address:
        raise DelegateError("bench --ray runs the suite on every node of the cluster: add --suite")
    from .inputs import make_inputs
    from .session import Session, run_settings

    config = load_cli_config(args)
    settings = run_settings(config.for_model(args.model))
    model, data, label = read_model_arg(args.model)
    if args.batch:
        from .shapes import with_batch
        from .tflite.writer import write_model
        with_batch(model.main, args.batch)
        data = write_model(model)  # the reference runs the same batch
        label += f" (batch {args.batch})"
    t0 = time.perf_counter()
    session = Session(model, settings)
    init_ms = (time.perf_counter() - t0) * 1e3
    named = make_inputs(session.graph, args.input, config, seed=args.seed)
    indexed = session.normalize_inputs(named)
    reference = None
    if args.compare == "litert":
        with native_stderr(log):  # LiteRT's XNNPACK line: to the log
            run_reference = litert_cpu(data, settings.compile.num_threads or 1)
        reference_inputs = [named[t.name] for t in session.graph.inputs]
        reference = lambda: run_reference(reference_inputs)  # noqa: E731
    # LiteRT alone, before delegate has run at all: the baseline that shows whether delegate slows it.
    reference_alone = alone_median(reference, max(5, args.runs // 4), warmup=2) if reference else None
    for _ in range(args.warmup):
        session.run_indexed(indexed)
        if reference:
            reference()
    with progress("timed runs", args.runs) as advance:
        ours, theirs = time_alternating(lambda: session.run_indexed(indexed), reference, args.runs, advance)
    per_op, timings = _measured_profile(session, session.executor, indexed)
    estimates = {p.index: session.partition_estimate(p) for p in session.executor.partitions}
    doc: dict[str, Any] = {
        "model": label, "runs": args.runs, "batch": args.batch or 1, "init_ms": round(init_ms, 3),
        "throughput_per_s": round((args.batch or 1) * 1e3 / float(np.median(ours)), 1),
        "median_ms": round(float(np.median(ours)), 4),
        "p50_ms": round(float(np.percentile(ours, 50)), 4), "p90_ms": round(float(np.percentile(ours, 90)), 4),
        "p99_ms": round(float(np.percentile(ours, 99)), 4),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "partitions": len(session.plan.partitions), "copies": len(session.plan.copies),
        "backends": [p.backend for p in session.plan.partitions],
        "estimated_ms": round(session.plan.estimated_ms, 4),
        "estimate_ratio": round(session.plan.estimated_ms / max(float(np.median(ours)), 1e-9), 3),
        "partition_times": [{"partition": t.index, "backend": t.backend, "estimated_ms": round(estimates[t.index], 4),
                             "measured_ms": round(t.ms, 4), "host_ms": round(t.host_ms, 4),
                             "resident_ms": _rounded(t.resident_ms), "boundary_ms": _rounded(t.boundary_ms),
                             "ops_ms": round(sum(t.op_ms.values()), 4) if t.op_ms else None,
                             "op_times": t.op_source} for t in timings],
        # every partition run once with its inputs and outputs on its device, summed; None unless each has one
        "resident_ms": (round(sum(t.resident_ms for t in timings), 4)
                        if timings and all(t.resident_ms is not None for t in timings) else None),
        "top_ops": sorted(per_op, key=lambda r: -r["ms"])[:5],
    }
    # the plan against its partitions timed alone: what a whole run costs beyond them.  Timed alone too where
    # runs alternated with a reference: its runs between ours leave caches and cores as a plan alone never finds
    # them (MobileNetV2 at 2 threads on the H100's host: 0.63 ms over its one partition)
    plan_ms = alone_median(lambda: session.run_indexed(indexed), max(5, args.runs // 4)) if reference \
        else float(np.median(ours))
    doc["profiles_saved"] = learn_from(session, session.executor, timings, args.profile, plan_ms=plan_ms)
    if reference:
        doc["reference"] = "litert"
        doc["reference_median_ms"] = round(float(np.median(theirs)), 4)
        doc["ratio"] = round(doc["median_ms"] / max(doc["reference_median_ms"], 1e-9), 3)
        doc["reference_alone_median_ms"] = round(reference_alone, 4)
        doc["reference_slowed"] = reference_slowed(doc["reference_median_ms"], reference_alone)
        # each run back to back, as a model runs when nothing else does: a runtime's runs may slow the other's
        # next ones (the numpy engine at 2 threads on an H100 host: 3.34 ms alone, 5.03 right after LiteRT's)
        doc["alone_median_ms"] = round(plan_ms, 4)
        doc["alone_ratio"] = round(plan_ms / max(reference_alone, 1e-9), 3)
        ours_mb, theirs_mb = separate_peak_rss(data, settings.compile.num_threads or 1, args.config, args.backends,
                                               args.set or [])
        doc["peak_rss_mb"], doc["reference_peak_rss_mb"] = round(ours_mb, 1), round(theirs_mb, 1)
        doc["rss_ratio"] = round(ours_mb / theirs_mb, 3)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("run,delegate_ms" + (",litert_ms" if reference else "") + "\n")
            for i, v in enumerate(ours):
                f.write(f"{i},{v:.5f}" + (f",{theirs[i]:.5f}" if reference else "") + "\n")
    if args.json:
        emit_json(doc)
        return 0
    c = console()
    c.print(f"[bold]{label}[/bold]: {args.runs} runs after {args.warmup} warm-ups; init {init_ms:.1f} ms; "
            f"{session.plan.summary()}")
    c.print(f"delegate: p50 {doc['p50_ms']:.3f} ms, p90 {doc['p90_ms']:.3f} ms, p99 {doc['p99_ms']:.3f} ms; "
            f"peak RSS {doc['peak_rss_mb']:.0f} MB")
    if reference:
        c.print(f"litert:   median {doc['reference_median_ms']:.3f} ms; ratio delegate/litert {doc['ratio']:.2f}x; "
                f"peak RSS alone: delegate {doc['peak_rss_mb']:.0f} MB, litert {doc['reference_peak_rss_mb']:.0f} MB "
                f"({doc['rss_ratio']:.2f}x)")
        c.print(f"alone (each back to back): delegate {doc['alone_median_ms']:.3f} ms, litert "
                f"{doc['reference_alone_median_ms']:.3f} ms; ratio {doc['alone_ratio']:.2f}x")
        if doc["reference_slowed"]:
            c.print(f"[yellow]warning:[/yellow] LiteRT took {doc['reference_median_ms']:.3f} ms alternating with "
                    f"delegate but {reference_alone:.3f} ms alone: something delegate leaves running slows it, "
                    f"so the ratio flatters delegate")
    c.print(f"plan: estimated {doc['estimated_ms']:.3f} ms, measured p50 {doc['p50_ms']:.3f} ms "
            f"(estimate / measured {doc['estimate_ratio']:.2f})")
    if doc["resident_ms"] is not None:
        c.print(f"device-resident: {doc['resident_ms']:.3f} ms per run with inputs and outputs left on the devices "
                f"(enqueue + wait, partitions summed); host in -> host out above")
    c.print(table("partitions (each timed alone: inputs staged on its device, outputs read back; host ms: until "
                  "run() returns, i.e. a queued device's enqueue/encode time; resident ms: a run on inputs already "
                  "on the device, outputs left there; boundary ms: device time of the host copies and layout "
                  "conversions; ops ms: its ops' times summed, as its op timer measured them: on a device, the "
                  "kernels' own time, so resident ms less ops ms is what the host's work and the waits add)",
                  ["#", "backend", "estimated ms", "measured ms", "host ms", "resident ms", "boundary ms", "ops ms",
                   "op times"],
                  [[r["partition"], r["backend"], f"{r['estimated_ms']:.4f}", f"{r['measured_ms']:.4f}",
                    f"{r['host_ms']:.4f}", _fmt_ms(r["resident_ms"], 4), _fmt_ms(r["boundary_ms"], 4),
                    _fmt_ms(r["ops_ms"], 4), r["op_times"]] for r in doc["partition_times"]]))
    if doc["top_ops"]:
        c.print(table("top-5 ops by measured time", ["op", "code", "backend", "ms", "measured by"],
                      [[r["op"], r["opcode"], r["backend"], f"{r['ms']:.4f}", r["source"]] for r in doc["top_ops"]]))
    else:
        c.print("no per-op times: no partition of this plan runs on a backend that times single ops")
    for path in doc["profiles_saved"]:
        c.print(f"cost profile refitted to these measurements: {path}")
    return 0


def _measured_profile(session, executor, indexed, runs: int = 5) -> tuple[list[dict[str, Any]], list]:
    """Per-partition times, and per-op rows only where the backend timed the ops (with the source)."""
    from .tools.measure import profile_partitions

    timings = profile_partitions(executor, indexed, runs)
    ops = {op.index: op for op in session.graph.ops}
    rows = [{"op": i, "opcode": ops[i].opcode, "backend": t.backend, "ms": ms, "source": t.op_source}
            for t in timings for i, ms in t.op_ms.items()]
    return rows, timings


# -- tune ------------------------------------------------------------------------------

PROFILE_RUNS = 5  # runs of each partition timed by tune's learning pass (each pass: whole, resident, per op)
# seconds of tune's budget kept for the learning pass after the search (at most LEARNING_SHARE of it), so that
# the whole command keeps to the budget: each measured plan profiled with fewer runs down to one, the slowest
# left out (pose_landmark_full here: its WebGPU plan on lavapipe, ~0.9 s a run, took 18 s of profiling after an
# 11 s search; on an H100 host the search took 9.8 s of 10 and the whole command 10.5)
LEARNING_S = 1.0
LEARNING_SHARE = 0.2
# where the search overran its share (a compile under way is not interrupted), the fastest plan still gets this long
MIN_LEARNING_S = 0.25
# the search gets at least this long after a slow start-up (it times the CPU alone whatever its budget)
MIN_SEARCH_S = 0.5

def cmd_tune(args) -> int:
    """Time the candidate plans of each model now and store the fastest (see delegate.plan_search); report
    how far the estimates were from the measurements."""
    from .cli import DEFAULT_MODEL, console, emit_json, load_cli_config
    from .tools.measure import estimate_report, process_started

    config = load_cli_config(args)
    if args.budget is not None and not args.budget > 0:
        raise DelegateError("--budget must be a positive number of seconds")
    docs, failed = [], 0
    started = process_started()  # the first model's budget includes the command's start-up
    for spec in args.models or [DEFAULT_MODEL]:
        try:
            doc, session = _tune_one(spec, config, args.budget, started)
            started = None
        except DelegateError as exc:  # one model that cannot be tuned does not stop the others
            if len(args.models or []) < 2:
                raise
            print(f"delegate: error: {spec}: {exc}", file=sys.stderr)
            docs.append({"model": spec, "error": str(exc)})
            failed = failed or exc.exit_code
            continue
        docs.append(doc)
        if not args.json:
            c = console()
            c.print(f"[bold]{doc['model']}[/bold]: {len(session.plan.candidates)} candidate plan(s) in "
                    f"{doc['search_seconds']:.1f} s, {doc['seconds']:.1f} s with learning from them; chosen: "
                    f"{session.plan.chosen} ({session.plan.choice})" + ("; stored for the next load" if doc["stored"] else ""))
            if doc["not_profiled"]:
                c.print(f"not profiled for the cost model (the budget ran out): {', '.join(doc['not_profiled'])}")
            c.print(candidates_table(session.plan))
        session.close()
    summary = estimate_report([d for d in docs if "error" not in d])
    if args.json:
        emit_json({"models": docs, "summary": summary})
        return failed
    if len(docs) > 1 or summary["plans_measured"]:
        console().print(f"estimates: {summary['within_25_percent']} of {summary['plans_measured']} measured plans "
                        f"within 25% (median estimate/measured {summary['median_ratio']}); the estimate's pick within "
                        f"1.10x of the fastest for {summary['pick_within_1_10']} of {summary['models']} model(s)")
    return failed


def _tune_one(spec: str, config, budget: float | None, started: float | None = None):
    """Measure one model's candidate plans, store the winner, and let the cost model learn from the winner and
    each single backend alone, partition by partition (estimated before learning, next to measured).  The
    budget counts from ``started`` (the process's start, for the first model: `time delegate tune` keeps
    to it), else from now."""
    from dataclasses import replace

    from . import plan_search
    from .cli import read_model_arg
    from .session import Session, run_settings

    settings = run_settings(config.for_model(spec))
    budget = settings.placement.budget_s if budget is None else budget
    learning_s = min(LEARNING_S, LEARNING_SHARE * budget)
    model, _, label = read_model_arg(spec)
    t0 = time.perf_counter() if started is None else started
    start_up_s = time.perf_counter() - t0
    search_budget = max(budget - learning_s - start_up_s, MIN_SEARCH_S)
    settings.placement = replace(settings.placement, budget_s=search_budget)
    session = Session(model, settings, remeasure=True)
    search_s = time.perf_counter() - t0 - start_up_s
    plan = session.plan
    estimated_pick, _ = session.planner.choose(plan.candidates)
    doc = {"model": label, "chosen": plan.chosen, "choice": plan.choice, "budget_seconds": budget,
           "start_up_seconds": round(start_up_s, 2), "search_budget_seconds": round(search_budget, 3),
           "search_seconds": round(search_s, 2), "stored": plan_search.NOT_STORED not in plan.choice,
           "estimated_pick": estimated_pick.name, "not_profiled": [],
           "candidates": [c.to_dict() for c in plan.candidates], "profiles": plan.profiles, "partitions": []}
    plan_ms = {c.name: c.measured_ms for c in plan.candidates if c.measured_ms is not None}
    measured = set(plan_ms)
    executors = {plan.chosen: session.executor}
    executors.update({name: e for name, e in session.baseline_executors.items() if name in measured})
    inputs = session.normalize_inputs(session._random_inputs())
    # the learning pass takes what the search left of the budget (at least MIN_LEARNING_S); fastest plans first
    deadline = max(t0 + budget, time.perf_counter() + MIN_LEARNING_S)
    for name, executor in sorted(executors.items(), key=lambda item: plan_ms[item[0]]):
        # profiling takes about 2 + 4 * runs plan runs (the partitions' inputs, a warm-up, then per run: whole,
        # resident, per op, and the per-op pass's set-up; measured: MobileNetV2's WebGPU plan on lavapipe,
        # 0.77 s a run, profiled in 4.4 s with one run)
        runs = min(PROFILE_RUNS, int(((deadline - time.perf_counter()) / (plan_ms[name] / 1e3) - 2) / 4))
        if runs < 1:  # profiling it even with one run would overrun the budget
            doc["not_profiled"].append(name)
            continue
        timings = _measured_profile(session, executor, inputs, runs)[1]
        estimates = {p.index: session.partition_estimate(p, executor) for p in executor.partitions}
        doc["partitions"] += [{"plan": name, "partition": t.index, "backend": t.backend,
                               "ops": len(executor.partitions[t.index].ops),
                               "op_indices": list(executor.partitions[t.index].op_indices),
                               "estimated_ms": round(estimates[t.index], 4), "measured_ms": round(t.ms, 4),
                               "ops_measured_ms": round(sum(t.op_ms.values()), 4) if t.op_ms else None,
                               "op_ms": {str(i): round(ms, 5) for i, ms in t.op_ms.items()}}
                              for t in timings]
        learn_from(session, executor, timings, plan_ms=plan_ms[name])
    doc["seconds"] = round(time.perf_counter() - t0, 2)
    return doc, session


def candidates_table(plan):
    from .cli import table

    def ms(v):
        return "-" if v is None else f"{v:.3f}"
    return table("candidate plans",
                 ["plan", "backends", "estimated ms", "measured ms", ""],
                 [[c.name + (" *" if c.name == plan.chosen else ""), ",".join(sorted(set(c.assignment.values()))),
                   ms(c.estimated_ms), ms(c.measured_ms), c.status] for c in plan.candidates])


# -- validate ----------------------------------------------------------------------

def cmd_validate(args) -> int:
    from .cli import EXIT_VALIDATION_FAILED, console, emit_json, load_cli_config, read_model_arg, table
    from .inputs import make_inputs
    from .session import Session, run_settings

    config = load_cli_config(args)
    model, data, label = read_model_arg(args.model)
    session = Session(model, run_settings(config.for_model(args.model)))
    thresholds = dict(getattr(config, "validate", None) or {})
    for key in ("max_abs_error", "max_rel_error", "min_cosine"):
        if getattr(args, key) is not None:
            thresholds[key] = getattr(args, key)
    thresholds.setdefault("max_rel_error", 5e-4 if session.settings.compile.precision == "fp32" else 1e-2)
    results: dict[str, dict[str, float]] = {}
    references: set[str] = set()
    runners: dict[bool, Any] = {}  # LiteRT's interpreters, built once: builtin kernels or not -> runner
    with progress("validating samples", args.samples) as advance:
        for sample in range(args.samples):
            named = make_inputs(session.graph, args.input, config, seed=args.seed + sample)
            actual = session.run(named)
            if args.expected:
                archive = np.load(args.expected)
                expected = {k: archive[k] for k in archive.files}
                missing = set(expected) - set(actual)
                if missing:
                    raise ExecutionError(f"{args.expected}: outputs {sorted(missing)} are not outputs of the model")
                compared = compare_outputs(actual, expected)
            else:
                compared = _against_litert(data, runners, session, named, actual, thresholds, references)
            for name, r in compared.items():
                worst = results.setdefault(name, {"max_abs_error": 0.0, "max_rel_error": 0.0, "cosine": 1.0})
                worst["max_abs_error"] = max(worst["max_abs_error"], r["max_abs_error"])
                worst["max_rel_error"] = max(worst["max_rel_error"], r["max_rel_error"])
                worst["cosine"] = min(worst["cosine"], r["cosine"])
            advance()
    failures = []
    for name, r in results.items():
        if "max_abs_error" in thresholds and r["max_abs_error"] > thresholds["max_abs_error"]:
            failures.append(f"{name}: max abs error {r['max_abs_error']:.3g} > {thresholds['max_abs_error']}")
        if "max_rel_error" in thresholds and r["max_rel_error"] > thresholds["max_rel_error"]:
            failures.append(f"{name}: max rel error {r['max_rel_error']:.3g} > {thresholds['max_rel_error']}")
        if "min_cosine" in thresholds and r["cosine"] < thresholds["min_cosine"]:
            failures.append(f"{name}: cosine {r['cosine']:.6f} < {thresholds['min_cosine']}")
    reference = args.expected or " or ".join(sorted(references)) or "litert"
    doc = {"model": label, "reference": reference, "samples": args.samples,
           "precision": session.settings.compile.precision, "thresholds": thresholds,
           "outputs": results, "passed": not failures, "failures": failures,
           "backends": sorted({p.backend for p in session.plan.partitions})}
    if args.json:
        emit_json(doc)
    else:
        c = console()
        c.print(table(f"{label} vs {reference} ({args.samples} input(s))",
                      ["output", "max abs", "max rel", "cosine"],
                      [[n, f"{r['max_abs_error']:.3g}", f"{r['max_rel_error']:.3g}", f"{r['cosine']:.6f}"]
                       for n, r in results.items()]))
        c.print("PASS" if not failures else "FAIL: " + "; ".join(failures))
    return 0 if not failures else EXIT_VALIDATION_FAILED


def _exceeds(r: dict[str, float], thresholds: dict[str, float]) -> bool:
    return (r["max_abs_error"] > thresholds.get("max_abs_error", float("inf"))
            or r["max_rel_error"] > thresholds.get("max_rel_error", float("inf"))
            or r["cosine"] < thresholds.get("min_cosine", float("-inf")))


def _against_litert(data: bytes, runners: dict, session, named, actual, thresholds,
                    references: set[str]) -> dict[str, dict]:
    """One sample's errors against LiteRT's interpreter (XNNPACK); where an output misses the thresholds, against
    LiteRT's builtin reference kernels too, and the nearer of the two: they differ from each other on quantized
    models (vit_tiny_block_int8 by 8 steps of its output's grid), and a plan bit-exact against the builtin
    kernels is LiteRT's result.  ``runners``: the interpreters built so far, kept for the next sample;
    ``references`` collects the ones that decided."""
    inputs = [named[t.name] for t in session.graph.inputs]

    def reference(builtin_kernels: bool) -> dict[str, np.ndarray]:
        if builtin_kernels not in runners:
            with native_stderr(log):  # LiteRT's XNNPACK line: to the log
                runners[builtin_kernels] = litert_cpu(data, 1, builtin_kernels=builtin_kernels)
        return {t.name: r for t, r in zip(session.graph.outputs, runners[builtin_kernels](inputs))}
    compared = compare_outputs(actual, reference(False))
    missed, replaced = [name for name, r in compared.items() if _exceeds(r, thresholds)], set()
    if missed:
        against = compare_outputs(actual, reference(True))
        replaced = {name for name in missed
                    if name in against and against[name]["max_rel_error"] < compared[name]["max_rel_error"]}
        compared.update({name: against[name] for name in replaced})
        references.update({"litert builtin kernels"} if replaced else set())
    if len(replaced) < len(compared):
        references.add("litert")
    return compared


# -- calibrate -----------------------------------------------------------------------

def cmd_calibrate(args) -> int:
    from .cli import console, emit_json, load_cli_config, table
    from .executor import ray_requested
    from .session import run_settings
    from .tools.calibrate import calibrate_all

    config = load_cli_config(args)
    settings = run_settings(config)
    if ray_requested(args, config):  # a fleet sweep: every node of the cluster
        from . import fleet
        return render_fleet_calibration(args, fleet.calibrate(settings, args.ray_address))
    report = calibrate_all(settings)
    rows, workloads, skipped, refused = (report[k] for k in ("profiles", "workloads", "skipped", "refused"))
    if args.json:
        emit_json(report)
        return MeasurementError.exit_code if refused else 0
    c = console()
    c.print(table("calibration", ["backend", "GFLOP/s", "GB/s", "launch us", "partition us", "xfer latency us",
                                  "xfer GB/s", "saved to"],
                  [[r["backend"], r["gflops"], r["gbytes_per_s"], r["launch_us"], r["partition_us"], r["transfer_latency_us"],
                    r["transfer_gbytes_per_s"] or "-", r["profile"]] for r in rows]))
    c.print(table("fit to workloads (plans of the refitted profiles; measured: the fastest pass, fitted)",
                  ["backend", "workload", "estimated ms", "measured ms", "each pass ms"],
                  [[name, w["workload"], w["estimated_ms"], w["measured_ms"], " ".join(map(str, w["passes_ms"]))]
                   for name, ws in workloads.items() for w in ws]))
    for r in rows:
        for figure, why in r["defaults_kept"].items():
            c.print(f"{r['backend']}: {figure} kept at the defaults, not measured: {why}")
    for name, why in skipped.items():
        c.print(f"skipped {name}: {why}")
    speed = report["speed"]
    c.print(f"speed check: {speed['network']} on the host took {speed['start_ms']} ms at the start and "
            f"{speed['end_ms']} ms at the end")
    for name, why in refused.items():
        c.print(f"refused {name}: {why}")
    return MeasurementError.exit_code if refused else 0


# -- cache ---------------------------------------------------------------------------

def cmd_cache(args) -> int:
    from .cli import console, emit_json, load_cli_config, table

    config = load_cli_config(args)
    directory = getattr(getattr(config, "serialization", None), "dir", None) if not isinstance(
        getattr(config, "serialization", None), dict) else config.serialization.get("dir")
    if not directory:
        raise CacheError("no serialization.dir is configured; set it in the config or with "
                         "--set serialization.dir=PATH")
    from .cache import clear, entries

    root = Path(os.path.expanduser(str(directory)))
    missing = not os.path.lexists(root)  # nothing cached yet: an empty cache, not an error
    if args.action == "clear":
        removed = 0 if missing else clear(root)
        if args.json:
            emit_json({"dir": str(root), "removed": removed})
        else:
            print(f"removed {removed} cache entries from {root}")
        return 0
    rows = [{"path": f"{sub}/{name}", "kind": header.get("kind"), "bytes": size}
            for sub, name, header, size in ([] if missing else entries(root))]
    if args.json:
        emit_json({"dir": str(root), "entries": rows})
        return 0
    console().print(table(f"kernel cache {root}", ["entry", "kind", "bytes"],
                          [[e["path"], e["kind"], e["bytes"]] for e in rows]))
    return 0


def fleet_flags(p, help: str) -> None:
    """``--ray`` and ``--ray-address`` of the fleet sweeps (delegate.fleet)."""
    p.add_argument("--ray", action="store_true", help=help)
    p.add_argument("--ray-address", help="the Ray cluster to sweep (default RAY_ADDRESS, else a local Ray)")


def add_parsers(sub, common) -> None:
    from .cli import at_least

    p = sub.add_parser("analyze", help="per backend: share of ops and compute it supports, what blocks it")
    common(p)
    p.set_defaults(fn=cmd_analyze)

    p = sub.add_parser("bench", help="latency percentiles, per-op profile, comparison with LiteRT")
    common(p)
    p.add_argument("--runs", type=at_least(1), default=50, help="timed runs (default 50)")
    p.add_argument("--warmup", type=at_least(0), default=5, help="untimed runs before them (default 5)")
    p.add_argument("--compare", choices=["litert"], help="alternate with LiteRT's interpreter on the same inputs")
    p.add_argument("--csv", help="write per-run times to this CSV")
    p.add_argument("--profile", action="store_true",
                   help="also store the measured per-op times (where a backend times ops) for later plans")
    p.add_argument("--input", "-i", action="append", metavar="FILE|NAME=FILE",
                   help="inputs as for run; random when omitted")
    p.add_argument("--seed", type=at_least(0), default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--batch", type=at_least(1), help="run at this batch size (inputs' leading dimension)")
    p.add_argument("--suite", action="store_true", help="the whole corpus on every backend/config vs LiteRT")
    p.add_argument("--models", nargs="+", help="suite: models (paths or zoo:NAME; default all zoo models)")
    p.add_argument("--models-dir", action="append", help="suite: also every .tflite in this directory")
    p.add_argument("--configs", help="suite: comma-separated subset of configurations")
    p.add_argument("--threads", type=at_least(1), default=2, help="suite: threads for delegate's CPU and LiteRT")
    p.add_argument("--out", help="suite: output directory (default: a new bench-results/suite-DATE-TIME; an "
                                 "existing directory's reports are replaced only when named here)")
    p.add_argument("--preference", default="fast_single_answer", choices=["fast_single_answer", "sustained_speed"],
                   help="suite: inference preference the GPU backends compile with (default fast_single_answer: "
                        "no tuning or plan search, so init is compile time alone)")
    fleet_flags(p, "suite: on every node of a Ray cluster, one task per node (a table per node and device)")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("validate", help="compare outputs with LiteRT or an expected .npz")
    common(p)
    p.add_argument("--expected", help=".npz of expected outputs (keys: output tensor names)")
    p.add_argument("--input", "-i", action="append", metavar="FILE|NAME=FILE",
                   help="inputs as for run; random when omitted")
    p.add_argument("--samples", type=at_least(1), default=1, help="number of random inputs")
    p.add_argument("--seed", type=at_least(0), default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--max-abs-error", dest="max_abs_error", type=float)
    p.add_argument("--max-rel-error", dest="max_rel_error", type=float)
    p.add_argument("--min-cosine", dest="min_cosine", type=float)
    p.set_defaults(fn=cmd_validate)

    p = sub.add_parser("calibrate", help="measure each backend and store its profile")
    common(p, model=False)
    fleet_flags(p, "calibrate every node of a Ray cluster, one task per node; their profiles are stored here")
    p.set_defaults(fn=cmd_calibrate)

    p = sub.add_parser("tune", help="time the candidate plans on this device, store the fastest for later loads")
    p.add_argument("models", nargs="*", help="models (.tflite paths or zoo:NAME); default zoo:mobilenet_v1")
    common(p, model=False)
    p.add_argument("--budget", type=float, help="seconds tune may take: the search and the learning pass after it "
                   "(default: placement.budget_s)")
    p.set_defaults(fn=cmd_tune)

    p = sub.add_parser("cache", help="list or clear the kernel cache")
    p.add_argument("action", choices=["ls", "clear"])
    common(p, model=False)
    p.set_defaults(fn=cmd_cache)
