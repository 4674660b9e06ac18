"""A program made real on a device, and the values that cross partition boundaries.

Everything is created once here: buffers (constants uploaded), one uniform
buffer with every dispatch's parameters, pipelines (shared per device by
source), bind groups and read-back buffers.  A run records one command
encoder with one compute pass holding every dispatch of the partition and
submits it once.  WebGPU lets a command buffer be submitted only once
(wgpu-native refuses a second submission), so each run records anew, with
as little Python as that takes: encoder, pass, copies and the submission
are direct wgpu-native calls on the handles kept at compile time
(:class:`NativeEncoding`; wgpu-py's methods cost several times as much
Python per call: argument checks, descriptor structs, a wrapper object per
encoder, pass and command buffer), and the dispatches one call into
record.c (:class:`Dispatches`; built like the CPU plugin's native loops,
into the user cache; without a C compiler a Python loop makes the same
calls).  Host data moves only for inputs arriving from the host (uploaded
as the caller's array, which the reading convolution reads as it is or the
device converts) and for outputs read back by ``to_host`` (stored in host
order by their kernel or converted on the device, copied in the same
submission once the host has asked for them).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from delegate.gpu import to_phwc4
from delegate.gpu.constants import from_float_view
from delegate.gpu.layout import phwc4_vectors
from delegate.gpu.waits import WaitLimit
from delegate.plugin_api import CompileError, CompiledPartition, DType, Quantization, load_library

from .device import DeviceContext, import_wgpu, map_for_reading
from delegate.gpu.plan import LaunchSpec, TensorSpec

from .program import STORAGE_DTYPES, Program


class HostTensor:
    """A host array waiting for the partition that uploads it (which also converts its layout)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array


Launch = tuple  # (pipeline, bind group, workgroups x, y, z)


def handles(launch: Launch) -> tuple:
    """A launch as the wgpu-native handles :class:`NativeEncoding` records (the wgpu-py objects must outlive them)."""
    pipeline, group, x, y, z = launch
    return pipeline._internal, group._internal, x, y, z


class NativeEncoding:
    """wgpu-native's entry points for recording and submitting one command encoder, called directly.

    Creating, finishing and submitting go through wgpu-py's error-capturing wrappers of the library, so a
    validation error still raises; the calls per dispatch go to the library itself."""

    def __init__(self, device, poll_in_caller: bool):
        from wgpu.backends.wgpu_native._api import ffi, lib, libf

        self.ffi, self.lib, self.libf = ffi, lib, libf
        self.device, self.queue = device._internal, device.queue._internal
        self.copy = lib.wgpuCommandEncoderCopyBufferToBuffer
        self.poll = functools.partial(lib.wgpuDevicePoll, self.device, False, ffi.NULL) if poll_in_caller else None
        self.stamp = lib.wgpuComputePassEncoderWriteTimestamp
        self.resolve = lib.wgpuCommandEncoderResolveQuerySet
        self.calls = (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                      lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL)
        self.descriptors = (ffi.new("WGPUCommandEncoderDescriptor *"), ffi.new("WGPUComputePassDescriptor *"),
                            ffi.new("WGPUCommandBufferDescriptor *"))

    def address(self, handle) -> int:
        """A handle (or entry point) as the integer record.c takes."""
        return int(self.ffi.cast("uintptr_t", handle))

    def encoder(self):
        return self.libf.wgpuDeviceCreateCommandEncoder(self.device, self.descriptors[0])

    def begin_pass(self, encoder):
        return self.libf.wgpuCommandEncoderBeginComputePass(encoder, self.descriptors[1])

    def end_pass(self, compute) -> None:
        try:
            self.libf.wgpuComputePassEncoderEnd(compute)
        finally:
            self.lib.wgpuComputePassEncoderRelease(compute)

    def record(self, compute, launches) -> None:
        """Dispatch ``launches`` (handles) in order, setting the pipeline only where it changes."""
        set_pipeline, set_bind_group, dispatch, null = self.calls
        current = None
        for pipeline, group, x, y, z in launches:
            if pipeline != current:
                set_pipeline(compute, pipeline)
                current = pipeline
            set_bind_group(compute, 0, group, 0, null)
            dispatch(compute, x, y, z)

    def submit(self, encoder) -> None:
        """Finish ``encoder`` and submit the command buffer (released after; the caller releases the encoder)."""
        finished = self.libf.wgpuCommandEncoderFinish(encoder, self.descriptors[2])
        buffers = self.ffi.new("WGPUCommandBuffer[1]", [finished])
        try:
            self.libf.wgpuQueueSubmit(self.queue, 1, buffers)
        finally:
            self.lib.wgpuCommandBufferRelease(buffers[0])

    def release(self, encoder) -> None:
        self.lib.wgpuCommandEncoderRelease(encoder)


