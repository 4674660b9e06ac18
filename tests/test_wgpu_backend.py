"""The WebGPU backend beyond single kernels: adapters, refusals, fusion, boundaries, the plan cache."""

import os
import stat
import threading
import time
import warnings

import numpy as np
import pytest
from hypothesis import given, strategies as st

from delegate import CompileOptions, read_model
from delegate.errors import CacheError, PluginError
from delegate.native import find_compiler
from delegate.cache import CacheWarning
from delegate.partition import make_partition
from delegate.planner import PlacementSettings
from delegate.plugins import default_manager
from delegate.runtime import Executor
from delegate.session import RunSettings, Session
from delegate.tflite.builder import GraphBuilder
from tests.models import normal, residual_block, squeeze_excitation
from tests.oputil import assert_close, litert_run

INFO = default_manager().backend_info("wgpu")
_available, _why = INFO.available()
pytestmark = pytest.mark.skipif(not _available, reason=f"no WebGPU adapter: {_why}")
RTOL = 1e-4


@pytest.fixture(scope="module")
def backend():
    return INFO.factory({})


def compile_whole(backend, model: bytes, options=None):
    g = read_model(model).main
    return g, backend.compile(make_partition(g, g.ops, "wgpu", 0), options or CompileOptions())


def run_compiled(backend, g, compiled, inputs):
    values = compiled.run({t.index: backend.to_device(x) for t, x in zip(g.inputs, inputs)})
    return [backend.to_host(values[t.index]) for t in g.outputs]


# -- adapters ---------------------------------------------------------------------------------

def test_devices_are_listed_for_the_cli():
    devices = INFO.list_devices()
    assert devices and all("(" in d and ")" in d for d in devices)
    ok, reason = INFO.available()
    assert ok and reason in devices


def test_device_info_names_adapter_driver_features_and_limits(backend):
    info = backend.device_info()
    assert info["backend"] == "wgpu" and info["adapter"] and info["backend_type"] and info["driver"]
    assert info["shader_f16"] == ("shader-f16" in info["features"])
    for limit in ("max-storage-buffer-binding-size", "max-storage-buffers-per-shader-stage",
                  "max-compute-invocations-per-workgroup"):
        assert info["limits"][limit] > 0


def test_every_adapter_can_be_chosen_by_api_and_name():
    from delegate_wgpu.device import adapters
    for adapter in adapters():
        api = adapter.info["backend_type"].lower()
        option = next(k for k, names in {"vulkan": ("vulkan",), "metal": ("metal",), "dx12": ("d3d12",),
                                         "gl": ("opengl", "opengles")}.items() if api in names)
        chosen = INFO.factory({"backend_type": option, "adapter": adapter.info["device"][:8]}).device_info()
        assert chosen["backend_type"] == adapter.info["backend_type"]
        assert chosen["adapter"] == adapter.info["device"]


def test_no_matching_adapter_lists_the_adapters():
    with pytest.raises(PluginError) as info:
        INFO.factory({"adapter": "no such gpu"})
    message = str(info.value)
    assert "no adapter matches adapter~'no such gpu'" in message and "adapters found:" in message
    assert all(d in message for d in INFO.list_devices())


@pytest.mark.parametrize("options, needle", [
    ({"device": "x"}, "unknown option(s) device; valid options: power_preference"),
    ({"power_preference": "fastest"}, "not one of high-performance, low-power"),
    ({"backend_type": "cuda"}, "not one of vulkan, metal, dx12, gl, any"),
    ({"limits": {"max_texture_size": 4}}, "unknown limit 'max_texture_size'"),
    ({"limits": {"max_buffer_size": 0}}, "must be a positive integer"),
    ({"workgroup_size": 1 << 20}, "workgroup_size 1048576 exceeds"),
])
def test_invalid_options_say_what_is_valid(options, needle):
    with pytest.raises(PluginError, match=None) as info:
        INFO.factory(options)
    assert needle in str(info.value)


# -- refusals -----------------------------------------------------------------------------------

def conv_model(rng, cin=3, cout=4, size=5, runtime_weights=False, version=1):
    b = GraphBuilder()
    x = b.input("x", (1, size, size, cin))
    w = b.input("w", (cout, 3, 3, cin)) if runtime_weights else b.const("w", normal(rng, (cout, 3, 3, cin)))
    b.output(b.op("CONV_2D", [x, w, b.const("b", normal(rng, cout))], version=version,
                  options={"padding": "SAME", "stride_w": 1, "stride_h": 1}))
    return b


def concat_model(count):
    b = GraphBuilder()
    b.output(b.op("CONCATENATION", [b.input(f"x{i}", (1, 2, 2, 3)) for i in range(count)], options={"axis": 3}))
    return b


def answer(backend, b, index=0, options=None):
    return backend.supports(read_model(b.to_bytes()).main.ops[index], options or CompileOptions())


def test_refusals_name_their_reason(backend):
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    b.output(b.op("LOG_SOFTMAX", [x]))
    assert "has no GPU kernel" in answer(backend, b).reason
    assert "must be a constant" in answer(backend, conv_model(rng, runtime_weights=True)).reason
    assert "version 3" in answer(backend, conv_model(rng, version=3)).reason
    b = GraphBuilder()
    x = b.input("x", (1, 2, 2, 3))
    b.output(b.op("ADD", [x, x], options={"fused_activation_function": "TANH"}))
    assert "TANH" in answer(backend, b).reason


