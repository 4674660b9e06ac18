"""The shared fusion passes and their placement: a fused group (a PAD and its convolution, constants and the
convolution reading them, an activation and its producer) runs on one backend in one partition, costs one
kernel there, and the result matches LiteRT."""

import numpy as np
import pytest
from hypothesis import given, settings

from delegate import CompileOptions, read_model
from delegate.passes import CHAIN_MAX_WEIGHTS, find_groups
from delegate.planner import PlacementSettings, Rule
from delegate.session import RunSettings, Session
from delegate.tflite.builder import GraphBuilder
from tests.models import normal, sparse_conv_model
from tests.oputil import assert_close, litert_run, require_backend
from tests.test_planner import check_partitions, make_planner, problems

GPUS = pytest.mark.parametrize("backend", ["opencl", "wgpu"])
CONV = {"padding": "VALID", "stride_h": 1, "stride_w": 1, "fused_activation_function": "NONE"}


def pad_conv_relu(rng) -> bytes:
    """PAD -> VALID CONV_2D -> RELU."""
    b = GraphBuilder()
    x = b.input("x", (1, 9, 7, 8))
    padded = b.op("PAD", [x, b.const("pads", np.array([[0, 0], [1, 1], [2, 0], [0, 0]], np.int32))])
    conv = b.op("CONV_2D", [padded, b.const("w", normal(rng, (6, 3, 3, 8))), b.const("b", normal(rng, 6))],
                options=CONV)
    b.output(b.op("RELU", [conv]))
    return b.to_bytes()


def dequantized_conv(rng) -> bytes:
    """int8 weights quantized per output channel -> DEQUANTIZE -> CONV_2D."""
    scales = rng.uniform(0.01, 0.05, 6).astype(np.float32)
    q = rng.integers(-127, 128, (6, 3, 3, 4)).astype(np.int8)
    b = GraphBuilder()
    x = b.input("x", (1, 6, 6, 4))
    w = b.op("DEQUANTIZE", [b.const("w", q, quant=(scales, np.zeros(6, np.int64), 0))], dtype="float32")
    b.output(b.op("CONV_2D", [x, w, b.const("b", normal(rng, 6))], options=CONV))
    return b.to_bytes()


def session(model: bytes, backend: str, **placement) -> Session:
    return Session(read_model(model), RunSettings(
        backends=[(backend, {}), ("cpu", {"engine": "numpy"})],
        compile=CompileOptions(precision="fp32", allow_quantized=True),
        placement=PlacementSettings(partitioner="greedy", **placement), fallback=False))


def check(s: Session, model: bytes, inputs) -> None:
    out = s.run(inputs)
    assert_close([out[t.name] for t in s.graph.outputs], litert_run(model, inputs, builtin=True), rtol=1e-4,
                 atol=1e-4)


@GPUS
@pytest.mark.parametrize("make", [pad_conv_relu, sparse_conv_model, dequantized_conv])
def test_group_runs_whole_on_the_gpu(backend, make):
    """Every op of the group in one GPU partition, the folded ones marked and free there."""
    require_backend(backend)
    rng = np.random.default_rng(0)
    model = make(rng)
    s = session(model, backend)
    assert [p.backend for p in s.plan.partitions] == [backend]
    anchor = next(op.index for op in s.graph.ops if op.opcode == "CONV_2D")
    for d in s.plan.decisions:
        if d.index != anchor:
            assert d.fused_into == anchor and d.reason.startswith(f"fused into #{anchor} (")
            assert d.estimates_ms[backend] == 0.0
    check(s, model, [normal(rng, t.shape) for t in s.graph.inputs])


@GPUS
def test_pad_is_never_cut_from_its_convolution(backend):
    """The GPU may not run the PAD (denied by config): greedy placement would put the convolution and its
    RELU there and the PAD on the CPU.  The group stays whole: all three on the CPU, fused there."""
    require_backend(backend)
    rng = np.random.default_rng(1)
    model = pad_conv_relu(rng)
    s = session(model, backend, denies=[Rule(backend=backend, op="PAD")])
    assert [p.backend for p in s.plan.partitions] == ["cpu"]
    assert "fused with op #0 (PAD)" in s.plan.decisions[1].refusals[backend]
    assert s.executor.compiled[0].describe()["fused"] == {"0": 1, "2": 1}
    check(s, model, [normal(rng, (1, 9, 7, 8))])


def test_groups_follow_the_declared_fusions():
    """The same graph, grouped for a backend folding pads and activations and for one folding nothing."""
    graph = read_model(pad_conv_relu(np.random.default_rng(2))).main
    (group,) = find_groups(graph.ops, {"pad", "activation"})
    assert group.anchor.opcode == "CONV_2D" and [op.opcode for op in group.folded] == ["PAD", "RELU"]
    assert group.kinds == ("pad", "activation")
    assert find_groups(graph.ops, {"pad"})[0].kinds == ("pad",)
    assert find_groups(graph.ops, ()) == []
    # a result the caller needs is not folded
    assert find_groups(graph.ops, {"activation"}, keep={graph.ops[1].outputs[0].index}) == []


