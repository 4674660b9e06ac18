"""Measured plan selection: compile a few candidate plans, time them on the device, keep the fastest.

The cost model ranks plans well only as far as its figures are right; a measurement settles it.
Candidates come from the planner (``Planner.candidates``).  Each is compiled (the kernel caches make
repeats cheap) and run on the same random inputs, in rounds, alternately, so that a busy moment
does not favour one; after a few rounds a candidate slower than the leader by a clear margin is
stopped (one over HOPELESS_MARGIN times it at its first timed run).  Everything stays within the time
budget.  The decision is stored per model, device and placement settings in the user cache, so the next
load takes it without measuring.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as StillRunning
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
from .tools.measure import SWITCH_SETTLE_MS, settle

MIN_ROUNDS = 3  # rounds every candidate runs before any is stopped (but a hopeless one)
# a candidate whose fastest run is this much slower than the leader's median is stopped at once, without
# the minimum rounds (pose_landmark_full here: WebGPU on lavapipe ~0.9 s a run against the CPU's 11 ms, nine
# runs of it took most of tune's budget)
HOPELESS_MARGIN = 3.0
# an accelerator alone estimated over this many times the CPU alone is not compiled at all: no plan estimated
# slower than the CPU alone was ever more than 3.6x faster than its estimate (an int16 model on PoCL, whose
# CPU kernels are reference loops), and a cold compile is seconds (pose_landmark_full here: its WebGPU plan
# estimated 94x the CPU, 5.8 s to compile and 1.35 s a run; its OpenCL plan on PoCL, with uncalibrated figures
# 8.9x, 33.9 s to compile cold: tune overran its 10 s budget by 32 s on it)
NEVER_ALONE_MARGIN = 5.0
MAX_ROUNDS = 25
# Timed runs of a candidate per round, back to back, after it settles (``measure.settle``: untimed runs for
# the first ~2 ms): a plan run right after another candidate's finds the caches, the host's thread pools and
# the device's queue as that one left them, not as its own last run did (alternating single runs,
# MobileNetV2 OpenCL greedy measured 1.33 ms on the H100 against 0.75 ms run back to back, which is how a
# model is run; after one untimed run, the CPU alone still measured up to 1.27x itself).
RUNS_PER_ROUND = 2
STOP_MARGIN = 1.3  # stopped when its fastest run is this much slower than the leader's median
# A plan that is not a single backend alone is kept over the fastest of those only where it measured faster
# than this fraction of that one's time: closer, the order is the measurement's noise, and a split plan or
# another precision is the one that risks more (an H100 host, 2026-12-08 00:51 UTC: the search kept
# efficientnet_lite_blocks_fp32's cost plan at fp16, which the harness then measured at 1.10x OpenCL alone; on
# the 2-core VM four configurations that chose one plan measured 0.94-1.06x each other)
CLEAR_WIN = 0.95
DECISION_VERSION = 2  # bump when the candidate set or its naming changes
# The status of an accelerator alone whose cold compile outlasted the budget (pose_landmark_full's OpenCL
# kernels took 10-14 s to build on H100 hosts, and tune took 14.7 s of a 10 s budget waiting for them).  The
# compile goes on in the background; a decision without that candidate is not stored, so the next search
# (its kernels built by then, in this process or in the kernel cache) times it.
OUTLASTED = "not measured: still compiling when the budget ran out"
NOT_STORED = "not stored: a backend was still compiling, the next search times it"

# Estimates closer than this do not decide between the CPU alone and the best plan using an accelerator: on
# the H200 after `delegate calibrate` (2026-12-06) whole-plan estimates were 0.59-1.41x of the measured times,
# the CPU's of small models the lowest (hand_recrop: 0.44 ms estimated, 0.74 measured).
TOO_CLOSE = 1.5


def estimates_too_close(candidates: Sequence[Candidate]) -> bool:
    """Whether the CPU alone and the best candidate using an accelerator are estimated within TOO_CLOSE of
    each other (then only measuring tells them apart)."""
    host = next((c for c in candidates if c.host_alone), None)
    others = [c.estimated_ms for c in candidates if not c.host_alone]
    if host is None or not others:
        return False
    best = min(others)
    return max(best, host.estimated_ms) < TOO_CLOSE * min(best, host.estimated_ms)


def model_fingerprint(graph: Subgraph) -> str:
    """Key of a model: its ops, options, tensor shapes and types, and every weight byte."""
    h = blake2b(digest_size=16)
    for op in graph.ops:
        h.update(json.dumps([op.opcode, op.version, [t.index if t is not None else -1 for t in op.inputs],
                             [t.index for t in op.outputs], op.options], sort_keys=True, default=str).encode())
    for t in graph.tensors:
        h.update(f"{t.index}|{t.shape}|{t.dtype.name}".encode())
        q = t.quantization
        if q is not None:  # by bytes: printing per-channel arrays took 97 ms of a load (mobilenet_v2_035_96_int8)
            h.update(f"q{q.axis}".encode())
            for part in (q.scale, q.zero_point, q.min, q.max):
                h.update(b"-" if part is None else np.ascontiguousarray(part).tobytes() + b"|")
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


def save_decision(key: str, winner: Candidate, candidates: Sequence[Candidate]) -> Path | None:
    """Store the decision under ``key``; None, nothing stored, where a single backend's compile outlasted the
    budget (the decision never saw it: the next search should)."""
    if any(c.status == OUTLASTED for c in candidates):
        return None
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


def plan_key(assignment: Any, precision: Any) -> tuple | None:
    """A plan's identity: its op -> backend assignment and its precision (names change meaning when the cost
    profile is refitted); None for what no plan can be (a stored file edited or damaged since it was written)."""
    try:
        return tuple(sorted((int(k), str(v)) for k, v in assignment.items())), str(precision or "")
    except (AttributeError, TypeError, ValueError):
        return None


def _stored_entries(doc: Mapping[str, Any]) -> list[tuple[tuple, dict]]:
    """The stored decision's candidates that are plans, with their keys."""
    entries = doc.get("candidates")
    keyed = [(plan_key(c.get("assignment"), c.get("precision")), c) for c in entries if isinstance(c, dict)] \
        if isinstance(entries, list) else []
    return [(key, c) for key, c in keyed if key is not None]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def stored_others(doc: Mapping[str, Any], candidates: Sequence[Candidate], valid: Callable[[Candidate], bool]) \
        -> list[Candidate]:
    """The candidates a stored decision timed besides ``candidates`` (another plan key), rebuilt as it stored
    them (their estimates of then), each only where ``valid`` (every op on a backend that still runs it): a
    stored decision's plan is then taken without searching the splits again (pose_landmark_full's min cuts
    took seconds on an H100 host)."""
    have = {plan_key(c.assignment, c.precision) for c in candidates}
    rebuilt = []
    for key, entry in _stored_entries(doc):
        candidate = Candidate(str(entry.get("name", "stored")), dict(key[0]), _number(entry.get("estimated_ms")) or 0.0,
                              precision=key[1])
        if key not in have and valid(candidate):
            have.add(key)
            rebuilt.append(candidate)
    return rebuilt


