"""The OpenCL partition enqueue: one native call (enqueue.c) where it builds, pyopencl's loop otherwise.

White-box checks of the runtime's own logic: the native path is the one that runs, gives the same
results as pyopencl's loop and LiteRT, reports a failing launch with pyopencl's own error, and gives
way to the loop without a compiler, with ``native_enqueue: false`` and while profiling.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from delegate import CompileOptions, read_model
from delegate import native as native_build
from delegate.partition import make_partition
from delegate.tflite.builder import GraphBuilder
from tests.models import normal
from tests.oputil import assert_close, litert_run

pytest.importorskip("pyopencl", reason="pyopencl is not installed")
from delegate_opencl import enqueue  # noqa: E402
from delegate_opencl.device import probe  # noqa: E402

_AVAILABLE, _WHY = probe()
if not _AVAILABLE:
    pytest.skip(f"no OpenCL device: {_WHY}", allow_module_level=True)

needs_native = pytest.mark.skipif(native_build.find_compiler() is None, reason="no C compiler on this machine")


def chain() -> tuple[GraphBuilder, list[np.ndarray]]:
    """Three kernels that cannot fuse (a pooling between convolutions) and their inputs."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 5))
    v = b.op("CONV_2D", [x, b.const("w1", normal(rng, (6, 3, 3, 5))), b.const("b1", normal(rng, (6,)))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"})
    v = b.op("MAX_POOL_2D", [v], options={"padding": "VALID", "stride_w": 2, "stride_h": 2, "filter_width": 2,
                                          "filter_height": 2, "fused_activation_function": "NONE"})
    b.output(b.op("CONV_2D", [v, b.const("w2", normal(rng, (4, 1, 1, 6))), b.const("b2", normal(rng, (4,)))],
                  options={"padding": "VALID", "stride_w": 1, "stride_h": 1, "fused_activation_function": "NONE"}))
    return b, [normal(rng, (1, 8, 8, 5))]


def compiled_chain(options=None):
    from delegate_opencl.backend import OpenCLBackend
    backend = OpenCLBackend(options or {})
    b, inputs = chain()
    g = read_model(b.to_bytes()).main
    return backend, g, backend.compile(make_partition(g, g.ops, "opencl", 0), CompileOptions()), b, inputs


def outputs(backend, g, compiled, inputs):
    values = compiled.run({t.index: backend.to_device(x) for t, x in zip(g.inputs, inputs)})
    return [backend.to_host(values[t.index]) for t in g.outputs]


@needs_native
def test_the_native_call_enqueues_every_kernel_and_agrees_with_litert(monkeypatch):
    backend, g, compiled, b, inputs = compiled_chain()
    assert compiled.describe()["kernels"] >= 2
    assert compiled.describe()["enqueue"] == f"native (one call for {compiled.describe()['kernels']} kernels)"
    calls = []
    native = compiled.prepared.native
    real = native.call
    monkeypatch.setattr(native, "call", lambda *args: calls.append(args[-2]) or real(*args))
    got = outputs(backend, g, compiled, inputs)
    assert calls == [len(compiled.launches)]  # one call, for all the kernels
    for want, have in zip(litert_run(b.to_bytes(), inputs), got):
        assert_close(have, want, rtol=1e-4, atol=1e-5)
    _, _, looped, _, _ = compiled_chain({"native_enqueue": False})
    assert looped.describe()["enqueue"] == "pyopencl loop (native_enqueue: false)"
    for first, second in zip(got, outputs(backend, g, looped, inputs)):
        np.testing.assert_array_equal(first, second)


@needs_native
def test_a_failing_launch_raises_what_pyopencl_raises():
    backend, g, compiled, _, inputs = compiled_chain()
    cl = backend.state.cl
    kernel, global_size, _ = compiled.launches[0]
    bad = (global_size[0] + 1, 1, 1) if global_size[0] > 1 else (2, 1, 1)  # a local size not dividing the global
    with pytest.raises(cl.Error) as theirs:
        cl.enqueue_nd_range_kernel(backend.state.queue, kernel, global_size, bad)
    prepared = enqueue.PreparedLaunches(compiled.prepared.native, [(kernel, global_size, bad)])
    with pytest.raises(cl.Error) as ours:
        prepared.enqueue(cl, backend.state.queue)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value) and ours.value.code == theirs.value.code
    assert ours.value.routine == "clEnqueueNDRangeKernel"
    backend.state.queue.finish()
    outputs(backend, g, compiled, inputs)  # the queue still runs


def test_error_classes_follow_pyopencl():
    import pyopencl as cl
    assert type(enqueue.cl_error(cl, "clX", cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE)) is cl.MemoryError
    assert type(enqueue.cl_error(cl, "clX", cl.status_code.INVALID_KERNEL_ARGS)) is cl.LogicError
    assert type(enqueue.cl_error(cl, "clX", cl.status_code.OUT_OF_RESOURCES)) is cl.RuntimeError
    assert str(enqueue.cl_error(cl, "clX", cl.status_code.INVALID_KERNEL_ARGS)) == "clX failed: INVALID_KERNEL_ARGS"


def test_without_a_compiler_the_pyopencl_loop_runs(monkeypatch, tmp_path):
    backend, g, compiled, b, inputs = compiled_chain()
    expected = outputs(backend, g, compiled, inputs)
    monkeypatch.setattr(native_build, "find_compiler", lambda: None)
    monkeypatch.setattr(enqueue, "_LOADED", [])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _, _, looped, _, _ = compiled_chain()
    assert looped.prepared is None
    assert looped.describe()["enqueue"] == "pyopencl loop (no C compiler found)"
    for want, have in zip(expected, outputs(backend, g, looped, inputs)):
        np.testing.assert_array_equal(have, want)


def test_a_failing_compiler_leaves_the_loop_and_no_library(monkeypatch, tmp_path):
    monkeypatch.setattr(native_build, "find_compiler", lambda: ["false"])
    monkeypatch.setattr(enqueue, "_LOADED", [])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _, _, looped, _, _ = compiled_chain()
    assert looped.describe()["enqueue"] == "pyopencl loop (false could not build enqueue.c)"
    assert not list(tmp_path.rglob("*.so"))


@needs_native
def test_profiling_takes_the_loop_and_gives_it_back():
    backend, g, compiled, _, inputs = compiled_chain()
    compiled.set_profiling(True)
    try:
        assert compiled.describe()["enqueue"] == "pyopencl loop (profiling: an event per kernel)"
        outputs(backend, g, compiled, inputs)
        times = compiled.profile()
        assert times and all(ms >= 0 for ms in times.values())
    finally:
        compiled.set_profiling(False)
    assert compiled.describe()["enqueue"].startswith("native")


# -- the wait for a run's work, bounded by limits.run_timeout_s ------------------------------------------------

@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_native), False])
def test_a_bounded_wait_returns_when_the_work_is_done_and_gives_up_after_its_limit(native, monkeypatch):
    """Both ways of asking: enqueue.c's loop and Python's (without a compiler, or ``native_enqueue: false``)."""
    from delegate_opencl.backend import OpenCLBackend
    from delegate_opencl.values import ABANDONED, WaitLimit, wait_within
    state = OpenCLBackend({}).state
    cl, queue = state.cl, state.queue
    asked = []
    wait = enqueue.NativeEnqueue.wait
    monkeypatch.setattr(enqueue.NativeEnqueue, "wait", lambda self, *a: asked.append(a) or wait(self, *a))
    gate = cl.UserEvent(state.context)
    marker = cl.enqueue_marker(queue, wait_for=[gate])
    try:
        for spin in (0.0, 0.05):
            started = time.perf_counter()
            with pytest.raises(TimeoutError, match=r"within 0.2 s \(limits.run_timeout_s\)"):
                wait_within(cl, queue, marker, WaitLimit(0.2, spin, native), ["held"])
            assert 0.2 <= time.perf_counter() - started < 2
            assert ABANDONED[-2:] == [marker, "held"]
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    wait_within(cl, queue, marker, WaitLimit(0.2, 0.05, native))
    wait_within(cl, queue, cl.enqueue_marker(queue), WaitLimit(None))
    assert marker.command_execution_status == cl.command_execution_status.COMPLETE
    assert len(asked) == (3 if native else 0)


