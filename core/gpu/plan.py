"""A partition's kernel plan, as plain data both GPU backends run from: launches, buffers, boundaries.

A :class:`KernelPlan` lists the launches of a partition in order (the kernel
template, its parameters, its arguments with buffers named by index, its work
sizes and the ops it computes), the buffers they use with their roles
(``input``, ``output``, ``constant`` with its bytes in the plan's blob,
``scratch``, ``staging``) and the tensors crossing the partition boundary.  It
holds no device object, so it serialises to JSON (plus the blob of constant
bytes) and a backend's caches key on that form.

:class:`BufferPlanner` assigns the buffers once for both backends: inputs,
outputs, constants and staging get their own; tensors living only inside the
partition share scratch buffers wherever their lifetimes (first to last
launch using them) do not overlap, and a value aliased to another (a reshape
keeping the PHWC4 bytes) uses its buffer.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, Hashable, Iterable

import numpy as np

from ..backend import CompileOptions, Partition
from ..cache import EntryStore, cache_key, ops_fingerprint
from ..digest import sha256
from ..ir import Tensor
from .constants import constant_value
from .layout import phwc4_vectors, to_phwc4

ROLES = ("input", "output", "constant", "scratch", "staging")
log = logging.getLogger(__name__)


@dataclass
class BufferSpec:
    nbytes: int
    role: str  # one of ROLES
    data: tuple[int, int] | None = None  # (offset, size) of a constant's bytes in the blob


@dataclass
class LaunchSpec:
    """One kernel launch.  ``args`` are (kind, value) pairs in the kernel's argument order: kinds
    ``buffer`` (read), ``write`` (a writable binding, where the dialect distinguishes), ``int``,
    ``float``, ``int2``, ``int4``, ``float2``, ``float4`` (value a number or a list); ``work`` is
    the dialect's work size (OpenCL global size, WebGPU workgroups), ``local`` a fixed work-group
    shape where the template needs one; ``params`` the template's compile-time parameters."""

    kernel: str
    args: list[list[Any]]
    work: list[int]
    label: str = ""
    ops: list[int] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    local: list[int] | None = None

    def buffers(self) -> list[int]:
        return [value for kind, value in self.args if kind in ("buffer", "write")]


@dataclass
class TensorSpec:
    """A tensor crossing the partition boundary: its buffer, and how the host reads or writes it.

    ``staging`` holds the tensor in host order (NHWC float32) and ``convert`` moves it between there
    and ``buffer`` on the device, so the host never reorders data; neither is set when the host
    bytes are the buffer's (one slice or one pixel, float32 storage), when the host converts, or
    when ``host_layout``: the input's one kernel reads ``buffer`` in host order.  ``host_dtype`` is the
    element type the host writes: float32, or a quantized input's own integers, which the device
    dequantizes (the conversion or the reading kernel).
    """

    index: int
    buffer: int
    shape: list[int]
    dtype: str
    quant: list[float] | None = None  # (scale, zero point) of a quantized tensor in the float view
    staging: int | None = None
    convert: LaunchSpec | None = None
    host_dtype: str = "float32"
    host_layout: bool = False


@dataclass
class KernelPlan:
    """Launches, buffers and boundaries of one partition; ``blob`` holds the constants' bytes."""

    storage: str  # "f32" | "f16"
    launches: list[LaunchSpec]
    buffers: list[BufferSpec]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    facts: dict[str, Any] = field(default_factory=dict)
    blob: bytes = b""

    TRANSIENT = ("blob",)  # fields not in the JSON head; subclasses add theirs

    def head(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in self.TRANSIENT}

    def to_json(self) -> str:
        return json.dumps(self.head(), sort_keys=True)

    def key(self) -> str:
        """Digest of the serialized plan (constants included), for the caches built from it."""
        return sha256(self.to_json().encode() + self.blob).hexdigest()

    def to_bytes(self) -> bytes:
        text = self.to_json().encode()
        return struct.pack("<Q", len(text)) + text + self.blob

    @classmethod
    def from_bytes(cls, raw: bytes) -> "KernelPlan":
        (size,) = struct.unpack_from("<Q", raw)
        head = json.loads(raw[8:8 + size])
        known = {f.name for f in fields(cls)} - set(cls.TRANSIENT)
        extra = {k: v for k, v in head.items() if k in known and k not in _CORE}
        return cls(head["storage"], [LaunchSpec(**d) for d in head["launches"]],
                   [BufferSpec(b["nbytes"], b["role"], tuple(b["data"]) if b["data"] else None)
                    for b in head["buffers"]],
                   [_tensor(t) for t in head["inputs"]], [_tensor(t) for t in head["outputs"]],
                   head["facts"], raw[8 + size:], **extra)

    def buffer_bytes(self) -> dict[str, int]:
        """Device bytes of the plan's buffers by role."""
        return {role: sum(b.nbytes for b in self.buffers if b.role == role) for role in ROLES}


