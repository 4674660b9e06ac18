"""Calibration: a backend's per-op launch cost, per-partition overhead, arithmetic throughput, memory
bandwidth and host transfers, measured so that the figures cannot lie.

Every figure is the difference between two device-resident runs that differ only in the work being
measured (a longer chain of the same op), each run timed in batches long enough to be far above the
timer's resolution, repeated until the repeats agree, and checked against physical bounds.  A
figure that stays unstable or out of bounds is refused with the reason, and nothing is stored.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..backend import HOST
from ..cost import DeviceProfile
from ..errors import MeasurementError

MIN_BATCH_S = 0.02  # each timed batch of runs lasts at least this long
REPEATS = 6  # timed batches of each side of a difference
STABLE_SPREAD = 0.30  # how far the two halves of the repeats may disagree, relative to the figure
ATTEMPTS = 4  # tries before an unstable figure is refused
SHORT, LONG = 2, 12  # chain lengths whose difference isolates the per-op launch cost
LONGER = 8 * LONG  # the long chain again where LONG's difference is lost in the noise (ops run batched)
STEP = 4  # extra ops in the longer chain of a work figure
WORK_OVER_LAUNCH = 10  # an op measured for its work lasts at least this many launches
FC_ROWS, FC_DEPTH = (256, 1024, 4096), 512  # products of ROWS x 512 by 512 x 512, growing until measurable
STREAM_ROWS = (256, 1024, 4096)  # pools over ROWS x 256 x 32 floats: 8, 32, 128 MiB, beyond every cache


@dataclass(frozen=True)
class Bounds:
    """What a device of one kind can physically do; a figure outside is a failed measurement."""

    gflops: float
    gbytes_per_s: float
    transfer_gbytes_per_s: float = 1000.0  # beyond any host link (NVLink-C2C is ~450 GB/s per direction)
    launch_us: float = 1e5


def bounds_for(device_info: dict[str, Any], host: bool = False) -> Bounds:
    """``host``: the device is the host backend's (its cores, whatever ``device_info`` says)."""
    if host or device_info.get("device_type") == "cpu":
        cores = os.cpu_count() or 1
        return Bounds(gflops=200.0 * cores, gbytes_per_s=1000.0)  # 200 GFLOP/s per core: AVX-512 FMA at 6 GHz
    return Bounds(gflops=5e6, gbytes_per_s=20000.0)  # above any GPU's peak (H200: ~4.8 TB/s)


def _chain(length: int, shape: tuple[int, ...], window: int = 1, small_output: bool = False):
    """``length`` pools, alternating max and average: each streams its input once and starts a kernel of its
    own on every backend (no backend fuses a pool into a pool).  ``window`` 2 keeps engines from taking
    a 1x1 pool for a copy they can drop (XNNPACK does).  ``small_output``: a mean over the pixels ends the
    chain, so that reading its result back (which ends every timed batch) is not a large copy whose
    jitter drowns the difference being measured (reading back 128 MiB took ~10 ms on the H200)."""
    from ..tflite.builder import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", shape)
    options = {"padding": "SAME", "stride_w": 1, "stride_h": 1, "filter_width": window, "filter_height": window,
               "fused_activation_function": "NONE"}
    for i in range(length):
        x = b.op("MAX_POOL_2D" if i % 2 == 0 else "AVERAGE_POOL_2D", [x], options=options)
    if small_output:
        x = b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": True})
    b.output(x)
    return b.build()


def _copies(pairs: int, shape: tuple[int, ...], small_output: bool = False):
    """``pairs`` inputs of ``shape``, each pooled (window 2) to an output of its own, or to a mean over its
    pixels with ``small_output``: models that differ from each other in the tensors a run copies."""
    from ..tflite.builder import GraphBuilder

    b = GraphBuilder()
    options = {"padding": "SAME", "stride_w": 1, "stride_h": 1, "filter_width": 2, "filter_height": 2,
               "fused_activation_function": "NONE"}
    for i in range(pairs):
        x = b.op("MAX_POOL_2D", [b.input(f"x{i}", shape)], options=options)
        if small_output:
            x = b.op("MEAN", [x, b.const(f"axes{i}", np.array([1, 2], np.int32))], options={"keep_dims": True})
        b.output(x)
    return b.build()


