"""The GPU kit's kernel plan: lifetime-shared buffers, the JSON round trip, and both backends planning
the same device memory for the same partition."""

from __future__ import annotations

import numpy as np
import pytest

from delegate import CompileOptions, read_model, zoo
from delegate.gpu.plan import BufferPlanner, KernelPlan
from delegate.partition import make_partition
from delegate.plugins import default_manager
from tests.models import normal, residual_block
from tests.oputil import assert_close, litert_run, require_backend

BACKENDS = ("opencl", "wgpu")


def test_scratch_values_share_a_buffer_once_their_lifetimes_end():
    """a lives in launches 0-1, b in 1-2, c in 2-3 and d in 3: c reuses a's buffer, d b's (grown to fit);
    the partition's input, output and constant keep their own."""
    planner = BufferPlanner(inputs=["x"], outputs=["y"])
    uses = [("x", 0), ("a", 0), ("w", 0), ("a", 1), ("b", 1), ("b", 2), ("c", 2), ("c", 3), ("d", 3), ("y", 3)]
    sizes = {"x": 16, "a": 64, "b": 32, "c": 48, "d": 40, "y": 16, "w": 8}
    for key, position in uses:
        planner.use(key, sizes[key], key == "w", position)
    planner.alias("view", "d")
    buffer_of, buffers, blob = planner.assign(lambda key: b"weights!")
    assert [(b.role, b.nbytes) for b in buffers] == [("input", 16), ("constant", 8), ("output", 16),
                                                     ("scratch", 64), ("scratch", 40)]
    assert buffer_of["c"] == buffer_of["a"] == 3 and buffer_of["d"] == buffer_of["b"] == buffer_of["view"] == 4
    assert bytes(blob) == b"weights!" and buffers[1].data == (0, 8)


def backend_of(name: str):
    require_backend(name)
    return default_manager().backend_info(name).factory({})


def compile_whole(backend, name: str, model: bytes, options: CompileOptions | None = None):
    g = read_model(model).main
    return g, backend.compile(make_partition(g, g.ops, name, 0), options or CompileOptions())


def run(backend, g, compiled, inputs):
    values = compiled.run({t.index: backend.to_device(x) for t, x in zip(g.inputs, inputs)})
    return [backend.to_host(values[t.index]) for t in g.outputs]


def plan_of(compiled) -> KernelPlan:
    return compiled.plan if hasattr(compiled, "plan") else compiled.program


@pytest.mark.parametrize("name", BACKENDS)
def test_a_plan_round_trips_through_json_and_runs_the_same(name):
    """The plan serialises to its JSON head and blob and reads back equal; the OpenCL runtime runs the
    plan read back with the same results, which match LiteRT."""
    backend = backend_of(name)
    rng = np.random.default_rng(3)
    model = residual_block(rng, gate=True).to_bytes()
    g, compiled = compile_whole(backend, name, model)
    plan = plan_of(compiled)
    again = type(plan).from_bytes(plan.to_bytes())
    assert again.to_json() == plan.to_json() and again.blob == plan.blob and again.key() == plan.key()
    assert {b.role for b in plan.buffers} >= {"input", "output", "constant"}
    inputs = [normal(rng, (1, 6, 5, 7)), normal(rng, (1, 6, 5, 6)), normal(rng, (1, 1, 1, 6))]
    expected = run(backend, g, compiled, inputs)
    assert_close(expected, litert_run(model, inputs), rtol=1e-4)
    if name == "opencl":
        from delegate_opencl.compiled import ClCompiled
        restored = ClCompiled(backend.state, make_partition(g, g.ops, name, 0), again, compiled.precision,
                              CompileOptions())
        np.testing.assert_array_equal(run(backend, g, restored, inputs)[0], expected[0])


def test_mobilenet_v1_plans_the_same_device_memory_on_both_backends():
    """Both backends share scratch buffers by lifetime through the kit's planner: MobileNet v1 holds the
    same bytes under OpenCL as under WebGPU (one buffer per tensor was 30.8 MB under OpenCL), and both match
    LiteRT; on both the first convolution reads the caller's NHWC floats where the host wrote them (one
    input buffer of 224 x 224 x 3 floats, no staging buffer)."""
    model = zoo.build("mobilenet_v1")
    data = np.random.default_rng(0).standard_normal((1, 224, 224, 3)).astype(np.float32)
    expected = litert_run(model, [data])
    planned = {}
    for name in BACKENDS:
        backend = backend_of(name)
        g, compiled = compile_whole(backend, name, model)
        assert_close(run(backend, g, compiled, [data]), expected, rtol=1e-4, atol=1e-5)
        facts = compiled.describe()
        assert facts["kernels"] == len(plan_of(compiled).launches) > 0
        planned[name] = facts["buffer_bytes"]
        padding = facts["device_bytes"] - sum(facts["buffer_bytes"].values())  # OpenCL's arena aligns its ranges
        assert 0 <= padding < 256 * len(plan_of(compiled).buffers) * (name == "opencl") + 1
    assert planned["opencl"] == planned["wgpu"]
    assert (planned["wgpu"]["input"], planned["wgpu"]["staging"]) == (224 * 224 * 3 * 4, 0)
    assert sum(planned["opencl"].values()) < 23e6


