"""``delegate eval MODEL DATASET``: every configuration against a reference, sample by sample.

The reference is LiteRT's CPU interpreter (``litert``; ``litert-builtin`` for its
reference kernels) or one of the configurations.  Per sample, configuration and
output: the max and mean absolute error, both relative to the reference's largest
magnitude, the cosine; for a classifier output (``[1, C]``, C >= 10) whether the
top-1 class agrees and whether the reference's top-1 is in the configuration's
top-5; for a detector (TFLite_Detection_PostProcess outputs) whether the top box's
class agrees and its box overlaps the reference's (IoU >= 0.5).  Aggregated with
percentiles, the worst samples listed; written as ``eval.json``, ``eval.csv`` (one
row per sample, configuration and output) and ``eval.png`` (when matplotlib is
installed).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .executor import Configuration, RayOptions, Throughput, batched_model, resolve_configurations, run_batches, to_runs
from .errors import DatasetError, DelegateError

TEXT_COLUMNS = ("id", "config", "backends", "output")  # backends: where the configuration's plan ran the model
METRICS = ("max_abs_error", "mean_abs_error", "max_rel_error", "mean_rel_error", "cosine")
AGREEMENTS = ("top1", "top5", "top_box")
REFERENCES = ("litert", "litert-builtin")
CLASSIFIER_MIN_CLASSES = 10
DETECTOR_OP = "TFLite_Detection_PostProcess"
IOU_AGREES = 0.5
PERCENTILES = (50, 90, 99)


class EvalWorker:
    """One session per configuration and the reference, built once (per Ray actor); a batch in, a row per
    sample, configuration and output out."""

    def __init__(self, data: bytes, batch: int, configurations: Sequence[Configuration], reference: str,
                 threads: int, dataset):
        from .session import Session
        from .tflite.reader import read_model
        from .tools.reference import litert_cpu

        self.batch, self.dataset = batch, dataset
        model = read_model(data)
        self.sessions = {c.name: Session(model, c.settings) for c in configurations}
        self.reference = reference
        if reference in REFERENCES:
            runner = litert_cpu(data, threads, builtin_kernels=reference == "litert-builtin")
            outputs = model.main.outputs
            self.run_reference = lambda named: dict(zip((t.name for t in outputs),
                                                        runner([named[t.name] for t in model.main.inputs])))
        else:
            self.run_reference = self.sessions[reference].run
        self.outputs = list(model.main.outputs)
        self.detector = _detector_outputs(model.main)
        self.placed = {name: ",".join(dict.fromkeys(p.backend for p in s.plan.partitions))
                       for name, s in self.sessions.items()}

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, inputs = self.dataset.decode(batch)
        rows: dict[str, list] = {k: [] for k in (*TEXT_COLUMNS, *METRICS, *AGREEMENTS)}
        done = 0
        for n, named in to_runs(inputs, self.batch):
            expected = self.run_reference(named)
            actual = {name: session.run(named) for name, session in self.sessions.items() if name != self.reference}
            for i in range(n):  # a sample's rows together: configurations, then outputs
                for name, got in actual.items():
                    for t in self.outputs:
                        a, e = (_real(t, x[t.name][i:i + 1]) for x in (got, expected))
                        row = {"id": ids[done + i] if ids else "", "config": name, "backends": self.placed[name],
                               "output": t.name,
                               **sample_metrics(a, e),
                               **(_top_box(got, expected, self.detector, i) if t.name == self.detector.get("scores")
                                  else {})}
                        for key in rows:
                            rows[key].append(row.get(key, math.nan))
            done += n
        return {k: np.asarray(v, dtype=object if k in TEXT_COLUMNS else np.float64)
                for k, v in rows.items()}


def sample_metrics(actual: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    """One sample's errors (relative to the reference's largest magnitude), cosine and, for a classifier
    output, top-1 agreement and the reference's top-1 within the top-5."""
    from .tools.compare import error_of

    metrics = error_of(actual, expected)
    diff = np.abs(actual - expected)
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    mean = float(diff.mean()) if diff.size else 0.0
    metrics.update(mean_abs_error=mean, mean_rel_error=mean / (scale or 1.0))
    if expected.ndim == 2 and expected.shape[1] >= CLASSIFIER_MIN_CLASSES:
        best = int(np.argmax(expected[0]))
        metrics["top1"] = float(int(np.argmax(actual[0])) == best)
        metrics["top5"] = float(best in np.argsort(-actual[0], kind="stable")[:5])
    return metrics