def stored_candidate(doc: Mapping[str, Any], candidates: Sequence[Candidate]) -> Candidate | None:
    """The candidate a stored decision names, with the stored measurements copied onto the candidates that
    are the same plan (``plan_key``).  A candidate the decision never timed says so."""
    measured = dict(_stored_entries(doc))
    wanted = plan_key(doc.get("assignment"), doc.get("precision"))
    if wanted is None:
        return None
    chosen = None
    for c in candidates:
        key = plan_key(c.assignment, c.precision)
        if key in measured:
            entry = measured[key]
            c.measured_ms, c.compile_s = _number(entry.get("measured_ms")), _number(entry.get("compile_s"))
            c.status = str(entry.get("status") or "")
        else:
            c.status = "not timed by the stored decision (planned since)"
        if key == wanted:
            chosen = c
    return chosen


class CompileHistory:
    """What the search has compiled so far, to predict the next compile.

    A backend reuses the kernels it built for an earlier candidate at the same precision (the plans of one
    model share most of them), so a candidate is predicted at the quickest compile so far plus, per backend,
    its first (cold) compile's share for the ops that backend has not compiled yet; at a precision it has
    not compiled, at its whole first compile (a kernel set of its own).  On the H200, selfie_segmentation:
    the CPU compiled in 0.09 s, OpenCL alone in 5.61 s, OpenCL at fp16 in 4.67 s."""

    def __init__(self) -> None:
        self.seconds: list[float] = []  # each compile (and first run) so far
        self.first: dict[str, tuple[float, int]] = {}  # backend -> (its first compile's seconds, its ops)
        self.built: dict[tuple[str, str], set[int]] = {}  # (backend, precision) -> op indices compiled

    def add(self, candidate: Candidate, seconds: float) -> None:
        self.seconds.append(seconds)
        for backend, ops in _ops_by_backend(candidate).items():
            self.first.setdefault(backend, (seconds, len(ops)))
            self.built.setdefault((backend, candidate.precision), set()).update(ops)

    def predicted_s(self, candidate: Candidate) -> float:
        quickest = min(self.seconds, default=0.0)
        longest = max(self.seconds, default=0.0)
        predicted = quickest
        for backend, ops in _ops_by_backend(candidate).items():
            first_s, first_ops = self.first.get(backend, (longest, 0))
            done = self.built.get((backend, candidate.precision))
            if done is None:  # never compiled at this precision (or at all): a cold kernel set
                predicted = max(predicted, first_s)
            else:
                predicted += first_s * len(ops - done) / max(first_ops, 1)
        return predicted


