"""A partition's buffers as ranges of one device buffer, its arena.

NVIDIA's driver charges every buffer argument of every launch (~0.4 us on an H100 host, an int ~0.1:
docs/gpu.md), and a convolution's launch carries four or more.  So a compiled partition allocates one
buffer holding every tensor, scratch buffer and constant of its kernel plan, each range starting at an
ALIGN-byte boundary, and each kernel takes that buffer once and its tensors as byte offsets into it
(prelude.cl's ARENA, AT and BIND).  The host's copies in and out address the same ranges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from delegate.plugin_api import CompileError
from delegate.gpu.plan import BufferSpec

# Where each range starts: a multiple of this many bytes, the alignment NVIDIA's and PoCL's drivers give a
# buffer of its own (so every vector access of a kernel stays aligned).
ALIGN = 256


@dataclass(frozen=True)
class Region:
    """A range of an arena: the arena's buffer, where the range starts, and its size in bytes."""

    buffer: Any
    offset: int
    nbytes: int

    def same_bytes(self, other: "Region") -> bool:
        return self.buffer.int_ptr == other.buffer.int_ptr and self.offset == other.offset


def offsets(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Each range's start when ranges of ``sizes`` bytes follow each other at ALIGN boundaries (an empty
    one still takes ALIGN bytes, so no two share a start), and the bytes they take in all."""
    starts, end = [], 0
    for size in sizes:
        starts.append(end)
        end += -(-max(size, 1) // ALIGN) * ALIGN
    return starts, end


def make_arena(cl, context, queue, device, specs: Sequence[BufferSpec], blob: bytes | bytearray) -> list[Region]:
    """One device buffer for every buffer of a kernel plan, zero-filled and the constants' bytes copied in; a
    range of it per spec.  CompileError when it is larger than the device allows one buffer to be."""
    if not specs:
        return []
    starts, total = offsets([spec.nbytes for spec in specs])
    limit = int(device.max_mem_alloc_size)
    if total > limit:
        raise CompileError(f"the partition's buffers need {total} bytes in one OpenCL buffer and "
                           f"{device.name.strip()} allows at most {limit}")
    arena = cl.Buffer(context, cl.mem_flags.READ_WRITE, total)
    cl.enqueue_fill_buffer(queue, arena, np.zeros(1, np.uint8), 0, total)
    for spec, start in zip(specs, starts):
        if spec.data is not None:
            offset, size = spec.data
            cl.enqueue_copy(queue, arena, np.frombuffer(blob, np.uint8, size, offset), dst_offset=start)
    return [Region(arena, start, spec.nbytes) for spec, start in zip(specs, starts)]
