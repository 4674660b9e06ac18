"""The measuring subcommands: analyze, bench, validate, calibrate, cache."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .backend import Support, asked_support
from .errors import CacheError, DelegateError, ExecutionError

ANALYZE_WARN_BELOW = 0.80


def _progress(total: int, description: str, enabled: bool):
    """A rich progress bar on a terminal; a no-op context otherwise."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        disable=not (enabled and sys.stderr.isatty()), transient=True,
                        console=__import__("rich.console", fromlist=["Console"]).Console(stderr=True))
    return progress, progress.add_task(description, total=total)


def peak_rss_mb() -> float:
    """This process's peak resident memory.  VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the
    parent across exec, so a child started by a large process would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


_LITERT_ALONE = """
import sys
import numpy as np
from delegate.cli_tools import peak_rss_mb
from ai_edge_litert.interpreter import Interpreter
it = Interpreter(model_path=sys.argv[1], num_threads=int(sys.argv[2]))
it.allocate_tensors()
for d in it.get_input_details():
    it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
for _ in range(5):
    it.invoke()
print(peak_rss_mb())
"""


# LiteRT slower than this while alternating with delegate than alone (by a factor, and by more than
# timer jitter) means delegate left work on the cores (spinning threads) that the reference paid for.
REFERENCE_SLOWDOWN = 1.25
REFERENCE_JITTER_MS = 0.1


def alone_median(run: Callable[[], Any], runs: int, warmup: int = 0) -> float:
    """Median ms of ``run`` on its own: the baseline the alternating measurement is checked against."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def reference_slowed(alternating_ms: float, alone_ms: float) -> bool:
    return alternating_ms > REFERENCE_SLOWDOWN * alone_ms and alternating_ms - alone_ms > REFERENCE_JITTER_MS


def separate_peak_rss(data: bytes, threads: int, argv: list[str]) -> tuple[float, float]:
    """Peak RSS of delegate alone and of LiteRT alone, each measured in a fresh process on the same model.

    In one process the two runtimes' memory would add up, so the comparison is made apart.
    """
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".tflite", delete=False) as f:
        f.write(data)
    ours = subprocess.run([sys.executable, "-m", "delegate.cli", "bench", f.name, "--runs", "5", "--warmup", "1",
                           "--json", *argv], capture_output=True, text=True, timeout=600)
    theirs = subprocess.run([sys.executable, "-c", _LITERT_ALONE, f.name, str(threads)], capture_output=True,
                            text=True, timeout=600)
    os.unlink(f.name)
    if ours.returncode or theirs.returncode:
        raise DelegateError(f"memory measurement failed: {(ours.stderr or theirs.stderr).strip()[-200:]}")
    return json.loads(ours.stdout)["peak_rss_mb"], float(theirs.stdout.strip().splitlines()[-1])


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
    manager = default_manager()
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

def _litert_runner(data: bytes, inputs: list[np.ndarray], threads: int):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise DelegateError("--compare litert needs ai-edge-litert (pip install 'delegate[reference]')") from None
    it = Interpreter(model_content=data, num_threads=threads)
    it.allocate_tensors()
    details = it.get_input_details()

    def run():
        for d, x in zip(details, inputs):
            it.set_tensor(d["index"], x)
        it.invoke()
        return [it.get_tensor(d["index"]) for d in it.get_output_details()]
    return run


def cmd_suite(args) -> int:
    """The whole corpus on every configuration; see delegate.suite."""
    from . import zoo
    from .cli import console, emit_json, read_model_arg
    from .suite import CONFIGS, run_suite

    specs = args.models or [f"zoo:{name}" for name in sorted(zoo.ZOO)]
    for directory in args.models_dir or []:
        specs += sorted(str(p) for p in Path(directory).glob("*.tflite"))
    models = [(Path(s).stem if not s.startswith("zoo:") else s, read_model_arg(s)[1]) for s in specs]
    configs = args.configs.split(",") if args.configs else None
    unknown = set(configs or []) - {c.name for c in CONFIGS}
    if unknown:
        raise DelegateError(f"unknown suite config(s) {sorted(unknown)}; known: {[c.name for c in CONFIGS]}")
    progress, task = _progress(len(models) * (len(configs or CONFIGS) + 1), "suite", not args.json)
    with progress:
        def step(label: str) -> None:
            progress.update(task, description=label)
            progress.advance(task)
        rows, files = run_suite(models, configs, args.runs, args.threads, Path(args.out), step, args.preference)
    if args.json:
        emit_json({"rows": [r.__dict__ for r in rows], "files": [str(f) for f in files]})
        return 0
    c = console()
    c.print(Path(files[0]).read_text())
    c.print("written: " + ", ".join(str(f) for f in files))
    return 0


