"""The device-independent GPU parts: support answers, PHWC4 layout math, the float view, fusion planning,
and the opencl plugin's availability probe when pyopencl or a platform is missing."""

from __future__ import annotations

import struct
import sys
import types

import numpy as np
import pytest
from hypothesis import given, strategies as st

from delegate import CompileOptions, Quantization
from delegate.gpu import check_op, plan_groups
from delegate.gpu.constants import activation_quant, constant_value, dequantize, from_float_view
from delegate.gpu.layout import as_nhwc, from_phwc4, nhwc_axis, pack_conv_weights, phwc4_shape, same_storage, to_phwc4
from delegate.tflite.builder import GraphBuilder

FLOAT = CompileOptions()
QUANT = CompileOptions(allow_quantized=True)


def single_op(opcode, input_shapes, consts=(), *, version=1, options=None, dtype="float32", **kwargs):
    """A graph holding one op; returns the op (producers and uses linked)."""
    b = GraphBuilder()
    ins = [b.input(f"x{i}", s, dtype) for i, s in enumerate(input_shapes)]
    ins += [b.const(f"c{i}", c) if c is not None else None for i, c in enumerate(consts)]
    b.output(b.op(opcode, ins, version=version, options=options, **kwargs))
    return b.build().main.ops[0]


def conv_op(version=1, weights_dtype=np.float32, act="NONE"):
    b = GraphBuilder()
    x = b.input("x", (1, 5, 5, 3))
    w = np.ones((4, 3, 3, 3), weights_dtype)
    quant = (np.full(4, 0.1), np.zeros(4), 0) if weights_dtype == np.int8 else None
    y = b.op("CONV_2D", [x, b.const("w", w, quant=quant), b.const("b", np.zeros(4, np.float32))], version=version,
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": act},
             dtype="float32")
    b.output(y)
    return b.build().main.ops[0]


# -- support answers -------------------------------------------------------------------
def test_conv_version_2_needs_quantized_support():
    op = conv_op(version=2, weights_dtype=np.int8)
    answer = check_op(op, FLOAT)
    assert not answer and "allow_quantized" in answer.reason and "version 2" in answer.reason
    assert check_op(op, QUANT)


def test_versions_beyond_the_table_are_refused_even_quantized():
    answer = check_op(conv_op(version=7), QUANT)
    assert not answer and "not supported" in answer.reason and "v5" in answer.reason


@pytest.mark.parametrize("opcode,version,ok", [
    ("DEPTHWISE_CONV_2D", 2, True), ("DEPTHWISE_CONV_2D", 3, False),
    ("RESIZE_BILINEAR", 3, True), ("RESIZE_BILINEAR", 4, False),
])
def test_listed_float_versions(opcode, version, ok):
    if opcode == "DEPTHWISE_CONV_2D":
        op = single_op(opcode, [(1, 4, 4, 2)], [np.ones((1, 3, 3, 2), np.float32), np.zeros(2, np.float32)],
                       version=version, options={"padding": "SAME", "stride_w": 1, "stride_h": 1,
                                                 "depth_multiplier": 1, "dilation_w_factor": 2,
                                                 "dilation_h_factor": 2})
    else:
        op = single_op(opcode, [(1, 4, 4, 2)], [np.array([8, 8], np.int32)], version=version,
                       options={"half_pixel_centers": True})
    assert bool(check_op(op, FLOAT)) is ok


def test_unknown_and_custom_ops_are_refused_with_reason():
    assert "LOG_SOFTMAX has no GPU kernel" in check_op(single_op("LOG_SOFTMAX", [(1, 4)]), FLOAT).reason
    op = single_op("MyOp", [(1, 4)], custom=True, shape=(1, 4))
    assert "custom op MyOp has no GPU kernel" in check_op(op, FLOAT).reason


