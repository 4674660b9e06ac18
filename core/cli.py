"""The ``delegate`` command line.

``delegate [run] [--config FILE] [MODEL]`` loads, plans, compiles, runs and
reports; the subcommands inspect, plan, analyze, bench, validate, backends,
calibrate, tune, cache and zoo each take ``--json``, ``--config``, ``--backends``
and ``--set``.  Every failure is one line on stderr and a documented exit code
(README, "Exit codes"); ``--debug`` adds the traceback and ``-v`` the log of
placement decisions, before or after the subcommand.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import __version__
from .errors import DelegateError, ExecutionError, ModelFormatError
from .quantize import MODES as QUANT_MODES
from .stdio import show_progress

DEFAULT_MODEL = "zoo:mobilenet_v1"
EXIT_VALIDATION_FAILED = 10
EXIT_USAGE = 2
EXIT_CLOSED_PIPE = 128 + 13  # killed by SIGPIPE, as `yes | head` reports it
OUTPUT_FLAGS = {"output": "--output", "csv": "--csv", "svg": "--svg"}  # files written after the run
SUBCOMMANDS = ("run", "inspect", "plan", "analyze", "bench", "validate", "backends", "calibrate", "tune", "cache", "zoo")
SUBCOMMANDS += ("eval", "map")  # datasets: delegate.evaluate, delegate.batchmap


# -- shared helpers ------------------------------------------------------------

def read_model_arg(spec: str):
    """(Model, bytes, label) for a path or ``zoo:NAME``."""
    from . import zoo
    from .tflite.reader import read_model

    if spec.startswith(zoo.PREFIX):
        data = zoo.from_spec(spec)
        return read_model(data), data, spec
    path = Path(spec)
    if not path.exists():
        raise ModelFormatError(f"{spec}: no such model file (give a .tflite path or zoo:NAME)")
    if path.is_dir():
        raise ModelFormatError(f"{spec}: is a directory, not a model file")
    data = path.read_bytes()
    return read_model(data), data, spec


def unwritable(spec: str) -> str | None:
    """Why the file ``spec`` cannot be written, known before a long run; None when it can be."""
    path = Path(spec)
    if path.is_dir():
        return "is a directory"
    if not path.parent.is_dir():
        return f"directory {path.parent} does not exist"
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        return "is not writable" if path.exists() else f"directory {path.parent} is not writable"
    return None


def _cannot_draw(dest: str) -> str | None:
    from .plot import dot_missing
    return dot_missing() if dest == "svg" else None


def load_cli_config(args):
    from .config import load_config
    return load_config(args.config, overrides=args.set or [], backends=args.backends)


def emit_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return str(value)


def console():
    """rich on a terminal; wide plain text (no colour, no wrapping of table rows) when piped."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:  # rich would exit 1 on its own: leave it to main()
            self.quiet = True
            raise BrokenPipeError

    if sys.stdout.isatty():
        return _Console(highlight=False)
    return _Console(highlight=False, color_system=None, width=240)


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]):
    from rich.table import Table
    t = Table(title=title, title_justify="left", box=None)
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*[str(v) for v in r])
    return t


def output_stats(name: str, arr: np.ndarray, producer: str | None = None) -> dict[str, Any]:
    """Shape, dtype and range of an output; its top 5 classes when it looks like class scores."""
    stats: dict[str, Any] = {"name": name, "shape": list(arr.shape), "dtype": str(arr.dtype)}
    if arr.size and arr.dtype.kind in "fiub":
        a = arr.astype(np.float64)
        stats.update(min=float(a.min()), max=float(a.max()), mean=float(a.mean()))
    if class_scores(arr, producer):
        top = np.argsort(arr[0])[::-1][:5]
        stats["top5"] = [{"class": int(i), "score": float(arr[0, i])} for i in top]
    return stats


def class_scores(arr: np.ndarray, producer: str | None) -> bool:
    """One batch row of >= 2 scores made by a SOFTMAX, or float values that form a distribution (>= 0, summing
    to 1): class scores.  Anything else (landmarks, boxes, logits of unknown meaning) gets no top 5."""
    if arr.ndim != 2 or arr.shape[0] != 1 or arr.shape[1] < 2 or arr.dtype.kind not in "fiu":
        return False
    if producer == "SOFTMAX":
        return True
    return arr.dtype.kind == "f" and bool(arr.min() >= 0) and abs(float(arr.sum(dtype=np.float64)) - 1) < 1e-3


