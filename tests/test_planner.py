"""Placement properties over random DAGs with fake backends."""

import copy
import dataclasses
import itertools
from unittest import mock

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, strategies as st

from delegate import Backend, CompileOptions, Support, read_model
from delegate.backend import ACCELERATOR, HOST
from delegate.cost import ACCELERATOR_DEFAULT
from delegate_cpu.plugin import DEFAULT_PROFILES as CPU_DEFAULTS
from delegate.errors import UnsupportedOpError
from delegate.planner import PlacementSettings, Planner, Rule
from delegate.tflite.builder import GraphBuilder

OPCODES = ["ADD", "MUL", "RELU", "TANH", "ABS", "SUB"]


class TableBackend(Backend):
    """A backend whose support and costs come from tables drawn by the test."""

    def __init__(self, name, supported, cost, transfer, accelerator=True):
        self.name, self.supported, self.cost, self.transfer = name, supported, cost, transfer
        self.role = ACCELERATOR if accelerator else HOST
        self.layout = "NHWC"

    def supports(self, op, options):
        return Support.yes() if op.index in self.supported else Support.no(f"table says no to op #{op.index}")

    def estimate_ms(self, op, options):
        return self.cost[op.index]

    def transfer_ms(self, nbytes):
        return self.transfer * nbytes / 32

    def compile(self, partition, options):
        raise NotImplementedError("planning-only backend")


@st.composite
def problems(draw, max_ops=12):
    n = draw(st.integers(2, max_ops))
    b = GraphBuilder()
    tensors = [b.input("x", (1, 8))]
    for i in range(n):
        code = draw(st.sampled_from(OPCODES))
        if code in ("ADD", "MUL", "SUB"):
            a = draw(st.sampled_from(tensors))
            c = draw(st.sampled_from(tensors))
            tensors.append(b.op(code, [a, c], options={"fused_activation_function": "NONE"}))
        else:
            tensors.append(b.op(code, [draw(st.sampled_from(tensors))]))
    unused = [t for t in tensors[1:] if not any(t in op.inputs for op in b.ops)]
    b.output(*(unused or tensors[-1:]))
    model = read_model(b.to_bytes())
    supported = {i for i in range(n) if draw(st.booleans()) or draw(st.booleans())}
    cpu_cost = [draw(st.floats(0.01, 2.0)) for _ in range(n)]
    gpu_cost = [draw(st.floats(0.001, 1.0)) for _ in range(n)]
    transfer = draw(st.floats(0.0, 1.0))
    return model.main, supported, cpu_cost, gpu_cost, transfer


def make_planner(supported, cpu_cost, gpu_cost, transfer, settings=None, partition_costs=True):
    n = len(cpu_cost)
    backends = {"gpu": TableBackend("gpu", supported, gpu_cost, transfer),
                "cpu": TableBackend("cpu", set(range(n)), cpu_cost, 0.0, accelerator=False)}
    # copies: a test that refits its planner's profiles must not change the defaults other tests plan with
    profiles = {"gpu": copy.deepcopy(ACCELERATOR_DEFAULT), "cpu": copy.deepcopy(CPU_DEFAULTS["numpy"])}
    if not partition_costs:
        profiles = {k: dataclasses.replace(p, partition_us=0.0) for k, p in profiles.items()}
    return Planner(backends, profiles, CompileOptions(), settings or PlacementSettings())


def check_partitions(graph, plan):
    seen = [i for p in plan.partitions for i in p.op_indices]
    assert sorted(seen) == [op.index for op in graph.ops], "every op in exactly one partition"
    part_of = {i: p.index for p in plan.partitions for i in p.op_indices}
    quotient = nx.DiGraph()
    quotient.add_nodes_from(p.index for p in plan.partitions)
    for op in graph.ops:
        for t in op.inputs:
            if t is not None and t.producer is not None and part_of[t.producer.index] != part_of[op.index]:
                quotient.add_edge(part_of[t.producer.index], part_of[op.index])
    assert nx.is_directed_acyclic_graph(quotient)
    for u, v in quotient.edges:
        assert u < v, "partitions run in index order"


@given(problems())
def test_partitions_cover_and_are_acyclic(problem):
    graph, supported, cpu, gpu, transfer = problem
    for mode in ("cost", "greedy"):
        plan = make_planner(supported, cpu, gpu, transfer, PlacementSettings(partitioner=mode)).plan(graph)
        check_partitions(graph, plan)
        for p in plan.partitions:
            if p.backend == "gpu":
                assert set(p.op_indices) <= supported


