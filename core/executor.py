"""Where a dataset's batches run: in this process, or on an actor pool of Ray Data.

Both run the same worker (a callable class that builds its sessions once, in
``__init__``) on the same chunks of the dataset, so a Ray run's results equal the
in-process run's.  Ray is optional (``pip install 'delegate[ray]'``): it is
imported only when asked for, and a cluster is joined at ``--ray-address`` or
``RAY_ADDRESS``, else a local one is started for the run.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import numpy as np

from .dataset import Dataset
from .errors import DatasetError, DelegateError, ExecutionError, UnsupportedOpError
from .session import RunSettings

INSTALL_RAY = "--ray needs Ray Data: pip install 'delegate[ray]'"


@dataclass
class Configuration:
    """A named way to run the model: a suite preset or a config file, resolved to RunSettings."""

    name: str
    settings: RunSettings

    @property
    def uses_gpu(self) -> bool:
        return any(name != "cpu" for name, _ in self.settings.backends)


def resolve_configurations(names: list[str], model_spec: str, default: RunSettings,
                           threads: int) -> list[Configuration]:
    """``--configs`` items: suite presets (``cpu-numpy``, ``opencl-fp16``, ...) or YAML config files;
    none: the command's own config.  Every one runs at ``threads`` CPU threads."""
    from .config import load_config
    from .session import run_settings
    from .suite import CONFIGS

    presets = {c.name: c for c in CONFIGS}
    configurations = []
    for name in names or ["config"]:
        if not names:
            settings = default
        elif name in presets:
            settings = presets[name].settings(threads, None, "sustained_speed")
        elif name.endswith((".yaml", ".yml")) or os.path.exists(name):
            settings = run_settings(load_config(name).for_model(model_spec))
        else:
            raise DelegateError(f"unknown configuration {name!r}: give a config file or one of {sorted(presets)}")
        configurations.append(Configuration(name, replace(settings, compile=replace(settings.compile,
                                                                                    num_threads=threads))))
    return configurations


def batched_model(data: bytes, batch: int) -> tuple[bytes, int, str | None]:
    """(model bytes, samples per run, note): the inputs' batch dimension resized to ``batch`` as
    ``bench --batch`` does, where the model allows it (every output keeps the batch as its first
    dimension); else the model as it is, one sample per run."""
    from .shapes import with_batch
    from .tflite.reader import read_model
    from .tflite.writer import write_model

    model = read_model(data)
    native = {t.shape[0] if t.shape else None for t in model.main.inputs}
    if native == {batch}:
        return data, batch, None
    try:
        with_batch(model.main, batch)
        leading = {t.shape[0] if t.shape else None for t in model.main.outputs}
        if leading != {batch}:
            raise UnsupportedOpError(f"outputs' first dimensions become {sorted(map(str, leading))}")
        return write_model(model), batch, None
    except (DelegateError, ValueError) as exc:
        why = str(exc).splitlines()[0]
        if native != {1}:
            raise DatasetError(f"the model's batch dimension cannot be resized ({why})") from None
        return data, 1, f"the model does not run batches of {batch} ({why}): one sample per run"


@dataclass
class RayOptions:
    address: str | None = None
    actors: int | None = None  # None: one per free slot of the cluster


def ray_requested(args, config) -> bool:
    """``--ray``, ``--ray-address`` or the config's ``executor: ray``: the commands that can run on Ray do."""
    return bool(args.ray or args.ray_address or config.executor == "ray")


def ray_options(args, config) -> RayOptions | None:
    """Ray when :func:`ray_requested`; else None (in-process)."""
    if ray_requested(args, config):
        return RayOptions(args.ray_address, args.workers)
    return None


