"""How the GPU backends move values between host and device: outputs read into host arrays made once
per compiled partition (pinned where OpenCL maps them), only the outputs the runtime says the host reads,
the device-resident run ``bench`` times, and the Session / Executor asking for a subset of the outputs."""

from __future__ import annotations

import numpy as np
import pytest

from delegate import CompileOptions, ExecutionError, InputError, load, read_model
from delegate.partition import make_partition
from delegate.plugins import default_manager
from delegate.runtime import Executor
from delegate.tflite.builder import GraphBuilder
from tests.models import conv_then_relu, normal
from tests.oputil import require_backend

BACKENDS = ("opencl", "wgpu")


def backend_of(name: str):
    require_backend(name)
    return default_manager().create(name)


def two_outputs() -> bytes:
    """relu(x) and x * 2 (both float32, 4-channel-unaligned: not PHWC4 in host order)."""
    b = GraphBuilder()
    x = b.input("x", (1, 4, 5, 3))
    b.output(b.op("RELU", [x], name="relu"))
    b.output(b.op("MUL", [x, b.const("two", np.full((3,), 2.0, np.float32))],
                  options={"fused_activation_function": "NONE"}, name="twice"))
    return b.to_bytes()


def compiled_whole(name: str, model: bytes):
    backend = backend_of(name)
    g = read_model(model).main
    return backend, g, backend.compile(make_partition(g, g.ops, name, 0), CompileOptions())


def expected(data: np.ndarray) -> list[np.ndarray]:
    return [np.maximum(data, 0), data * 2]


@pytest.mark.parametrize("name", BACKENDS)
def test_outputs_are_read_into_host_arrays_made_once(name):
    """Every run reads into the same host array per output (no allocation per run), each read holding that
    run's values."""
    backend, g, compiled = compiled_whole(name, two_outputs())
    rng = np.random.default_rng(1)
    seen = []
    for _ in range(3):
        data = normal(rng, (1, 4, 5, 3))
        values = compiled.run({g.inputs[0].index: backend.to_device(data)})
        hosts = [backend.to_host(values[t.index]) for t in g.outputs]
        for host, want in zip(hosts, expected(data)):
            np.testing.assert_allclose(host, want, rtol=1e-6, atol=1e-6)
        seen.append([id(h) for h in hosts])
    assert seen[0] == seen[1] == seen[2]


def test_opencl_reads_into_pinned_memory_and_falls_back_to_pageable(monkeypatch):
    """PoCL maps ALLOC_HOST_PTR buffers: the outputs land there; where mapping fails, in ordinary memory,
    with the reason in describe(), and the values are the same."""
    backend, g, compiled = compiled_whole("opencl", two_outputs())
    data = normal(np.random.default_rng(2), (1, 4, 5, 3))
    values = compiled.run({g.inputs[0].index: backend.to_device(data)})
    backend.to_host(values[g.outputs[0].index])
    assert compiled.describe()["host_outputs"] == ["pinned (mapped CL_MEM_ALLOC_HOST_PTR)"]

    cl = backend.state.cl

    def refuse(*args, **kwargs):
        raise cl.LogicError(cl._cl._ErrorRecord(routine="clEnqueueMapBuffer", code=-12, msg=""))
    monkeypatch.setattr(cl, "enqueue_map_buffer", refuse)
    backend, g, compiled = compiled_whole("opencl", two_outputs())
    values = compiled.run({g.inputs[0].index: backend.to_device(data)})
    hosts = [backend.to_host(values[t.index]) for t in g.outputs]
    for host, want in zip(hosts, expected(data)):
        np.testing.assert_allclose(host, want, rtol=1e-6, atol=1e-6)
    (kind,) = compiled.describe()["host_outputs"]
    assert kind.startswith("pageable (mapping a pinned buffer failed: clEnqueueMapBuffer failed")


