"""The plugin contract: discovery, disable lists, a third-party backend end to end, hookspec meta-tests."""

import inspect
import warnings

import numpy as np
import pytest

import delegate
from delegate import hookimpl, hookspecs
from delegate.backend import HOST, BackendInfo, Support
from delegate.errors import CompileError, PluginError
from delegate.planner import PlacementSettings, Rule
from delegate.plugins import PluginManager
from delegate.session import BackendFallbackWarning, RunSettings, Session
from delegate.tflite.builder import GraphBuilder
from delegate import read_model

HOOKS = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("delegate_")]


def mixed_model():
    """ADD/MUL/TANH (the fake accelerator runs them) around an ABS (it does not)."""
    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 4))
    y = b.op("ADD", [x, b.const("c", np.full(4, 0.5, np.float32))], options={"fused_activation_function": "RELU"})
    y = b.op("MUL", [y, y], options={"fused_activation_function": "NONE"})
    z = b.op("ABS", [y])
    b.output(b.op("TANH", [z]), b.op("SUB", [y, z], options={"fused_activation_function": "NONE"}))
    return read_model(b.to_bytes())


def test_every_hookspec_documented_with_example():
    assert set(HOOKS) == {"delegate_backends", "delegate_custom_kernels", "delegate_graph_passes",
                          "delegate_plan_ready"}
    for name in HOOKS:
        doc = inspect.getdoc(getattr(hookspecs, name))
        assert doc and "@hookimpl" in doc, f"{name} lacks a documented example"


def test_entry_points_discovered():
    manager = PluginManager()
    names = {s.name: s for s in manager.status()}
    assert names["cpu"].available
    assert names["fakegpu"].available and names["fakegpu"].plugin == "fakegpu"


def test_disable_list_from_env(monkeypatch):
    monkeypatch.setenv("DELEGATE_DISABLE_PLUGINS", "fakegpu")
    assert "fakegpu" not in PluginManager().backends()
    assert "fakegpu" not in PluginManager(disable=["fakegpu"]).backends()


def test_unknown_backend_lists_installed():
    with pytest.raises(PluginError, match="installed backends: .*cpu"):
        PluginManager().backend_info("tpu9000")


def test_misspelt_hook_is_rejected():
    class Bad:
        @delegate.hookimpl
        def delegate_backend(self):  # missing "s"
            return []
    with pytest.raises(Exception, match="delegate_backend"):
        PluginManager(load_entry_points=False, extra_plugins=[Bad()])


class Recorder:
    """Implements every extension hook, to prove each one is called."""

    def __init__(self):
        self.calls = []

    @delegate.hookimpl
    def delegate_backends(self):
        self.calls.append("delegate_backends")
        return [BackendInfo("recorder-cpu", factory=lambda options: None, available=lambda: (False, "test only"))]

    @delegate.hookimpl
    def delegate_custom_kernels(self, backend):
        self.calls.append("delegate_custom_kernels")
        if backend == "cpu":
            def negate(op):
                def run(ins, outs):
                    np.negative(ins[0], out=outs[0])
                return run
            return {"MyNegate": negate}
        return None

    @delegate.hookimpl
    def delegate_graph_passes(self):
        self.calls.append("delegate_graph_passes")
        return [lambda graph: False]

    @delegate.hookimpl
    def delegate_plan_ready(self, plan):
        self.calls.append("delegate_plan_ready")


def test_every_hookspec_exercised():
    recorder = Recorder()
    manager = PluginManager(extra_plugins=[recorder])
    assert "recorder-cpu" in manager.backends()
    assert any(not s.available and s.reason == "test only" for s in manager.status())
    assert len(manager.graph_passes()) == 1
    b = GraphBuilder()
    x = b.input("x", (3,))
    b.output(b.op("MyNegate", [x], custom=True, shape=(3,)))
    session = Session(read_model(b.to_bytes()), RunSettings(), manager=manager)
    np.testing.assert_array_equal(session.run([np.array([1, -2, 3], np.float32)])["mynegate"], [-1, 2, -3])
    assert set(recorder.calls) == set(HOOKS)


