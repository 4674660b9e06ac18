"""Fault injection: a backend failing at any stage costs nothing but speed; a cache survives concurrent writers."""

import json
import subprocess
import sys

import numpy as np
import pytest

from delegate import hookimpl
from delegate.errors import ExecutionError
from delegate.planner import PlacementSettings
from delegate.plugins import PluginManager
from delegate.session import BackendFallbackWarning, RunSettings, Session
from tests.test_plugins import mixed_model

X = np.random.default_rng(0).standard_normal((1, 8, 8, 4)).astype(np.float32)


def cpu_reference():
    return Session(mixed_model(), RunSettings()).run([X])


def fake(options, fallback=True):
    return RunSettings(backends=[("fakegpu", options), ("cpu", {})], fallback=fallback,
                       placement=PlacementSettings(partitioner="greedy"))


def assert_same(outputs, reference):
    for name, value in reference.items():
        np.testing.assert_allclose(outputs[name], value, rtol=1e-6)


def test_support_query_crash_is_a_refusal():
    session = Session(mixed_model(), fake({"fail_supports": True}))
    assert all(p.backend == "cpu" for p in session.plan.partitions)
    assert "simulated support-query crash" in session.plan.decisions[0].refusals["fakegpu"]
    assert_same(session.run([X]), cpu_reference())


def test_device_lost_mid_run_falls_back_once_and_loses_nothing():
    session = Session(mixed_model(), fake({"lose_after": 1}))
    first = session.run([X])
    with pytest.warns(BackendFallbackWarning, match="fakegpu.*fake device disappeared") as record:
        second = session.run([X])
        third = session.run([X])
    assert len(record) == 1
    assert all(p.backend == "cpu" for p in session.executor.partitions)
    for outputs in (first, second, third):
        assert_same(outputs, cpu_reference())


def test_device_lost_without_fallback_is_a_clear_error():
    session = Session(mixed_model(), fake({"lose_after": 0}, fallback=False))
    with pytest.raises(ExecutionError, match="partition 0 on fakegpu failed: DeviceLost") as caught:
        session.run([X])
    assert (caught.value.partition, caught.value.backend) == (0, "fakegpu")


class PlanObserver:
    def __init__(self):
        self.plans = []

    @hookimpl
    def delegate_plan_ready(self, plan):
        self.plans.append(plan)


def test_fallback_is_a_new_plan_revision_that_observers_are_told_about():
    observer = PlanObserver()
    session = Session(mixed_model(), fake({"lose_after": 1}), manager=PluginManager(extra_plugins=[observer]))
    planned = session.plan
    on_device = [p.index for p in planned.partitions if p.backend == "fakegpu"]
    assert observer.plans == [planned] and planned.revision == 0 and len(on_device) == 2
    session.run([X])
    with pytest.warns(BackendFallbackWarning, match="fakegpu.*fake device disappeared"):
        assert_same(session.run([X]), cpu_reference())
    # one revision per partition that failed, each told; the plan observers saw first is left as it was
    assert [plan.revision for plan in observer.plans] == [0, 1, 2]
    assert [p.backend for p in planned.partitions if p.index in on_device] == ["fakegpu", "fakegpu"]
    final = observer.plans[-1]
    assert session.plan is final and {p.backend for p in final.partitions} == {"cpu"}
    assert all(ran is planned for ran, planned in zip(session.executor.partitions, final.partitions))
    assert [n for n in final.notes if n.startswith("revision ")] == [
        f"revision {r}: partition {i} on fakegpu moved to cpu: failed while running: partition {i} on fakegpu "
        f"failed: DeviceLost: fake device disappeared" for r, i in enumerate(on_device, 1)]
    assert {d.backend for d in final.decisions} == {"cpu"} and "fakegpu" in {d.backend for d in planned.decisions}


INIT_SCRIPT = """
import json, sys
import numpy as np
from delegate import CompileOptions, read_model
from delegate.planner import PlacementSettings
from delegate.session import RunSettings, Session
from delegate.tflite.builder import GraphBuilder
b = GraphBuilder()
x = b.input("x", (1, 8, 8, 3))
w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
y = b.op("CONV_2D", [x, b.const("w", w), b.const("b", np.zeros(4, np.float32))],
         options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"})
b.output(y)
settings = RunSettings(backends=[("opencl", {}), ("cpu", {})], fallback=False,
                       compile=CompileOptions(cache_dir=sys.argv[1], model_token="shared"),
                       placement=PlacementSettings(partitioner="greedy"))
s = Session(read_model(b.to_bytes()), settings)
out = s.run([np.ones((1, 8, 8, 3), np.float32)])
print(json.dumps({"program": s.executor.compiled[0].describe()["program"], "sum": float(out["conv_2d"].sum())}))
"""


def test_two_processes_share_one_kernel_cache(tmp_path):
    pytest.importorskip("pyopencl", reason="pyopencl is not installed")
    from delegate.plugins import default_manager
    ok, why = default_manager().backend_info("opencl").available()
    if not ok:
        pytest.skip(f"no OpenCL device: {why}")
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", INIT_SCRIPT, str(cache)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0]["sum"] == pytest.approx(results[1]["sum"])
    third = subprocess.run([sys.executable, "-c", INIT_SCRIPT, str(cache)], capture_output=True, text=True,
                           timeout=600)
    assert third.returncode == 0, third.stderr
    after = json.loads(third.stdout.strip().splitlines()[-1])
    assert after["program"] == "cache" and after["sum"] == pytest.approx(results[0]["sum"])
