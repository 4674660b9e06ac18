"""The enqueue of a partition's kernels: one call into enqueue.c, or pyopencl's loop.

At batch 1 on a fast GPU the host's work per kernel sets the floor: pyopencl's
``enqueue_nd_range_kernel`` converts its arguments and makes an Event per call.
enqueue.c takes the kernels, work sizes and queue as arrays built once at compile
time and calls ``clEnqueueNDRangeKernel`` for each with no events, so a run
makes one ctypes call.  It is built like the CPU plugin's native loops
(delegate.native, into the user cache); without a C compiler, with
``native_enqueue: false``, or while the partition keeps profiling events (those
need an Event per kernel) pyopencl's loop runs instead.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any, Sequence

from delegate.plugin_api import load_library

SOURCE = Path(__file__).with_name("enqueue.c")
FLAG_SETS = (["-O2"],)
# Spin-loop hints between a wait's asks of the event's status (enqueue.c's wait_event).  Host -> host p50 on an
# H100 host, asking with none / 20 / 200 between asks: MobileNetV2 0.634 / 0.622 / 0.623 ms, pose_landmark_full
# 1.086 / 1.057 / 1.049 ms (the driver's blocking wait: 0.630, 1.095).
PAUSE_ITERS = 20

_INT64 = ctypes.c_int64


class NativeEnqueue:
    """enqueue.c's entry points, and the addresses of the OpenCL functions they call in pyopencl's ICD
    loader (``clEnqueueNDRangeKernel``; ``clFlush`` and ``clGetEventInfo`` for the wait)."""

    def __init__(self, library: ctypes.CDLL, enqueue_address: int, flush_address: int, info_address: int):
        self.call = library.enqueue_launches
        self.call.argtypes = [ctypes.c_void_p] * 7 + [_INT64, ctypes.POINTER(_INT64)]
        self.call.restype = ctypes.c_int32
        self.enqueue_address = enqueue_address
        self.wait_call = library.wait_event
        self.wait_call.argtypes = [ctypes.c_void_p] * 4 + [_INT64] * 4 + [ctypes.POINTER(ctypes.c_int32)]
        self.wait_call.restype = ctypes.c_int32
        self.flush_address, self.info_address = flush_address, info_address

    def wait(self, cl, queue, event, spin_s: float, limit_s: float, max_sleep_s: float) -> bool:
        """Wait for ``event`` of ``queue`` as enqueue.c's ``wait_event`` does (the GIL released meanwhile):
        True once complete, False when ``limit_s`` passed first; failed work raises pyopencl's error."""
        detail = ctypes.c_int32(0)
        outcome = self.wait_call(self.flush_address, self.info_address, queue.int_ptr, event.int_ptr,
                                 _ns(spin_s), PAUSE_ITERS, _ns(limit_s), _ns(max_sleep_s), ctypes.byref(detail))
        if outcome == 2:  # the work failed: the driver's wait raises its error
            event.wait()
            raise cl_error(cl, "clWaitForEvents", detail.value)
        if outcome == 3:
            raise cl_error(cl, "clGetEventInfo", detail.value)
        return outcome == 0


_LOCK = threading.Lock()
_LOADED: list = []  # [NativeEnqueue | str (why there is none)] once tried


def native_enqueue(cl) -> NativeEnqueue | str:
    """The native enqueue, built and loaded on the first call; else why it cannot be."""
    with _LOCK:
        if not _LOADED:
            _LOADED.append(_load(cl))
        return _LOADED[0]


def _load(cl) -> NativeEnqueue | str:
    names = ("clEnqueueNDRangeKernel", "clFlush", "clGetEventInfo")
    addresses = [loader_function(cl, name) for name in names]
    missing = [name for name, address in zip(names, addresses) if address is None]
    if missing:
        return f"pyopencl's OpenCL library exports no {', '.join(missing)}"
    built = load_library(SOURCE, FLAG_SETS, "opencl")
    if built.library is None:
        return built.reason
    return NativeEnqueue(built.library, *addresses)


def loader_function(cl, name: str) -> int | None:
    """The address of ``name`` in the OpenCL library pyopencl's extension is linked against (its bundled
    ICD loader or the system's): symbols looked up through a library's handle resolve in its dependencies."""
    try:
        return ctypes.cast(getattr(ctypes.CDLL(cl._cl.__file__), name), ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


class PreparedLaunches:
    """A partition's launches as enqueue.c takes them, built once; the kernels stay referenced here."""

    def __init__(self, native: NativeEnqueue, launches: Sequence[tuple[Any, tuple, tuple | None]]):
        self.native, self.launches = native, list(launches)
        count = len(self.launches)
        self.count = count
        self.kernels = (ctypes.c_void_p * count)(*(kernel.int_ptr for kernel, _, _ in self.launches))
        self.dims = (ctypes.c_uint32 * count)(*(len(size) for _, size, _ in self.launches))
        self.global_sizes = (ctypes.c_size_t * (3 * count))(*_padded(size for _, size, _ in self.launches))
        self.local_sizes = (ctypes.c_size_t * (3 * count))(*_padded(local or (1, 1, 1)
                                                                    for _, _, local in self.launches))
        self.has_local = (ctypes.c_uint8 * count)(*(local is not None for _, _, local in self.launches))
        self.failed = _INT64(-1)
        self.failed_ref = ctypes.byref(self.failed)

    def enqueue(self, cl, queue) -> None:
        """Enqueue every launch on ``queue``; a failure raises what pyopencl would have raised for it."""
        status = self.native.call(self.native.enqueue_address, queue.int_ptr, self.kernels, self.dims,
                                  self.global_sizes, self.local_sizes, self.has_local, self.count, self.failed_ref)
        if status:
            raise cl_error(cl, "clEnqueueNDRangeKernel", status)


def _ns(seconds: float) -> int:
    """``seconds`` in nanoseconds as enqueue.c takes them (a limit of centuries held to 2**62 ns)."""
    return int(min(seconds * 1e9, 2.0 ** 62))


def _padded(sizes) -> list[int]:
    """Work sizes of up to three dimensions, three slots each."""
    flat: list[int] = []
    for size in sizes:
        flat += [*size, *[1] * (3 - len(size))]
    return flat


def cl_error(cl, routine: str, code: int):
    """The exception pyopencl raises when ``routine`` returns ``code``: its class chosen by pyopencl's rule
    (allocation failure: MemoryError; CL_INVALID_*: LogicError; other failures: RuntimeError), its message
    ("ROUTINE failed: CODE_NAME") made by pyopencl's error record."""
    record = cl._cl._ErrorRecord(routine=routine, code=code, msg="")
    if code == cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE:
        return cl.MemoryError(record)
    if code <= cl.status_code.INVALID_VALUE:
        return cl.LogicError(record)
    return cl.RuntimeError(record) if code < 0 else cl.Error(record)