def test_third_party_backend_end_to_end():
    model = mixed_model()
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 4)).astype(np.float32)
    reference = Session(model, RunSettings()).run([x])
    session = Session(model, RunSettings(backends=[("fakegpu", {}), ("cpu", {})],
                                         placement=PlacementSettings(partitioner="greedy")))
    assert {p.backend for p in session.plan.partitions} == {"fakegpu", "cpu"}
    assert session.plan.warnings() == ["op code #2 (ABS) cannot be handled by this delegate"]
    out = session.run([x])
    for name in reference:
        np.testing.assert_allclose(out[name], reference[name], rtol=1e-6)
    # y is consumed by the CPU (ABS) and by the accelerator (SUB): one download, then one upload of z
    assert session.executor.transfers_last_run >= 2


def test_failing_backend_falls_back_to_cpu_once():
    model = mixed_model()
    x = np.ones((1, 8, 8, 4), np.float32)
    settings = RunSettings(backends=[("fakegpu", {"fail_compile": True}), ("cpu", {})],
                           placement=PlacementSettings(partitioner="greedy"))
    with pytest.warns(BackendFallbackWarning, match="fakegpu.*simulated compiler crash"):
        session = Session(model, settings)
    assert all(p.backend == "cpu" for p in session.executor.partitions)
    np.testing.assert_allclose(session.run([x])["tanh"], Session(model, RunSettings()).run([x])["tanh"])
    settings.fallback = False
    with pytest.raises(CompileError, match="fakegpu' failed to compile partition 0: RuntimeError: simulated compiler crash") \
            as caught:
        Session(model, settings)
    assert (caught.value.partition, caught.value.backend) == (0, "fakegpu")


class HostPlugin:
    """A third-party host backend under another name than cpu (the CPU plugin's kernels, renamed)."""

    @hookimpl
    def delegate_backends(self):
        from delegate_cpu.plugin import CpuBackend

        class MyHost(CpuBackend):
            name = "myhost"
        return [BackendInfo("myhost", factory=MyHost, role=HOST, description="a host of its own")]


@pytest.mark.parametrize("fail_compile", [False, True])
def test_a_third_party_host_is_the_host(fail_compile):
    """With the cpu plugin disabled, a host backend of another name is the host: the config's word ``cpu`` means
    it, it runs what the accelerator refuses and holds the inputs and outputs, and fallback goes to it."""
    manager = PluginManager(disable=["cpu"], extra_plugins=[HostPlugin()])
    model = mixed_model()
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 4)).astype(np.float32)
    reference = Session(model, RunSettings()).run([x])
    settings = RunSettings(backends=[("fakegpu", {"fail_compile": fail_compile}), ("cpu", {})],
                           placement=PlacementSettings(partitioner="greedy"))
    with warnings.catch_warnings(record=True) as fell_back:
        warnings.simplefilter("always")
        session = Session(model, settings, manager=manager)
    assert list(session.backends) == ["fakegpu", "myhost"] and session.host == session.plan.host == "myhost"
    expected = {"myhost"} if fail_compile else {"fakegpu", "myhost"}
    assert {p.backend for p in session.executor.partitions} == expected
    assert [str(w.message) for w in fell_back if w.category is BackendFallbackWarning] == (
        ["backend 'fakegpu' compile failed: RuntimeError: simulated compiler crash; its partitions fall back to "
         "myhost"] if fail_compile else [])
    assert session.plan.decisions[2].backend == "myhost"  # ABS: the accelerator refuses it
    out = session.run([x])
    for name in reference:
        np.testing.assert_allclose(out[name], reference[name], rtol=1e-6)
    # without the word cpu in the list, the host is added all the same; a pin to cpu means that host
    pinned = Session(model, RunSettings(backends=[("fakegpu", {})], placement=PlacementSettings(
        partitioner="greedy", pins=[Rule(backend="cpu", op="MUL")])), manager=manager)
    assert list(pinned.backends) == ["fakegpu", "myhost"]
    with pytest.raises(PluginError, match="no host backend to run on .*: backend 'cpu' is not available here: its "
                                          "plugin is disabled"):
        Session(model, RunSettings(), manager=PluginManager(disable=["cpu"]))
    assert [d.backend for d in pinned.plan.decisions][:3] == ["fakegpu", "myhost", "myhost"]