@pytest.mark.parametrize("name", BACKENDS)
def test_a_cached_plan_skips_the_lowering(name, tmp_path, monkeypatch):
    """With a cache directory and a model token the plan is stored; the next compile of the same
    partition reads it instead of lowering again, and runs the same."""
    backend = backend_of(name)
    rng = np.random.default_rng(5)
    model = residual_block(rng).to_bytes()
    options = CompileOptions(cache_dir=str(tmp_path), model_token="block")
    g, first = compile_whole(backend, name, model, options)
    assert first.describe()["plan_source"] == "planned"
    if name == "opencl":
        from delegate_opencl.lowering import ClLowering
        monkeypatch.setattr(ClLowering, "lower_all", lambda *args: pytest.fail("lowered again despite the cache"))
    else:
        from delegate_wgpu import backend as wgpu_backend
        monkeypatch.setattr(wgpu_backend, "build_program", lambda *args: pytest.fail("planned again despite the cache"))
    _, second = compile_whole(backend, name, model, options)
    assert second.describe()["plan_source"] == "cache" and plan_of(second).key() == plan_of(first).key()
    inputs = [normal(rng, (1, 6, 5, 7)), normal(rng, (1, 6, 5, 6))]
    np.testing.assert_array_equal(run(backend, g, second, inputs)[0], run(backend, g, first, inputs)[0])


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("shape, template", [((1, 3, 3, 256), "conv2d_split"), ((1, 24, 24, 8), "conv2d")])
def test_a_convolution_with_few_outputs_and_long_sums_splits_them_on_both_dialects(name, shape, template):
    """The convolution decision is the kit's: a 3x3 convolution over 256 channels into a 3x3x10 result (a
    detector head) shares each output's sum among a work group (conv2d_split) on both dialects, a wide
    one with short sums runs a work item per outputs (conv2d); both match LiteRT."""
    from tests.conformance_cases import conv
    backend = backend_of(name)
    model, inputs, _ = conv(np.random.default_rng(7), shape, 10, 3, {"padding": "SAME"})
    g, compiled = compile_whole(backend, name, model)
    assert [launch.kernel for launch in plan_of(compiled).launches] == [template]
    assert_close(run(backend, g, compiled, inputs), litert_run(model, inputs), rtol=1e-4, atol=1e-5)


def test_every_opencl_template_storing_in_host_order_stores_through_store_out():
    """The kit may ask any template OpenCL lists as a host writer to store its output in host order (NHWC
    float32, a smaller buffer than PHWC4): a template writing its output with STORE4 instead would write past
    that buffer.  Each one declares its output as OUT_STORAGE and stores it through STORE_OUT."""
    from importlib import resources

    from delegate_opencl.lowering import ClLowering
    from delegate_opencl.program import MAPPINGS

    kernels = resources.files("delegate_opencl").joinpath("kernels")
    for name in sorted(ClLowering.host_writers - set(MAPPINGS)):
        source = kernels.joinpath(f"{name}.cl").read_text()
        assert "BIND(OUT_STORAGE, out)" in source and "STORE_OUT(" in source, name
        assert not any(line.strip().startswith("STORE4(") and ", out, " in line for line in source.splitlines()), name


def test_every_wgsl_template_storing_in_host_order_stores_through_emit():
    """The kit may ask any template WebGPU lists as a host writer to store its output in host order (NHWC
    float32, a smaller buffer than PHWC4): a template writing its output binding itself would write past
    that buffer.  Each one (with the helpers it is assembled with) stores through ``emit`` only, and a
    kernel asked to store in host order binds its output as floats that ``emit`` writes lane by lane."""
    from delegate.gpu.lowering import Call, TensorArg
    from delegate_wgpu.kernels import HELPERS, KernelList, spell
    from delegate_wgpu.shaders import MAPPINGS, template

    for name in sorted(KernelList.host_writers - set(MAPPINGS)):
        source = "\n".join([template(name), *(template(helper) for helper in HELPERS.get(name, ()))])
        assert "emit(" in source, name
        assert "dst[" not in source and "dst_store(" not in source, name
    call = Call("elementwise", [TensorArg("src", 1, (1, 2, 2, 3))], [], output=(2, (1, 2, 2, 3)),
                constants=(("host_output", 1),))
    k = spell(call)
    assert [(b.name, b.element) for b in k.bindings if b.writable] == [("dst", "f32")]
    rendered = k.source("f16", 64)
    assert "dst[first + lane] = v[lane];" in rendered and "dst_store(" not in rendered


FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures" / "converter"
KERNEL_MODELS = {"mobilenet_v1": lambda: zoo.build("mobilenet_v1", alpha=0.25, size=64),
                 "mobilenet_ssd": lambda: zoo.build("mobilenet_ssd"),
                 "yolo_tiny": lambda: zoo.build("yolo_tiny", size=96, classes=4),
                 "transformer_block": lambda: zoo.build("transformer_block"),
                 "efficientnet_int8": lambda: (FIXTURES / "efficientnet_lite_blocks_int8.tflite").read_bytes(),
                 "efficientnet_int16x8": lambda: (FIXTURES / "efficientnet_lite_blocks_int16x8.tflite").read_bytes()}


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("model", sorted(KERNEL_MODELS))
def test_the_planner_costs_the_kernels_the_lowering_launches(name, model):
    """Placement groups and costs what a GPU lowering runs as one kernel (``placement_groups``): per
    partition, the ops the cost model charges are as many as the kernels compiled (a swish's MUL applied
    in its LOGISTIC's kernel was charged as a kernel of its own, doubling the estimate of every such pair)."""
    import delegate

    require_backend(name)
    session = delegate.load(read_model(KERNEL_MODELS[model]()), backends=f"[{name},cpu]", partitioner="greedy",
                            **{"placement.search": "estimate"})
    try:
        executor = session.executor  # the chosen plan, once the accelerators have started (host first)
        folded = session.planner.folded(session.graph, name)
        backend = session.backends[name]
        checked = 0
        for part, compiled in zip(session.plan.partitions, executor.compiled):
            if part.backend != name:
                continue
            charged = [op for op in part.ops if op.index not in folded
                       and backend.estimate_ms(op, session.settings.compile) != 0.0]
            assert len(charged) == len(compiled.describe()["launches"]), (part.index, compiled.describe()["launches"])
            checked += 1
        assert checked
    finally:
        session.close()


def test_an_integer_squeeze_and_excitation_block_runs_in_three_kernels_with_its_roundings():
    """An int8 squeeze-and-excitation block: the two one-pixel convolutions in one kernel, each of the first's
    rounding steps on a grid passed to it (OpenCL: HIDDEN_PARAMS; WebGPU: uniforms), and the gate product
    computed where the projection reads it, rounded onto the MUL's grid there (OpenCL: GATE_GRID and the grid
    as an argument; WebGPU: the rounded helper and its uniform), as their own kernels stored them."""
    import delegate
    from delegate.gpu.constants import activation_quant
    from tests.conformance_cases import CASES

    model = next(case for case in CASES if case.id == "CONV_2D:int8_squeeze_excite").make()[0]
    for backend in ("opencl", "wgpu"):
        require_backend(backend)
        session = delegate.load(model, None, backends=f"[{backend},cpu]", partitioner="greedy", allow_quantized=True,
                                **{"placement.search": "estimate"})
        gate = next(op for op in session.graph.ops if op.opcode == "MUL" and len(op.inputs[1].shape) == 4
                    and op.inputs[1].shape[1] == 1 and op.inputs[0].shape[1] > 1)
        grid = activation_quant(gate.outputs[0])
        compiled = session.executor.compiled[0]
        launches = compiled.describe()["launches"]
        assert len(launches) == 3 and launches[0].startswith("MEAN") and launches[2].startswith("MUL")
        assert [op.split("#")[0] for op in launches[1].split("+")] == ["CONV_2D", "LOGISTIC", "MUL", "CONV_2D",
                                                                       "LOGISTIC"]
        if backend == "opencl":
            chained, gated = (next(s for s in compiled.plan.launches if s.label == label) for label in launches[1:])
            assert ["GATE_GRID", 1] in [list(d) for d in gated.params["defines"]]
            assert ["float4", list(grid)] in gated.args
            hidden = dict((name, value) for name, value in chained.params["defines"])
            assert "fake_quant" in hidden["HIDDEN_ACT(v)"] and hidden["HIDDEN_PARAMS"].count("float4") == 3
        else:
            shaders = compiled.program.shaders
            assert any("fake_quant(V(src[i]) * V(gate[" in text and "p.gate_grid" in text for text in shaders)
            assert any("fn hidden_steps" in text and "p.h0" in text for text in shaders)
        session.close()


def test_an_integer_depthwise_convolution_staged_by_its_pointwise_reader_rounds_there():
    """OpenCL computes an int8 depthwise convolution where the 1x1 convolution reading it stages its input: one
    kernel, the depthwise convolution's roundings on grids passed to it (DEPTHWISE_GRIDS)."""
    import delegate
    from tests.conformance_cases import CASES

    require_backend("opencl")
    model = next(case for case in CASES if case.id == "DEPTHWISE_CONV_2D:int8_into_pointwise").make()[0]
    session = delegate.load(model, None, backends="[opencl,cpu]", partitioner="greedy", allow_quantized=True,
                            **{"placement.search": "estimate"})
    compiled = session.executor.compiled[0]
    (launch,) = compiled.plan.launches
    assert launch.label == "DEPTHWISE_CONV_2D#0+CONV_2D#1"
    defines = dict((name, value) for name, value in launch.params["defines"])
    assert defines["DEPTHWISE_GRIDS"].count("float4") == 1 and "fake_quant" in defines["DEPTHWISE_ACT(v)"]
    session.close()