def _fc_chain(length: int, rows: int, small_output: bool = False):
    from ..tflite.builder import GraphBuilder

    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (rows, FC_DEPTH))
    for i in range(length):
        w = b.const(f"w{i}", (rng.standard_normal((FC_DEPTH, FC_DEPTH)) * 0.04).astype(np.float32))
        x = b.op("FULLY_CONNECTED", [x, w], options={"fused_activation_function": "NONE"})
    if small_output:  # one column out: a small result to read back (see ``_chain``)
        tail = b.const("tail", (rng.standard_normal((1, FC_DEPTH)) * 0.04).astype(np.float32))
        x = b.op("FULLY_CONNECTED", [x, tail], options={"fused_activation_function": "NONE"})
    b.output(x)
    return b.build()


class Runner:
    """One calibration model compiled on the backend, runnable resident or with host copies.

    Resident runs read an input that already lives on the device: the output of a separate one-op
    model of the same shape, run once (a host array given to ``run`` would be uploaded every time)."""

    def __init__(self, backend, options, model, feeder: "Runner | None" = None):
        from ..partition import make_partition

        self.backend, self.graph = backend, model.main
        part = make_partition(self.graph, self.graph.ops, backend.name, 0)
        self.compiled = backend.compile(part, options)
        self.host = {t.index: np.full(t.shape, 0.5, np.float32) for t in self.graph.inputs}
        uploaded = {i: backend.to_device(v) for i, v in self.host.items()}
        if feeder is None:
            self.staged = uploaded
        else:
            (value,) = feeder.compiled.run(feeder.staged).values()
            self.staged = {self.graph.inputs[0].index: value}

    @classmethod
    def resident_pair(cls, backend, options, short_model, long_model, feeder_model) -> tuple["Runner", "Runner"]:
        feeder = cls(backend, options, feeder_model)
        return cls(backend, options, short_model, feeder), cls(backend, options, long_model, feeder)

    def resident(self, n: int) -> None:
        """``n`` runs on staged inputs, then one output read back: the device queue drains once."""
        for _ in range(n):
            out = self.compiled.run(self.staged)
        self.backend.to_host(next(iter(out.values())))

    def synchronized(self, n: int) -> None:
        """``n`` runs on staged inputs, each waited for by reading its first output back: a round trip
        without the uploads, where a queue of runs is no faster than runs one at a time (WebGPU)."""
        for _ in range(n):
            self.resident(1)

    def round_trip(self, n: int) -> None:
        """``n`` runs that each upload the inputs and read every output back."""
        for _ in range(n):
            out = self.compiled.run({i: self.backend.to_device(v) for i, v in self.host.items()})
            for value in out.values():
                self.backend.to_host(value)


def per_run_seconds(batch: Callable[[int], None]) -> float:
    """Seconds per run of ``batch(n)``, with ``n`` doubled until one batch lasts ``MIN_BATCH_S``."""
    batch(1)
    n = 1
    while True:
        t = time.perf_counter()
        batch(n)
        elapsed = time.perf_counter() - t
        if elapsed >= MIN_BATCH_S or n >= 1 << 16:
            return elapsed / n
        n *= 2


def stable_difference(what: str, backend: str, long: Callable[[], float], short: Callable[[], float],
                      per: float = 1.0) -> float:
    """``(long() - short()) / per`` from the fastest of ``REPEATS`` alternated batches of each (the least
    disturbed by other work on the machine), once the two halves of the repeats agree on it.

    Raises MeasurementError when the difference is not positive or the halves never agree."""
    spread, value = float("inf"), 0.0
    half = REPEATS // 2
    for _ in range(ATTEMPTS):
        longs, shorts = [], []
        for _ in range(REPEATS):
            longs.append(long())
            shorts.append(short())
        value = (min(longs) - min(shorts)) / per
        first = (min(longs[:half]) - min(shorts[:half])) / per
        second = (min(longs[half:]) - min(shorts[half:])) / per
        if value > 0 and first > 0 and second > 0:
            spread = abs(first - second) / value
            if spread <= STABLE_SPREAD:
                return value
    raise MeasurementError(f"calibrating {backend}: {what} did not come out stable and positive in {ATTEMPTS} "
                           f"tries (last spread {spread:.0%}, value {value * 1e6:.3g} us); the machine may "
                           f"be busy: retry when it is quiet")