SOURCE = Path(__file__).with_name("record.c")
_LOCK = threading.Lock()
_LOADED: list = []  # [the record_dispatches entry point | str (why there is none)] once tried


def record_loop():
    """record.c's entry point, built and loaded on the first call; else why it cannot be."""
    with _LOCK:
        if not _LOADED:
            built = load_library(SOURCE, (["-O2"],), "wgpu")
            if built.library is None:
                _LOADED.append(built.reason)
            else:
                call = built.library.record_dispatches
                call.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int64]
                call.restype = None
                _LOADED.append(call)
        return _LOADED[0]


class Dispatches:
    """A partition's dispatches (handles, in order) ready to record: as arrays for one record.c call,
    made once, or, without it, the handles for :meth:`NativeEncoding.record`'s loop (``reason`` says why)."""

    def __init__(self, native: NativeEncoding, launches: Sequence[tuple]):
        self.native, self.launches = native, list(launches)
        loop = record_loop()
        self.reason = loop if isinstance(loop, str) else ""
        self.loop = None if self.reason or not self.launches else loop
        if self.loop is None:
            return
        address = native.address
        count = self.count = len(self.launches)
        self.functions = [address(native.ffi.addressof(native.lib, name)) for name in (
            "wgpuComputePassEncoderSetPipeline", "wgpuComputePassEncoderSetBindGroup",
            "wgpuComputePassEncoderDispatchWorkgroups")]
        self.pipelines = (ctypes.c_void_p * count)(*(address(launch[0]) for launch in self.launches))
        self.groups = (ctypes.c_void_p * count)(*(address(launch[1]) for launch in self.launches))
        self.counts = (ctypes.c_uint32 * (3 * count))(*(n for launch in self.launches for n in launch[2:]))

    def record(self, compute) -> None:
        if self.loop is None:
            self.native.record(compute, self.launches)
        else:
            self.loop(*self.functions, self.native.address(compute), self.pipelines, self.groups, self.counts,
                      self.count)

    def describe(self) -> str:
        return f"a Python loop ({self.reason})" if self.reason else "record.c"