def test_adapter_limits_force_refusals():
    rng = np.random.default_rng(1)
    few_buffers = INFO.factory({"limits": {"max_storage_buffers_per_shader_stage": 4}})
    reason = answer(few_buffers, concat_model(4)).reason
    assert reason == "needs 5 storage buffers in one kernel; the adapter allows 4 per stage"
    assert answer(few_buffers, concat_model(3))
    small = INFO.factory({"limits": {"max_storage_buffer_binding_size": 1024}})
    reason = answer(small, conv_model(rng, cin=8, size=6)).reason
    assert reason.startswith("tensor 'x' needs a 1152-byte buffer; the adapter binds at most 1024 bytes")
    reason = answer(small, conv_model(rng, cin=16, cout=9, size=2)).reason
    assert reason.startswith("packed weights need") or "packed weights" in reason
    assert answer(small, conv_model(rng, cin=3, size=4))


def test_the_plan_explains_a_refusal_and_runs_the_op_on_the_cpu():
    rng = np.random.default_rng(2)
    data = concat_model(4).to_bytes()
    settings = RunSettings(backends=[("wgpu", {"limits": {"max_storage_buffers_per_shader_stage": 4}}), ("cpu", {})],
                           placement=PlacementSettings(partitioner="greedy"))
    session = Session(read_model(data), settings)
    decision = session.plan.decisions[0]
    assert decision.backend == "cpu" and "storage buffers" in str(session.plan.to_dict())
    inputs = [normal(rng, (1, 2, 2, 3)) for _ in range(4)]
    out = session.run(inputs)
    assert_close([out[session.graph.outputs[0].name]], litert_run(data, inputs))


# -- fusion ---------------------------------------------------------------------------------------

def gated_residual_block(rng, extra_output=False) -> bytes:
    return residual_block(rng, extra_output, gate=True).to_bytes()


def test_fusion_reduces_dispatches_and_keeps_results(backend):
    rng = np.random.default_rng(3)
    model = gated_residual_block(rng)
    inputs = [normal(rng, (1, 6, 5, 7)), normal(rng, (1, 6, 5, 6)), normal(rng, (1, 1, 1, 6))]
    expected = litert_run(model, inputs)
    g, fused = compile_whole(backend, model)
    assert fused.describe()["kernels"] == 1 and fused.describe()["fused"] == [[0, 1, 2, 3, 4]]
    g, unfused = compile_whole(INFO.factory({"fuse": False}), model)
    assert unfused.describe()["kernels"] == 5
    for compiled in (fused, unfused):
        assert_close(run_compiled(backend, g, compiled, inputs), expected, rtol=RTOL, atol=1e-5)
    _, split = compile_whole(backend, gated_residual_block(rng, extra_output=True))  # the ADD result leaves the partition
    assert split.describe()["kernels"] == 2


