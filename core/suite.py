"""``delegate bench --suite``: the corpus on every available backend and config, against LiteRT.

For each model, LiteRT's interpreter (same thread count) and each delegate
configuration run alternately in one process on the same inputs.  Written to
``--out``: ``suite.md`` (table with machine, versions, date and the exact
command), ``suite.csv`` and ``suite.png`` (latency ratio to LiteRT per model
and configuration, when matplotlib is installed).
"""

from __future__ import annotations

import csv
import datetime
import logging
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .backend import HOST, CompileOptions
from .errors import DelegateError
from .planner import PlacementSettings
from .session import RunSettings, Session
from .stdio import native_reason, native_stderr
from .tools.compare import worst_relative_error
from .tools.measure import alone_median, peak_rss_mb, reference_slowed, time_alternating
from .tools.reference import litert_cpu, litert_gpu

log = logging.getLogger(__name__)

CPU_NUMPY = ("cpu", {"engine": "numpy"})
CPU_AUTO = ("cpu", {"engine": "auto"})  # the ops GPU configurations leave to the CPU


@dataclass
class SuiteConfig:
    name: str
    backends: list[tuple[str, dict]]
    precision: str = "fp32"
    partitioner: str = "cost"

    def settings(self, threads: int, cache_dir: str | None, preference: str) -> RunSettings:
        return RunSettings(backends=self.backends,
                           compile=CompileOptions(precision=self.precision, allow_quantized=True,
                                                  num_threads=threads, cache_dir=cache_dir,
                                                  inference_preference=preference),
                           placement=PlacementSettings(partitioner=self.partitioner), fallback=True)


CONFIGS = [
    SuiteConfig("cpu-numpy", [CPU_NUMPY]),
    SuiteConfig("cpu-litert", [("cpu", {"engine": "litert"})]),
    SuiteConfig("opencl-fp32", [("opencl", {}), CPU_AUTO]),
    SuiteConfig("opencl-fp16", [("opencl", {}), CPU_AUTO], precision="fp16"),
    SuiteConfig("opencl-fp32-greedy", [("opencl", {}), CPU_AUTO], partitioner="greedy"),
    SuiteConfig("wgpu-fp32", [("wgpu", {}), CPU_AUTO]),
    SuiteConfig("wgpu-fp16", [("wgpu", {}), CPU_AUTO], precision="fp16"),
    SuiteConfig("wgpu-fp32-greedy", [("wgpu", {}), CPU_AUTO], partitioner="greedy"),
]


