"""The CPU backend's LiteRT engine: a whole model as read goes to LiteRT as its own bytes, anything
else (a part of it, a graph changed since) written out; both give LiteRT's outputs."""

import os

import numpy as np
import pytest

from delegate import CompileOptions, read_model, zoo
from delegate.partition import make_partition
from delegate.plugins import default_manager
from delegate.runtime import Executor
from delegate.tflite.builder import GraphBuilder
from tests.oputil import litert_run

pytest.importorskip("ai_edge_litert.interpreter")


def _compile(graph, ops, num_threads: int = 1):
    backend = default_manager().backend_info("cpu").factory({"engine": "litert"})
    return Executor(graph, [make_partition(graph, ops, "cpu", 0)], {"cpu": backend},
                    CompileOptions(num_threads=num_threads))


def test_whole_model_goes_as_read_and_parts_are_written():
    data = zoo.mobilenet_v1(alpha=0.25, size=96)
    graph = read_model(data).main
    x = np.random.default_rng(0).standard_normal(graph.inputs[0].shape).astype(np.float32)
    whole = _compile(graph, graph.ops)
    assert whole.compiled[0].describe() == {"engine": "litert", "model": "as read", "threads": 1}
    out = whole.run({graph.inputs[0].index: x})[graph.outputs[0].index]
    np.testing.assert_array_equal(out, litert_run(data, [x])[0])
    part = _compile(graph, graph.ops[:5])
    assert part.compiled[0].describe()["model"] == "written"


def test_a_whole_model_whose_outputs_are_not_in_tensor_order_goes_as_read():
    """pose_landmark_full lists its outputs out of tensor order, which a partition never does: it was written
    out again (0.2 s of its load here, and a second copy of its weights) although it was the model as read."""
    b = GraphBuilder()
    x = b.input("x", (1, 6))
    late, early = b.op("RELU", [x]), b.op("NEG", [x])
    b.output(early, late)
    data = b.to_bytes()
    graph = read_model(data).main
    assert [t.index for t in graph.outputs] != sorted(t.index for t in graph.outputs)
    whole = _compile(graph, graph.ops)
    assert whole.compiled[0].describe()["model"] == "as read"
    value = np.random.default_rng(1).standard_normal((1, 6)).astype(np.float32)
    out = whole.run({graph.inputs[0].index: value})
    for t, expected in zip(graph.outputs, litert_run(data, [value])):
        np.testing.assert_array_equal(out[t.index], expected)


def test_a_small_partition_keeps_the_thread_count_it_runs_fastest_at(monkeypatch):
    """LiteRT's thread pool costs more than a small partition's ops gain from it (H200, 16 threads: a
    transformer block 9x slower than on one): under sustained_speed, partitions under SMALL_PARTITION_MS
    try fewer threads, in turns on zeros, keep the fastest (fewer only where clearly faster) and say what
    they measured."""
    from delegate_cpu import plugin

    data = zoo.transformer_block(tokens=8, width=16)
    graph = read_model(data).main
    backend = default_manager().backend_info("cpu").factory({"engine": "litert"})

    def run(preference="sustained_speed"):
        return Executor(graph, [make_partition(graph, graph.ops, "cpu", 0)], {"cpu": backend},
                        CompileOptions(num_threads=16, inference_preference=preference)).compiled[0]
    compiled = run()
    described = compiled.describe()
    assert set(described["thread_trial_ms"]) == {"16", "8", "1"} and described["threads"] in (16, 8, 1)
    trials = {int(k): v for k, v in described["thread_trial_ms"].items()}
    kept = described["threads"]  # never slower than the count asked for; fewer only where clearly faster
    assert kept == 16 or trials[kept] < plugin.THREAD_GAIN * trials[16]
    assert all(v >= plugin.THREAD_GAIN * trials[kept] for k, v in trials.items() if k < kept)
    x = np.random.default_rng(0).standard_normal(graph.inputs[0].shape).astype(np.float32)
    np.testing.assert_array_equal(compiled.run({graph.inputs[0].index: x})[graph.outputs[0].index],
                                  litert_run(data, [x])[0])
    # one answer soon: no trial interpreters (they cost more initialisation than one run gains)
    described = run("fast_single_answer").describe()
    assert described["threads"] == 16 and "thread_trial_ms" not in described
    monkeypatch.setattr(plugin, "SMALL_PARTITION_MS", 0.0)  # every partition is large: the count as asked
    described = run().describe()
    assert described["threads"] == 16 and "thread_trial_ms" not in described