def _real(t, values: np.ndarray) -> np.ndarray:
    """Values as real numbers: a quantized output through its scale and zero point."""
    q = t.quantization
    if q is not None and values.dtype.kind in "iu" and q.scale.size == 1:
        return (values.astype(np.float64) - float(q.zero_point[0])) * float(q.scale[0])
    return values.astype(np.float64)


def _detector_outputs(graph) -> dict[str, str]:
    """The boxes, classes and scores outputs of a TFLite_Detection_PostProcess, when the model ends in one."""
    names = {t.name for t in graph.outputs}
    for op in graph.ops:
        if op.opcode == DETECTOR_OP or op.custom == DETECTOR_OP:
            boxes, classes, scores = (t.name for t in op.outputs[:3])
            if {boxes, classes, scores} <= names:
                return {"boxes": boxes, "classes": classes, "scores": scores}
    return {}


def _top_box(actual, expected, detector: dict[str, str], i: int) -> dict[str, float]:
    """Whether sample ``i``'s highest-scoring detection has the reference's class and box (IoU >= 0.5)."""
    top = [int(np.argmax(x[detector["scores"]][i])) for x in (actual, expected)]
    same_class = actual[detector["classes"]][i][top[0]] == expected[detector["classes"]][i][top[1]]
    iou = _iou(actual[detector["boxes"]][i][top[0]], expected[detector["boxes"]][i][top[1]])
    return {"top_box": float(bool(same_class) and iou >= IOU_AGREES)}


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    """Overlap of two (ymin, xmin, ymax, xmax) boxes."""
    def area(box):
        return max(box[2] - box[0], 0.0) * max(box[3] - box[1], 0.0)
    inner = (max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))
    union = area(a) + area(b) - area(inner)
    return float(area(inner) / union) if union > 0 else float(np.array_equal(a, b))


# -- aggregation and reports -----------------------------------------------------------

def summarize(rows: dict[str, np.ndarray], worst: int) -> dict[str, Any]:
    """Per configuration and output: percentiles of each metric, agreement shares; the worst samples."""
    configs: dict[str, Any] = {}
    for config in dict.fromkeys(rows["config"]):
        mine = rows["config"] == config
        outputs = {}
        for output in dict.fromkeys(rows["output"][mine]):
            sel = mine & (rows["output"] == output)
            entry: dict[str, Any] = {"samples": int(sel.sum())}
            for m in METRICS:
                values = rows[m][sel]
                low = m == "cosine"  # the bad end of a cosine is its low end
                entry[m] = {"p" + str(p): float(np.percentile(values, 100 - p if low else p)) for p in PERCENTILES}
                entry[m]["min" if low else "max"] = float(values.min() if low else values.max())
            for a in AGREEMENTS:
                values = rows[a][sel]
                if not np.isnan(values).all():
                    entry[a] = float(np.nanmean(values))
            outputs[output] = entry
        order = np.argsort(-rows["max_rel_error"][mine], kind="stable")[:worst]
        picked = {k: v[mine][order] for k, v in rows.items()}
        configs[config] = {"backends": str(rows["backends"][mine][0]), "outputs": outputs, "worst": [
            {"id": str(picked["id"][j]), "output": str(picked["output"][j]),
             **{m: float(picked[m][j]) for m in ("max_rel_error", "max_abs_error", "cosine")}}
            for j in range(len(order))]}
    return configs


def write_reports(doc: dict[str, Any], rows: dict[str, np.ndarray], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "eval.json", out / "eval.csv"]
    written[0].write_text(json.dumps(doc, indent=2) + "\n")
    with written[1].open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(list(rows))
        for j in range(len(rows["id"])):
            writer.writerow([_cell(rows[k][j]) for k in rows])
    png = _plot(doc, rows, out / "eval.png")
    return written + ([png] if png else [])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(float(value))
    return str(value)