@dataclass
class Row:
    model: str
    config: str
    status: str = "ok"
    init_ms: float | None = None
    init_cached_ms: float | None = None
    first_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    litert_ms: float | None = None
    ratio: float | None = None
    partitions: int | None = None
    copies: int | None = None
    max_error: float | None = None
    peak_rss_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def bench_model(label: str, data: bytes, configs: list[SuiteConfig], runs: int, threads: int,
                cache_root: Path, progress: Callable[[str], None], preference: str) -> list[Row]:
    from .inputs import random_input
    from .tflite.reader import read_model

    model = read_model(data)
    rng = np.random.default_rng(0)
    host_inputs = [random_input(t, rng) for t in model.main.inputs]
    try:
        with native_stderr(log):
            reference = litert_cpu(data, threads)
            expected = reference(host_inputs)
        missing_reference = None
    except (RuntimeError, ValueError) as exc:  # a custom op LiteRT lacks: time ours alone
        reference = expected = None
        missing_reference = f"LiteRT cannot run it: {str(exc).splitlines()[0][:100]}"
    rows = []
    for config in configs:
        progress(f"{label} / {config.name}")
        row = Row(label, config.name)
        rows.append(row)
        cache_dir = cache_root / f"{label.replace(':', '_')}-{config.name}"
        try:
            t = time.perf_counter()
            session = Session(model, config.settings(threads, str(cache_dir), preference))
            row.init_ms = (time.perf_counter() - t) * 1e3
            first = session.manager.resolve(config.backends[0][0])
            if first != session.host and not any(p.backend == first for p in session.plan.partitions):
                row.status = f"nothing placed on {first}"
            t = time.perf_counter()
            Session(model, config.settings(threads, str(cache_dir), preference)).close()
            row.init_cached_ms = (time.perf_counter() - t) * 1e3
            inputs = session.normalize_inputs(host_inputs)
            theirs = None if reference is None else (lambda: reference(host_inputs))
            # LiteRT alone, before this configuration has run: the baseline that shows whether it slows LiteRT.
            alone = alone_median(theirs, max(5, runs // 4), warmup=2) if theirs is not None else None
            t = time.perf_counter()
            out = session.run_indexed(inputs)
            row.first_ms = (time.perf_counter() - t) * 1e3
            if expected is not None:
                row.max_error = worst_relative_error([out[t.index] for t in session.graph.outputs], expected)
            for _ in range(3):
                session.run_indexed(inputs)
                if theirs is not None:
                    theirs()
            mine, ref = time_alternating(lambda: session.run_indexed(inputs), theirs, runs)
            row.p50_ms, row.p90_ms = float(np.percentile(mine, 50)), float(np.percentile(mine, 90))
            if ref:
                row.litert_ms = float(np.median(ref))
                row.ratio = row.p50_ms / row.litert_ms
                if reference_slowed(row.litert_ms, alone):
                    row.status = f"LiteRT slowed alternating ({row.litert_ms:.3f} vs {alone:.3f} ms alone)"
            else:
                row.status = missing_reference
            row.partitions, row.copies = len(session.plan.partitions), len(session.plan.copies)
            row.peak_rss_mb = peak_rss_mb()
            session.close()
        except (DelegateError, RuntimeError, ValueError) as exc:
            row.status = f"failed: {str(exc).splitlines()[0][:120]}"
    progress(f"{label} / litert-gpu")
    row = Row(label, "litert-gpu")
    rows.append(row)
    if reference is None:
        row.status = f"unavailable: {missing_reference}"
        return rows
    with native_stderr(log, echo=lambda line: False) as lines:  # its registry and driver logs: -vv
        try:
            _time_litert_gpu(row, data, expected, host_inputs, reference, runs)
            failed = None
        except Exception as exc:  # LiteRT's accelerator is optional: record why it did not run
            failed = (type(exc).__name__, str(exc))  # not the exception: its frames would keep the model alive
    if failed is not None:
        row.status = f"unavailable: {(native_reason(lines, failed[1]) or failed[0])[:120]}"
    return rows


def _time_litert_gpu(row: Row, data: bytes, expected, host_inputs, reference, runs: int) -> None:
    """LiteRT's GPU accelerator timed against its CPU interpreter, into ``row``; the model is freed on return."""
    t = time.perf_counter()
    gpu = litert_gpu(data, expected)
    row.init_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    got = gpu(host_inputs)
    row.first_ms = (time.perf_counter() - t) * 1e3
    row.max_error = worst_relative_error(got, expected)
    for _ in range(3):
        gpu(host_inputs)
    mine, ref = time_alternating(lambda: gpu(host_inputs), lambda: reference(host_inputs), runs)
    row.p50_ms, row.p90_ms = float(np.percentile(mine, 50)), float(np.percentile(mine, 90))
    row.litert_ms = float(np.median(ref))
    row.ratio = row.p50_ms / row.litert_ms


def machine_facts() -> dict[str, str]:
    from . import __version__
    facts = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "python": platform.python_version(),
             "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
                        f"{len(__import__('os').sched_getaffinity(0))} cores",
             "delegate": __version__, "numpy": np.__version__}
    try:
        import ai_edge_litert
        facts["ai-edge-litert"] = getattr(ai_edge_litert, "__version__", "installed")
    except ImportError:
        pass
    return facts


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def write_reports(rows: list[Row], out: Path, command: str, devices: list[str]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    facts = machine_facts()
    lines = [f"Benchmark suite, {facts['date']}. Command: `{command}`", "",
             "Machine: " + facts["machine"] + "; " + "; ".join(devices), "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in facts.items() if k not in ("date", "machine")), "",
             "| model | config | p50 ms | p90 ms | LiteRT ms | ratio | first ms | init ms | init cached ms "
             "| partitions | copies | max err | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.config} | {_fmt(r.p50_ms)} | {_fmt(r.p90_ms)} | {_fmt(r.litert_ms)} | "
                     f"{_fmt(r.ratio, 2)} | {_fmt(r.first_ms)} | {_fmt(r.init_ms, 1)} | {_fmt(r.init_cached_ms, 1)} | "
                     f"{r.partitions if r.partitions is not None else '-'} | "
                     f"{r.copies if r.copies is not None else '-'} | "
                     f"{'-' if r.max_error is None else f'{r.max_error:.2e}'} | {r.status} |")
    md = out / "suite.md"
    md.write_text("\n".join(lines) + "\n")
    csv_path = out / "suite.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        names = [k for k in Row.__dataclass_fields__ if k != "extra"]
        writer.writerow(names)
        for r in rows:
            writer.writerow([getattr(r, k) for k in names])
    written = [md, csv_path]
    try:
        figure = draw_chart(rows, f"{facts['machine']}, {facts['date']}")
        figure.savefig(out / "suite.png", dpi=110, bbox_inches="tight")
        written.append(out / "suite.png")
    except ImportError:
        log.warning("suite.png not drawn: matplotlib is not installed (pip install 'delegate[all]')")
        with md.open("a") as f:
            f.write("\nNo chart: matplotlib is not installed (pip install 'delegate[all]').\n")
    return written


def draw_chart(rows: list[Row], machine: str):
    """Latency ratio to LiteRT per model (groups) and configuration (bars), on a log scale with one label per
    power-of-two tick; the legend beside the plot, the machine and date in the title."""
    import matplotlib.figure
    import matplotlib.ticker
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    ok = [r for r in rows if r.ratio is not None]
    models = sorted({r.model for r in ok})
    configs = sorted({r.config for r in ok})
    fig = matplotlib.figure.Figure(figsize=(max(7.0, len(models) * 1.4 + 3.0), 4.8))  # not pyplot's: nothing kept
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    width = 0.8 / max(len(configs), 1)
    for i, config in enumerate(configs):
        values = [next((r.ratio for r in ok if r.model == m and r.config == config), np.nan) for m in models]
        ax.bar(np.arange(len(models)) + i * width, values, width, label=config)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(models)) + 0.4 - width / 2)
    ax.set_xticklabels(models, rotation=20, ha="right")
    ax.set_ylabel("latency / LiteRT interpreter (lower is better)")
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=2, numticks=12))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_title(f"delegate vs LiteRT, median latency ratio\n{machine}", fontsize=10)
    if configs:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig


def fresh_out(root: Path = Path("bench-results")) -> Path:
    """A directory no earlier suite wrote to: ``root/suite-DATE-TIME`` (with a counter if that exists)."""
    stem = root / datetime.datetime.now().strftime("suite-%Y%m%d-%H%M%S")
    out, n = stem, 1
    while out.exists():
        n += 1
        out = stem.with_name(f"{stem.name}-{n}")
    return out


def run_suite(models: list[tuple[str, bytes]], config_names: list[str] | None, runs: int, threads: int,
              out: Path, progress: Callable[[str], None], preference: str = "fast_single_answer",
              command: str | None = None) -> tuple[list[Row], list[Path]]:
    """Every model on every configuration named (all when None); the rows and the reports written to
    ``out``, whose header quotes ``command`` (default: this process's command line)."""
    configs = [c for c in CONFIGS if not config_names or c.name in config_names]
    rows = []
    cache_root = out / "cache"
    cache_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    for label, data in models:
        rows.extend(bench_model(label, data, configs, runs, threads, cache_root, progress, preference))
    devices = _device_lines()
    return rows, write_reports(rows, out, command or "delegate " + " ".join(sys.argv[1:]), devices)


def _device_lines() -> list[str]:
    from .plugins import default_manager

    lines = []
    for status in default_manager().status():
        if status.available and status.role != HOST:
            try:
                info = default_manager().backend_info(status.name).factory({}).device_info()
                lines.append(f"{status.name}: {info.get('device') or info.get('adapter') or status.reason}")
            except Exception as exc:
                lines.append(f"{status.name}: unavailable ({exc})")
    return lines