def test_fusion_stops_at_the_storage_buffer_limit():
    rng = np.random.default_rng(4)
    model = gated_residual_block(rng)
    narrow = INFO.factory({"limits": {"max_storage_buffers_per_shader_stage": 5}})
    g, compiled = compile_whole(narrow, model)
    assert compiled.describe()["kernels"] == 2  # conv (4 buffers) + residual (5); the gate starts a kernel
    inputs = [normal(rng, (1, 6, 5, 7)), normal(rng, (1, 6, 5, 6)), normal(rng, (1, 1, 1, 6))]
    assert_close(run_compiled(narrow, g, compiled, inputs), litert_run(model, inputs), rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("op, kernel, stride, padding", [("DEPTHWISE_CONV_2D", 3, 2, "VALID"),
                                                        ("CONV_2D", 3, 1, "SAME"), ("CONV_2D", 1, 1, "VALID")])
def test_zero_padding_is_read_through_by_the_convolution(backend, op, kernel, stride, padding):
    """PAD then convolution (how the converter writes asymmetric padding) is one kernel; a PAD read
    twice, or padding channels, keeps its own."""
    rng = np.random.default_rng(19)

    def model(pads, second_reader=False):
        b = GraphBuilder()
        x = b.input("x", (1, 7, 8, 5))
        padded = b.op("PAD", [x, b.const("pads", np.array(pads, np.int32))])
        channels = 5 + sum(pads[3])
        if op == "DEPTHWISE_CONV_2D":
            weights, options = (1, kernel, kernel, channels), {"depth_multiplier": 1}
        else:
            weights, options = (6, kernel, kernel, channels), {}
        y = b.op(op, [padded, b.const("w", normal(rng, weights)), b.const("b", normal(rng, weights[0] if
                                                                                      op == "CONV_2D" else channels))],
                 options={"padding": padding, "stride_h": stride, "stride_w": stride, **options})
        b.output(b.op("ADD", [y, y]) if not second_reader else y)
        if second_reader:
            b.output(b.op("RELU", [padded]))
        return b.to_bytes()
    inputs = [normal(rng, (1, 7, 8, 5))]
    for pads, second_reader, dispatches in [([[0, 0], [1, 2], [2, 1], [0, 0]], False, 2),
                                            ([[0, 0], [1, 2], [2, 1], [0, 0]], True, 3),
                                            ([[0, 0], [1, 0], [0, 1], [0, 3]], False, 3)]:
        data = model(pads, second_reader)
        g, compiled = compile_whole(backend, data)
        assert compiled.describe()["kernels"] == dispatches
        assert_close(run_compiled(backend, g, compiled, inputs), litert_run(data, inputs), rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("batch, gate_batch, gate_first", [(1, 1, False), (2, 2, True), (2, 1, False)])
def test_channel_gate_is_applied_by_the_next_1x1_convolution(backend, batch, gate_batch, gate_first):
    """Squeeze-and-excitation: the MUL by a per-channel gate runs inside the 1x1 convolution reading it."""
    rng = np.random.default_rng(20)
    b = GraphBuilder()
    x = b.input("x", (batch, 5, 6, 7))
    g = b.input("g", (gate_batch, 1, 1, 7))
    gated = b.op("MUL", [g, x] if gate_first else [x, g])
    b.output(b.op("CONV_2D", [gated, b.const("w", normal(rng, (9, 1, 1, 7))), b.const("b", normal(rng, 9))],
                  options={"padding": "VALID", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"}))
    data = b.to_bytes()
    g, compiled = compile_whole(backend, data)
    assert compiled.describe()["kernels"] == 1 and compiled.describe()["launches"] == ["MUL#0+CONV_2D#1"]
    inputs = [normal(rng, (batch, 5, 6, 7)), normal(rng, (gate_batch, 1, 1, 7))]
    assert_close(run_compiled(backend, g, compiled, inputs), litert_run(data, inputs), rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("batch, channels, precision", [(1, 16, "fp32"), (2, 37, "fp32"), (1, 96, "fp16")])
def test_squeeze_and_excitation_in_three_kernels(backend, batch, channels, precision):
    """Global pooling; both bottleneck convolutions in one workgroup; the gate applied by the projection."""
    rng = np.random.default_rng(21)
    b = squeeze_excitation(rng, batch, channels, fused_relu=False)
    data = b.to_bytes()
    g, compiled = compile_whole(backend, data, CompileOptions(precision=precision))
    assert compiled.describe()["kernels"] == 3
    inputs = [normal(rng, (batch, 6, 7, channels))]
    tolerance = 2e-2 if compiled.program.storage == "f16" else RTOL
    assert_close(run_compiled(backend, g, compiled, inputs), litert_run(data, inputs), rtol=tolerance, atol=1e-5)


@pytest.mark.parametrize("multiplier, stride, dilation, relu, channels", [
    (1, 2, 1, True, 12), (2, 1, 2, False, 10), (1, 1, 1, False, 160)])
def test_depthwise_then_1x1_runs_as_two_kernels(backend, multiplier, stride, dilation, relu, channels):
    """Unlike OpenCL, whose product stages its input: a depthwise convolution read only by a 1x1 convolution
    keeps its own kernel (matmul.wgsl would compute it once per group of output slices), and the pair
    still matches LiteRT."""
    rng = np.random.default_rng(31)
    c = channels // multiplier
    b = GraphBuilder()
    x = b.input("x", (1, 9, 8, c))
    dw = b.op("DEPTHWISE_CONV_2D", [x, b.const("dw", normal(rng, (1, 3, 3, channels))), b.const("db", normal(rng, channels))],
              options={"padding": "SAME", "stride_h": stride, "stride_w": stride, "depth_multiplier": multiplier,
                       "dilation_h_factor": dilation, "dilation_w_factor": dilation,
                       "fused_activation_function": "RELU6" if relu else "NONE"}, version=2 if dilation > 1 else 1)
    b.output(b.op("CONV_2D", [dw, b.const("pw", normal(rng, (7, 1, 1, channels))), b.const("pb", normal(rng, 7))],
                  options={"padding": "VALID", "stride_w": 1, "stride_h": 1}))
    data = b.to_bytes()
    g, compiled = compile_whole(backend, data)
    assert compiled.describe()["launches"] == ["DEPTHWISE_CONV_2D#0", "CONV_2D#1"]
    inputs = [normal(rng, (1, 9, 8, c))]
    assert_close(run_compiled(backend, g, compiled, inputs), litert_run(data, inputs), rtol=RTOL, atol=1e-5)


def _shaders_of(compiled, template: str) -> list[str]:
    program = compiled.program
    return [program.shaders[d.params["shader"]] for d in program.launches if d.kernel == template]


@pytest.mark.parametrize("multiplier", [1, 2])
def test_the_depthwise_multiplier_is_a_shader_constant(backend, multiplier):
    """The channel multiplier is compiled into the depthwise shader, not read from the uniform in the tap
    loop (where it is 1 the lane gathers compile out), and the result matches LiteRT."""
    rng = np.random.default_rng(32)
    channels = 8 * multiplier
    b = GraphBuilder()
    x = b.input("x", (1, 7, 9, 8))
    b.output(b.op("DEPTHWISE_CONV_2D", [x, b.const("w", normal(rng, (1, 3, 3, channels))),
                                        b.const("b", normal(rng, channels))],
                  options={"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": multiplier}))
    data = b.to_bytes()
    g, compiled = compile_whole(backend, data)
    (source,) = _shaders_of(compiled, "depthwise_conv2d")
    assert f"const MULTIPLIER: i32 = {multiplier};" in source and "p.multiplier" not in source
    inputs = [normal(rng, (1, 7, 9, 8))]
    assert_close(run_compiled(backend, g, compiled, inputs), litert_run(data, inputs), rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("fill", [None, 0.0, 2.5])
def test_a_zero_pad_fill_is_a_shader_constant(backend, fill):
    """PAD (and PADV2 with a zero fill) pads with the shader's constant zero; another PADV2 fill is read
    from the uniform; all match LiteRT."""
    rng = np.random.default_rng(33)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 5, 6))
    pads = b.const("p", np.array([[0, 0], [1, 2], [2, 1], [0, 0]], np.int32))
    operands = [x, pads] if fill is None else [x, pads, b.const("v", np.array(fill, np.float32))]
    b.output(b.op("PAD" if fill is None else "PADV2", operands))
    data = b.to_bytes()
    g, compiled = compile_whole(backend, data)
    (source,) = _shaders_of(compiled, "gather")
    assert ("p.fill" in source) == bool(fill)
    inputs = [normal(rng, (1, 4, 5, 6))]
    assert_close(run_compiled(backend, g, compiled, inputs), litert_run(data, inputs), rtol=RTOL, atol=1e-5)


def test_chained_folds_are_done_once_each(backend):
    """Three 1x1 convolutions of one pixel behind a PAD: the PAD folds into the first, which then runs on
    its own; the second and third run as one pair."""
    rng = np.random.default_rng(23)
    b = GraphBuilder()
    x = b.input("x", (1, 1, 1, 6))
    v = b.op("PAD", [x, b.const("pads", np.array([[0, 0], [0, 0], [0, 0], [0, 0]], np.int32))])
    for i, (cin, cout) in enumerate([(6, 5), (5, 7), (7, 3)]):
        v = b.op("CONV_2D", [v, b.const(f"w{i}", normal(rng, (cout, 1, 1, cin))), b.const(f"b{i}", normal(rng, cout))],
                 options={"padding": "VALID", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"})
    b.output(v)
    data = b.to_bytes()
    g, compiled = compile_whole(backend, data)
    assert compiled.describe()["launches"] == ["PAD#0+CONV_2D#1", "CONV_2D#2+CONV_2D#3"]
    inputs = [normal(rng, (1, 1, 1, 6))]
    assert_close(run_compiled(backend, g, compiled, inputs), litert_run(data, inputs), rtol=RTOL, atol=1e-5)


# -- layout and boundaries --------------------------------------------------------------------

@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple), seed=st.integers(0, 2**16))
def test_device_layout_round_trip(backend, shape, seed):
    """Host -> PHWC4 buffer -> host through a partition whose only op is a free reshape (no dispatch)."""
    b = GraphBuilder()
    x = b.input("x", shape)
    n, h, w, c = (1,) * (4 - len(shape)) + shape
    flat = (n, 1, h * w, c) if len(shape) == 4 else (h * w, c)  # keeps N, H*W and C: the same PHWC4 bytes
    b.output(b.op("RESHAPE", [x, b.const("s", np.array(flat, np.int32))]))
    g, compiled = compile_whole(backend, b.to_bytes())
    assert compiled.describe()["kernels"] == 0
    data = normal(np.random.default_rng(seed), shape, 10)
    np.testing.assert_array_equal(run_compiled(backend, g, compiled, [data])[0], data.reshape(flat))


@pytest.mark.parametrize("shape, fp32_converts", [((1, 5, 6, 3), True), ((2, 3, 4, 4), False), ((1, 1, 1, 8), False),
                                                  ((7, 9), True), ((6,), False), ((1, 2, 2, 8), True)])
def test_boundary_layouts_are_converted_on_the_device(backend, shape, fp32_converts):
    """NHWC in, NHWC out: uploaded as the caller's array and read back as the host's, in fp32 and fp16
    storage; only fp32 tensors whose NHWC values start their PHWC4 storage (four channels, whole slices
    of one pixel, one pixel of one image) skip the input's conversion kernel, and the output of any other
    is stored in host order by the RELU kernel itself (no conversion kernel either)."""
    b = GraphBuilder()
    x = b.input("x", shape)
    b.output(b.op("RELU", [x]))
    data = normal(np.random.default_rng(11), shape, 4)
    for precision, tolerance in (("fp32", 0), ("fp16", 4e-3)):
        g, compiled = compile_whole(backend, b.to_bytes(), CompileOptions(precision=precision))
        needed = compiled.program.storage == "f16" or fp32_converts
        assert [spec.convert is not None for spec in compiled.program.inputs] == [needed]
        assert [(spec.convert, spec.host_layout) for spec in compiled.program.outputs] == [(None, needed)]
        out = run_compiled(backend, g, compiled, [data])[0]
        np.testing.assert_allclose(out, np.maximum(data, 0), rtol=tolerance, atol=tolerance)


def test_read_back_joins_the_run_once_the_host_reads_an_output(backend):
    """The first read copies on its own; later runs record the copy, and every read sees its own run."""
    b = GraphBuilder()
    x = b.input("x", (1, 3, 5, 6))
    b.output(b.op("RELU", [x]))
    g, compiled = compile_whole(backend, b.to_bytes())
    rng = np.random.default_rng(12)
    (tensor,) = compiled.results.values()
    for step in range(4):
        data = normal(rng, (1, 3, 5, 6))
        value = compiled.run({g.inputs[0].index: backend.to_device(data)})[g.outputs[0].index]
        assert value.fresh == (step > 0)
        if step != 2:  # a run whose result nobody reads still keeps the copy current
            np.testing.assert_array_equal(backend.to_host(value), np.maximum(data, 0))
    assert tensor.wanted


def test_the_first_read_of_a_run_brings_every_output_it_copied_back(backend, monkeypatch):
    """Three outputs copied into one read-back buffer: the first read of a run maps it once and brings all
    three to the host, the others then map nothing; a run whose outputs were not all read replaces them,
    and every read sees its own run."""
    from wgpu.backends.wgpu_native import GPUBuffer

    b = GraphBuilder()
    x = b.input("x", (1, 3, 5, 6))
    b.output(b.op("RELU", [x]), b.op("NEG", [x]), b.op("ABS", [x]))
    g, compiled = compile_whole(backend, b.to_bytes())
    compiled.read_hint(None)
    maps = []
    original = GPUBuffer.map_async if hasattr(GPUBuffer, "map_async") else None
    monkeypatch.setattr(GPUBuffer, "map_async", lambda self, *a, **k: (maps.append(self), original(self, *a, **k))[1])
    original_sync = GPUBuffer.map_sync
    monkeypatch.setattr(GPUBuffer, "map_sync", lambda self, *a, **k: (maps.append(self), original_sync(self, *a, **k))[1])
    rng = np.random.default_rng(13)
    expected = (lambda d: np.maximum(d, 0), lambda d: -d, np.abs)
    for step in range(4):
        data = normal(rng, (1, 3, 5, 6))
        values = compiled.run({g.inputs[0].index: backend.to_device(data)})
        tensors = [values[t.index] for t in g.outputs]
        read = [0] if step == 2 else range(3)  # step 2 leaves two outputs unread
        maps.clear()
        for k in read:
            np.testing.assert_array_equal(backend.to_host(tensors[k]), expected[k](data))
        assert len(maps) == 1 and maps[0] is compiled.readback.buffer  # one map brought them all
    assert len({t.offset for t in compiled.outputs}) == 3 and all(t.offset % 256 == 0 for t in compiled.outputs)


def test_quantized_boundaries_go_through_the_float_view(backend):
    """int8 in, int8 out: dequantized on upload, requantized on read-back, exactly."""
    b = GraphBuilder()
    x = b.input("x", (1, 3, 5, 6), "int8", quant=(0.1, -3))
    b.output(b.op("RESHAPE", [x, b.const("s", np.array((1, 15, 6), np.int32))], dtype="int8", quant=(0.1, -3)))
    g, compiled = compile_whole(backend, b.to_bytes(), CompileOptions(allow_quantized=True))
    data = np.random.default_rng(5).integers(-128, 128, (1, 3, 5, 6)).astype(np.int8)
    out = run_compiled(backend, g, compiled, [data])[0]
    assert out.dtype == np.int8
    np.testing.assert_array_equal(out, data.reshape(1, 15, 6))


def test_values_stay_on_the_device_between_partitions(backend):
    """wgpu -> cpu -> wgpu: the first partition's result reaches the third without visiting the host."""
    rng = np.random.default_rng(6)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 5))
    y = b.op("CONV_2D", [x, b.const("w", normal(rng, (6, 1, 1, 5))), b.const("b", normal(rng, 6))],
             options={"padding": "VALID", "stride_w": 1, "stride_h": 1})
    z = b.op("SQUARE", [y])
    b.output(b.op("ADD", [y, z]))
    data = b.to_bytes()
    g = read_model(data).main
    cpu = default_manager().backend_info("cpu").factory({})
    parts = [make_partition(g, g.ops[:1], "wgpu", 0), make_partition(g, g.ops[1:2], "cpu", 1),
             make_partition(g, g.ops[2:], "wgpu", 2)]
    executor = Executor(g, parts, {"wgpu": backend, "cpu": cpu}, CompileOptions())
    inputs = [normal(rng, (1, 4, 4, 5))]
    out = executor.run({g.inputs[0].index: inputs[0]})
    assert executor.transfers_last_run == 4  # x up, y down (for SQUARE), z up, the result down
    assert_close([out[g.outputs[0].index]], litert_run(data, inputs), rtol=RTOL, atol=1e-5)



@pytest.mark.parametrize("gpu_first", [True, False])
def test_folded_constants_across_partitions(backend, gpu_first):
    """float16 weights behind DEQUANTIZE: folded whichever side the DEQUANTIZEs land on, and a folded value
    that leaves the GPU partition (the bias, also used on the CPU) is delivered from its constant buffer."""
    rng = np.random.default_rng(10)
    b = GraphBuilder()
    x = b.input("x", (1, 5, 5, 3))
    w = b.op("DEQUANTIZE", [b.const("w16", normal(rng, (4, 3, 3, 3)).astype(np.float16))], dtype="float32")
    bias = b.op("DEQUANTIZE", [b.const("b16", normal(rng, 4).astype(np.float16))], dtype="float32")
    b.output(b.op("CONV_2D", [x, w, bias], options={"padding": "VALID", "stride_w": 1, "stride_h": 1}))
    b.output(b.op("ADD", [bias, bias]))
    data = b.to_bytes()
    g = read_model(data).main
    cut, names = (3, ("wgpu", "cpu")) if gpu_first else (2, ("cpu", "wgpu"))
    parts = [make_partition(g, g.ops[:cut], names[0], 0), make_partition(g, g.ops[cut:], names[1], 1)]
    cpu = default_manager().backend_info("cpu").factory({})
    inputs = [normal(rng, (1, 5, 5, 3))]
    out = Executor(g, parts, {"wgpu": backend, "cpu": cpu}, CompileOptions()).run({g.inputs[0].index: inputs[0]})
    assert_close([out[t.index] for t in g.outputs], litert_run(data, inputs), rtol=RTOL, atol=1e-5)

# -- the plan cache ---------------------------------------------------------------------------

def deep_model(seed=7, layers=16, width=32):
    """Enough layers with weights that planning (packing, WGSL) costs something."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    v = b.input("x", (1, 8, 8, width))
    for i in range(layers):
        v = b.op("CONV_2D", [v, b.const(f"w{i}", normal(rng, (width, 3, 3, width), 0.1)),
                             b.const(f"b{i}", normal(rng, width))],
                 options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU6"})
        v = b.op("DEPTHWISE_CONV_2D", [v, b.const(f"d{i}", normal(rng, (1, 3, 3, width), 0.3)),
                                       b.const(f"c{i}", normal(rng, width))],
                 options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "depth_multiplier": 1})
    b.output(b.op("MEAN", [v, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": False}))
    return b.to_bytes()


def cached_options(tmp_path, token="deep"):
    return CompileOptions(cache_dir=str(tmp_path / "cache"), model_token=token)


def test_second_compile_reuses_the_plan(backend, tmp_path):
    """A second compile with the cache takes the plan from it (what it saves, planning, WGSL generation
    and weight packing, is measured by the benchmark, not here) and runs the same."""
    model = deep_model()
    g = read_model(model).main
    partition = make_partition(g, g.ops, "wgpu", 0)
    options = cached_options(tmp_path)
    first = backend.compile(partition, options)
    assert first.describe()["plan_source"] == "planned"
    second = backend.compile(partition, options)
    assert second.describe()["plan_source"] == "cache"
    inputs = [normal(np.random.default_rng(8), (1, 8, 8, 32))]
    expected = run_compiled(backend, g, first, inputs)
    np.testing.assert_array_equal(run_compiled(backend, g, second, inputs)[0], expected[0])
    assert_close(expected, litert_run(model, inputs), rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_corrupt_entries_are_rebuilt_with_a_warning(backend, tmp_path, damage):
    g = read_model(deep_model()).main
    partition = make_partition(g, g.ops, "wgpu", 0)
    options = cached_options(tmp_path, f"damaged-{damage}")
    backend.compile(partition, options)
    (entry,) = (tmp_path / "cache" / "wgpu").glob("*.plan")
    raw = bytearray(entry.read_bytes())
    if damage == "flip":
        raw[-100] ^= 0xFF
    elif damage == "truncate":
        raw = raw[:len(raw) // 2]
    else:
        raw = bytearray(b"not a cache entry")
    entry.write_bytes(bytes(raw))
    with pytest.warns(CacheWarning, match="rebuilding it"):
        rebuilt = backend.compile(partition, options)
    assert rebuilt.describe()["plan_source"] == "planned"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backend.compile(partition, options).describe()["plan_source"] == "cache"


def test_entries_are_keyed_by_precision(backend, tmp_path):
    g = read_model(deep_model()).main
    partition = make_partition(g, g.ops, "wgpu", 0)
    backend.compile(partition, cached_options(tmp_path, "keyed"))
    half = CompileOptions(precision="fp16", cache_dir=str(tmp_path / "cache"), model_token="keyed")
    assert backend.compile(partition, half).describe()["plan_source"] == "planned"
    assert len(list((tmp_path / "cache" / "wgpu").glob("*.plan"))) == 2


def test_new_weights_under_the_same_token_are_planned_again(backend, tmp_path):
    """Issue 17 #8: the plan cache, keyed by the token alone, ran a new model's inputs through old weights."""
    options = cached_options(tmp_path, "same-token")
    inputs = [normal(np.random.default_rng(9), (1, 8, 8, 16))]
    for seed, expected_source in ((1, "planned"), (2, "planned"), (2, "cache")):
        model = deep_model(seed, layers=2, width=16)
        g = read_model(model).main
        compiled = backend.compile(make_partition(g, g.ops, "wgpu", 0), options)
        assert compiled.describe()["plan_source"] == expected_source
        assert_close(run_compiled(backend, g, compiled, inputs), litert_run(model, inputs), rtol=RTOL, atol=1e-5)


def test_cache_directory_is_private_and_unsafe_ones_are_refused(backend, tmp_path):
    g = read_model(concat_model(2).to_bytes()).main
    partition = make_partition(g, g.ops, "wgpu", 0)
    backend.compile(partition, cached_options(tmp_path, "private"))
    for path in (tmp_path / "cache", tmp_path / "cache" / "wgpu"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(CacheError, match="writable by group or others"):
        backend.compile(partition, CompileOptions(cache_dir=str(shared), model_token="m"))


def small_network(rng):
    """One of each tiled kernel: a 3x3 convolution, a depthwise one, a 1x1 convolution, a dense layer."""
    b = GraphBuilder()
    v = b.input("x", (1, 9, 10, 3))
    v = b.op("CONV_2D", [v, b.const("w0", normal(rng, (12, 3, 3, 3))), b.const("b0", normal(rng, 12))],
             options={"padding": "SAME", "stride_w": 2, "stride_h": 2, "fused_activation_function": "RELU6"})
    v = b.op("DEPTHWISE_CONV_2D", [v, b.const("w1", normal(rng, (1, 3, 3, 12))), b.const("b1", normal(rng, 12))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "depth_multiplier": 1})
    v = b.op("CONV_2D", [v, b.const("w2", normal(rng, (40, 1, 1, 12))), b.const("b2", normal(rng, 40))],
             options={"padding": "VALID", "stride_w": 1, "stride_h": 1})
    v = b.op("RESHAPE", [v, b.const("s", np.array([1, 1000], np.int32))], options={"new_shape": [1, 1000]})
    b.output(b.op("FULLY_CONNECTED", [v, b.const("w3", normal(rng, (10, 1000), 0.1)), b.const("b3", normal(rng, 10))]))
    return b.to_bytes()


def test_sustained_speed_times_the_tilings_and_caches_the_choice(backend, tmp_path):
    rng = np.random.default_rng(17)
    model = small_network(rng)
    g = read_model(model).main
    partition = make_partition(g, g.ops, "wgpu", 0)
    options = CompileOptions(inference_preference="sustained_speed", cache_dir=str(tmp_path / "cache"),
                             model_token="tuned")
    tuned = backend.compile(partition, options)
    facts = tuned.describe()
    assert facts["plan_source"] == "tuned" and len(facts["tilings"]) == 4
    program = tuned.program
    used = {d.params["shader"] for d in program.launches + [t.convert for t in program.inputs + program.outputs
                                                           if t.convert]}
    assert facts["shaders"] == len(program.shaders) == len(used)  # untried tilings' shaders are gone
    inputs = [normal(rng, (1, 9, 10, 3))]
    expected = run_compiled(backend, g, tuned, inputs)
    assert_close(expected, litert_run(model, inputs), rtol=RTOL, atol=1e-5)
    again = backend.compile(partition, options)
    assert again.describe()["plan_source"] == "cache" and again.describe()["tilings"] == facts["tilings"]
    np.testing.assert_array_equal(run_compiled(backend, g, again, inputs)[0], expected[0])
    assert backend.compile(partition, CompileOptions(cache_dir=options.cache_dir, model_token="tuned")
                           ).describe()["plan_source"] == "planned"  # the other preference has its own entry


def test_tuning_without_gpu_timestamps_uses_the_host_clock(backend, monkeypatch):
    rng = np.random.default_rng(22)
    model = small_network(rng)
    g = read_model(model).main
    monkeypatch.setattr(backend.context, "timestamps", False)
    tuned = backend.compile(make_partition(g, g.ops, "wgpu", 0), CompileOptions(inference_preference="sustained_speed"))
    assert tuned.describe()["plan_source"] == "tuned"
    inputs = [normal(rng, (1, 9, 10, 3))]
    assert_close(run_compiled(backend, g, tuned, inputs), litert_run(model, inputs), rtol=RTOL, atol=1e-5)


def test_tuning_keeps_the_fastest_variant(backend, monkeypatch):
    """With a stopwatch that finds each tiling tried faster than the one before, the last one wins."""
    from delegate_wgpu import tuning
    from delegate_wgpu.program import build_program
    model = small_network(np.random.default_rng(18))
    g = read_model(model).main
    partition = make_partition(g, g.ops, "wgpu", 0)
    options = CompileOptions(inference_preference="sustained_speed")
    planned = build_program(partition, options, "f32", 64, backend.context.limits, backend.shape, tuning=True)
    clock = iter(range(10**6, 0, -1))
    monkeypatch.setattr(tuning, "_Stopwatch", lambda compiled: lambda launch: next(clock))
    tilings = backend.compile(partition, options).describe()["tilings"]
    assert tilings == {planned.launches[i].label: variants[-1].tiling for i, variants in planned.variants.items()}


def test_per_op_profile_from_gpu_timestamps(backend):
    rng = np.random.default_rng(9)
    model = gated_residual_block(rng, extra_output=True)
    g, compiled = compile_whole(backend, model)
    inputs = [normal(rng, (1, 6, 5, 7)), normal(rng, (1, 6, 5, 6)), normal(rng, (1, 1, 1, 6))]
    compiled.set_profiling(True)
    started = time.perf_counter()
    for _ in range(3):
        run_compiled(backend, g, compiled, inputs)
    wall_ms = (time.perf_counter() - started) * 1e3
    times = compiled.profile()
    if "timestamp-query-inside-passes" not in backend.device_info()["features"]:
        assert times == {}  # no GPU timestamps: the caller splits the partition's time by estimate
        return
    assert set(times) == {0, 2}  # each kernel's time is booked on its first op: the conv, and the MUL
    assert all(ms >= 0 for ms in times.values()) and sum(times.values()) * 3 <= wall_ms
    compiled.set_profiling(False)
    assert compiled.profile() == {}


def test_missing_wgpu_makes_the_backend_unavailable_not_broken(monkeypatch):
    import sys
    from delegate_wgpu import device
    monkeypatch.setitem(sys.modules, "wgpu", None)  # as if the package were not installed
    monkeypatch.setattr(device, "adapters", device.adapters.__wrapped__)  # bypass the process-wide cache
    ok, reason = INFO.available()
    assert not ok and "wgpu is not installed" in reason and "delegate[wgpu]" in reason
    with pytest.raises(PluginError, match="wgpu is not installed"):
        INFO.factory({})


@pytest.mark.skipif(find_compiler() is None, reason="no C compiler on this machine")
def test_each_run_records_a_fresh_encoder_by_direct_calls_with_or_without_timestamps(backend):
    """run records encoder, pass and submission through wgpu-native's handles and the dispatches in one
    call into record.c (the machine has a C compiler), anew each run (a command buffer is submitted once);
    profiling puts timestamps between the dispatches: every run gives LiteRT's answer, bit for bit the
    same, and a profiled run times every op."""
    rng = np.random.default_rng(23)
    model = small_network(rng)
    g = read_model(model).main
    compiled = backend.compile(make_partition(g, g.ops, "wgpu", 0), CompileOptions())
    dispatches = len(compiled.launches)
    calls = f"direct wgpu-native calls ({dispatches} dispatches, one pass, one submission); "
    assert compiled.describe()["encoding"] == calls + "the dispatches by record.c"
    assert len(compiled.launches) >= 2
    inputs = [normal(rng, (1, 9, 10, 3))]
    direct = run_compiled(backend, g, compiled, inputs)
    assert_close(direct, litert_run(model, inputs), rtol=RTOL, atol=1e-5)
    again = run_compiled(backend, g, compiled, inputs)
    compiled.set_profiling(True)
    try:
        if compiled.profiler is not None:  # the adapter has timestamps (lavapipe does)
            assert compiled.describe()["encoding"] == calls + "a Python loop with timestamps between the dispatches"
        stamped = run_compiled(backend, g, compiled, inputs)
        if compiled.profiler is not None:
            assert set(compiled.profile()) == {d.ops[0] for d in compiled.program.launches if d.ops}
    finally:
        compiled.set_profiling(False)
    for a, b, c in zip(direct, again, stamped):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


@pytest.mark.skipif(find_compiler() is None, reason="no C compiler on this machine")
def test_without_a_compiler_a_python_loop_records_the_same_dispatches(backend, monkeypatch):
    """Where record.c cannot be built, the dispatches go through the same entry points from a Python loop,
    with the reason in the description, and give the same bits."""
    from delegate_wgpu import compiled as compiled_module
    rng = np.random.default_rng(24)
    model = small_network(rng)
    g = read_model(model).main
    inputs = [normal(rng, (1, 9, 10, 3))]
    native = backend.compile(make_partition(g, g.ops, "wgpu", 0), CompileOptions())
    monkeypatch.setattr(compiled_module, "_LOADED", ["no C compiler found"])
    looped = backend.compile(make_partition(g, g.ops, "wgpu", 0), CompileOptions())
    assert looped.describe()["encoding"].endswith("; the dispatches by a Python loop (no C compiler found)")
    assert native.describe()["encoding"].endswith("; the dispatches by record.c")
    expected = run_compiled(backend, g, native, inputs)
    for a, b in zip(expected, run_compiled(backend, g, looped, inputs)):
        np.testing.assert_array_equal(a, b)


# -- the wait for a run's work, bounded by limits.run_timeout_s ------------------------------------------------

class _Unresolved:
    """A map that never completes: its event is never set (a stand-in for device work that never finishes)."""

    def __init__(self):
        self._thread_event = threading.Event()

    def sync_wait(self):  # pragma: no cover - reached only if a wait ignored its limit
        raise AssertionError("waited past the limit")


def test_a_bounded_map_returns_when_the_work_is_done_and_gives_up_after_its_limit(backend):
    from delegate_wgpu.device import WaitLimit, bounded_maps, map_for_reading

    if not bounded_maps():
        pytest.skip("this wgpu-py's promises carry no event to wait on with a limit (runs keep the watchdog)")
    wgpu = pytest.importorskip("wgpu")
    device = backend.context.device
    buffer = device.create_buffer(size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    map_for_reading(buffer, WaitLimit(5.0))  # done at once: nothing writes it
    buffer.unmap()

    class Stalled:
        def map_async(self, mode):
            return _Unresolved()
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"within 0.2 s \(limits.run_timeout_s\)"):
        map_for_reading(Stalled(), WaitLimit(0.2))
    assert 0.2 <= time.perf_counter() - started < 2


def test_a_wait_with_a_poll_resolves_the_map_on_the_calling_thread_and_keeps_its_limit(backend):
    """On a hardware adapter a wait polls the device itself (no hand-off through wgpu-py's polling thread);
    on a CPU adapter (this machine's lavapipe) it does not, since polling would take the cores the work runs
    on.  Either way the limit holds."""
    from delegate_wgpu.device import POLL_SPIN_S, WaitLimit, bounded_maps, map_for_reading

    if not bounded_maps():
        pytest.skip("this wgpu-py's promises carry no event to wait on with a limit (runs keep the watchdog)")
    assert backend.context.poll_in_caller == (backend.context.adapter.info.get("adapter_type") != "CPU")
    pending = _Unresolved()
    polls = []

    def poll():  # the third poll completes the map, on the waiting thread
        polls.append(threading.get_ident())
        if len(polls) == 3:
            pending._thread_event.set()

    class Polled:
        def map_async(self, mode):
            return pending
    pending.sync_wait = lambda: None
    map_for_reading(Polled(), WaitLimit(5.0), poll)
    assert polls == [threading.get_ident()] * 3

    class Stalled:
        def map_async(self, mode):
            return _Unresolved()
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"within 0.2 s"):
        map_for_reading(Stalled(), WaitLimit(0.2), lambda: None)
    assert 0.2 <= time.perf_counter() - started < 2
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"within 0.005 s"):  # a limit shorter than the polling stops it
        map_for_reading(Stalled(), WaitLimit(0.005), lambda: None)
    assert time.perf_counter() - started < POLL_SPIN_S + 0.5


def test_webgpu_runs_on_the_calling_thread_and_a_run_that_never_finishes_falls_back(monkeypatch):
    """The session gives WebGPU no watchdog thread (its run records and submits); the wait for the outputs
    bounds itself instead: a read that never completes fails the partition in time, and the CPU takes over
    (or, with ``fallback: false``, the run fails)."""
    import delegate
    from delegate.errors import ExecutionError
    from delegate.session import BackendFallbackWarning
    from delegate_wgpu.device import bounded_maps
    from wgpu.backends.wgpu_native import GPUBuffer

    rng = np.random.default_rng(40)
    b = GraphBuilder()
    x = b.input("x", (1, 6, 7, 5))
    b.output(b.op("CONV_2D", [x, b.const("w", normal(rng, (4, 3, 3, 5))), b.const("b", normal(rng, 4))],
                  options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"}))
    data = b.to_bytes()
    inputs = [normal(rng, (1, 6, 7, 5))]
    expected = litert_run(data, inputs)
    settings = {"backends": "[wgpu, cpu]", "partitioner": "greedy", "precision": "fp32", "limits.run_timeout_s": 0.3}
    session = delegate.load(data, **settings)
    strict = delegate.load(data, fallback=False, **settings)
    assert [p.backend for p in session.executor.partitions] == ["wgpu"]
    if not bounded_maps():  # a wgpu-py whose maps cannot be waited for with a limit: the watchdog stays
        assert "wgpu" in session.executor.watchdogs
        return
    assert "wgpu" not in session.executor.watchdogs
    assert_close(list(session.run(inputs).values()), expected, rtol=RTOL, atol=1e-5)

    monkeypatch.setattr(GPUBuffer, "map_async", lambda self, mode, offset=0, size=None: _Unresolved())
    started = time.perf_counter()
    with pytest.warns(BackendFallbackWarning, match=r"within 0.3 s \(limits.run_timeout_s\)"):
        outputs = session.run(inputs)
    assert time.perf_counter() - started < 10
    assert_close(list(outputs.values()), expected, rtol=RTOL, atol=1e-5)
    assert [p.backend for p in session.executor.partitions] == ["cpu"]
    with pytest.raises(ExecutionError, match=r"partition 0 on wgpu failed: .*within 0.3 s"):
        strict.run(inputs)