PARTITION_COLUMNS = ["#", "backend", "ops", "ops at", "inputs", "outputs", "compiled as"]
PLACEMENT_COLUMNS = ["op", "code", "ver", "backend", "est ms", "copies in", "why"]
LEGEND = [
    ("op, code, ver", "the op's index in the model, its TFLite op code and version"),
    ("backend", "where the op runs"),
    ("est ms", "the cost model's estimate of the op alone on that backend; an estimate, not a measurement "
               "(`delegate bench` measures)"),
    ("copies in", "inputs of the op copied from another device before it runs"),
    ("why", "the reason for that backend; the assignment is made for the whole graph, so an op may stay where it "
            "alone is slower when moving it would cost copies"),
    ("ops, ops at", "a partition's op count and their indices (ranges when it is not one run of ops)"),
    ("inputs, outputs", "tensors crossing the partition's boundary (each a copy when the devices differ)"),
    ("compiled as", "the engine, precision and kernel count its backend compiled (the details below; all of them "
                    "in --json)"),
    ("candidate plans", "the assignments compared; * marks the chosen one, measured ms only where timed here"),
]


def compiled_details(session) -> list[dict[str, Any]]:
    """What each backend says of its compiled partition (engine, precision and why, kernels)."""
    return [compiled.describe() for compiled in session.executor.compiled]


def _summary(details: dict[str, Any]) -> str:
    """The table's short form of a compiled partition: engine, precision and counts (the reasons: --explain)."""
    parts = [str(details[k]) for k in ("engine", "precision") if k in details]
    for key in ("kernels", "dispatches"):
        if key in details:
            count = details[key] if isinstance(details[key], int) else len(details[key])
            parts.append(f"{count} {key}")
    return " ".join(parts) or "-"