def test_a_backend_of_unknown_role_is_not_loaded():
    class Odd:
        @hookimpl
        def delegate_backends(self):
            return [BackendInfo("odd", factory=lambda options: None, role="coprocessor")]
    manager = PluginManager(extra_plugins=[Odd()])
    assert "odd" not in manager.backends() and "role 'coprocessor'" in manager.load_errors["odd"]


@pytest.mark.parametrize("options, expected_backends, words", [
    ({"fp16_error": 0.5, "half_faster": True}, {"fakegpu", "cpu"}, "rebuilt in fp32"),
    ({"error": 0.5}, {"cpu"}, "moved to cpu"),
])
def test_accuracy_guard(options, expected_backends, words):
    from delegate.backend import CompileOptions
    from delegate.session import AccuracyBound
    model = mixed_model()
    settings = RunSettings(backends=[("fakegpu", options), ("cpu", {})], compile=CompileOptions(precision="fp16"),
                           placement=PlacementSettings(partitioner="greedy"),
                           accuracy_guard=AccuracyBound(max_abs_error=0.01))
    session = Session(model, settings)
    assert {p.backend for p in session.executor.partitions} == expected_backends
    assert any(words in note for note in session.plan.notes)
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 4)).astype(np.float32)
    reference = Session(model, RunSettings()).run([x])
    for name, value in session.run([x]).items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-5, atol=1e-6)


def test_config_disable_plugins_reaches_the_plugin_manager():
    """``disable_plugins`` in the config keeps a plugin out of sessions (skipped like an unavailable one)."""
    from delegate.config import load_config
    from delegate.session import run_settings

    config = load_config(None, overrides=["backends=[fakegpu, cpu]", "partitioner=greedy",
                                          "disable_plugins=[fakegpu]"])
    session = Session(mixed_model(), run_settings(config))
    assert {p.backend for p in session.plan.partitions} == {"cpu"}
    assert "disabled" in session.skipped["fakegpu"]
    strict = load_config(None, overrides=["backends=[fakegpu, cpu]", "disable_plugins=[fakegpu]", "fallback=false"])
    with pytest.raises(PluginError, match="disabled"):
        Session(mixed_model(), run_settings(strict))
    greedy = load_config(None, overrides=["backends=[fakegpu, cpu]", "partitioner=greedy"])
    enabled = Session(mixed_model(), run_settings(greedy))
    assert "fakegpu" in {p.backend for p in enabled.plan.partitions}


def test_backends_command_honours_disable_plugins(capsys):
    import json

    from delegate.cli import main

    assert main(["backends", "--json", "--set", "disable_plugins=[fakegpu]"]) == 0
    assert "fakegpu" not in {row["name"] for row in json.loads(capsys.readouterr().out)["backends"]}
    assert main(["backends", "--json"]) == 0
    assert "fakegpu" in {row["name"] for row in json.loads(capsys.readouterr().out)["backends"]}


