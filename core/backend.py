"""The backend contract: what a plugin's backend answers when the planner negotiates with it.

A plugin registers :class:`BackendInfo` descriptors through the
``delegate_backends`` hook; the factory builds a :class:`Backend` for one run
with its options from the config.  The planner asks ``supports`` per op,
``estimate_ms`` per op and ``transfer_ms`` per cut edge, then calls
``compile`` once per partition and runs the result with tensors that stay
resident on the backend between partitions.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from .cost import ACCELERATOR_DEFAULT, DeviceProfile, cost_class
from .errors import PluginError
from .ir import Op, Subgraph, Tensor
from .passes import Group, find_groups

API_VERSION = 1

HOST = "host"  # runs what no accelerator takes, holds graph inputs and outputs; exactly one per session
ACCELERATOR = "accelerator"  # a device reached through to_device/to_host
ROLES = (HOST, ACCELERATOR)

DeviceValue = Any  # a backend's own handle of a tensor's value (a numpy array on the host)


@dataclass(frozen=True)
class BackendInfo:
    """A backend a plugin offers.

    ``factory(options)`` builds the backend; ``available()`` says, without side
    effects, whether it can run here and, when not, why (missing package, no device);
    ``list_devices()`` names the devices it could open here, for ``delegate backends``.
    ``role`` is HOST for the backend that runs what no accelerator takes (the config calls
    it ``cpu`` whatever its name); the plugin manager sets it on every backend it builds.
    ``options``: the JSON Schema of each option the factory takes; where a plugin declares
    them, the config loader checks them (file, line, key path, a did-you-mean for an unknown
    one); where it declares none, they reach the factory unchecked.
    """

    name: str
    factory: Callable[[Mapping[str, Any]], "Backend"]
    available: Callable[[], tuple[bool, str]] = lambda: (True, "")
    description: str = ""
    api_version: int = API_VERSION
    role: str = ACCELERATOR
    list_devices: Callable[[], list[str]] = lambda: []
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Support:
    """A backend's answer for one op: yes, or no with the check that failed."""

    ok: bool
    reason: str = ""

    @classmethod
    def yes(cls) -> "Support":
        return cls(True)

    @classmethod
    def no(cls, reason: str) -> "Support":
        return cls(False, reason)

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class CompileOptions:
    """What a backend needs to know to build a partition."""

    precision: str = "fp32"  # "fp32" | "fp16" (fp16 only where precision loss is allowed)
    allow_quantized: bool = False  # accept quantized op versions (float view of int8 models)
    inference_preference: str = "fast_single_answer"  # or "sustained_speed"
    num_threads: int = 1
    cache_dir: str | None = None
    model_token: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Partition:
    """A connected set of ops placed on one backend, as a subgraph view of the model.

    ``inputs``/``outputs`` are the tensors crossing the partition boundary
    (graph inputs, values produced by other partitions, or consumed after it).
    """

    index: int
    backend: str
    ops: list[Op]
    inputs: list[Tensor]
    outputs: list[Tensor]
    graph: Subgraph

    @property
    def op_indices(self) -> list[int]:
        return [op.index for op in self.ops]


class CompiledPartition(abc.ABC):
    """A partition ready to run.  Values passed in and out are this backend's device values."""

    @abc.abstractmethod
    def run(self, inputs: Mapping[int, DeviceValue]) -> dict[int, DeviceValue]:
        """Run once.  ``inputs`` maps tensor index -> device value; returns the outputs likewise."""

    def describe(self) -> dict[str, Any]:
        """Facts for ``delegate plan`` (precision used, kernels, fusion)."""
        return {}

    # whether ``run`` returns host arrays made for that run alone, which nothing writes or keeps after it (LiteRT's
    # get_tensor copies): the session hands such graph outputs to its caller as they are instead of copying them
    # again (a copy of new memory: 29 us for deeplab_tiny's 80 KB output on a 2-core VM, 20% of its run)
    outputs_owned = False

    # whether ``profile`` times each op run alone, outside the partition's runs (LiteRT's engine): then the op
    # times give each op's share of the partition's measured time, not time spent inside it
    ops_timed_alone = False

    def op_timer(self) -> str:
        """How this partition times single ops (e.g. "OpenCL profiling events"), or "" when it cannot:
        then only the whole partition is timed, and nothing is reported per op."""
        return ""

    def set_profiling(self, enabled: bool) -> None:
        """Time every op of the following runs, where ``op_timer`` says the backend can."""

    def profile(self) -> dict[int, float]:
        """Per-op measured milliseconds of the profiled runs (empty when ``op_timer`` is "")."""
        return {}

    def read_hint(self, indices: frozenset[int] | None) -> None:
        """The outputs (tensor indices; None: all) whose values the host will read after the following runs,
        so a device backend reads back only those; an output outside them must still come back when asked
        for, at its own cost.  The runtime says it before running; by default nothing changes."""

    def run_resident(self) -> bool:
        """Run once on the inputs already on the device (those of the last run), leave the outputs there and
        wait until the device is done: the device-resident time ``bench`` reports.  False, doing nothing,
        where the backend has no such run."""
        return False

    def boundary_ms(self) -> float | None:
        """Device milliseconds per profiled run spent moving and converting the partition's inputs and
        outputs between host and device (None where they are not timed)."""
        return None

    def reset_state(self) -> None:
        """Put variable tensors back to their initial values (LiteRT's ``reset_all_variables``).

        A backend whose partitions hold no state (it runs no op with variable tensors) needs nothing here.
        """