def op_ranges(indices: Sequence[int], most: int = 3) -> str:
    """``#0..#5`` for one run of ops; ``#0..#5, #9, #12..#20`` (and how many more) when there are gaps."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"#{a}" if a == b else f"#{a}..#{b}" for a, b in runs[:most])
    return text + (f" +{len(runs) - most} more ranges" if len(runs) > most else "")


def plan_rows(plan, details: list[dict[str, Any]]) -> list[list[Any]]:
    return [[p.index, p.backend, len(p.op_indices), op_ranges(p.op_indices), len(p.inputs), len(p.outputs),
             _summary(d)] for p, d in zip(plan.partitions, details)]


def backends_in_use(plan) -> list[str]:
    """The backends that run at least one op, in the order of their first partition."""
    return list(dict.fromkeys(p.backend for p in plan.partitions))


def plan_doc(session) -> dict[str, Any]:
    doc = session.plan.to_dict()
    for entry, details in zip(doc["partitions"], compiled_details(session)):
        entry["compiled"] = details
    return doc


# -- commands ---------------------------------------------------------------------

def run_one(spec: str, model_config, input_specs, seed: int, runs: int) -> dict[str, Any]:
    """Load, plan, compile and run one model; the report as data."""
    from .inputs import make_inputs
    from .session import Session, run_settings

    model, _, label = read_model_arg(spec)
    started = time.perf_counter()
    session = Session(model, run_settings(model_config))
    init_ms = (time.perf_counter() - started) * 1e3
    inputs = make_inputs(session.graph, input_specs, model_config, seed=seed)
    t0 = time.perf_counter()
    outputs = session.run(inputs)
    first_ms = (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(inputs)
        times.append((time.perf_counter() - t0) * 1e3)
    median = float(np.median(times)) if times else first_ms
    producers = {t.name: t.producer.opcode for t in session.graph.outputs if t.producer is not None}
    return {
        "model": label,
        "name": getattr(model_config, "name", label),
        "precision": model_config.precision,
        "backends_in_use": backends_in_use(session.plan),
        "plan": plan_doc(session),
        "outputs": [output_stats(n, a, producers.get(n)) for n, a in outputs.items()],
        "timing_ms": {"init": round(init_ms, 3), "first_run": round(first_ms, 3), "median": round(median, 3),
                      "runs": len(times)},
        "_arrays": outputs,
        "_plan": session.plan,
        "_details": compiled_details(session),
    }


def cmd_run(args) -> int:
    config = load_cli_config(args)
    if args.model is None and config.models:
        jobs = [(m.path, m) for m in config.models]
    else:
        spec = args.model or DEFAULT_MODEL
        jobs = [(spec, config.for_model(spec))]
    if config.concurrency == "parallel" and len(jobs) > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(len(jobs)) as pool:
            reports = list(pool.map(lambda job: run_one(job[0], job[1], args.input, args.seed, args.runs), jobs))
    else:
        reports = [run_one(spec, mc, args.input, args.seed, args.runs) for spec, mc in jobs]
    if args.output:
        arrays = {}
        for r in reports:
            prefix = f"{r['name']}/" if len(reports) > 1 else ""
            arrays.update({prefix + k: v for k, v in r["_arrays"].items()})
        np.savez(args.output, **arrays)
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in reports]
    if args.json:
        emit_json(public[0] if len(public) == 1 else {"models": public})
        return 0
    c = console()
    for r in reports:
        print_report(c, r)
    if args.output:
        c.print(f"outputs saved to {args.output}")
    return 0


def print_report(c, r: dict[str, Any]) -> None:
    plan = r["_plan"]
    c.print(f"[bold]{r['model']}[/bold] ({r['name']}, {r['precision']}): {len(plan.graph.ops)} ops, "
            f"backends in use: {', '.join(r['backends_in_use'])}")
    for w in plan.warnings():
        c.print(f"WARNING: {w}")
    c.print(plan.summary())
    c.print(table("partitions", PARTITION_COLUMNS, plan_rows(plan, r["_details"])))
    c.print(f"copies between devices: {len(plan.copies)}; estimated {plan.estimated_ms:.3f} ms")
    for note in plan.notes:
        c.print(f"note: {note}")
    rows = [[s["name"], s["shape"], s["dtype"], _fmt(s.get("min")), _fmt(s.get("max")), _fmt(s.get("mean"))]
            for s in r["outputs"]]
    c.print(table("outputs", ["name", "shape", "dtype", "min", "max", "mean"], rows))
    for s in r["outputs"]:
        if "top5" in s:
            c.print(f"top-5 of {s['name']}: " + ", ".join(f"{t['class']} ({t['score']:.4f})" for t in s["top5"]))
    t = r["timing_ms"]
    c.print(f"timing: init {t['init']:.1f} ms, first run {t['first_run']:.2f} ms, "
            f"median of {t['runs']} runs {t['median']:.2f} ms")


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.5g}"


def cmd_inspect(args) -> int:
    load_cli_config(args)  # taken by every command: a broken config is reported here too
    model, data, label = read_model_arg(args.model)
    g = model.main
    if args.json:
        emit_json({
            "model": label, "bytes": len(data), "subgraphs": len(model.subgraphs),
            "inputs": [_tensor_doc(t) for t in g.inputs], "outputs": [_tensor_doc(t) for t in g.outputs],
            "ops": [{"index": op.index, "opcode": op.opcode, "version": op.version, "custom": op.custom,
                     "inputs": [None if t is None else t.index for t in op.inputs],
                     "outputs": [t.index for t in op.outputs], "options": op.options} for op in g.ops],
            "tensors": [_tensor_doc(t) for t in g.tensors],
            "opcode_counts": g.opcode_counts(),
            "signatures": [s.__dict__ for s in model.signatures],
            "metadata": sorted(model.metadata),
        })
        return 0
    c = console()
    c.print(f"[bold]{label}[/bold]: {len(data)} bytes, {len(model.subgraphs)} subgraph(s), "
            f"{len(g.ops)} ops, {len(g.tensors)} tensors")
    c.print(table("inputs", ["index", "name", "type", "quantization"],
                  [[t.index, t.name, t.type_str(), t.quantization.describe() if t.quantization else "-"]
                   for t in g.inputs]))
    c.print(table("outputs", ["index", "name", "type", "quantization"],
                  [[t.index, t.name, t.type_str(), t.quantization.describe() if t.quantization else "-"]
                   for t in g.outputs]))
    c.print(table("op codes", ["op", "count"], sorted(g.opcode_counts().items(), key=lambda kv: -kv[1])))
    if args.ir:
        print(str(model))
    return 0


def _tensor_doc(t) -> dict[str, Any]:
    doc = {"index": t.index, "name": t.name, "dtype": t.dtype.name, "shape": list(t.shape),
           "constant": t.is_constant}
    if t.shape_signature is not None:
        doc["shape_signature"] = list(t.shape_signature)
    if t.quantization is not None:
        doc["quantization"] = {"scale": t.quantization.scale.tolist(), "zero_point": t.quantization.zero_point.tolist(),
                               "axis": t.quantization.axis}
    return doc


def cmd_backends(args) -> int:
    from .plugins import default_manager

    manager = default_manager(load_cli_config(args).disable_plugins)
    rows = []
    for s in manager.status():
        entry = {"name": s.name, "plugin": s.plugin, "available": s.available, "reason": s.reason,
                 "description": s.description}
        if s.available:
            entry["devices"] = _devices(manager, s.name)
        rows.append(entry)
    if args.json:
        emit_json({"backends": rows})
        return 0
    c = console()
    c.print(table("backends", ["name", "available", "details"],
                  [[r["name"], "yes" if r["available"] else "no",
                    "; ".join(r.get("devices") or []) or r["reason"] or r["description"]] for r in rows]))
    return 0


def _devices(manager, name: str) -> list[str]:
    try:
        return [str(d) for d in manager.backend_info(name).list_devices()]
    except Exception as exc:
        return [f"device listing failed: {exc}"]


def cmd_plan(args) -> int:
    from .session import Session, run_settings

    config = load_cli_config(args)
    model, _, label = read_model_arg(args.model)
    session = Session(model, run_settings(config.for_model(args.model)))
    plan = session.plan
    if args.svg:
        from .plot import plan_svg
        Path(args.svg).write_text(plan_svg(plan))
    if args.json:
        emit_json({"model": label, **plan_doc(session)})
        return 0
    c = console()
    for w in plan.warnings():
        c.print(f"WARNING: {w}")
    c.print(plan.summary())
    rows = [[d.index, d.opcode, f"v{d.version}", d.backend, _fmt_est(d.estimates_ms.get(d.backend)), d.copies,
             d.reason] for d in plan.decisions]
    c.print(table("placement", PLACEMENT_COLUMNS, rows))
    details = compiled_details(session)
    c.print(table("partitions", PARTITION_COLUMNS, plan_rows(plan, details)))
    c.print(f"copies: {len(plan.copies)} ({sum(x.nbytes for x in plan.copies)} bytes); "
            f"estimated total {plan.estimated_ms:.3f} ms ({plan.partitioner} partitioner)")
    from .cli_tools import candidates_table
    c.print(candidates_table(plan))
    c.print(f"chosen: {plan.chosen} ({plan.choice})")
    c.print("cost profiles: " + "; ".join(f"{name}: {where}" for name, where in plan.profiles.items()))
    for note in plan.notes:
        c.print(f"note: {note}")
    if args.explain:
        c.print(table("what the columns mean", ["column", "meaning"], LEGEND))
        for p, d in zip(plan.partitions, details):
            c.print(f"partition {p.index} ({p.backend}) compiled as: "
                    + "; ".join(f"{k} {_detail(v)}" for k, v in d.items()))
    else:
        c.print("what the columns mean, and each partition's compile details: delegate plan --explain")
    if args.svg:
        c.print(f"plan drawn to {args.svg}")
    return 0


def _detail(value: Any, most: int = 5) -> str:
    """One compile detail in a line: long lists and mappings as their size and first items (all of it: --json)."""
    if isinstance(value, dict):
        value = [f"{k}: {v}" for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return f"{len(value)} ({', '.join(map(str, value[:most]))}{', ...' if len(value) > most else ''})"
    return str(value)


def _fmt_est(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def cmd_zoo(args) -> int:
    from . import zoo

    load_cli_config(args)  # taken by every command: a broken config is reported here too
    if not args.name:
        names = sorted(zoo.ZOO)
        if args.json:
            emit_json({"models": names})
        else:
            print("\n".join(names))
        return 0
    try:
        data = zoo.build(args.name, quant=args.quant)
    except KeyError as exc:
        raise ModelFormatError(str(exc.args[0])) from None
    suffix = "" if args.quant == "fp32" else f"_{args.quant}"
    out = args.output or f"{args.name}{suffix}.tflite"
    Path(out).write_bytes(data)
    if args.json:
        emit_json({"model": args.name, "quant": args.quant, "path": out, "bytes": len(data)})
    else:
        print(f"wrote {out} ({args.quant}, {len(data)} bytes)")
    return 0


def closed_pipe() -> int:
    """The reader of stdout went away (``delegate ... | head``): stop quietly, as other command-line tools do."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes nowhere instead of failing at exit
    os.close(devnull)
    return EXIT_CLOSED_PIPE


