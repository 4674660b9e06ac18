"""Measured plan selection: compile a few candidate plans, time them on the device, keep the fastest.

The cost model ranks plans well only as far as its figures are right; a measurement settles it.
Candidates come from the planner (``Planner.candidates``).  Each is compiled (the kernel caches make
repeats cheap) and run on the same random inputs, in rounds, alternately, so that a busy moment
does not favour one; after a few rounds a candidate slower than the leader by a clear margin is
stopped.  Everything stays within the time budget.  The decision is stored per model, device and
placement settings in the user cache, so the next load takes it without measuring.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .cost import fingerprint, profile_dir
from .digest import blake2b, sha256
from .errors import DelegateError
from .ir import Subgraph
from .planner import Candidate
from .stdio import progress

MIN_ROUNDS = 3  # rounds every candidate runs before any is stopped
MAX_ROUNDS = 25
# Runs of a candidate per round, back to back, the first not timed: a plan run right after another
# candidate's finds the caches and the device's queue as that one left them, not as its own last run
# did (alternating single runs, MobileNetV2 OpenCL greedy measured 1.33 ms on the H100 against 0.75 ms
# run back to back, which is how a model is run).
RUNS_PER_ROUND = 3
STOP_MARGIN = 1.3  # stopped when its fastest run is this much slower than the leader's median
DECISION_VERSION = 2  # bump when the candidate set or its naming changes


def model_fingerprint(graph: Subgraph) -> str:
    """Key of a model: its ops, options, tensor shapes and types, and every weight byte."""
    h = blake2b(digest_size=16)
    for op in graph.ops:
        h.update(json.dumps([op.opcode, op.version, [t.index if t is not None else -1 for t in op.inputs],
                             [t.index for t in op.outputs], op.options], sort_keys=True, default=str).encode())
    for t in graph.tensors:
        h.update(f"{t.index}|{t.shape}|{t.dtype.name}|{t.quantization}".encode())
        if t.data is not None:
            h.update(np.ascontiguousarray(t.data).tobytes())
    return h.hexdigest()


def decision_key(graph: Subgraph, devices: Mapping[str, Mapping[str, Any]], settings: Mapping[str, Any]) -> str:
    """Model fingerprint + device fingerprints + the settings that change which plans exist or how fast."""
    text = json.dumps({"model": model_fingerprint(graph), "devices": {k: fingerprint(dict(v)) for k, v in devices.items()},
                       "settings": settings, "version": DECISION_VERSION}, sort_keys=True, default=str)
    return sha256(text.encode()).hexdigest()[:32]


def decision_dir() -> Path:
    return profile_dir() / "decisions"


def load_decision(key: str) -> dict[str, Any] | None:
    """A stored decision, or None (missing or unreadable: planning continues without it)."""
    try:
        doc = json.loads((decision_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("assignment"), dict):
        return None
    return doc


def save_decision(key: str, winner: Candidate, candidates: Sequence[Candidate]) -> Path:
    directory = decision_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{key}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({
        "chosen": winner.name, "precision": winner.precision,
        "assignment": {str(k): v for k, v in winner.assignment.items()},
        "measured_at": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "candidates": [{**c.to_dict(), "assignment": {str(k): v for k, v in c.assignment.items()}}
                       for c in candidates]}, indent=1))
    os.replace(tmp, path)
    return path


def stored_candidate(doc: Mapping[str, Any], candidates: Sequence[Candidate]) -> Candidate | None:
    """The candidate a stored decision names, with the stored measurements copied onto the candidates that
    are the same plan (assignment and precision; names can change meaning when the cost profile is refitted).
    A candidate the decision never timed says so."""
    def same_plan(assignment: Mapping[str, str], precision: str) -> tuple:
        return tuple(sorted((int(k), v) for k, v in assignment.items())), precision

    measured = {same_plan(c["assignment"], c.get("precision", "")): c for c in doc.get("candidates", [])
                if isinstance(c, dict) and isinstance(c.get("assignment"), dict)}
    wanted = same_plan(doc["assignment"], doc.get("precision", ""))
    chosen = None
    for c in candidates:
        key = same_plan(c.assignment, c.precision)
        if key in measured:
            c.measured_ms, c.status = measured[key].get("measured_ms"), measured[key].get("status", "")
            c.compile_s = measured[key].get("compile_s")
        else:
            c.status = "not timed by the stored decision (planned since)"
        if key == wanted:
            chosen = c
    return chosen


def predicted_compile_s(candidate: Candidate, compiles: Sequence[float], first_compile_s: Mapping[str, float],
                        compiled_pairs: set[tuple[str, str]]) -> float:
    """About the quickest compile so far where each of the candidate's backends has compiled a candidate at
    its precision already (the backends reuse the kernels built: the plans of one model share most of
    them); where one has not, as long as that backend's first compile, when its kernels were all built
    cold (the longest compile so far if it never compiled).  Selfie_segmentation on the H200: the CPU
    compiled in 0.09 s, OpenCL alone in 5.61 s, and OpenCL at fp16, a kernel set of its own, in 4.67 s."""
    quickest = min(compiles, default=0.0)
    new = {b for b in set(candidate.assignment.values()) if (b, candidate.precision) not in compiled_pairs}
    return max([quickest] + [first_compile_s.get(b, max(compiles, default=0.0)) for b in new])


@dataclass
class Trial:
    candidate: Candidate
    run: Callable[[], Any]
    samples: list[float]


def measure(candidates: Sequence[Candidate], build: Callable[[Candidate], Callable[[], Any]],
            budget_s: float, started: float | None = None) -> Candidate:
    """Time each candidate (``build`` compiles it and returns one run); fill ``measured_ms``; the fastest.

    The single backends alone come first (what the plan must never be slower than), the host's first, then
    the others in order of their estimate.  The host alone is always compiled, an accelerator alone while any
    of the budget is left, any other candidate where its predicted compile (see ``predicted_compile_s``) and
    the minimum rounds of every candidate compiled, its own included, still fit in the budget.  A compile
    under way is not interrupted: the budget is overrun by at most one.  One that fails to compile
    or run is left out with the reason in its ``status``.  ``started``: when the search began (perf_counter),
    if before this call: the budget is the caller's whole wait, its backends' set-up included (on the H200,
    tune took 10.9 s of a 10 s budget counted from here)."""
    start = time.perf_counter() if started is None else started
    deadline = start + budget_s
    trials: list[Trial] = []
    compiles: list[float] = []  # seconds to compile and first run each candidate
    first_compile_s: dict[str, float] = {}  # backend -> the compile of the first candidate that used it
    compiled_pairs: set[tuple[str, str]] = set()  # (backend, precision) of every candidate compiled
    with progress(f"timing {len(candidates)} candidate plans (each compiled first)", len(candidates)) as advance:
        for c in sorted(candidates, key=lambda c: (not c.host_alone, not c.baseline, c.estimated_ms)):
            advance()
            now = time.perf_counter()
            # the minimum rounds at twice the estimates (a first run, which includes lazy set-up, says less)
            timed_ms = sum(t.candidate.estimated_ms for t in trials) + c.estimated_ms
            rounds = 2 * MIN_ROUNDS * RUNS_PER_ROUND * timed_ms / 1e3
            fits = now <= deadline if c.baseline else \
                now + predicted_compile_s(c, compiles, first_compile_s, compiled_pairs) + rounds <= deadline
            if trials and not c.host_alone and not fits:
                c.status = "not measured: the budget ran out"
                continue
            try:
                run = build(c)
                run()  # first run: lazy set-up, not timed
            except Exception as exc:  # a candidate that cannot run is left out, whatever the backend raised
                what = str(exc) if isinstance(exc, DelegateError) else f"{type(exc).__name__}: {exc}"
                c.status = f"not measured: {(what.splitlines() or [''])[0][:160]}"
                continue
            c.compile_s = time.perf_counter() - now
            compiles.append(c.compile_s)
            for backend in set(c.assignment.values()):
                first_compile_s.setdefault(backend, c.compile_s)
                compiled_pairs.add((backend, c.precision))
            trials.append(Trial(c, run, []))
    live = list(trials)
    for round_ in range(MAX_ROUNDS):
        for trial in live:
            trial.run()
            runs = []
            for _ in range(RUNS_PER_ROUND - 1):
                t = time.perf_counter()
                trial.run()
                runs.append((time.perf_counter() - t) * 1e3)
            trial.samples.extend(runs)
        if time.perf_counter() > deadline and round_ + 1 < MIN_ROUNDS:
            break  # compiling took the budget: the rounds timed so far decide
        if round_ + 1 >= MIN_ROUNDS:
            leader = min(float(np.median(t.samples)) for t in live)
            for trial in list(live):
                if min(trial.samples) > STOP_MARGIN * leader:
                    live.remove(trial)
                    trial.candidate.status = f"stopped after {len(trial.samples)} runs: over {STOP_MARGIN}x the leader"
            if time.perf_counter() > deadline or len(live) == 1:
                break
    for trial in trials:
        trial.candidate.measured_ms = float(np.median(trial.samples))
    if not trials:
        raise RuntimeError("no candidate plan could be compiled and run")
    return min((t.candidate for t in trials if t in live), key=lambda c: c.measured_ms)
