"""The opencl backend object: device selection, the support answer, compile, and boundary transfers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from delegate.gpu.profile import default_profile
from delegate.gpu.dialect import OPENCL
from delegate.gpu.fusion import fusions_of, placement_groups, runs_no_kernel
from delegate.gpu.plan import KernelPlan, PlanCache, code_digest
from delegate.gpu.registry import supports
from delegate.gpu.remembered import LazyDevice
from delegate.plugin_api import (Backend, CompileOptions, CompiledPartition, DeviceProfile, Op, Partition, PluginError,
                                 Support, available_cores)

from . import __version__
from .compiled import ClCompiled, choose_precision, lower
from .device import DeviceRequest, device_facts, import_pyopencl, remembered, select_device
from .lowering import DIALECT, FOLDS
from .program import ProgramBuilder
from .values import ClValue, WaitLimit


@dataclass
class DeviceState:
    """One context, one in-order queue and the built programs of a device, shared in the process."""

    cl: Any
    device: Any
    context: Any
    queue: Any
    facts: dict[str, Any]
    builder: ProgramBuilder
    profilers: int = 0

    def set_profiling(self, enabled: bool) -> None:
        """Count a partition starting or stopping to profile.  Event timestamps cost time per enqueue on
        some drivers, so the queue records them only while some partition profiles; the queue is
        drained before it is replaced, so the order of work is kept."""
        before = self.profilers > 0
        self.profilers += 1 if enabled else -1
        if (self.profilers > 0) != before:
            self.queue.finish()
            self.queue = make_queue(self.cl, self.context, self.device, self.profilers > 0)


def make_queue(cl, context, device, profiling: bool):
    properties = cl.command_queue_properties.PROFILING_ENABLE if profiling else 0
    return cl.CommandQueue(context, device, properties=properties)


_DEVICES: dict[tuple[str, str, str], DeviceState] = {}


def device_state(cl, platform, device) -> DeviceState:
    facts = device_facts(cl, platform, device)
    key = (facts["platform"], facts["device"], facts["driver_version"])
    if key not in _DEVICES:
        context = cl.Context([device])
        _DEVICES[key] = DeviceState(cl, device, context, make_queue(cl, context, device, False), facts,
                                    ProgramBuilder(cl, context, device, facts))
    return _DEVICES[key]


class OpenCLBackend(Backend):
    """Runs GPU-supported ops as OpenCL kernels; tensors live as PHWC4 buffers between kernels."""

    name = "opencl"
    layout = "PHWC4"
    precisions = ("fp32", "fp16")
    fusions = fusions_of(FOLDS)  # the groups placement keeps together: what the lowering folds

    def __init__(self, options: Mapping[str, Any] | None = None):
        """Plans from the device's remembered facts where an earlier process stored them; the device itself
        opens when a partition first compiles (``state``)."""
        options = dict(options or {})
        self.request = DeviceRequest.from_options(options)
        self.device = LazyDevice("opencl", remembered(self.request), "pyopencl", import_pyopencl, self._open,
                                 lambda state: state.facts)
        self.facts = self.device.facts
        self.native_enqueue = bool(options.get("native_enqueue", True))  # False: pyopencl's loop (to compare)
        # set by ``bound_waits``, read by every partition's waits
        self.wait_limit = WaitLimit(native=self.native_enqueue)
        # a partition's kernels built as up to this many programs at once (see ``programs_at_once``)
        self.build_threads = options.get("build_threads")
        if self.build_threads is not None and (isinstance(self.build_threads, bool)
                                               or not isinstance(self.build_threads, int) or self.build_threads < 1):
            raise PluginError(f"opencl backend: build_threads must be a positive integer, got {self.build_threads!r}")

    def programs_at_once(self) -> int:
        """``build_threads``, or by default: on a GPU, one program per core of the process, up to 16 (cold, on
        the H100: MobileNetV2's first load 6.0-6.4 s with one program, 4.9-5.9 s with 16; pose_landmark_full's
        9.0-9.4 s and 6.9-7.0 s); on a CPU device one (PoCL compiles on the cores that would build the other
        programs: two were not reliably faster on 2 cores, see docs/config.md)."""
        if self.build_threads is not None:
            return self.build_threads
        return min(available_cores(), 16) if self.facts["device_type"] == "gpu" else 1

    def _open(self) -> DeviceState:
        cl = import_pyopencl()
        platform, device = select_device(cl, self.request)
        return device_state(cl, platform, device)

    @property
    def state(self) -> DeviceState:
        """The open device (see ``LazyDevice``)."""
        return self.device.opened()

    def supports(self, op: Op, options: CompileOptions) -> Support:
        return supports(DIALECT, op, options)

    def default_profile(self) -> DeviceProfile:
        return default_profile(self.device_info())

    def placement_groups(self, ops, keep, options: CompileOptions) -> list:
        return placement_groups(ops, keep, FOLDS, float_view=options.allow_quantized)

    def estimate_ms(self, op: Op, options: CompileOptions) -> float | None:
        """Nothing for ops that never run (folded DEQUANTIZE, a reshape keeping the bytes); else the roofline
        (what a kernel folds is in ``placement_groups``)."""
        return 0.0 if runs_no_kernel(op, options.allow_quantized) else None

    def half_precision(self) -> tuple[bool, str]:
        if self.facts["fp16"]:
            return True, "the device has cl_khr_fp16: half storage and arithmetic"
        return False, ("the device lacks cl_khr_fp16 (no half arithmetic): half storage alone saves bandwidth "
                       "but adds conversions, and costs precision")

    def compile(self, partition: Partition, options: CompileOptions) -> CompiledPartition:
        """The partition's kernel plan (from the plan cache when one is configured and holds it), made real."""
        facts = self.facts
        precision = choose_precision(options.precision, facts["fp16"])
        cache = PlanCache("opencl", partition, options, {
            "precision": precision.name, "device": facts, "code": code_digest("delegate_opencl", OPENCL.definitions()),
            "plugin": __version__})
        plan, source = cache.load(KernelPlan), "cache"
        if plan is None:
            plan, source = lower(partition, options, precision, facts["compute_units"]), "planned"
            cache.store_plan(plan)
        return ClCompiled(self.state, partition, plan, precision, options, source, self.native_enqueue,
                          self.programs_at_once(), self.wait_limit)

    def bound_waits(self, seconds: float | None) -> bool:
        """On a GPU: a run only enqueues, and the wait for its outputs (``to_host``) gives up after
        ``seconds``, asking the event's status without sleeping for its first 50 ms (a batch-1 run's wait
        is far shorter).  Not on a CPU device (PoCL): it computes on the cores such asking would take, and
        sleeping between asks made hand_recrop's runs 10% slower here than the driver's blocking wait; its
        runs keep the watchdog thread."""
        if self.facts["device_type"] != "gpu":
            return False
        self.wait_limit.seconds = seconds
        self.wait_limit.spin_s = 0.05
        return True

    def to_device(self, array: np.ndarray) -> ClValue:
        return ClValue.stage(array)

    def to_host(self, value: Any) -> np.ndarray:
        if isinstance(value, ClValue):
            return value.to_host(self.state.cl, self.state.queue)
        return np.asarray(value)

    def transfer_ms(self, nbytes: int) -> float:
        """Launch latency plus bytes over the host link (memory copies when the device is the CPU)."""
        if self.facts["device_type"] == "cpu":
            return 0.01 + nbytes / 8e9 * 1e3
        return 0.03 + nbytes / 12e9 * 1e3

    def device_info(self) -> dict[str, Any]:
        return dict(self.facts)

    def close(self) -> None:
        if self.device.handle is not None:
            self.device.handle.queue.finish()