def test_a_residual_add_folds_into_the_convolution_it_follows_when_its_other_operand_is_ready():
    """Two int8 convolutions of one input, then their ADD: only the second convolution can add the
    first's result as it stores (the first runs before the second's result exists)."""
    rng = np.random.default_rng(4)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 3), "int8", quant=(0.05, 0))
    results = [b.op("CONV_2D", [x, b.const(f"w{i}", rng.integers(-127, 128, (3, 1, 1, 3)).astype(np.int8),
                                            quant=(0.01, 0))], dtype="int8", quant=(0.1, 0),
                    options={"padding": "VALID", "stride_h": 1, "stride_w": 1}) for i in range(2)]
    b.output(b.op("ADD", results, dtype="int8", quant=(0.2, 0)))
    graph = read_model(b.to_bytes()).main
    groups = find_groups(graph.ops, {"residual"})
    assert [(g.anchor.index, tuple(op.index for op in g.folded), g.kinds) for g in groups] == [(1, (2,), ("residual",))]
    assert find_groups(graph.ops, {"epilogue"}) == []  # a float kind: not for int8


def test_a_clamp_after_a_float_residual_add_folds_with_it_as_that_adds_activation():
    """conv, conv, ADD of their results, then a separate RELU: the second convolution adds the first's
    result and clamps as it stores; a result the caller needs is not folded."""
    rng = np.random.default_rng(6)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 3))
    results = [b.op("CONV_2D", [x, b.const(f"w{i}", rng.standard_normal((3, 1, 1, 3)).astype(np.float32))],
                    options={"padding": "VALID", "stride_h": 1, "stride_w": 1}) for i in range(2)]
    added = b.op("ADD", results)
    b.output(b.op("RELU", [added]))
    graph = read_model(b.to_bytes()).main
    (group,) = find_groups(graph.ops, {"residual", "activation"})
    assert (group.anchor.index, [op.opcode for op in group.folded], group.kinds) == \
        (1, ["ADD", "RELU"], ("residual", "activation"))
    (group,) = find_groups(graph.ops, {"residual", "activation"}, keep={added.index})
    assert [op.opcode for op in group.folded] == ["ADD"]


class FusingTable:
    """Table backends of tests.test_planner that fold activations (the CPU) and epilogues too (the GPU)."""

    def __init__(self, problem):
        graph, supported, cpu, gpu, transfer = problem
        self.graph = graph
        self.planners = []
        for mode in ("cost", "greedy"):
            planner = make_planner(supported, cpu, gpu, transfer, PlacementSettings(partitioner=mode))
            planner.backends["cpu"].fusions = frozenset({"activation"})
            planner.backends["gpu"].fusions = frozenset({"activation", "epilogue"})
            self.planners.append(planner)


@settings(max_examples=60, deadline=None)
@given(problems())
def test_placement_never_splits_a_group(problem):
    """Over random graphs and supports: every candidate plan keeps each unit on one backend, in one partition."""
    table = FusingTable(problem)
    for planner in table.planners:
        plan = planner.plan(table.graph)
        check_partitions(table.graph, plan)
        _, units = planner.groups(table.graph)
        for candidate in plan.candidates:
            partitions = planner.plan_for(table.graph, candidate).partitions
            part_of = {i: p.index for p in partitions for i in p.op_indices}
            for unit in units.values():
                assert len({part_of[op.index] for op in unit}) == 1, (candidate.name, unit)


def squeeze_excite_and_separable(rng) -> bytes:
    """A depthwise convolution -> RELU6 -> 1x1 convolution (a separable block); a gate MUL of another input by
    one value per channel -> 1x1 convolution; the ADD of both -> RELU."""
    b = GraphBuilder()
    x, r = b.input("x", (1, 6, 6, 8)), b.input("r", (1, 6, 6, 8))
    gate = b.input("gate", (1, 1, 1, 8))
    dw = b.op("DEPTHWISE_CONV_2D", [x, b.const("dw", normal(rng, (1, 3, 3, 8))), b.const("db", normal(rng, 8))],
              options={**CONV, "padding": "SAME", "depth_multiplier": 1})
    pw = b.op("CONV_2D", [b.op("RELU6", [dw]), b.const("pw", normal(rng, (8, 1, 1, 8))), b.const("pb", normal(rng, 8))],
              options=CONV)
    gated = b.op("CONV_2D", [b.op("MUL", [r, gate], options={"fused_activation_function": "NONE"}),
                             b.const("gw", normal(rng, (8, 1, 1, 8))), b.const("gb", normal(rng, 8))], options=CONV)
    b.output(b.op("RELU", [b.op("ADD", [pw, gated], options={"fused_activation_function": "NONE"})]))
    return b.to_bytes()


