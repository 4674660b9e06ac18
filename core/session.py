"""Load a model, negotiate with the backends, plan, compile and run: the one-call API.

    import delegate
    session = delegate.load("model.tflite", "configs/edge.yaml")
    outputs = session.run({"input": image})

A backend that is unavailable, or fails while compiling or running, is replaced
by the CPU for the partitions it held (once, with a warning naming the backend
and the error) unless the config turns ``fallback`` off.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from .backend import Backend, CompiledPartition, CompileOptions, Partition
from .cost import DeviceProfile, load_profile
from .errors import DelegateError, ExecutionError, PluginError
from .ir import Model, Subgraph, Tensor
from .planner import Plan, PlacementSettings, Planner
from .plugins import PluginManager, default_manager
from .runtime import Executor
from .tflite.reader import read_model
from .validate import validate_graph

log = logging.getLogger(__name__)


class BackendFallbackWarning(UserWarning):
    """A backend failed and its work went to the CPU."""


@dataclass
class RunSettings:
    """Everything a session needs from the config, already resolved for one model."""

    backends: list[tuple[str, dict[str, Any]]] = field(default_factory=lambda: [("cpu", {})])
    compile: CompileOptions = field(default_factory=CompileOptions)
    placement: PlacementSettings = field(default_factory=PlacementSettings)
    fallback: bool = True
    accuracy_guard: AccuracyBound | None = None


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
    backends = [(b.name, {**cpu_options, **b.options} if b.name == "cpu" else dict(b.options))
                for b in config.backends]
    if all(name != "cpu" for name, _ in backends):
        backends.append(("cpu", cpu_options))
    placement = PlacementSettings(partitioner=config.partitioner,
                                  max_delegated_partitions=config.max_delegated_partitions,
                                  min_nodes_per_partition=config.min_nodes_per_partition,
                                  pins=list(config.pin), denies=list(config.deny))
    guard = config.accuracy_guard
    bound = AccuracyBound(guard.max_abs_error, guard.max_rel_error) if guard.enabled else None
    return RunSettings(backends, config.compile_options(), placement, bool(config.fallback), bound)


def _warn(message: str) -> None:
    log.warning(message)
    warnings.warn(message, BackendFallbackWarning, stacklevel=3)


def instantiate_backends(requested: Sequence[tuple[str, Mapping[str, Any]]], manager: PluginManager,
                         fallback: bool) -> tuple[dict[str, Backend], dict[str, str]]:
    """Build the requested backends in priority order; the CPU is always added last.

    Returns the backends and, for each one skipped, why.
    """
    backends: dict[str, Backend] = {}
    skipped: dict[str, str] = {}
    for name, options in requested:
        if name in backends:
            continue
        if name in manager.load_errors and name not in manager.backends():
            info, ok, reason = None, False, f"its plugin failed to load ({manager.load_errors[name]})"
        else:
            info = manager.backend_info(name)  # unknown name -> PluginError listing the installed ones
            ok, reason = _probe(info)
        try:
            if not ok:
                raise PluginError(f"backend {name!r} is not available here: {reason}")
            backends[name] = info.factory(dict(options or {}))
            backends[name].add_custom_kernels(manager.custom_kernels(name))
        except Exception as exc:
            message = str(exc) if isinstance(exc, DelegateError) else f"backend {name!r} failed to start: {exc}"
            if not fallback or name == "cpu":
                raise exc if isinstance(exc, DelegateError) else PluginError(message) from exc
            skipped[name] = message
            log.info("%s; continuing without it", message)
    if "cpu" not in backends:
        backends["cpu"] = manager.backend_info("cpu").factory({})
        backends["cpu"].add_custom_kernels(manager.custom_kernels("cpu"))
    # the CPU last: it is the fallback, whatever the order in the config
    cpu = backends.pop("cpu")
    backends["cpu"] = cpu
    return backends, skipped


def _probe(info) -> tuple[bool, str]:
    try:
        ok, reason = info.available()
        return bool(ok), reason
    except Exception as exc:
        return False, f"availability check failed: {exc}"


def profile_kind(name: str, info: Mapping[str, Any]) -> str:
    """Which default profile fits a backend when it has not been calibrated."""
    if name == "cpu":
        return "cpu-litert" if info.get("engine") == "litert" else "cpu"
    return "cpu-device" if info.get("device_type") == "cpu" else "gpu"


def backend_profiles(backends: Mapping[str, Backend]) -> dict[str, DeviceProfile]:
    profiles = {}
    for name, be in backends.items():
        info = be.device_info()
        profiles[name] = load_profile(info, profile_kind(name, info))
    return profiles


class Session:
    """A model planned and compiled for the configured backends."""

    def __init__(self, model: Model, settings: RunSettings | None = None, *,
                 manager: PluginManager | None = None, subgraph: int = 0):
        self.model = model
        self.settings = settings or RunSettings()
        self.manager = manager or default_manager()
        self.graph: Subgraph = model.subgraphs[subgraph]
        started = time.perf_counter()
        self._warned: set[str] = set()
        self.backends, self.skipped = instantiate_backends(self.settings.backends, self.manager,
                                                           self.settings.fallback)
        validate_graph(self.graph)
        for graph_pass in self.manager.graph_passes():
            if graph_pass(self.graph):
                self.graph.link()
        self.profiles = backend_profiles(self.backends)
        self.planner = Planner(self.backends, self.profiles, self.settings.compile, self.settings.placement)
        self.plan: Plan = self.planner.plan(self.graph)
        self.plan.notes.extend(f"{name} skipped: {why}" for name, why in self.skipped.items())
        for d in self.plan.decisions:
            log.info("op #%d %s v%d -> %s: %s", d.index, d.opcode, d.version, d.backend, d.reason)
        self.manager.hook.delegate_plan_ready(plan=self.plan)
        self.executor = Executor(self.graph, self.plan.partitions, self.backends, self.settings.compile,
                                 compiled=[self._compile(p) for p in self.plan.partitions])
        if self.settings.accuracy_guard is not None and any(p.backend != "cpu" for p in self.plan.partitions):
            self._guard_accuracy(self.settings.accuracy_guard)
        self.init_ms = (time.perf_counter() - started) * 1e3

    # -- compile / fallback ----------------------------------------------
    def _compile(self, partition: Partition) -> CompiledPartition:
        backend = self.backends[partition.backend]
        try:
            return backend.compile(partition, self.settings.compile)
        except Exception as exc:
            if partition.backend == "cpu" or not self.settings.fallback:
                raise
            return self._to_cpu(partition, f"compile failed: {exc}")

    def _to_cpu(self, partition: Partition, why: str) -> CompiledPartition:
        if partition.backend not in self._warned:
            self._warned.add(partition.backend)
            _warn(f"backend {partition.backend!r} {why}; its partitions fall back to cpu")
        self.plan.notes.append(f"partition {partition.index} moved from {partition.backend} to cpu: {why}")
        partition.backend = "cpu"
        return self.backends["cpu"].compile(partition, self.settings.compile)

    # -- accuracy guard ------------------------------------------------------
    def _guard_accuracy(self, bound: AccuracyBound) -> None:
        """Check every accelerator partition on a calibration input against the CPU, given the same inputs.

        A partition beyond the bound is rebuilt in fp32 when it ran in fp16, and moved to the CPU
        when fp32 is still beyond it; each step is noted in the plan.
        """
        from .inputs import random_input

        rng = np.random.default_rng(0)
        cpu = self.backends["cpu"]
        values = {t.index: random_input(t, rng) for t in self.graph.inputs}
        for i, part in enumerate(self.executor.partitions):
            reference = cpu.compile(part, self.settings.compile).run({t.index: values[t.index] for t in part.inputs})
            reference = {k: np.asarray(cpu.to_host(v)) for k, v in reference.items()}
            if part.backend != "cpu":
                error = self._partition_error(part, self.executor.compiled[i], values, reference, bound)
                if error is not None and self.settings.compile.precision == "fp16":
                    fp32 = replace(self.settings.compile, precision="fp32")
                    compiled = self.backends[part.backend].compile(part, fp32)
                    self.plan.notes.append(f"accuracy guard: partition {part.index} on {part.backend} erred "
                                           f"{error:.3g} in fp16; rebuilt in fp32")
                    self.executor.compiled[i] = compiled
                    error = self._partition_error(part, compiled, values, reference, bound)
                if error is not None:
                    self.plan.notes.append(f"accuracy guard: partition {part.index} on {part.backend} erred "
                                           f"{error:.3g}; moved to cpu")
                    backend = part.backend
                    part.backend = "cpu"
                    self.executor.compiled[i] = cpu.compile(part, self.settings.compile)
                    log.warning("accuracy guard moved partition %d from %s to cpu (error %.3g)",
                                part.index, backend, error)
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
                raise ExecutionError(f"the model has {len(tensors)} input(s) but {len(inputs)} were given")
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
                    raise ExecutionError(f"unknown input {key!r}; the model's inputs are {names}")
                pairs.append((t, value))
            missing = [t.name for t in tensors if t not in [p[0] for p in pairs]]
            if missing:
                raise ExecutionError(f"missing input(s): {', '.join(missing)}")
        out = {}
        for t, value in pairs:
            arr = np.asarray(value)
            if arr.dtype != t.dtype.numpy:
                target = t.dtype.numpy
                if arr.dtype.kind == target.kind and target.kind in "iu" and not np.can_cast(arr.dtype, target) \
                        and arr.size and (arr.min() < np.iinfo(target).min or arr.max() > np.iinfo(target).max):
                    raise ExecutionError(f"input {t.name!r} expects {t.dtype.name}: its values "
                                         f"[{arr.min()}, {arr.max()}] do not fit (they would wrap)")
                if arr.dtype.kind == target.kind or (arr.dtype.kind in "iu" and target.kind in "iu"
                                                     and np.can_cast(arr.dtype, target)):
                    arr = arr.astype(target)
                else:
                    raise ExecutionError(f"input {t.name!r} expects {t.dtype.name}, got {arr.dtype}")
            if tuple(arr.shape) != t.shape:
                raise ExecutionError(f"input {t.name!r} expects shape {list(t.shape)}, got {list(arr.shape)}")
            out[t.index] = arr
        return out

    def run_indexed(self, inputs: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Run with inputs keyed by tensor index; outputs keyed likewise (fallback on device failure)."""
        try:
            return self.executor.run(inputs)
        except ExecutionError as exc:
            failed = [i for i, p in enumerate(self.executor.partitions)
                      if p.backend != "cpu" and f"partition {p.index} on {p.backend}" in str(exc)]
            if not failed or not self.settings.fallback:
                raise
            i = failed[0]
            self.executor.compiled[i] = self._to_cpu(self.executor.partitions[i], f"failed while running: {exc}")
            return self.run_indexed(inputs)

    def run(self, inputs: Any) -> dict[str, np.ndarray]:
        """Run once; returns outputs by tensor name (copies, safe to keep)."""
        results = self.run_indexed(self.normalize_inputs(inputs))
        return {t.name: np.array(results[t.index]) for t in self.graph.outputs}

    def close(self) -> None:
        self.executor.close()


def load(model: str | os.PathLike | bytes | Model, config: Any = None, **overrides: Any) -> Session:
    """Read ``model`` (path, bytes or IR) and build a session from ``config`` (path, Config or None).

    ``overrides`` are ``--set``-style keys, e.g. ``load(path, precision="fp16")``.
    """
    from .config import load_config

    if not isinstance(model, Model):
        model = read_model(model)
    if config is None or isinstance(config, (str, os.PathLike)):
        config = load_config(config, overrides=[f"{k}={v}" for k, v in overrides.items()])
    return Session(model, run_settings(config))