def test_opencl_reads_back_only_the_hinted_outputs():
    """With the hint naming one output, the first read brings that one alone; the other still comes back
    when asked for, correct."""
    backend, g, compiled = compiled_whole("opencl", two_outputs())
    relu, twice = (t.index for t in g.outputs)
    compiled.read_hint(frozenset({relu}))
    data = normal(np.random.default_rng(3), (1, 4, 5, 3))
    values = compiled.run({g.inputs[0].index: backend.to_device(data)})
    np.testing.assert_allclose(backend.to_host(values[relu]), expected(data)[0], rtol=1e-6)
    assert values[twice].floats is None
    np.testing.assert_allclose(backend.to_host(values[twice]), expected(data)[1], rtol=1e-6)
    compiled.read_hint(None)
    values = compiled.run({g.inputs[0].index: backend.to_device(data)})
    backend.to_host(values[relu])
    assert values[twice].floats is not None  # read with the first one


def test_wgpu_records_read_backs_of_the_hinted_outputs_only():
    backend, g, compiled = compiled_whole("wgpu", two_outputs())
    relu, twice = (t.index for t in g.outputs)
    compiled.read_hint(frozenset({twice}))
    data = normal(np.random.default_rng(4), (1, 4, 5, 3))
    values = compiled.run({g.inputs[0].index: backend.to_device(data)})
    assert values[twice].fresh and not values[relu].fresh
    np.testing.assert_allclose(backend.to_host(values[twice]), expected(data)[1], rtol=1e-6)
    np.testing.assert_allclose(backend.to_host(values[relu]), expected(data)[0], rtol=1e-6)


@pytest.mark.parametrize("name", BACKENDS)
def test_a_resident_run_leaves_the_values_on_the_device(name):
    """run_resident runs the kernels on the inputs of the last run and waits; a read after it gives that
    run's outputs again (the kernels recomputed them from the same inputs)."""
    backend, g, compiled = compiled_whole(name, two_outputs())
    data = normal(np.random.default_rng(5), (1, 4, 5, 3))
    values = compiled.run({g.inputs[0].index: backend.to_device(data)})
    for t in g.outputs:
        backend.to_host(values[t.index])
    assert compiled.run_resident() is True
    values = compiled.run({g.inputs[0].index: backend.to_device(data)})
    for t, want in zip(g.outputs, expected(data)):
        np.testing.assert_allclose(backend.to_host(values[t.index]), want, rtol=1e-6, atol=1e-6)


def test_backends_without_a_resident_run_say_so():
    backend = backend_of("cpu")
    g = read_model(two_outputs()).main
    assert backend.compile(make_partition(g, g.ops, "cpu", 0), CompileOptions()).run_resident() is False


@pytest.mark.parametrize("name", BACKENDS)
def test_a_session_returns_and_reads_only_the_outputs_asked_for(name):
    require_backend(name)
    session = load(two_outputs(), backends=f"[{name}, cpu]", partitioner="greedy",
                   precision="fp32")
    data = normal(np.random.default_rng(6), (1, 4, 5, 3))
    (compiled,) = session.executor.compiled
    relu, twice = (t.index for t in session.graph.outputs)
    out = session.run({"x": data}, outputs=["twice"])
    assert list(out) == ["twice"]
    np.testing.assert_allclose(out["twice"], expected(data)[1], rtol=1e-6)
    if name == "opencl":
        assert compiled.host_reads == frozenset({twice})
    else:
        assert [t.wanted for t in compiled.outputs] == [False, True]
    full = session.run({"x": data})
    assert sorted(full) == ["relu", "twice"]
    np.testing.assert_allclose(full["relu"], expected(data)[0], rtol=1e-6)
    assert session.run_indexed(session.normalize_inputs({"x": data}), [relu]).keys() == {relu}
    with pytest.raises(InputError, match=r"unknown output\(s\) \['nope'\]"):
        session.run({"x": data}, outputs=["nope"])
    with pytest.raises(InputError, match="are not outputs of the model"):
        session.run_indexed(session.normalize_inputs({"x": data}), [session.graph.inputs[0].index])


