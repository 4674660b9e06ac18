"""Values of the opencl backend: what ``to_device`` gives and ``CompiledPartition.run`` returns.

``to_device`` only *stages* the caller's array: the partition that consumes
it writes the NHWC values as they are, from the caller's own array, into a
staging buffer bound at compile time and a kernel moves them into PHWC4, so
an inference neither reshuffles nor copies on the host nor allocates device
memory.  Partition outputs stay in their device buffers; the first ``to_host``
among the outputs of one run converts back to NHWC on the device, enqueues
the reads of the outputs the host will read (all of them unless the runtime
said which, see ``ClCompiled.read_hint``) and waits once, so a run costs a
single host sync.  Each output is read into a host array made once per
compiled partition, pinned where the driver gives such memory (a mapped
``CL_MEM_ALLOC_HOST_PTR`` buffer: the copy is a DMA with no page faults and
no bounce through the driver's own staging); a value read back is therefore
valid until its partition runs again, as the CPU backend's arena outputs are.
"""

from __future__ import annotations

import ctypes
import math
import time
from typing import Any

import numpy as np

from delegate.gpu.constants import from_float_view, to_float_view
from delegate.gpu.waits import WaitLimit as KitWaitLimit
from delegate.plugin_api import DType, Quantization, Tensor

from .arena import Region
from .enqueue import native_enqueue


def host_array(cl, context, queue, shape: tuple[int, ...], limit: "WaitLimit") -> tuple[np.ndarray, Any, str]:
    """A float32 host array of ``shape`` for reads from the device: (array, its OpenCL buffer or None, kind).

    Pinned where the driver can map an ``ALLOC_HOST_PTR`` buffer (it stays mapped for the array's life; no
    kernel ever uses that buffer, so the mapping is never in the way); else ordinary pageable memory, and
    the kind says why.  The mapping waits its turn in the queue, within ``limit``."""
    if math.prod(shape) == 0:
        return np.empty(shape, np.float32), None, "pageable (empty tensor)"
    try:
        buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR,
                           4 * math.prod(shape))
        array, mapped = cl.enqueue_map_buffer(queue, buffer, cl.map_flags.READ | cl.map_flags.WRITE, 0, shape,
                                              np.float32, is_blocking=False)
        wait_within(cl, queue, mapped, limit, [array])
    except cl.Error as exc:
        return np.empty(shape, np.float32), None, f"pageable (mapping a pinned buffer failed: {exc})"
    return array, buffer, "pinned (mapped CL_MEM_ALLOC_HOST_PTR)"


class WaitLimit(KitWaitLimit):
    """The kit's limit, and how OpenCL waits within it: ``spin_s``, how long a wait keeps asking before it
    sleeps between asks; ``native``, asked by enqueue.c's loop where it builds (else by Python's)."""

    def __init__(self, seconds: float | None = None, spin_s: float = 0.0, native: bool = True):
        super().__init__(seconds)
        self.spin_s, self.native = spin_s, native
        self._asker: list = []  # enqueue.c's loop (or None), found on the first wait

    def asker(self, cl):
        """enqueue.c's loop where ``native`` and it builds, else None; looked up once, not on every run."""
        if not self._asker:
            loaded = native_enqueue(cl) if self.native else None
            self._asker.append(None if isinstance(loaded, str) else loaded)
        return self._asker[0]

    def gave_up(self, event, pending) -> TimeoutError:
        """The error of a wait past the limit, ``event`` and ``pending`` kept in ABANDONED."""
        ABANDONED.extend([event, *pending])
        return self.exceeded()


# Once a wait has lasted its ``spin_s``, it sleeps a twentieth of the time waited so far between asks (at
# most POLL_MAX_S): a run is noticed done at most ~5% late, and a long one costs few wake-ups.
POLL_MAX_S = 1e-3


# What waits gave up on: pyopencl's event of a copy to or from a host array waits for its copy when freed, so
# the events (and the arrays they hold) of work that never finished are kept for the process's life, and
# beyond: the list holds a reference of its own, so not even the interpreter's exit frees it (and hangs).
ABANDONED: list = []
ctypes.pythonapi.Py_IncRef(ctypes.py_object(ABANDONED))


