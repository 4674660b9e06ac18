"""Device facts remembered between processes: a plan that leaves the GPU backends idle never opens their
devices, a lazily opened device is checked against the facts the plan used, and a changed driver
environment is another key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from delegate.gpu.remembered import Environment, Remembered


def test_the_signature_follows_the_driver_environment(tmp_path, monkeypatch):
    icd = tmp_path / "icd"
    icd.mkdir()
    library = tmp_path / "libdriver.so.1"
    library.write_bytes(b"v1")
    manifest = icd / "driver.json"
    manifest.write_text(json.dumps({"ICD": {"library_path": str(library)}}))
    monkeypatch.setenv("DRIVER_FILES", str(icd))
    monkeypatch.setenv("DRIVER_KNOB_A", "1")
    environment = Environment(packages=("numpy", "no-such-distribution"), variables=("DRIVER_FILES", "DRIVER_KNOB_*"))
    first = environment.signature()
    assert first == environment.signature()
    assert first["packages"]["no-such-distribution"] is None and first["variables"]["DRIVER_KNOB_A"] == "1"
    assert str(manifest) in first["files"] and str(library) in first["files"]  # the library the manifest names
    library.write_bytes(b"a new driver")
    assert environment.signature() != first
    again = environment.signature()
    monkeypatch.setenv("DRIVER_KNOB_B", "2")
    assert environment.signature() != again


def test_facts_round_trip_and_a_changed_device_replaces_them(tmp_path, monkeypatch):
    monkeypatch.setenv("DELEGATE_PROFILE_DIR", str(tmp_path))
    store = Remembered("gpu", {"device": ""}, Environment())
    assert store.facts() is None
    facts = {"backend": "gpu", "device": "X", "limits": {"a": 1}, "features": ["f16"]}
    store.store(facts)
    assert Remembered("gpu", {"device": ""}, Environment()).facts() == facts
    assert Remembered("gpu", {"device": "other"}, Environment()).facts() is None  # another request
    assert store.check(facts, dict(facts, features=("f16",))) is None  # the same facts, however held
    changed = store.check(facts, dict(facts, device="Y"))
    assert "device" in changed and store.facts()["device"] == "Y"
    store.path.write_text("{not json")
    assert store.facts() is None  # unreadable: probed again, never trusted


def _run(code: str, profiles) -> dict:
    env = dict(os.environ, DELEGATE_PROFILE_DIR=str(profiles))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


LOAD = """
import json, sys, time
import delegate
start = time.perf_counter()
session = delegate.load("zoo:mobilenet_v1")
session.wait_until_ready()  # the accelerators start behind the first runs (host first)
print(json.dumps({"on": sorted({p.backend for p in session.plan.partitions}),
                  "backends": sorted(session.backends),
                  "drivers": sorted(m for m in ("pyopencl", "wgpu") if m in sys.modules)}))
"""


def test_a_plan_that_leaves_the_software_devices_idle_never_opens_them(tmp_path):
    """The shipped defaults on a machine whose GPU APIs are served by its own cores: the first process
    opens the devices to learn their facts; the next plans from the facts alone, onto the CPU, without
    loading either driver."""
    first = _run(LOAD, tmp_path)
    present = [b for b in ("opencl", "wgpu") if b in first["backends"]]
    if not present:
        pytest.skip("neither OpenCL nor WebGPU is available here")
    assert first["on"] == ["cpu"]
    second = _run(LOAD, tmp_path)
    assert second["backends"] == first["backends"] and second["on"] == ["cpu"]
    assert second["drivers"] == []


LAZY = """
import json, sys
import numpy as np
import delegate
from delegate.inputs import make_inputs
gpu = delegate.load("zoo:mobilenet_v1", backends="[opencl,cpu]", partitioner="greedy")
gpu.wait_until_ready()
cpu = delegate.load("zoo:mobilenet_v1", backends="[cpu]")
x = make_inputs(gpu.graph, None)
a, b = (next(iter(s.run(x).values())) for s in (gpu, cpu))
print(json.dumps({"on": sorted({p.backend for p in gpu.plan.partitions}),
                  "error": float(np.abs(a - b).max() / (np.abs(b).max() or 1))}))
"""


def test_a_device_planned_from_remembered_facts_opens_when_it_compiles(tmp_path):
    pytest.importorskip("pyopencl")
    from delegate_opencl.device import probe
    if not probe()[0]:
        pytest.skip("no OpenCL device here")
    _run(LOAD, tmp_path)  # remembers the facts
    lazy = _run(LAZY, tmp_path)
    assert lazy["on"] == ["cpu", "opencl"] or lazy["on"] == ["opencl"]
    assert lazy["error"] < 1e-3


def test_a_device_whose_facts_changed_is_not_run_with_the_old_ones(tmp_path, monkeypatch):
    pytest.importorskip("pyopencl")
    from delegate_opencl.backend import OpenCLBackend
    from delegate_opencl.device import DeviceRequest, probe, remembered
    if not probe()[0]:
        pytest.skip("no OpenCL device here")
    monkeypatch.setenv("DELEGATE_PROFILE_DIR", str(tmp_path))
    live = OpenCLBackend({}).facts
    store = remembered(DeviceRequest())
    store.store(dict(live, compute_units=live["compute_units"] + 7))
    stale = OpenCLBackend({})
    assert stale.facts["compute_units"] == live["compute_units"] + 7  # planned from the remembered facts
    from delegate import PluginError
    with pytest.raises(PluginError, match="facts changed.*compute_units"):
        stale.state
    assert store.facts() == json.loads(json.dumps(live))  # the next load plans with the device's own
