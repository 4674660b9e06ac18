"""Issue 17, behind the reader: caches that trust nothing, budgets, threads, checked partition boundaries.

Each test names the finding it keeps fixed.
"""

import hashlib
import json
import os
import stat
import threading
import time
import warnings

import numpy as np
import pytest
from delegate_fakegpu.plugin import DeviceArray, FakeGpu

from delegate import BackendInfo, hookimpl
from delegate.cache import MANIFEST, CacheWarning, EntryStore, clear, entries
from delegate.config import Limits, load_config
from delegate.errors import CacheError, ConfigError, ExecutionError
from delegate.interpreter import Interpreter
from delegate.planner import PlacementSettings
from delegate.plugins import PluginManager
from delegate.session import BackendFallbackWarning, RunSettings, Session
from delegate.tflite.builder import GraphBuilder
from delegate.tflite.reader import read_model
from tests.models import normal, residual_block
from tests.oputil import litert_run
from tests.test_plugins import mixed_model

X = np.random.default_rng(0).standard_normal((1, 8, 8, 4)).astype(np.float32)
KEY = "k" * 64


# -- caches (findings 6, 7, 13, 19) ---------------------------------------------------------------

def test_a_symlinked_cache_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(CacheError, match="symbolic link"):
        EntryStore(tmp_path / "link", "opencl")
    assert list(real.iterdir()) == []


def test_links_inside_the_cache_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    store = EntryStore(tmp_path / "cache", "opencl")
    (tmp_path / "cache" / "opencl-link").symlink_to(outside)
    with pytest.raises(CacheError, match="symbolic link"):
        EntryStore(tmp_path / "cache", "opencl-link")
    store.path(KEY, "bin").symlink_to("/dev/zero")
    with pytest.warns(CacheWarning, match="symbolic link"):
        assert store.load(KEY, "bin") is None
    assert store.store(KEY, "bin", b"payload") is not None  # replaces the link, never writes through it
    assert store.load(KEY, "bin") == b"payload"


def test_a_fifo_entry_neither_hangs_nor_is_read(tmp_path):
    store = EntryStore(tmp_path / "cache", "opencl")
    os.mkfifo(store.path(KEY, "bin"))
    started = time.monotonic()
    with pytest.warns(CacheWarning, match="not a regular file"):
        assert store.load(KEY, "bin") is None
    assert time.monotonic() - started < 5


def test_an_entry_over_the_size_cap_is_not_read(tmp_path, monkeypatch):
    import delegate.cache as cache
    store = EntryStore(tmp_path / "cache", "opencl")
    store.store(KEY, "bin", b"x" * 1000)
    monkeypatch.setattr(cache, "MAX_ENTRY_BYTES", 100)
    with pytest.warns(CacheWarning, match="more than the 100"):
        assert store.load(KEY, "bin") is None


def test_an_entry_changed_and_resummed_is_not_trusted(tmp_path):
    """#7: a truncated binary with a recomputed checksum was loaded and crashed the driver."""
    store = EntryStore(tmp_path / "cache", "opencl")
    store.store(KEY, "bin", b"a whole device binary")
    path = store.path(KEY, "bin")
    header = json.loads(path.read_bytes().partition(b"\n")[0])
    payload = b"a whole"
    header.update(size=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    header["hmac"] = hashlib.sha256(payload).hexdigest()
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)
    with pytest.warns(CacheWarning, match="checksum mismatch"):
        assert store.load(KEY, "bin") is None


def test_an_entry_of_another_user_is_not_read(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to give a file away")
    store = EntryStore(tmp_path / "cache", "opencl")
    store.store(KEY, "bin", b"payload")
    os.chown(store.path(KEY, "bin"), 12345, 12345)
    with pytest.warns(CacheWarning, match="another user"):
        assert store.load(KEY, "bin") is None


def test_a_directory_of_another_user_or_writable_parent_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(CacheError, match="parent .* is writable by others"):
        EntryStore(shared / "cache", "opencl")
    shared.chmod(0o1777)  # sticky, like /tmp: what others can do there is covered by the other checks
    assert stat.S_IMODE(os.stat(EntryStore(shared / "cache", "opencl").directory).st_mode) == 0o700
    if os.getuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 12345, 12345)
        with pytest.raises(CacheError, match="belongs to another user"):
            EntryStore(theirs, "opencl")