def test_graph_changed_since_it_was_read_is_written():
    data = zoo.mobilenet_v1(alpha=0.25, size=96)
    graph = read_model(data).main
    graph.serialized = (graph.serialized[0], graph.serialized[1] + 1)  # as if an op had been added or removed
    assert _compile(graph, graph.ops).compiled[0].describe()["model"] == "written"


def _atan2_model() -> bytes:
    b = GraphBuilder()
    x, y = b.input("x", (2, 3)), b.input("y", (2, 3))
    b.output(b.op("ATAN2", [x, y], shape=(2, 3), name="angle"))
    return b.to_bytes()


@pytest.mark.parametrize("engine", ["litert", "auto"])
def test_engine_takes_every_op_litert_resolves(engine):
    """ATAN2 has no numpy kernel; LiteRT's interpreter runs it, so the LiteRT engine must too."""
    from delegate.config import load_config
    from delegate.interpreter import Interpreter

    data = _atan2_model()
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    it = Interpreter(model_content=data, config=load_config("configs/cpu.yaml", overrides=[f"cpu.engine={engine}"]))
    it.allocate_tensors()
    it.set_tensor(0, x)
    it.set_tensor(1, y)
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), litert_run(data, [x, y])[0])


def test_litert_is_asked_once_per_op_signature(monkeypatch):
    from delegate_cpu import plugin

    asked, ask = [], plugin._ask_litert
    monkeypatch.setattr(plugin, "_LITERT_ANSWERS", {})
    monkeypatch.setattr(plugin, "_ask_litert", lambda op: asked.append(op.opcode) or ask(op))
    backend = default_manager().backend_info("cpu").factory({"engine": "litert"})
    graph = read_model(_atan2_model()).main
    for _ in range(3):
        assert backend.supports(graph.ops[0], CompileOptions())
    b = GraphBuilder()
    b.output(b.op("NoSuchOp", [b.input("x", (2, 3))], custom=True, shape=(2, 3), name="y"))
    answer = backend.supports(read_model(b.to_bytes()).main.ops[0], CompileOptions())
    assert not answer and "LiteRT refuses it: Encountered unresolved custom op: NoSuchOp" in answer.reason
    assert asked == ["ATAN2", "NoSuchOp"]
    numpy_only = default_manager().backend_info("cpu").factory({"engine": "numpy"})
    assert not numpy_only.supports(graph.ops[0], CompileOptions())


def test_an_op_litert_refuses_only_when_it_runs_is_refused_at_planning():
    """LiteRT allocates an int16 SQUARED_DIFFERENCE and refuses it on its first invoke (the converter's
    transformer_block_int16x8): the CPU backend says so before any run, under either engine, instead of
    failing the user's first run; on zeros or ones a division's data (FLOOR_DIV by zero) is no refusal."""
    from pathlib import Path

    from delegate.errors import DelegateError
    from delegate.session import RunSettings, Session

    data = (Path(__file__).parent / "fixtures/converter/transformer_block_int16x8.tflite").read_bytes()
    graph = read_model(data).main
    op = next(op for op in graph.ops if op.opcode == "SQUARED_DIFFERENCE")
    for engine in ("litert", "auto", "numpy"):
        answer = default_manager().create("cpu", {"engine": engine}).supports(op, CompileOptions())
        assert not answer and "int16 SQUARED_DIFFERENCE" in answer.reason
    with pytest.raises(DelegateError, match="cannot run on any backend"):
        Session(read_model(data), RunSettings(backends=[("cpu", {"engine": "auto"})]))
    b = GraphBuilder()
    x, y = b.input("x", (2, 3), "int32"), b.input("y", (2, 3), "int32")
    b.output(b.op("FLOOR_DIV", [x, y], shape=(2, 3), dtype="int32", name="q"))
    assert default_manager().create("cpu", {"engine": "litert"}).supports(read_model(b.to_bytes()).main.ops[0],
                                                                          CompileOptions())


