"""Values of the opencl backend: what ``to_device`` gives and ``CompiledPartition.run`` returns.

``to_device`` converts a host array to PHWC4 and *stages* it: the upload is
enqueued by the partition that consumes the value, straight into the input
buffer its kernels were bound to at compile time, so an inference allocates
no buffers and rebinds no arguments.  Partition outputs stay in their device
buffers; the first ``to_host`` among the outputs of one run enqueues the
reads of all of them and waits once, so a run costs a single host sync.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from delegate.gpu.constants import from_float_view, to_float_view
from delegate.gpu.layout import from_phwc4, phwc4_vectors, to_phwc4
from delegate.ir import DType, Quantization, Tensor


class ClValue:
    """A tensor held by the opencl backend: in a device buffer, or staged on the host for upload."""

    __slots__ = ("shape", "dtype", "quant", "buffer", "storage", "staged", "readback", "batch")

    def __init__(self, shape, dtype: DType, *, quant: Quantization | None = None, buffer: Any = None,
                 storage: np.dtype | None = None, staged: np.ndarray | None = None,
                 batch: "ReadbackBatch | None" = None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.quant = quant
        self.buffer = buffer
        self.storage = storage
        self.staged = staged
        self.readback: np.ndarray | None = None
        self.batch = batch

    @classmethod
    def stage(cls, array: np.ndarray) -> "ClValue":
        array = np.asarray(array)
        return cls(array.shape, DType.from_numpy(array.dtype), staged=to_phwc4(array))

    def upload(self, cl, queue, buffer, tensor: Tensor, storage: np.dtype) -> None:
        """Enqueue the copy of this value into a partition's input ``buffer`` (non-blocking)."""
        if self.buffer is not None and self.storage == storage:
            if self.buffer.int_ptr != buffer.int_ptr:
                cl.enqueue_copy(queue, buffer, self.buffer)
            return
        if self.staged is not None:
            data = to_float_view(self.staged, tensor)
        else:
            data = to_phwc4(self.host_floats(cl, queue))  # already the float view
        cl.enqueue_copy(queue, buffer, data.astype(storage), is_blocking=False)

    def host_floats(self, cl, queue) -> np.ndarray:
        """The float values of a device-resident value in NHWC (reads it back if needed)."""
        if self.readback is None:
            self.batch.read(cl, queue)
        return from_phwc4(self.readback.astype(np.float32), self.shape)

    def to_host(self, cl, queue) -> np.ndarray:
        if self.staged is not None:
            return from_phwc4(self.staged, self.shape)
        return from_float_view(self.host_floats(cl, queue), self.dtype, self.quant)


class ReadbackBatch:
    """The outputs of one run: read back together, with one wait."""

    def __init__(self, values: list[ClValue]):
        self.values = values

    def read(self, cl, queue) -> None:
        event = None
        for value in self.values:
            if value.readback is None:
                value.readback = np.empty(phwc4_vectors(value.shape) * 4, value.storage)
                event = cl.enqueue_copy(queue, value.readback, value.buffer, is_blocking=False)
        if event is not None:
            event.wait()  # the queue is in order: the last read done means all are
