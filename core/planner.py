"""Placement: which backend runs each op, and the partitions that result.

Pipeline: capability query -> per-op costs -> assignment -> partition formation
-> partition limits -> explanation.  The assignment minimises total compute
plus transfer time.  With the CPU and one accelerator this is exactly an s-t
minimum cut (scipy's max flow), where a tensor consumed on several devices is paid for
once per destination; with several accelerators each CPU+accelerator pair is
solved exactly and the cheapest pair is kept (plans mixing two accelerators
are not considered).  ``partitioner: greedy`` reproduces LiteRT's rule (every
supported op delegated, largest partitions by node count kept) as a baseline,
and the cost plan falls back to it in the rare case the partition limits make
the greedy plan cheaper, so the cost plan never costs more.
"""

from __future__ import annotations

import fnmatch
import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from .backend import HOST, Backend, CompileOptions, Partition, asked_cost_class, asked_estimate, asked_support
from .cost import DeviceProfile, fold_group_costs, input_channels, measured, op_bytes, op_flops, op_signature, op_steps
from .errors import UnsupportedOpError
from .ir import Op, Subgraph, Tensor
from .partition import make_partition
from .passes import Group, folded_into, folds_constant
from .shapes import static_op


def _host_cores(backend: Backend) -> bool:
    """Whether ``backend``'s device is a CPU (the host's cores behind a GPU API)."""
    try:
        return backend.device_info().get("device_type") == "cpu"
    except Exception:  # a plugin bug must not break planning
        return False


INF = math.inf
_BIG = 1e12  # finite stand-in for "impossible" inside the max-flow graph


@dataclass
class Rule:
    """A pin or deny rule: matches by op code, op index or tensor-name glob."""

    backend: str | None = None
    op: str | None = None
    index: int | None = None
    tensor: str | None = None

    def matches(self, op: Op) -> bool:
        if self.op is not None and op.opcode != self.op:
            return False
        if self.index is not None and op.index != self.index:
            return False
        if self.tensor is not None and not any(
                fnmatch.fnmatchcase(t.name, self.tensor) for t in op.outputs):
            return False
        return True

    def describe(self) -> str:
        what = []
        if self.op is not None:
            what.append(f"op {self.op}")
        if self.index is not None:
            what.append(f"index {self.index}")
        if self.tensor is not None:
            what.append(f"tensor {self.tensor!r}")
        return " ".join(what) or "all ops"


@dataclass
class PlacementSettings:
    partitioner: str = "cost"  # "cost" | "greedy"
    search: str = "estimate"  # "auto" | "estimate" | "measure" (see plan_search)
    budget_s: float = 10.0
    host_first: bool = True  # see Session: the host serves runs while the plan compiles or is measured
    max_delegated_partitions: int = 0  # 0 = unlimited
    min_nodes_per_partition: int = 1
    pins: list[Rule] = field(default_factory=list)
    denies: list[Rule] = field(default_factory=list)


@dataclass
class Copy:
    tensor: int
    name: str
    source: str
    destination: str
    nbytes: int
    ms: float


@dataclass
class OpDecision:
    index: int
    opcode: str
    version: int
    backend: str
    reason: str
    estimates_ms: dict[str, float]
    refusals: dict[str, str]
    copies: int = 0
    fused_into: int | None = None  # the op whose kernel runs this one on its backend (a fused group's anchor)


@dataclass
class Candidate:
    """One assignment the planner considered; ``measured_ms`` is filled only by timing it on the device."""

    name: str
    assignment: dict[int, str]
    estimated_ms: float
    notes: list[str] = field(default_factory=list)
    precision: str = ""  # "" = as configured, each accelerator keeping fp32 where half is not faster
    baseline: bool = False  # a single backend alone (the CPU, or an accelerator's greedy plan)
    host_alone: bool = False  # the host backend alone: what a plan must never be slower than, always timed
    measured_ms: float | None = None
    status: str = ""  # why it was not measured, or was stopped early
    compile_s: float | None = None  # measured: its compile and first run, when the search timed it

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "precision": self.precision, "estimated_ms": round(self.estimated_ms, 4),
                "measured_ms": None if self.measured_ms is None else round(self.measured_ms, 4),
                "status": self.status, "backends": sorted(set(self.assignment.values())),
                "compile_s": None if self.compile_s is None else round(self.compile_s, 3)}