@pytest.mark.parametrize("make,needle", [
    (lambda: single_op("RELU", [(1, 2, 2, 2, 2)]), "rank 5"),
    (lambda: single_op("RELU", [(1, 4)], dtype="int32"), "int32"),
    (lambda: single_op("CONV_2D", [(1, 4, 4, 2), (3, 1, 1, 2)], [np.zeros(3, np.float32)],
                       options={"padding": "SAME", "stride_w": 1, "stride_h": 1}), "must be a constant"),
    (lambda: conv_op(act="TANH"), "fused TANH"),
    (lambda: conv_op(act="SIGN_BIT"), "SIGN_BIT"),
    (lambda: single_op("MEAN", [(2, 3, 3, 4)], [np.array([0, 1], np.int32)]), "batch axis"),
    (lambda: single_op("STRIDED_SLICE", [(1, 4, 4, 4)], [np.zeros(4, np.int32), np.full(4, 2, np.int32),
                                                          np.ones(4, np.int32)], options={"ellipsis_mask": 1}),
     "ellipsis_mask"),
    (lambda: single_op("DEQUANTIZE", [(1, 4)], dtype="float16"), "input 0 is float16"),
    (lambda: single_op("LSTM", [(1, 3), (1, 2)], [np.zeros((8, 5), np.float32), np.zeros(8, np.float32)],
                       options={"kernel_type": "FULL", "fused_activation_function": "TANH"},
                       shapes=[(1, 2)] * 1), "basic LSTM"),
    (lambda: single_op("Convolution2DTransposeBias", [(1, 2, 2, 1)],
                       [np.zeros((1, 2, 2, 1), np.float32), np.zeros(1, np.float32)], custom=True,
                       custom_options=b"\x01\x00", shape=(1, 4, 4, 1)), "custom options are 2 bytes"),
])
def test_refusals_name_the_failed_check(make, needle):
    answer = check_op(make(), FLOAT)
    assert not answer
    assert needle in answer.reason


def test_quantized_activations_need_the_float_view():
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 2), "int8", quant=(0.1, 3))
    b.output(b.op("MAX_POOL_2D", [x], options={"padding": "VALID", "filter_height": 2,
                                                          "filter_width": 2, "stride_h": 2, "stride_w": 2},
                  quant=(0.1, 3)))
    op = b.build().main.ops[0]
    assert "enable allow_quantized" in check_op(op, FLOAT).reason
    assert check_op(op, QUANT)


