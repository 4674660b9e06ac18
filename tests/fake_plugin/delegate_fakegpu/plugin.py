"""An 'accelerator' that holds tensors in its own wrapper type and runs a few elementwise ops.

It imports only delegate.plugin_api, exactly as a real third-party plugin would.
"""

from __future__ import annotations

import time

import numpy as np

from delegate.plugin_api import Backend, BackendInfo, CompiledPartition, Support, hookimpl

SUPPORTED = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "MAXIMUM": np.maximum, "MINIMUM": np.minimum}
UNARY = {"RELU": lambda x: np.maximum(x, 0), "LOGISTIC": lambda x: 1 / (1 + np.exp(-x)), "TANH": np.tanh}


class DeviceArray:
    """A value 'on the device': the runtime must move it through to_host/to_device."""

    def __init__(self, array):
        self.array = np.array(array)


class DeviceLost(RuntimeError):
    """What a device that disappears mid-run looks like to the runtime."""


class FakeCompiled(CompiledPartition):
    """``error`` is added to every output (to exercise the accuracy guard); after ``lose_after``
    runs the device is gone (to exercise fallback during execution)."""

    def __init__(self, partition, error=0.0, lose_after=None, delay_ms=0.0):
        self.partition = partition
        self.delay_ms = delay_ms
        self.error = error
        self.lose_after = lose_after
        self.runs = 0

    def run(self, inputs):
        if self.lose_after is not None and self.runs >= self.lose_after:
            raise DeviceLost("fake device disappeared")
        if self.delay_ms:  # a device much slower than its estimates claim
            time.sleep(self.delay_ms / 1e3)
        values = {i: v.array for i, v in inputs.items()}
        for op in self.partition.ops:
            args = [values[t.index] if t.index in values else np.asarray(t.data) for t in op.inputs]
            if op.opcode in SUPPORTED:
                out = SUPPORTED[op.opcode](args[0], args[1])
            else:
                out = UNARY[op.opcode](args[0])
            if op.options.get("fused_activation_function") == "RELU":
                out = np.maximum(out, 0)
            values[op.outputs[0].index] = out.astype(np.float32)
        self.runs += 1
        return {t.index: DeviceArray(values[t.index] + np.float32(self.error)) for t in self.partition.outputs}


class FakeGpu(Backend):
    name = "fakegpu"
    layout = "PHWC4"

    def __init__(self, options):
        self.options = dict(options)
        self.fail_compile = bool(self.options.get("fail_compile"))
        if self.options.get("start_ms"):  # a GPU driver's first start on a fresh machine
            time.sleep(float(self.options["start_ms"]) / 1e3)
        if self.options.get("fail_start"):
            raise RuntimeError("simulated driver failure")

    def supports(self, op, options):
        if self.options.get("fail_supports"):
            raise RuntimeError("simulated support-query crash")
        if op.opcode not in SUPPORTED and op.opcode not in UNARY:
            return Support.no(f"fakegpu runs only {sorted(SUPPORTED) + sorted(UNARY)}")
        if op.version != 1:
            return Support.no(f"version {op.version} is not supported (only 1)")
        if any(t is not None and t.dtype.name != "float32" for t in op.inputs):
            return Support.no("float32 only")
        act = op.options.get("fused_activation_function", "NONE")
        if act not in ("NONE", "RELU"):
            return Support.no(f"fused activation {act} is not supported")
        return Support.yes()

    def compile(self, partition, options):
        if self.options.get("compile_ms"):  # a cold kernel compile
            time.sleep(float(self.options["compile_ms"]) / 1e3)
        if self.fail_compile:
            raise RuntimeError("simulated compiler crash")
        error = float(self.options.get("error", 0.0))
        if options.precision == "fp16":
            error += float(self.options.get("fp16_error", 0.0))
        return FakeCompiled(partition, error, self.options.get("lose_after"), float(self.options.get("delay_ms", 0.0)))

    def estimate_ms(self, op, options):
        return 0.001

    def half_precision(self):
        if self.options.get("half_faster"):
            return True, "fake half arithmetic"
        return super().half_precision()

    def transfer_ms(self, nbytes):
        return 0.05 + nbytes / 1e9

    def to_device(self, array):
        return DeviceArray(array)

    def to_host(self, value):
        return value.array

    def device_info(self):
        return {"backend": "fakegpu", "device": "fake", "device_type": "gpu"}


@hookimpl
def delegate_backends():
    return [BackendInfo("fakegpu", factory=FakeGpu, description="test-only fake accelerator")]
