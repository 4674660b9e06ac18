"""Registers the ``wgpu`` backend through the ``delegate.backends`` entry point."""

from __future__ import annotations

from typing import Any, Mapping

from delegate.plugin_api import BackendInfo, hookimpl

from .device import OPTIONS, list_devices, probe


def factory(options: Mapping[str, Any]):
    """Build the backend (imports wgpu: only when a backend is wanted)."""
    from .backend import WgpuBackend
    return WgpuBackend(options)



@hookimpl
def delegate_backends():
    return [BackendInfo("wgpu", factory=factory, available=probe, list_devices=list_devices, options=OPTIONS,
                        description=f"WebGPU (wgpu-py) WGSL kernels on PHWC4 buffers; options: {', '.join(OPTIONS)}")]