class DeviceTensor:
    """A partition output resident on the device: its buffer, shape and how the host reads it.

    The partition records the copy into its read-back buffer (and the conversion to NHWC float32) with
    its dispatches for the outputs the host reads: those the runtime names (``WgpuCompiled.read_hint``),
    and one the host asked for, whose first read records its own copy.  The first read of a run brings
    every output the run copied back to the host at once (:class:`ReadBack`), each into a host array
    made once, so a float32 value read back is valid until the partition runs again (as the CPU
    backend's arena outputs are).
    """

    __slots__ = ("context", "native", "buffer", "storage", "shape", "dtype", "quant", "nbytes", "source", "convert",
                 "readback", "offset", "host", "wanted", "fresh", "taken", "host_layout")

    def __init__(self, context: DeviceContext, native: NativeEncoding, buffers: list, storage: str, spec: TensorSpec,
                 convert: Launch | None):
        self.context, self.native, self.buffer, self.storage = context, native, buffers[spec.buffer], storage
        self.shape = tuple(spec.shape)
        self.dtype = DType[spec.dtype]
        self.quant = None if spec.quant is None else Quantization(np.array([spec.quant[0]], np.float32),
                                                                  np.array([spec.quant[1]], np.int64))
        self.nbytes = storage_nbytes(self.shape, storage)
        self.source = self.buffer if spec.staging is None else buffers[spec.staging]
        self.host_layout = spec.host_layout  # the buffer holds NHWC float32: another partition reads it via the host
        self.convert = convert  # the wgpu-py objects, kept alive for their handles
        self.readback: ReadBack | None = None  # the partition's (set by the partition), and the offset in it
        self.offset = 0
        self.host: np.ndarray | None = None  # the host value of the last run, once read back
        self.wanted = self.fresh = False  # copied back with every run; copied back by the last one
        self.taken = False  # whether ``host`` holds the last run's value

    def record_conversion(self, compute) -> None:
        if self.convert:
            self.native.record(compute, (handles(self.convert),))

    def to_host(self) -> np.ndarray:
        """The array the host expects for this tensor (NHWC, its dtype)."""
        if not self.fresh:
            native = self.native
            encoder = native.encoder()
            try:
                compute = native.begin_pass(encoder)
                self.record_conversion(compute)
                native.end_pass(compute)
                self.readback.record(encoder, self)
                native.submit(encoder)
            finally:
                native.release(encoder)
            self.wanted = self.fresh = True
        if not self.taken:
            self.readback.fetch()
        return self.host

    def take(self, mapped: memoryview) -> None:
        """The value from the mapped read-back buffer into the host array (one copy: the map ends after)."""
        values = np.frombuffer(mapped, np.float32, count=int(np.prod(self.shape)), offset=self.offset)
        values = values.reshape(self.shape)
        if self.dtype is not DType.float32:
            self.host = from_float_view(values, self.dtype, self.quant)
        else:
            if self.host is None:
                self.host = np.empty(self.shape, np.float32)
            np.copyto(self.host, values)
        self.taken = True


