"""Every zoo model, as built and post-training quantized (fp16 weights, full int8), in LiteRT and on the CPU.

The numpy CPU backend matches LiteRT within 1e-4 of each output's range in
fp32 and fp16 (against XNNPACK and the builtin kernels), and within one
quantization step of LiteRT's builtin integer kernels in int8.  The int8
models must also stay close to the float ones, and every output must vary
with the input (random weights can easily give dead or constant heads).
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from delegate import CompileOptions, DType, read_model, zoo
from delegate.cli import main
from delegate.inputs import random_input
from delegate.plugins import default_manager
from delegate.quantize import INT8_RULES, full_int8, int8_rule
from delegate.tflite.builder import GraphBuilder
from delegate.tflite.writer import write_model
from tests.oputil import delegate_run, litert, litert_run

MODELS = sorted(zoo.ZOO)
WEIGHTED = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0, "TRANSPOSE_CONV": 0}  # op -> channel axis
SAME_SCALE = {"AVERAGE_POOL_2D", "MAX_POOL_2D", "RESHAPE", "CONCATENATION", "RESIZE_BILINEAR",
              "RESIZE_NEAREST_NEIGHBOR", "TRANSPOSE", "PAD", "SQUEEZE", "STRIDED_SLICE", "MAXIMUM"}
# The versions TFLite's converter gives these ops in an int8 model (FULLY_CONNECTED and MUL are checked apart).
INT8_VERSIONS = {"CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "AVERAGE_POOL_2D": 2, "MAX_POOL_2D": 2, "RESHAPE": 1,
                 "SOFTMAX": 2, "CONCATENATION": 2, "LOGISTIC": 2, "LEAKY_RELU": 1, "MEAN": 2, "ADD": 2, "SUB": 2,
                 "RSQRT": 2, "TRANSPOSE": 2, "BATCH_MATMUL": 2, "GELU": 2, "QUANTIZE": 1, "DEQUANTIZE": 2}


@functools.cache
def built(name: str, quant: str) -> bytes:
    return zoo.build(name, quant=quant)


def random_inputs(data: bytes, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [random_input(t, rng) for t in read_model(data).main.inputs]


def cpu_runnable(data: bytes) -> bytes:
    """The model without the trailing custom ops the CPU backend has no kernel for (their inputs become outputs)."""
    model = read_model(data)
    g = model.main
    cpu = default_manager().backend_info("cpu").factory({})
    refused = [op for op in g.ops if op.custom and not cpu.supports(op, CompileOptions())]
    if not refused:
        return data
    assert all(t in g.outputs for op in refused for t in op.outputs), "only trailing custom ops can be cut"
    g.ops = [op for op in g.ops if op not in refused]
    g.outputs = [t for op in refused for t in op.inputs if t is not None and not t.is_constant]
    g.link()
    model.signatures = []
    return write_model(model)


def output_steps(data: bytes) -> list[float]:
    """The allowed error of each float output of an int8 model: the scale its DEQUANTIZE reads, or, for an
    output a float op computes from dequantized values (detection post-processing), float rounding only."""
    steps = []
    for t in read_model(data).main.outputs:
        if t.producer.opcode == "DEQUANTIZE":
            steps.append(float(t.producer.inputs[0].quantization.scale[0]))
        else:
            assert t.producer.custom, f"output {t.name!r} is neither dequantized nor made by a float custom op"
            steps.append(1e-5)
    return steps


def assert_within_range(actual, expected, rel: float = 1e-4) -> None:
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape, f"output {i}: shape {a.shape} != {e.shape}"
        err = float(np.abs(a.astype(np.float64) - e).max())
        span = float(e.max() - e.min())
        assert err <= rel * span, f"output {i}: max error {err:.3g} > {rel:g} of its range {span:.3g}"


def assert_within_steps(actual, expected, steps) -> None:
    for i, (a, e, step) in enumerate(zip(actual, expected, steps)):
        err = float(np.abs(a.astype(np.float64) - e).max())
        assert err <= step * 1.001, f"output {i}: max error {err:.3g} is more than one step ({step:.3g})"


def missing_int8_kernels(data: bytes) -> list[str]:
    """Integer ops of the model the CPU backend would run with a float kernel, where that is not just data movement."""
    from delegate_cpu import registry

    registry.load_all()
    return sorted({op.opcode for op in read_model(data).main.ops
                   if registry.is_quantized_op(op) and op.opcode not in registry.QUANT_KERNELS
                   and not INT8_RULES[op.opcode].same_scale})


# --- every model, every precision, in LiteRT ------------------------------------------------------

@pytest.mark.parametrize("quant", ["fp32", "fp16", "int8"])
@pytest.mark.parametrize("name", MODELS)
def test_runs_in_litert_and_outputs_follow_the_input(name, quant):
    data = built(name, quant)
    first, second = (litert_run(data, random_inputs(data, seed)) for seed in (1, 2))
    for t, a, b in zip(read_model(data).main.outputs, first, second):
        assert np.isfinite(a).all() and np.isfinite(b).all(), t.name
        if a.size == 1:  # a detection count: at least one box, whatever the input
            assert a.item() >= 1, t.name
            continue
        assert a.std() > 0 and b.std() > 0, f"{t.name} is constant"
        assert a.std() != b.std(), f"{t.name} does not depend on the input"


@pytest.mark.parametrize("quant", ["fp32", "int8"])
def test_ssd_detections_spread_over_the_classes(quant):
    """Random weights must not make one class win everywhere (the heads read non-negative features)."""
    data = built("mobilenet_ssd", quant)
    classes = np.concatenate([litert_run(data, random_inputs(data, seed))[1].ravel() for seed in (1, 2)])
    counts = np.bincount(classes.astype(int))
    assert (counts > 0).sum() >= 5 and counts.max() <= classes.size // 2, counts


# --- the CPU backend against LiteRT ---------------------------------------------------------------

@pytest.mark.parametrize("quant", ["fp32", "fp16"])
@pytest.mark.parametrize("name", MODELS)
def test_cpu_matches_litert_in_float(name, quant):
    data = cpu_runnable(built(name, quant))
    inputs = random_inputs(data, 3)
    actual = delegate_run(data, inputs)
    for builtin in (False, True):  # XNNPACK, then the builtin kernels
        assert_within_range(actual, litert_run(data, inputs, builtin=builtin))


@pytest.mark.parametrize("name", MODELS)
def test_cpu_matches_litert_builtin_in_int8(name, request):
    data = cpu_runnable(built(name, "int8"))
    missing = missing_int8_kernels(data)
    if missing:
        request.applymarker(pytest.mark.xfail(reason=f"the cpu backend has no int8 kernel for {', '.join(missing)}"))
    inputs = random_inputs(data, 4)
    assert_within_steps(delegate_run(data, inputs), litert_run(data, inputs, builtin=True), output_steps(data))


# --- int8 accuracy ------------------------------------------------------------------------------

def accuracy_probes(data: bytes) -> list[str]:
    """Names of the tensors to compare between the float and the int8 model: the outputs, except that a
    softmax is judged by its logits (a 1001-way softmax of random weights is nearly uniform, finer than int8's
    1/256 step) and a custom op by its inputs (detections are ranked lists, not values)."""
    names = []
    for t in read_model(data).main.outputs:
        op = t.producer
        if op.custom:
            names += [x.name for x in op.inputs if x is not None and not x.is_constant and x.name not in names]
        else:
            names.append(op.inputs[0].name if op.opcode == "SOFTMAX" else t.name)
    return names


def litert_tensors(data: bytes, inputs, names: list[str]) -> list[np.ndarray]:
    """Named tensors after a run with LiteRT's builtin kernels, integer ones dequantized."""
    it = litert.Interpreter(model_content=data, experimental_preserve_all_tensors=True,
                            experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    details = {d["name"]: d for d in it.get_tensor_details()}
    values = []
    for name in names:
        d = details[name]
        v = it.get_tensor(d["index"]).astype(np.float64)
        if d["dtype"] != np.float32:
            scale, zero_point = d["quantization"]
            v = (v - zero_point) * scale
        values.append(v)
    return values


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel(), b.ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("name", MODELS)
def test_int8_tracks_the_float_model(name):
    fp32, int8 = built(name, "fp32"), built(name, "int8")
    names = accuracy_probes(fp32)
    inputs = random_inputs(fp32, 5)
    for probe, f, q in zip(names, litert_tensors(fp32, inputs, names), litert_tensors(int8, inputs, names)):
        assert cosine(f, q) > 0.97, f"{probe}: cosine similarity {cosine(f, q):.4f}"


# --- the form of the quantized models -------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_fp16_weights_sit_behind_dequantize(name):
    float_graph = read_model(built(name, "fp32")).main
    g = read_model(built(name, "fp16")).main
    widened = [op for op in g.ops if op.opcode == "DEQUANTIZE"]
    assert len(g.ops) == len(float_graph.ops) + len(widened)
    assert all(op.version == 3 and op.inputs[0].dtype is DType.float16 and op.inputs[0].is_constant
               and op.outputs[0].dtype is DType.float32 for op in widened)
    for op in g.ops:
        if op.custom or op.opcode == "DEQUANTIZE":
            continue
        assert not any(t is not None and t.is_constant and t.dtype.is_float for t in op.inputs), op.describe()
        if op.opcode in WEIGHTED:
            assert op.inputs[1].producer.opcode == "DEQUANTIZE", op.describe()
    weights = {t.name: np.asarray(t.data) for t in float_graph.tensors if t.is_constant and t.dtype is DType.float32}
    for op in widened:
        half = op.inputs[0]
        np.testing.assert_array_equal(half.data, weights[half.name].astype(np.float16))


@pytest.mark.parametrize("name", MODELS)
def test_int8_form(name):
    float_graph = read_model(built(name, "fp32")).main
    g = read_model(built(name, "int8")).main
    assert [(t.name, t.dtype) for t in g.inputs] == [(t.name, t.dtype) for t in float_graph.inputs]
    assert [(t.name, t.dtype) for t in g.outputs] == [(t.name, t.dtype) for t in float_graph.outputs]
    # the ops the quantizer keeps float (the detection post-process, the sequence LSTM: ``int8_rule``) read
    # float values, the graph's inputs among them
    assert all(op.opcode == "QUANTIZE" or int8_rule(op) is None for t in g.inputs for op in t.uses)
    for op in g.ops:
        if op.opcode not in ("QUANTIZE", "DEQUANTIZE") and int8_rule(op) is None:
            assert all(t.dtype is DType.float32 for t in op.inputs if t is not None and not t.is_constant)
            continue
        real = [t for t in (*op.inputs, *op.outputs) if t is not None and t.dtype in (DType.int8, DType.float32)]
        if op.opcode in ("QUANTIZE", "DEQUANTIZE"):
            assert {t.dtype for t in real} == {DType.int8, DType.float32}, op.describe()
        else:
            assert all(t.dtype is DType.int8 and t.quantization is not None for t in real), op.describe()
        if op.opcode in INT8_VERSIONS:
            assert op.version == INT8_VERSIONS[op.opcode], op.describe()
        if op.opcode in SAME_SCALE:
            assert all(t.quantization == real[0].quantization for t in real), op.describe()
        if op.opcode in ("SOFTMAX", "LOGISTIC"):
            q = op.outputs[0].quantization
            assert (float(q.scale[0]), int(q.zero_point[0])) == (1 / 256, -128), op.describe()
        if op.opcode == "FULLY_CONNECTED":
            assert op.version == (5 if op.options.get("keep_num_dims") else 4), op.describe()
        if op.opcode == "MUL":
            a, b, out = (float(t.quantization.scale[0]) for t in (*op.inputs, op.outputs[0]))
            assert op.version == (3 if a * b / out >= 1 else 2), op.describe()
        if op.opcode in WEIGHTED:
            check_weights_and_bias(op, WEIGHTED[op.opcode])


def check_weights_and_bias(op, axis: int) -> None:
    """Symmetric per-channel int8 weights using the full range; int32 bias at input scale x weight scale."""
    x, w, bias = op.inputs[0], op.inputs[1], op.inputs[2]
    wq = w.quantization
    assert w.dtype is DType.int8 and wq.axis == axis and wq.scale.size == w.shape[axis], op.describe()
    assert not wq.zero_point.any()
    peaks = np.abs(np.asarray(w.data, np.int64)).max(axis=tuple(a for a in range(len(w.shape)) if a != axis))
    assert (peaks == 127).all(), op.describe()
    assert bias.dtype is DType.int32 and not bias.quantization.zero_point.any()
    expected = float(x.quantization.scale[0]) * wq.scale.astype(np.float64)
    np.testing.assert_allclose(bias.quantization.scale, expected, rtol=1e-6)


# --- the quantizer on ops the zoo does not use ----------------------------------------------------

def test_int8_ops_beyond_the_zoo():
    rng = np.random.default_rng(7)
    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 4))
    y = b.op("CONV_2D", [x, b.const("w", rng.standard_normal((6, 3, 3, 4)) * 0.3), b.const("b", rng.normal(0, 0.1, 6))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "NONE"})
    y = b.op("PAD", [y, b.const("pads", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))])
    y = b.op("STRIDED_SLICE", [y, b.const("begin", np.array([0, 1, 0, 0], np.int32)),
                               b.const("end", np.array([1, 9, 8, 6], np.int32)),
                               b.const("strides", np.array([1, 1, 1, 1], np.int32))],
             options={"begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0, "shrink_axis_mask": 0})
    squashed = b.op("TANH", [y])
    y = b.op("MAXIMUM", [b.op("HARD_SWISH", [y]), b.op("RELU6", [y])])
    y = b.op("TRANSPOSE_CONV", [b.const("out_shape", np.array([1, 16, 16, 3], np.int32)),
                                b.const("tw", rng.standard_normal((3, 3, 3, 6)) * 0.3), y, b.const("tb", np.zeros(3))],
             options={"padding": "SAME", "stride_w": 2, "stride_h": 2, "fused_activation_function": "NONE"},
             dtype="float32")
    pooled = b.op("MEAN", [y, b.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": False})
    b.output(squashed, pooled)
    data = write_model(full_int8(read_model(b.to_bytes()), samples=4))

    g = read_model(data).main
    assert {op.opcode: op.version for op in g.ops} == {
        "QUANTIZE": 1, "CONV_2D": 3, "PAD": 2, "STRIDED_SLICE": 2, "TANH": 2, "HARD_SWISH": 1, "RELU6": 2,
        "MAXIMUM": 2, "TRANSPOSE_CONV": 3, "MEAN": 2, "DEQUANTIZE": 2}
    tanh = next(op for op in g.ops if op.opcode == "TANH").outputs[0].quantization
    assert (float(tanh.scale[0]), int(tanh.zero_point[0])) == (1 / 128, 0)
    inputs = random_inputs(data, 8)
    expected = litert_run(data, inputs, builtin=True)
    assert all(e.std() > 0 for e in expected)
    assert_within_steps(delegate_run(data, inputs), expected, output_steps(data))


# --- the command line -------------------------------------------------------------------------------

def test_cli_writes_quantized_zoo_models(tmp_path, capsys):
    for quant in ("fp16", "int8"):
        out = tmp_path / f"block_{quant}.tflite"
        assert main(["zoo", "transformer_block", "--quant", quant, "-o", str(out), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert (doc["quant"], doc["path"], doc["bytes"]) == (quant, str(out), out.stat().st_size)
        g = read_model(out.read_bytes()).main
        converted = {op.opcode: op.inputs[0].dtype for op in g.ops if op.opcode in ("QUANTIZE", "DEQUANTIZE")}
        assert converted == ({"QUANTIZE": DType.float32, "DEQUANTIZE": DType.int8} if quant == "int8"
                             else {"DEQUANTIZE": DType.float16})
    with pytest.raises(SystemExit):
        main(["zoo", "transformer_block", "--quant", "int4"])


def test_load_takes_zoo_names_like_the_cli():
    import delegate
    session = delegate.load("zoo:posenet", backends="[cpu]", **{"cpu.engine": "numpy"})
    x = random_input(session.graph.inputs[0], np.random.default_rng(0))
    expected = litert_run(zoo.build("posenet"), [x])
    got = session.run({session.graph.inputs[0].name: x})
    for want, have in zip(expected, got.values()):
        np.testing.assert_allclose(have, want, atol=1e-4 * (np.ptp(want) + 1e-6))
    with pytest.raises(delegate.ModelFormatError, match="unknown zoo model 'nope'; known: blazeface, deeplab_v3"):
        delegate.load("zoo:nope")