def check_bounds(backend: str, profile: DeviceProfile, bounds: Bounds) -> None:
    checks = [("launch_us", profile.launch_us, bounds.launch_us), ("gflops", profile.gflops, bounds.gflops),
              ("gbytes_per_s", profile.gbytes_per_s, bounds.gbytes_per_s)]
    if np.isfinite(profile.transfer_gbytes_per_s):
        checks += [("transfer_gbytes_per_s", profile.transfer_gbytes_per_s, bounds.transfer_gbytes_per_s),
                   ("transfer_latency_us", profile.transfer_latency_us, 1e6)]
    for name, value, most in checks:
        if not 0 < value <= most:
            raise MeasurementError(f"calibrating {backend}: measured {name} = {value:.4g} is outside what the "
                                   f"device can do (0, {most:.4g}]; nothing was stored")


def work_per_op(what: str, backend, options, make: Callable[[int, int, bool], Any], sizes: Sequence[int],
                launch_s: float) -> tuple[float, int, Runner]:
    """Seconds of one op's work, from chains of 1 and 1 + ``STEP`` ops built by ``make(length, size,
    small_output=True)``, at the first size whose op lasts ``WORK_OVER_LAUNCH`` launches (so that launch
    jitter cannot drown it), else the largest; also the size used and the one-op runner (for the transfer
    figures).  Their input comes from ``make(1, size, False)``, whose output has the chain's input shape.
    A size whose difference is not stable is too small for this device's timer and queue jitter: the next
    size is tried, and only the largest one's instability is an error."""
    for i, size in enumerate(sizes):
        last = i == len(sizes) - 1
        one, more = Runner.resident_pair(backend, options, make(1, size, True), make(1 + STEP, size, True),
                                         make(1, size, False))
        try:
            value = stable_difference(what, backend.name, lambda: per_run_seconds(more.resident),
                                      lambda: per_run_seconds(one.resident), STEP)
        except MeasurementError:
            if not last:
                continue
            value = device_timed_op(more) if backend.role != HOST else None
            if value is None:
                raise
        if value >= WORK_OVER_LAUNCH * launch_s or last:
            return value, size, one
    raise AssertionError("sizes is empty")


def device_timed_op(runner: Runner) -> float | None:
    """Seconds of the typical op of ``runner``'s chain by the device's own timer (profiling events,
    timestamp queries), where its backend has one and every op timed positive: on the H200 the host's
    clock across queues of WebGPU runs disagreed with itself by 209% on 128 MiB pools, which its
    timestamps time alone.  The chain's last op (its small mean) is left out."""
    compiled = runner.compiled
    if not compiled.op_timer():
        return None
    compiled.set_profiling(True)
    try:
        for _ in range(REPEATS):
            runner.resident(1)
        times = compiled.profile()
    finally:
        compiled.set_profiling(False)
    last = runner.graph.ops[-1].index
    pools = [ms for index, ms in times.items() if index != last]
    if not pools or min(pools) <= 0:
        return None
    return float(np.median(pools)) * 1e-3


def _launch_seconds(backend, compile_options, tiny_shape: tuple[int, ...]) -> tuple[float, "Runner"]:
    """Seconds an op's launch adds (chains of SHORT and LONG tiny pools; of SHORT and LONGER where a
    backend's ops cost too little for LONG to tell: the numpy engine runs a partition's native calls
    as one, ~0.03-0.4 us an op), and the short chain's runner."""
    for length in (LONG, LONGER):
        short, long = Runner.resident_pair(backend, compile_options, _chain(SHORT, tiny_shape, 2),
                                           _chain(length, tiny_shape, 2), _chain(1, tiny_shape, 2))
        try:
            return stable_difference("the per-op launch cost", backend.name,
                                     lambda: per_run_seconds(long.resident),
                                     lambda: per_run_seconds(short.resident), length - SHORT), short
        except MeasurementError:
            if length == LONGER:
                raise
    raise AssertionError("no chain length")