def _ops_by_backend(candidate: Candidate) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for index, backend in candidate.assignment.items():
        found.setdefault(backend, set()).add(int(index))
    return found


@dataclass
class Trial:
    candidate: Candidate
    run: Callable[[], Any]
    samples: list[float]


def _not_measured(exc: BaseException) -> str:
    what = str(exc) if isinstance(exc, DelegateError) else f"{type(exc).__name__}: {exc}"
    return f"not measured: {(what.splitlines() or [''])[0][:160]}"


def _leader_ms(trials: Sequence[Trial], besides: Trial) -> float:
    """The least median of the trials timed so far other than ``besides`` (inf where none is)."""
    return min((float(np.median(t.samples)) for t in trials if t is not besides and t.samples), default=np.inf)


def measure(candidates: Sequence[Candidate], build: Callable[[Candidate], Callable[[], Any]],
            budget_s: float, started: float | None = None,
            more: Callable[[], Sequence[Candidate]] | None = None) -> Candidate:
    """Time each candidate (``build`` compiles it and returns one run); fill ``measured_ms``; the fastest, but a
    single backend alone over any other plan that did not beat it by more than CLEAR_WIN.

    The single backends alone come first (what the plan must never be slower than), compiled side by side,
    one thread each (``build`` must let different backends compile at once): the host alone always, an
    accelerator alone while any of the budget is left and unless estimated over NEVER_ALONE_MARGIN times the
    host alone.  A cold accelerator compile is seconds of driver work
    that releases the interpreter (OpenCL 5.6-5.9 s and WebGPU 2.3-2.9 s cold on the H200, one after the
    other before).  Then the others, one at a time in order of their estimate, where the predicted compile
    (``CompileHistory``) and the minimum rounds of every candidate compiled, its own included, still fit.  A
    compile under way is not interrupted, but an accelerator alone still compiling when the budget runs out is
    not waited for (``OUTLASTED``; the host alone always is).  One that fails to compile
    or run is left out with the reason in its ``status``.  ``started``: when the search began (perf_counter),
    if before this call: the budget is the caller's whole wait, its backends' set-up included.  ``more``: finds
    further candidates on this thread while the single backends compile (on the H100, pose_landmark_full's six
    min cuts took 4 s: as long as OpenCL's cold compile, one after the other before)."""
    start = time.perf_counter() if started is None else started
    deadline = start + budget_s
    trials: list[Trial] = []
    history = CompileHistory()
    ordered = sorted(candidates, key=lambda c: (not c.host_alone, not c.baseline, c.estimated_ms))
    host_ms = next((c.estimated_ms for c in ordered if c.host_alone), float("inf"))
    alone = [c for c in ordered if c.host_alone or (c.baseline and time.perf_counter() <= deadline
                                                    and c.estimated_ms <= NEVER_ALONE_MARGIN * host_ms)]
    for c in ordered:
        if c.baseline and c not in alone:
            c.status = (f"not measured: estimated over {NEVER_ALONE_MARGIN:g}x the CPU alone"
                        if c.estimated_ms > NEVER_ALONE_MARGIN * host_ms else "not measured: the budget ran out")

    def first_run(c: Candidate, run: Callable[[], Any], built_s: float) -> None:
        """The untimed first run (lazy set-up, one candidate at a time); the candidate joins the trials."""
        t = time.perf_counter()
        try:
            run()
        except Exception as exc:  # a candidate that cannot run is left out, whatever the backend raised
            c.status = _not_measured(exc)
            return
        c.compile_s = built_s + time.perf_counter() - t
        history.add(c, c.compile_s)
        trials.append(Trial(c, run, []))

    with progress(f"timing {len(candidates)} candidate plans (each compiled first)", len(candidates)) as advance:
        def built(c: Candidate) -> tuple[Callable[[], Any] | BaseException, float]:
            t = time.perf_counter()
            try:
                return build(c), time.perf_counter() - t
            except Exception as exc:
                return exc, time.perf_counter() - t
        pool = ThreadPoolExecutor(max_workers=max(len(alone), 1), thread_name_prefix="delegate-tune")
        try:
            jobs = [(c, pool.submit(built, c)) for c in alone]
            found = list(more()) if more is not None else []
            advance(parts=0, total=len(candidates) + len(found))
            ordered += sorted(found, key=lambda c: c.estimated_ms)
            for c, job in jobs:
                try:
                    run, seconds = job.result(None if c.host_alone else max(deadline - time.perf_counter(), 0.0))
                except StillRunning:
                    c.status = OUTLASTED
                    advance()
                    continue
                advance()
                if isinstance(run, BaseException):
                    c.status = _not_measured(run)
                    continue
                first_run(c, run, seconds)
        finally:
            pool.shutdown(wait=False)  # a compile that outlasted the budget finishes on its own thread
        for c in ordered:
            if c in alone or c.baseline:
                continue
            advance()
            now = time.perf_counter()
            # the minimum rounds at twice the estimates (a first run, which includes lazy set-up, says less); a
            # candidate estimated hopeless against the best runs twice before it is stopped, not the rounds
            estimates = [t.candidate.estimated_ms for t in trials] + [c.estimated_ms]
            if c.estimated_ms > HOPELESS_MARGIN * min(estimates):  # its compile would buy one run and a stop
                c.status = f"not measured: estimated over {HOPELESS_MARGIN}x the best"
                continue
            rounds = 2 * sum(ms * (2 if ms > HOPELESS_MARGIN * min(estimates) else MIN_ROUNDS * RUNS_PER_ROUND)
                             + MIN_ROUNDS * max(ms, SWITCH_SETTLE_MS) for ms in estimates) / 1e3
            if trials and now + history.predicted_s(c) + rounds > deadline:
                c.status = "not measured: the budget ran out"
                continue
            run, seconds = built(c)
            if isinstance(run, BaseException):
                c.status = _not_measured(run)
                continue
            first_run(c, run, seconds)
    live = list(trials)
    # a new order each round: a plan run right after another finds the machine as that one left it (an OpenCL
    # plan's driver threads still busy slowed the CPU plan after it by 1.2x on the H200); in a fixed order
    # the CPU alone always came after the same accelerator plan (deeplab_tiny_fp32 on an H100 host: OpenCL
    # greedy chosen, then measured 1.19x the CPU alone in shuffled rounds)
    order = np.random.default_rng(0)
    for round_ in range(MAX_ROUNDS):
        for trial in [live[i] for i in order.permutation(len(live))]:
            leader = _leader_ms(live, trial)
            settle(trial.run)
            runs = []
            for _ in range(RUNS_PER_ROUND):
                t = time.perf_counter()
                trial.run()
                runs.append((time.perf_counter() - t) * 1e3)
                if runs[-1] > HOPELESS_MARGIN * leader:
                    break  # one run says enough: its other runs would only spend the budget
            trial.samples.extend(runs)
        margin = STOP_MARGIN if round_ + 1 >= MIN_ROUNDS else HOPELESS_MARGIN
        for trial in list(live):
            if min(trial.samples) > margin * _leader_ms(live, trial):
                live.remove(trial)
                runs = len(trial.samples)
                trial.candidate.status = f"stopped after {runs} run{'s' * (runs != 1)}: over {margin}x the leader"
        if time.perf_counter() > deadline and round_ + 1 < MIN_ROUNDS:
            break  # compiling took the budget: the rounds timed so far decide
        if round_ + 1 >= MIN_ROUNDS and (time.perf_counter() > deadline or len(live) == 1):
            break
    for trial in trials:
        trial.candidate.measured_ms = float(np.median(trial.samples))
    if not trials:
        raise RuntimeError("no candidate plan could be compiled and run")
    kept = [t.candidate for t in trials if t in live]
    best = min(kept, key=lambda c: c.measured_ms)
    single = min((c for c in kept if c.baseline), key=lambda c: c.measured_ms, default=None)
    if single is not None and not best.baseline and best.measured_ms > CLEAR_WIN * single.measured_ms:
        best.status = (f"within {1 - CLEAR_WIN:.0%} of {single.name}: a single backend alone is kept unless beaten "
                       f"by more")
        best = single
    return best