def test_a_directory_swapped_for_a_link_after_opening_is_not_followed(tmp_path):
    store = EntryStore(tmp_path / "cache", "opencl")
    store.store(KEY, "bin", b"ours")
    elsewhere = EntryStore(tmp_path / "elsewhere", "opencl")
    elsewhere.store(KEY, "bin", b"someone else's")
    os.rename(tmp_path / "cache" / "opencl", tmp_path / "moved")
    (tmp_path / "cache" / "opencl").symlink_to(tmp_path / "elsewhere" / "opencl")
    assert store.load(KEY, "bin") == b"ours"  # through the descriptor opened at the start


def test_a_directory_that_is_not_a_cache_is_refused_and_kept(tmp_path):
    """#13: `dir: .` made `cache clear` delete a project."""
    (tmp_path / "project.py").write_text("print()")
    with pytest.raises(CacheError, match="is not a delegate cache"):
        EntryStore(tmp_path, "opencl")
    with pytest.raises(CacheError, match="is not a delegate cache"):
        clear(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["project.py"]


def test_clear_deletes_only_its_own_entries(tmp_path):
    store = EntryStore(tmp_path / "cache", "wgpu", "m")
    store.store(KEY, "plan", b"plan")
    (store.directory / "mine.txt").write_text("not an entry")
    assert [(sub, header["kind"]) for sub, _, header, _ in entries(tmp_path / "cache")] == [("wgpu", "plan")]
    assert clear(tmp_path / "cache") == 1
    assert sorted(p.name for p in (tmp_path / "cache").rglob("*")) == [MANIFEST, "mine.txt", "wgpu"]


class Hostile(FakeGpu):
    """The fake accelerator, misbehaving as ``mode`` says: wrong outputs, hangs, a cache of its own."""

    name = "hostile"

    def compile(self, partition, options):
        mode = self.options.get("mode")
        if mode == "hang_compile":
            threading.Event().wait(30)
        if mode == "cache":
            EntryStore(options.cache_dir, "hostile")
        if mode == "silent_compile":
            raise RuntimeError()
        return HostileCompiled(super().compile(partition, options), mode)


class HostileCompiled:
    def __init__(self, inner, mode):
        self.inner, self.mode = inner, mode

    def run(self, inputs):
        if self.mode == "hang_run":
            threading.Event().wait(30)
        out = self.inner.run(inputs)
        change = {"half": lambda a: a[..., : a.shape[-1] // 2], "float16": lambda a: a.astype(np.float16),
                  "int8": lambda a: a.astype(np.int8), "float64": lambda a: a.astype(np.float64),
                  "host": lambda a: a}.get(self.mode)
        if change is None:
            return out
        if self.mode == "host":  # plain arrays, one missing
            return {k: v.array for k, v in list(out.items())[1:]}
        return {k: DeviceArray(change(v.array)) for k, v in out.items()}

    def describe(self):
        return {}


class HostilePlugin:
    @hookimpl
    def delegate_backends(self):
        return [BackendInfo("hostile", factory=Hostile)]


MANAGER = PluginManager(extra_plugins=[HostilePlugin()])


def hostile(mode, fallback=True, **limits):
    return RunSettings(backends=[("hostile", {"mode": mode}), ("cpu", {})], fallback=fallback,
                       placement=PlacementSettings(partitioner="greedy"), limits=Limits(**limits))


def cpu_reference():
    return Session(mixed_model(), RunSettings()).run([X])


def test_an_unsafe_cache_is_a_configuration_error_even_with_fallback(tmp_path):
    """#19: an unsafe cache only moved work to the CPU, with exit 0."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    settings = hostile("cache")
    settings.compile.cache_dir = str(shared)
    with pytest.raises(CacheError, match="writable by group or others"):
        Session(mixed_model(), settings, manager=MANAGER)


# -- partition boundaries (findings 5, 12) and timeouts (16) ---------------------------------------

@pytest.mark.parametrize("mode, words", [("half", r"as \[1, 8, 8, 2\] float32"), ("float16", "float16"),
                                         ("int8", "int8"), ("float64", "float64"),
                                         ("host", "did not return tensor")])
def test_a_plugin_returning_wrong_values_has_failed(mode, words):
    reference = cpu_reference()
    session = Session(mixed_model(), hostile(mode), manager=MANAGER)
    assert any(p.backend == "hostile" for p in session.executor.partitions)
    with pytest.warns(BackendFallbackWarning, match=words):
        outputs = session.run([X])
    for name, value in reference.items():
        np.testing.assert_allclose(outputs[name], value, rtol=1e-6)
    session = Session(mixed_model(), hostile(mode, fallback=False), manager=MANAGER)
    with pytest.raises(ExecutionError, match=f"partition 0 on hostile failed: .*{words}"):
        session.run([X])


def test_a_compile_error_without_a_message_still_says_what_failed():
    """#20: the warning read "compile failed: " and nothing more."""
    with pytest.warns(BackendFallbackWarning, match="compile failed: RuntimeError"):
        Session(mixed_model(), hostile("silent_compile"), manager=MANAGER)


def test_a_hanging_plugin_compile_falls_back_or_fails_in_time():
    started = time.monotonic()
    with pytest.warns(BackendFallbackWarning, match=r"compile\(\) did not finish within 0.3 s \(limits.compile_timeout_s\)"):
        session = Session(mixed_model(), hostile("hang_compile", compile_timeout_s=0.3), manager=MANAGER)
    assert all(p.backend == "cpu" for p in session.executor.partitions)
    from delegate.errors import CompileError
    with pytest.raises(CompileError, match="did not finish within 0.3 s"):
        Session(mixed_model(), hostile("hang_compile", fallback=False, compile_timeout_s=0.3), manager=MANAGER)
    assert time.monotonic() - started < 10


def test_a_hanging_plugin_run_falls_back_or_fails_in_time():
    reference = cpu_reference()
    started = time.monotonic()
    session = Session(mixed_model(), hostile("hang_run", run_timeout_s=0.3), manager=MANAGER)
    with pytest.warns(BackendFallbackWarning, match=r"run\(\) did not finish within 0.3 s \(limits.run_timeout_s\)"):
        outputs = session.run([X])
    np.testing.assert_allclose(outputs["tanh"], reference["tanh"], rtol=1e-6)
    session = Session(mixed_model(), hostile("hang_run", fallback=False, run_timeout_s=0.3), manager=MANAGER)
    with pytest.raises(ExecutionError, match="partition 0 on hostile failed: .*did not finish"):
        session.run([X])
    assert time.monotonic() - started < 10


# -- budgets (findings 14, 15) ----------------------------------------------------------------------

def big_intermediates_model() -> bytes:
    """A few hundred bytes declaring 2 GiB intermediates."""
    b = GraphBuilder()
    x = b.input("x", (1, 512, 1024, 1024))
    y = b.op("RELU", [x])
    b.output(b.op("ADD", [y, b.op("TANH", [y])], options={"fused_activation_function": "NONE"}))
    return b.to_bytes()


def test_a_model_over_the_memory_budget_is_refused_before_allocating():
    data = big_intermediates_model()
    assert len(data) < 2000
    with pytest.raises(ExecutionError, match=r"needs 6 GiB .* budget of 4 GiB \(limits.memory_mb\)"):
        Session(read_model(data), RunSettings(limits=Limits(memory_mb=4096)))


def test_the_default_budget_is_what_the_address_space_limit_leaves(monkeypatch):
    """Under ``ulimit -v`` the default budget (limits.memory_mb: null) is what the limit leaves beside what the
    process has mapped: a model planning past it is refused in one line, not by numpy's MemoryError."""
    import resource

    from delegate import config

    mapped = config._mapped_bytes()
    assert mapped > 0
    monkeypatch.setattr(resource, "getrlimit", lambda which: (mapped + (1 << 30), resource.RLIM_INFINITY)
                        if which == resource.RLIMIT_AS else (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert config.machine_memory() <= 1 << 30
    with pytest.raises(ExecutionError, match=r"more than the memory budget of 1 GiB \(limits.memory_mb\)"):
        Session(read_model(big_intermediates_model()), RunSettings(limits=Limits()))


def test_resize_is_checked_against_the_budget_and_negative_dimensions_are_refused():
    b = GraphBuilder()
    x = b.input("x", (1, 64, 64, 3), shape_signature=(-1, 64, 64, 3))
    b.output(b.op("RELU", [x]))
    it = Interpreter(model_content=b.to_bytes(), config=load_config("configs/cpu.yaml"))
    index = it.get_input_details()[0]["index"]
    with pytest.raises(ExecutionError, match="dimensions must be >= 0"):
        it.resize_tensor_input(index, [-1, 64, 64, 3])
    it.resize_tensor_input(index, [10_000_000, 64, 64, 3])
    with pytest.raises(ExecutionError, match="limits.memory_mb"):
        it.allocate_tensors()
    it.resize_tensor_input(index, [2, 64, 64, 3])
    it.allocate_tensors()
    value = normal(np.random.default_rng(1), (2, 64, 64, 3))
    it.set_tensor(index, value)
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), np.maximum(value, 0))


def test_a_huge_config_is_refused_before_parsing(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("pin: [" + ", ".join(["{op: ADD, backend: cpu}"] * 200_000) + "]\n")
    started = time.monotonic()
    with pytest.raises(ConfigError, match="is over 1024 KiB"):
        load_config(path)
    assert time.monotonic() - started < 2


def test_num_threads_is_bounded_by_the_machine():
    with pytest.raises(ConfigError, match="num_threads"):
        load_config(None, overrides=["num_threads=100000000"])
    with pytest.raises(ValueError, match="num_threads must be at most"):
        Interpreter(model_content=mixed_model_bytes(), num_threads=512 * (os.cpu_count() or 1))
    with pytest.raises(ValueError, match="num_threads should >= 1"):  # as LiteRT's own check says
        Interpreter(model_content=mixed_model_bytes(), num_threads=-1)


def test_shell_style_defaults_say_what_is_wrong():
    with pytest.raises(ConfigError, match=r"\$\{HOME:-x\}: only \$NAME and \$\{NAME\} are expanded"):
        load_config(None, overrides=["serialization.dir=${HOME:-x}/cache"])


def mixed_model_bytes() -> bytes:
    from delegate.tflite.writer import write_model
    return write_model(mixed_model())


# -- threads (finding 9) -------------------------------------------------------------------------

def threaded(worker, count=4):
    errors = []

    def guarded(i):
        try:
            worker(i)
        except Exception as exc:  # reported below with the thread's index
            errors.append((i, repr(exc)))

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_one_session_many_threads_each_get_their_own_answer():
    rng = np.random.default_rng(3)
    data = residual_block(rng).to_bytes()
    inputs = [[normal(rng, (1, 6, 5, 7)), normal(rng, (1, 6, 5, 6))] for _ in range(4)]
    expected = [litert_run(data, x) for x in inputs]
    session = Session(read_model(data), RunSettings(backends=[("cpu", {"engine": "numpy"})]))
    names = [t.name for t in session.output_tensors()]

    def worker(i):
        for _ in range(50):
            got = session.run(inputs[i])
            for name, want in zip(names, expected[i]):
                np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5)

    threaded(worker)


def test_one_interpreter_many_threads_each_get_their_own_answer():
    rng = np.random.default_rng(4)
    data = residual_block(rng).to_bytes()
    inputs = [[normal(rng, (1, 6, 5, 7)), normal(rng, (1, 6, 5, 6))] for _ in range(4)]
    expected = [litert_run(data, x) for x in inputs]
    it = Interpreter(model_content=data, config=load_config("configs/cpu.yaml", overrides=["cpu.engine=numpy"]))
    it.allocate_tensors()
    ins, outs = it.get_input_details(), it.get_output_details()

    def worker(i):
        for _ in range(50):
            for d, x in zip(ins, inputs[i]):
                it.set_tensor(d["index"], x)
            it.invoke()
            for d, want in zip(outs, expected[i]):
                np.testing.assert_allclose(it.get_tensor(d["index"]), want, rtol=1e-4, atol=1e-5)

    threaded(worker)


# -- the native library cache (finding 6) -----------------------------------------------------------

def test_the_native_library_is_loaded_only_from_a_verified_entry(tmp_path, monkeypatch):
    from delegate import native as native_build
    from delegate_cpu.kernels import native
    if native.native_loops() is None:
        pytest.skip("no C compiler: the native loops are not built here")
    store = EntryStore(native_build.native_cache_dir(), "cpu", "native")
    # this build's entry (the cache may hold builds of other versions of the source)
    key = native_build.entry_key(native.SOURCE.read_bytes(), native_build.find_compiler(), native.native_loops().flags)
    library = store.load(key, "so")
    assert library is not None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    builds = []
    monkeypatch.setattr(native_build, "compile_library",
                        lambda compiler, flags, source: builds.append(flags) or library)
    assert native._load() is not None and len(builds) == 1
    planted = EntryStore(native_build.native_cache_dir(), "cpu", "native")
    # the one just built
    (key,) = [h["key"] for sub, _, h, _ in entries(native_build.native_cache_dir()) if sub == "cpu"]
    path = planted.path(key, "so")
    assert path.parent == tmp_path / "delegate" / "native-loops" / "cpu"
    raw = path.read_bytes()
    head, _, payload = raw.partition(b"\n")
    forged = json.loads(head)
    forged["hmac"] = hashlib.sha256(payload[:100]).hexdigest()
    path.write_bytes(json.dumps(forged).encode() + b"\n" + payload[:100])  # truncated, re-summed
    with pytest.warns(CacheWarning, match="checksum mismatch"):
        assert native._load() is not None
    assert len(builds) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native._load() is not None and len(builds) == 2  # the rebuilt entry is used


# -- plugins that break the contract, inputs the CLI is given (findings 17, 20) --------------------

class Liar(FakeGpu):
    """supports() and estimate_ms() answering what the contract does not allow."""

    name = "liar"

    def supports(self, op, options):
        return self.options["supports"] if "supports" in self.options else super().supports(op, options)

    def estimate_ms(self, op, options):
        return self.options.get("estimate", 0.001)

    def cost_class(self, op):
        return self.options["cost_class"] if "cost_class" in self.options else super().cost_class(op)


class LiarPlugin:
    @hookimpl
    def delegate_backends(self):
        return [BackendInfo("liar", factory=Liar)]


@pytest.mark.parametrize("answer", [False, "yes", None, 1])
def test_a_support_answer_that_is_not_a_support_refuses_the_op(answer):
    reference = cpu_reference()
    settings = RunSettings(backends=[("liar", {"supports": answer}), ("cpu", {})])
    session = Session(mixed_model(), settings, manager=PluginManager(extra_plugins=[LiarPlugin()]))
    assert all(p.backend == "cpu" for p in session.executor.partitions)
    assert "supports() returned" in session.plan.decisions[0].refusals["liar"]
    np.testing.assert_allclose(session.run([X])["tanh"], reference["tanh"])


@pytest.mark.parametrize("estimate", ["fast", float("nan"), -1.0, True])
def test_an_estimate_that_is_not_a_time_is_a_plugin_error(estimate):
    from delegate.errors import PluginError
    settings = RunSettings(backends=[("liar", {"estimate": estimate}), ("cpu", {})])
    with pytest.raises(PluginError, match=r"estimate_ms\(\) returned"):
        Session(mixed_model(), settings, manager=PluginManager(extra_plugins=[LiarPlugin()]))


@pytest.mark.parametrize("klass", [None, "", 3])
def test_a_cost_class_that_is_not_a_name_is_a_plugin_error(klass):
    from delegate.errors import PluginError
    settings = RunSettings(backends=[("liar", {"cost_class": klass, "estimate": None}), ("cpu", {})])
    with pytest.raises(PluginError, match=r"cost_class\(\) returned"):
        Session(mixed_model(), settings, manager=PluginManager(extra_plugins=[LiarPlugin()]))


def write(path, builder):
    path.write_bytes(builder.to_bytes())
    return str(path)


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    b = GraphBuilder()
    b.output(b.op("RELU", [b.input("x", (1, 4))]))
    files = {"relu": write(d / "relu.tflite", b)}
    b = GraphBuilder()
    b.output(b.op("RELU", [b.input("x", (0, 2**31 - 1, 2**31 - 1, 2**31 - 1))]))
    files["huge_zero"] = write(d / "huge_zero.tflite", b)
    b = GraphBuilder()
    x = b.input("x", (1, 4), "string")
    b.output(b.op("RESHAPE", [x, b.const("s", np.array([4], np.int32))], shape=(4,)))
    files["string"] = write(d / "string.tflite", b)
    b = GraphBuilder()
    b.output(b.op("RELU", [b.input("x", (1, 8, 8, 1))]))
    files["image"] = write(d / "image.tflite", b)
    np.save(d / "text.npy", np.array([["a", "b", "c", "d"]]))
    np.savez(d / "objects.npz", x=np.array([[1, "a", None, 2]], dtype=object))
    np.savez(d / "good.npz", x=np.ones((1, 4), np.float32))
    raw = bytearray((d / "good.npz").read_bytes())
    raw[80:90] = b"\xff" * 10
    (d / "corrupt.npz").write_bytes(bytes(raw))
    (d / "truncated.npz").write_bytes(bytes(raw[:60]))
    from PIL import Image
    Image.new("L", (20000, 20000)).save(d / "bomb.png")
    return d, files


@pytest.mark.parametrize("model, extra, words", [
    ("huge_zero", [], "spans .* more than the memory budget"),
    ("string", [], "is a string tensor; only numeric inputs"),
    ("relu", ["-i", "text.npy"], "expects float32 numbers, got an array of <U1"),
    ("relu", ["-i", "objects.npz"], "not a readable .npz"),
    ("relu", ["-i", "corrupt.npz"], "not a readable .npz"),
    ("relu", ["-i", "truncated.npz"], "not a readable .npz"),
    ("image", ["-i", "bomb.png"], "cannot read image .*decompression bomb"),
])
def test_the_cli_maps_hostile_input_to_its_exit_code(hostile_files, model, extra, words):
    import re
    import subprocess
    import sys
    d, files = hostile_files
    proc = subprocess.run([sys.executable, "-m", "delegate.cli", "run", "--backends", "cpu", files[model], *extra],
                          capture_output=True, text=True, timeout=300, cwd=d)
    assert proc.returncode == ExecutionError.exit_code, proc.stderr
    assert "internal error" not in proc.stderr and re.search(words, proc.stderr), proc.stderr


def test_out_of_memory_in_the_cli_is_an_execution_error(monkeypatch, capsys, hostile_files):
    from delegate import cli

    def exhausted(self, inputs):
        raise MemoryError()
    monkeypatch.setattr(Session, "run", exhausted)
    assert cli.main(["run", "--backends", "cpu", hostile_files[1]["relu"]]) == ExecutionError.exit_code
    err = capsys.readouterr().err
    assert "out of memory" in err and "internal error" not in err
