"""Cost model: estimated time of an op on a backend and of moving a tensor between devices.

Compute time is a roofline, ``launch + max(flops / throughput, bytes / bandwidth) * class scale``,
against a :class:`DeviceProfile`; each partition adds its backend's fixed cost.  Profiles come from
``delegate calibrate`` (stored per device fingerprint in the user cache dir), are refitted by every
measurement (``refit``: bench, tune, calibrate) and fall back to their backend's defaults.  Measured
per-op times (``delegate bench --profile``) replace estimates for the ops they cover.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .digest import sha1, sha256
from .ir import Op


# Op classes the cost model fits a throughput correction for (see ``refit``): one per kind of kernel engines
# run (a product of two activations is not a product by constant weights, packed once: LiteRT runs its int8
# form through a reference loop).
OP_CLASSES = {"CONV_2D": "conv", "TRANSPOSE_CONV": "conv", "Convolution2DTransposeBias": "conv",
              "DEPTHWISE_CONV_2D": "depthwise", "FULLY_CONNECTED": "matmul", "BATCH_MATMUL": "batch_matmul",
              "MAX_POOL_2D": "pool", "AVERAGE_POOL_2D": "pool", "MEAN": "reduce", "SUM": "reduce",
              "REDUCE_MAX": "reduce", "REDUCE_MIN": "reduce", "REDUCE_PROD": "reduce", "SOFTMAX": "reduce",
              "RESHAPE": "layout", "TRANSPOSE": "layout", "CONCATENATION": "layout", "SLICE": "layout",
              "STRIDED_SLICE": "layout", "PAD": "layout", "PADV2": "layout", "GATHER": "layout",
              "SPLIT": "layout", "SPLIT_V": "layout", "PACK": "layout", "UNPACK": "layout",
              "RESIZE_BILINEAR": "resize", "RESIZE_NEAREST_NEIGHBOR": "resize",
              "UNIDIRECTIONAL_SEQUENCE_LSTM": "recurrent", "LSTM": "recurrent", "UNIDIRECTIONAL_SEQUENCE_RNN": "recurrent",
              "BIDIRECTIONAL_SEQUENCE_LSTM": "recurrent", "BIDIRECTIONAL_SEQUENCE_RNN": "recurrent", "RNN": "recurrent"}


def op_class(op: Op) -> str:
    return OP_CLASSES.get(op.opcode, "elementwise")


def cost_class(op: Op) -> str:
    """The op's class and, where it computes in integers or on quantized weights, its kind ("conv/int8",
    "conv/int16", "matmul/hybrid"): engines run those through other kernels (LiteRT's int16 kernels are
    reference loops, tens of times slower); a float layout op moving its data in runs shorter than
    SHORT_RUN_BYTES on average is the kind "strided" (see ``contiguous_runs``).  A fit without the kind falls
    back to the class alone."""
    x = op.inputs[0] if op.inputs else None
    kind = ""
    if x is not None and x.dtype.name in ("int8", "uint8", "int16"):
        kind = "int16" if x.dtype.name == "int16" else "int8"
    elif x is not None and x.dtype.name.startswith("float") and any(
            t is not None and t.is_constant and t.dtype.name == "int8" and t.quantization for t in op.inputs[1:]):
        kind = "hybrid"
    elif op_class(op) == "layout" and op.outputs and 1 < (runs := contiguous_runs(op)) and \
            op.outputs[0].nbytes < SHORT_RUN_BYTES * runs:
        kind = "strided"
    return f"{op_class(op)}/{kind}" if kind else op_class(op)


# a copy in contiguous runs shorter than this on average costs per run more than per byte
SHORT_RUN_BYTES = 1024


def contiguous_runs(op: Op) -> int:
    """How many contiguous pieces a layout op copies its data in: 1 for a RESHAPE or a CONCATENATION of whole
    blocks, a piece per pixel for a PAD, CONCATENATION or SPLIT along the channels, many for a TRANSPOSE.
    Engines copy piece by piece: on an H100 host LiteRT's channel PADs of MediaPipe's detectors took 10-130 us
    at 16 threads for rooflines of 0.3-5.5 us, its RESHAPEs about their roofline."""
    data = [t for t in op.inputs if t is not None and not t.is_constant]
    out = op.outputs[0] if op.outputs else None
    if not data or out is None or not out.shape:
        return 1
    x = max(data, key=lambda t: t.size)
    code, rank = op.opcode, len(out.shape)
    if code == "TRANSPOSE":
        perm = op.inputs[1].data if len(op.inputs) > 1 and op.inputs[1] is not None else None
        moved = perm is None or list(np.asarray(perm).reshape(-1)) != list(range(rank))
        return max(out.size // max(out.shape[-1], 1), 1) if moved else 1
    if code in ("CONCATENATION", "PACK"):
        axis = int(op.options.get("axis", 0)) % rank
        return int(np.prod(out.shape[:axis], dtype=np.int64))
    if code == "GATHER":
        axis = int(op.options.get("axis", 0)) % max(len(x.shape), 1)
        return max(out.size // max(int(np.prod(x.shape[axis + 1:], dtype=np.int64)), 1), 1)
    if len(x.shape) != rank:  # UNPACK, or a RESHAPE: whole blocks either way but for UNPACK's inner axes
        axis = int(op.options.get("axis", 0)) % max(len(x.shape), 1) if code == "UNPACK" else 0
        return int(np.prod(x.shape[:axis], dtype=np.int64))
    # PAD, SLICE, SPLIT...: pieces of the innermost axis whose extent changes, one per position of the axes before
    changed = [k for k in range(rank) if x.shape[k] != out.shape[k]]
    return int(np.prod(out.shape[:changed[-1]], dtype=np.int64)) if changed else 1


@dataclass
class DeviceProfile:
    """Throughput and transfer figures of one backend on one device.

    An op's own work is ``class_floor_us + roofline * class_scale`` for its class: fitted from measured op
    and partition times (``refit``), so that the estimates of models never measured improve too (the
    floor is a kernel's least duration on a device; the scale corrects the roofline).  On an
    ``asynchronous`` device the host enqueues the next kernel while the device runs this one, so an
    op costs the larger of its launch and its work; on the host they add up."""

    gflops: float  # sustained arithmetic throughput
    gbytes_per_s: float  # memory bandwidth seen by kernels
    launch_us: float  # fixed cost per op (dispatch, Python overhead)
    partition_us: float = 0.0  # fixed cost per partition run: submission, queue drain, engine call
    # inside a whole plan, beyond its partitions timed alone (``refit_plan``): the host's fixed cost of one
    # run (the executor's checks and staging), and each partition's cost at its boundaries (uploads of its
    # inputs, the wait for the device)
    run_us: float = 0.0
    boundary_us: float = 0.0
    transfer_latency_us: float = 0.0  # fixed cost per host<->device copy
    transfer_gbytes_per_s: float = float("inf")  # host<->device bandwidth
    class_scale: dict[str, float] = field(default_factory=dict)
    class_floor_us: dict[str, float] = field(default_factory=dict)
    # the largest roofline (ms) among the ops a class's line was fitted to: beyond it the fitted slope is not
    # extrapolated (``roofline_work_ms``)
    class_reach_ms: dict[str, float] = field(default_factory=dict)
    # how many times slower than its class's fitted figure an engine's kernel of one kind is, where no
    # measurement of that kind was fitted ("conv/int16", or "int16" for every class): the backend's own
    # knowledge of its kernels (LiteRT's int16x8 kernels are reference loops), never fitted or stored
    kind_scale: dict[str, float] = field(default_factory=dict)
    # the kinds whose kernels run on one thread whatever the thread count (LiteRT's reference loops): at n
    # threads they are as many times further from a throughput measured or scaled at n threads as the n
    # threads are faster than one (``thread_speedup``, else n)
    serial_kinds: tuple[str, ...] = ()
    # a host calibrated at n threads: how many times faster its matrix products ran than at one thread
    # (0: not measured; the serial kinds then count n)
    thread_speedup: float = 0.0
    # a host's figures of one thread, for a plan at ``threads``: an op's roofline is shared among as many
    # threads as each gets ``thread_grain_us`` of it (an engine splits an op into tiles, and a small op's
    # tiles do not fill a team), never more than ``threads``; 1: the figures are those of the plan's threads
    threads: int = 1
    thread_grain_us: float = 0.0
    # what a kernel spends, per input channel, on an op of each fold kind (``WORKING_FOLDS``) it computes while
    # reading it (fitted: ``refit``); a kind never fitted costs nothing beyond its reader's own estimate
    folded_channel_us: dict[str, float] = field(default_factory=dict)
    fit_points: dict[str, list[list[Any]]] = field(default_factory=dict)  # the measurements behind the fit
    asynchronous: bool = False
    measured_op_ms: dict[str, float] = field(default_factory=dict)  # op signature -> measured ms
    calibrated_at: str = ""  # when ``delegate calibrate`` measured the figures above ("" = defaults)
    # figures calibrate could not measure stably, kept at the backend's defaults: figure -> why
    defaults_kept: dict[str, str] = field(default_factory=dict)
    fitted_at: str = ""  # when measurements last refitted ``class_scale``/``partition_us``
    fit_samples: int = 0  # measurements behind the fit
    source: str = "default"  # "default (WHAT)" or the file it was read from
    borrowed_from: str = ""  # never measured: the figures are this other backend's (``borrowed``) until a fit

    def compute_ms(self, flops: float, nbytes: float, klass: str | None = None, steps: int = 1) -> float:
        """``steps``: the op's dependent kernel steps (``op_steps``), each paying the class's floor."""
        return self.kernel_ms(self.roofline_ms(flops, nbytes, klass), klass, steps)

    def kernel_ms(self, roof: float, klass: str | None, steps: int = 1) -> float:
        """An op of roofline ``roof`` ms: its class's work and its launch (see the class docstring)."""
        work = self.floor_ms(klass) * steps + self.roofline_work_ms(roof, klass)
        launch = self.launch_us * 1e-3
        return max(launch, work) if self.asynchronous else launch + work

    def folded_ms(self, kind: str, channels: float) -> float:
        """What an op folded into its reader's kernel (``kind``: ``passes.folded_into``) adds to that kernel."""
        return self.folded_channel_us.get(kind, 0.0) * channels * 1e-3

    def floor_ms(self, klass: str | None) -> float:
        return _fitted(self.class_floor_us, klass, 0.0) * 1e-3

    def roofline_ms(self, flops: float, nbytes: float, klass: str | None = None) -> float:
        """The op's roofline on the threads it gets (``threads``; one for a ``serial_kinds`` kernel)."""
        roof = max(flops / (self.gflops * 1e9), nbytes / (self.gbytes_per_s * 1e9)) * 1e3
        if self.threads <= 1 or self.serial(klass):
            return roof
        share = roof * 1e3 / self.thread_grain_us if self.thread_grain_us > 0 else self.threads
        return roof / min(max(share, 1.0), self.threads)

    def serial(self, klass: str | None) -> bool:
        """Whether the engine runs ``klass``'s kernels on one thread whatever the thread count."""
        return bool(klass) and (klass in self.serial_kinds or klass.partition("/")[2] in self.serial_kinds)

    def roofline_work_ms(self, roof: float, klass: str | None) -> float:
        """The roofline part of an op's work: its class's scale up to the largest op the class was fitted to,
        and beyond that the roofline itself (times its kind's known slowness): a slope fitted on small ops is
        mostly their overheads (the H200's LiteRT MEANs: 5-36 us for rooflines of 0.01-0.24 us gave a scale
        of 85, and MobileNetV2's 1.8 us MEAN an estimate of 84 us for the 5 it took).  On a host whose profile
        is at n threads, a class slower than its roofline goes on at one thread's roofline at least (its
        ``thread_speedup``): the H100 host's LiteRT BATCH_MATMULs at 16 threads ran 25x their roofline for ops
        far beyond the small ones fitted (vit_tiny_block's: 54 us each, estimated 13: the plan at 0.75x)."""
        scale = self.scale(klass)
        reach = _fitted(self.class_reach_ms, klass, float("inf"))
        if roof <= reach:
            return roof * scale
        return reach * scale + (roof - reach) * min(scale, max(self.kind_factor(klass), self.thread_speedup))

    def scale(self, klass: str | None) -> float:
        """The fitted correction of a class's roofline ("*": fitted on whole partitions, for all classes); a kind
        not fitted itself ("conv/int16") costs its class's times the kind's ``kind_scale``."""
        if klass in self.class_scale:
            return self.class_scale[klass]
        return _fitted(self.class_scale, klass, 1.0) * self.kind_factor(klass)

    def kind_factor(self, klass: str | None) -> float:
        if not klass or "/" not in klass:
            return 1.0
        return self.kind_scale.get(klass, self.kind_scale.get(klass.split("/", 1)[1], 1.0))

    def transfer_ms(self, nbytes: int) -> float:
        if self.transfer_gbytes_per_s == float("inf"):
            return 0.0
        return self.transfer_latency_us * 1e-3 + nbytes / (self.transfer_gbytes_per_s * 1e9) * 1e3

    def describe(self) -> str:
        """Which figures the planner used: defaults, or a calibrated/fitted file and its dates."""
        if self.borrowed_from:
            return f"not measured; {self.borrowed_from}'s figures ({self.source})"
        if not self.calibrated_at and not self.fitted_at:
            return self.source
        parts = [f"calibrated {self.calibrated_at}" if self.calibrated_at else "default figures"]
        if self.defaults_kept:
            parts[0] += f" (defaults kept for {', '.join(sorted(self.defaults_kept))})"
        if self.fitted_at:
            parts.append(f"refitted {self.fitted_at} from {self.fit_samples} measurement(s)")
        return ", ".join(parts) + f" ({self.source})"


def _fitted(values: Mapping[str, float], klass: str | None, default: float) -> float:
    """A fitted figure of ``klass`` ("conv/int8"), else of its class ("conv"), else of all ("*")."""
    for key in (klass or "", (klass or "").split("/")[0], "*"):
        if key in values:
            return values[key]
    return default


# The figures of an uncalibrated accelerator whose plugin contributes none (``Backend.default_profile``).
# Deliberately conservative: an uncalibrated GPU must win clearly before ops move there.
ACCELERATOR_DEFAULT = DeviceProfile(gflops=500.0, gbytes_per_s=100.0, launch_us=10.0, partition_us=50.0,
                                    transfer_latency_us=50.0, transfer_gbytes_per_s=5.0, asynchronous=True,
                                    source="default (accelerator)")


def _conv_flops(op: Op) -> float:
    out = op.outputs[0]
    w = op.input(1)
    if w is None or len(w.shape) != 4:
        return float(out.size)
    if op.opcode == "DEPTHWISE_CONV_2D":
        return 2.0 * out.size * w.shape[1] * w.shape[2]
    # CONV_2D weights OHWI: per output element kh*kw*ci multiply-adds
    return 2.0 * out.size * int(np.prod(w.shape[1:]))


# Arithmetic per element of the elementwise ops that evaluate a function (a polynomial or a division per
# element, as the vector kernels of every engine do), against one for an add: without it a sigmoid costs what
# an add costs (MediaPipe's selfie segmentation: eleven LOGISTIC ops estimated at a twelfth of their time).
FLOPS_PER_ELEMENT = {"LOGISTIC": 12.0, "TANH": 12.0, "EXP": 10.0, "LOG": 10.0, "GELU": 16.0, "ELU": 10.0,
                     "HARD_SWISH": 4.0, "SIN": 12.0, "COS": 12.0, "POW": 20.0, "SQRT": 4.0, "RSQRT": 4.0,
                     "DIV": 4.0, "FLOOR_DIV": 4.0, "FLOOR_MOD": 6.0, "LOG_SOFTMAX": 12.0}
SEQUENCE_OPS = ("UNIDIRECTIONAL_SEQUENCE_LSTM", "UNIDIRECTIONAL_SEQUENCE_RNN", "BIDIRECTIONAL_SEQUENCE_LSTM",
                "BIDIRECTIONAL_SEQUENCE_RNN")


def op_steps(op: Op) -> int:
    """Dependent kernel steps the op runs one after the other: the time steps of a sequence RNN (each a small
    product waiting for the last), else 1.  Each pays its class's floor (LiteRT's sequence LSTM: ~40 us for 4
    steps of a product the roofline puts at 3 us)."""
    x = op.input(0)
    if op.opcode not in SEQUENCE_OPS or x is None or len(x.shape) != 3:
        return 1
    return max(int(x.shape[0] if op.options.get("time_major") else x.shape[1]), 1)


def op_flops(op: Op) -> float:
    """Approximate floating-point operations of one op."""
    code = op.opcode
    if code in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        return _conv_flops(op)
    if code in ("TRANSPOSE_CONV", "Convolution2DTransposeBias"):
        w = op.input(1)
        x = op.input(2) if code == "TRANSPOSE_CONV" else op.input(0)
        if w is None or x is None or len(w.shape) != 4:
            return float(op.outputs[0].size) if op.outputs else 0.0
        return 2.0 * x.size * int(np.prod(w.shape[:3]))
    if code == "FULLY_CONNECTED":
        w = op.input(1)
        return 2.0 * op.outputs[0].size * (w.shape[-1] if w is not None and w.shape else 1)
    if code == "BATCH_MATMUL":
        a = op.input(0)
        if a is None or len(a.shape) < 2:
            return float(op.outputs[0].size)
        k = a.shape[-2] if op.options.get("adj_x") else a.shape[-1]
        return 2.0 * op.outputs[0].size * k
    if code in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        return float(op.outputs[0].size * op.options.get("filter_height", 1) * op.options.get("filter_width", 1))
    if code in ("UNIDIRECTIONAL_SEQUENCE_LSTM", "LSTM"):
        x, w = op.input(0), op.input(1)
        n_cell = w.shape[0] if w is not None and w.shape else 1
        return 8.0 * (x.size if x is not None else 0) * n_cell + 8.0 * op.outputs[0].size * n_cell
    out = sum(t.size for t in op.outputs)
    ins = sum(t.size for t in op.inputs if t is not None)
    return float(max(out, ins)) * FLOPS_PER_ELEMENT.get(code, 1.0)


def fold_group_costs(costs: dict[int, dict[str, float]], folded: Mapping[str, Mapping[int, float]]) -> None:
    """A fused group costs one kernel, its anchor's: on each backend, the ops it folds into their group's
    anchor (``folded[backend]``: op index -> ms; constants it computes at compile time among them) cost
    only what they add to that kernel (``DeviceProfile.folded_ms``), most of them nothing."""
    for backend, fold_ms in folded.items():
        for index, ms in fold_ms.items():
            if backend in costs.get(index, {}):
                costs[index][backend] = ms


def op_bytes(op: Op) -> float:
    """Bytes an op reads and writes (weights included)."""
    return float(sum(t.nbytes for t in op.inputs if t is not None) + sum(t.nbytes for t in op.outputs))


@dataclass
class Observation:
    """One partition measured on its backend: its ops, its time, and its ops' times where measured.

    ``transfer_ms``: the part of ``ms`` spent moving its inputs and outputs (estimated), which the fit of
    the partition's own overhead leaves out."""

    ops: list[Op]
    ms: float
    op_ms: dict[int, float] = field(default_factory=dict)
    op_times_include_launch: bool = True  # host timers do; device events time the kernel alone
    op_times_alone: bool = False  # each op timed run alone, outside the partition: they give its share
    transfer_ms: float = 0.0
    # anchor op index -> (fold kind, input channels) of each working fold its kernel computes (``folds_of``):
    # its time is its own class's work and theirs
    folds: dict[int, list[tuple[str, float]]] = field(default_factory=dict)


# the fold kinds whose folded op still does its work inside its reader's kernel (a depthwise convolution
# computed while a 1x1 convolution stages its input; a 1x1 convolution of one pixel run with the next): each
# costs what ``DeviceProfile.folded_channel_us`` fits.  The other folds (pads, gates, reshapes, activations,
# constants) become addressing or an epilogue and cost nothing.
WORKING_FOLDS = ("depthwise_pointwise", "chain")


def folds_of(ops: Sequence[Op], folded: Mapping[int, tuple[int, str]]) -> dict[int, list[tuple[str, float]]]:
    """Per anchor (op index), its working folds among ``ops``: ``folded`` is ``passes.folded_into``'s map."""
    folds: dict[int, list[tuple[str, float]]] = {}
    for op in ops:
        anchor, kind = folded.get(op.index, (None, ""))
        if kind in WORKING_FOLDS:
            folds.setdefault(anchor, []).append((kind, input_channels(op)))
    return folds


def input_channels(op: Op) -> float:
    """The channels (last axis) of the op's first input: what a working fold's cost is counted in."""
    x = op.inputs[0] if op.inputs else None
    return float(x.shape[-1]) if x is not None and x.shape else 0.0


# a fitted correction beyond this is a broken measurement, not a device (scalar reference loops, LiteRT's
# int16x8 kernels, run ~100x below a core's vector peak)
SCALE_RANGE = (0.02, 200.0)
MAX_POINTS = 300  # measurements kept per class for the fit (the oldest go first)
QUEUED = "queued partition"  # whole partitions of an asynchronous device, with their kernels' device times
WHOLE = "*"  # the class of partitions timed only as a whole: one floor per op and one scale for all classes
BY_CLASS = "* by class"  # the same partitions, their ops counted per cost class: a floor and scale per class
CLASS_PRIOR = 0.5  # the fit for all classes counts as this many partitions of each class (``_class_fit``)
FIXED_SHARE = 0.1  # ops whose roofline is less than this share of their time are timed at their fixed cost
# a class's scale is fitted from partitions timed whole only where its roofline is at least this share of one
# partition's time (on the H200's calibration: fitted from any share, LiteRT's estimates were 2x off or worse
# for 4 of 25 models, vit_tiny_block_int8 13x; from 5%, for 3, the worst 2.7x)
SCALE_SHARE = 0.05
# how far the sums of a class's measured ops may move its line (``_sum_matched``): beyond, the line's points
# are not one kind of op
SUM_MATCH_RANGE = (0.5, 2.5)
PLAN = "plan"  # whole plans against their partitions timed alone: ``run_us`` and ``boundary_us``
FOLDED = "folded"  # kernels computing working folds (``WORKING_FOLDS``) with their anchor: ``folded_channel_us``
RUN_PRIOR_MS = 1.0  # no host run cost weighs as much as one plan of this time (``refit_plan``)
# a class's line through ops timed one by one has a floor of its own (and on the host gives the launch) only where
# its smallest op's roofline is at most this: fixed costs are microseconds, and a line through large ops only
# extrapolates one (MobileNetV2's convolutions timed by the numpy engine at 2 threads, rooflines of 17-380 us,
# drew a start of 37 us that iris_landmark's 55 small ones, 1-5 us, then paid in full: 3x its time)
FLOOR_REACH_MS = 0.005


def refit(profile: DeviceProfile, observations: Sequence[Observation], free: Callable[[Op], bool],
          classify: Callable[[Op], str] = cost_class) -> int:
    """Add ``observations`` to the profile's measurements and refit ``class_floor_us``, ``class_scale`` and
    ``partition_us`` to all it keeps; returns how many new measurements there were.

    Per op class, a line through the ops measured one by one: work = floor + scale * roofline (on the host,
    whose timers include each op's launch, the launch is the least of the classes' lines at zero work: the
    figure the chains of ``calibrate`` measured is not what ops cost inside a network).  Partitions
    timed only as a whole (the LiteRT engine) give one line for every class: work = ops * floor + scale *
    roofline.  Least squares over everything kept, so each measurement improves estimates of models never
    measured.  ``free``: ops the backend never runs (folded), which carry no time; ``classify``: the backend's
    class of an op (``Backend.cost_class``)."""
    launch = profile.launch_us * 1e-3
    points = profile.fit_points
    added = 0
    for obs in observations:
        counted = [op for op in obs.ops if not free(op)]
        if obs.op_ms:
            own = obs.ms - obs.transfer_ms
            # the ops the backend folds take no part: timed alone they cost what they never cost in the run
            timed = sum(obs.op_ms.get(op.index, 0.0) for op in counted)
            # timers that add up to more than the partition took disturbed what they timed (a Python call per
            # op where the engine runs a batched call, or a timer of coarse resolution): they give each op's
            # share of the partition's own time; so do ops timed alone (LiteRT's engine), either way: alone, an
            # op runs on warm caches and a warm thread pool, inside a network it does not.  A device's profiling
            # events are held to the partition's whole time, its estimated transfers included (the H200's OpenCL
            # kernels summed to up to 3x it; the estimate of its transfers may be most of a small one's time)
            if obs.op_times_include_launch or obs.op_times_alone:
                target = own if (obs.op_times_alone and timed > 0 < own) or timed > own > 0 else timed
            else:
                target = obs.ms if timed > obs.ms > 0 else timed
            shares = _apportioned({op.index: obs.op_ms[op.index] for op in counted if op.index in obs.op_ms}, target,
                                  obs.op_times_alone)
            for op in counted:
                roof = profile.roofline_ms(op_flops(op), op_bytes(op), classify(op))
                measured = shares.get(op.index)
                if measured is None or roof <= 0:
                    continue
                if op.index in obs.folds:  # the anchor's class's line is its own work: fitted without it
                    points.setdefault(FOLDED, []).append([classify(op), float(op_steps(op)), roof, measured,
                                                          *(x for fold in obs.folds[op.index] for x in fold)])
                    added += 1
                    continue
                # the host's times keep their launch: refit finds it (see above)
                points.setdefault(classify(op), []).append([float(op_steps(op)), roof, measured])
                added += 1
            if obs.op_times_include_launch:  # host timers: the partition's overhead is what they leave out
                points.setdefault("partition", []).append([own - sum(shares.values())])
            else:  # device events: the host's launches overlap the kernels, fitted over whole partitions
                points.setdefault(QUEUED, []).append([own, *(shares.get(op.index, 0.0) for op in counted)])
            added += 1
        elif counted:  # timed whole: its own fixed cost, a floor per op and a scale, fitted over partitions
            roofs = [profile.roofline_ms(op_flops(op), op_bytes(op), classify(op)) for op in counted]
            own = max(obs.ms - obs.transfer_ms - launch * len(counted), 0.0)
            # the scale for all classes is the one of float kernels: the slow kinds' rooflines count as many
            # times as their kernels are slower
            kinds = sum(roof * profile.kind_factor(classify(op)) for op, roof in zip(counted, roofs))
            points.setdefault(WHOLE, []).append([float(sum(op_steps(op) for op in counted)), kinds, own])
            classes: dict[str, list[float]] = {}
            for op, roof in zip(counted, roofs):
                entry = classes.setdefault(classify(op), [0.0, 0.0])
                entry[0] += op_steps(op)
                entry[1] += roof
            points.setdefault(BY_CLASS, []).append([own, *(x for k, (n, r) in sorted(classes.items())
                                                           for x in (k, n, r))])
            added += 1
    lines: dict[str, np.ndarray] = {}  # the host's ops timed one by one, per class: fitted after the loop
    for klass in list(points):
        del points[klass][:-MAX_POINTS]
        if klass in (BY_CLASS, PLAN, FOLDED):
            continue  # fitted after the one for all classes, which it is held to; whole plans by refit_plan;
            # folds once their anchors' classes are
        if klass == QUEUED:
            profile.launch_us, profile.partition_us = _queued_fit(points[klass])
            continue
        rows = np.array(points[klass], dtype=np.float64)
        if klass == "partition":
            profile.partition_us = max(float(np.median(rows[:, 0])) * 1e3, 0.0)
            continue
        if klass == WHOLE:
            fixed, floor, scale = _whole_fit(rows, profile)
            profile.partition_us = fixed * 1e3
            profile.class_floor_us[klass], profile.class_scale[klass] = floor * 1e3, scale
            continue
        profile.class_reach_ms[klass] = float(rows[:, 1].max())
        if profile.asynchronous:  # device events: the kernel alone
            floor, scale = _line(rows[:, 0], rows[:, 1], rows[:, 2], profile.floor_ms(klass), profile.scale(klass))
            profile.class_floor_us[klass], profile.class_scale[klass] = floor * 1e3, scale
        else:
            lines[klass] = rows
    if lines:  # the classes whose points draw a line set the launch; the others are fitted on top of it
        fitted = {k: _line(r[:, 0], r[:, 1], r[:, 2], 0.0) for k, r in lines.items()
                  if _spread(r[:, 1]) and r[:, 1].min() <= FLOOR_REACH_MS}
        # the launch is paid once an op: a line's start is one where its ops are one step each (an LSTM's
        # start is its floor per step)
        launch = min((start for k, (start, _) in fitted.items() if np.all(lines[k][:, 0] == 1)), default=launch)
        profile.launch_us = launch * 1e3
        for klass, rows in lines.items():
            start, scale = fitted.get(klass) or _line(rows[:, 0], rows[:, 1], rows[:, 2],
                                                      launch + profile.floor_ms(klass), profile.scale(klass))
            # the line's start is a step's floor plus the op's launch spread over its steps
            floor, scale = _sum_matched(rows, launch, max(start - launch / float(np.median(rows[:, 0])), 0.0), scale)
            profile.class_floor_us[klass], profile.class_scale[klass] = floor * 1e3, scale
    if points.get(BY_CLASS) and WHOLE in points:
        for key, (floor, scale) in _class_fit(points[BY_CLASS], profile).items():
            profile.class_floor_us[key], profile.class_scale[key] = floor * 1e3, scale
    if points.get(FOLDED):
        profile.folded_channel_us = _folded_fit(points[FOLDED], profile)
    if added:
        _fitted_now(profile, added)
    return added


def _folded_fit(rows: Sequence[Sequence[Any]], profile: DeviceProfile) -> dict[str, float]:
    """Microseconds per input channel of each working fold kind: what the kernels computing them took beyond
    their anchor's own estimate (rows: anchor class, steps, roofline, measured ms, then kind, channels pairs),
    least squares, none negative.  On an H100's OpenCL a 1x1 convolution computing a 3x3 depthwise one took
    ~0.4 us more per input channel, 9-42 us in all, where its own estimate was 9-14 us."""
    kinds = sorted({row[i] for row in rows for i in range(4, len(row), 2)})
    design = np.zeros((len(rows), len(kinds)))
    beyond = np.zeros(len(rows))
    for r, row in enumerate(rows):
        klass, steps, roof, ms = row[:4]
        beyond[r] = ms - profile.kernel_ms(roof, klass, int(steps))
        for i in range(4, len(row), 2):
            design[r, kinds.index(row[i])] += row[i + 1]
    per_channel, *_ = np.linalg.lstsq(design, beyond, rcond=None)
    return {kind: max(float(c), 0.0) * 1e3 for kind, c in zip(kinds, per_channel)}


def _apportioned(op_ms: Mapping[int, float], total: float, alone: bool) -> dict[int, float]:
    """Op times brought to sum to ``total``, the partition's own time, by scaling; ops timed ``alone`` beyond it
    first lose their excess as a cost common to every op, at most half an op's time: each paid a whole engine
    call of its own (LiteRT: 1-3 us, where a small transformer's ops take 0.4 us inside the network), and scaling
    alone took that off large ops in proportion (the transformer's matrix products came out at a third of
    their time)."""
    timed = sum(op_ms.values())
    if timed <= 0 or total <= 0:
        return dict(op_ms)
    if timed > total and alone:
        common = (timed - total) / len(op_ms)
        op_ms = {i: ms - min(common, 0.5 * ms) for i, ms in op_ms.items()}
        timed = sum(op_ms.values())
    return {i: ms * total / timed for i, ms in op_ms.items()}


def _fitted_now(profile: DeviceProfile, added: int) -> None:
    profile.borrowed_from = ""  # its own now
    profile.fit_samples += added
    profile.fitted_at = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")


def refit_plan(profiles: Mapping[str, DeviceProfile], host: str, plan_ms: float,
               partitions: Sequence[tuple[str, float]]) -> None:
    """Learn what a whole plan costs beyond its partitions timed alone: ``plan_ms``, the plan's measured
    time, against ``partitions``, (backend, ms) of each partition timed alone.  A plan on the host alone
    gives the host's ``run_us``; one with accelerator partitions gives their ``boundary_us``, what is left
    once the host's run cost is taken off, per partition of theirs.  Medians over the plans kept: one
    disturbed timing does not move them.  The host's weighs each plan by the inverse square of its time (a
    plan's jitter grows with its time, and the run cost is a sliver of a large plan's), against no run cost
    weighed as one plan of RUN_PRIOR_MS: a large plan's gap alone (MobileNetV2's numpy plan on the H100's host
    at 2 threads: 0.63 ms of 5.35, its partition timed alone after runs alternating with LiteRT) is not every
    plan's run cost (iris_landmark's estimate then came out at 3.5x its time)."""
    gap = plan_ms - sum(ms for _, ms in partitions)
    counts: dict[str, int] = {}
    for backend, _ in partitions:
        counts[backend] = counts.get(backend, 0) + 1
    accelerators = [b for b in counts if b != host]
    if not accelerators:
        profiles[host].fit_points.setdefault(PLAN, []).append([gap, plan_ms])
    for backend in accelerators:
        profiles[backend].fit_points.setdefault(PLAN, []).append([gap, counts[backend]])
    for backend in accelerators or [host]:
        _fitted_now(profiles[backend], 1)
    run = profiles[host]
    if run.fit_points.get(PLAN):
        del run.fit_points[PLAN][:-MAX_POINTS]
        rows = run.fit_points[PLAN]
        weights = [1.0 / max(r[1] if len(r) > 1 else 1.0, 0.01) ** 2 for r in rows]
        run.run_us = max(_weighted_median([0.0] + [r[0] for r in rows], [RUN_PRIOR_MS ** -2] + weights), 0.0) * 1e3
    for backend in accelerators:
        rows = profiles[backend].fit_points[PLAN]
        del rows[:-MAX_POINTS]
        profiles[backend].boundary_us = max(float(np.median([(r[0] - run.run_us * 1e-3) / r[1] for r in rows])),
                                            0.0) * 1e3


def _weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    order = np.argsort(values)
    cumulative = np.cumsum(np.asarray(weights, dtype=np.float64)[order])
    return float(np.asarray(values, dtype=np.float64)[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


def _queued_fit(partitions: list[list[float]]) -> tuple[float, float]:
    """(launch us, partition us) of an asynchronous device from whole partitions: each took
    ``partition + sum(max(launch, kernel))`` over its kernels' device times; the launch (the host's cost of
    one kernel) found by a search over a log grid, the partition overhead as the median rest."""
    best = None
    for launch in np.geomspace(0.5e-3, 0.5, 160):
        predicted = np.array([sum(max(launch, k) for k in p[1:]) for p in partitions])
        totals = np.array([p[0] for p in partitions])
        overhead = max(float(np.median(totals - predicted)), 0.0)
        error = float(np.sum(((overhead + predicted - totals) / np.maximum(totals, 1e-6)) ** 2))
        if best is None or error < best[0]:
            best = (error, launch, overhead)
    return best[1] * 1e3, best[2] * 1e3


def _whole_fit(rows: np.ndarray, profile: DeviceProfile) -> tuple[float, float, float]:
    """(partition ms, floor ms per op, scale) with time ~ partition + ops * floor + scale * roofline over
    partitions timed whole: the fixed cost shows in small partitions, the floor and scale in large ones.
    Non-negative least squares (the coefficients that come out negative are dropped and the rest refit);
    with fewer than four partitions the scale alone, the rest kept."""
    counts, roofs, times = rows[:, 0], rows[:, 1], rows[:, 2]
    fixed, floor, scale = profile.partition_us * 1e-3, profile.floor_ms(WHOLE), profile.scale(WHOLE)
    # only partitions whose roofline (at the device's peak) is a fair share of their time say anything
    # about the scale; a tiny model's time is all fixed costs
    telling = roofs >= FIXED_SHARE * times
    if len(times) < 4:
        if not telling.any():
            return fixed, floor, scale
        # the ratio of the sums: the scale that explains the most time (a partition of a few microseconds,
        # mostly fixed costs, must not weigh as much as one of milliseconds)
        rest = np.maximum(times - fixed - counts * floor, 0.0)[telling]
        return fixed, floor, float(np.clip(rest.sum() / roofs[telling].sum(), *SCALE_RANGE))
    columns = np.stack([np.ones_like(counts), counts, roofs], 1)
    weight = 1.0 / np.maximum(times, 0.05)  # relative errors: a plan's estimate is judged against its own time

    def nonnegative(keep: list[int], target: np.ndarray) -> dict[int, float]:
        while True:
            coef, *_ = np.linalg.lstsq(columns[:, keep] * weight[:, None], target * weight, rcond=None)
            if (coef >= 0).all() or len(keep) == 1:
                return dict(zip(keep, np.maximum(coef, 0.0)))
            keep.pop(int(np.argmin(coef)))
    fitted = nonnegative([0, 1, 2] if telling.sum() >= 2 else [0, 1], times)
    # a partition's fixed cost is at most half the least time a partition took: time the fit leaves
    # unexplained (kernels slower than their kind says) must not become a fixed cost every partition pays
    bound = 0.5 * float(times.min())
    if fitted.get(0, 0.0) > bound:
        fitted = {0: bound, **nonnegative([1, 2] if 2 in fitted else [1], times - bound)}
    if 2 not in fitted:
        return float(fitted.get(0, 0.0)), float(fitted.get(1, 0.0)), scale
    return float(fitted.get(0, 0.0)), float(fitted.get(1, 0.0)), float(np.clip(fitted.get(2, SCALE_RANGE[0]),
                                                                                 *SCALE_RANGE))


def _class_fit(rows: list[list[Any]], profile: DeviceProfile) -> dict[str, tuple[float, float]]:
    """(floor ms, scale) per cost class from partitions timed whole, each row ``[own ms, class, ops, roofline
    ms, class, ...]``: time ~ partition + sum over classes (ops * floor + scale * roofline), least squares on
    relative errors, every coefficient held towards the fit for all classes, a kind's scale towards that times
    its ``kind_scale`` (a ridge weighed as CLASS_PRIOR partitions of the class: evidence outweighs it as it
    accumulates), none negative."""
    fixed, floor, scale = profile.partition_us * 1e-3, profile.floor_ms(WHOLE), profile.scale(WHOLE)
    keys = sorted({row[i] for row in rows for i in range(1, len(row), 3)})
    column = {k: i for i, k in enumerate(keys)}
    x = np.zeros((len(rows), 2 * len(keys)))
    times = np.array([float(row[0]) for row in rows])
    for r, row in enumerate(rows):
        for i in range(1, len(row), 3):
            x[r, column[row[i]]], x[r, len(keys) + column[row[i]]] = row[i + 1], row[i + 2]
    prior = np.array([floor] * len(keys) + [scale * profile.kind_factor(k) for k in keys])
    # a class whose roofline is a sliver of every partition's time says nothing about its scale (its time
    # there is floors and fixed costs): held at the prior, or a small transformer's elementwise int8 ops
    # take a scale of 70 that a large one's then pays in full (SCALE_SHARE)
    share = (x[:, len(keys):] / np.maximum(times, 1e-9)[:, None]).max(axis=0)
    silent = len(keys) + np.flatnonzero(share < SCALE_SHARE)
    weight = 1.0 / np.maximum(times, 0.05)
    times = times - x[:, silent] @ prior[silent]
    x[:, silent] = 0.0
    x *= weight[:, None]
    # one row of the prior per coefficient, as strong as CLASS_PRIOR partitions of its class: a class seen in
    # one partition moves most of the way to what that partition says, one seen in many is held by them
    typical = np.sqrt(np.array([np.mean(col[col > 0] ** 2) if (col > 0).any() else 1.0 for col in x.T]))
    held = np.sqrt(CLASS_PRIOR) * typical
    a = np.vstack([x, np.diag(held)])
    b = np.concatenate([(times - fixed) * weight, held * prior])
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    return {k: (max(float(coef[i]), 0.0), float(np.clip(coef[len(keys) + i], *SCALE_RANGE)))
            for i, k in enumerate(keys)}


def _sum_matched(rows: np.ndarray, launch: float, floor: float, scale: float) -> tuple[float, float]:
    """(floor, scale) of a host class's line, its work part rescaled so the line's sum over the class's
    measured ops is their measured sum: op times are skewed (a few ops run far above the line through the
    typical one), and a plan's estimate is a sum (on the H200's calibration the typical-op lines left the
    sums of elementwise ops 0.64x measured, of reductions 0.53x)."""
    counts, roofs, works = rows[:, 0], rows[:, 1], rows[:, 2]
    work = floor * counts.sum() + scale * roofs.sum()
    if work <= 0:
        return floor, scale
    factor = float(np.clip((works.sum() - launch * len(rows)) / work, *SUM_MATCH_RANGE))
    return floor * factor, float(np.clip(scale * factor, *SCALE_RANGE))


def _spread(roofs: np.ndarray) -> bool:
    """Whether ops' rooflines are many and varied enough to draw a line through (a floor and a scale)."""
    return len(roofs) >= 2 and roofs.max() > 4 * roofs.min()


def _line(counts: np.ndarray, roofs: np.ndarray, works: np.ndarray, floor: float,
          scale: float = 1.0) -> tuple[float, float]:
    """(floor per op, scale) with work ~ counts * floor + scale * roofs, both non-negative; with too few or too
    alike points, one of the two: the floor where the roofline is a sliver of the time (a GPU's 6 us for an
    elementwise op whose bytes take 0.01 us is its least kernel time, not a 600x slower memory), else the
    scale (the floor kept); ``scale`` is the class's scale so far (a kind's: its class's times its factor),
    kept where the floor is fitted: a kind measured only on small ops keeps its slowness for large ones.  A
    line whose smallest op is beyond FLOOR_REACH_MS keeps ``floor`` and fits the scale."""
    if _spread(roofs) and roofs.min() <= FLOOR_REACH_MS:
        # between absolute errors (the large ops dominate a sum) and relative ones (so do the many small)
        weight = 1.0 / np.sqrt(np.maximum(works, 1e-3))
        (f, k), *_ = np.linalg.lstsq(np.stack([counts, roofs], 1) * weight[:, None], works * weight, rcond=None)
        if f < 0:
            f, k = 0.0, float(np.dot(roofs, works) / np.dot(roofs, roofs))
        elif k < SCALE_RANGE[0]:
            k = SCALE_RANGE[0]
            f = float(np.median((works - k * roofs) / counts))
        return max(float(f), 0.0), float(np.clip(k, *SCALE_RANGE))
    if np.median(roofs) * scale < FIXED_SHARE * np.median(works):
        return max(float(np.median((works - scale * roofs) / counts)), 0.0), scale
    return floor, float(np.clip(np.median(np.maximum(works - counts * floor, 0.0) / roofs), *SCALE_RANGE))


def op_signature(op: Op) -> str:
    """Key of a measured per-op time: op code and shapes (not names), so it transfers between models."""
    shapes = ";".join(",".join(map(str, t.shape)) for t in op.inputs if t is not None)
    opts = json.dumps(op.options, sort_keys=True, default=str)
    return sha1(f"{op.opcode}|{shapes}|{opts}".encode()).hexdigest()[:16]


def profile_dir() -> Path:
    from platformdirs import user_cache_dir
    return Path(os.environ.get("DELEGATE_PROFILE_DIR") or Path(user_cache_dir("delegate")) / "profiles")


# The facts that identify a device and driver and do not change while it runs (free memory does).
STABLE_FACTS = ("backend", "engine", "platform", "device", "adapter", "vendor", "device_type", "backend_type",
                "adapter_type", "driver", "driver_version", "compute_units", "cpu_model", "cores", "threads")


def profile_info(backend: Any, threads: int) -> dict[str, Any]:
    """The facts a backend's profile is keyed by: the host's figures hold for one thread count only (a
    profile fitted at one thread is not the one of a plan at sixteen)."""
    info = backend.device_info()
    return {**info, "threads": max(int(threads or 1), 1)} if backend.role == "host" else info


def fingerprint(device_info: dict[str, Any]) -> str:
    """Key of a device's profile, from its stable facts only."""
    text = json.dumps({k: device_info[k] for k in STABLE_FACTS if k in device_info}, sort_keys=True, default=str)
    return sha256(text.encode()).hexdigest()[:20]


def load_profile(device_info: dict[str, Any], default: DeviceProfile) -> DeviceProfile:
    """The stored calibration of this device, or a fresh copy of ``default`` (its backend's)."""
    path = profile_dir() / f"{fingerprint(device_info)}.json"
    try:
        data = json.loads(path.read_text())
        profile = DeviceProfile(**{k: v for k, v in data.items() if k in DeviceProfile.__dataclass_fields__})
        profile.source = str(path)
        profile.kind_scale = dict(default.kind_scale)  # the backend's, never measured
        profile.serial_kinds = tuple(default.serial_kinds)
        _check_figures(profile)
        return profile
    except (OSError, ValueError, TypeError):
        return DeviceProfile(**asdict(default))  # asdict copies: refits never touch the default


def host_profile(backend: Any, threads: int) -> DeviceProfile:
    """The host backend's stored profile for this thread count, or its default, whose figures are one
    thread's, each op's roofline shared among the threads its size fills (``DeviceProfile.threads``).  A
    profile calibrated at ``threads`` has the threads' figures: its serial kinds are as many times further
    from them as the threads are faster than one (the calibrated ``thread_speedup``, else ``threads``)."""
    default = backend.default_profile()
    profile = load_profile(profile_info(backend, threads), default)
    if profile.source == default.source:
        profile.threads = max(int(threads or 1), 1)
        if profile.threads > 1:
            profile.source += f" shared by {threads} threads"
        return profile
    if profile.threads == 1:
        speedup = profile.thread_speedup or threads
        profile.kind_scale.update({k: profile.kind_scale[k] * speedup for k in profile.serial_kinds
                                   if k in profile.kind_scale})
    profile.source += f" at {threads} thread(s)"
    return profile


def measured(profile: DeviceProfile) -> bool:
    return bool(profile.calibrated_at or profile.fitted_at) and not profile.borrowed_from


def borrowed(profile: DeviceProfile, lender: DeviceProfile, lender_name: str) -> DeviceProfile:
    """The figures of ``lender``, a measured device of the same kind whose backend starts from the same
    defaults, for ``profile``, never measured: the defaults proved off by some factor on that device, and
    would be off by much the same here (the software devices behind OpenCL and WebGPU run on the same
    cores).  Without it an unmeasured device looks cheaper than every measured one.  Its own
    measurements are not borrowed: the first fit here starts from these figures, on its own points."""
    figures = asdict(lender)
    figures.update(fit_points={}, measured_op_ms={}, fit_samples=0, kind_scale=dict(profile.kind_scale),
                   serial_kinds=tuple(profile.serial_kinds), borrowed_from=lender_name, source=lender.describe())
    return DeviceProfile(**figures)


def _check_figures(profile: DeviceProfile) -> None:
    """A stored profile whose figures are not positive numbers is not used (ValueError)."""
    for name in ("gflops", "gbytes_per_s", "transfer_gbytes_per_s"):
        value = getattr(profile, name)
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} = {value!r}")
    for name in ("launch_us", "partition_us", "transfer_latency_us", "run_us", "boundary_us"):
        value = getattr(profile, name)
        if not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            raise ValueError(f"{name} = {value!r}")
    if not all(isinstance(v, (int, float)) and v > 0 for v in profile.class_scale.values()):
        raise ValueError("class_scale")
    for name in ("class_floor_us", "folded_channel_us"):
        if not all(isinstance(v, (int, float)) and 0 <= v < float("inf") for v in getattr(profile, name).values()):
            raise ValueError(name)


def save_profile(device_info: dict[str, Any], profile: DeviceProfile) -> Path:
    """Persist a profile atomically; returns its path."""
    directory = profile_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{fingerprint(device_info)}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    data = asdict(profile)
    data["device_info"] = device_info
    data.pop("source", None)
    data.pop("kind_scale", None)
    data.pop("serial_kinds", None)
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)
    return path