def run_batches(dataset: Dataset, worker: type, args: tuple, ray: RayOptions | None, threads: int,
                gpu: bool, advance: Callable[[int], None], rows_per_sample: int = 1,
                clock: "Throughput | None" = None) -> Iterator[dict[str, np.ndarray]]:
    """Each batch ``worker(*args)`` returns, in dataset order; ``advance`` is told the samples done and
    ``clock`` when and where each batch ran."""
    clock = clock or Throughput(rows_per_sample)
    if ray is None:
        if dataset.parquet:
            raise DatasetError(f"{dataset.spec}: Parquet datasets are read through Ray Data: add --ray")
        run = Timed(worker, args)
        for chunk in range(dataset.chunks):
            out = clock.take(run({"chunk": np.array([chunk])}))
            advance(len(out["id"]) // rows_per_sample)
            yield out
        return
    yield from _on_ray(dataset, worker, args, ray, threads, gpu, advance, rows_per_sample, clock)


class Timed:
    """A worker whose every batch carries who ran it and when the call began and ended on that worker's own
    clock (columns ``WORKER`` and ``CALL``, a value per row so that any regrouping of rows keeps them): what
    :class:`Throughput` tells the work from the executor's cost by."""

    def __init__(self, worker: type, args: tuple):
        self.worker = worker(*args)
        self.name = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        out = self.worker(batch)
        call = np.array([start, time.perf_counter()])
        n = len(next(iter(out.values())))
        return {**out, WORKER: np.full(n, self.name, dtype=object), CALL: np.tile(call, (n, 1))}


WORKER, CALL = "_worker", "_call"


class Throughput:
    """Where the time of a run over a dataset went, from the calls its workers timed (:class:`Timed`).

    A worker's wall time per batch is its call (the work: decode, sessions, metrics) and the gap until its
    next call begins: the executor's own cost per batch (Ray: handing the batch over and its results back,
    scheduling; in process: what the driver does with a result).  ``overhead_share`` is the gaps over the
    work of the calls that followed them; the first call of each worker waits for its sessions to be built,
    which is the run's start-up (``first_batch_s``), not a per-batch cost."""

    def __init__(self, rows_per_sample: int = 1):
        self.rows_per_sample = rows_per_sample
        self.started = time.perf_counter()
        self.first_batch_s: float | None = None
        self.rows: dict[tuple[str, float, float], int] = {}  # (worker, call start, call end): rows it returned

    def take(self, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch without its timing columns, which are recorded."""
        if self.first_batch_s is None:
            self.first_batch_s = time.perf_counter() - self.started
        workers, calls = out.pop(WORKER), out.pop(CALL)
        for key in zip(workers, calls[:, 0], calls[:, 1]):
            self.rows[key] = self.rows.get(key, 0) + 1
        return out

    def report(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.started
        by_worker: dict[str, list[tuple[float, float, int]]] = {}
        for (worker, start, end), rows in self.rows.items():
            by_worker.setdefault(worker, []).append((start, end, rows // self.rows_per_sample))
        work, gaps, followed, steady = [], [], [], 0.0
        for calls in by_worker.values():
            calls.sort()
            work += [end - start for start, end, _ in calls]
            gaps += [b[0] - a[1] for a, b in zip(calls, calls[1:])]
            followed += [end - start for start, end, _ in calls[1:]]
            span = calls[-1][1] - calls[0][0]
            steady += sum(n for *_, n in calls) / span if span > 0 else 0.0

        def ms(values):
            return round(float(np.median(values)) * 1e3, 3) if values else None
        return {"workers": len(by_worker), "batches": len(work),
                "samples_per_batch": int(np.median([n for calls in by_worker.values() for *_, n in calls]))
                if work else 0,
                "wall_s": round(wall, 3), "first_batch_s": round(self.first_batch_s or 0.0, 3),
                "work_s": round(float(sum(work)), 3), "work_ms_per_batch": ms(work), "overhead_ms_per_batch": ms(gaps),
                "overhead_share": round(float(sum(gaps) / sum(followed)), 4) if followed and sum(followed) > 0 else None,
                "steady_samples_per_s": round(float(steady), 2)}


def import_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise DelegateError(INSTALL_RAY) from None
    return ray


def connect(ray_module, address: str | None):
    """Join the cluster at ``address`` (or RAY_ADDRESS); else start a local Ray for this run."""
    if not ray_module.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")  # its workers' notices, not for our users
        try:
            ray_module.init(address=address, include_dashboard=False, log_to_driver=False,
                            logging_level=logging.ERROR)
        except ConnectionError as exc:
            raise ExecutionError(f"cannot join the Ray cluster at {address}: {exc}") from None
    return ray_module


def _on_ray(dataset, worker, args, options: RayOptions, threads, gpu, advance, rows_per_sample, clock):
    ray = connect(import_ray(), options.address)
    logging.getLogger("ray.data").setLevel(logging.CRITICAL)  # its plans, timings and errors: ours report them
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # results in dataset order, as in-process
    context.enable_progress_bars = False  # ours counts samples
    resources = ray.cluster_resources()
    num_gpus = 1 if gpu and resources.get("GPU", 0) >= 1 else 0
    slots = int(resources.get("GPU", 0) if num_gpus else resources.get("CPU", 1) // threads)
    if dataset.parquet:  # Ray Data's reads need a CPU the actors leave free (else they wait for ever)
        actors = options.actors or max(1, slots - (not num_gpus))
        source = ray.data.read_parquet(dataset.spec)
        batch_size = dataset.batch
    else:  # one chunk per row and per block: actors run exactly the batches an in-process run does, and each
        # result comes back when its chunk is done (a block's results come back only with its last chunk's)
        actors = options.actors or max(1, slots)
        source = ray.data.from_items([{"chunk": i} for i in range(dataset.chunks)],
                                     override_num_blocks=dataset.chunks)
        batch_size = 1
    results = source.map_batches(RayActor, fn_constructor_args=(worker, args), batch_size=batch_size,
                                 batch_format="numpy",
                                 compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=threads,
                                 num_gpus=num_gpus)
    try:
        for out in results.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=0):
            # no prefetch: it holds each result back until the next one is also done
            if FAILED in out:
                raise raised(str(out[FAILED][0]), str(out["message"][0]))
            out = clock.take(out)
            advance(len(out["id"]) // rows_per_sample)
            yield out
    except DelegateError:
        raise
    except Exception as exc:  # Ray's own failure (a lost node, a worker killed): its last line
        raise ExecutionError(f"the Ray run failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1]}") \
            from None


class RayActor:
    """A worker on Ray: a DelegateError comes back as data (Ray Data hands the driver only its text)."""

    def __init__(self, worker: type, args: tuple):
        try:
            self.worker, self.failed = Timed(worker, args), None
        except DelegateError as exc:
            self.worker, self.failed = None, exc

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            if self.failed is not None:
                raise self.failed
            return self.worker(batch)
        except DelegateError as exc:
            return {FAILED: np.array([type(exc).__name__]), "message": np.array([str(exc)])}


FAILED = "delegate_error"


def raised(kind: str, message: str) -> DelegateError:
    """The error a Ray worker sent back as its class name and text, rebuilt on the driver."""
    from . import errors
    return getattr(errors, kind, DelegateError)(message)


def padded(inputs: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """A short last batch filled up to the model's batch with copies of its last sample."""
    n = len(next(iter(inputs.values())))
    if n == batch:
        return inputs
    return {k: np.concatenate([v, np.repeat(v[-1:], batch - n, axis=0)]) for k, v in inputs.items()}


def to_runs(inputs: dict[str, np.ndarray], batch: int) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """(samples, inputs of one model run) for a decoded batch of any length."""
    n = len(next(iter(inputs.values())))
    for start in range(0, n, batch):
        part = {k: v[start:start + batch] for k, v in inputs.items()}
        yield len(next(iter(part.values()))), padded(part, batch)