@given(problems(), st.integers(0, 3))
def test_cost_plan_never_worse_than_greedy(problem, limit):
    graph, supported, cpu, gpu, transfer = problem
    cost = make_planner(supported, cpu, gpu, transfer,
                        PlacementSettings("cost", max_delegated_partitions=limit)).plan(graph)
    greedy = make_planner(supported, cpu, gpu, transfer,
                          PlacementSettings("greedy", max_delegated_partitions=limit)).plan(graph)
    assert cost.estimated_ms <= greedy.estimated_ms + 1e-9
    if limit:
        assert len(cost.delegated) <= limit


def _brute_force(planner, graph, supported):
    costs, _ = planner.capabilities(graph)
    best = np.inf
    for choice in itertools.product(["cpu", "gpu"], repeat=len(graph.ops)):
        if any(c == "gpu" and i not in supported for i, c in enumerate(choice)):
            continue
        best = min(best, planner.evaluate(graph, dict(enumerate(choice)), costs)[0])
    return best


@given(problems(max_ops=10))
def test_min_cut_equals_brute_force(problem):
    """With copies as the only boundary cost, the min cut is the exact optimum."""
    graph, supported, cpu, gpu, transfer = problem
    planner = make_planner(supported, cpu, gpu, transfer, partition_costs=False)
    cheapest = min(c.estimated_ms for c in planner.plan(graph).candidates)
    assert cheapest == pytest.approx(_brute_force(planner, graph, supported), rel=1e-9, abs=1e-9)


@given(problems(max_ops=14), st.sampled_from([0.25, 1.0, 4.0]), st.sampled_from([1.0, 1e4]))
def test_min_cut_assigns_as_a_float_max_flow_does(problem, scale, slow):
    """The integer max flow is a speed choice only: every node lands on the side networkx's float max flow
    (preflow push) puts it, on the same graph; costs ``slow`` times larger exercise the coarser units."""
    from delegate import planner as planner_module
    graph, supported, cpu, gpu, transfer = problem
    planner = make_planner(supported, [c * slow for c in cpu], [c * slow for c in gpu], transfer)
    costs, _ = planner.capabilities(graph)
    seen = []
    real = planner_module.FlowGraph.reaching_sink

    def compared(flows, source, sink):
        ours = real(flows, source, sink)
        g = nx.DiGraph()
        g.add_nodes_from(range(len(flows.ids)))
        for u, v, ms in flows.edges:
            if ms >= planner_module._BIG:
                continue  # no capacity: infinite to networkx
            if g.has_edge(u, v) and "capacity" in g[u][v]:
                g[u][v]["capacity"] += ms
            elif not g.has_edge(u, v):
                g.add_edge(u, v, capacity=ms)
        for u, v, ms in flows.edges:
            if ms >= planner_module._BIG:
                if g.has_edge(u, v):
                    g[u][v].pop("capacity", None)
                else:
                    g.add_edge(u, v)
        _, (_, reference) = nx.minimum_cut(g, source, sink)
        seen.append((ours, set(reference)))
        return ours
    with mock.patch.object(planner_module.FlowGraph, "reaching_sink", compared):
        planner.min_cut(graph, "gpu", costs, scale)
    assert seen and all(ours == reference for ours, reference in seen)


def test_min_cut_never_takes_an_uncuttable_edge_however_large_the_costs():
    """Parallel uncuttable edges and finite costs whose nanoseconds pass 2**31 (scipy's max flow is 32-bit):
    an op only the accelerator runs stays there, the rest goes where it is cheaper."""
    graph = _chain(4)
    planner = make_planner({0, 1, 2, 3}, [5e4, 1.0, 5e4, 1.0], [1.0, 5e4, 1.0, 5e4], 0.0)
    costs, _ = planner.capabilities(graph)
    costs[0].pop("cpu")  # only the accelerator runs op 0
    cut = planner.min_cut(graph, "gpu", costs)
    assert cut == {0: "gpu", 1: "cpu", 2: "gpu", 3: "cpu"}


@given(problems(max_ops=10))
def test_plan_with_partition_costs_beats_every_single_backend(problem):
    """Fixed partition costs make the optimum a harder problem (the min cut charges them per cut edge):
    the plan is never costlier than the CPU alone or greedy, and the cheapest candidate is close to the
    optimum."""
    graph, supported, cpu, gpu, transfer = problem
    planner = make_planner(supported, cpu, gpu, transfer)
    plan = planner.plan(graph)
    singles = [c.estimated_ms for c in plan.candidates if c.baseline]
    assert plan.estimated_ms <= min(singles) + 1e-12
    best = _brute_force(planner, graph, supported)
    cheapest = min(c.estimated_ms for c in plan.candidates)
    assert best - 1e-9 <= cheapest <= best + 2 * ACCELERATOR_DEFAULT.partition_us * 1e-3


def _chain(n=6):
    b = GraphBuilder()
    t = b.input("x", (1, 8))
    for _ in range(n):
        t = b.op("RELU", [t], name="relu")
    b.output(t)
    return read_model(b.to_bytes()).main


