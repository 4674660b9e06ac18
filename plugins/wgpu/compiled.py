"""A program made real on a device, and the values that cross partition boundaries.

Everything is created once here: buffers (constants uploaded), one uniform
buffer with every dispatch's parameters, pipelines (shared per device by
source) and bind groups.  A run records one command encoder with every
dispatch of the partition and submits it once; host data moves only for
inputs arriving from the host and for outputs read back by ``to_host``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from delegate.backend import CompiledPartition
from delegate.errors import CompileError
from delegate.gpu import from_phwc4, to_phwc4
from delegate.gpu.constants import from_float_view
from delegate.gpu.layout import phwc4_vectors
from delegate.ir import DType, Quantization

from .device import DeviceContext, import_wgpu
from .program import STORAGE_DTYPES, Program, TensorSpec


class HostTensor:
    """A host array already converted to PHWC4 float32, waiting for the partition that uploads it."""

    __slots__ = ("array", "data")

    def __init__(self, array: np.ndarray):
        self.array = array
        self.data = to_phwc4(array, np.float32)


class DeviceTensor:
    """A partition output resident on the device: its buffer, shape and how the host reads it."""

    __slots__ = ("context", "buffer", "storage", "shape", "dtype", "quant", "nbytes", "_readback")

    def __init__(self, context: DeviceContext, buffer, storage: str, spec: TensorSpec):
        self.context, self.buffer, self.storage = context, buffer, storage
        self.shape = tuple(spec.shape)
        self.dtype = DType[spec.dtype]
        self.quant = None if spec.quant is None else Quantization(np.array([spec.quant[0]], np.float32),
                                                                  np.array([spec.quant[1]], np.int64))
        self.nbytes = storage_nbytes(self.shape, storage)
        self._readback = None

    def to_host(self) -> np.ndarray:
        """Copy back, leave PHWC4 and the float view: the array the host expects for this tensor."""
        wgpu = import_wgpu()
        device = self.context.device
        if self._readback is None:
            self._readback = device.create_buffer(size=self.nbytes, usage=wgpu.BufferUsage.MAP_READ |
                                                  wgpu.BufferUsage.COPY_DST, label="readback")
        encoder = device.create_command_encoder()
        encoder.copy_buffer_to_buffer(self.buffer, 0, self._readback, 0, self.nbytes)
        device.queue.submit([encoder.finish()])
        self._readback.map_sync(wgpu.MapMode.READ)
        try:
            values = np.frombuffer(self._readback.read_mapped(), STORAGE_DTYPES[self.storage]).astype(np.float32)
        finally:
            self._readback.unmap()
        return from_float_view(from_phwc4(values, self.shape), self.dtype, self.quant)


def storage_nbytes(shape, storage: str) -> int:
    return phwc4_vectors(shape) * 4 * np.dtype(STORAGE_DTYPES[storage]).itemsize


class _InputSlot:
    """Where one partition input goes, with the scratch arrays its float view needs (made once)."""

    def __init__(self, spec: TensorSpec, buffer, storage: str):
        self.spec, self.buffer = spec, buffer
        self.shape = tuple(spec.shape)
        self.nbytes = storage_nbytes(self.shape, storage)
        self.quant = spec.quant
        vectors = self.nbytes // (4 * np.dtype(STORAGE_DTYPES[storage]).itemsize)
        self.work = np.empty((vectors, 4), np.float32) if self.quant else None
        self.mask = to_phwc4(np.ones(self.shape, np.float32)).reshape(-1, 4) if self.quant else None
        self.half = np.empty((vectors, 4), np.float16) if storage == "f16" else None

    def stage(self, value: Any) -> np.ndarray:
        """Host value -> the bytes the input buffer holds (float view, storage precision)."""
        if isinstance(value, DeviceTensor):
            value = value.to_host()  # from another device or precision: through the host
        data = (value if isinstance(value, HostTensor) else HostTensor(np.asarray(value))).data.reshape(-1, 4)
        if self.quant:
            scale, zero = self.quant
            np.subtract(data, zero, out=self.work)
            np.multiply(self.work, scale, out=self.work)
            np.multiply(self.work, self.mask, out=self.work)  # padding lanes stay zero
            data = self.work
        if self.half is not None:
            np.copyto(self.half, data, casting="unsafe")
            data = self.half
        return data


class WgpuCompiled(CompiledPartition):
    """A partition's pipelines, bind groups and buffers; ``run`` records and submits one encoder."""

    def __init__(self, context: DeviceContext, program: Program, facts: dict[str, Any]):
        wgpu = import_wgpu()
        self.context, self.program = context, program
        self.facts = facts
        device = context.device
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        blob = memoryview(program.blob)
        self.buffers = []
        for i, spec in enumerate(program.buffers):
            buffer = device.create_buffer(size=spec.nbytes, usage=usage, label=f"{spec.role}{i}")
            if spec.data is not None:
                offset, size = spec.data
                device.queue.write_buffer(buffer, 0, blob[offset:offset + size])
            self.buffers.append(buffer)
        params = blob[program.params_start:]
        self.uniforms = device.create_buffer_with_data(data=params if len(params) else bytes(16),
                                                       usage=wgpu.BufferUsage.UNIFORM)
        writable = {d.shader: tuple(w for _, w in d.bindings) for d in program.dispatches}
        pipelines = [self._pipeline(source, writable[i]) for i, source in enumerate(program.shaders)]
        most = context.limits["max-compute-workgroups-per-dimension"]
        self.launches = []
        for d in program.dispatches:
            pipeline, layout = pipelines[d.shader]
            entries = [{"binding": i, "resource": {"buffer": self.buffers[b], "offset": 0,
                                                   "size": self.buffers[b].size}}
                       for i, (b, _) in enumerate(d.bindings)]
            entries.append({"binding": len(d.bindings),
                            "resource": {"buffer": self.uniforms, "offset": d.params[0], "size": d.params[1]}})
            group = device.create_bind_group(layout=layout, entries=entries, label=d.label)
            workgroups = -(-d.invocations // program.workgroup)
            x = min(workgroups, most)
            self.launches.append((pipeline, group, x, -(-workgroups // x)))
        self.inputs = [_InputSlot(s, self.buffers[s.buffer], program.storage) for s in program.inputs]
        self.results = {s.index: DeviceTensor(context, self.buffers[s.buffer], program.storage, s)
                        for s in program.outputs}
        self.profiler: _Profiler | None = None

    def _pipeline(self, source: str, writable: tuple[bool, ...]) -> tuple[Any, Any]:
        """The pipeline of ``source`` on this device (built once per process) and its bind group layout."""
        cached = self.context.pipelines.get(source)
        if cached is not None:
            return cached
        wgpu = import_wgpu()
        device = self.context.device
        layout = self.context.layouts.get(writable)
        if layout is None:
            kinds = [wgpu.BufferBindingType.storage if w else wgpu.BufferBindingType.read_only_storage
                     for w in writable] + [wgpu.BufferBindingType.uniform]
            group_layout = device.create_bind_group_layout(entries=[
                {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}}
                for i, kind in enumerate(kinds)])
            layout = self.context.layouts[writable] = (
                group_layout, device.create_pipeline_layout(bind_group_layouts=[group_layout]))
        try:
            module = device.create_shader_module(code=source)
            pipeline = device.create_compute_pipeline(layout=layout[1], compute={"module": module,
                                                                                  "entry_point": "main"})
        except Exception as exc:
            raise CompileError(f"wgpu could not build a shader: {exc}", log=source) from None
        self.context.pipelines[source] = (pipeline, layout[0])
        return pipeline, layout[0]

    def run(self, inputs: Mapping[int, Any]) -> dict[int, Any]:
        device = self.context.device
        encoder = device.create_command_encoder()
        for slot in self.inputs:
            value = inputs[slot.spec.index]
            if (isinstance(value, DeviceTensor) and value.context is self.context
                    and value.storage == self.program.storage):
                if value.buffer is not slot.buffer:
                    encoder.copy_buffer_to_buffer(value.buffer, 0, slot.buffer, 0, slot.nbytes)
            else:
                device.queue.write_buffer(slot.buffer, 0, slot.stage(value))
        compute = encoder.begin_compute_pass()
        stamp = self.profiler.stamp if self.profiler else None
        for i, (pipeline, group, x, y) in enumerate(self.launches):
            if stamp:
                stamp(compute, i)
            compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(x, y)
        if stamp:
            stamp(compute, len(self.launches))
        compute.end()
        if self.profiler:
            self.profiler.resolve(encoder)
        device.queue.submit([encoder.finish()])
        if self.profiler:
            self.profiler.collect()
        return self.results

    def set_profiling(self, enabled: bool) -> None:
        """Time every dispatch of the following runs with GPU timestamps, where the adapter has them."""
        self.profiler = _Profiler(self.context, self.program) if enabled and self.context.timestamps else None

    def profile(self) -> dict[int, float]:
        """Median milliseconds per op over the profiled runs; a fused kernel's time goes to its first op."""
        return self.profiler.per_op() if self.profiler else {}

    def describe(self) -> dict[str, Any]:
        return dict(self.facts)


class _Profiler:
    """A timestamp before every dispatch and after the last, read back after each run."""

    def __init__(self, context: DeviceContext, program: Program):
        wgpu = import_wgpu()
        from wgpu.backends.wgpu_native.extras import write_timestamp

        device = context.device
        self.context, self.program = context, program
        self.count = len(program.dispatches) + 1
        self.queries = device.create_query_set(type=wgpu.QueryType.timestamp, count=self.count)
        self.resolved = device.create_buffer(size=8 * self.count,
                                             usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self.readback = device.create_buffer(size=8 * self.count,
                                             usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        self.stamp = lambda compute, index: write_timestamp(compute, self.queries, index)
        self.samples: dict[int, list[float]] = {}

    def resolve(self, encoder) -> None:
        encoder.resolve_query_set(self.queries, 0, self.count, self.resolved, 0)
        encoder.copy_buffer_to_buffer(self.resolved, 0, self.readback, 0, 8 * self.count)

    def collect(self) -> None:
        self.readback.map_sync(import_wgpu().MapMode.READ)
        try:
            ticks = np.frombuffer(self.readback.read_mapped(), np.uint64).astype(np.float64)
        finally:
            self.readback.unmap()
        run: dict[int, float] = {}
        for d, ns in zip(self.program.dispatches, np.diff(ticks)):
            if d.ops:
                run[d.ops[0]] = run.get(d.ops[0], 0.0) + max(ns, 0.0) * 1e-6  # timestamps are nanoseconds
        for op, ms in run.items():
            self.samples.setdefault(op, []).append(ms)

    def per_op(self) -> dict[int, float]:
        return {op: float(np.median(ms)) for op, ms in self.samples.items()}