_CORE = ("storage", "launches", "buffers", "inputs", "outputs", "facts")


def _tensor(d: dict[str, Any]) -> TensorSpec:
    convert = d.pop("convert")
    return TensorSpec(**d, convert=LaunchSpec(**convert) if convert else None)


class BufferPlanner:
    """Collects the values a partition's launches use, in launch order, and assigns their buffers.

    Values are any hashable keys (tensor indices, packed weights, temporaries).  ``inputs`` and
    ``outputs`` are the partition's boundary tensors: they keep their own buffers, so the host
    (and other partitions) can read and write them between runs.
    """

    def __init__(self, inputs: Iterable[Hashable], outputs: Iterable[Hashable]):
        self.inputs, self.outputs = set(inputs), set(outputs)
        self.aliases: dict[Hashable, Hashable] = {}
        self.roles: dict[Hashable, str] = {}  # storage root -> role
        self.sizes: dict[Hashable, int] = {}
        self.span: dict[Hashable, list[int]] = {}  # storage root -> [first, last] launch using it

    def root(self, key: Hashable) -> Hashable:
        """The value whose buffer ``key`` uses."""
        while key in self.aliases:
            key = self.aliases[key]
        return key

    def alias(self, key: Hashable, of: Hashable) -> None:
        """``key`` is stored in ``of``'s buffer (the same bytes)."""
        self.aliases[key] = of

    def use(self, key: Hashable, nbytes: int, constant: bool, position: int | None) -> None:
        """Launch ``position`` (None: the boundary) uses ``key``, of ``nbytes``, a constant or not."""
        root = self.root(key)
        if root not in self.roles:
            self.sizes[root] = max(int(nbytes), 1)
            self.roles[root] = "constant" if constant else "scratch"
        if key in self.inputs:
            self.roles[root] = "input"
        elif key in self.outputs and self.roles[root] == "scratch":
            self.roles[root] = "output"
        if position is not None:
            self.span.setdefault(root, [position, position])[1] = position

    def used(self, key: Hashable) -> bool:
        return self.root(key) in self.roles

    def assign(self, data: Callable[[Hashable], bytes]) -> tuple[dict[Hashable, int], list[BufferSpec], bytearray]:
        """(buffer index per value, buffers, blob): own buffers for inputs, outputs and constants
        (``data(root)`` giving a constant's bytes), scratch shared by lifetime, best fit first."""
        buffers: list[BufferSpec] = []
        buffer_of: dict[Hashable, int] = {}
        blob = bytearray()
        for root, role in self.roles.items():
            if role == "scratch":
                continue
            placed = None
            if role == "constant":
                raw = data(root)
                blob.extend(bytes(-len(blob) % 16))
                placed = (len(blob), len(raw))
                blob.extend(raw)
            buffer_of[root] = len(buffers)
            buffers.append(BufferSpec(self.sizes[root], role, placed))
        free: list[int] = []
        active: list[tuple[int, int]] = []  # (last use, buffer)
        scratch = [r for r, role in self.roles.items() if role == "scratch"]
        for root in sorted(scratch, key=lambda r: self.span.get(r, [0, 0])[0]):
            first, last = self.span.get(root, [0, 0])
            for item in [a for a in active if a[0] < first]:
                active.remove(item)
                free.append(item[1])
            need = self.sizes[root]
            fitting = [b for b in free if buffers[b].nbytes >= need]
            chosen = min(fitting, key=lambda b: buffers[b].nbytes) if fitting else (
                max(free, key=lambda b: buffers[b].nbytes) if free else None)
            if chosen is None:
                chosen = len(buffers)
                buffers.append(BufferSpec(need, "scratch"))
            else:
                free.remove(chosen)
                buffers[chosen].nbytes = max(buffers[chosen].nbytes, need)
            buffer_of[root] = chosen
            active.append((last, chosen))
        for key in self.aliases:
            if self.root(key) in buffer_of:
                buffer_of[key] = buffer_of[self.root(key)]
        return buffer_of, buffers, blob