def test_dequantize_of_constants_is_folded():
    b = GraphBuilder()
    half = b.const("w16", np.arange(6, dtype=np.float16).reshape(2, 3))
    q = b.const("w8", np.array([[-2, 0, 5]], np.int8), quant=(0.5, 1))
    y16 = b.op("DEQUANTIZE", [half], version=2, dtype="float32")
    y8 = b.op("DEQUANTIZE", [q], version=3, dtype="float32")
    b.output(y16, y8)
    g = b.build().main
    assert check_op(g.ops[0], FLOAT)
    assert "needs allow_quantized" in check_op(g.ops[1], FLOAT).reason and check_op(g.ops[1], QUANT)
    np.testing.assert_array_equal(constant_value(y16), np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_allclose(constant_value(y8), [[-1.5, -0.5, 2.0]])


def test_transpose_conv_bias_custom_options_parsed():
    op = single_op("Convolution2DTransposeBias", [(1, 2, 2, 1)],
                   [np.zeros((1, 2, 2, 1), np.float32), np.zeros(1, np.float32)], custom=True,
                   custom_options=struct.pack("<3i", 1, 2, 2), shape=(1, 4, 4, 1))
    assert check_op(op, FLOAT)


def test_support_is_derived_from_the_dialect_handlers():
    """An op is refused by a dialect without a handler for it; a handler's own constraint gives the reason."""
    from delegate.gpu.registry import lowers, supports
    relu = single_op("RELU", [(1, 4)])
    assert "no kernel in the probe lowering" in supports("probe", relu, FLOAT).reason
    lowers("probe", "RELU", check=lambda op: "rank 2 is not covered" if len(op.inputs[0].shape) == 2 else None)(
        lambda plan, group: None)
    assert supports("probe", relu, FLOAT).reason == "rank 2 is not covered"
    assert supports("probe", single_op("RELU", [(1, 2, 4)]), FLOAT)
    assert "rank 5" in supports("probe", single_op("RELU", [(1, 2, 2, 2, 2)]), FLOAT).reason  # the kit's rule
    assert "no kernel in the probe lowering" in supports("probe", single_op("DEQUANTIZE", [(1, 4)]), FLOAT).reason
    with pytest.raises(ValueError, match="lowered twice"):
        lowers("probe", "RELU")(lambda plan, group: None)
    with pytest.raises(ValueError, match="no rule"):
        lowers("probe", "NOT_AN_OP")(lambda plan, group: None)


def test_the_kits_handlers_lower_for_every_dialect_with_their_templates():
    """A kit handler serves each dialect declaring its templates; lacking one, the op is refused with the
    template's name; a dialect's own handler for an op the kit lowers is refused as lowered twice."""
    from delegate.gpu import registry
    from delegate.gpu.lowering import elementwise
    relu = single_op("RELU", [(1, 4)])
    try:
        registry.declare_templates("probe_kit", ["elementwise"])
        registry.declare_templates("probe_bare", [])
        assert registry.handler("probe_kit", relu).lower is elementwise
        assert supports_of("probe_kit", relu)
        refusal = supports_of("probe_bare", relu)
        assert not refusal and "needs the elementwise kernel template" in refusal.reason
        assert "RELU" in registry.accepted("probe_kit") and "RELU" not in registry.accepted("probe_bare")
        with pytest.raises(ValueError, match="lowered twice"):
            registry.lowers("probe_kit", "RELU")(lambda plan, group: None)
    finally:
        registry._TEMPLATES.pop("probe_kit", None)
        registry._TEMPLATES.pop("probe_bare", None)


def test_both_gpu_dialects_take_the_elementwise_and_boundary_launches_from_the_kit():
    """OpenCL and WebGPU run one handler for the elementwise family, and their templates have the same names."""
    from delegate.gpu import registry
    from delegate.gpu.lowering import elementwise
    from importlib import import_module
    for module in ("delegate_opencl.lowering", "delegate_wgpu.kernels"):  # each declares its dialect's templates
        import_module(module)
    add = single_op("ADD", [(1, 4, 4, 3), (1, 4, 4, 3)])
    for dialect in ("opencl", "wgpu"):
        assert registry.handler(dialect, add).lower is elementwise
        assert {"elementwise", "layout_in", "layout_out"} <= registry._TEMPLATES[dialect]


def supports_of(dialect, op):
    from delegate.gpu.registry import supports
    return supports(dialect, op, FLOAT)


# -- float view ---------------------------------------------------------------------------
def test_per_channel_dequantize_and_requantize():
    data = np.array([[10, -10], [4, 0]], np.int8)
    quant = Quantization(np.array([0.5, 0.25], np.float32), np.array([0, 2]), axis=0)
    np.testing.assert_allclose(dequantize(data, quant), [[5, -5], [0.5, -0.5]])
    per_tensor = Quantization(np.array([0.5], np.float32), np.array([-1]))
    from delegate.ir import DType
    q = from_float_view(np.array([0.25, -0.25, 100.0, -100.0], np.float32), DType.int8, per_tensor)
    np.testing.assert_array_equal(q, [0, -2, 127, -128])  # ties away from zero, then clamped


# -- layout -------------------------------------------------------------------------------
shapes = st.lists(st.integers(1, 6), min_size=0, max_size=4).map(tuple)


@given(shape=shapes, seed=st.integers(0, 1000))
def test_phwc4_round_trip_and_zero_padding(shape, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    packed = to_phwc4(x)
    assert packed.shape == phwc4_shape(shape)
    np.testing.assert_array_equal(from_phwc4(packed, shape), x)
    c = as_nhwc(shape)[3]
    assert not packed[:, -1, ..., c % 4 or 4:].any()  # lanes past the channels hold zero


@given(shape=st.tuples(*[st.integers(1, 6)] * 4), data=st.data())
def test_reshapes_keeping_batch_channels_and_plane_share_bytes(shape, data):
    n, h, w, c = shape
    rows = data.draw(st.sampled_from([d for d in range(1, h * w + 1) if h * w % d == 0]))
    other = (n, rows, h * w // rows, c)
    while len(other) > 1 and other[0] == 1 and data.draw(st.booleans()):
        other = other[1:]
    assert same_storage(shape, other)
    x = np.arange(n * h * w * c, dtype=np.float32)
    np.testing.assert_array_equal(to_phwc4(x.reshape(shape)).ravel(), to_phwc4(x.reshape(other)).ravel())


def test_axes_map_onto_the_4d_view():
    assert as_nhwc((5,)) == (1, 1, 1, 5) and as_nhwc((2, 5)) == (1, 1, 2, 5)
    assert [nhwc_axis(a, 2) for a in (0, 1, -1)] == [2, 3, 3]
    with pytest.raises(ValueError):
        nhwc_axis(3, 3)


def test_conv_weights_pack_into_4x4_blocks():
    w = np.arange(5 * 1 * 1 * 6, dtype=np.float32).reshape(5, 1, 1, 6)
    packed = pack_conv_weights(w)
    assert packed.shape == (2, 1, 1, 2, 4, 4)
    assert packed[1, 0, 0, 1, 1, 0] == w[4, 0, 0, 5]  # output 4 = slice 1 lane 0; input 5 = slice 1 lane 1
    assert packed[1, 0, 0, 1, 2, 0] == 0 and packed[1, 0, 0, 0, 0, 1] == 0  # padding


# -- fusion -------------------------------------------------------------------------------
def residual_block(extra_output=False):
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 3))
    r = b.input("r", (1, 4, 4, 4))
    y = b.op("CONV_2D", [x, b.const("w", np.ones((4, 1, 1, 3), np.float32)), b.const("b", np.zeros(4, np.float32))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"})
    z = b.op("ADD", [r, y], options={"fused_activation_function": "NONE"})
    m = b.op("MUL", [z, b.const("k", np.float32(0.5).reshape(1))], options={"fused_activation_function": "NONE"})
    b.output(b.op("HARD_SWISH", [m]))
    if extra_output:
        b.output(z)
    return b.build().main


def test_conv_bias_activation_and_followers_form_one_group():
    g = residual_block()
    groups = plan_groups(g.ops, {t.index for t in g.outputs})
    assert len(groups) == 1
    steps = groups[0].steps
    assert [s.signature() for s in steps] == [("unary", "RELU", None, False, ()), ("binary", "ADD", "tensor", True, ()),
                                              ("binary", "MUL", "scalar", False, ()),
                                              ("unary", "HARD_SWISH", None, False, ())]
    assert groups[0].output is g.outputs[0]


def test_values_needed_elsewhere_are_stored():
    g = residual_block(extra_output=True)
    groups = plan_groups(g.ops, {t.index for t in g.outputs})
    assert [[op.opcode for op in grp.ops] for grp in groups] == [["CONV_2D", "ADD"], ["MUL", "HARD_SWISH"]]


def swish_after_conv(swapped=False, keep_conv=False, keep_sigmoid=False):
    """CONV_2D, then x * LOGISTIC(x) on its result as a converter writes a swish: LOGISTIC and MUL."""
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 3))
    y = b.op("CONV_2D", [x, b.const("w", np.ones((4, 1, 1, 3), np.float32)), b.const("b", np.zeros(4, np.float32))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "NONE"})
    gate = b.op("LOGISTIC", [y])
    b.output(b.op("MUL", [gate, y] if swapped else [y, gate], options={"fused_activation_function": "RELU6"}))
    for extra, wanted in ((y, keep_conv), (gate, keep_sigmoid)):
        if wanted:
            b.output(extra)
    return b.build().main


@pytest.mark.parametrize("swapped", [False, True])
def test_a_swish_after_a_kernel_is_one_epilogue_step(swapped):
    """x * LOGISTIC(x) on a kernel's value is one step of its epilogue (the kernel stores only the product),
    whichever input of the MUL the value is; the MUL's own activation follows."""
    g = swish_after_conv(swapped)
    groups = plan_groups(g.ops, {t.index for t in g.outputs})
    assert [[op.opcode for op in grp.ops] for grp in groups] == [["CONV_2D", "LOGISTIC", "MUL"]]
    assert [s.signature() for s in groups[0].steps] == [("unary", "SWISH", None, False, ()),
                                                        ("unary", "RELU6", None, False, ())]


def test_an_integer_swish_rounds_its_logistic_inside_the_step():
    """In the float view of an int8 model the LOGISTIC's result lies on its grid before the MUL reads it: the
    fused step carries that grid and rounds onto it between the two operations, in both dialects."""
    from delegate.gpu.dialect import OPENCL, WGSL, epilogue_lines

    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 3), "int8", quant=(0.03, -4))
    y = b.op("CONV_2D", [x, b.const("w", np.ones((4, 1, 1, 3), np.int8), quant=(0.01, 0)),
                         b.const("b", np.zeros(4, np.int32), quant=(0.0003, 0))], dtype="int8", quant=(0.05, 3),
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "NONE"})
    gate = b.op("LOGISTIC", [y], dtype="int8", quant=(1 / 256, -128))
    b.output(b.op("MUL", [gate, y], dtype="int8", quant=(0.08, -10), options={"fused_activation_function": "NONE"}))
    g = b.build().main
    groups = plan_groups(g.ops, {t.index for t in g.outputs}, float_view=True)
    assert [[op.opcode for op in grp.ops] for grp in groups] == [["CONV_2D", "LOGISTIC", "MUL"]]
    assert [s.kind for s in groups[0].steps] == ["quantize", "swish", "quantize"]
    swish = groups[0].steps[1]
    assert swish.quant == activation_quant(gate)
    for dialect in (OPENCL, WGSL):
        line = epilogue_lines(dialect, [swish.signature()], lambda i, s: "", lambda i: f"grid{i}")[0]
        rounded = dialect.quantize_call(dialect.unary("LOGISTIC", "v"), "grid0")
        assert line == f"v = {dialect.binary_call('MUL', 'v', rounded)};"