def _plot(doc: dict[str, Any], rows: dict[str, np.ndarray], path: Path) -> Path | None:
    """Histograms of each configuration's max relative error per sample, and its agreement shares."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    configs = list(doc["configs"])
    fig, (hist, bars) = plt.subplots(1, 2, figsize=(11, 4))
    for config in configs:
        values = rows["max_rel_error"][rows["config"] == config]
        hist.hist(np.log10(np.maximum(values.astype(np.float64), 1e-12)), bins=40, alpha=0.6, label=config)
    hist.set_xlabel("log10 max relative error per sample and output")
    hist.set_ylabel("count")
    hist.legend(fontsize=7)
    labels = [f"{o}: {a}" for o, e in next(iter(doc["configs"].values()))["outputs"].items() for a in AGREEMENTS
              if a in e]
    width = 0.8 / max(len(configs), 1)
    for k, config in enumerate(configs):
        values = [doc["configs"][config]["outputs"][label.split(": ")[0]][label.split(": ")[1]] for label in labels]
        bars.bar(np.arange(len(labels)) + k * width, values, width, label=config)
    bars.set_xticks(np.arange(len(labels)) + 0.4 - width / 2)
    bars.set_xticklabels(labels, rotation=20, ha="right", fontsize=7)
    bars.set_ylim(0, 1.05)
    bars.set_ylabel(f"share of samples agreeing with {doc['reference']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# -- the command -----------------------------------------------------------------------

def evaluate(model_spec: str, dataset_spec: str, config, configs: list[str], reference: str = "litert",
             batch: int = 1, threads: int = 1, ray: RayOptions | None = None, progress=lambda done, total: None,
             worst: int = 5, compare_in_process: bool = False) -> tuple[dict, dict]:
    """(summary document, per-sample rows) of ``eval``; the Python form of the command.

    ``compare_in_process`` (with ``ray``): the same dataset also runs in this process, first, with one set of
    sessions; the document says how the two throughputs compare and whether their rows are identical."""
    from .cli import read_model_arg
    from .dataset import open_dataset
    from .session import run_settings
    from .tflite.reader import read_model

    _, data, label = read_model_arg(model_spec)
    configurations = resolve_configurations(configs, model_spec, run_settings(config.for_model(model_spec)), threads)
    names = [c.name for c in configurations]
    if reference not in REFERENCES and reference not in names:
        raise DelegateError(f"unknown reference {reference!r}: {' or '.join(REFERENCES)}, or one of --configs "
                            f"{names}")
    if all(n == reference for n in names):
        raise DelegateError(f"nothing to compare: the only configuration is the reference {reference!r}")
    if compare_in_process and ray is None:
        raise DelegateError("comparing with an in-process run needs a Ray run to compare: add --ray")
    data, per_run, note = batched_model(data, batch)
    graph = read_model(data).main
    dataset = open_dataset(dataset_spec, graph.inputs, config.input, batch)
    per_sample = (len(names) - (reference in names)) * len(graph.outputs)

    def run(executor: RayOptions | None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        clock = Throughput(per_sample)
        parts = list(run_batches(dataset, EvalWorker, (data, per_run, configurations, reference, threads, dataset),
                                 executor, threads, any(c.uses_gpu for c in configurations),
                                 lambda n: progress(n, dataset.size or None), per_sample, clock))
        if not parts or not sum(len(p["id"]) for p in parts):
            raise DatasetError(f"{dataset_spec}: the dataset holds no samples")
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, clock.report()

    baseline = run(None) if compare_in_process else None
    rows, throughput = run(ray)
    if not any(rows["id"]):  # Parquet without an id column: samples numbered in dataset order
        rows["id"] = np.asarray([f"#{j // per_sample}" for j in range(len(rows["id"]))], dtype=object)
    samples = len(rows["id"]) // per_sample
    doc = {"model": label, "dataset": dataset_spec, "samples": samples, "reference": reference, "batch": per_run,
           "threads": threads, "executor": "ray" if ray else "in-process", "seconds": throughput["wall_s"],
           "samples_per_s": round(samples / throughput["wall_s"], 2), "throughput": throughput,
           "notes": [note] if note else [], "configs": summarize(rows, worst)}
    if baseline is not None:
        base_rows, base = baseline
        doc["in_process"] = {"samples_per_s": round(samples / base["wall_s"], 2), "throughput": base,
                             "identical": all(np.array_equal(rows[k], v, equal_nan=v.dtype != object)
                                              for k, v in base_rows.items())}
        doc["speedup"] = round(doc["samples_per_s"] / doc["in_process"]["samples_per_s"], 3)
        doc["steady_speedup"] = round(throughput["steady_samples_per_s"] / base["steady_samples_per_s"], 3)
    return doc, rows


def cmd_eval(args) -> int:
    from .cli import console, emit_json, load_cli_config, table
    from .stdio import progress
    from .executor import ray_options

    config = load_cli_config(args)
    threads = args.threads or config.compile_options().num_threads
    with progress("eval", None, "samples") as advance:
        doc, rows = evaluate(args.model, args.dataset, config, args.configs.split(",") if args.configs else [],
                             args.reference, args.batch, threads, ray_options(args, config),
                             lambda n, total: advance(parts=n, total=total), args.worst, args.compare_in_process)
    doc["files"] = [str(f) for f in write_reports(doc, rows, Path(args.out))]
    if args.json:
        emit_json(doc)
        return 0
    c = console()
    c.print(f"[bold]{doc['model']}[/bold] on {doc['dataset']}: {doc['samples']} samples vs {doc['reference']}, "
            f"{doc['executor']}, {doc['seconds']:.1f} s ({doc['samples_per_s']:.1f} samples/s, batch {doc['batch']})")
    c.print(throughput_line(doc["throughput"]))
    if "in_process" in doc:
        c.print(f"in process: {doc['in_process']['samples_per_s']:.1f} samples/s; {doc['executor']} / in process: "
                f"{doc['speedup']:.2f}x (steady state {doc['steady_speedup']:.2f}x); results "
                + ("identical" if doc["in_process"]["identical"] else "DIFFER"))
    for note in doc["notes"]:
        c.print(f"note: {note}")
    c.print(table("agreement and errors per sample (p50 / p99 / worst)",
                  ["config", "ran on", "output", "top-1", "top-5", "top box", "max rel error", "mean rel error", "cosine"],
                  [[config, entry["backends"], output, *[_share(e.get(a)) for a in AGREEMENTS],
                    *[f"{e[m]['p50']:.2e} / {e[m]['p99']:.2e} / {e[m]['max']:.2e}" for m in ("max_rel_error",
                                                                                         "mean_rel_error")],
                    f"{e['cosine']['p50']:.6f} / {e['cosine']['p99']:.6f} / {e['cosine']['min']:.6f}"]
                   for config, entry in doc["configs"].items() for output, e in entry["outputs"].items()]))
    for config, entry in doc["configs"].items():
        c.print(f"worst samples of {config}: " + ", ".join(f"{w['id']} ({w['output']}: {w['max_rel_error']:.2e})"
                                                          for w in entry["worst"]))
    c.print("written: " + ", ".join(doc["files"]))
    return 0


def throughput_line(t: dict[str, Any]) -> str:
    """An executor's measurement of itself (delegate.executor.Throughput) in a line."""
    share = "-" if t["overhead_share"] is None else f"{t['overhead_share']:.1%}"
    return (f"throughput: {t['workers']} worker(s), {t['batches']} batches of {t['samples_per_batch']} samples; "
            f"first batch after {t['first_batch_s']:.1f} s; per batch {t['work_ms_per_batch']} ms of work and "
            f"{t['overhead_ms_per_batch']} ms between calls ({share} of the work); steady "
            f"{t['steady_samples_per_s']:.1f} samples/s")


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