def test_the_executor_reads_back_what_another_backend_consumes():
    """An OpenCL partition feeding a CPU partition reads that value back even when the caller asks for no
    output of its own; a value consumed only on OpenCL is not."""
    require_backend("opencl")
    b = GraphBuilder()
    x = b.input("x", (1, 4, 5, 3))
    a = b.op("RELU", [x])
    b.output(b.op("TANH", [a], name="y"))
    g = read_model(b.to_bytes()).main
    backends = {"opencl": backend_of("opencl"), "cpu": backend_of("cpu")}
    parts = [make_partition(g, [g.ops[0]], "opencl", 0), make_partition(g, [g.ops[1]], "cpu", 1)]
    executor = Executor(g, parts, backends, CompileOptions())
    data = normal(np.random.default_rng(7), (1, 4, 5, 3))
    (out,) = executor.run({g.inputs[0].index: data}).values()
    np.testing.assert_allclose(out, np.tanh(np.maximum(data, 0)), rtol=1e-5, atol=1e-6)
    assert executor.compiled[0].host_reads == frozenset({g.ops[0].outputs[0].index})
    assert executor.run({g.inputs[0].index: data}, frozenset()) == {}


@pytest.mark.parametrize("name", BACKENDS)
def test_the_interpreter_invokes_again_on_a_gpu_backend(name):
    """Nothing keeps the Interpreter's input buffer referenced after invoke() (the run's thread, an upload's
    event), so the next invoke() is not refused as if the caller held a view; each gives its own answer."""
    require_backend(name)
    from delegate.config import load_config
    from delegate.interpreter import Interpreter
    config = load_config(None, overrides=["partitioner=greedy", "precision=fp32"], backends=f"{name},cpu")
    interpreter = Interpreter(model_content=two_outputs(), config=config)
    interpreter.allocate_tensors()
    (x,) = interpreter.get_input_details()
    outputs = {d["name"]: d["index"] for d in interpreter.get_output_details()}
    rng = np.random.default_rng(9)
    for _ in range(3):
        data = normal(rng, (1, 4, 5, 3))
        interpreter.set_tensor(x["index"], data)
        interpreter.invoke()
        np.testing.assert_allclose(interpreter.get_tensor(outputs["relu"]), expected(data)[0], rtol=1e-6)
        np.testing.assert_allclose(interpreter.get_tensor(outputs["twice"]), expected(data)[1], rtol=1e-6)


def test_a_read_hint_that_raises_is_its_partitions_failure():
    """The runtime calls read_hint on a plugin's compiled partition (skipping one that has none); what it
    raises becomes an ExecutionError naming the partition, which the fallback acts on."""
    class Raising:
        def __init__(self, inner):
            self.inner = inner

        def run(self, inputs):
            return self.inner.run(inputs)

        def read_hint(self, indices):
            raise RuntimeError("boom")

    class Plain(Raising):
        read_hint = None

    backends = {"cpu": backend_of("cpu")}
    g = read_model(two_outputs()).main
    part = make_partition(g, g.ops, "cpu", 0)
    data = normal(np.random.default_rng(10), (1, 4, 5, 3))
    inner = backends["cpu"].compile(part, CompileOptions())
    executor = Executor(g, [part], backends, CompileOptions(), compiled=[Raising(inner)])
    with pytest.raises(ExecutionError, match="partition 0 on cpu failed: read_hint\\(\\) raised RuntimeError: boom"):
        executor.run({g.inputs[0].index: data})
    executor = Executor(g, [part], backends, CompileOptions(), compiled=[Plain(inner)])
    out = executor.run({g.inputs[0].index: data})
    np.testing.assert_allclose(out[g.outputs[0].index], expected(data)[0])


def gpu_interpreter(name: str):
    require_backend(name)
    from delegate.config import load_config
    from delegate.interpreter import Interpreter
    config = load_config(None, overrides=["partitioner=greedy", "precision=fp32"], backends=f"{name},cpu")
    interpreter = Interpreter(model_content=two_outputs(), config=config)
    interpreter.allocate_tensors()
    outputs = {d["name"]: d["index"] for d in interpreter.get_output_details()}
    return interpreter, interpreter.get_input_details()[0]["index"], outputs