def cmd_bench(args) -> int:
    from .cli import console, emit_json, load_cli_config, read_model_arg, table

    if args.suite:
        return cmd_suite(args)
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
        reference = _litert_runner(data, [named[t.name] for t in session.graph.inputs],
                                   settings.compile.num_threads or 1)
    # LiteRT alone, before delegate has run at all: the baseline that shows whether delegate slows it.
    reference_alone = alone_median(reference, max(5, args.runs // 4), warmup=2) if reference else None
    for _ in range(args.warmup):
        session.run_indexed(indexed)
        if reference:
            reference()
    ours, theirs = [], []
    progress, task = _progress(args.runs, "bench", not args.json)
    with progress:
        for _ in range(args.runs):
            t = time.perf_counter()
            session.run_indexed(indexed)
            ours.append((time.perf_counter() - t) * 1e3)
            if reference:
                t = time.perf_counter()
                reference()
                theirs.append((time.perf_counter() - t) * 1e3)
            progress.advance(task)
    per_op = _per_op_profile(session, indexed)
    if args.profile:
        _save_measured(session, per_op)
    doc: dict[str, Any] = {
        "model": label, "runs": args.runs, "batch": args.batch or 1, "init_ms": round(init_ms, 3),
        "throughput_per_s": round((args.batch or 1) * 1e3 / float(np.median(ours)), 1),
        "median_ms": round(float(np.median(ours)), 4),
        "p50_ms": round(float(np.percentile(ours, 50)), 4), "p90_ms": round(float(np.percentile(ours, 90)), 4),
        "p99_ms": round(float(np.percentile(ours, 99)), 4),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "partitions": len(session.plan.partitions), "copies": len(session.plan.copies),
        "backends": [p.backend for p in session.plan.partitions],
        "top_ops": sorted(per_op, key=lambda r: -r["ms"])[:5],
    }
    if reference:
        doc["reference"] = "litert"
        doc["reference_median_ms"] = round(float(np.median(theirs)), 4)
        doc["ratio"] = round(doc["median_ms"] / max(doc["reference_median_ms"], 1e-9), 3)
        doc["reference_alone_median_ms"] = round(reference_alone, 4)
        doc["reference_slowed"] = reference_slowed(doc["reference_median_ms"], reference_alone)
        passthrough = [a for flag, value in (("--config", args.config), ("--backends", args.backends))
                       if value for a in (flag, value)] + [a for v in args.set or [] for a in ("--set", v)]
        ours_mb, theirs_mb = separate_peak_rss(data, settings.compile.num_threads or 1, passthrough)
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
        if doc["reference_slowed"]:
            c.print(f"[yellow]warning:[/yellow] LiteRT took {doc['reference_median_ms']:.3f} ms alternating with "
                    f"delegate but {reference_alone:.3f} ms alone: something delegate leaves running slows it, "
                    f"so the ratio flatters delegate")
    c.print(table("top-5 ops by time", ["op", "code", "backend", "ms"],
                  [[r["op"], r["opcode"], r["backend"], f"{r['ms']:.4f}"] for r in doc["top_ops"]]))
    return 0


def _per_op_profile(session, indexed, repeats: int = 3) -> list[dict[str, Any]]:
    """Per-op times: from the backend's own profile where it has one, else the partition's time split by estimate."""
    rows = []
    for part, compiled in zip(session.executor.partitions, session.executor.compiled):
        times = {}
        enable = getattr(compiled, "set_profiling", None)
        if enable:
            enable(True)
            for _ in range(repeats):
                session.run_indexed(indexed)
            times = compiled.profile()
            enable(False)
        if not times:
            t = time.perf_counter()
            for _ in range(repeats):
                session.run_indexed(indexed)
            total = (time.perf_counter() - t) * 1e3 / repeats
            est = {op.index: session.planner.op_cost(op, part.backend) for op in part.ops}
            norm = sum(est.values()) or 1.0
            times = {i: total * v / norm for i, v in est.items()}
        for op in part.ops:
            rows.append({"op": op.index, "opcode": op.opcode, "backend": part.backend, "ms": float(times.get(op.index, 0))})
    return rows


def _save_measured(session, per_op) -> None:
    from .cost import op_signature, save_profile
    ops = {op.index: op for op in session.graph.ops}
    for name, backend in session.backends.items():
        profile = session.profiles[name]
        for r in per_op:
            if r["backend"] == name:
                profile.measured_op_ms[op_signature(ops[r["op"]])] = r["ms"]
        save_profile(backend.device_info(), profile)


# -- validate ----------------------------------------------------------------------

def compare_outputs(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    out = {}
    for name, e in expected.items():
        a = np.asarray(actual[name], np.float64)
        e = np.asarray(e, np.float64)
        if a.shape != e.shape:
            raise ExecutionError(f"output {name!r}: shape {list(a.shape)} differs from expected {list(e.shape)}")
        diff = np.abs(a - e)
        denom = float(np.abs(e).max()) or 1.0
        na, ne = np.linalg.norm(a), np.linalg.norm(e)
        cosine = float(np.dot(a.ravel(), e.ravel()) / (na * ne)) if na and ne else float(na == ne)
        out[name] = {"max_abs_error": float(diff.max()) if diff.size else 0.0,
                     "max_rel_error": float(diff.max() / denom) if diff.size else 0.0, "cosine": cosine}
    return out


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
    progress, task = _progress(args.samples, "validate", not args.json)
    with progress:
        for sample in range(args.samples):
            named = make_inputs(session.graph, args.input, config, seed=args.seed + sample)
            actual = session.run(named)
            if args.expected:
                archive = np.load(args.expected)
                expected = {k: archive[k] for k in archive.files}
                missing = set(expected) - set(actual)
                if missing:
                    raise ExecutionError(f"{args.expected}: outputs {sorted(missing)} are not outputs of the model")
            else:
                ref = _litert_runner(data, [named[t.name] for t in session.graph.inputs], 1)()
                expected = {t.name: r for t, r in zip(session.graph.outputs, ref)}
            for name, r in compare_outputs(actual, expected).items():
                worst = results.setdefault(name, {"max_abs_error": 0.0, "max_rel_error": 0.0, "cosine": 1.0})
                worst["max_abs_error"] = max(worst["max_abs_error"], r["max_abs_error"])
                worst["max_rel_error"] = max(worst["max_rel_error"], r["max_rel_error"])
                worst["cosine"] = min(worst["cosine"], r["cosine"])
            progress.advance(task)
    failures = []
    for name, r in results.items():
        if "max_abs_error" in thresholds and r["max_abs_error"] > thresholds["max_abs_error"]:
            failures.append(f"{name}: max abs error {r['max_abs_error']:.3g} > {thresholds['max_abs_error']}")
        if "max_rel_error" in thresholds and r["max_rel_error"] > thresholds["max_rel_error"]:
            failures.append(f"{name}: max rel error {r['max_rel_error']:.3g} > {thresholds['max_rel_error']}")
        if "min_cosine" in thresholds and r["cosine"] < thresholds["min_cosine"]:
            failures.append(f"{name}: cosine {r['cosine']:.6f} < {thresholds['min_cosine']}")
    doc = {"model": label, "reference": args.expected or "litert", "samples": args.samples,
           "precision": session.settings.compile.precision, "thresholds": thresholds,
           "outputs": results, "passed": not failures, "failures": failures,
           "backends": sorted({p.backend for p in session.plan.partitions})}
    if args.json:
        emit_json(doc)
    else:
        c = console()
        c.print(table(f"{label} vs {doc['reference']} ({args.samples} input(s))",
                      ["output", "max abs", "max rel", "cosine"],
                      [[n, f"{r['max_abs_error']:.3g}", f"{r['max_rel_error']:.3g}", f"{r['cosine']:.6f}"]
                       for n, r in results.items()]))
        c.print("PASS" if not failures else "FAIL: " + "; ".join(failures))
    return 0 if not failures else EXIT_VALIDATION_FAILED


# -- calibrate -----------------------------------------------------------------------

def _calibration_models():
    from .tflite.builder import GraphBuilder

    rng = np.random.default_rng(0)
    gemm = GraphBuilder()
    x = gemm.input("x", (256, 512))
    gemm.output(gemm.op("FULLY_CONNECTED", [x, gemm.const("w", rng.standard_normal((512, 512)) * 0.05)],
                        options={"fused_activation_function": "NONE"}))
    stream = GraphBuilder()
    a = stream.input("a", (1, 256, 256, 32))
    stream.output(stream.op("ADD", [a, stream.const("b", np.ones(32, np.float32))],
                            options={"fused_activation_function": "NONE"}))
    tiny = GraphBuilder()
    t = tiny.input("t", (1, 1, 1, 4))
    tiny.output(tiny.op("RELU", [t]))
    chain = GraphBuilder()
    c = chain.input("c", (1, 1, 1, 4))
    window = {"padding": "VALID", "stride_w": 1, "stride_h": 1, "filter_width": 1, "filter_height": 1,
              "fused_activation_function": "NONE"}
    for _ in range(TINY_CHAIN):  # pools start kernels of their own: nothing fuses them away
        c = chain.op("AVERAGE_POOL_2D", [chain.op("MAX_POOL_2D", [c], options=window)], options=window)
    chain.output(c)
    return {"gemm": (gemm.build(), 2.0 * 256 * 512 * 512), "stream": (stream.build(), 0.0),
            "tiny": (tiny.build(), 0.0), "chain": (chain.build(), 0.0)}


TINY_CHAIN = 8  # pairs of trivial ops whose extra time over one op is the per-op launch cost


def _median_seconds(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return float(np.median(samples))


def _resident_seconds(backend, compiled, graph, repeats: int) -> float:
    """Time of one run with inputs and outputs left on the device.

    ``n`` runs are queued and one output is read back once; the difference between
    ``1 + repeats`` runs and one run, over ``repeats``, is the steady-state cost of a run.
    """
    inputs = {t.index: backend.to_device(np.ones(t.shape, np.float32)) for t in graph.inputs}

    def batch(n: int) -> None:
        for _ in range(n):
            out = compiled.run(inputs)
        backend.to_host(next(iter(out.values())))

    one = _median_seconds(lambda: batch(1), 5)
    many = _median_seconds(lambda: batch(1 + repeats), 3)
    return max((many - one) / repeats, 1e-7)


def calibrate_backend(backend, compile_options, repeats: int = 10):
    """Measure throughput, bandwidth, launch overhead and host<->device transfers of one backend."""
    from .cost import DeviceProfile
    from .partition import make_partition

    figures = {}
    for key, (model, flops) in _calibration_models().items():
        g = model.main
        part = make_partition(g, g.ops, backend.name, 0)
        compiled = backend.compile(part, compile_options)
        figures[key] = (_resident_seconds(backend, compiled, g, repeats), flops, g, compiled)
    # per op: the chain's time beyond a single op's, per extra op; the rest of a single op's time is the
    # fixed cost of running a partition at all, which the cost model charges at partition boundaries
    launch = max((figures["chain"][0] - figures["tiny"][0]) / (2 * TINY_CHAIN - 1), 1e-7)
    gemm_s = max(figures["gemm"][0] - launch, 1e-7)
    stream_g = figures["stream"][2]
    stream_bytes = 2 * stream_g.inputs[0].nbytes
    stream_s = max(figures["stream"][0] - launch, 1e-7)
    profile = DeviceProfile(gflops=figures["gemm"][1] / gemm_s / 1e9, gbytes_per_s=stream_bytes / stream_s / 1e9,
                            launch_us=launch * 1e6, source="calibrated")
    if backend.name != "cpu":
        # a full round trip (upload, run, download) of the tiny and the streaming model, less their
        # device-resident run time, is two transfers of each model's input size
        def round_trip(key: str) -> float:
            seconds, _, g, compiled = figures[key]
            host = {t.index: np.ones(t.shape, np.float32) for t in g.inputs}

            def once() -> None:
                out = compiled.run({i: backend.to_device(v) for i, v in host.items()})
                for value in out.values():
                    backend.to_host(value)
            return max(_median_seconds(once, repeats) - seconds, 1e-7) / 2
        small, big = round_trip("tiny"), round_trip("stream")
        profile.transfer_latency_us = small * 1e6
        profile.transfer_gbytes_per_s = stream_g.inputs[0].nbytes / max(big - small, 1e-7) / 1e9
    return profile


def cmd_calibrate(args) -> int:
    from .cli import console, emit_json, load_cli_config, table
    from .cost import save_profile
    from .session import instantiate_backends, run_settings
    from .plugins import default_manager

    config = load_cli_config(args)
    settings = run_settings(config)
    backends, skipped = instantiate_backends(settings.backends, default_manager(), True)
    rows = []
    progress, task = _progress(len(backends), "calibrate", not args.json)
    with progress:
        for name, backend in backends.items():
            profile = calibrate_backend(backend, settings.compile, args.repeats)
            path = save_profile(backend.device_info(), profile)
            rows.append({"backend": name, "gflops": round(profile.gflops, 2),
                         "gbytes_per_s": round(profile.gbytes_per_s, 2), "launch_us": round(profile.launch_us, 1),
                         "transfer_latency_us": round(profile.transfer_latency_us, 1),
                         "transfer_gbytes_per_s": (round(profile.transfer_gbytes_per_s, 2)
                                                   if np.isfinite(profile.transfer_gbytes_per_s) else None),
                         "profile": str(path)})
            progress.advance(task)
    if args.json:
        emit_json({"profiles": rows, "skipped": skipped})
        return 0
    c = console()
    c.print(table("calibration", ["backend", "GFLOP/s", "GB/s", "launch us", "xfer latency us", "xfer GB/s", "saved to"],
                  [[r["backend"], r["gflops"], r["gbytes_per_s"], r["launch_us"], r["transfer_latency_us"],
                    r["transfer_gbytes_per_s"] or "-", r["profile"]] for r in rows]))
    for name, why in skipped.items():
        c.print(f"skipped {name}: {why}")
    return 0


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
    if args.action == "clear":
        removed = clear(root)
        if args.json:
            emit_json({"dir": str(root), "removed": removed})
        else:
            print(f"removed {removed} cache entries from {root}")
        return 0
    rows = [{"path": f"{sub}/{name}", "kind": header.get("kind"), "bytes": size}
            for sub, name, header, size in entries(root)]
    if args.json:
        emit_json({"dir": str(root), "entries": rows})
        return 0
    console().print(table(f"kernel cache {root}", ["entry", "kind", "bytes"],
                          [[e["path"], e["kind"], e["bytes"]] for e in rows]))
    return 0


def add_parsers(sub, common) -> None:
    p = sub.add_parser("analyze", help="per backend: share of ops and compute it supports, what blocks it")
    common(p)
    p.set_defaults(fn=cmd_analyze)

    p = sub.add_parser("bench", help="latency percentiles, per-op profile, comparison with LiteRT")
    common(p)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compare", choices=["litert"], help="alternate with LiteRT's interpreter on the same inputs")
    p.add_argument("--csv", help="write per-run times to this CSV")
    p.add_argument("--profile", action="store_true", help="store measured per-op times for later plans")
    p.add_argument("--input", "-i", action="append")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, help="run at this batch size (inputs' leading dimension)")
    p.add_argument("--suite", action="store_true", help="the whole corpus on every backend/config vs LiteRT")
    p.add_argument("--models", nargs="+", help="suite: models (paths or zoo:NAME; default all zoo models)")
    p.add_argument("--models-dir", action="append", help="suite: also every .tflite in this directory")
    p.add_argument("--configs", help="suite: comma-separated subset of configurations")
    p.add_argument("--threads", type=int, default=2, help="suite: threads for delegate's CPU and LiteRT")
    p.add_argument("--out", default="bench-results", help="suite: output directory")
    p.add_argument("--preference", default="sustained_speed", choices=["sustained_speed", "fast_single_answer"],
                   help="suite: inference preference the GPU backends compile with")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("validate", help="compare outputs with LiteRT or an expected .npz")
    common(p)
    p.add_argument("--expected", help=".npz of expected outputs (keys: output tensor names)")
    p.add_argument("--input", "-i", action="append")
    p.add_argument("--samples", type=int, default=1, help="number of random inputs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-abs-error", dest="max_abs_error", type=float)
    p.add_argument("--max-rel-error", dest="max_rel_error", type=float)
    p.add_argument("--min-cosine", dest="min_cosine", type=float)
    p.set_defaults(fn=cmd_validate)

    p = sub.add_parser("calibrate", help="measure each backend and store its profile")
    common(p, model=False)
    p.add_argument("--repeats", type=int, default=10)
    p.set_defaults(fn=cmd_calibrate)

    p = sub.add_parser("cache", help="list or clear the kernel cache")
    p.add_argument("action", choices=["ls", "clear"])
    common(p, model=False)
    p.set_defaults(fn=cmd_cache)