def test_gate_depthwise_pointwise_and_epilogue_groups():
    """With the OpenCL backend's fusions: the depthwise convolution and its RELU6 fold into the pointwise one,
    whose epilogue takes the ADD and the RELU; the gate MUL folds into the convolution reading it.  The CPU's
    fusions group only the RELU6 with the depthwise convolution and the RELU with the ADD."""
    graph = read_model(squeeze_excite_and_separable(np.random.default_rng(3))).main
    opencl = {"constant", "pad", "activation", "epilogue", "gate", "depthwise_pointwise"}
    described = {(g.anchor.index, tuple(op.index for op in g.folded), g.kinds) for g in find_groups(graph.ops, opencl)}
    assert described == {(2, (0, 1, 5, 6), ("depthwise_pointwise", "activation", "epilogue", "activation")),
                         (4, (3,), ("gate",))}
    cpu = {(g.anchor.index, tuple(op.index for op in g.folded)) for g in find_groups(graph.ops, {"activation"})}
    assert cpu == {(0, (1,)), (5, (6,))}


def bottleneck(rng, units: int = 3) -> bytes:
    """MEAN over the image -> 1x1 convolution -> RELU -> 1x1 convolution -> LOGISTIC, one pixel: the
    bottleneck of a squeeze-and-excitation block."""
    b = GraphBuilder()
    x = b.input("x", (2, 5, 5, 12))
    pooled = b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": True})
    hidden = b.op("CONV_2D", [pooled, b.const("w1", normal(rng, (units, 1, 1, 12))), b.const("b1", normal(rng, units))],
                  options=CONV)
    gate = b.op("CONV_2D", [b.op("RELU", [hidden]), b.const("w2", normal(rng, (12, 1, 1, units))),
                            b.const("b2", normal(rng, 12))], options=CONV)
    b.output(b.op("LOGISTIC", [gate]))
    return b.to_bytes()


def test_a_chain_of_two_one_pixel_convolutions_is_one_group():
    """With the GPU backends' fusions the first bottleneck convolution and its RELU fold into the second
    (``chain``), whose epilogue takes the LOGISTIC; not without the fusion, nor past CHAIN_MAX_WEIGHTS
    weights in a layer."""
    gpu = {"constant", "pad", "activation", "epilogue", "gate", "depthwise_pointwise", "chain"}
    graph = read_model(bottleneck(np.random.default_rng(5))).main
    described = {(g.anchor.index, tuple(op.index for op in g.folded), g.kinds) for g in find_groups(graph.ops, gpu)}
    assert described == {(3, (1, 2, 4), ("chain", "activation", "epilogue"))}
    assert all("chain" not in g.kinds for g in find_groups(graph.ops, gpu - {"chain"}))
    wide = read_model(bottleneck(np.random.default_rng(5), units=CHAIN_MAX_WEIGHTS // 12 + 1)).main
    assert all("chain" not in g.kinds for g in find_groups(wide.ops, gpu))


def test_reshapes_read_only_by_a_concatenation_travel_with_it():
    """With either GPU backend's fusions a concatenation's reshaped inputs are its group (``reshape``): it
    reads through them; the RELU before one of them stays apart.  Both backends declare what their
    lowering folds (``fusions_of`` their dialect's folds): the same kinds but the depthwise convolution
    WebGPU's products do not compute."""
    from delegate_opencl.backend import OpenCLBackend
    from delegate_wgpu.backend import WgpuBackend
    from tests.conformance_cases import CASES
    model, _, _ = next(c for c in CASES if c.id == "CONCATENATION:reshaped_inputs").make()
    graph = read_model(model).main
    assert OpenCLBackend.fusions == WgpuBackend.fusions | {"depthwise_pointwise"}
    assert "depthwise_pointwise" not in WgpuBackend.fusions
    for fusions in (OpenCLBackend.fusions, WgpuBackend.fusions):
        described = {(g.anchor.index, tuple(op.index for op in g.folded), g.kinds) for g in find_groups(graph.ops, fusions)}
        assert described == {(3, (1, 2), ("reshape", "reshape"))}
        assert find_groups(graph.ops, fusions - {"reshape"}) == []


@GPUS
def test_a_chain_runs_as_one_kernel_and_matches_litert(backend):
    require_backend(backend)
    rng = np.random.default_rng(6)
    model = bottleneck(rng)
    s = session(model, backend)
    assert [p.backend for p in s.plan.partitions] == [backend]
    assert s.executor.compiled[0].describe()["launches"] == ["MEAN#0", "CONV_2D#1+RELU#2+CONV_2D#3+LOGISTIC#4"]
    check(s, model, [normal(rng, t.shape) for t in s.graph.inputs])


@GPUS
def test_fused_blocks_match_litert(backend):
    require_backend(backend)
    rng = np.random.default_rng(4)
    model = squeeze_excite_and_separable(rng)
    s = session(model, backend)
    assert [p.backend for p in s.plan.partitions] == [backend]
    check(s, model, [normal(rng, t.shape) for t in s.graph.inputs])