class Backend(abc.ABC):
    """One execution backend (CPU, an OpenCL device, a WebGPU adapter...)."""

    name: str = "backend"
    layout: str = "NHWC"  # the layout its values are kept in; anything else costs a conversion per copy
    role: str = ACCELERATOR  # its BackendInfo's, set when the plugin manager builds it
    # the precisions it computes in (``precision`` in the config); the conformance matrix checks each
    precisions: tuple[str, ...] = ("fp32",)
    fusions: frozenset[str] = frozenset()  # what its kernels fold into a neighbour (kinds of delegate.passes.FUSIONS)

    @abc.abstractmethod
    def supports(self, op: Op, options: CompileOptions) -> Support:
        """Whether this backend can run ``op`` (code, version, dtypes, shapes, attributes)."""

    @abc.abstractmethod
    def compile(self, partition: Partition, options: CompileOptions) -> CompiledPartition:
        """Build a partition; raise CompileError with the build log on failure."""

    def placement_groups(self, ops: Sequence[Op], keep: Collection[int], options: CompileOptions) -> list[Group]:
        """The groups of ``ops`` (topologically ordered) its kernels run as one: what placement keeps whole and
        costs as one kernel (``keep``: tensors that must stay visible).  By default the shared passes' groups
        for the fusions it declares; a backend whose lowering plans its own kernels returns those."""
        return find_groups(ops, self.fusions, keep)

    def estimate_ms(self, op: Op, options: CompileOptions) -> float | None:
        """Estimated time of ``op`` here, or None to let the cost model use its roofline."""
        return None

    def cost_class(self, op: Op) -> str:
        """The class the cost model estimates ``op`` by and fits its measurements to (``cost.cost_class``: the
        op's kind of kernel).  A backend running one class through two kinds of kernel names its own kind
        ("elementwise/step"); a fit without that kind falls back to the class alone."""
        return cost_class(op)

    def default_profile(self) -> DeviceProfile:
        """The cost figures used until ``delegate calibrate`` has measured this device (a host's are per
        thread); by default the conservative figures of an unknown accelerator."""
        return ACCELERATOR_DEFAULT

    def half_precision(self) -> tuple[bool, str]:
        """Whether half precision is expected to be faster here than fp32, and why.  Where it is not, a
        config that allows fp16 still gets fp32 (unless a measured plan search finds fp16 faster)."""
        return False, f"{self.name} has no half-precision kernels"

    def transfer_ms(self, nbytes: int) -> float:
        """Time to move ``nbytes`` between host memory and this backend (0 for the host)."""
        return 0.0

    def bound_waits(self, seconds: float | None) -> bool:
        """Whether this backend bounds its own waits by ``limits.run_timeout_s`` (``seconds``; None: no limit).
        True where its compiled partitions' ``run`` only enqueues device work and every wait for that work
        (in ``to_host``) raises TimeoutError after ``seconds``: the runtime then calls ``run`` on the calling
        thread.  By default False: each ``run`` goes to a watchdog thread, whose hand-over cost 20-75 µs a
        run on H100 hosts."""
        return False

    def to_device(self, array: np.ndarray) -> DeviceValue:
        """Host array -> device value (identity on the host).  The runtime calls it once per value crossing
        into this backend; values stay resident between its partitions."""
        return array

    def to_host(self, value: DeviceValue) -> np.ndarray:
        """Device value -> host array (identity on the host); the runtime checks its shape and dtype.  It may be
        the backend's own buffer, valid until the partition that made the value runs again."""
        return value

    def add_custom_kernels(self, kernels: Mapping[str, Any]) -> None:
        """Kernels for custom ops contributed by other plugins (``delegate_custom_kernels``)."""

    def device_info(self) -> dict[str, Any]:
        """Device, driver and version facts; they key profiles and the kernel cache."""
        return {"backend": self.name}

    def close(self) -> None:
        """Release device resources."""


def asked_support(backend: Backend, op: Op, options: CompileOptions) -> Support:
    """``backend.supports(op)`` held to the contract: an answer that is not a Support is the plugin's bug."""
    answer = backend.supports(op, options)
    if not isinstance(answer, Support):
        raise PluginError(f"backend {backend.name!r}: supports() returned {answer!r}, not a Support")
    return answer


def asked_cost_class(backend: Backend, op: Op) -> str:
    """``backend.cost_class(op)`` held to the contract: a class name, a string."""
    klass = backend.cost_class(op)
    if not isinstance(klass, str) or not klass:
        raise PluginError(f"backend {backend.name!r}: cost_class() returned {klass!r}, not a class name")
    return klass


def asked_estimate(backend: Backend, op: Op, options: CompileOptions) -> float | None:
    """``backend.estimate_ms(op)`` held to the contract: None, or a finite time >= 0 in milliseconds."""
    value = backend.estimate_ms(op, options)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value < 0:
        raise PluginError(f"backend {backend.name!r}: estimate_ms() returned {value!r}, "
                          f"not a time in milliseconds or None")
    return float(value)
