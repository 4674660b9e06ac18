"""Choosing the WebGPU adapter, opening a device on it, and the facts and limits that shape the plan.

wgpu is imported inside functions only, so importing the plugin never fails:
a missing package or adapter makes the backend unavailable, with the reason.
Devices are shared per adapter within a process (with their pipelines), so
compiling many small models (tests, several sessions) builds each shader once.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, Mapping

from delegate.plugin_api import PluginError
from delegate.gpu.options import check_keys, choice
from delegate.gpu.remembered import Environment, Remembered, importable
from delegate.gpu.waits import WaitLimit

from . import __version__

POWER_PREFERENCES = ("high-performance", "low-power")
BACKEND_TYPES = {"vulkan": ("vulkan",), "metal": ("metal",), "dx12": ("d3d12", "dx12"),
                 "gl": ("opengl", "opengles", "gl"), "any": ()}
# The backend's options (JSON Schema of each; the config loader checks them against these)
OPTIONS = {"power_preference": {"enum": list(POWER_PREFERENCES)}, "backend_type": {"enum": list(BACKEND_TYPES)},
           "adapter": {"type": "string", "minLength": 1},
           "limits": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1}},
           "workgroup_size": {"type": "integer", "minimum": 1}, "fuse": {"type": "boolean"},
           "subgroups": {"type": "boolean"}}
OPTION_KEYS = tuple(OPTIONS)
# Adapter limits the plan depends on; a ``limits`` option may lower them (to plan for a smaller device).
LIMITS = ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
          "max-compute-invocations-per-workgroup", "max-compute-workgroup-size-x",
          "max-compute-workgroups-per-dimension", "max-uniform-buffer-binding-size",
          "max-compute-workgroup-storage-size")
# Native APIs before OpenGL, whose compute path is the most restricted.
TIMESTAMP_FEATURES = ("timestamp-query", "timestamp-query-inside-passes")
_API_RANK = {"vulkan": 0, "metal": 0, "d3d12": 0, "opengl": 2, "opengles": 2}
_KIND_RANK = {"high-performance": {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3},
              "low-power": {"IntegratedGPU": 0, "DiscreteGPU": 1, "VirtualGPU": 2, "CPU": 3}}


@dataclass(frozen=True)
class AdapterRequest:
    """Backend options naming an adapter, plus the limits and workgroup size to plan with."""

    power_preference: str = "high-performance"
    backend_type: str = "any"
    adapter: str = ""
    limits: tuple[tuple[str, int], ...] = ()
    workgroup_size: int = 64
    fuse: bool = True
    subgroups: bool = True  # reductions may use subgroup operations where the adapter has them

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "AdapterRequest":
        check_keys("wgpu", options, OPTION_KEYS)
        power = choice("wgpu", options, "power_preference", "high-performance", POWER_PREFERENCES)
        api = choice("wgpu", options, "backend_type", "any", tuple(BACKEND_TYPES))
        limits = []
        for name, value in dict(options.get("limits") or {}).items():
            key = str(name).replace("_", "-")
            if key not in LIMITS:
                raise PluginError(f"wgpu backend: unknown limit {name!r}; limits that can be lowered: "
                                  f"{', '.join(l.replace('-', '_') for l in LIMITS)}")
            if not isinstance(value, int) or value < 1:
                raise PluginError(f"wgpu backend: limit {name} must be a positive integer, got {value!r}")
            limits.append((key, value))
        size = options.get("workgroup_size", 64)
        if not isinstance(size, int) or size < 1:
            raise PluginError(f"wgpu backend: workgroup_size must be a positive integer, got {size!r}")
        return cls(power, api, str(options.get("adapter", "") or ""), tuple(sorted(limits)), size,
                   bool(options.get("fuse", True)), bool(options.get("subgroups", True)))

    def describe(self) -> str:
        parts = [f"backend_type={self.backend_type}", f"power_preference={self.power_preference}"]
        if self.adapter:
            parts.insert(0, f"adapter~{self.adapter!r}")
        return ", ".join(parts)


def _private_runtime_dir() -> None:
    """Give the process an ``XDG_RUNTIME_DIR`` when it has none, before any driver loads.

    Mesa's drivers probe Wayland, and libwayland prints "XDG_RUNTIME_DIR is invalid or not set" for
    each probe without one (a server session, a container).  The directory must be private, as the
    variable's specification says: this user's own, mode 0700, not a link; otherwise a fresh one.
    """
    if os.environ.get("XDG_RUNTIME_DIR", "").startswith("/") or not hasattr(os, "getuid"):
        return  # set (all that libwayland checks), or not POSIX: no Wayland
    path = os.path.join(tempfile.gettempdir(), f"delegate-runtime-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return  # no writable temporary directory: the message is only noise
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) != 0o700:
        path = tempfile.mkdtemp(prefix="delegate-runtime-")
    os.environ["XDG_RUNTIME_DIR"] = path


def import_wgpu():
    """The wgpu module, or PluginError saying how to get it."""
    _private_runtime_dir()
    try:
        import wgpu
    except ImportError as exc:
        raise PluginError(f"wgpu is not installed ({exc}); install delegate[wgpu]") from None
    return wgpu


@functools.lru_cache(maxsize=1)
def adapters() -> tuple[Any, ...]:
    """Every adapter wgpu finds (enumerated once per process: it initialises each driver)."""
    wgpu = import_wgpu()
    try:
        found = tuple(wgpu.gpu.enumerate_adapters_sync())
    except Exception as exc:
        raise PluginError(f"wgpu could not enumerate adapters: {type(exc).__name__}: {exc}") from None
    if not found:
        raise PluginError("wgpu found no adapter; install a Vulkan, Metal or D3D12 driver "
                          "(on Linux without a GPU: Mesa lavapipe, package mesa-vulkan-drivers)")
    return found


def api_name(adapter) -> str:
    return str(adapter.info.get("backend_type", "")).lower()


def describe_adapter(adapter) -> str:
    info = adapter.info
    return describe_facts({"adapter": info.get("device"), "vendor": info.get("vendor"),
                           "adapter_type": info.get("adapter_type"), "backend_type": info.get("backend_type"),
                           "shader_f16": "shader-f16" in adapter.features})


def describe_facts(facts: Mapping[str, Any]) -> str:
    """An adapter as ``delegate backends`` names it, from its facts (``device_facts``, or remembered)."""
    f16 = ", shader-f16" if facts.get("shader_f16") else ""
    return f"{facts.get('adapter') or facts.get('vendor')} ({facts.get('adapter_type')}, {facts.get('backend_type')}{f16})"


# What selects the WebGPU driver: wgpu-py (it bundles wgpu-native) and the Vulkan loader's drivers.
ENVIRONMENT = Environment(
    packages=("wgpu",),
    variables=("VK_DRIVER_FILES", "VK_ICD_FILENAMES", "VK_ADD_DRIVER_FILES", "VK_LOADER_DRIVERS_SELECT",
               "VK_LOADER_DRIVERS_DISABLE", "LD_LIBRARY_PATH", "MESA_*", "WGPU_*", "CUDA_VISIBLE_DEVICES",
               "NVIDIA_VISIBLE_DEVICES"),
    manifests=("/usr/share/vulkan/icd.d/*.json", "/usr/local/share/vulkan/icd.d/*.json", "/etc/vulkan/icd.d/*.json",
               "~/.local/share/vulkan/icd.d/*.json"))


def remembered(request: AdapterRequest) -> Remembered:
    """The stored facts of the adapter ``request`` selects (what selects it: the adapter, API, power
    preference and lowered limits)."""
    return Remembered("wgpu", {"adapter": request.adapter, "backend_type": request.backend_type,
                               "power_preference": request.power_preference, "limits": list(request.limits),
                               "plugin": __version__}, ENVIRONMENT)


def list_devices() -> list[str]:
    """One line per adapter, for ``delegate backends``."""
    return [describe_adapter(a) for a in adapters()]


def select_adapter(request: AdapterRequest):
    """The best adapter matching ``request``; PluginError listing the adapters when none does."""
    found = adapters()
    wanted = BACKEND_TYPES[request.backend_type]
    needle = request.adapter.lower()
    matches = [a for a in found
               if (not wanted or api_name(a) in wanted)
               and (not needle or any(needle in str(a.info.get(k, "")).lower()
                                      for k in ("device", "vendor", "description")))]
    if not matches:
        listing = "; ".join(describe_adapter(a) for a in found)
        raise PluginError(f"wgpu backend: no adapter matches {request.describe()}; adapters found: {listing}")
    kinds = _KIND_RANK[request.power_preference]
    return min(matches, key=lambda a: (kinds.get(a.info.get("adapter_type"), 4), _API_RANK.get(api_name(a), 1)))


def probe() -> tuple[bool, str]:
    """Whether a WebGPU adapter is usable here, and which (or why not); never raises.  Facts remembered from
    an earlier process answer without starting a driver."""
    try:
        facts = remembered(AdapterRequest()).facts()
        if facts is not None and importable("wgpu"):
            return True, describe_facts(facts)
        return True, describe_adapter(select_adapter(AdapterRequest()))
    except PluginError as exc:
        return False, str(exc)
    except Exception as exc:  # a broken driver must not break discovery
        return False, f"wgpu probe failed: {type(exc).__name__}: {exc}"


@dataclass
class DeviceContext:
    """An open device and what is built on it once per process: pipelines and bind group layouts."""

    adapter: Any
    device: Any
    f16: bool
    timestamps: bool  # per-dispatch GPU timestamps (for per-op profiles)
    limits: dict[str, int]
    subgroups: bool = False  # subgroup operations, in subgroups of consecutive invocations
    poll_in_caller: bool = False  # runs wait by polling from their own thread (``map_for_reading``)
    pipelines: dict[str, Any] = field(default_factory=dict)
    layouts: dict[tuple, Any] = field(default_factory=dict)


_CONTEXTS: dict[tuple, DeviceContext] = {}


def open_device(request: AdapterRequest) -> DeviceContext:
    """The shared device on the adapter ``request`` selects, with limits lowered as it asks (its workgroup
    size is checked against them by the backend, on the facts it plans with: ``check_workgroup_size``)."""
    adapter = select_adapter(request)
    caps = dict(request.limits)
    limits = {name: min(int(adapter.limits[name]), caps.get(name, adapter.limits[name])) for name in LIMITS}
    key = (id(adapter), tuple(sorted(limits.items())))
    context = _CONTEXTS.get(key)
    if context is None:
        f16 = "shader-f16" in adapter.features
        timestamps = set(TIMESTAMP_FEATURES) <= set(adapter.features)
        subgroups = "subgroup" in adapter.features
        features = ((["shader-f16"] if f16 else []) + (list(TIMESTAMP_FEATURES) if timestamps else [])
                    + (["subgroup"] if subgroups else []))
        try:
            device = adapter.request_device_sync(label="delegate", required_features=features,
                                                 required_limits=dict(limits))
        except Exception as exc:
            raise PluginError(f"wgpu backend: cannot open a device on {describe_adapter(adapter)}: {exc}") from None
        context = _CONTEXTS[key] = DeviceContext(adapter, device, f16, timestamps, limits,
                                                 subgroups and consecutive_subgroups(device),
                                                 poll_in_caller=adapter.info.get("adapter_type") != "CPU")
    return context


def check_workgroup_size(request: AdapterRequest, limits: Mapping[str, int], adapter: str) -> None:
    size = request.workgroup_size
    most = min(limits["max-compute-invocations-per-workgroup"], limits["max-compute-workgroup-size-x"])
    if size > most:
        raise PluginError(f"wgpu backend: workgroup_size {size} exceeds what {adapter} allows ({most} invocations)")


def consecutive_subgroups(device) -> bool:
    """Whether the device's subgroups are aligned runs of consecutive invocations (the layout the
    subgroup reductions rely on, which WebGPU does not promise), tried with one dispatch."""
    wgpu = import_wgpu()
    try:
        module = device.create_shader_module(
            code=resources.files("delegate_wgpu").joinpath("shaders", "subgroup_probe.wgsl").read_text())
        pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        flags = device.create_buffer(size=4 * 256, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                         entries=[{"binding": 0, "resource": {"buffer": flags}}])
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(1)
        compute.end()
        device.queue.submit([encoder.finish()])
        return bytes(device.queue.read_buffer(flags)) == (1).to_bytes(4, "little") * 256
    except Exception:  # a driver that cannot compile the probe cannot run the reductions either
        return False


_read_modes: list[Any] = ["READ_NOSYNC", "READ"]


def bounded_maps() -> bool:
    """Whether this wgpu-py's promises carry the event its polling thread sets once they resolve
    (wgpu-native's ``_thread_event``, which its own ``sync_wait`` waits on): a map can then be waited for with
    a limit.  The one name of wgpu-py's internals the plugin reads; without it runs keep the watchdog.  Asked
    only once wgpu-py is loaded: a plan that leaves WebGPU idle never loads it (nor its driver) to ask."""
    global _promises
    if _promises is None:
        if "wgpu" not in sys.modules:
            return False
        try:
            from wgpu import _async
            _promises = "_thread_event" in _async.GPUPromise.__init__.__code__.co_names
        except (ImportError, AttributeError):
            _promises = False
    return _promises


_promises: bool | None = None  # ``bounded_maps``' answer, once wgpu-py is loaded


POLL_SPIN_S = 0.02  # the longest a wait polls from the calling thread before it sleeps on the polling thread


def map_for_reading(buffer, limit: WaitLimit | None = None, poll: Callable[[], Any] | None = None) -> None:
    """Map a read-back buffer that the last submission wrote, waiting at most ``limit.seconds`` for it (set only
    where ``bounded_maps()``; TimeoutError after, the buffer then left mid-map, and the partition with it).

    ``poll`` (a non-blocking device poll; given on hardware adapters): the wait first polls from this thread
    for up to ``POLL_SPIN_S``, resolving the map here, instead of sleeping until wgpu-py's polling thread wakes,
    sees the map done and wakes this one (two thread hand-offs: on an H100 host MobileNetV2 ran 0.80 ms host to
    host polling here against 1.06 through the polling thread).  A CPU adapter gets no ``poll``: its work runs
    on the host's cores, which a polling caller would take.

    Before every read mapping wgpu-py submits an empty command buffer (a workaround for buffers no
    submission has touched); ours were just written by one, so the mode that skips that extra submission is
    used where this wgpu-py has it."""
    promises = bounded_maps()  # a wgpu-py without map promises maps here, waited for without a limit
    while True:
        try:
            promise = buffer.map_async(_read_modes[0]) if promises else buffer.map_sync(_read_modes[0])
            break
        except ValueError:
            if len(_read_modes) == 1:
                raise
            _read_modes.pop(0)
    if promise is None:  # mapped already
        return
    done = promise._thread_event
    seconds = limit.seconds if limit is not None else None
    if poll is not None:
        started = time.perf_counter()
        spin = POLL_SPIN_S if seconds is None else min(POLL_SPIN_S, seconds)
        while not done.is_set() and time.perf_counter() - started < spin:
            poll()
        if seconds is not None:
            seconds = max(seconds - (time.perf_counter() - started), 0.0)
    if seconds is not None and not done.wait(seconds):
        raise limit.exceeded()
    promise.sync_wait()


def device_facts(context: DeviceContext) -> dict[str, Any]:
    """What identifies the adapter and driver: keys the cache and the cost profiles."""
    info = context.adapter.info
    return {
        "backend": "wgpu",
        "adapter": info.get("device", ""),
        "vendor": info.get("vendor", ""),
        "backend_type": info.get("backend_type", ""),
        "adapter_type": info.get("adapter_type", ""),
        "device_type": "cpu" if info.get("adapter_type") == "CPU" else "gpu",
        "driver": info.get("description", ""),
        "features": sorted(str(f) for f in context.adapter.features),
        "shader_f16": context.f16,
        "subgroups": context.subgroups,
        "limits": dict(sorted(context.limits.items())),
        "wgpu": import_wgpu().__version__,
        "plugin_version": __version__,
    }