def test_min_nodes_and_pins_and_denies():
    graph = _chain()
    n = len(graph.ops)
    everything = set(range(n))
    fast = [0.001] * n
    slow = [1.0] * n
    plan = make_planner(everything, slow, fast, 0.0,
                        PlacementSettings(min_nodes_per_partition=n + 1)).plan(graph)
    assert all(p.backend == "cpu" for p in plan.partitions)
    assert any("min_nodes_per_partition" in note for note in plan.notes)
    plan = make_planner(everything, slow, fast, 0.0,
                        PlacementSettings(denies=[Rule(backend="gpu", index=2)])).plan(graph)
    assert plan.decisions[2].backend == "cpu" and "denied" in plan.decisions[2].refusals["gpu"]
    plan = make_planner(everything, fast, slow, 0.0,
                        PlacementSettings(pins=[Rule(backend="gpu", op="RELU", index=3)])).plan(graph)
    assert plan.decisions[3].backend == "gpu"
    with pytest.raises(UnsupportedOpError, match="pinned to gpu"):
        make_planner(set(), fast, slow, 0.0, PlacementSettings(pins=[Rule(backend="gpu", index=0)])).plan(graph)


def test_litert_words_in_summary_and_warnings():
    graph = _chain(4)
    plan = make_planner({0, 1, 3}, [1.0] * 4, [0.001] * 4, 0.0, PlacementSettings("greedy")).plan(graph)
    assert plan.summary() == "Replacing 3 out of 4 node(s) with delegate (gpu) node, yielding 2 partitions"
    assert plan.warnings() == ["op code #2 (RELU) cannot be handled by this delegate"]
    doc = plan.to_dict()
    assert {"partitions", "copies", "estimated_ms"} <= set(doc)
    assert all({"backend", "ops"} <= set(p) for p in doc["partitions"])


def test_copy_paid_once_per_destination():
    b = GraphBuilder()
    x = b.input("x", (1, 8))
    y = b.op("RELU", [x], name="producer")
    b.output(b.op("TANH", [y], name="c1"), b.op("ABS", [y], name="c2"))
    graph = read_model(b.to_bytes()).main
    planner = make_planner({0}, [1.0, 0.1, 0.1], [0.001] * 3, 1.0)
    costs, _ = planner.capabilities(graph)
    total, copies = planner.evaluate(graph, {0: "gpu", 1: "cpu", 2: "cpu"}, costs)
    assert [(c.tensor, c.destination) for c in copies if c.source == "gpu"] == [(y.index, "cpu")]


def test_why_says_an_op_slower_where_it_runs_was_kept_for_the_whole_plan():
    """The reason of one op's backend: its own numbers when it is fastest there, else what moving it alone costs."""
    graph = _chain(5)
    cpu, gpu = [1.0, 1.0, 0.04, 1.0, 1.0], [0.001, 0.001, 0.05, 0.001, 0.001]
    planner = make_planner(set(range(5)), cpu, gpu, 1.0)
    plan = planner.plan(graph)
    assert [d.backend for d in plan.decisions] == ["gpu"] * 5
    op = graph.ops[2]
    moved = [c for t in (op.inputs[0], op.outputs[0])
             for c in planner.tensor_copies(graph, t, {**{i: "gpu" for i in range(5)}, 2: "cpu"})]
    assert len(moved) == 2 and not any(c.tensor in (op.inputs[0].index, op.outputs[0].index) for c in plan.copies)
    assert plan.decisions[2].reason == (
        f"kept with its partition (alone cpu 0.0400 ms vs gpu 0.0500 ms): moving it alone would cost "
        f"{sum(c.ms for c in moved) - 0.01:.4f} ms more, its own saving included (+2 copies)")
    assert plan.decisions[0].reason == "fastest here: gpu 0.0010 ms vs cpu 1.0000 ms"


@pytest.mark.parametrize("gpu_ms, chosen", [(0.9, "cpu"), (0.5, "greedy:gpu")])
def test_an_accelerator_with_borrowed_figures_must_win_clearly(gpu_ms, chosen):
    """An accelerator never measured here that borrows a measured sibling's figures is not conservative the
    way the defaults are: its plan is taken from estimates only when clearly (BORROWED_MARGIN) faster than
    the best plan without it, and the choice says why; with its own figures the lower estimate wins."""
    graph = _chain()
    planner = make_planner(set(range(6)), [1.0] * 6, [gpu_ms] * 6, 0.0, partition_costs=False)
    assert planner.plan(graph).chosen == "greedy:gpu"
    planner.profiles["gpu"].borrowed_from = "opencl"
    plan = planner.plan(graph)
    assert plan.chosen == chosen
    if chosen == "cpu":
        assert "gpu was never measured here (its figures are borrowed)" in plan.choice