# -- argument parsing ------------------------------------------------------------

def _common(p: argparse.ArgumentParser, model: bool = True) -> None:
    """The flags every command takes; ``--debug``/``-v`` here too, so they may follow the subcommand."""
    if model:
        p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                       help=f"a .tflite file or zoo:NAME (default {DEFAULT_MODEL})")
    p.add_argument("--config", "-c", help="YAML config (default: the built-in edge defaults)")
    p.add_argument("--backends", help="comma-separated backends in priority order, overriding the config")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config key for this run")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    _global_flags(p, default=argparse.SUPPRESS)  # absent after the subcommand: keep what came before it


def _global_flags(p: argparse.ArgumentParser, default: Any) -> None:
    p.add_argument("--debug", action="store_true", default=default, help="show tracebacks")
    p.add_argument("-v", "--verbose", action="count", default=default, help="log placement decisions (-vv: debug)")


def at_least(minimum: int):
    """An argparse type: an integer of at least ``minimum`` (a usage error, exit 2, otherwise)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="delegate", description="Run TFLite models across backends, "
                                     "placed by a cost model.")
    parser.add_argument("--version", action="version", version=f"delegate {__version__}")
    _global_flags(parser, default=None)
    sub = parser.add_subparsers(dest="command")

    p = sub.add_parser("run", help="load, plan, compile, run and report (the default command)")
    _common(p)
    p.set_defaults(model=None)  # none given: the config's models: list, else the default model
    p.add_argument("--input", "-i", action="append", metavar="FILE|NAME=FILE",
                   help="inputs: an .npz, NAME=FILE.npy, or an image (PNG/JPEG); random when omitted")
    p.add_argument("--output", "-o", help="save outputs to this .npz")
    p.add_argument("--runs", type=at_least(1), default=10, help="timed runs after the first (default 10)")
    p.add_argument("--seed", type=at_least(0), default=0, help="seed of the random inputs (default 0)")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("inspect", help="print the model's IR: inputs, outputs, ops, tensors")
    _common(p)
    p.add_argument("--ir", action="store_true", help="also print the textual IR")
    p.set_defaults(fn=cmd_inspect)

    p = sub.add_parser("plan", help="explain where each op runs and why")
    _common(p)
    p.add_argument("--svg", help="draw the plan to this SVG file")
    p.add_argument("--explain", action="store_true",
                   help="also say what each column means and print every partition's compile details")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("backends", help="list installed backends, their devices and availability")
    _common(p, model=False)  # the config's disable_plugins applies
    p.set_defaults(fn=cmd_backends)

    p = sub.add_parser("zoo", help="write a built-in model to a .tflite file")
    p.add_argument("name", nargs="?", help="model name (omit to list)")
    _common(p, model=False)
    p.add_argument("--output", "-o", help="output path (default NAME.tflite, NAME_QUANT.tflite when quantized)")
    p.add_argument("--quant", choices=QUANT_MODES, default="fp32",
                   help="fp32 as built; fp16 weights behind DEQUANTIZE; int8 full-integer, calibrated on random "
                        "inputs, with float32 inputs and outputs")
    p.set_defaults(fn=cmd_zoo)

    from . import cli_tools
    cli_tools.add_parsers(sub, _common)
    _dataset_parsers(sub)
    return parser


def _dataset_parsers(sub) -> None:
    """``eval`` and ``map``: a model over a dataset, in-process or on Ray (delegate.evaluate, delegate.batchmap)."""
    from .batchmap import cmd_map
    from .evaluate import REFERENCES, cmd_eval

    def dataset_command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("model", help="a .tflite file or zoo:NAME")
        p.add_argument("dataset", help="a folder of images or of .npy/.npz shards, one shard, or Parquet (with --ray)")
        _common(p, model=False)
        p.add_argument("--batch", type=at_least(1), default=1,
                       help="samples per batch a worker takes, run along the model's batch dimension where it "
                            "allows, else one at a time (default 1)")
        p.add_argument("--threads", type=at_least(1), help="CPU threads per session (default: the config's)")
        p.add_argument("--ray", action="store_true", help="run on Ray Data actors, one session each (executor: ray)")
        p.add_argument("--ray-address", help="join this Ray cluster (default RAY_ADDRESS, else a local Ray)")
        p.add_argument("--workers", type=at_least(1), help="Ray actors (default: the cluster's CPUs / --threads)")
        return p

    p = dataset_command("eval", "compare configurations with a reference over a dataset, sample by sample")
    p.add_argument("--configs", help="comma-separated suite presets (bench --suite) or config files "
                                     "(default: the --config)")
    p.add_argument("--reference", default="litert",
                   help=f"{' or '.join(REFERENCES)} (LiteRT's CPU interpreter), or one of --configs (default litert)")
    p.add_argument("--worst", type=at_least(0), default=5, help="worst samples listed per configuration")
    p.add_argument("--out", default="eval-results", help="directory for eval.json, eval.csv, eval.png")
    p.add_argument("--compare-in-process", action="store_true",
                   help="with --ray: first run the dataset in this process (one set of sessions) and report the "
                        "Ray run's speedup over it and whether the results are identical")
    p.set_defaults(fn=cmd_eval)

    p = dataset_command("map", "run the model over a dataset, writing its outputs")
    p.add_argument("--out", required=True, help="directory for the outputs (.npz shards; Parquet with --ray) and "
                                                "map.json")
    p.add_argument("--overwrite", action="store_true", help="replace a previous map's files in --out")
    p.add_argument("--shard-size", type=at_least(1), default=1024, help="samples per output shard (default 1024)")
    p.set_defaults(fn=cmd_map)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `delegate --config X model.tflite` is `delegate run --config X model.tflite`
    first = next((a for a in argv if not a.startswith("-")), None)
    if not any(a in SUBCOMMANDS for a in argv[:1]) and not any(a in ("-h", "--help", "--version") for a in argv):
        global_flags = [a for a in argv if a in ("--debug", "-v", "-vv", "--verbose")]
        rest = [a for a in argv if a not in global_flags]
        if first not in SUBCOMMANDS:
            argv = global_flags + ["run"] + rest
    parser = build_parser()
    args = parser.parse_args(argv)
    args.debug, args.verbose = bool(args.debug), args.verbose or 0
    logging.basicConfig(level=logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    show_progress(sys.stderr.isatty() and not getattr(args, "json", False))
    if not args.debug:
        warnings.simplefilter("ignore")  # fallbacks are reported through the log and the plan notes
    if not getattr(args, "fn", None):
        parser.print_help()
        return EXIT_USAGE
    for dest, flag in OUTPUT_FLAGS.items():
        problem = getattr(args, dest, None) and (unwritable(getattr(args, dest)) or _cannot_draw(dest))
        if problem:
            print(f"delegate: error: {flag} {getattr(args, dest)}: {problem}", file=sys.stderr)
            return EXIT_USAGE
    try:
        code = int(args.fn(args) or 0)
        sys.stdout.flush()  # a reader that stopped early (`| head`) is found here, not at interpreter exit
        return code
    except BrokenPipeError:
        return closed_pipe()
    except DelegateError as exc:
        if args.debug:
            raise
        print(f"delegate: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("delegate: interrupted", file=sys.stderr)
        return 130
    except MemoryError as exc:  # what the model or its inputs asked for, not a bug
        if args.debug:
            raise
        print(f"delegate: error: out of memory{f' ({exc})' if str(exc) else ''}; "
              f"limits.memory_mb caps what one session may plan for", file=sys.stderr)
        return ExecutionError.exit_code
    except Exception as exc:  # a bug: still one line unless --debug
        if args.debug:
            raise
        # a file system refusing a file the checks before the run could not foresee (/proc, read-only): not a bug
        if isinstance(exc, OSError) and exc.filename is not None:
            print(f"delegate: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"delegate: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