@pytest.mark.parametrize("name", BACKENDS)
def test_the_interpreter_reads_back_the_outputs_read_after_the_last_invoke(name):
    """After an invoke whose outputs the caller read only one of, the next invoke reads back only that one;
    get_tensor of the other still gives this invoke's values, read from the device when asked for."""
    interpreter, x, outputs = gpu_interpreter(name)
    (compiled,) = interpreter._sessions[0].executor.compiled
    rng = np.random.default_rng(11)
    for step in range(4):
        data = normal(rng, (1, 4, 5, 3))
        interpreter.set_tensor(x, data)
        interpreter.invoke()
        reads = compiled.host_reads if name == "opencl" else frozenset(
            t.index for t in compiled.program.outputs if compiled.results[t.index].wanted)
        assert reads == (frozenset(outputs.values()) if step == 0 else frozenset({outputs["twice"]}))
        np.testing.assert_allclose(interpreter.get_tensor(outputs["twice"]), expected(data)[1], rtol=1e-6)
        if step == 3:  # an output not read back with the run comes from the device now
            np.testing.assert_allclose(interpreter.get_tensor(outputs["relu"]), expected(data)[0], rtol=1e-6)
            np.testing.assert_allclose(interpreter.tensor(outputs["relu"])(), expected(data)[0], rtol=1e-6)


def test_an_output_left_on_the_device_is_read_before_another_thread_runs():
    """Thread A invokes and reads nothing; thread B's invoke first brings A's outputs into A's buffers, so A
    still reads its own answer afterwards."""
    import threading

    interpreter, x, outputs = gpu_interpreter("opencl")
    rng = np.random.default_rng(12)
    first = normal(rng, (1, 4, 5, 3))
    interpreter.set_tensor(x, first)
    interpreter.invoke()
    interpreter.get_tensor(outputs["twice"])  # from now on only "twice" is read back with a run
    interpreter.set_tensor(x, first)
    interpreter.invoke()  # leaves "relu" on the device
    second = normal(rng, (1, 4, 5, 3))

    def other():
        interpreter.set_tensor(x, second)
        interpreter.invoke()
        np.testing.assert_allclose(interpreter.get_tensor(outputs["relu"]), expected(second)[0], rtol=1e-6)
    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    np.testing.assert_allclose(interpreter.get_tensor(outputs["relu"]), expected(first)[0], rtol=1e-6)
    np.testing.assert_allclose(interpreter.get_tensor(outputs["twice"]), expected(first)[1], rtol=1e-6)


def test_an_output_of_a_replaced_run_is_refused():
    require_backend("opencl")
    session = load(two_outputs(), backends="[opencl, cpu]", partitioner="greedy", precision="fp32")
    relu, twice = (t.index for t in session.graph.outputs)
    inputs = session.normalize_inputs({"x": np.zeros((1, 4, 5, 3), np.float32)})
    run = session.run_into(inputs, lambda results, owned: None, [twice])
    got = []
    session.fetch_into(relu, run, got.append)
    np.testing.assert_array_equal(got[0], np.zeros((1, 4, 5, 3), np.float32))
    with pytest.raises(ExecutionError, match="not an output the last run left unread"):
        session.fetch_into(relu, run, got.append)
    later = session.run_into(inputs, lambda results, owned: None, [twice])
    with pytest.raises(ExecutionError, match=f"output {relu} of run {run} is gone: run {later} came after"):
        session.fetch_into(relu, run, got.append)