def test_profiled_runs_time_each_op_alone_on_the_values_the_op_before_made():
    """LiteRT times no op of a model it runs whole: profiling steps through the partition op by op, each op a
    one-op LiteRT model fed what the one before produced (indices computed at run time included), with the
    constants it folds inside it (the fp16 weights' DEQUANTIZE costs nothing, as in the whole
    model), and reports every op it ran; the partition's own results are unchanged."""
    from delegate.quantize import quantize
    from delegate.tflite.writer import write_model

    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 8))
    w = b.const("w", np.random.default_rng(1).standard_normal((8, 1, 1, 8)).astype(np.float32))
    y = b.op("CONV_2D", [x, w, b.const("bias", np.zeros(8, np.float32))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"})
    picked = b.op("ARG_MAX", [y, b.const("axis", np.array([3], np.int32))], options={"output_type": 2}, dtype="int32")
    looked_up = b.op("GATHER", [b.const("table", np.arange(8, dtype=np.float32)), picked], options={"axis": 0})
    b.output(b.op("ADD", [looked_up, looked_up], options={"fused_activation_function": "NONE"}))
    data = write_model(quantize(b.build(), "fp16"))
    graph = read_model(data).main
    executor = _compile(graph, graph.ops)
    compiled = executor.compiled[0]
    assert compiled.op_timer() == "each op alone, as a one-op LiteRT model"
    xv = np.random.default_rng(0).standard_normal(graph.inputs[0].shape).astype(np.float32)
    compiled.set_profiling(True)
    out = executor.run({graph.inputs[0].index: xv})[graph.outputs[0].index]
    np.testing.assert_array_equal(out, litert_run(data, [xv])[0])
    times = compiled.profile()
    run_ops = {op.index for op in graph.ops if op.opcode != "DEQUANTIZE"}
    assert set(times) == run_ops and all(ms > 0 for ms in times.values())
    # the one-op models, fed along the chain, computed what the whole model did
    np.testing.assert_array_equal(compiled.chain_outputs[graph.outputs[0].index], out)
    compiled.set_profiling(False)
    assert compiled.profile() == {} and compiled.chain_outputs == {}


def test_ops_timed_alone_hold_one_thread_pool_at_a_time():
    """Each op's one-op model is released once timed: holding one per op kept a thread pool each (140 pools of
    16 threads for pose_landmark_full), and the pools just used spun while the next op was timed."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    y = b.input("x", (1, 16, 16, 16))
    for i in range(12):
        w = b.const(f"w{i}", rng.standard_normal((16, 1, 1, 16)).astype(np.float32))
        y = b.op("CONV_2D", [y, w, b.const(f"b{i}", np.zeros(16, np.float32))],
                 options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"})
    b.output(y)
    graph = read_model(b.to_bytes()).main
    executor = _compile(graph, graph.ops, num_threads=4)
    compiled = executor.compiled[0]
    xv = rng.standard_normal(graph.inputs[0].shape).astype(np.float32)
    executor.run({graph.inputs[0].index: xv})
    before = len(os.listdir("/proc/self/task"))
    compiled.set_profiling(True)
    executor.run({graph.inputs[0].index: xv})
    times = compiled.profile()
    assert len(times) == 12 and all(ms > 0 for ms in times.values())
    assert len(os.listdir("/proc/self/task")) <= before + 4  # one pool of 4 at most, not 12
    compiled.set_profiling(False)


def _around_transpose_conv(custom: bool, size: int = 5) -> bytes:
    """A convolution, MediaPipe's Convolution2DTransposeBias (``custom``) or the builtin TRANSPOSE_CONV of the
    same geometry, and a LOGISTIC, on a ``size`` x ``size`` image; float16 weights, each read through a
    DEQUANTIZE."""
    from delegate.shapes import transpose_conv_bias_geometry

    rng = np.random.default_rng(4)
    b = GraphBuilder()

    def half(name, shape):
        return b.op("DEQUANTIZE", [b.const(name, rng.standard_normal(shape).astype(np.float16))], dtype="float32",
                    name=f"{name}_fp32")
    x = b.input("x", (1, size, size, 8))
    y = b.op("CONV_2D", [x, half("w", (6, 3, 3, 8)), half("bias", (6,))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"})
    weights, bias = half("up_w", (4, 2, 2, 6)), half("up_b", (4,))
    params = np.array([2, 2, 2], "<i4").tobytes()  # VALID, stride 2
    shape = transpose_conv_bias_geometry((1, size, size, 6), (4, 2, 2, 6), params)[0]
    if custom:
        up = b.op("Convolution2DTransposeBias", [y, weights, bias], custom=True, custom_options=params, shape=shape)
    else:
        up = b.op("TRANSPOSE_CONV", [b.const("shape", np.array(shape, np.int32)), weights, y, bias], version=3,
                  dtype="float32", options={"padding": "VALID", "stride_h": 2, "stride_w": 2}, shape=shape)
    b.output(b.op("LOGISTIC", [up]), y)
    return b.to_bytes()


def test_custom_op_litert_lacks_runs_on_numpy_between_litert_stretches():
    """LiteRT's own kernels lack MediaPipe's Convolution2DTransposeBias: that op runs on the numpy kernel, the
    ops before and after it on LiteRT (with the fp16 weights' DEQUANTIZE each stretch reads), host arrays
    between them; the results are LiteRT's for the builtin TRANSPOSE_CONV of the same geometry, and the
    profile times every op of every stretch."""
    data = _around_transpose_conv(custom=True)
    graph = read_model(data).main
    executor = _compile(graph, graph.ops)
    compiled = executor.compiled[0]
    described = compiled.describe()
    assert described["engine"] == "litert and numpy" and "Convolution2DTransposeBias" in described["litert_refused"]
    assert [s["engine"] for s in described["segments"]] == ["litert", "numpy", "litert"]
    xv = np.random.default_rng(0).standard_normal(graph.inputs[0].shape).astype(np.float32)
    compiled.set_profiling(True)
    out = executor.run({graph.inputs[0].index: xv})
    expected = litert_run(_around_transpose_conv(custom=False), [xv])
    for tensor, want in zip(graph.outputs, expected):
        np.testing.assert_allclose(out[tensor.index], want, rtol=1e-5, atol=1e-6)
    assert set(compiled.profile()) == {op.index for op in graph.ops if op.opcode != "DEQUANTIZE"}


@pytest.mark.parametrize("threads", [1, 4])
def test_a_custom_op_litert_lacks_is_costed_as_the_numpy_engine_runs_it_between_litert_calls(threads):
    """Planned for the LiteRT engine, the custom op LiteRT leaves to the numpy engine costs the numpy engine's
    estimate of it plus copying what it reads and writes across the LiteRT calls around it, both at one
    thread's figures whatever the plan's count (the kernel is a Python step of numpy calls); the op LiteRT
    runs itself keeps the planner's roofline."""
    from delegate.cost import cost_class, host_profile, op_bytes, op_flops, op_steps

    graph = read_model(_around_transpose_conv(custom=True, size=96)).main  # an op the threads' figures would share
    litert = default_manager().backend_info("cpu").factory({"engine": "litert"})
    numpy_engine = default_manager().backend_info("cpu").factory({"engine": "numpy"})
    options = CompileOptions(num_threads=threads)
    up = next(op for op in graph.ops if op.opcode == "Convolution2DTransposeBias")
    numpy_ms = host_profile(numpy_engine, 1).compute_ms(op_flops(up), op_bytes(up), cost_class(up), op_steps(up))
    moved = up.inputs[0].nbytes + up.outputs[0].nbytes  # the weights are compile-time constants
    copies_ms = 2 * moved / (host_profile(litert, 1).gbytes_per_s * 1e9) * 1e3
    assert litert.estimate_ms(up, options) == pytest.approx(numpy_ms + copies_ms)
    assert numpy_engine.estimate_ms(up, options) is None  # the numpy engine's own plan: the roofline
    assert all(litert.estimate_ms(op, options) is None for op in graph.ops if op is not up)


@pytest.mark.parametrize("engine", ["litert", "numpy"])
def test_a_sessions_outputs_are_its_runs_own_whether_or_not_they_are_copied_again(engine):
    """LiteRT's engine returns copies (``outputs_owned``): the session hands them over without a second copy;
    the numpy engine's are copied.  Either way a run's outputs stay as they were after the next run."""
    import delegate
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 4))
    y = b.op("CONV_2D", [x, b.const("w", rng.standard_normal((6, 3, 3, 4))), b.const("bias", rng.standard_normal(6))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1}, name="y")
    z = b.op("ADD", [y, b.const("one", np.float32(1.0))], name="z")
    b.output(y, z)
    model = b.to_bytes()
    session = delegate.load(model, backends="[cpu]", **{"cpu.engine": engine})
    first_in, second_in = (rng.standard_normal((1, 8, 8, 4)).astype(np.float32) for _ in range(2))
    first = session.run({"x": first_in})
    kept = {name: value.copy() for name, value in first.items()}
    second = session.run({"x": second_in})
    expected = litert_run(model, [first_in])
    for name in first:
        np.testing.assert_array_equal(first[name], kept[name])
        assert not np.array_equal(first[name], second[name])
        assert first[name] is not second[name] and not np.shares_memory(first[name], second[name])
    owned = session._serving.owned_last_run
    assert owned == (frozenset(t.index for t in session.graph.outputs) if engine == "litert" else frozenset())
    for got, want in zip((first[t.name] for t in session.graph.outputs), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