def calibrate_backend(backend, compile_options) -> DeviceProfile:
    """The backend's profile, every figure measured on device-resident data (transfers measured apart; where
    those are not stable, the backend's default transfer figures are kept and named in ``defaults_kept``)."""
    name = backend.name
    tiny_shape = (1, 2, 2, 4)
    launch_s, short = _launch_seconds(backend, compile_options, tiny_shape)
    # A partition's own cost beyond its ops (submission, queue drain): a short chain less its ops.
    partition_s = max(min(per_run_seconds(short.resident) for _ in range(REPEATS)) - SHORT * launch_s, 0.0)
    asynchronous = backend.role != HOST  # devices run queued kernels while the host enqueues the next
    # on the host an op's launch and work add up; on a device the chain's extra time is the work alone
    own = (lambda s: s) if asynchronous else (lambda s: max(s - launch_s, s * 0.5))
    stream_s, rows, stream = work_per_op("the streaming op time", backend, compile_options,
                                         lambda n, r, small: _chain(n, (1, r, 256, 32), 2, small), STREAM_ROWS, launch_s)
    stream_bytes = 2 * rows * 256 * 32 * 4
    fc_s, fc_rows, _ = work_per_op("the matrix product time", backend, compile_options, _fc_chain, FC_ROWS, launch_s)
    profile = DeviceProfile(
        gflops=2.0 * fc_rows * FC_DEPTH * FC_DEPTH / own(fc_s) / 1e9, gbytes_per_s=stream_bytes / own(stream_s) / 1e9,
        launch_us=launch_s * 1e6, partition_us=partition_s * 1e6, source="calibrated", asynchronous=asynchronous,
        calibrated_at=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"))
    threads = compile_options.num_threads or 1
    if not asynchronous and threads > 1:
        # what the threads bring to a product, against one: the kinds an engine runs on one thread (LiteRT's
        # reference loops) cost that many times their share of the throughput above, not ``threads`` times
        one_s, _, _ = work_per_op("the one-thread matrix product time", backend,
                                  dataclasses.replace(compile_options, num_threads=1), _fc_chain, (fc_rows,), launch_s)
        profile.thread_speedup = float(np.clip(own(one_s) / own(fc_s), 1.0, threads))
    if asynchronous:
        tiny = Runner(backend, compile_options, _chain(1, tiny_shape, 2), feeder=short)
        try:
            latency_s, copy_s, copies = _transfer_seconds(name, tiny, stream)
            profile.transfer_latency_us = latency_s * 1e6
            profile.transfer_gbytes_per_s = stream_bytes / 2 / max(copy_s - copies * latency_s, copy_s * 0.5) / 1e9
        except MeasurementError:
            try:  # from the tensors a run copies instead (WebGPU on the H100: the latency came out negative)
                latency_s, upload_s = _transfer_by_copies(name, backend, compile_options, tiny_shape,
                                                          (1, rows, 256, 32), launch_s, profile.gbytes_per_s)
                profile.transfer_latency_us = latency_s * 1e6
                profile.transfer_gbytes_per_s = stream_bytes / 2 / upload_s / 1e9
            except MeasurementError as exc:  # the device's own figures stand; its transfers keep the defaults
                _keep_default_transfers(backend, profile, exc)
    if not asynchronous:  # the host's classes the fit to workloads never reaches (no example network has a
        # sequence LSTM) keep the backend's own figures rather than the fit for all classes
        default = backend.default_profile()
        profile.class_scale, profile.class_floor_us = dict(default.class_scale), dict(default.class_floor_us)
        profile.class_reach_ms = dict(default.class_reach_ms)
    check_bounds(name, profile, bounds_for(backend.device_info(), backend.role == HOST))
    return profile


def _keep_default_transfers(backend, profile: DeviceProfile, exc: MeasurementError) -> None:
    default = backend.default_profile()
    profile.transfer_latency_us = default.transfer_latency_us
    profile.transfer_gbytes_per_s = default.transfer_gbytes_per_s
    profile.defaults_kept = {"transfers": str(exc)}


def _transfer_by_copies(name: str, backend, options, tiny_shape, large_shape, launch_s: float,
                        device_gbytes_per_s: float) -> tuple[float, float]:
    """(latency of one copy, time of one upload of ``large_shape``) from round trips alone, each run
    uploading its inputs and reading its outputs back: three tiny input/output pairs against one (four copies
    and two pools more), and a large input against a tiny one, each reduced to a small output (the large
    upload, less the device's time to read it).  No resident or waited-for run enters (on WebGPU on the H100
    those were slower than round trips)."""
    one, three = (Runner(backend, options, _copies(n, tiny_shape)) for n in (1, 3))
    latency_s = stable_difference("the host transfer latency", name, lambda: per_run_seconds(three.round_trip),
                                  lambda: per_run_seconds(one.round_trip), 4) - launch_s / 2
    if latency_s <= 0:
        raise MeasurementError(f"calibrating {name}: the host transfer latency came out at {latency_s * 1e6:.3g} us, "
                               "not positive")
    small, large = (Runner(backend, options, _copies(1, shape, small_output=True)) for shape in (tiny_shape, large_shape))
    upload_s = stable_difference("the host transfer time", name, lambda: per_run_seconds(large.round_trip),
                                 lambda: per_run_seconds(small.round_trip))
    upload_s -= 4.0 * float(np.prod(large_shape)) / (device_gbytes_per_s * 1e9)  # the pool reading it
    if upload_s <= 0:
        raise MeasurementError(f"calibrating {name}: the host transfer time came out not positive")
    return latency_s, upload_s


def _transfer_seconds(name: str, tiny: Runner, stream: Runner) -> tuple[float, float, int]:
    """(latency of one copy, time of the stream chain's large upload with its latencies, how many latencies
    that time holds), from round trips against queued runs: a round trip adds an upload and a read-back,
    two latencies (the large upload's round trip, one large copy and two latencies).  Where a queue of
    runs is no faster than runs waited for one by one (WebGPU on a fast GPU: the difference is not
    positive), against synchronized runs instead, which read back too: the upload alone, one latency."""
    try:
        return (stable_difference("the host transfer latency", name, lambda: per_run_seconds(tiny.round_trip),
                                  lambda: per_run_seconds(tiny.resident), 2),
                stable_difference("the host transfer time", name, lambda: per_run_seconds(stream.round_trip),
                                  lambda: per_run_seconds(stream.resident)), 2)
    except MeasurementError:
        return (stable_difference("the host transfer latency", name, lambda: per_run_seconds(tiny.round_trip),
                                  lambda: per_run_seconds(tiny.synchronized)),
                stable_difference("the host transfer time", name, lambda: per_run_seconds(stream.round_trip),
                                  lambda: per_run_seconds(stream.synchronized)), 1)


# What the fit to real workloads runs: the project's own example networks at sizes of their own (not the ones
# ``zoo:NAME`` builds), so that the profile describes the op mix of mobile models, not chains of one op; float
# and full-integer (engines run int8 kernels of their own: on the H200, fitted to float networks alone,
# LiteRT's int8 plans were over-estimated 1.3-1.6x; an int8 attention block, whose products of two
# activations LiteRT runs through reference loops, 12x without one), and one of a few microseconds, mostly
# fixed costs.
WORKLOADS = (("mobilenet_v1", {"alpha": 0.5, "size": 128, "seed": 11}), ("posenet", {"size": 129, "seed": 12}),
             ("yolo_tiny", {"size": 160, "classes": 8, "seed": 13}), ("deeplab_v3", {"size": 129, "seed": 14}),
             ("transformer_block", {"tokens": 32, "width": 64, "seed": 15}),
             ("mobilenet_v1", {"alpha": 0.25, "size": 96, "seed": 16}),
             ("mobilenet_v1", {"alpha": 0.5, "size": 128, "quant": "int8", "seed": 17}),
             ("posenet", {"size": 97, "quant": "int8", "seed": 18}),
             ("transformer_block", {"tokens": 8, "width": 32, "seed": 19}),
             ("transformer_block", {"tokens": 32, "width": 64, "quant": "int8", "seed": 20}),
             # inverted residuals (residual ADDs, explicit PADs, float16 weights) and detection heads (RESHAPE and
             # CONCATENATION of small maps, a CPU-only post-processing op): the MediaPipe models' small ops, which
             # the networks above lack (on the H200 their elementwise and layout ops came out 0.4-0.6x measured)
             ("mobilenet_v2", {"size": 128, "classes": 10, "quant": "fp16", "seed": 21}),
             ("mobilenet_v2", {"size": 96, "classes": 10, "quant": "int8", "seed": 22}),
             ("mobilenet_ssd", {"size": 128, "seed": 23}),
             # channel PADs on the shortcut and 5x5 depthwise blocks (MediaPipe's face, palm and pose detectors):
             # LiteRT copies a channel pad pixel by pixel, tens of times its roofline at 16 threads on an H100 host
             ("blazeface", {"size": 128, "seed": 24}),
             # a sequence LSTM: dependent steps, each a small product waiting for the last (the recurrent class,
             # which the networks above lack: on an H100 host a converter LSTM classifier was estimated at 1.8x
             # its time on the default figures)
             ("lstm_classifier", {"steps": 16, "features": 32, "units": 64, "seed": 25}),
             # a second LSTM of a sixteenth of the work: with one size the recurrent class's whole time went into
             # its per-step floor (on an H100 host a converter LSTM of a quarter of the work then came out 1.5x)
             ("lstm_classifier", {"steps": 16, "features": 8, "units": 16, "seed": 26}),
             # int8 on a few channels: at 16 threads LiteRT's took about as long as int8 ops of ten times the
             # work (an int8 MobileNet at width 0.35 was estimated at 0.6x its time from the wider networks)
             ("mobilenet_v1", {"alpha": 0.25, "size": 96, "quant": "int8", "seed": 27}))
WORKLOAD_RUNS = 25
# a workload's plan is timed over WORKLOAD_PLAN_RUNS after WORKLOAD_WARMUP, once settled: over 25 runs after 3, an
# H100 host's 16-thread LiteRT timed mobilenet_v1 at width 0.25 (96 px) at 0.389 ms, above the same network at
# width 0.5 (128 px, 0.351), where another host's took 0.28 and 0.43
WORKLOAD_PLAN_RUNS, WORKLOAD_WARMUP = 60, 10
# Each workload is timed in WORKLOAD_PASSES passes over all of them and its fastest pass is fitted: other work on
# the machine only ever slows a timing, and a burst of it can outlast a whole network's timing, which the speed
# check at both ends does not see (an H100 host, 2026-12-08 00:25 UTC, one pass: transformer_block(tokens=8) took
# 0.558 ms and blazeface 2.68 where other hosts took 0.086 and 0.90; the refitted profile estimated an int8
# MobileNet on the CPU alone at 2.1x its time, and the shipped defaults put it on OpenCL, 1.23x slower)
WORKLOAD_PASSES = 2


def _timed_workload(session, inputs) -> tuple[float, list]:
    """One pass of a workload: its plan's median ms once settled, and each partition timed alone."""
    from .measure import profile_partitions

    return _settled_median(lambda: session.run_indexed(inputs)), \
        profile_partitions(session.executor, inputs, WORKLOAD_RUNS)


def _settled_median(run) -> float:
    """Median ms of WORKLOAD_PLAN_RUNS of ``run`` after WORKLOAD_WARMUP, once settled (``measure.settle``)."""
    from .measure import alone_median, settle

    settle(run)
    return alone_median(run, WORKLOAD_PLAN_RUNS, warmup=WORKLOAD_WARMUP)


def _plan_of(executor) -> list[tuple[str, tuple[int, ...]]]:
    """A plan's partitions as (backend, op indices): what its timings are keyed by."""
    return [(p.backend, tuple(op.index for op in p.ops)) for p in executor.partitions]


def fit_to_workloads(settings, name: str) -> list[dict[str, Any]]:
    """Run each workload with backend ``name`` taking every op it supports (the host the rest), time its
    partitions alone and its plan, in WORKLOAD_PASSES passes, and refit the profiles to its fastest pass (its
    partitions and the plan's time: ``measure.learn_from``, the whole-plan costs ``run_us`` and ``boundary_us``
    too); then plan each workload again from the refitted profiles.  Rows: workload, the new plan's estimate,
    the measured time of the plan (the fastest pass) and each pass's."""
    from .. import zoo
    from ..inputs import make_inputs
    from ..plugins import HOST_WORD
    from ..session import Session
    from ..tflite.reader import read_model
    from .measure import learn_from

    backends = [b for b in settings.backends if b[0] in (name, HOST_WORD)]
    placement = dataclasses.replace(settings.placement, partitioner="greedy", search="estimate",
                                    pins=[], denies=[], max_delegated_partitions=0, min_nodes_per_partition=1)
    workload = dataclasses.replace(settings, backends=backends, placement=placement, fallback=False)
    built = []  # (model bytes, session, inputs): open through every pass
    try:
        for net, kwargs in WORKLOADS:
            data = zoo.build(net, **kwargs)
            session = Session(read_model(data), workload)
            built.append((data, session, session.normalize_inputs(make_inputs(session.graph, None))))
        passes: list[list[tuple[float, list]]] = [[] for _ in built]
        for _ in range(WORKLOAD_PASSES):
            for (_, session, inputs), timed in zip(built, passes):
                timed.append(_timed_workload(session, inputs))
        plans = [_plan_of(session.executor) for _, session, _ in built]
    finally:
        for _, session, _ in built:
            session.close()
    measured = []
    # each fitted in a session of its own, as the last one's refit left the profiles on disk
    for (net, kwargs), (data, _, _), plan, timed in zip(WORKLOADS, built, plans, passes):
        ms, timings = min(timed, key=lambda t: t[0])
        session = Session(read_model(data), workload)
        try:
            if _plan_of(session.executor) != plan:  # a plan that depends on the refits so far: timed again
                ms, timings = _timed_workload(session, session.normalize_inputs(make_inputs(session.graph, None)))
            learn_from(session, session.executor, timings, plan_ms=ms)
        finally:
            session.close()
        measured.append((net, kwargs, data, ms, [round(t[0], 4) for t in timed]))
    rows = []
    for net, kwargs, data, ms, each in measured:  # the estimates the refitted profiles give
        session = Session(read_model(data), workload)
        rows.append({"workload": f"{net}({', '.join(f'{k}={v}' for k, v in kwargs.items() if k != 'seed')})",
                     "estimated_ms": round(session.plan.estimated_ms, 4), "measured_ms": round(ms, 4),
                     "passes_ms": each})
        session.close()
    return rows


# How far apart the reference network's times at the start and the end of a calibration may be (either way)
# before it is refused: the machine's speed changed under it.  An H100 host, slowed while it calibrated, stored
# CPU figures under half of other hosts' (478 GFLOP/s against 1064-1358), and once it was quick again the
# plans were estimated at 1.9-2.4x their time.
SPEED_DRIFT = 1.25
# The reference is timed in this many bursts at each end and the fastest burst's median counts: the check asks
# whether the machine's own speed changed, and a burst of other work at one end is not that (an H100 host,
# 2026-12-08 00:51 UTC: one burst each, 0.326 ms at the start and 0.419 at the end, and every figure refused;
# the CPU-only calibration right after timed it at 0.409 and 0.349).  A slowdown that outlasts every burst
# still refuses.
REFERENCE_BURSTS = 3


def reference_ms(settings) -> float:
    """The first example network on the host backend alone, the least of REFERENCE_BURSTS medians of
    WORKLOAD_PLAN_RUNS, each once settled: the speed check at both ends of a calibration."""
    from .. import zoo
    from ..inputs import make_inputs
    from ..plugins import HOST_WORD
    from ..session import Session
    from ..tflite.reader import read_model

    net, kwargs = WORKLOADS[0]
    alone = dataclasses.replace(settings.placement, search="estimate", pins=[], denies=[])
    host = dataclasses.replace(settings, backends=[b for b in settings.backends if b[0] == HOST_WORD] or
                               [(HOST_WORD, {})], placement=alone, fallback=False)
    session = Session(read_model(zoo.build(net, **kwargs)), host)
    try:
        inputs = session.normalize_inputs(make_inputs(session.graph, None))
        return min(_settled_median(lambda: session.run_indexed(inputs)) for _ in range(REFERENCE_BURSTS))
    finally:
        session.close()


def calibrate_all(settings) -> dict[str, Any]:
    """``delegate calibrate`` as data: each configured backend calibrated and its profile stored, then every
    profile refitted to the example networks (the host's first).  ``profiles``: a row per stored profile;
    ``workloads``: per backend, the refitted plans' estimates against their measured times; ``skipped``:
    backends that did not start; ``refused``: backends whose figures were refused, with why; ``speed``: the
    reference network's ms at the start and the end.  Where those two are over SPEED_DRIFT apart, every
    backend is refused and each profile file is put back as it was before."""
    from ..cost import fingerprint, profile_dir, profile_info, save_profile
    from ..errors import DelegateError
    from ..plugins import default_manager
    from ..session import instantiate_backends
    from ..stdio import progress

    backends, skipped = instantiate_backends(settings.backends, default_manager(settings.disable_plugins), True)
    paths = [profile_dir() / f"{fingerprint(profile_info(b, settings.compile.num_threads))}.json"
             for b in backends.values()]
    before = {path: path.read_bytes() if path.is_file() else None for path in paths}
    start_ms = reference_ms(settings)
    rows, refused = [], {}
    with progress("calibrating backends", len(backends)) as advance:
        for name, backend in backends.items():
            try:
                profile = calibrate_backend(backend, settings.compile)
            except MeasurementError as exc:  # this backend's figures are refused; the others still count
                refused[name] = str(exc)
                continue
            finally:
                advance()
            path = save_profile(profile_info(backend, settings.compile.num_threads), profile)
            rows.append({"backend": name, "gflops": round(profile.gflops, 2),
                         "gbytes_per_s": round(profile.gbytes_per_s, 2), "launch_us": round(profile.launch_us, 2),
                         "partition_us": round(profile.partition_us, 2),
                         "transfer_latency_us": round(profile.transfer_latency_us, 2),
                         "transfer_gbytes_per_s": (round(profile.transfer_gbytes_per_s, 2)
                                                   if np.isfinite(profile.transfer_gbytes_per_s) else None),
                         "profile": str(path), "defaults_kept": dict(profile.defaults_kept)})
    # the micro figures set the shape of the model; real networks set its floors and scales
    workloads = {}
    with progress("fitting profiles to example networks", len(rows)) as advance:
        for row in sorted(rows, key=lambda r: backends[r["backend"]].role != HOST):  # the host's own fit first
            try:
                workloads[row["backend"]] = fit_to_workloads(settings, row["backend"])
            except DelegateError as exc:
                refused[row["backend"]] = f"the fit to workloads failed: {exc}"
            finally:
                advance()
    end_ms = reference_ms(settings)
    speed = {"network": WORKLOADS[0][0], "start_ms": round(start_ms, 4), "end_ms": round(end_ms, 4)}
    if max(start_ms, end_ms) > SPEED_DRIFT * min(start_ms, end_ms):
        _put_back(before)
        why = (f"the machine's speed changed during the calibration: the reference network ({WORKLOADS[0][0]} on "
               f"the host) took {start_ms:.3g} ms at the start and {end_ms:.3g} ms at the end; nothing was stored "
               f"(calibrate again when the machine is quiet)")
        rows, workloads, refused = [], {}, {name: why for name in backends}
    return {"profiles": rows, "workloads": workloads, "skipped": skipped, "refused": refused, "speed": speed}


def _put_back(before: dict) -> None:
    """Each profile file as it was before the calibration: its old bytes, or none where there was none."""
    for path, data in before.items():
        if data is None:
            path.unlink(missing_ok=True)
            continue
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