def wait_within(cl, queue, event, limit: WaitLimit, pending: list | tuple = ()) -> None:
    """Wait for ``event`` of ``queue``; TimeoutError once ``limit.seconds`` have passed, ``event`` and the
    ``pending`` objects of the same work kept in ABANDONED.  With no limit, the driver's blocking wait.  With
    one, the event's status is asked for (the queue flushed first, so the work is submitted): by one call
    into enqueue.c where it builds, which asks without Python's cost per ask (on an H100 host the Python
    loop's wait took 20 µs longer than the driver's blocking wait), else by the loop below."""
    if limit.seconds is None:
        event.wait()
        return
    asker = limit.asker(cl)
    if asker is not None:
        if not asker.wait(cl, queue, event, limit.spin_s, limit.seconds, POLL_MAX_S):
            raise limit.gave_up(event, pending)
        return
    queue.flush()
    complete = cl.command_execution_status.COMPLETE
    start = time.perf_counter()
    while True:
        status = event.command_execution_status
        if status == complete:
            return
        if status < 0:  # the work failed: the driver's wait raises its error
            event.wait()
            return
        waited = time.perf_counter() - start
        if waited > limit.seconds:
            raise limit.gave_up(event, pending)
        time.sleep(0.0 if waited < limit.spin_s else min(waited / 20, POLL_MAX_S))


class Boundary:
    """Where a partition input or output meets the host: its PHWC4 range of the arena, the bound kernel that
    converts between it and an NHWC staging range (none when the bytes coincide) and, for an output once first
    read, the host array it is read into (made once, reused by every later run).  An input's host values
    are float32 or, ``host_dtype`` an integer type, a quantized input's own integers (the device
    dequantizes); ``host_layout``: the buffer holds them in host order, read so by the input's kernel."""

    __slots__ = ("tensor", "buffer", "staging", "kernel", "global_size", "local_size", "host", "pinned",
                 "host_kind", "host_dtype", "host_layout")

    def __init__(self, tensor: Tensor, buffer: Region, staging: Region | None = None, kernel=None, global_size=None,
                 local_size=None, host_dtype: np.dtype = np.dtype(np.float32), host_layout: bool = False):
        self.tensor, self.buffer, self.staging = tensor, buffer, staging
        self.kernel, self.global_size, self.local_size = kernel, global_size, local_size
        self.host_dtype, self.host_layout = host_dtype, host_layout
        self.host: np.ndarray | None = None
        self.pinned, self.host_kind = None, ""

    def upload(self, cl, queue, values: np.ndarray) -> list:
        """Enqueue the copy of NHWC ``values`` and their conversion (non-blocking); returns their events."""
        target = self.buffer if self.kernel is None else self.staging
        _check_fits(values, target, "input")
        events = [cl.enqueue_copy(queue, target.buffer, values, dst_offset=target.offset, is_blocking=False)]
        if self.kernel is not None:
            events.append(cl.enqueue_nd_range_kernel(queue, self.kernel, self.global_size, self.local_size))
        return events

    def enqueue_read(self, cl, context, queue, limit: "WaitLimit") -> list:
        """Enqueue the conversion to NHWC and the read into this output's host array (non-blocking; the array
        made on the first read, within ``limit``); returns their events, the read's last."""
        if self.host is None:
            self.host, self.pinned, self.host_kind = host_array(cl, context, queue, self.tensor.shape, limit)
        events = []
        if self.kernel is not None:
            events.append(cl.enqueue_nd_range_kernel(queue, self.kernel, self.global_size, self.local_size))
        source = self.buffer if self.kernel is None else self.staging
        _check_fits(self.host, source, "output")
        events.append(cl.enqueue_copy(queue, self.host, source.buffer, src_offset=source.offset, is_blocking=False))
        return events


def _check_fits(host: np.ndarray, region: Region, what: str) -> None:
    """A copy between ``host`` and ``region`` stays inside the range: the arena's neighbours are other tensors."""
    if host.nbytes > region.nbytes:
        raise ValueError(f"an {what} of {host.nbytes} bytes does not fit its {region.nbytes}-byte device range")


