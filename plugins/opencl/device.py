"""Choosing the OpenCL device a backend runs on, and the facts about it that key caches and profiles.

pyopencl is imported here, inside functions, so that importing the plugin
never fails: a missing package or driver makes the backend unavailable, with
the reason, instead of breaking plugin discovery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from delegate.plugin_api import PluginError
from delegate.gpu.options import check_keys, choice
from delegate.gpu.remembered import Environment, Remembered, importable

from . import __version__

DEVICE_TYPES = ("gpu", "cpu", "accelerator", "any")
# The backend's options (JSON Schema of each; the config loader checks them against these)
OPTIONS = {"platform": {"type": "string", "minLength": 1}, "device": {"type": "string", "minLength": 1},
           "device_type": {"enum": list(DEVICE_TYPES)}, "native_enqueue": {"type": "boolean"},
           "build_threads": {"type": "integer", "minimum": 1, "maximum": 256}}
OPTION_KEYS = tuple(OPTIONS)
_PREFERENCE = ("gpu", "accelerator", "cpu")  # for device_type "any": the fastest kind first


@dataclass(frozen=True)
class DeviceRequest:
    """Backend options naming a device: substrings of the platform and device names, and a kind."""

    platform: str = ""
    device: str = ""
    device_type: str = "any"

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "DeviceRequest":
        check_keys("opencl", options, OPTION_KEYS)
        kind = choice("opencl", options, "device_type", "any", DEVICE_TYPES)
        return cls(str(options.get("platform", "") or ""), str(options.get("device", "") or ""), kind)

    def describe(self) -> str:
        parts = [f"{k}~{v!r}" for k, v in (("platform", self.platform), ("device", self.device)) if v]
        return ", ".join(parts + [f"device_type={self.device_type}"])


def import_pyopencl():
    """pyopencl, or PluginError saying how to get it."""
    try:
        import pyopencl
    except ImportError as exc:
        raise PluginError(f"pyopencl is not installed ({exc}); install delegate[opencl]") from None
    return pyopencl


def device_kind(cl, device) -> str:
    if device.type & cl.device_type.GPU:
        return "gpu"
    if device.type & cl.device_type.ACCELERATOR:
        return "accelerator"
    return "cpu"


def list_devices(cl) -> list[tuple[Any, Any]]:
    """(platform, device) pairs of every OpenCL device; PluginError when there is no platform."""
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        raise PluginError(f"no OpenCL platform found ({exc}); install a driver or pocl-binary-distribution") \
            from None
    found = []
    for platform in platforms:
        try:
            found.extend((platform, d) for d in platform.get_devices())
        except cl.Error:
            continue  # a platform without devices
    if not found:
        raise PluginError("OpenCL platforms exist but none has a device")
    return found


def select_device(cl, request: DeviceRequest) -> tuple[Any, Any]:
    """The (platform, device) matching ``request``; PluginError listing the devices found otherwise."""
    found = list_devices(cl)
    matches = [(p, d) for p, d in found
               if request.platform.lower() in p.name.lower() and request.device.lower() in d.name.lower()
               and request.device_type in ("any", device_kind(cl, d))]
    if not matches:
        listing = "; ".join(f"{p.name.strip()} / {d.name.strip()} ({device_kind(cl, d)})" for p, d in found)
        raise PluginError(f"opencl backend: no device matches {request.describe()}; devices found: {listing}")
    failures = []
    for platform, device in sorted(matches, key=lambda pd: _PREFERENCE.index(device_kind(cl, pd[1]))):
        error = compiler_error(cl, device)
        if error is None:
            return platform, device
        failures.append(f"{device.name.strip()} on {platform.name.strip()}: {error}")
    raise PluginError("opencl backend: no matching device can compile OpenCL C (" + "; ".join(failures) + ")")


_COMPILER_ERRORS: dict[int, str | None] = {}


def compiler_error(cl, device) -> str | None:
    """None when ``device``'s OpenCL C compiler builds a trivial kernel, else the build log's first error
    line.  A driver can list a device it cannot compile for (a CPU driver whose LLVM does not know this
    host's CPU): such a device is passed over, not chosen and then failed on every partition."""
    key = device.int_ptr
    if key not in _COMPILER_ERRORS:
        try:
            context = cl.Context([device])
            cl.Program(context, "__kernel void probe(__global float* x) { x[get_global_id(0)] = 1.0f; }").build()
            _COMPILER_ERRORS[key] = None
        except cl.Error as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if "error" in ln.lower() and ln.strip()]
            _COMPILER_ERRORS[key] = next((ln for ln in lines if not ln.startswith("clBuildProgram")),
                                         lines[0] if lines else "build failed")
    return _COMPILER_ERRORS[key]


def device_names() -> list[str]:
    """Every OpenCL device here, as ``device (kind) on platform``, for ``delegate backends``."""
    cl = import_pyopencl()
    return [f"{d.name.strip()} ({device_kind(cl, d)}) on {p.name.strip()}" for p, d in list_devices(cl)]


def probe() -> tuple[bool, str]:
    """Whether any OpenCL device is usable here, and if not why; never raises.  Facts remembered from an
    earlier process answer without starting a driver."""
    try:
        facts = remembered(DeviceRequest()).facts()
        if facts is not None and importable("pyopencl"):
            return True, f"{facts['device']} on {facts['platform']}"
        cl = import_pyopencl()
        platform, device = select_device(cl, DeviceRequest())
    except PluginError as exc:
        return False, str(exc)
    except Exception as exc:  # a broken driver must not break discovery
        return False, f"OpenCL probe failed: {type(exc).__name__}: {exc}"
    return True, f"{device.name.strip()} on {platform.name.strip()}"


# What selects the OpenCL driver: pyopencl, PoCL's wheel, the ICD loader's vendor files, and the variables
# that choose among them (PoCL's change its devices and compute units).
ENVIRONMENT = Environment(
    packages=("pyopencl", "pocl-binary-distribution"),
    variables=("OCL_ICD_VENDORS", "OCL_ICD_FILENAMES", "OPENCL_VENDOR_PATH", "LD_LIBRARY_PATH", "POCL_*",
               "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"),
    manifests=("/etc/OpenCL/vendors/*.icd",))


def remembered(request: DeviceRequest) -> Remembered:
    """The stored facts of the device ``request`` selects."""
    return Remembered("opencl", {"platform": request.platform, "device": request.device,
                                 "device_type": request.device_type, "plugin": __version__}, ENVIRONMENT)


def device_facts(cl, platform, device) -> dict[str, Any]:
    """What identifies a device and driver: keys the kernel cache and the cost profiles."""
    extensions = sorted(device.extensions.split())
    return {
        "backend": "opencl",
        "platform": platform.name.strip(),
        "platform_version": platform.version.strip(),
        "device": device.name.strip(),
        "device_type": device_kind(cl, device),
        "driver_version": device.driver_version.strip(),
        "opencl_c_version": device.opencl_c_version.strip(),
        "compute_units": int(device.max_compute_units),
        "max_work_group_size": int(device.max_work_group_size),
        "global_mem_bytes": int(device.global_mem_size),
        "fp16": "cl_khr_fp16" in extensions,
        "extensions": extensions,
        "plugin_version": __version__,
    }