@dataclass
class Plan:
    graph: Subgraph
    partitions: list[Partition]
    decisions: list[OpDecision]
    copies: list[Copy]
    estimated_ms: float
    partitioner: str
    accelerators: list[str]
    notes: list[str] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    chosen: str = ""  # the candidate this plan is
    choice: str = ""  # how it was chosen: "estimated", "measured now", "stored decision of DATE"
    profiles: dict[str, str] = field(default_factory=dict)  # backend -> which cost profile was used
    host: str = ""  # the host backend's name
    revision: int = 0  # 0 as planned; each fallback makes the next revision (``moved``)

    @property
    def delegated(self) -> list[Partition]:
        return [p for p in self.partitions if p.backend != self.host]

    def moved(self, index: int, backend: str, why: str) -> Plan:
        """The next revision: partition ``index`` and its ops on ``backend``, ``why`` noted.  This plan, which
        observers may hold, is left as it was; the estimates and copies stay those of the planned placement."""
        part = next(p for p in self.partitions if p.index == index)
        ops = set(part.op_indices)
        note = f"revision {self.revision + 1}: partition {index} on {part.backend} moved to {backend}: {why}"
        return replace(self, partitions=[replace(p, backend=backend) if p is part else p for p in self.partitions],
                       decisions=[replace(d, backend=backend, reason=why) if d.index in ops else d
                                  for d in self.decisions],
                       notes=[*self.notes, note], revision=self.revision + 1)

    def summary(self) -> str:
        """LiteRT's own wording for the delegation result."""
        if not self.accelerators:
            return f"No delegate in use: all {len(self.graph.ops)} node(s) run on {self.host}"
        delegated = self.delegated
        names = sorted({p.backend for p in delegated}) or self.accelerators[:1]
        n_ops = sum(len(p.ops) for p in delegated)
        return (f"Replacing {n_ops} out of {len(self.graph.ops)} node(s) with delegate ({', '.join(names)}) node, "
                f"yielding {len(delegated)} partitions")

    def warnings(self) -> list[str]:
        """LiteRT's per-op warning for every op no accelerator can run."""
        out = []
        if not self.accelerators:
            return out
        for d in self.decisions:
            if all(a in d.refusals for a in self.accelerators):
                out.append(f"op code #{d.index} ({d.opcode}) cannot be handled by this delegate")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "partitioner": self.partitioner,
            "estimated_ms": round(self.estimated_ms, 4),
            "partitions": [{"index": p.index, "backend": p.backend, "ops": p.op_indices,
                            "inputs": [t.index for t in p.inputs], "outputs": [t.index for t in p.outputs]}
                           for p in self.partitions],
            "copies": [c.__dict__ for c in self.copies],
            "ops": [d.__dict__ for d in self.decisions],
            "warnings": self.warnings(),
            "notes": self.notes,
            "chosen": self.chosen, "choice": self.choice, "revision": self.revision,
            "candidates": [c.to_dict() for c in self.candidates],
            "profiles": dict(self.profiles),
        }


class FlowGraph:
    """A directed graph with capacities in ms, for one minimum cut (``Planner.min_cut``); a capacity of
    ``_BIG`` or more is one no cut may take."""

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.edges: list[tuple[int, int, float]] = []

    def node(self, key: Any) -> int:
        return self.ids.setdefault(key, len(self.ids))

    def add(self, u: int, v: int, ms: float) -> None:
        if ms > 1e-12:  # nothing (and keeps denormal capacities out of the arithmetic)
            self.edges.append((u, v, ms))

    def reaching_sink(self, source: int, sink: int) -> set[int]:
        """The nodes that can still reach ``sink`` in the residual graph of a maximum flow from ``source``.

        scipy's max flow runs on 32-bit integers: finite capacities in nanoseconds (coarser where their sum
        would not fit), each uncuttable one (parallel ones too) just above all the finite ones together, so
        that no cut takes it and no sum overflows."""
        import numpy as np
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import breadth_first_order, maximum_flow

        n = len(self.ids)
        if not self.edges:
            return {sink}
        u, v, ms = (np.array(x) for x in zip(*self.edges))
        ms = ms.astype(np.float64)
        uncuttable = ms >= _BIG
        finite_ms = float(ms[~uncuttable].sum())
        units_per_ms = min(1e6, 2.0 ** 29 / (finite_ms + 1.0))
        units = np.rint(ms * units_per_ms)
        most = int(np.rint(finite_ms * units_per_ms)) + 1  # below 2**30
        units[uncuttable] = most
        capacity = coo_matrix((units.astype(np.int64), (u, v)), shape=(n, n)).tocsr()  # parallel edges summed
        capacity.sum_duplicates()
        np.minimum(capacity.data, most, out=capacity.data)
        flow = maximum_flow(capacity, source, sink).flow
        residual = (capacity - flow).tocsr()  # reverse edges carry what flows forward
        residual.data[residual.data < 0] = 0
        residual.eliminate_zeros()
        # who reaches the sink: the sink's breadth-first order over the reversed residual edges
        return set(breadth_first_order(residual.T.tocsr(), sink, directed=True, return_predecessors=False).tolist())