class Values:
    """The values a partition's launches bind: its tensors (by index), packed constants (float32, in
    their kernel's layout), temporaries (by PHWC4 shape), and aliases (a value stored in another's
    buffer).  Both lowerings keep theirs here, so sizes and constant bytes are reckoned once."""

    def __init__(self) -> None:
        self.tensors: dict[int, Tensor] = {}
        self.constants: dict[Hashable, np.ndarray] = {}
        self.temporaries: dict[Hashable, tuple[int, ...]] = {}
        self.aliases: dict[Hashable, Hashable] = {}
        self.host_bytes: dict[Hashable, int] = {}  # partition inputs kept in host order (the caller's bytes)

    def nbytes(self, key: Hashable, itemsize: int) -> int:
        if key in self.host_bytes:
            return self.host_bytes[key]
        if key in self.constants:
            return self.constants[key].size * itemsize
        shape = self.temporaries[key] if key in self.temporaries else self.tensors[key].shape
        return max(phwc4_vectors(shape), 1) * 4 * itemsize

    def is_constant(self, key: Hashable) -> bool:
        return key in self.constants or (key in self.tensors and constant_value(self.tensors[key]) is not None)

    def constant_bytes(self, key: Hashable, dtype: np.dtype) -> bytes:
        """A constant's bytes in the storage type: packed as it is, a constant tensor in PHWC4."""
        if key in self.constants:
            values = self.constants[key]
        else:
            t = self.tensors[key]
            values = to_phwc4(constant_value(t).reshape(t.shape), np.float32)
        return np.ascontiguousarray(values, dtype).tobytes()

    def planner(self, inputs: Iterable[Hashable], outputs: Iterable[Hashable]) -> BufferPlanner:
        planner = BufferPlanner(inputs, outputs)
        planner.aliases.update(self.aliases)
        return planner

    def use(self, planner: BufferPlanner, key: Hashable, itemsize: int, position: int | None) -> None:
        """Record that launch ``position`` (None: the boundary) binds ``key``."""
        root = planner.root(key)
        planner.use(key, self.nbytes(root, itemsize), self.is_constant(root), position)


@lru_cache(maxsize=None)
def code_digest(package: str, definitions: str) -> str:
    """Digest of a GPU plugin's code and templates (every file of ``package``), the kit's code (its lowering,
    fusion and layouts, and the shared fusion rules of ``delegate.passes``) and the dialect's rendered
    ``definitions``: a cached plan is only valid for the rules and sources it was made from."""
    digest = sha256(definitions.encode())
    kit = resources.files(__package__)
    for entry in sorted(kit.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".py"):
            digest.update(entry.name.encode() + entry.read_bytes())
    digest.update(resources.files(__package__.rpartition(".")[0]).joinpath("passes.py").read_bytes())
    pending = [resources.files(package)]
    while pending:
        for entry in sorted(pending.pop().iterdir(), key=lambda e: e.name):
            if entry.name == "__pycache__":
                continue
            if entry.is_dir():
                pending.append(entry)
            else:
                digest.update(entry.name.encode() + entry.read_bytes())
    return digest.hexdigest()


class PlanCache:
    """Where a backend keeps the plans of a model's partitions (with a cache directory and a model token),
    keyed by what the partition computes and ``facts``: everything else the plan depends on (device,
    storage, templates, the plugin's version, its options)."""

    def __init__(self, backend: str, partition: Partition, options: CompileOptions, facts: dict[str, Any]):
        self.backend = backend
        self.store = EntryStore(options.cache_dir, backend, options.model_token) \
            if options.cache_dir and options.model_token else None
        self.key = cache_key({
            "model": options.model_token, "ops": ops_fingerprint(partition.ops),
            "inputs": [(t.index, t.shape, t.dtype.name) for t in partition.inputs],
            "outputs": [(t.index, t.shape, t.dtype.name) for t in partition.outputs],
            "allow_quantized": options.allow_quantized, **facts}) if self.store else ""

    def load(self, cls: type[KernelPlan]) -> KernelPlan | None:
        raw = self.store.load(self.key, "plan") if self.store is not None else None
        if raw is None:
            return None
        try:
            return cls.from_bytes(raw)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("%s: cached plan %s could not be read (%s); planning again", self.backend, self.key[:12], exc)
            return None

    def store_plan(self, plan: KernelPlan) -> None:
        if self.store is not None:
            self.store.store(self.key, "plan", plan.to_bytes())