class ClValue:
    """A tensor held by the opencl backend: in a device buffer, or staged on the host for upload."""

    __slots__ = ("shape", "dtype", "quant", "staged", "boundary", "storage", "floats", "batch")

    def __init__(self, shape, dtype: DType, *, quant: Quantization | None = None, staged: np.ndarray | None = None,
                 boundary: Boundary | None = None, storage: np.dtype | None = None,
                 batch: "ReadbackBatch | None" = None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.quant = quant
        self.staged = staged
        self.boundary = boundary
        self.storage = storage
        self.floats: np.ndarray | None = None  # the NHWC float view, once read back
        self.batch = batch

    @classmethod
    def stage(cls, array: np.ndarray) -> "ClValue":
        array = np.asarray(array)
        return cls(array.shape, DType.from_numpy(array.dtype), staged=array)

    @property
    def buffer(self) -> Region | None:
        return None if self.boundary is None else self.boundary.buffer

    def host_floats(self, cl, queue) -> np.ndarray:
        """The NHWC float view of a device-resident value (reads it back if needed)."""
        if self.floats is None:
            self.batch.read(cl, queue, self)
        return self.floats

    def to_host(self, cl, queue) -> np.ndarray:
        if self.staged is not None:
            return self.staged
        floats = self.host_floats(cl, queue)
        return floats if self.dtype is DType.float32 else from_float_view(floats, self.dtype, self.quant)


def fill_input(cl, queue, boundary: Boundary, value: Any, storage: np.dtype) -> list:
    """Enqueue what puts ``value`` into a partition's input ``boundary``; returns the events of the upload
    and its conversion (none for a device copy).  A float32 array in C order, or a quantized input's
    integers, goes from the caller's own memory to the device: no host copy, no conversion."""
    if not isinstance(value, ClValue):
        value = ClValue.stage(value)
    if value.boundary is not None and value.storage == storage and not (boundary.host_layout
                                                                         or value.boundary.host_layout):
        source, target = value.buffer, boundary.buffer
        if not source.same_bytes(target):
            cl.enqueue_copy(queue, target.buffer, source.buffer, src_offset=source.offset, dst_offset=target.offset,
                            byte_count=min(source.nbytes, target.nbytes))
        return []
    if boundary.host_dtype.kind != "f":  # dequantized on the device
        host = value.staged if value.staged is not None else value.to_host(cl, queue)
        return boundary.upload(cl, queue, np.ascontiguousarray(host, boundary.host_dtype))
    if value.staged is not None:
        floats = np.ascontiguousarray(to_float_view(value.staged, boundary.tensor), np.float32)
    else:
        floats = value.host_floats(cl, queue)  # made by a partition of another precision
    return boundary.upload(cl, queue, floats)


class ReadbackBatch:
    """The outputs of one run, converted and read back together with one wait: the one asked for and
    those in ``wanted`` (tensor indices the host is expected to read; None: every output)."""

    def __init__(self, values: list[ClValue], context, wanted: frozenset[int] | None, events: list | None,
                 uploads: list, limit: WaitLimit):
        self.values, self.context, self.wanted, self.limit = values, context, wanted, limit
        self.events = events  # where a profiled run keeps the events of its reads
        self.uploads = uploads  # the run's upload events, holding the caller's arrays until the copies are done

    def read(self, cl, queue, asked: ClValue) -> None:
        enqueued = []
        for value in self.values:
            if value.floats is None and (value is asked or self.wanted is None
                                         or value.boundary.tensor.index in self.wanted):
                events = value.boundary.enqueue_read(cl, self.context, queue, self.limit)
                value.floats = value.boundary.host
                if self.events is not None:
                    self.events.extend(events)
                enqueued += events
        if enqueued:  # the queue is in order: the last read done means all are, the uploads too
            try:
                wait_within(cl, queue, enqueued[-1], self.limit, enqueued + self.uploads)
            finally:
                self.uploads.clear()  # so the caller's input arrays are no longer referenced (or only abandoned)