class Planner:
    """Places the ops of a subgraph on the given backends (priority order, CPU included)."""

    def __init__(self, backends: Mapping[str, Backend], profiles: Mapping[str, DeviceProfile],
                 options: CompileOptions, settings: PlacementSettings | None = None):
        hosts = [name for name, be in backends.items() if be.role == HOST]
        if len(hosts) != 1:
            raise ValueError(f"a plan needs exactly one host backend (the fallback), not {hosts or 'none'}")
        self.host = hosts[0]
        self.backends = dict(backends)
        self.profiles = dict(profiles)
        self.options = options
        self.settings = settings or PlacementSettings()
        self.accelerators = [n for n in self.backends if n != self.host]
        self.unmeasured_host_cores = {n for n in self.accelerators if _host_cores(self.backends[n])
                                      and not measured(self.profiles[n])}
        self._groups: dict[int, tuple[Subgraph, dict[str, list[Group]], dict[int, tuple[Op, ...]]]] = {}

    # -- costs -----------------------------------------------------------
    # An accelerator that is the host's own cores behind a GPU API (PoCL, lavapipe) and was never measured
    # costs each unit (the ops placement moves whole) at least what the host backend does (``capabilities``):
    # its default figures are a guess, and the host's kernels run on the same cores (this 2-core machine,
    # 2026-12-04: PoCL's default figures put a ViT block's int8 BATCH_MATMULs there at 0.17 ms against the
    # CPU's 0.74, and that plan ran 4.5x the CPU alone).
    def op_cost(self, op: Op, backend: str) -> float:
        be = self.backends[backend]
        estimate = asked_estimate(be, op, self.options)
        if estimate is not None:
            return float(estimate)
        profile = self.profiles[backend]
        timed = profile.measured_op_ms.get(op_signature(op))
        if timed is not None:
            return float(timed)
        return profile.compute_ms(op_flops(op), op_bytes(op), asked_cost_class(be, op), op_steps(op))

    def transfer_cost(self, t: Tensor, backend: str) -> float:
        """One copy of ``t`` between the host and ``backend`` (layout conversion included): from the backend's
        calibrated transfer figures where ``delegate calibrate`` measured them, else from the backend's own
        figure (``Backend.transfer_ms``), else from its profile's defaults.  A plugin's own figure is a guess
        for devices of its kind: NVIDIA's OpenCL took 0.03 ms + 12 GB/s for one, where calibrate measured
        8.5 us + 16.9 GB/s on an H100 host (MobileNetV2's input estimated 0.085 ms; its whole plan ran 0.02 ms
        over its partition)."""
        if backend == self.host:
            return 0.0
        be, profile = self.backends[backend], self.profiles[backend]
        calibrated = bool(profile.calibrated_at) and "transfers" not in profile.defaults_kept \
            and not profile.borrowed_from
        ms = 0.0 if calibrated else be.transfer_ms(t.nbytes)
        if ms:
            return ms
        host = self.profiles[self.host]
        convert = t.nbytes / (host.gbytes_per_s * 1e9) * 1e3 if be.layout != "NHWC" else 0.0
        return self.profiles[backend].transfer_ms(t.nbytes) + convert

    def capabilities(self, graph: Subgraph) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, str]]]:
        """Per op: cost on each backend that can run it, and the reason of each that cannot.  The ops of a fused
        group go only to backends that run all of it, and cost nothing where they are folded into its anchor."""
        costs: dict[int, dict[str, float]] = {}
        refusals: dict[int, dict[str, str]] = {}
        for op in graph.ops:
            costs[op.index], refusals[op.index] = {}, {}
            pinned = [r for r in self.settings.pins if r.matches(op)]
            for name, be in self.backends.items():
                try:
                    answer = asked_support(be, op, self.options)
                except Exception as exc:  # a plugin bug must not break planning
                    answer = None
                    refusals[op.index][name] = f"support query failed: {type(exc).__name__}: {exc}"
                if answer is not None and not answer:
                    refusals[op.index][name] = answer.reason or "not supported"
                elif answer is not None:
                    denied = next((r for r in self.settings.denies
                                   if r.matches(op) and r.backend in (None, name)
                                   and not (r.backend is None and name == self.host)), None)
                    if denied is not None:
                        refusals[op.index][name] = f"denied by config rule ({denied.describe()})"
                    elif pinned and pinned[0].backend != name:
                        refusals[op.index][name] = f"pinned to {pinned[0].backend} by config"
                    else:
                        costs[op.index][name] = self.op_cost(op, name)
            if pinned and pinned[0].backend not in costs[op.index]:
                target = pinned[0].backend
                why = refusals[op.index].get(target, f"backend {target!r} is not in use")
                raise UnsupportedOpError(f"{op.describe()} is pinned to {target} but {target} cannot run it: {why}",
                                         op_index=op.index, opcode=op.opcode, backend=target)
            if not costs[op.index]:
                reasons = "; ".join(f"{b}: {r}" for b, r in refusals[op.index].items())
                raise UnsupportedOpError(f"{op.describe()} cannot run on any backend ({reasons})",
                                         op_index=op.index, opcode=op.opcode)
        self.groups(graph, costs)
        self.place_units(graph, costs, refusals)
        fold_group_costs(costs, {name: self.fold_ms(graph, name) for name in self.backends})
        for name in self.unmeasured_host_cores:
            for unit, host_ms, own_ms in self.unit_costs(graph, costs, name):
                if own_ms < host_ms:  # never measured: the host's own cores behind a GPU API are no faster
                    costs[unit[0].index][name] += host_ms - own_ms
        return costs, refusals

    def unit_costs(self, graph: Subgraph, costs: Mapping[int, Mapping[str, float]], backend: str):
        """(unit, host ms, ``backend`` ms) of each unit (the ops placement moves whole) both can run."""
        _, units = self.groups(graph)
        for unit in {id(u): u for u in units.values()}.values():
            if all(self.host in costs[o.index] and backend in costs[o.index] for o in unit):
                yield unit, sum(costs[o.index][self.host] for o in unit), sum(costs[o.index][backend] for o in unit)

    def fold_ms(self, graph: Subgraph, backend: str) -> dict[int, float]:
        """The ops ``backend`` folds (``folded``) and what each adds to the kernel computing it: a working fold
        (``cost.WORKING_FOLDS``) its fitted cost per input channel, the others nothing."""
        groups, _ = self.groups(graph)
        into = folded_into(groups[backend])
        profile = self.profiles[backend]
        ops = {op.index: op for op in graph.ops}
        return {index: profile.folded_ms(into[index][1], input_channels(ops[index])) if index in into else 0.0
                for index in self.folded(graph, backend)}

    def folded(self, graph: Subgraph, backend: str) -> set[int]:
        """The ops ``backend`` never runs on their own: folded into a group's anchor, or, where it folds
        constants, computing a compile-time constant."""
        groups, _ = self.groups(graph)
        constants = {op.index for op in graph.ops if folds_constant(op)} if "constant" in \
            self.backends[backend].fusions else set()
        return set(folded_into(groups[backend])) | constants

    # -- fused groups ------------------------------------------------------
    def groups(self, graph: Subgraph, costs: Mapping[int, Mapping[str, float]] | None = None
               ) -> tuple[dict[str, list[Group]], dict[int, tuple[Op, ...]]]:
        """Each backend's fused groups (``delegate.passes``, for the fusions it declares, among the ops it
        can run: ``costs``, as ``capabilities`` found them), and the units placement moves whole: op index
        -> the ops of its unit (groups of different backends that share an op merged), in topological
        order.  Without ``costs``: those ``capabilities`` found last for ``graph``."""
        key = id(graph)
        if costs is not None or self._groups.get(key, (None,))[0] is not graph:
            order = graph.topological_order()
            keep = {t.index for t in graph.outputs}
            groups = {name: be.placement_groups([op for op in order if costs is None or name in costs[op.index]],
                                                keep, self.options) for name, be in self.backends.items()}
            parent = {op.index: op.index for op in order}

            def root(i: int) -> int:
                while parent[i] != i:
                    parent[i] = i = parent[parent[i]]
                return i
            for found in groups.values():
                for g in found:
                    for op in g.folded:
                        parent[root(op.index)] = root(g.anchor.index)
            members: dict[int, list[Op]] = {}
            for op in order:
                members.setdefault(root(op.index), []).append(op)
            self._groups[key] = graph, groups, {op.index: tuple(members[root(op.index)]) for op in order}
        return self._groups[key][1:]

    def place_units(self, graph: Subgraph, costs: dict[int, dict[str, float]],
                    refusals: dict[int, dict[str, str]]) -> None:
        """Restrict every op of a unit to the backends that can run all of it (the backend's answer for the
        group), so that no placement cuts a group; a unit no backend runs whole stays a set of single ops."""
        _, units = self.groups(graph)
        for unit in {id(u): u for u in units.values() if len(u) > 1}.values():
            common = set.intersection(*(set(costs[op.index]) for op in unit))
            if not common:
                continue
            for op in unit:
                for name in set(costs[op.index]) - common:
                    blocker = next(o for o in unit if name not in costs[o.index])
                    del costs[op.index][name]
                    refusals[op.index][name] = (f"fused with op #{blocker.index} ({blocker.opcode}), which "
                                                f"{name} cannot run: {refusals[blocker.index].get(name, '')}")

    # -- assignment ------------------------------------------------------
    def evaluate(self, graph: Subgraph, assignment: Mapping[int, str],
                 costs: Mapping[int, Mapping[str, float]]) -> tuple[float, list[Copy]]:
        """Total estimated time of an assignment (its ops, copies, partitions and one run's fixed cost) and
        the copies it causes."""
        total = sum(costs[op.index].get(assignment[op.index], INF) for op in graph.ops)
        copies = [c for t in graph.tensors if not t.is_constant for c in self.tensor_copies(graph, t, assignment)]
        total += sum(c.ms for c in copies)
        total += sum(self.partition_ms(assignment[ops[0].index]) + self.boundary_ms(assignment[ops[0].index])
                     for ops in self.form_partitions(graph, assignment))
        return total + self.profiles[self.host].run_us * 1e-3, copies

    def tensor_copies(self, graph: Subgraph, t: Tensor, assignment: Mapping[int, str]) -> list[Copy]:
        """The copies of one value under an assignment: one per device reading it other than its producer's."""
        source = assignment[t.producer.index] if t.producer is not None else self.host
        destinations = {assignment[u.index] for u in t.uses}
        if any(o.index == t.index for o in graph.outputs):
            destinations.add(self.host)
        # a device-to-device move goes through the host
        return [Copy(t.index, t.name, source, dest, t.nbytes, self.transfer_cost(t, source) + self.transfer_cost(t, dest))
                for dest in sorted(destinations - {source})]

    def partition_estimate(self, graph: Subgraph, partition: Partition) -> float:
        """Estimated ms of one partition of ``graph`` run on its own backend: its ops (those its backend folds
        cost what they add to their reader's kernel, as in the plan's estimate) and its fixed cost."""
        fold_ms = self.fold_ms(graph, partition.backend)
        return sum(fold_ms[op.index] if op.index in fold_ms else self.op_cost(op, partition.backend)
                   for op in partition.ops) + self.partition_ms(partition.backend)

    def partition_ms(self, backend: str) -> float:
        """Fixed cost of running one partition on ``backend`` (submission, queue drain, engine call)."""
        return self.profiles[backend].partition_us * 1e-3

    def boundary_ms(self, backend: str) -> float:
        """What a partition on ``backend`` costs inside a plan beyond its time alone (``cost.refit_plan``)."""
        return self.profiles[backend].boundary_us * 1e-3

    def min_cut(self, graph: Subgraph, accel: str, costs: Mapping[int, Mapping[str, float]],
                boundary_scale: float = 1.0) -> dict[int, str]:
        """Exact CPU/accelerator assignment by s-t minimum cut (source side = accelerator).

        ``boundary_scale`` weighs the cut edges (copies and partition boundaries) up or down: the
        measured search tries such variants, since boundary costs are the least certain estimates.
        The source side is every node that cannot reach the sink in the residual graph of a maximum flow
        (the largest minimum cut, the same whichever maximum flow), found by scipy's max flow on
        capacities in nanoseconds: through networkx's Boykov-Kolmogorov, pose_landmark_full's six cuts took
        most of its 357 ms split search here, most of a load without a stored decision."""
        flows = FlowGraph()
        s, t = flows.node("source"), flows.node("sink")

        def cap(value: float) -> float:
            return _BIG if value == INF else value

        for op in graph.ops:
            c = costs[op.index]
            flows.add(s, flows.node(op.index), cap(c.get(self.host, INF)))  # cut when the op is on the CPU
            flows.add(flows.node(op.index), t, cap(c.get(accel, INF)))  # cut when the op is on the accelerator
        outputs = {o.index for o in graph.outputs}
        for tensor in graph.tensors:
            if tensor.is_constant or (not tensor.uses and tensor.index not in outputs):
                continue
            # a cut edge is a copy and a partition boundary on each side of it
            ms = (self.transfer_cost(tensor, accel) + self.partition_ms(accel) + self.boundary_ms(accel)
                  + self.partition_ms(self.host) + self.boundary_ms(self.host)) * boundary_scale
            producer = flows.node(tensor.producer.index) if tensor.producer is not None else None
            down, up = flows.node(("down", tensor.index)), flows.node(("up", tensor.index))
            # download once when produced on the accelerator and needed on the host
            if producer is not None:
                flows.add(producer, down, ms)
                for u in tensor.uses:
                    flows.add(down, flows.node(u.index), _BIG)
                if tensor.index in outputs:
                    flows.add(down, t, _BIG)
            # upload once when produced on the host and needed on the accelerator
            for u in tensor.uses:
                flows.add(flows.node(u.index), up, _BIG)
            flows.add(up, producer if producer is not None else t, ms)
        _, units = self.groups(graph)
        for op in graph.ops:  # a fused group is never cut (its ops were given the same backends)
            for other in units[op.index]:
                if other is not op and set(costs[other.index]) == set(costs[op.index]):
                    flows.add(flows.node(op.index), flows.node(other.index), _BIG)
        sink_side = flows.reaching_sink(s, t)
        return {op.index: (self.host if flows.node(op.index) in sink_side else accel) for op in graph.ops}

    def greedy(self, graph: Subgraph, accel: str, costs: Mapping[int, Mapping[str, float]]) -> dict[int, str]:
        """LiteRT's rule: every op the accelerator supports is delegated."""
        return {op.index: (accel if accel in costs[op.index] else self.host) for op in graph.ops}

    # -- partitions ------------------------------------------------------
    def form_partitions(self, graph: Subgraph, assignment: Mapping[int, str]) -> list[list[Op]]:
        """Group ops into partitions whose quotient graph is acyclic, a fused group in one partition.

        Units (fused groups, single ops) are taken in topological order; a unit joins the newest partition
        of its backend that is not older than any partition it reads from, else opens one.  Every edge
        then runs from an older partition to a newer (or the same) one.
        """
        groups: list[tuple[str, list[Op]]] = []
        part_of: dict[int, int] = {}
        for unit in self.unit_order(graph):
            backends = {assignment[op.index] for op in unit}
            for ops in [unit] if len(backends) == 1 else [[op] for op in unit]:  # an assignment cutting a group
                backend = assignment[ops[0].index]
                inside = {op.index for op in ops}
                deps = [part_of[t.producer.index] for op in ops for t in op.inputs
                        if t is not None and t.producer is not None and t.producer.index not in inside]
                floor = max(deps, default=-1)
                target = None
                for gi in range(len(groups) - 1, floor - 1, -1):
                    if gi < 0:
                        break
                    if groups[gi][0] == backend:
                        target = gi
                        break
                if target is None:
                    groups.append((backend, []))
                    target = len(groups) - 1
                groups[target][1].extend(ops)
                part_of.update((op.index, target) for op in ops)
        return [ops for _, ops in groups]

    def unit_order(self, graph: Subgraph) -> list[tuple[Op, ...]]:
        """The placement units in a topological order of the graph they make (the earliest ready first)."""
        _, units = self.groups(graph)
        position = {op.index: i for i, op in enumerate(graph.topological_order())}
        first = {op.index: units[op.index][0].index for op in graph.ops}
        waiting = {u: set() for u in set(first.values())}
        readers: dict[int, set[int]] = {u: set() for u in waiting}
        for op in graph.ops:
            for t in op.inputs:
                if t is not None and t.producer is not None and first[t.producer.index] != first[op.index]:
                    waiting[first[op.index]].add(first[t.producer.index])
                    readers[first[t.producer.index]].add(first[op.index])
        ready = [(position[u], u) for u, deps in waiting.items() if not deps]
        heapq.heapify(ready)
        order = []
        while ready:
            _, u = heapq.heappop(ready)
            order.append(units[u])
            for r in readers[u]:
                waiting[r].discard(u)
                if not waiting[r]:
                    heapq.heappush(ready, (position[r], r))
        return order

    def enforce_limits(self, graph: Subgraph, assignment: dict[int, str],
                       costs: Mapping[int, Mapping[str, float]], by_size: bool) -> tuple[dict[int, str], list[str]]:
        """Move partitions below ``min_nodes_per_partition`` or beyond ``max_delegated_partitions`` to the CPU.

        Which partitions stay: the largest by node count (``by_size``, LiteRT's rule) or
        those whose removal would cost the most time (the cost planner).
        """
        notes = []
        settings = self.settings
        while True:
            groups = [ops for ops in self.form_partitions(graph, assignment) if assignment[ops[0].index] != self.host]
            small = [ops for ops in groups if len(ops) < settings.min_nodes_per_partition]
            movable = [ops for ops in small if all(self.host in costs[o.index] for o in ops)]
            if movable:
                for ops in movable:
                    notes.append(f"partition of {len(ops)} op(s) starting at op #{ops[0].index} moved to "
                                 f"{self.host}: fewer than min_nodes_per_partition={settings.min_nodes_per_partition}")
                    for o in ops:
                        assignment[o.index] = self.host
                continue
            limit = settings.max_delegated_partitions
            if not limit or len(groups) <= limit:
                return assignment, notes
            base, _ = self.evaluate(graph, assignment, costs)

            def keep_score(ops: list[Op]) -> float:
                if by_size:
                    return len(ops)
                trial = dict(assignment)
                for o in ops:
                    if self.host not in costs[o.index]:
                        return INF
                    trial[o.index] = self.host
                return self.evaluate(graph, trial, costs)[0] - base

            ranked = sorted(groups, key=keep_score, reverse=True)
            dropped = ranked[limit:]
            dropped_any = False
            for ops in dropped:
                if not all(self.host in costs[o.index] for o in ops):
                    continue
                dropped_any = True
                notes.append(f"partition of {len(ops)} op(s) starting at op #{ops[0].index} moved to "
                             f"{self.host}: beyond max_delegated_partitions={limit}")
                for o in ops:
                    assignment[o.index] = self.host
            if not dropped_any:
                return assignment, notes

    # -- the whole pipeline --------------------------------------------------
    BOUNDARY_SCALES = (0.25, 4.0)  # min-cut variants among the candidates

    def candidates(self, graph: Subgraph) -> tuple[list[Candidate], dict, dict]:
        """Every assignment worth considering, with its estimate; also the per-op costs and refusals.

        The single backends alone (``baselines``), then the plans that split the model (``splits``).
        Duplicates are dropped."""
        costs, refusals = self.capabilities(graph)
        found = self.baselines(graph, costs)
        return found + self.splits(graph, costs, found), costs, refusals

    def baselines(self, graph: Subgraph, costs: Mapping[int, Mapping[str, float]]) -> list[Candidate]:
        """The CPU alone, and per accelerator greedy (LiteRT's rule, the accelerator alone): cheap to find,
        so a measured search compiles them while the others are searched."""
        cpu_only = {op.index: self.host if self.host in costs[op.index] else next(iter(costs[op.index]))
                    for op in graph.ops}
        found: list[tuple[str, dict[int, str], list[str]]] = [(self.host, cpu_only, [])]
        for accel in self.accelerators:
            found.append((f"greedy:{accel}", *self.enforce_limits(graph, self.greedy(graph, accel, costs), costs, True)))
        return self._distinct(graph, found, costs, [])

    def splits(self, graph: Subgraph, costs: Mapping[int, Mapping[str, float]],
               baselines: Sequence[Candidate]) -> list[Candidate]:
        """Per accelerator: the cost plan (min cut), min-cut variants with boundary costs scaled, and greedy
        with every partition that does not pay for itself (estimated) returned to the CPU; none of those
        that ``baselines`` (or another) already is."""
        found: list[tuple[str, dict[int, str], list[str]]] = []
        for accel in self.accelerators:
            if self.settings.partitioner == "greedy" or self.dominated(graph, accel, costs):
                continue
            found.append((f"cost:{accel}", *self.enforce_limits(graph, self.min_cut(graph, accel, costs), costs,
                                                                False)))
            for scale in self.BOUNDARY_SCALES:
                found.append((f"cost:{accel} boundaries x{scale:g}",
                              *self.enforce_limits(graph, self.min_cut(graph, accel, costs, scale), costs, False)))
            greedy, notes = self.enforce_limits(graph, self.greedy(graph, accel, costs), costs, True)
            found.append((f"trimmed:{accel}", *self.trim(graph, greedy, costs, notes)))
        return self._distinct(graph, found, costs, list(baselines))

    def _distinct(self, graph: Subgraph, found, costs, known: list[Candidate]) -> list[Candidate]:
        """``found`` (name, assignment, notes) as candidates, leaving out a plan ``known`` or found before."""
        out: list[Candidate] = []
        for name, assignment, notes in found:
            assignment = self.with_readers(graph, assignment, costs)
            same = next((c for c in known + out if c.assignment == assignment), None)
            if same is not None:  # the same plan reached another way: keep why the limits shaped it so
                if not name.startswith("trimmed:"):
                    same.notes.extend(n for n in notes if n not in same.notes)
                continue
            out.append(Candidate(name, assignment, self.evaluate(graph, assignment, costs)[0], list(notes),
                                 baseline=name == self.host or name.startswith("greedy:"),
                                 host_alone=name == self.host))
        return out

    def with_readers(self, graph: Subgraph, assignment: Mapping[int, str],
                     costs: Mapping[int, Mapping[str, float]]) -> dict[int, str]:
        """``assignment`` with each op of shape arithmetic on static shapes (``shapes.static_op``) where its readers
        are, when they are all on one backend that runs it, and on the host when its value is a graph output:
        such an op costs next to nothing anywhere, and a GPU lowering computes no value
        for other partitions (a RESHAPE pinned to the CPU read the shape a GPU partition gave it as zeros)."""
        out = dict(assignment)
        outputs = {t.index for t in graph.outputs}
        for op in reversed(graph.ops):
            if not static_op(op):
                continue
            readers = {out[u.index] for t in op.outputs for u in t.uses}
            if any(t.index in outputs for t in op.outputs):
                readers = {self.host}
            if len(readers) == 1 and next(iter(readers)) in costs[op.index]:
                out[op.index] = next(iter(readers))
        return out

    def dominated(self, graph: Subgraph, accel: str, costs: Mapping[int, Mapping[str, float]]) -> bool:
        """Whether no unit (the ops placement moves whole) is cheaper on ``accel`` than on the host, which runs
        them all: then every plan using it costs at least the CPU alone (copies and boundaries cost nothing
        less than nothing), and its min cuts need not be searched (a second each on a 300-op model here)."""
        if any(self.host not in c for c in costs.values() if accel in c):
            return False
        return all(own_ms >= host_ms for _, host_ms, own_ms in self.unit_costs(graph, costs, accel))

    def trim(self, graph: Subgraph, assignment: dict[int, str], costs, notes: list[str]) -> tuple[dict[int, str], list[str]]:
        """``assignment`` with accelerator partitions returned to the CPU, weakest first, each only when that
        lowers the estimate (2 evaluations per partition, so large greedy plans stay cheap to trim)."""
        notes = list(notes)
        base, _ = self.evaluate(graph, assignment, costs)
        movable = [ops for ops in self.form_partitions(graph, assignment)
                   if assignment[ops[0].index] != self.host and all(self.host in costs[o.index] for o in ops)]

        def without(ops, current):
            return {**current, **{o.index: self.host for o in ops}}
        gains = sorted(((self.evaluate(graph, without(ops, assignment), costs)[0] - base, i)
                        for i, ops in enumerate(movable)))
        for gain, i in gains:
            if gain >= 0:
                break
            trial = without(movable[i], assignment)
            total, _ = self.evaluate(graph, trial, costs)
            if total < base:
                assignment, base = trial, total
                notes.append(f"partition of {len(movable[i])} op(s) starting at op #{movable[i][0].index} "
                             f"returned to {self.host}: it did not pay for its copies and boundaries")
        return assignment, notes

    # A plan other than a single backend alone must be estimated this much faster than the best of those:
    # its extra boundaries are the least certain part of any estimate (on the H200, 2026-12-01, the
    # lowest estimate alone was within 1.05x of the best single backend on 12 of 21 models on OpenCL;
    # with this margin on 14, and on 21 of 21 on WebGPU).
    SPLIT_MARGIN = 0.8
    # A plan on an accelerator that borrows a measured sibling's figures (``cost.borrowed``: never measured
    # itself) must be estimated this much faster than the best plan without it to be chosen over it: on the
    # H200, 2026-12-04, WebGPU (whose calibration was refused) borrowed OpenCL's figures, came out 1% below
    # OpenCL's plan for MobileNetV2 and ran 2.4x slower.  (Default figures are conservative by themselves.)
    BORROWED_MARGIN = 0.8

    def plan(self, graph: Subgraph) -> Plan:
        """From estimates: the best single backend alone (the CPU, or an accelerator's greedy plan), unless
        another candidate is estimated clearly faster (``SPLIT_MARGIN``); LiteRT's greedy plan under
        ``partitioner: greedy``."""
        return self.plan_of_candidates(graph, *self.candidates(graph))

    def plan_of_candidates(self, graph: Subgraph, candidates: list[Candidate], costs, refusals) -> Plan:
        """``plan`` from candidates already found (a measured search finds them while it compiles)."""
        best, choice = self.choose(candidates)
        plan = self.plan_for(graph, best, costs, refusals)
        plan.candidates, plan.choice = candidates, choice
        return plan

    def choose(self, candidates: list[Candidate]) -> tuple[Candidate, str]:
        """The candidate estimates alone pick, and why: among all, unless the pick runs on an accelerator with
        borrowed figures and is not clearly faster than the pick among the candidates without one."""
        candidates = [c for c in candidates if not c.precision]
        pick, why = self._choose(candidates)
        own = [c for c in candidates if not self._borrowing(c)]
        if not own or not self._borrowing(pick):
            return pick, why
        safe, safe_why = self._choose(own)
        if pick.estimated_ms < self.BORROWED_MARGIN * safe.estimated_ms:
            return pick, why + f", and under {self.BORROWED_MARGIN:g}x the best plan on backends measured here"
        return safe, (f"{safe_why}; {pick.name} is not estimated under {self.BORROWED_MARGIN:g}x it, and "
                      f"{', '.join(self._borrowing(pick))} was never measured here (its figures are borrowed)")

    def _borrowing(self, candidate: Candidate) -> list[str]:
        """The accelerators ``candidate`` uses whose figures are another's."""
        return sorted(b for b in set(candidate.assignment.values()) if self.profiles[b].borrowed_from)

    def _choose(self, candidates: list[Candidate]) -> tuple[Candidate, str]:
        if self.settings.partitioner == "greedy":
            return min([c for c in candidates if c.name.startswith("greedy:")] or candidates,
                       key=lambda c: c.estimated_ms), "LiteRT's rule (partitioner: greedy)"
        single = min((c for c in candidates if c.baseline), key=lambda c: c.estimated_ms)
        split = min(candidates, key=lambda c: c.estimated_ms)
        if split.estimated_ms < self.SPLIT_MARGIN * single.estimated_ms:
            return split, f"estimated under {self.SPLIT_MARGIN:g}x the best single backend"
        return single, "lowest estimate of a single backend"

    def plan_for(self, graph: Subgraph, candidate: Candidate, costs=None, refusals=None) -> Plan:
        """The plan (partitions, copies, explanation) of one candidate assignment."""
        if costs is None:
            costs, refusals = self.capabilities(graph)
        assignment = self.with_readers(graph, candidate.assignment, costs)  # a stored decision may predate it
        total, copies = self.evaluate(graph, assignment, costs)
        partitions = [make_partition(graph, ops, assignment[ops[0].index], i)
                      for i, ops in enumerate(self.form_partitions(graph, assignment))]
        decisions = self.explain(graph, assignment, costs, refusals, copies)
        return Plan(graph, partitions, decisions, copies, total, self.settings.partitioner, self.accelerators,
                    list(candidate.notes), chosen=candidate.name, host=self.host,
                    profiles={name: p.describe() for name, p in self.profiles.items()})

    def explain(self, graph: Subgraph, assignment: Mapping[int, str], costs, refusals, copies) -> list[OpDecision]:
        """Per op: where it runs and why.  The assignment is decided for the whole graph, so an op on a backend
        where it alone is slower says what moving it alone would cost instead."""
        copies_into: dict[int, int] = {}
        for c in copies:
            t = graph.tensors[c.tensor]
            for u in t.uses:
                if assignment[u.index] == c.destination:
                    copies_into[u.index] = copies_into.get(u.index, 0) + 1
        groups, _ = self.groups(graph)
        folded = {name: folded_into(found) for name, found in groups.items()}
        out = []
        host = self.host
        for op in graph.ops:
            chosen = assignment[op.index]
            anchor, kind = folded.get(chosen, {}).get(op.index, (None, ""))
            est = {b: round(v, 5) for b, v in costs[op.index].items()}
            refused = refusals[op.index]
            cheaper = min((b for b in est if b != chosen and est[b] < est.get(chosen, INF)), key=est.get, default=None)
            if chosen == host and self.accelerators and all(a in refused for a in self.accelerators):
                reason = "; ".join(f"{a}: {refused[a]}" for a in self.accelerators)
            elif not self.accelerators:
                reason = f"{host} is the only backend in use"
            elif self.settings.partitioner == "greedy" and chosen == host:
                reason = "outside the kept partitions (greedy partitioner)"
            elif self.settings.partitioner == "greedy":
                reason = f"greedy partitioner (LiteRT's rule): every op {chosen} runs goes there; " + ", ".join(
                    f"{b} {est[b]:.4f} ms" for b in sorted(est, key=lambda b: b != chosen))
            elif cheaper is not None:
                reason = self._kept_reason(graph, assignment, op, chosen, cheaper, est)
            else:
                others = ", ".join(f"{b} {est[b]:.4f} ms" for b in est if b != chosen)
                fastest = all(est[chosen] < est[b] for b in est if b != chosen)
                reason = f"{'fastest' if fastest else 'no slower'} here: {chosen} {est[chosen]:.4f} ms" + (
                    f" vs {others}" if others else f" ({', '.join(sorted(refused))} cannot run it)" if refused else "")
            if anchor is not None:  # the anchor's line says why the group is where it is
                reason = f"fused into #{anchor} ({kind})"
            out.append(OpDecision(op.index, op.opcode, op.version, chosen, reason, est, dict(refused),
                                  copies_into.get(op.index, 0), anchor))
        return out

    def _kept_reason(self, graph, assignment, op, chosen, cheaper, est) -> str:
        """Why ``op`` stays on ``chosen`` although it alone is faster on ``cheaper``: what moving it alone would
        change in compute and copies (the values it reads and writes); when that is a saving, the plan's other
        terms (partitions, the choice among candidates) decided."""
        alone = f"alone {cheaper} {est[cheaper]:.4f} ms vs {chosen} {est[chosen]:.4f} ms"
        moved = {**assignment, op.index: cheaper}
        values = {t.index: t for t in [*op.inputs, *op.outputs] if t is not None and not t.is_constant}.values()
        now = [c for t in values for c in self.tensor_copies(graph, t, assignment)]
        then = [c for t in values for c in self.tensor_copies(graph, t, moved)]
        extra = est[cheaper] - est[chosen] + sum(c.ms for c in then) - sum(c.ms for c in now)
        if extra > 0:
            return (f"kept with its partition ({alone}): moving it alone would cost {extra:.4f} ms more, its own "
                    f"saving included ({len(then) - len(now):+d} copies)")
        return f"the plan is chosen as a whole ({alone}; partition costs or the choice among candidate plans decided)"