def test_plugins_import_only_the_plugin_surface():
    """Every plugin module (first-party and the test plugin) imports delegate only through ``delegate.plugin_api``,
    and a GPU plugin also through the GPU kit: anything else of delegate is free to change under them."""
    import ast
    from pathlib import Path

    from delegate import plugin_api

    root = Path(__file__).parent.parent
    modules = sorted((root / "plugins").rglob("*.py")) + sorted((root / "tests" / "fake_plugin").rglob("*.py"))
    assert len(modules) > 20
    kit = plugin_api.GPU_KIT
    outside = []
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported = [node.module]
                if node.module == "delegate":  # ``from delegate import x`` names a module or a top-level name
                    imported = [f"delegate.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                imported = [a.name for a in node.names]
            else:
                continue
            for name in imported:
                if (name == "delegate" or name.startswith("delegate.")) and name != "delegate.plugin_api" \
                        and name != kit and not name.startswith(kit + "."):
                    outside.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    assert not outside, "plugins import delegate outside delegate.plugin_api:\n" + "\n".join(outside)
    missing = [n for n in plugin_api.__all__ if not hasattr(plugin_api, n)]
    assert not missing


def test_the_contract_is_declared_on_the_base_classes():
    """A backend that implements only what is abstract gets every other member of the contract from the base
    classes, so callers call them directly; members nothing reads are gone."""
    from delegate.backend import ACCELERATOR, Backend, CompiledPartition
    from delegate.cli import _devices
    from delegate.cost import ACCELERATOR_DEFAULT

    class Ran(CompiledPartition):
        def run(self, inputs):
            return dict(inputs)

    class Minimal(Backend):
        name = "minimal"

        def supports(self, op, options):
            return Support.yes()

        def compile(self, partition, options):
            return Ran()

    class Listed:
        @hookimpl
        def delegate_backends(self):
            return [BackendInfo("minimal", factory=lambda options: Minimal()),
                    BackendInfo("listed", factory=lambda options: Minimal(), list_devices=lambda: ["dev0", 1]),
                    BackendInfo("not_one", factory=lambda options: object())]

    manager = PluginManager(load_entry_points=False, extra_plugins=[Listed()])
    backend = manager.create("minimal")
    x = np.ones(3, np.float32)
    assert backend.role == ACCELERATOR and backend.default_profile() is ACCELERATOR_DEFAULT
    assert backend.to_host(backend.to_device(x)) is x and backend.transfer_ms(1 << 20) == 0.0
    compiled = backend.compile(None, None)
    compiled.set_profiling(True)
    assert compiled.op_timer() == "" and compiled.profile() == {} and compiled.describe() == {}
    assert _devices(manager, "minimal") == [] and _devices(manager, "listed") == ["dev0", "1"]
    with pytest.raises(PluginError, match="backend 'not_one': its factory returned object, not a Backend"):
        manager.create("not_one")
    assert not hasattr(Backend, "is_accelerator") and "is_accelerator" not in BackendInfo.__dataclass_fields__
    assert backend.precisions == ("fp32",)  # what the conformance matrix checks it in


def test_a_plugins_compile_error_is_told_its_partition():
    """Without fallback, a CompileError a plugin raises reaches the caller with its log and the partition."""
    from delegate.backend import Backend

    class Broken(Backend):
        name = "broken"

        def supports(self, op, options):
            return Support.yes() if op.opcode == "MUL" else Support.no("MUL only")

        def compile(self, partition, options):
            raise CompileError("kernel did not build", log="error: line 3")

    class Plugin:
        @hookimpl
        def delegate_backends(self):
            return [BackendInfo("broken", factory=lambda options: Broken())]

    settings = RunSettings(backends=[("broken", {}), ("cpu", {})], fallback=False,
                           placement=PlacementSettings(partitioner="greedy"))
    with pytest.raises(CompileError, match="^kernel did not build$") as caught:
        Session(mixed_model(), settings, manager=PluginManager(extra_plugins=[Plugin()]))
    assert (caught.value.log, caught.value.partition, caught.value.backend) == ("error: line 3", 1, "broken")


def test_opencl_passes_over_a_device_that_cannot_compile():
    """A driver can list a device whose compiler fails on this host (a CPU driver whose LLVM does not know
    the CPU): the backend chooses a device that builds, and with none says why, instead of failing later
    on every partition."""
    from delegate_opencl import device as cl_device

    class BuildError(Exception):
        pass

    class Device:
        def __init__(self, name, builds):
            self.name, self.builds, self.type, self.int_ptr = name, builds, 2, id(self)

    class Platform:
        def __init__(self, name, devices):
            self.name, self.devices = name, devices

        def get_devices(self):
            return self.devices

    class FakeCl:
        Error = BuildError
        device_type = type("device_type", (), {"GPU": 4, "ACCELERATOR": 8})

        def __init__(self, platforms):
            self.platforms = platforms

        def get_platforms(self):
            return self.platforms

        class Context:
            def __init__(self, devices):
                self.device = devices[0]

        class Program:
            def __init__(self, context, source):
                self.device = context.device

            def build(self):
                if not self.device.builds:
                    raise BuildError("clBuildProgram failed: BUILD_PROGRAM_FAILURE\nerror: unknown target CPU 'generic'")

    broken, working = Device("old-cpu", False), Device("new-cpu", True)
    cl = FakeCl([Platform("first", [broken]), Platform("second", [working])])
    platform, chosen = cl_device.select_device(cl, cl_device.DeviceRequest())
    assert chosen is working and platform.name == "second"
    with pytest.raises(PluginError, match="can compile OpenCL C.*old-cpu on first: error: unknown target CPU"):
        cl_device.select_device(FakeCl([Platform("first", [broken])]), cl_device.DeviceRequest())
