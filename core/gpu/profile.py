"""The cost figures of a GPU backend's device before ``delegate calibrate`` has measured it."""

from __future__ import annotations

from typing import Any, Mapping

from ..cost import ACCELERATOR_DEFAULT, DeviceProfile

# A device that is really the host's cores behind a GPU API (PoCL, lavapipe) is slower than the host
# backend's own kernels.
HOST_CORES = DeviceProfile(gflops=15.0, gbytes_per_s=8.0, launch_us=20.0, partition_us=100.0,
                           transfer_latency_us=10.0, transfer_gbytes_per_s=10.0, asynchronous=True,
                           source="default (cpu-device)")


def default_profile(device_info: Mapping[str, Any]) -> DeviceProfile:
    """A real GPU gets the conservative accelerator figures; the host's cores behind a GPU API, their own."""
    return HOST_CORES if device_info.get("device_type") == "cpu" else ACCELERATOR_DEFAULT