def test_a_reshape_onto_its_inputs_own_grid_rounds_nothing_and_runs_no_kernel():
    """In the float view a quantized tensor's values lie on its grid: a reshape onto the same grid has no
    rounding step, and one keeping the PHWC4 bytes runs no kernel; onto another grid it would round, in a
    kernel, where LiteRT copies the integers: refused."""
    from delegate.gpu.fusion import activation_steps, runs_no_kernel

    for out_quant, rounds in (((0.02, -3), False), ((0.03, 0), True)):
        b = GraphBuilder()
        x = b.input("x", (1, 8), "int8", quant=(0.02, -3))
        b.output(b.op("RESHAPE", [x, b.const("s", np.array([1, 1, 1, 8], np.int32))], dtype="int8", quant=out_quant))
        reshape = b.build().main.ops[0]
        assert [s.kind for s in activation_steps(reshape, True)] == (["quantize"] if rounds else [])
        assert runs_no_kernel(reshape, True) is not rounds
        # onto another grid LiteRT copies the integers: the GPU path refuses such a reshape
        assert bool(check_op(reshape, CompileOptions(allow_quantized=True))) is not rounds


def test_a_zero_pad_onto_its_inputs_own_grid_rounds_nothing():
    """A quantized zero PAD onto its input's grid adds zeros, which lie on it: no rounding step, so it folds into
    the convolution reading it; onto another grid the GPU path refuses it, as a reshape (LiteRT copies)."""
    from delegate.gpu.fusion import activation_steps

    for out_quant, rounds in (((0.02, -3), False), ((0.03, 0), True)):
        b = GraphBuilder()
        x = b.input("x", (1, 3, 4, 5), "int8", quant=(0.02, -3))
        b.output(b.op("PAD", [x, b.const("p", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))], dtype="int8",
                      quant=out_quant))
        pad = b.build().main.ops[0]
        assert [s.kind for s in activation_steps(pad, True)] == (["quantize"] if rounds else [])
        assert bool(check_op(pad, CompileOptions(allow_quantized=True))) is not rounds


