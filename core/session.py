"""Load a model, negotiate with the backends, plan, compile and run: the one-call API.

    import delegate
    session = delegate.load("model.tflite", "configs/edge.yaml")
    outputs = session.run({"input": image})

A backend that is unavailable, or fails while compiling or running, is replaced
by the CPU for the partitions it held (once, with a warning naming the backend
and the error) unless the config turns ``fallback`` off.  One session may be
shared by threads: runs take turns, each with its own inputs and outputs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .backend import HOST, Backend, CompiledPartition, CompileOptions, Partition
from .config import Limits
from .cost import DeviceProfile, borrowed, host_profile, load_profile, measured, profile_info
from .errors import CacheError, CompileError, DelegateError, ExecutionError, InputError, PluginError
from .ir import STATE_OPS, Model, Subgraph, Tensor
from .memory import keep_freed_host_memory, peak_bytes
from .planner import Candidate, Plan, PlacementSettings, Planner
from .plugins import HOST_WORD, PluginManager, default_manager
from .runtime import Executor, ModelState, Watchdog, running
from .stdio import progress
from .tflite.reader import read_model
from .validate import validate_graph

log = logging.getLogger(__name__)

# How long a load waits for the chosen plan before the host alone serves the first runs meanwhile: kernels
# loaded from the cache are ready well within it (OpenCL 24-250 ms on the H200 for whole models).
HOST_FIRST_AFTER_S = 0.25


class BackendFallbackWarning(UserWarning):
    """A backend failed and its work went to the CPU."""


@dataclass
class RunSettings:
    """Everything a session needs from the config, already resolved for one model."""

    backends: list[tuple[str, dict[str, Any]]] = field(default_factory=lambda: [(HOST_WORD, {})])
    compile: CompileOptions = field(default_factory=CompileOptions)
    placement: PlacementSettings = field(default_factory=PlacementSettings)
    fallback: bool = True
    accuracy_guard: AccuracyBound | None = None
    disable_plugins: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)


@dataclass
class AccuracyBound:
    """Largest error an accelerator partition may show against the CPU on the calibration input."""

    max_abs_error: float | None = None
    max_rel_error: float | None = 1e-2

    def exceeded(self, actual: np.ndarray, expected: np.ndarray) -> float | None:
        """The error when it is beyond the bound, else None."""
        diff = float(np.abs(actual.astype(np.float64) - expected).max()) if expected.size else 0.0
        if self.max_abs_error is not None and diff > self.max_abs_error:
            return diff
        scale = float(np.abs(expected).max()) if expected.size else 0.0
        if self.max_rel_error is not None and diff > self.max_rel_error * max(scale, 1e-12):
            return diff
        return None


def run_settings(config: Any) -> RunSettings:
    """RunSettings from a loaded Config (its top level) or one ModelConfig.

    The config's ``cpu`` section becomes the cpu backend's options; the CPU is
    always in the list, as the fallback.
    """
    cpu_options = dict(config.cpu)
    backends = [(b.name, {**cpu_options, **b.options} if b.name == HOST_WORD else dict(b.options))
                for b in config.backends]
    if all(name != HOST_WORD for name, _ in backends):
        backends.append((HOST_WORD, cpu_options))
    placement = PlacementSettings(partitioner=config.partitioner,
                                  max_delegated_partitions=config.max_delegated_partitions,
                                  min_nodes_per_partition=config.min_nodes_per_partition,
                                  pins=list(config.pin), denies=list(config.deny),
                                  search=config.placement.search, budget_s=config.placement.budget_s,
                                  host_first=config.placement.host_first)
    guard = config.accuracy_guard
    bound = AccuracyBound(guard.max_abs_error, guard.max_rel_error) if guard.enabled else None
    return RunSettings(backends, config.compile_options(), placement, bool(config.fallback), bound,
                       disable_plugins=tuple(config.disable_plugins), limits=config.limits)


def _warn(message: str) -> None:
    log.warning(message)
    warnings.warn(message, BackendFallbackWarning, stacklevel=3)


def instantiate_backends(requested: Sequence[tuple[str, Mapping[str, Any]]], manager: PluginManager,
                         fallback: bool, built_host: tuple[str, Backend] | None = None
                         ) -> tuple[dict[str, Backend], dict[str, str]]:
    """Build the requested backends in priority order; the host is always there, last.

    The config's ``cpu`` names the host backend whatever its plugin calls it; the first host requested is the
    host, a later one is skipped.  ``built_host``: the host, already built (name, backend): the others are
    built around it.  Returns the backends and, for each one skipped, why.
    """
    backends: dict[str, Backend] = dict([built_host]) if built_host else {}
    skipped: dict[str, str] = {}
    for name, options in requested:
        name = manager.resolve(name)
        host = next((n for n, b in backends.items() if b.role == HOST), None)
        if name in backends:
            continue
        if host is not None and _role(manager, name) == HOST:
            skipped[name] = f"backend {name!r} is not used: {host!r} is the host"
            continue
        if name in manager.disabled:
            info, ok, reason = None, False, "its plugin is disabled (disable_plugins)"
        elif name in manager.load_errors and name not in manager.backends():
            info, ok, reason = None, False, f"its plugin failed to load ({manager.load_errors[name]})"
        else:
            info = manager.backend_info(name)  # unknown name -> PluginError listing the installed ones
            ok, reason = _probe(info)
        try:
            if not ok:
                raise PluginError(f"backend {name!r} is not available here: {reason}")
            backends[name] = manager.create(name, options)
        except Exception as exc:
            message = str(exc) if isinstance(exc, DelegateError) else f"backend {name!r} failed to start: {exc}"
            if not fallback or _role(manager, name) == HOST:
                raise exc if isinstance(exc, DelegateError) else PluginError(message) from exc
            skipped[name] = message
            log.info("%s; continuing without it", message)
    host = next((n for n, b in backends.items() if b.role == HOST), None) or manager.host()
    if host is None:
        why = f": {skipped[HOST_WORD]}" if HOST_WORD in skipped else ""
        raise PluginError(f"no host backend to run on (the cpu plugin, or another of role host){why}")
    # the host last: it is the fallback, whatever the order in the config
    backends[host] = backends.pop(host) if host in backends else manager.create(host)
    return backends, skipped


def host_entries(requested: Sequence[tuple[str, Mapping[str, Any]]], manager: PluginManager
                 ) -> list[tuple[str, Mapping[str, Any]]]:
    """The requested backends whose plugins are hosts, after checking that every name is installed (an unknown
    name is the configuration's error, raised at load whatever is built later)."""
    for name, _ in requested:
        name = manager.resolve(name)
        if name not in manager.disabled and name not in manager.load_errors:
            manager.backend_info(name)  # unknown name -> PluginError listing the installed ones
    return [(name, options) for name, options in requested if _role(manager, manager.resolve(name)) == HOST]


def _role(manager: PluginManager, name: str) -> str | None:
    found = manager.backends().get(name)
    return found[0].role if found else None


def _probe(info) -> tuple[bool, str]:
    try:
        ok, reason = info.available()
        return bool(ok), reason
    except Exception as exc:
        return False, f"availability check failed: {exc}"


def backend_profiles(backends: Mapping[str, Backend], threads: int = 1) -> dict[str, DeviceProfile]:
    """Each backend's stored profile for this thread count, or its own default; the host's default
    throughput is per thread (a stored host profile was measured at ``threads`` and is used as it is); the
    host's serial kinds are as many times further from either as the threads are faster than one (the
    calibrated ``thread_speedup``, else ``threads``); an accelerator never measured borrows the
    figures of a measured one of its kind of device and defaults (``cost.borrowed``)."""
    profiles = {name: host_profile(be, threads) if be.role == HOST else load_profile(profile_info(be, threads),
                                                                                        be.default_profile())
                for name, be in backends.items()}
    for name, be in backends.items():
        kind = be.device_info().get("device_type")
        if be.role == HOST or measured(profiles[name]) or kind is None:
            continue
        lender = next((other for other, ob in backends.items() if other != name and ob.role != HOST
                       and measured(profiles[other]) and ob.device_info().get("device_type") == kind
                       and ob.default_profile().source == be.default_profile().source), None)
        if lender is not None:
            profiles[name] = borrowed(profiles[name], profiles[lender], lender)
    return profiles


class Session:
    """A model planned and compiled for the configured backends."""

    def __init__(self, model: Model, settings: RunSettings | None = None, *,
                 manager: PluginManager | None = None, subgraph: int = 0, state: ModelState | None = None,
                 remeasure: bool = False, host_first: bool = False):
        """``state`` is shared by sessions of several subgraphs of one model instance (an Interpreter's);
        ``remeasure``: time the candidate plans now even if a decision is stored (``delegate tune``);
        ``host_first``: the caller serves runs (``load``, the Interpreter), so under ``placement.host_first``
        the host alone may serve them while the chosen plan is prepared (see ``_prepare_meanwhile``); the
        tools that measure or explain the plan leave it off."""
        keep_freed_host_memory()  # each run's fresh outputs reuse the last run's freed pages
        self.model = model
        self.state = state if state is not None else ModelState(model)
        self.settings = settings or RunSettings()
        self.manager = manager or default_manager(self.settings.disable_plugins)
        self.graph: Subgraph = model.subgraphs[subgraph]
        started = time.perf_counter()
        self._warned: set[str] = set()
        self._host_first = host_first and self._may_serve_from_host()
        # host first: the accelerators start on the preparing thread (a GPU driver's first start takes seconds)
        requested = host_entries(self.settings.backends, self.manager) if self._host_first else self.settings.backends
        self.backends, self.skipped = instantiate_backends(requested, self.manager, self.settings.fallback)
        self.host = next(name for name, b in self.backends.items() if b.role == HOST)
        validate_graph(self.graph)
        check_budget(self.graph, self.settings.limits)
        for graph_pass in self.manager.graph_passes():
            if graph_pass(self.graph):
                self.graph.link()
        self._lock = threading.RLock()
        self.baseline_executors: dict[str, Executor] = {}  # with remeasure: the single-backend plans measured
        # one compile at a time per backend: a measured search and the host serving meanwhile compile at once
        self._compiling: dict[str, threading.Lock] = {}
        self._use_backends(self.backends, self.skipped)
        self._meanwhile: _Meanwhile | None = None  # the chosen plan being prepared while the host serves
        self._measure_later: Callable[[], tuple[Plan, list[CompiledPartition]]] | None = None
        self.ready_ms: float | None = None  # when the chosen plan could run (after init_ms where the host served)
        if self._host_first and len(self.settings.backends) > len(requested):
            self._serving = self._prepare_meanwhile(started, start_backends=True)
        else:
            self.plan, compiled = self._choose_plan(remeasure, started)
            self._announce(self.plan)
            if compiled is None and self._host_first and (self._measure_later or self._uses_accelerators(self.plan)):
                self._serving = self._prepare_meanwhile(started, start_backends=False)
            else:
                self._serving = self._ready(compiled or self._compile_all(list(self.plan.partitions)))
        if self.settings.accuracy_guard is not None and any(p.backend != self.host for p in self.plan.partitions):
            # on a scratch state, and variable tensors reset after: the user's first run starts afresh
            with running(ModelState(model)):
                self._guard_accuracy(self.settings.accuracy_guard)
            self._serving.reset_state()
        self.init_ms = (time.perf_counter() - started) * 1e3
        if self._meanwhile is None:
            self.ready_ms = self.init_ms

    def _use_backends(self, backends: dict[str, Backend], skipped: dict[str, str]) -> None:
        """Plan and compile with ``backends`` from now on (their profiles, planner and watchdogs)."""
        with self._lock:
            self.backends, self.skipped = backends, skipped
            self._compile_watch = self._watchdogs("compile_timeout_s")
            self.profiles = backend_profiles(backends, self.settings.compile.num_threads)
            self.planner = Planner(backends, self.profiles, self.settings.compile, self._host_rules())
            for name in backends:
                self._compiling.setdefault(name, threading.Lock())

    def _announce(self, plan: Plan) -> None:
        """The plan chosen: its notes on backends skipped, its decisions logged, the plugins told."""
        plan.notes.extend(f"{name} skipped: {why}" for name, why in self.skipped.items())
        for d in plan.decisions:
            log.info("op #%d %s v%d -> %s: %s", d.index, d.opcode, d.version, d.backend, d.reason)
        self.manager.hook.delegate_plan_ready(plan=plan)

    def _ready(self, compiled: list[CompiledPartition]) -> Executor:
        """The executor of the plan as compiled (a fallback while compiling revised the plan), its notes."""
        executor = Executor(self.graph, self.plan.partitions, self.backends, self.settings.compile,
                            compiled=compiled, state=self.state, watchdogs=self._watchdogs("run_timeout_s"))
        self.plan.notes.extend(self._precision_notes())
        self._estimate_at_engine_threads(executor)
        return executor

    @property
    def executor(self) -> Executor:
        """The chosen plan's executor (waiting for it where the host serves meanwhile)."""
        self._adopt(wait=True)
        return self._serving

    def wait_until_ready(self) -> float:
        """Wait for the chosen plan where the host serves the first runs meanwhile (``placement.host_first``);
        the ms from the start of the load until the plan was ready."""
        self._adopt(wait=True)
        return self.ready_ms

    # -- the host serving while the chosen plan is prepared ---------------------
    def _may_serve_from_host(self) -> bool:
        """Whether the host alone may serve the first runs: under fast_single_answer and fallback (a failure
        in the background goes to the host, as it would at load), without the accuracy guard (it checks the
        plan before its first run), for a graph without state (variable tensors, resources) and of a model
        of one subgraph (the Interpreter's control flow runs several sessions on one state)."""
        s = self.settings
        return (s.placement.host_first and s.compile.inference_preference == "fast_single_answer" and s.fallback
                and s.accuracy_guard is None and len(self.model.subgraphs) == 1
                and not any(t.is_variable for t in self.graph.tensors)
                and not any(op.opcode in STATE_OPS for op in self.graph.ops))

    def _uses_accelerators(self, plan: Plan) -> bool:
        return any(p.backend != self.host for p in plan.partitions)

    def _prepare_meanwhile(self, started: float, start_backends: bool) -> Executor:
        """Prepare the chosen plan on a thread (start the accelerators and choose it first where they are not
        started yet, measure the candidates where ``_measure_later`` says so, then compile); unless it is ready
        within HOST_FIRST_AFTER_S (kernels cached), the host alone serves the runs until it is (``_adopt``).  A
        cold OpenCL compile takes 1-6 s on a GPU host, LiteRT's own GPU initialisation 0.6-2 s, a GPU driver's
        first start on a fresh machine seconds: the first answers should wait for none of them."""
        host = None
        if start_backends:  # until the chosen plan is known: the host's own, which the first runs go to
            with contextlib.suppress(Exception):  # (none: the runs wait for the chosen plan)
                self.plan = host = self.planner.plan_for(self.graph, self._host_alone())
        job = _Meanwhile(self._measure_later, started, start_backends)
        self._meanwhile = job
        job.thread = threading.Thread(target=job.prepare, args=(self,), name="delegate-prepare")
        job.thread.start()
        job.thread.join(HOST_FIRST_AFTER_S)
        if job.thread.is_alive() and (host is not None or not start_backends):
            try:
                host = host or self.planner.plan_for(self.graph, self._host_alone())
                compiled = [self._compile_now(p, self.settings.compile) for p in host.partitions]
            except Exception:  # e.g. an op only an accelerator runs: the runs wait for the chosen plan
                host = None
        else:
            host = None
        if host is None:
            job.thread.join()
            self._meanwhile = None
            if job.error is not None:
                raise job.error
            return job.executor or self._ready(self._compile_all(list(self.plan.partitions)))
        with self._lock:
            job.note = f"the first runs go to {self.host} alone while " + job.doing()
            self.plan.notes.append(job.note)
        return Executor(self.graph, host.partitions, self.backends, self.settings.compile, compiled=compiled,
                        state=self.state)

    def _host_alone(self) -> Candidate:
        return Candidate(self.host, {op.index: self.host for op in self.graph.ops}, 0.0, host_alone=True)

    def _adopt(self, wait: bool) -> None:
        """Runs go to the chosen plan once it is prepared (``wait``: wait for it); an error preparing it is
        raised here, at each run, as loading would have."""
        job = self._meanwhile
        if job is None:
            return
        if wait:
            job.thread.join()
        elif job.thread.is_alive():
            return
        with self._lock:
            if self._meanwhile is not job:
                return
            if job.error is not None:
                raise job.error
            self._meanwhile = None
            self.ready_ms = job.ready_ms
            if job.note in self.plan.notes:
                self.plan.notes.remove(job.note)
            if job.executor is None:  # the host alone was chosen: it serves on as it did
                return
            job.executor.runs = self._serving.runs
            self._serving = job.executor
            self.plan.notes.append(f"runs before {job.ready_ms / 1e3:.2f} s (from the load) went to {self.host} "
                                   f"alone while {job.doing(done=True)}")

    def _host_rules(self) -> PlacementSettings:
        """The placement settings with the config's word ``cpu`` in pins and denies meaning this session's host."""
        placement = self.settings.placement
        if self.host == HOST_WORD:
            return placement

        def resolved(rules):
            return [replace(r, backend=self.host) if r.backend == HOST_WORD else r for r in rules]
        return replace(placement, pins=resolved(placement.pins), denies=resolved(placement.denies))

    # -- choosing the plan ------------------------------------------------
    def _choose_plan(self, remeasure: bool, started: float) -> tuple[Plan, list[CompiledPartition] | None]:
        """The plan with the lowest estimate, a stored measured decision, or the fastest candidate measured
        now (see plan_search, its budget counted from ``started``, when the session began); with the
        compiled partitions when measuring left them ready.  Under ``auto`` estimates too close to tell the
        CPU alone from an accelerator plan are measured: now, or behind the first runs (``host_first``)."""
        from . import plan_search

        placement, preference = self.settings.placement, self.settings.compile.inference_preference
        if placement.search == "estimate":
            return self.planner.plan(self.graph), None
        measure_now = remeasure or placement.search == "measure" or preference == "sustained_speed"
        key = plan_search.decision_key(self.graph, {n: b.device_info() for n, b in self.backends.items()},
                                       self._placement_facts())
        stored = None if remeasure else plan_search.load_decision(key)
        costs, refusals = self.planner.capabilities(self.graph)
        first = self.planner.baselines(self.graph, costs)
        found: list = []  # the other candidates, found while the single backends compile
        pending = None

        def more():
            found.extend(self.planner.splits(self.graph, costs, first))
            found.extend(self._precision_variants(first + found))
            return found
        if stored is not None:
            shortcut = self._stored_plan(stored, first, costs, refusals)
            if shortcut is not None:
                return shortcut, None
        if stored is not None or not measure_now or len(first) < 2:
            more()
            plan = self.planner.plan_of_candidates(self.graph, first + found, costs, refusals)
            if len(first) < 2 and not found:
                return plan, None
            chosen = plan_search.stored_candidate(stored, plan.candidates) if stored else None
            if chosen is not None:
                return self._plan_of(chosen, plan, f"stored measured decision of {stored.get('measured_at', '?')}"), None
            too_close = plan_search.estimates_too_close(plan.candidates)
            if too_close and self._host_first:
                candidates = plan.candidates
                self._measure_later = lambda: self._measured(candidates, [], None, costs, refusals, key,
                                                             remeasure, time.perf_counter(), "measured meanwhile")
                return plan, None
            if not measure_now and not too_close:
                return plan, None
            first, found = plan.candidates, []
        else:
            pending = more
        return self._measured(first, found, pending, costs, refusals, key, remeasure, started, "fastest measured now")

    def _measured(self, first, found: list, pending, costs, refusals, key: str, remeasure: bool, started: float,
                  choice: str) -> tuple[Plan, list[CompiledPartition]]:
        """The fastest of the candidates ``first`` (and those ``pending`` finds meanwhile, added to ``found``),
        measured now within the placement budget counted from ``started``; stored under ``key``; with its
        compiled partitions.  Each timed run takes the session's turn: runs the host serves meanwhile wait."""
        from . import plan_search

        built: dict[str, list[CompiledPartition]] = {}

        def build(candidate):
            with self._lock:
                candidate_plan = self.planner.plan_for(self.graph, candidate)
            compiled = [self._compile_now(p, self.options_for(p.backend, candidate.precision))
                        for p in candidate_plan.partitions]
            built[candidate.name] = compiled
            executor = Executor(self.graph, candidate_plan.partitions, self.backends, self.settings.compile, compiled,
                                watchdogs=self._watchdogs("run_timeout_s"))
            if remeasure and candidate.baseline and not candidate.precision:
                self.baseline_executors[candidate.name] = executor  # tune learns from these too
            inputs = self._random_inputs()

            def run():
                with self._lock:
                    return executor.run(inputs)
            return run

        winner = plan_search.measure(first, build, self.settings.placement.budget_s, started, more=pending)
        candidates = first + found
        plan = self.planner.plan_of_candidates(self.graph, candidates, costs, refusals)
        if plan_search.save_decision(key, winner, candidates) is None:
            choice += f" ({plan_search.NOT_STORED})"
        chosen_plan = self._plan_of(winner, plan, choice)
        # measuring ran the winner on a scratch model state; its variable tensors start afresh for the user
        for compiled in built[winner.name]:
            compiled.reset_state()
        return chosen_plan, built[winner.name]

    def _stored_plan(self, stored: dict, first: list, costs, refusals) -> Plan | None:
        """A stored decision's plan from the single backends planned now and the other candidates the decision
        timed (as it stored them), without searching the splits again: on a load with a decision stored that
        search was most of the plan's choice (efficientnet_lite_blocks_int16x8 here: 130 of 180 ms).  None where
        the decision's plan is none of those or an op of it is no longer run by its backend: then the whole
        search, and the decision matched against what it finds."""
        from . import plan_search

        ops = {op.index for op in self.graph.ops}

        def still_runs(candidate) -> bool:
            return set(candidate.assignment) == ops and all(
                backend in self.backends and backend not in refusals.get(index, {})
                for index, backend in candidate.assignment.items())
        candidates = list(first) + plan_search.stored_others(stored, first, still_runs)
        chosen = plan_search.stored_candidate(stored, candidates)
        if chosen is None or not still_runs(chosen):
            return None
        plan = self.planner.plan_for(self.graph, chosen, costs, refusals)
        plan.candidates, plan.choice = candidates, f"stored measured decision of {stored.get('measured_at', '?')}"
        self.precision_choice = chosen.precision
        return plan

    def _plan_of(self, candidate, estimated: Plan, choice: str) -> Plan:
        plan = self.planner.plan_for(self.graph, candidate)
        plan.candidates, plan.choice = estimated.candidates, choice
        self.precision_choice = candidate.precision
        return plan

    # -- estimates of what runs ----------------------------------------------
    def _engine_threads(self, partition: Partition, executor: Executor) -> int | None:
        """The thread count a host partition's engine runs at, where it is not the session's (LiteRT's thread
        trial under sustained_speed keeps fewer where they measured faster)."""
        if partition.backend != self.host:
            return None
        threads = executor.compiled[executor.partitions.index(partition)].describe().get("threads")
        return threads if threads and threads != self.settings.compile.num_threads else None

    def partition_estimate(self, partition: Partition, executor: Executor | None = None,
                           threads: int | None = None) -> float:
        """The estimate of one partition of ``executor`` (the session's by default) as its engine runs it: at
        the thread count its engine chose (``threads``, found when not given), with that count's profile."""
        executor = executor or self.executor
        threads = threads or self._engine_threads(partition, executor)
        if threads is None:
            return self.planner.partition_estimate(self.graph, partition)
        profile = backend_profiles({self.host: self.backends[self.host]}, threads)[self.host]
        planner = Planner(self.backends, {**self.profiles, self.host: profile}, self.settings.compile,
                          self._host_rules())
        return planner.partition_estimate(self.graph, partition)

    def _estimate_at_engine_threads(self, executor: Executor) -> None:
        """The plan's estimate of the host partitions its engine runs at fewer threads, made with their profile."""
        for partition in executor.partitions:
            threads = self._engine_threads(partition, executor)
            if threads is None:
                continue
            self.plan.estimated_ms += (self.partition_estimate(partition, executor, threads)
                                       - self.planner.partition_estimate(self.graph, partition))
            self.plan.notes.append(f"partition {partition.index} ({self.host}) runs at {threads} thread(s), "
                                   "measured faster at load; estimated with that thread count's profile")

    # -- precision ----------------------------------------------------------
    precision_choice = ""  # the chosen candidate's precision ("" = the rule below)

    def options_for(self, backend: str, choice: str | None = None) -> CompileOptions:
        """What ``backend`` compiles with.  ``precision: fp16`` allows half precision, it does not oblige it:
        a backend where half is not expected to be faster gets fp32, unless the chosen candidate (``choice``,
        "fp16" or "fp32", from a measured search) says otherwise."""
        options = self.settings.compile
        choice = self.precision_choice if choice is None else choice
        if options.precision != "fp16" or backend == self.host:
            return options
        if choice in ("fp16", "fp32"):
            return replace(options, precision=choice)
        faster, _ = self.backends[backend].half_precision()
        return options if faster else replace(options, precision="fp32")

    def _precision_variants(self, candidates) -> list:
        """For a config allowing fp16: each accelerator plan also at the precision its backends' rule did not
        pick, so that the measurement, not the rule, decides."""
        if self.settings.compile.precision != "fp16":
            return []
        variants = []
        for c in candidates:
            used = {b for b in c.assignment.values() if b != self.host}
            if not used:
                continue
            other = "fp32" if all(self.backends[b].half_precision()[0] for b in used) else "fp16"
            variants.append(Candidate(f"{c.name} {other}", c.assignment, c.estimated_ms, list(c.notes), other))
        return variants

    def _precision_notes(self) -> list[str]:
        notes = []
        if self.settings.compile.precision != "fp16":
            return notes
        for name in sorted({p.backend for p in self.plan.partitions} - {self.host}):
            used = self.options_for(name).precision
            if used == "fp32":
                why = self.backends[name].half_precision()[1] if not self.precision_choice else \
                    "the measured search found fp32 faster"
                notes.append(f"{name}: fp16 is allowed but fp32 is used: {why}")
        return notes

    def _placement_facts(self) -> dict[str, Any]:
        """The settings a stored decision is valid for: what changes the plans or their speed."""
        s, c = self.settings.placement, self.settings.compile
        return {"backends": self.settings.backends, "partitioner": s.partitioner,
                "max_delegated_partitions": s.max_delegated_partitions, "min_nodes": s.min_nodes_per_partition,
                "pins": [r.__dict__ for r in s.pins], "denies": [r.__dict__ for r in s.denies],
                "precision": c.precision, "allow_quantized": c.allow_quantized, "threads": c.num_threads,
                "preference": c.inference_preference}

    def _random_inputs(self) -> dict[int, np.ndarray]:
        from .inputs import random_input

        rng = np.random.default_rng(0)
        return {t.index: random_input(t, rng) for t in self.graph.inputs}

    # -- compile / fallback ----------------------------------------------
    def _watchdogs(self, key: str) -> dict[str, Watchdog]:
        """A watchdog per accelerator for ``limits.<key>`` (none while that limit is off); the host is the
        fallback and runs on the calling thread, and so do the runs of a backend that bounds its own waits
        (``Backend.bound_waits``)."""
        seconds = getattr(self.settings.limits, key)
        accelerators = [name for name in self.backends if name != self.host]
        if key == "run_timeout_s":
            accelerators = [name for name in accelerators
                            if not getattr(self.backends[name], "bound_waits", lambda _: False)(seconds)]
        return {name: Watchdog(name, seconds, key) for name in accelerators if seconds}

    def _compile_now(self, partition: Partition, options: CompileOptions) -> CompiledPartition:
        """Compile on the partition's backend, under its compile time limit (accelerators only), one
        partition at a time per backend (a measured search compiles the single backends side by side)."""
        backend = self.backends[partition.backend]
        watchdog = self._compile_watch.get(partition.backend)
        with self._compiling[partition.backend]:
            if watchdog is None:
                return backend.compile(partition, options)
            return watchdog.call(backend.compile, partition, options, what="compile()")

    def _compile_all(self, partitions: list[Partition]) -> list[CompiledPartition]:
        """Every partition compiled, in order, under a progress bar (a cold GPU compile takes seconds)."""
        compiled = []
        with progress(f"compiling {len(partitions)} partition(s)", len(partitions)) as advance:
            for partition in partitions:
                compiled.append(self._compile(partition))
                advance()
        return compiled

    def _compile(self, partition: Partition) -> CompiledPartition:
        try:
            return self._compile_now(partition, self.options_for(partition.backend))
        except Exception as exc:
            # an unsafe cache directory is the configuration's fault: another backend would not fix it
            if partition.backend == self.host or isinstance(exc, (CacheError, MemoryError)):
                raise
            why = str(exc) if isinstance(exc, DelegateError) and str(exc) else f"{type(exc).__name__}: {exc}"
            if not self.settings.fallback:
                if isinstance(exc, CompileError) and exc.partition is None:  # a plugin's: name the partition
                    exc.partition, exc.backend = partition.index, partition.backend
                if isinstance(exc, DelegateError):
                    raise
                raise CompileError(f"backend {partition.backend!r} failed to compile partition "
                                   f"{partition.index}: {why}", partition=partition.index,
                                   backend=partition.backend) from exc
            return self._fall_back(partition, f"compile failed: {why}")

    def _fall_back(self, partition: Partition, why: str) -> CompiledPartition:
        """``partition`` compiled on the host instead, warning once per backend (see ``_move_to_host``)."""
        if partition.backend not in self._warned:
            self._warned.add(partition.backend)
            _warn(f"backend {partition.backend!r} {why}; its partitions fall back to {self.host}")
        return self._move_to_host(partition, why)

    def _move_to_host(self, partition: Partition, why: str) -> CompiledPartition:
        """``partition`` compiled on the host, as the plan's next revision, which plan observers are told about
        (the plan they saw is left as it was).  The caller puts the revised partition in the executor."""
        self.plan = self.plan.moved(partition.index, self.host, why)
        self.manager.hook.delegate_plan_ready(plan=self.plan)
        moved = next(p for p in self.plan.partitions if p.index == partition.index)
        return self.backends[self.host].compile(moved, self.settings.compile)

    def _revised_executor_partition(self, i: int) -> None:
        """The executor runs partition ``i`` as the latest plan revision has it."""
        self._serving.partitions[i] = next(p for p in self.plan.partitions
                                           if p.index == self._serving.partitions[i].index)

    # -- accuracy guard ------------------------------------------------------
    def _guard_accuracy(self, bound: AccuracyBound) -> None:
        """Check every accelerator partition on a calibration input against the CPU, given the same inputs.

        A partition beyond the bound is rebuilt in fp32 when it ran in fp16, and moved to the CPU
        when fp32 is still beyond it; each step is noted in the plan.
        """
        from .inputs import random_input

        rng = np.random.default_rng(0)
        host = self.backends[self.host]
        values = {t.index: random_input(t, rng) for t in self.graph.inputs}
        for i, part in enumerate(self._serving.partitions):
            reference = host.compile(part, self.settings.compile).run({t.index: values[t.index] for t in part.inputs})
            reference = {k: np.asarray(host.to_host(v)) for k, v in reference.items()}
            if part.backend != self.host:
                error = self._partition_error(part, self._serving.compiled[i], values, reference, bound)
                if error is not None and self.options_for(part.backend).precision == "fp16":
                    fp32 = replace(self.settings.compile, precision="fp32")
                    compiled = self.backends[part.backend].compile(part, fp32)
                    self.plan.notes.append(f"accuracy guard: partition {part.index} on {part.backend} erred "
                                           f"{error:.3g} in fp16; rebuilt in fp32")
                    self._serving.compiled[i] = compiled
                    error = self._partition_error(part, compiled, values, reference, bound)
                if error is not None:
                    self._serving.compiled[i] = self._move_to_host(part, f"accuracy guard: erred {error:.3g}")
                    self._revised_executor_partition(i)
                    log.warning("accuracy guard moved partition %d from %s to %s (error %.3g)",
                                part.index, part.backend, self.host, error)
            values.update(reference)

    def _partition_error(self, part, compiled, values, reference, bound: AccuracyBound) -> float | None:
        backend = self.backends[part.backend]
        outputs = compiled.run({t.index: backend.to_device(values[t.index]) for t in part.inputs})
        worst = None
        for idx, value in outputs.items():
            error = bound.exceeded(np.asarray(backend.to_host(value)), reference[idx])
            if error is not None:
                worst = max(worst or 0.0, error)
        return worst

    # -- running -----------------------------------------------------------
    def input_tensors(self) -> list[Tensor]:
        return list(self.graph.inputs)

    def output_tensors(self) -> list[Tensor]:
        return list(self.graph.outputs)

    def normalize_inputs(self, inputs: Any) -> dict[int, np.ndarray]:
        """Accept a dict by tensor name / ``input_N`` / index, a list in input order, or one array.

        Checks dtype and shape so nothing malformed reaches a kernel.
        """
        tensors = self.graph.inputs
        if isinstance(inputs, np.ndarray) or not isinstance(inputs, (Mapping, list, tuple)):
            inputs = [inputs]
        if isinstance(inputs, (list, tuple)):
            if len(inputs) != len(tensors):
                raise InputError(f"the model has {len(tensors)} input(s) but {len(inputs)} were given")
            pairs = list(zip(tensors, inputs))
        else:
            by_name = {t.name: t for t in tensors}
            pairs = []
            for key, value in inputs.items():
                t = by_name.get(key) if isinstance(key, str) else None
                if t is None and isinstance(key, str) and key.startswith("input_") and key[6:].isdigit():
                    pos = int(key[6:])
                    t = tensors[pos] if pos < len(tensors) else None
                if t is None and isinstance(key, int):
                    t = next((x for x in tensors if x.index == key), None)
                if t is None:
                    names = ", ".join(repr(x.name) for x in tensors)
                    raise InputError(f"unknown input {key!r}; the model's inputs are {names}")
                pairs.append((t, value))
            missing = [t.name for t in tensors if t not in [p[0] for p in pairs]]
            if missing:
                raise InputError(f"missing input(s): {', '.join(missing)}")
        return {t.index: checked_input(t, value) for t, value in pairs}

    def run_indexed(self, inputs: Mapping[int, np.ndarray],
                    outputs: Iterable[int] | None = None) -> dict[int, np.ndarray]:
        """Run with inputs keyed by tensor index; outputs keyed likewise (fallback on device failure).
        ``outputs``: the output tensor indices wanted (None: all); the others are not read back.

        Runs take turns; the outputs are this run's own copies, whatever runs next (copied here unless the
        partition that made one made it for this run alone: ``CompiledPartition.outputs_owned``)."""
        with self._lock:
            results = self._run_locked(inputs, self._wanted(outputs))
            owned = self._serving.owned_last_run
            return {k: v if k in owned else np.array(v) for k, v in results.items()}

    def run_into(self, inputs: Mapping[int, np.ndarray],
                 store: Callable[[Mapping[int, np.ndarray], frozenset[int]], None],
                 outputs: Iterable[int] | None = None) -> int:
        """Run and hand the outputs to ``store`` before the next run may start, uncopied, with the indices of
        those this run made for itself alone (``CompiledPartition.outputs_owned``): ``store`` may keep those
        as they are; the others can be the backends' own buffers, so it copies what it keeps of them (the
        Interpreter's output buffers).  Returns the run's number, for :meth:`fetch_into` of the outputs it
        left on the devices."""
        with self._lock:
            results = self._run_locked(inputs, self._wanted(outputs))
            store(results, self._serving.owned_last_run)
            return self._serving.runs

    def fetch_into(self, index: int, run: int, store: Callable[[np.ndarray], None]) -> None:
        """Hand ``store`` output ``index`` of run number ``run`` (one that did not return it), read back now
        and uncopied as in :meth:`run_into`; ExecutionError once a later run has replaced it."""
        with self._lock:
            if run != self._serving.runs:
                raise ExecutionError(f"output {index} of run {run} is gone: run {self._serving.runs} came after")
            store(self._serving.fetch(index))

    def _wanted(self, outputs: Iterable[int] | None) -> frozenset[int] | None:
        """``outputs`` checked against the graph's outputs."""
        if outputs is None:
            return None
        wanted = frozenset(int(i) for i in outputs)
        unknown = wanted - self._serving.graph_outputs()
        if unknown:
            names = ", ".join(f"{t.index} ({t.name!r})" for t in self.graph.outputs)
            raise InputError(f"tensor(s) {sorted(unknown)} are not outputs of the model; its outputs are {names}")
        return wanted

    def _run_locked(self, inputs: Mapping[int, np.ndarray], outputs: frozenset[int] | None) -> dict[int, np.ndarray]:
        self._adopt(wait=False)
        try:
            return self._serving.run(inputs, outputs)
        except ExecutionError as exc:
            failed = [i for i, p in enumerate(self._serving.partitions)
                      if p.index == exc.partition and p.backend == exc.backend != self.host]
            if not failed or not self.settings.fallback:
                raise
            i = failed[0]
            self._serving.compiled[i] = self._fall_back(self._serving.partitions[i], f"failed while running: {exc}")
            self._revised_executor_partition(i)
            return self._run_locked(inputs, outputs)

    def run(self, inputs: Any, outputs: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Run once; returns outputs by tensor name (copies, safe to keep).  ``outputs``: the names wanted
        (None: all); only those are read back from the devices."""
        wanted = None
        if outputs is not None:
            by_name = {t.name: t.index for t in self.graph.outputs}
            unknown = [name for name in outputs if name not in by_name]
            if unknown:
                raise InputError(f"unknown output(s) {unknown}; the model's outputs are {sorted(by_name)}")
            wanted = [by_name[name] for name in outputs]
        results = self.run_indexed(self.normalize_inputs(inputs), wanted)
        return {t.name: results[t.index] for t in self.graph.outputs if t.index in results}

    def reset_state(self) -> None:
        """Variable tensors back to their initial values, as right after compiling."""
        self._serving.reset_state()

    def close(self) -> None:
        if self._meanwhile is not None:
            self._meanwhile.thread.join()  # its backends close below; nothing it built is used
        self._serving.close()


class _Meanwhile:
    """The chosen plan prepared on a thread while the host alone serves (``Session._prepare_meanwhile``)."""

    def __init__(self, measure: Callable[[], tuple[Plan, list[CompiledPartition]]] | None, started: float,
                 start_backends: bool):
        self.measure, self.started, self.start_backends = measure, started, start_backends
        self.thread: threading.Thread | None = None
        self.executor: Executor | None = None  # None: the host alone was chosen
        self.error: BaseException | None = None
        self.ready_ms: float | None = None
        self.note = ""  # the plan's note on the host serving meanwhile

    def doing(self, done: bool = False) -> str:
        """What the thread does (did) meanwhile, for the plan's notes."""
        if self.start_backends:
            return ("the accelerators started and this plan was " + ("chosen by measurement and compiled"
                                                                     if self.measure else "chosen and compiled")
                    if done else "the accelerators start and the plan is chosen and prepared")
        what = "measured and compiled" if self.measure else "compiled"
        return f"this plan was {what}" if done else f"the chosen plan is {what}"

    def prepare(self, session: "Session") -> None:
        try:
            compiled = None
            plan = None if self.start_backends else session.plan
            if self.start_backends:
                backends, skipped = instantiate_backends(session.settings.backends, session.manager,
                                                         session.settings.fallback,
                                                         built_host=(session.host, session.backends[session.host]))
                session._use_backends(backends, {**session.skipped, **skipped})
                plan, compiled = session._choose_plan(False, self.started)
                self.measure = session._measure_later  # too close to call: measured here and now
            if self.measure is not None:
                plan, compiled = self.measure()
            if plan is not session.plan:
                with session._lock:
                    plan.notes.extend(n for n in [self.note] if n)  # the host serving meanwhile, if it does
                    session.plan = plan
                if self.start_backends:
                    session._announce(plan)
                else:
                    session.manager.hook.delegate_plan_ready(plan=plan)
            host_alone = [p.backend for p in plan.partitions] == [session.host]
            if compiled or not host_alone:
                self.executor = session._ready(compiled or session._compile_all(list(plan.partitions)))
        except BaseException as exc:  # raised to the caller at its next run, as the load would have
            self.error = exc
        self.ready_ms = (time.perf_counter() - self.started) * 1e3


def checked_input(t: Tensor, value: Any) -> np.ndarray:
    """``value`` as input ``t``: its dtype (a safe cast allowed) and exactly its shape."""
    arr = np.asarray(value)
    if t.dtype.numpy is None:
        raise InputError(f"input {t.name!r} is a {t.dtype.name} tensor; only numeric inputs can be given")
    if arr.dtype != t.dtype.numpy:
        target = t.dtype.numpy
        if arr.dtype.kind == target.kind and target.kind in "iu" and not np.can_cast(arr.dtype, target) \
                and arr.size and (arr.min() < np.iinfo(target).min or arr.max() > np.iinfo(target).max):
            raise InputError(f"input {t.name!r} expects {t.dtype.name}: its values [{arr.min()}, {arr.max()}] "
                             f"do not fit (they would wrap)")
        if arr.dtype.kind == target.kind or (arr.dtype.kind in "iu" and target.kind in "iu"
                                             and np.can_cast(arr.dtype, target)):
            arr = arr.astype(target)
        else:
            raise InputError(f"input {t.name!r} expects {t.dtype.name}, got {arr.dtype}")
    if tuple(arr.shape) != t.shape:
        raise InputError(f"input {t.name!r} expects shape {list(t.shape)}, got {list(arr.shape)}")
    return arr


def check_budget(graph: Subgraph, limits: Limits) -> None:
    """Refuse, before anything is allocated, a graph whose tensors alive at once exceed the memory budget."""
    budget = limits.memory_bytes()
    for t in graph.tensors:  # numpy lays out a zero-size array of absurd dimensions no better
        span = math.prod(d for d in t.shape if d > 0) * max(t.dtype.itemsize, 1)
        if not t.is_constant and span > budget:
            raise ExecutionError(f"tensor {t.index} ({t.name!r}) of shape {list(t.shape)} spans "
                                 f"{span / 2**30:.3g} GiB, more than the memory budget of {budget / 2**30:.3g} GiB "
                                 f"(limits.memory_mb)")
    need = peak_bytes(graph)
    if need > budget:
        raise ExecutionError(f"the model needs {need / 2**30:.3g} GiB for tensors alive at once, more than the "
                             f"memory budget of {budget / 2**30:.3g} GiB (limits.memory_mb)")


def load(model: str | os.PathLike | bytes | Model, config: Any = None, **overrides: Any) -> Session:
    """Read ``model`` (path, ``zoo:NAME``, bytes or IR) and build a session from ``config`` (path, Config or None).

    ``overrides`` are ``--set``-style keys, e.g. ``load(path, precision="fp16")``.
    """
    from . import zoo
    from .config import load_config

    if isinstance(model, str) and model.startswith(zoo.PREFIX):
        model = zoo.from_spec(model)
    if not isinstance(model, Model):
        model = read_model(model)
    if config is None or isinstance(config, (str, os.PathLike)):
        config = load_config(config, overrides=[f"{k}={v}" for k, v in overrides.items()])
    return Session(model, run_settings(config), host_first=True)
