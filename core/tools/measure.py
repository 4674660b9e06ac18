"""Timing: medians, alternation with a reference, peak memory, and per-op / per-partition profiles.

Everything here is measured; nothing is derived from the cost model.  Where a backend cannot time
single ops (the LiteRT engine), only its partitions are timed, and the profile says so.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..backend import HOST, asked_cost_class
from ..errors import DelegateError

# LiteRT slower than this while alternating with delegate than alone (by a factor, and by more than
# timer jitter) means delegate left work on the cores (spinning threads) that the reference paid for.
REFERENCE_SLOWDOWN = 1.25
REFERENCE_JITTER_MS = 0.1


_IMPORTED = time.perf_counter()


def process_started() -> float:
    """When this process started, on the ``time.perf_counter`` clock (Linux: from /proc; elsewhere when this
    module was imported, which misses the interpreter's start-up and the first imports)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED
    return time.perf_counter() - max(age, 0.0)


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


def samples_ms(run: Callable[[], Any], runs: int, warmup: int = 0) -> list[float]:
    """Milliseconds of ``runs`` calls of ``run`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1e3)
    return times


# After another plan has run, a plan's first runs are slow: on an H100 host the CPU alone (LiteRT, 16 threads)
# right after an OpenCL or WebGPU plan's run took 1.45x, 1.27x, 1.12x and 1.04x its back-to-back time on its next
# four runs (mobilenet_v2_035_96_int8, 0.385 ms a run), efficientnet_lite_blocks_int8 1.28x to 1.03x over four,
# iris_landmark 1.17x then 1.03x: about the first 1.5 ms after each switch.  Plans timed in turn settle first.
SWITCH_SETTLE_MS = 2.0


def settle(run: Callable[[], Any]) -> None:
    """Untimed runs of ``run`` until SWITCH_SETTLE_MS passed, at least one: before timing a plan that another
    plan's runs just preceded (the time a model is run back to back is the one to measure)."""
    start = time.perf_counter()
    run()
    while (time.perf_counter() - start) * 1e3 < SWITCH_SETTLE_MS:
        run()


def alone_median(run: Callable[[], Any], runs: int, warmup: int = 0) -> float:
    """Median ms of ``run`` on its own: the baseline the alternating measurement is checked against."""
    return float(np.median(samples_ms(run, runs, warmup)))


def reference_slowed(alternating_ms: float, alone_ms: float) -> bool:
    return alternating_ms > REFERENCE_SLOWDOWN * alone_ms and alternating_ms - alone_ms > REFERENCE_JITTER_MS


def time_alternating(ours: Callable[[], Any], theirs: Callable[[], Any] | None, runs: int,
                     tick: Callable[[], None] | None = None) -> tuple[list[float], list[float]]:
    """``ours`` and ``theirs`` alternately, ``runs`` times each; milliseconds of each."""
    mine, ref = [], []
    for _ in range(runs):
        t = time.perf_counter()
        ours()
        mine.append((time.perf_counter() - t) * 1e3)
        if theirs is not None:
            t = time.perf_counter()
            theirs()
            ref.append((time.perf_counter() - t) * 1e3)
        if tick is not None:
            tick()
    return mine, ref


def separate_peak_rss(data: bytes, threads: int, config: str | None, backends: str | None,
                      overrides: list[str]) -> tuple[float, float]:
    """Peak RSS of delegate alone and of LiteRT alone, each in a fresh process that loads the model, runs it
    five times and imports nothing of the other runtime (nor delegate's CLI).

    In one process the two runtimes' memory would add up, so the comparison is made apart.
    """
    from .reference import DELEGATE_ALONE_SCRIPT, LITERT_ALONE_SCRIPT

    with tempfile.NamedTemporaryFile(suffix=".tflite", delete=False) as f:
        f.write(data)
    try:
        ours = subprocess.run([sys.executable, "-c", DELEGATE_ALONE_SCRIPT, f.name, config or "", backends or "",
                               *overrides], capture_output=True, text=True, timeout=600)
        theirs = subprocess.run([sys.executable, "-c", LITERT_ALONE_SCRIPT, f.name, str(threads)],
                                capture_output=True, text=True, timeout=600)
    finally:
        os.unlink(f.name)
    if ours.returncode or theirs.returncode:
        raise DelegateError(f"memory measurement failed: {(ours.stderr or theirs.stderr).strip()[-200:]}")
    return float(ours.stdout.strip().splitlines()[-1]), float(theirs.stdout.strip().splitlines()[-1])


@dataclass
class PartitionTiming:
    """One partition timed on its own: inputs staged on its device, outputs read back to the host."""

    index: int
    backend: str
    ms: float
    # until run() returned, read-backs excluded: on a queued device (OpenCL, WebGPU) the host's enqueue or
    # encode work alone, which sets the floor at batch 1 on a fast GPU; on the CPU the whole computation
    host_ms: float = 0.0
    op_ms: dict[int, float] = field(default_factory=dict)  # per op, where the backend times ops
    op_source: str = ""  # how op_ms was measured, or why there is none
    ops_alone: bool = False  # op_ms timed each op run alone, outside the partition's runs
    # device time of the host copies and layout conversions at the partition's edges, where the backend times them
    boundary_ms: float | None = None
    # one run with inputs and outputs left on the device (enqueue + wait), where the backend has such a run
    resident_ms: float | None = None


def partition_inputs(executor, indexed: dict[int, np.ndarray]) -> list[dict[int, np.ndarray]]:
    """The host values each partition of ``executor`` reads, from one run of its plan."""
    values = dict(indexed)
    per_partition = []
    for part, compiled in zip(executor.partitions, executor.compiled):
        backend = executor.backends[part.backend]
        args = {t.index: np.asarray(values[t.index]) for t in part.inputs}
        per_partition.append(args)
        outputs = compiled.run({i: backend.to_device(v) for i, v in args.items()})
        values.update({i: np.asarray(backend.to_host(v)) for i, v in outputs.items()})
    return per_partition


def profile_partitions(executor, indexed: dict[int, np.ndarray], runs: int = 5) -> list[PartitionTiming]:
    """Each partition's own time, and its ops' times where its backend can measure them."""
    timings = []
    for part, compiled, args in zip(executor.partitions, executor.compiled, partition_inputs(executor, indexed)):
        backend = executor.backends[part.backend]
        staged = {i: backend.to_device(v) for i, v in args.items()}
        host: list[float] = []

        def once():
            start = time.perf_counter()
            outputs = compiled.run(staged)
            host.append((time.perf_counter() - start) * 1e3)
            for value in outputs.values():
                backend.to_host(value)
        ms = float(np.median(samples_ms(once, runs, warmup=1)))
        timing = PartitionTiming(part.index, part.backend, ms, float(np.median(host[1:])))
        resident = getattr(compiled, "run_resident", None)  # a plugin's class may predate it
        if resident is not None and resident():  # on the inputs the runs above left on the device
            timing.resident_ms = float(np.median(samples_ms(resident, runs)))
        source = compiled.op_timer()
        if source:
            compiled.set_profiling(True)
            try:
                samples_ms(once, runs)
                timing.op_ms = {int(k): float(v) for k, v in compiled.profile().items()}
                timing.ops_alone = bool(getattr(compiled, "ops_timed_alone", False))
                timing.boundary_ms = compiled.boundary_ms() if hasattr(compiled, "boundary_ms") else None
            finally:
                compiled.set_profiling(False)
        timing.op_source = source if timing.op_ms else f"partition timed as a whole: {part.backend} " + (
            "timed no op" if source else "cannot time single ops here")
        timings.append(timing)
    return timings


def estimate_report(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """How good the cost model's estimates were over tuned models: share of measured plans within 25%,
    the median estimate/measured ratio, and how often the lowest estimate was within 1.10x of the fastest."""
    ratios, picks = [], 0
    for doc in docs:
        measured = {c["name"]: c["measured_ms"] for c in doc["candidates"] if c["measured_ms"]}
        ratios += [c["estimated_ms"] / measured[c["name"]] for c in doc["candidates"] if c["name"] in measured]
        best = min(measured.values(), default=None)
        pick = measured.get(doc["estimated_pick"])
        picks += bool(best and pick and pick <= 1.10 * best)
    return {"models": len(docs), "plans_measured": len(ratios),
            "within_25_percent": sum(0.75 <= r <= 1.25 for r in ratios),
            "median_ratio": round(float(np.median(ratios)), 3) if ratios else None,
            "pick_within_1_10": picks}


def on_anchors(op_ms: dict[int, float], anchors: dict[int, int]) -> dict[int, float]:
    """Per-op times with a fused kernel's time on the op the planner costs it to (its group's anchor:
    ``passes.folded_into``): a backend's timer names a kernel by any of its ops (OpenCL's by the first,
    the depthwise convolution a 1x1 convolution's kernel computes), and the ops folded into an anchor
    cost nothing of their own, so a time left on one would go unlearned (or be kept as that op's)."""
    moved: dict[int, float] = {}
    for index, ms in op_ms.items():
        target = anchors.get(index, index)
        moved[target] = moved.get(target, 0.0) + ms
    return moved


def learn_from(session, executor, timings: list[PartitionTiming], store_ops: bool = False,
               plan_ms: float | None = None) -> list[str]:
    """Refit each backend's profile to measured partitions of ``executor`` (a plan of ``session``), and with
    ``plan_ms`` (the whole plan's measured time) to what the plan cost beyond them; with ``store_ops`` keep
    the exact op times for later plans; returns where profiles were saved."""
    from ..cost import Observation, folds_of, op_signature, profile_info, refit, refit_plan, save_profile
    from ..passes import folded_into

    saved = []
    changed = set()
    if plan_ms is not None and len(timings) == len(executor.partitions):
        refit_plan(session.profiles, session.host, plan_ms, [(t.backend, t.ms) for t in timings])
        changed = {t.backend for t in timings}
    ops = {op.index: op for op in session.graph.ops}
    parts = {p.index: p for p in executor.partitions}
    described = {p.index: c.describe() for p, c in zip(executor.partitions, executor.compiled)}
    engines = {i: d.get("engine") for i, d in described.items()}
    threads = session.settings.compile.num_threads
    groups, _ = session.planner.groups(session.graph)
    for name, backend in session.backends.items():
        engine = backend.device_info().get("engine")
        # a partition run by another engine than the one this profile describes (the numpy engine taking a
        # partition LiteRT refused) says nothing about it
        # nor one its engine ran at another thread count than the profile's (LiteRT's thread trial under
        # sustained_speed keeps fewer where they were faster): that is another profile's measurement
        mine = [t for t in timings if t.backend == name and (engine is None or engines[t.index] in (None, engine))
                and described[t.index].get("threads", threads) == threads]
        if not mine and name not in changed:
            continue
        profile = session.profiles[name]
        into = folded_into(groups.get(name, []))
        anchors = {index: anchor for index, (anchor, _) in into.items()}
        observations = [Observation(list(parts[t.index].ops), t.ms, on_anchors(t.op_ms, anchors),
                                    op_times_include_launch=backend.role == HOST,
                                    op_times_alone=t.ops_alone,
                                    transfer_ms=sum(session.planner.transfer_cost(x, name)
                                                    for x in parts[t.index].inputs + parts[t.index].outputs),
                                    folds=folds_of(parts[t.index].ops, into))
                        for t in mine]
        folded = session.planner.folded(session.graph, name)
        used = refit(profile, observations, lambda op, b=backend: op.index in folded
                     or b.estimate_ms(op, session.settings.compile) == 0.0,
                     lambda op, b=backend: asked_cost_class(b, op))
        if store_ops:
            for obs in observations:
                for i, ms in obs.op_ms.items():
                    if i not in obs.folds:  # a working fold's kernel time is not its anchor's own
                        profile.measured_op_ms[op_signature(ops[i])] = ms
        if used or store_ops or name in changed:
            saved.append(str(save_profile(profile_info(backend, session.settings.compile.num_threads), profile)))
    return saved