def test_opencl_reads_an_input_and_writes_an_output_in_host_order():
    """A convolution of a 3-channel input, then RELU in a second partition: the convolution reads the caller's
    NHWC floats and stores its 3-channel output as NHWC floats (no conversion kernel either side); the second
    partition, handed that device value, takes it through the host into its input's conversion (RELU's kernel
    reads PHWC4, and stores its output for the host too), and both match LiteRT."""
    from tests.oputil import litert_run
    rng = np.random.default_rng(11)
    model = conv_then_relu(rng)
    backend = backend_of("opencl")
    g = read_model(model).main
    first, second = (backend.compile(make_partition(g, [op], "opencl", i), CompileOptions())
                     for i, op in enumerate(g.ops))
    assert (first.describe()["kernels"], first.describe()["conversions"]) == (1, 0)
    assert [t.host_layout for t in first.plan.inputs + first.plan.outputs] == [True, True]
    assert second.describe()["conversions"] == 1
    assert [t.host_layout for t in second.plan.inputs + second.plan.outputs] == [False, True]
    data = normal(rng, (1, 6, 5, 3))
    conv = first.run({g.inputs[0].index: backend.to_device(data)})[g.ops[0].outputs[0].index]
    relu = second.run({g.ops[0].outputs[0].index: conv})[g.outputs[1].index]
    want = litert_run(model, [data])
    np.testing.assert_allclose(backend.to_host(conv), want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(backend.to_host(relu), want[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_opencl_stores_for_the_host_an_output_a_free_reshape_makes(precision):
    """A 1x1 convolution of one pixel reshaped to (1, 10) (the same PHWC4 bytes: no kernel) as the output: the
    fp16 convolution stores its result in host order, which is the reshape's, so the output needs no
    conversion kernel (fp32's PHWC4 bytes are the host's already; fp16 converts the input, read by a product);
    the values match LiteRT."""
    from tests.oputil import litert_run
    rng = np.random.default_rng(12)
    b = GraphBuilder()
    x = b.input("x", (1, 1, 1, 6))
    y = b.op("CONV_2D", [x, b.const("w", normal(rng, (10, 1, 1, 6))), b.const("b", normal(rng, (10,)))],
             options={"padding": "VALID", "stride_w": 1, "stride_h": 1})
    b.output(b.op("RESHAPE", [y, b.const("shape", np.array([1, 10], np.int32))], options={"new_shape": [1, 10]}))
    model = b.to_bytes()
    backend = backend_of("opencl")
    g = read_model(model).main
    compiled = backend.compile(make_partition(g, g.ops, "opencl", 0), CompileOptions(precision=precision))
    assert (compiled.describe()["kernels"], compiled.describe()["conversions"]) == (1, int(precision == "fp16"))
    assert [t.host_layout for t in compiled.plan.outputs] == [precision == "fp16"]
    data = normal(rng, (1, 1, 1, 6))
    out = compiled.run({g.inputs[0].index: backend.to_device(data)})
    np.testing.assert_allclose(backend.to_host(out[g.outputs[0].index]), litert_run(model, [data])[0],
                               rtol=1e-2 if precision == "fp16" else 1e-5, atol=1e-2 if precision == "fp16" else 1e-5)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_wgpu_writes_an_output_in_host_order(precision):
    """A convolution into 3 channels, then RELU in a second partition: the convolution's kernel stores its
    output as NHWC floats (no layout_out), at fp32 and fp16 storage alike; the second partition, handed that
    device value, takes it through the host into its input (no device copy of host-order bytes into PHWC4),
    its RELU stores for the host too, and both match LiteRT."""
    from tests.oputil import litert_run
    rng = np.random.default_rng(11)
    model = conv_then_relu(rng)
    backend = backend_of("wgpu")
    g = read_model(model).main
    first, second = (backend.compile(make_partition(g, [op], "wgpu", i), CompileOptions(precision=precision))
                     for i, op in enumerate(g.ops))
    for compiled, template in ((first, "conv2d"), (second, "elementwise")):
        assert [launch.kernel for launch in compiled.program.launches] == [template]
        assert [(t.host_layout, t.convert) for t in compiled.program.outputs] == [(True, None)]
    data = normal(rng, (1, 6, 5, 3))
    conv = first.run({g.inputs[0].index: backend.to_device(data)})[g.ops[0].outputs[0].index]
    relu = second.run({g.ops[0].outputs[0].index: conv})[g.outputs[1].index]
    want = litert_run(model, [data])
    tolerance = 1e-2 if precision == "fp16" else 1e-5
    np.testing.assert_allclose(backend.to_host(conv), want[0], rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(backend.to_host(relu), want[1], rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("name", BACKENDS)
def test_the_outputs_of_a_multi_output_op_are_converted_for_the_host(name):
    """SPLIT into two 3-channel outputs: an op with several results stores none in host order (its
    kernels are written for PHWC4), so each output keeps its conversion kernel; both match LiteRT."""
    from tests.oputil import litert_run
    b = GraphBuilder()
    x = b.input("x", (1, 4, 5, 6))
    parts = b.op("SPLIT", [b.const("axis", np.array(3, np.int32)), x], options={"num_splits": 2},
                 name="split", num_outputs=2, dtype=np.float32)
    b.output(*parts)
    model = b.to_bytes()
    backend, g, compiled = compiled_whole(name, model)
    plan = compiled.plan if name == "opencl" else compiled.program
    assert [t.host_layout for t in plan.outputs] == [False, False]
    assert all(t.convert is not None for t in plan.outputs)
    data = normal(np.random.default_rng(13), (1, 4, 5, 6))
    values = compiled.run({g.inputs[0].index: backend.to_device(data)})
    for t, want in zip(g.outputs, litert_run(model, [data])):
        np.testing.assert_allclose(backend.to_host(values[t.index]), want, rtol=1e-6, atol=1e-6)


def test_wgpu_stores_for_the_host_an_output_a_free_reshape_makes():
    """A 3x3 convolution into 6 channels reshaped to (1, 30, 6) (the same PHWC4 bytes: no kernel) as the output,
    at fp16: the convolution stores its result in host order, which is the reshape's, so the output needs no
    conversion kernel; the values match LiteRT."""
    from tests.oputil import litert_run
    rng = np.random.default_rng(12)
    b = GraphBuilder()
    x = b.input("x", (1, 6, 5, 4))
    y = b.op("CONV_2D", [x, b.const("w", normal(rng, (6, 3, 3, 4))), b.const("b", normal(rng, (6,)))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1})
    b.output(b.op("RESHAPE", [y, b.const("shape", np.array([1, 30, 6], np.int32))], options={"new_shape": [1, 30, 6]}))
    model = b.to_bytes()
    backend = backend_of("wgpu")
    g = read_model(model).main
    compiled = backend.compile(make_partition(g, g.ops, "wgpu", 0), CompileOptions(precision="fp16"))
    assert [launch.kernel for launch in compiled.program.launches] == ["conv2d"]
    assert [(t.convert, t.host_layout) for t in compiled.program.outputs] == [(None, True)]
    data = normal(rng, (1, 6, 5, 4))
    out = compiled.run({g.inputs[0].index: backend.to_device(data)})
    np.testing.assert_allclose(backend.to_host(out[g.outputs[0].index]), litert_run(model, [data])[0],
                               rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype, shape", [("float32", (2, 6, 5, 3)), ("uint8", (1, 6, 7, 3)), ("int8", (1, 5, 7, 3))])
def test_wgpu_reads_a_convolutions_input_in_host_order(dtype, shape):
    """The one convolution reading a partition input reads the caller's NHWC values (float32, or uint8 / int8
    integers, 126 and 105 bytes: not whole words, which it dequantizes) where the host wrote them: no
    layout_in and no host dequantization; the result matches LiteRT."""
    from tests.conformance_cases import conv, quantized_conv
    from tests.oputil import assert_close, litert_run
    rng = np.random.default_rng(14)
    if dtype == "float32":
        model, inputs, _ = conv(rng, shape, 5, 3, {})
    else:
        model, inputs = quantized_conv(rng, "CONV_2D", dtype, (0.02, 128 if dtype == "uint8" else -4), (0.05, 3),
                                       shape=shape)
    backend = backend_of("wgpu")
    g = read_model(model).main
    compiled = backend.compile(make_partition(g, g.ops, "wgpu", 0), CompileOptions(allow_quantized=True))
    assert [launch.kernel for launch in compiled.program.launches] == ["conv2d"]
    assert [(t.host_layout, t.host_dtype, t.convert) for t in compiled.program.inputs] == [(True, dtype, None)]
    out = compiled.run({g.inputs[0].index: backend.to_device(inputs[0])})[g.outputs[0].index]
    want = litert_run(model, inputs)[0]
    got = backend.to_host(out)
    if dtype == "float32":
        assert_close([got], [want], rtol=1e-4, atol=1e-5)
    else:  # the float view rounds onto the output's grid: at most one step from LiteRT's integers
        assert got.dtype == want.dtype and np.max(np.abs(got.astype(np.int32) - want.astype(np.int32))) <= 1
