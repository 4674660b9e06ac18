"""Values of the opencl backend: what ``to_device`` gives and ``CompiledPartition.run`` returns.

``to_device`` only *stages* the caller's array: the partition that consumes
it uploads the NHWC values as they are into a staging buffer bound at
compile time and a kernel moves them into PHWC4, so an inference neither
reshuffles on the host nor allocates device memory.  Partition outputs stay
in their device buffers; the first ``to_host`` among the outputs of one run
converts each back to NHWC on the device, enqueues the reads of all of them
and waits once, so a run costs a single host sync.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from delegate.gpu.constants import from_float_view, to_float_view
from delegate.plugin_api import DType, Quantization, Tensor


class Boundary:
    """Where a partition input or output meets the host: its PHWC4 buffer, and the bound kernel that
    converts between it and an NHWC float32 staging buffer (none when the bytes coincide)."""

    __slots__ = ("tensor", "buffer", "staging", "kernel", "global_size", "local_size")

    def __init__(self, tensor: Tensor, buffer, staging=None, kernel=None, global_size=None, local_size=None):
        self.tensor, self.buffer, self.staging = tensor, buffer, staging
        self.kernel, self.global_size, self.local_size = kernel, global_size, local_size

    def upload(self, cl, queue, floats: np.ndarray):
        """Enqueue the copy of NHWC ``floats`` and their conversion (non-blocking); returns the copy's event."""
        event = cl.enqueue_copy(queue, self.buffer if self.kernel is None else self.staging, floats,
                                is_blocking=False)
        if self.kernel is not None:
            cl.enqueue_nd_range_kernel(queue, self.kernel, self.global_size, self.local_size)
        return event

    def enqueue_read(self, cl, queue, host: np.ndarray):
        """Enqueue the conversion to NHWC and the read into ``host`` (non-blocking)."""
        if self.kernel is None:
            return cl.enqueue_copy(queue, host, self.buffer, is_blocking=False)
        cl.enqueue_nd_range_kernel(queue, self.kernel, self.global_size, self.local_size)
        return cl.enqueue_copy(queue, host, self.staging, is_blocking=False)


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
    def buffer(self):
        return None if self.boundary is None else self.boundary.buffer

    def host_floats(self, cl, queue) -> np.ndarray:
        """The NHWC float view of a device-resident value (reads it back if needed)."""
        if self.floats is None:
            self.batch.read(cl, queue)
        return self.floats

    def to_host(self, cl, queue) -> np.ndarray:
        if self.staged is not None:
            return self.staged
        floats = self.host_floats(cl, queue)
        return floats if self.dtype is DType.float32 else from_float_view(floats, self.dtype, self.quant)


def fill_input(cl, queue, boundary: Boundary, value: Any, storage: np.dtype):
    """Enqueue what puts ``value`` into a partition's input ``boundary``; returns the upload's event, if any."""
    if not isinstance(value, ClValue):
        value = ClValue.stage(value)
    if value.boundary is not None and value.storage == storage:
        if value.buffer.int_ptr != boundary.buffer.int_ptr:
            cl.enqueue_copy(queue, boundary.buffer, value.buffer)
        return None
    if value.staged is not None:
        floats = np.ascontiguousarray(to_float_view(value.staged, boundary.tensor), np.float32)
    else:
        floats = value.host_floats(cl, queue)  # made by a partition of another precision
    return boundary.upload(cl, queue, floats)


class ReadbackBatch:
    """The outputs of one run: converted and read back together, with one wait."""

    def __init__(self, values: list[ClValue]):
        self.values = values

    def read(self, cl, queue) -> None:
        event = None
        for value in self.values:
            if value.floats is None:
                value.floats = np.empty(value.shape, np.float32)
                event = value.boundary.enqueue_read(cl, queue, value.floats)
        if event is not None:
            event.wait()  # the queue is in order: the last read done means all are