def test_opencl_runs_on_the_calling_thread_and_a_run_that_never_finishes_falls_back(monkeypatch):
    """On a GPU the session gives OpenCL no watchdog thread (its run only enqueues); the wait for the outputs
    bounds itself instead: device work that never completes fails the partition in time, and the CPU takes
    over.  (The device here may be PoCL, a CPU device, whose runs keep the watchdog: it is taken for a GPU.)"""
    import delegate
    from delegate_opencl.backend import OpenCLBackend
    opened = OpenCLBackend.__init__

    def as_gpu(self, options=None):
        opened(self, options)
        self.facts = {**self.facts, "device_type": "gpu"}

    monkeypatch.setattr(OpenCLBackend, "__init__", as_gpu)
    from delegate.errors import ExecutionError
    from delegate.session import BackendFallbackWarning
    from delegate_opencl.compiled import ClCompiled
    b, inputs = chain()
    data = b.to_bytes()
    expected = litert_run(data, inputs)
    session = delegate.load(data, backends="[opencl, cpu]", partitioner="greedy", **{"limits.run_timeout_s": 0.3})
    assert [p.backend for p in session.executor.partitions] == ["opencl"]
    assert "opencl" not in session.executor.watchdogs
    assert_close(list(session.run(inputs).values())[0], expected[0], 1e-4)
    strict = delegate.load(data, backends="[opencl, cpu]", partitioner="greedy", fallback=False,
                           **{"limits.run_timeout_s": 0.3})

    gates = []
    enqueue_kernels = ClCompiled._enqueue_kernels

    def stalled(self):  # every kernel of the run waits for an event nobody completes
        gates.append(self.device.cl.UserEvent(self.device.context))
        self.device.cl.enqueue_marker(self.device.queue, wait_for=[gates[-1]])
        enqueue_kernels(self)

    monkeypatch.setattr(ClCompiled, "_enqueue_kernels", stalled)
    try:
        started = time.perf_counter()
        with pytest.warns(BackendFallbackWarning, match=r"within 0.3 s \(limits.run_timeout_s\)"):
            outputs = session.run(inputs)
        assert time.perf_counter() - started < 10
        assert_close(list(outputs.values())[0], expected[0], 1e-4)
        assert [p.backend for p in session.executor.partitions] == ["cpu"]
        with pytest.raises(ExecutionError, match=r"partition 0 on opencl failed: .*within 0.3 s"):
            strict.run(inputs)
    finally:
        import pyopencl as cl
        for gate in gates:  # the queue is the process's: let the stalled work through
            gate.set_status(cl.command_execution_status.COMPLETE)


def test_a_cpu_device_keeps_the_watchdog_thread_and_the_drivers_wait(monkeypatch):
    from delegate_opencl.backend import OpenCLBackend
    backend = OpenCLBackend({})
    monkeypatch.setitem(backend.facts, "device_type", "cpu")
    assert backend.bound_waits(300.0) is False and backend.wait_limit.seconds is None
    monkeypatch.setitem(backend.facts, "device_type", "gpu")
    assert backend.bound_waits(300.0) is True and backend.wait_limit.seconds == 300.0