class ReadBack:
    """The one mappable buffer a partition's outputs are copied back into, each at an offset of its own: a
    run's outputs reach the host through one map and one unmap however many they are (each map is a round
    of wgpu-py's promise and the device's polling thread: with a buffer and a map each, pose_landmark_full's
    input and five outputs cost an H100 host 0.50 ms a run beyond its resident time, OpenCL's 0.21)."""

    ALIGNMENT = 256  # each output's offset (copies need 4 bytes, maps 8)

    def __init__(self, context: DeviceContext, native: NativeEncoding, tensors: Sequence[DeviceTensor],
                 wait_limit: WaitLimit | None):
        self.context, self.native, self.wait_limit = context, native, wait_limit
        self.size = 0
        for tensor in tensors:
            tensor.readback, tensor.offset = self, self.size
            self.size += -(-tensor.source.size // self.ALIGNMENT) * self.ALIGNMENT
        self.buffer = None  # made when first wanted: most outputs only ever feed other partitions
        self.pending: list[DeviceTensor] = []  # copied since the last fetch, not yet on the host

    def begin_run(self) -> None:
        """A run's copies replace the values of the last one, read or not."""
        self.pending.clear()

    def record(self, encoder, tensor: DeviceTensor) -> None:
        if self.buffer is None:
            usage = import_wgpu().BufferUsage
            self.buffer = self.context.device.create_buffer(size=max(self.size, 4),
                                                            usage=usage.MAP_READ | usage.COPY_DST, label="readback")
        self.native.copy(encoder, tensor.source._internal, 0, self.buffer._internal, tensor.offset, tensor.source.size)
        tensor.taken = False
        if tensor not in self.pending:
            self.pending.append(tensor)

    def fetch(self) -> None:
        """Map the buffer once the submissions that wrote it are done (waiting at most the backend's limit:
        TimeoutError after, the buffer left mid-map and the partition with it), copy every pending output to
        its host array, unmap."""
        map_for_reading(self.buffer, self.wait_limit, self.native.poll)
        try:
            mapped = self.buffer.read_mapped(copy=False)
            for tensor in self.pending:
                tensor.take(mapped)
        finally:
            self.pending.clear()
            self.buffer.unmap()


def storage_nbytes(shape, storage: str) -> int:
    return phwc4_vectors(shape) * 4 * np.dtype(STORAGE_DTYPES[storage]).itemsize


class _InputSlot:
    """Where one partition input goes: its buffer (in host order where its one kernel reads it so), or
    host-order staging the device converts from."""

    def __init__(self, spec: TensorSpec, buffers: list, storage: str, convert: Launch | None):
        self.index = spec.index
        self.buffer = buffers[spec.buffer]
        self.target = self.buffer if spec.staging is None else buffers[spec.staging]
        self.convert = convert
        self.shape = tuple(spec.shape)
        self.nbytes = storage_nbytes(self.shape, storage)
        self.host_layout = spec.host_layout  # the input's one kernel reads the caller's bytes (host_dtype)
        self.host_dtype = np.dtype(spec.host_dtype)
        self.quant = None if self.host_layout else spec.quant
        # integers its kernel reads as float32 in host order (int16): their float view, made on the host
        self.dequant = spec.quant if self.host_layout and self.host_dtype.kind == "f" else None
        if self.quant:  # the float view is made on the host, with scratch arrays made once
            vectors = phwc4_vectors(self.shape)
            self.work = np.empty((vectors, 4), np.float32)
            self.mask = to_phwc4(np.ones(self.shape, np.float32)).reshape(-1, 4)
            self.half = np.empty((vectors, 4), np.float16) if storage == "f16" else None

    def upload(self, queue, value: Any) -> None:
        """Write a host value (or one from another device or precision, through the host)."""
        if isinstance(value, DeviceTensor):
            value = value.to_host()
        array = value.array if isinstance(value, HostTensor) else value
        if not self.quant:
            data = np.ascontiguousarray(array, self.host_dtype).reshape(-1)
            if self.dequant is not None and np.asarray(array).dtype.kind in "iu":
                scale, zero = self.dequant
                data = (data - np.float32(zero)) * np.float32(scale)
            if data.nbytes % 4:  # a quantized input's integers, read by its kernel in words of 4
                data = np.concatenate([data, np.zeros(-data.nbytes % 4, data.dtype)])
            queue.write_buffer(self.target, 0, data)
            return
        scale, zero = self.quant
        np.subtract(to_phwc4(array, np.float32).reshape(-1, 4), zero, out=self.work)
        np.multiply(self.work, scale, out=self.work)
        np.multiply(self.work, self.mask, out=self.work)  # padding lanes stay zero
        data = self.work
        if self.half is not None:
            np.copyto(self.half, data, casting="unsafe")
            data = self.half
        queue.write_buffer(self.target, 0, data)


class WgpuCompiled(CompiledPartition):
    """A partition's pipelines, bind groups and buffers; ``run`` records and submits one encoder."""

    def __init__(self, context: DeviceContext, program: Program, facts: dict[str, Any],
                 wait_limit: WaitLimit | None = None):
        """``wait_limit``: the backend's, which bounds the waits for this partition's runs."""
        wgpu = import_wgpu()
        self.context, self.program = context, program
        self.facts = facts
        device = context.device
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        blob = memoryview(program.blob)
        self.buffers = []
        for i, spec in enumerate(program.buffers):
            buffer = device.create_buffer(size=-(-spec.nbytes // 4) * 4, usage=usage, label=f"{spec.role}{i}")
            if spec.data is not None:
                offset, size = spec.data
                device.queue.write_buffer(buffer, 0, blob[offset:offset + size])
            self.buffers.append(buffer)
        params = blob[program.params_start:]
        self.uniforms = device.create_buffer_with_data(data=params if len(params) else bytes(16),
                                                       usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_SRC)
        self.fence = None  # made by the first run_resident
        self.launches = [self.launch(d) for d in program.launches]
        self.native = NativeEncoding(device, context.poll_in_caller)
        self.prepare_encoding()
        self.inputs = [_InputSlot(s, self.buffers, program.storage, s.convert and self.launch(s.convert))
                       for s in program.inputs]
        self.wait_limit = wait_limit
        self.outputs = [DeviceTensor(context, self.native, self.buffers, program.storage, s,
                                     s.convert and self.launch(s.convert)) for s in program.outputs]
        self.readback = ReadBack(context, self.native, self.outputs, wait_limit)
        self.results = {t.index: tensor for t, tensor in zip(program.outputs, self.outputs)}
        self.profiler: _Profiler | None = None

    def launch(self, d: LaunchSpec) -> Launch:
        """Pipeline, bind group (made once, here) and workgroup counts of one launch."""
        pipeline, layout = self._pipeline(self.program.shaders[d.params["shader"]],
                                          tuple(kind == "write" for kind, _ in d.args))
        entries = [{"binding": i, "resource": {"buffer": self.buffers[b], "offset": 0, "size": self.buffers[b].size}}
                   for i, (_, b) in enumerate(d.args)]
        offset, size = d.params["uniform"]
        entries.append({"binding": len(d.args), "resource": {"buffer": self.uniforms, "offset": offset, "size": size}})
        group = self.context.device.create_bind_group(layout=layout, entries=entries, label=d.label)
        return (pipeline, group, *d.work)

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
        queue, native = self.context.device.queue, self.native
        copies, conversions = [], []
        for slot in self.inputs:
            value = inputs[slot.index]
            if (isinstance(value, DeviceTensor) and value.context is self.context
                    and value.storage == self.program.storage and not (value.host_layout or slot.host_layout)):
                if value.buffer is not slot.buffer:
                    copies.append((value.buffer._internal, slot.buffer._internal, slot.nbytes))
            else:
                slot.upload(queue, value)
                if slot.convert:
                    conversions.append(handles(slot.convert))
        encoder = native.encoder()
        try:
            for source, target, nbytes in copies:
                native.copy(encoder, source, 0, target, 0, nbytes)
            compute = native.begin_pass(encoder)
            try:
                native.record(compute, conversions)
                if self.profiler:
                    self._record_stamped(compute, self.profiler.stamp)
                else:
                    self.dispatches.record(compute)
                for tensor in self.outputs:
                    if tensor.wanted:
                        tensor.record_conversion(compute)
            finally:
                native.end_pass(compute)
            self.readback.begin_run()
            for tensor in self.outputs:
                tensor.fresh = tensor.wanted
                if tensor.wanted:
                    self.readback.record(encoder, tensor)
            if self.profiler:
                self.profiler.resolve(encoder)
            native.submit(encoder)
        finally:
            native.release(encoder)
        if self.profiler:
            self.profiler.collect()
        return self.results

    def read_hint(self, indices) -> None:
        """Record the read-back copies of the outputs in ``indices`` (None: all) with every run, and of no
        other (an output asked for anyway records its own copy first, as in ``DeviceTensor``)."""
        for index, tensor in self.results.items():
            tensor.wanted = indices is None or index in indices

    def run_resident(self) -> bool:
        """One submission of the partition's dispatches on the inputs already in its buffers, no uploads,
        conversions or read-backs, and the wait for it (by mapping a 4-byte fence the submission writes)."""
        native = self.native
        if self.fence is None:
            usage = import_wgpu().BufferUsage
            self.fence = self.context.device.create_buffer(size=4, usage=usage.MAP_READ | usage.COPY_DST, label="fence")
        encoder = native.encoder()
        try:
            compute = native.begin_pass(encoder)
            try:
                self.dispatches.record(compute)
            finally:
                native.end_pass(compute)
            native.copy(encoder, self.uniforms._internal, 0, self.fence._internal, 0, 4)
            native.submit(encoder)
        finally:
            native.release(encoder)
        map_for_reading(self.fence, self.wait_limit, self.native.poll)
        self.fence.unmap()
        return True

    def prepare_encoding(self) -> None:
        """The launches as wgpu-native handles for run's direct calls; again whenever ``launches`` change
        (tuning): a handle outliving its object would be used after wgpu-py released it."""
        self.handles = [handles(launch) for launch in self.launches]
        self.dispatches = Dispatches(self.native, self.handles)

    def _record_stamped(self, compute, stamp) -> None:
        """Every dispatch between timestamps."""
        for i, launch in enumerate(self.handles):
            stamp(compute, i)
            self.native.record(compute, (launch,))
        stamp(compute, len(self.handles))

    def op_timer(self) -> str:
        return "WebGPU timestamp queries" if self.context.timestamps else ""

    def set_profiling(self, enabled: bool) -> None:
        """Time every dispatch of the following runs with GPU timestamps, where the adapter has them."""
        timed = enabled and self.context.timestamps
        self.profiler = _Profiler(self.context, self.native, self.program, self.wait_limit) if timed else None

    def profile(self) -> dict[int, float]:
        """Median milliseconds per op over the profiled runs; a fused kernel's time goes to its first op."""
        return self.profiler.per_op() if self.profiler else {}

    def describe(self) -> dict[str, Any]:
        recording = ("a Python loop with timestamps between the dispatches" if self.profiler else
                     f"the dispatches by {self.dispatches.describe()}")
        encoding = (f"direct wgpu-native calls ({len(self.launches)} dispatches, one pass, one submission); "
                    f"{recording}")
        return {**self.facts, "encoding": encoding}


class Timestamps:
    """``count`` GPU timestamps written inside a compute pass (a wgpu-native handle), resolved into a buffer
    and read back."""

    def __init__(self, context: DeviceContext, native: NativeEncoding, count: int, wait_limit: WaitLimit | None = None):
        wgpu = import_wgpu()
        device = context.device
        self.native, self.count, self.wait_limit = native, count, wait_limit
        self.queries = device.create_query_set(type=wgpu.QueryType.timestamp, count=count)
        self.resolved = device.create_buffer(size=8 * count,
                                             usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self.readback = device.create_buffer(size=8 * count,
                                             usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def stamp(self, compute, index: int) -> None:
        self.native.stamp(compute, self.queries._internal, index)

    def resolve(self, encoder) -> None:
        self.native.resolve(encoder, self.queries._internal, 0, self.count, self.resolved._internal, 0)
        self.native.copy(encoder, self.resolved._internal, 0, self.readback._internal, 0, 8 * self.count)

    def read(self) -> np.ndarray:
        """Milliseconds between consecutive timestamps of the submission just made."""
        map_for_reading(self.readback, self.wait_limit, self.native.poll)
        try:
            ticks = np.frombuffer(self.readback.read_mapped(), np.uint64).astype(np.float64)
        finally:
            self.readback.unmap()
        return np.maximum(np.diff(ticks), 0.0) * 1e-6  # timestamps are nanoseconds


class _Profiler(Timestamps):
    """A timestamp before every dispatch and after the last, read back after each run."""

    def __init__(self, context: DeviceContext, native: NativeEncoding, program: Program,
                 wait_limit: WaitLimit | None = None):
        super().__init__(context, native, len(program.launches) + 1, wait_limit)
        self.program = program
        self.samples: dict[int, list[float]] = {}

    def collect(self) -> None:
        run: dict[int, float] = {}
        for d, ms in zip(self.program.launches, self.read()):
            if d.ops:
                run[d.ops[0]] = run.get(d.ops[0], 0.0) + ms
        for op, ms in run.items():
            self.samples.setdefault(op, []).append(ms)

    def per_op(self) -> dict[int, float]:
        return {op: float(np.median(ms)) for op, ms in self.samples.items()}