def test_a_swish_whose_parts_are_read_elsewhere_stays_apart():
    """The kernel's value or the LOGISTIC's needed outside: each is stored, and the swish is not fused."""
    for g in (swish_after_conv(keep_conv=True), swish_after_conv(keep_sigmoid=True)):
        groups = plan_groups(g.ops, {t.index for t in g.outputs})
        assert not any(s.name == "SWISH" for grp in groups for s in grp.steps)
        assert sum(len(grp.ops) for grp in groups) == len(g.ops)


@given(seed=st.integers(0, 500))
def test_groups_run_after_everything_they_read(seed):
    """Random elementwise DAGs: each group's inputs are graph inputs, constants or stored earlier."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    values = [b.input("x", (1, 2, 2, 3)), b.input("y", (1, 2, 2, 3))]
    for _ in range(8):
        if rng.random() < 0.4:
            values.append(b.op(str(rng.choice(["RELU", "LOGISTIC", "TANH"])), [values[rng.integers(len(values))]]))
        else:
            a, c = rng.integers(len(values), size=2)
            values.append(b.op(str(rng.choice(["ADD", "MUL", "MAXIMUM"])), [values[a], values[c]]))
    b.output(values[-1])
    g = b.build().main
    groups = plan_groups(g.ops, {t.index for t in g.outputs})
    stored = {t.index for t in g.inputs}
    for grp in groups:
        members = {id(op) for op in grp.ops}
        for op in grp.ops:
            for t in op.inputs:
                inside = t.producer is not None and id(t.producer) in members
                assert inside or t.index in stored, f"group {grp.ops} reads {t} before it is stored"
        stored.add(grp.output.index)
    assert sum(len(grp.ops) for grp in groups) == len(g.ops)


# -- availability probe --------------------------------------------------------------------
def test_probe_without_pyopencl(monkeypatch):
    from delegate_opencl import device
    monkeypatch.setitem(sys.modules, "pyopencl", None)
    ok, reason = device.probe()
    assert not ok and "pyopencl is not installed" in reason


def test_probe_without_platform(monkeypatch, tmp_path):
    from delegate_opencl import device
    monkeypatch.setenv("DELEGATE_PROFILE_DIR", str(tmp_path))  # no facts remembered: the driver is asked

    class NoPlatform(Exception):
        pass

    def no_platforms():
        raise NoPlatform("PLATFORM_NOT_FOUND_KHR")
    fake = types.SimpleNamespace(Error=NoPlatform, get_platforms=no_platforms)
    monkeypatch.setattr(device, "import_pyopencl", lambda: fake)
    ok, reason = device.probe()
    assert not ok and "no OpenCL platform found" in reason


def test_plugin_registers_through_the_entry_point():
    from delegate.plugins import PluginManager
    info = PluginManager().backend_info("opencl")
    assert info.role == "accelerator" and callable(info.available)
    ok, reason = info.available()
    assert isinstance(ok, bool) and reason
    if ok:  # the probe's device is among those listed for `delegate backends`
        assert any(line.startswith(reason.split(" on ")[0]) for line in info.list_devices())


@pytest.mark.parametrize("axes,hosts", [([1, 2], True), ([3], False)])
def test_no_fusion_into_kernels_followed_by_a_relayout(axes, hosts):
    """MEAN over the channels of (1,4,4,8) computes (1,4,4,1) but stores (1,4,4): positions differ."""
    from delegate.gpu.fusion import hosts_epilogue
    op = single_op("MEAN", [(1, 4, 4, 8)], [np.array(axes, np.int32)], options={"keep_dims": False})
    assert hosts_epilogue(op) is hosts


# -- gathers, scans and one-hot encodings --------------------------------------------------------
@pytest.mark.parametrize("indices,options,needle", [
    (None, {"axis": 0}, "runtime indices stay on the CPU"),
    (np.array([0, 5], np.int32), {"axis": 0}, "index 5 is out of range [0, 5)"),
    (np.array([-1], np.int32), {"axis": 0}, "index -1 is out of range"),
    (np.array([[0], [1]], np.int32), {"axis": 1, "batch_dims": 1}, "batch_dims 1 is not implemented"),
])
def test_gather_refusals_keep_every_read_inside_the_input(indices, options, needle):
    """The GPUs take GATHER only with constant indices inside the axis (TFLite refuses the others at run
    time), so the mapping never reads outside its input."""
    if indices is None:
        b = GraphBuilder()
        b.output(b.op("GATHER", [b.input("x", (5, 3)), b.input("i", (2,), "int32")], options=options))
        op = b.build().main.ops[0]
    else:
        op = single_op("GATHER", [(5, 3) if "batch_dims" not in options else (2, 5, 3)], [indices], options=options)
    answer = check_op(op, FLOAT)
    assert not answer and needle in answer.reason, answer.reason


def test_gather_of_constant_indices_inside_the_axis_is_accepted():
    assert check_op(single_op("GATHER", [(5, 3)], [np.array([4, 0, 4], np.int32)], options={"axis": 0}), FLOAT)


def test_one_hot_needs_a_constant_depth_and_values():
    b = GraphBuilder()
    b.output(b.op("ONE_HOT", [b.input("i", (3,), "int32"), b.input("depth", (), "int32"),
                              b.const("on", np.array(1.0, np.float32)), b.const("off", np.array(0.0, np.float32))],
                  dtype="float32", shape=(3, 4), options={"axis": -1}))
    answer = check_op(b.build().main.ops[0], FLOAT)
    assert not answer and "depth (input 1) must be a constant" in answer.reason


def test_cumsum_needs_a_constant_axis():
    b = GraphBuilder()
    b.output(b.op("CUMSUM", [b.input("x", (2, 3)), b.input("axis", (), "int32")], shape=(2, 3)))
    answer = check_op(b.build().main.ops[0], FLOAT)
    assert not answer and "axis (input 1) must be a constant" in answer.reason
