"""Registers the ``opencl`` backend through the ``delegate.backends`` entry point."""

from __future__ import annotations

from typing import Any, Mapping

from delegate.plugin_api import BackendInfo, hookimpl

from .device import OPTIONS, device_names, probe


def _factory(options: Mapping[str, Any]):
    from .backend import OpenCLBackend  # imports pyopencl: only when a backend is wanted
    return OpenCLBackend(options)


@hookimpl
def delegate_backends():
    return [BackendInfo("opencl", factory=_factory, available=probe, options=OPTIONS, list_devices=device_names,
                        description="OpenCL kernels on PHWC4 buffers (GPU, or CPU through PoCL); "
                                    f"options: {', '.join(OPTIONS)}")]
