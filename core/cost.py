"""Cost model: estimated time of an op on a backend and of moving a tensor between devices.

Compute time is a roofline, ``launch + max(flops / throughput, bytes / bandwidth)``,
against a :class:`DeviceProfile`.  Profiles come from ``delegate calibrate``
(stored per device fingerprint in the user cache dir) and fall back to the
documented defaults below.  Measured per-op times (``delegate bench --profile``)
replace estimates for the ops they cover.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .ir import Op


@dataclass
class DeviceProfile:
    """Throughput and transfer figures of one backend on one device."""

    gflops: float  # sustained arithmetic throughput
    gbytes_per_s: float  # memory bandwidth seen by kernels
    launch_us: float  # fixed cost per op (dispatch, Python overhead)
    transfer_latency_us: float = 0.0  # fixed cost per host<->device copy
    transfer_gbytes_per_s: float = float("inf")  # host<->device bandwidth
    measured_op_ms: dict[str, float] = field(default_factory=dict)  # op signature -> measured ms
    source: str = "default"

    def compute_ms(self, flops: float, nbytes: float) -> float:
        roof = max(flops / (self.gflops * 1e9), nbytes / (self.gbytes_per_s * 1e9))
        return self.launch_us * 1e-3 + roof * 1e3

    def transfer_ms(self, nbytes: int) -> float:
        if self.transfer_gbytes_per_s == float("inf"):
            return 0.0
        return self.transfer_latency_us * 1e-3 + nbytes / (self.transfer_gbytes_per_s * 1e9) * 1e3


# Defaults when no calibration exists.  Deliberately conservative for accelerators: an
# uncalibrated GPU must win clearly before ops move there.
DEFAULT_PROFILES = {
    "cpu": DeviceProfile(gflops=20.0, gbytes_per_s=8.0, launch_us=15.0),  # numpy kernels
    "cpu-litert": DeviceProfile(gflops=80.0, gbytes_per_s=15.0, launch_us=2.0),  # LiteRT engine
    "gpu": DeviceProfile(gflops=500.0, gbytes_per_s=100.0, launch_us=10.0,
                         transfer_latency_us=50.0, transfer_gbytes_per_s=5.0),
    "cpu-device": DeviceProfile(gflops=15.0, gbytes_per_s=8.0, launch_us=20.0,
                                transfer_latency_us=10.0, transfer_gbytes_per_s=10.0),
}


def _conv_flops(op: Op) -> float:
    out = op.outputs[0]
    w = op.input(1)
    if w is None or len(w.shape) != 4:
        return float(out.size)
    if op.opcode == "DEPTHWISE_CONV_2D":
        return 2.0 * out.size * w.shape[1] * w.shape[2]
    # CONV_2D weights OHWI: per output element kh*kw*ci multiply-adds
    return 2.0 * out.size * int(np.prod(w.shape[1:]))


def op_flops(op: Op) -> float:
    """Approximate floating-point operations of one op."""
    code = op.opcode
    if code in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        return _conv_flops(op)
    if code in ("TRANSPOSE_CONV", "Convolution2DTransposeBias"):
        w = op.input(1)
        x = op.input(2) if code == "TRANSPOSE_CONV" else op.input(0)
        if w is None or x is None or len(w.shape) != 4:
            return float(op.outputs[0].size) if op.outputs else 0.0
        return 2.0 * x.size * int(np.prod(w.shape[:3]))
    if code == "FULLY_CONNECTED":
        w = op.input(1)
        return 2.0 * op.outputs[0].size * (w.shape[-1] if w is not None and w.shape else 1)
    if code == "BATCH_MATMUL":
        a = op.input(0)
        if a is None or len(a.shape) < 2:
            return float(op.outputs[0].size)
        k = a.shape[-2] if op.options.get("adj_x") else a.shape[-1]
        return 2.0 * op.outputs[0].size * k
    if code in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        return float(op.outputs[0].size * op.options.get("filter_height", 1) * op.options.get("filter_width", 1))
    if code in ("UNIDIRECTIONAL_SEQUENCE_LSTM", "LSTM"):
        x, w = op.input(0), op.input(1)
        n_cell = w.shape[0] if w is not None and w.shape else 1
        return 8.0 * (x.size if x is not None else 0) * n_cell + 8.0 * op.outputs[0].size * n_cell
    out = sum(t.size for t in op.outputs)
    ins = sum(t.size for t in op.inputs if t is not None)
    return float(max(out, ins))


def op_bytes(op: Op) -> float:
    """Bytes an op reads and writes (weights included)."""
    return float(sum(t.nbytes for t in op.inputs if t is not None) + sum(t.nbytes for t in op.outputs))


def op_signature(op: Op) -> str:
    """Key of a measured per-op time: op code and shapes (not names), so it transfers between models."""
    shapes = ";".join(",".join(map(str, t.shape)) for t in op.inputs if t is not None)
    opts = json.dumps(op.options, sort_keys=True, default=str)
    return hashlib.sha1(f"{op.opcode}|{shapes}|{opts}".encode()).hexdigest()[:16]


def profile_dir() -> Path:
    from platformdirs import user_cache_dir
    return Path(os.environ.get("DELEGATE_PROFILE_DIR") or Path(user_cache_dir("delegate")) / "profiles")


def fingerprint(device_info: dict[str, Any]) -> str:
    """Stable key of a device (backend, device, driver, plugin version)."""
    text = json.dumps(device_info, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def load_profile(device_info: dict[str, Any], kind: str) -> DeviceProfile:
    """The stored calibration of this device, or the default for its kind."""
    path = profile_dir() / f"{fingerprint(device_info)}.json"
    try:
        data = json.loads(path.read_text())
        profile = DeviceProfile(**{k: v for k, v in data.items() if k in DeviceProfile.__dataclass_fields__})
        profile.source = str(path)
        return profile
    except (OSError, ValueError, TypeError):
        base = DEFAULT_PROFILES[kind]
        return DeviceProfile(**{**asdict(base), "measured_op_ms": {}})


def save_profile(device_info: dict[str, Any], profile: DeviceProfile) -> Path:
    """Persist a profile atomically; returns its path."""
    directory = profile_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{fingerprint(device_info)}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    data = asdict(profile)
    data["device_info"] = device_info
    data.pop("source", None)
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)
    return path
