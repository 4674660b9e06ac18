"""Threads for the CPU kernels: kernels split their own work into chunks; BLAS runs single-threaded.

OpenBLAS's worker threads spin for a while after every call.  Next to the
kernels' own helper threads (and other busy processes) they oversubscribe the
cores, and a GEMM that waits for a descheduled worker stalls for a whole
scheduler slice.  So while a partition runs, BLAS is held to one thread and
large products are split into chunks like every other kernel's work.  Chunks
are shared, not assigned: every thread takes the next chunk left, so a helper
that starts late (on a loaded machine) costs nothing but its missing help.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

_THREADS = contextvars.ContextVar("delegate_cpu_kernel_threads", default=1)
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


@contextlib.contextmanager
def kernel_threads(count: int) -> Iterator[None]:
    """Kernels built inside this block may split their work over ``count`` threads (CompileOptions.num_threads)."""
    token = _THREADS.set(max(int(count or 1), 1))
    try:
        yield
    finally:
        _THREADS.reset(token)


def threads() -> int:
    """At compile time: how many threads the kernel being built may use."""
    return _THREADS.get()


def even_chunks(count: int, parts: int) -> list[tuple[int, int]]:
    """``count`` items as ``parts`` contiguous (start, stop) ranges of near-equal size."""
    parts = max(1, min(parts, count))
    return [(count * i // parts, count * (i + 1) // parts) for i in range(parts)]


def chunks_for(count: int, work: float, min_work: float = 1 << 18, per_thread: int = 2) -> list[tuple[int, int]]:
    """At compile time: ranges over ``count`` rows to share among the threads (one when ``work`` is small).

    ``per_thread`` chunks per thread let a thread that started first take over the share of one
    that started late.
    """
    n = threads()
    if n <= 1 or work < min_work:
        return [(0, count)]
    return even_chunks(count, min(n * per_thread, int(work // (min_work / 2)) or 1))


def spread(chunks: Sequence[tuple]) -> Callable[[Callable[..., None]], None]:
    """At compile time: a runner calling ``fn(*chunk)`` for every chunk, over the kernel's threads.

    numpy and BLAS release the GIL inside their loops, so disjoint parts of one output run in
    parallel; the calling thread works too.
    """
    chunks = list(chunks)
    helpers = min(threads(), len(chunks)) - 1
    if helpers <= 0:
        def inline(fn: Callable[..., None]) -> None:
            for chunk in chunks:
                fn(*chunk)
        return inline

    def shared(fn: Callable[..., None]) -> None:
        queue = iter(chunks)  # next() on a list iterator is atomic under the GIL

        def drain() -> None:
            for chunk in queue:
                fn(*chunk)
        pending = [_pool().submit(drain) for _ in range(helpers)]
        drain()
        for future in pending:
            if not future.cancel():
                future.result()
    return shared


def _pool() -> ThreadPoolExecutor:
    """One process-wide pool of helper threads (idle threads cost nothing)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="delegate-cpu")
        return _POOL


def _openblas_thread_controls() -> list[tuple[Callable[[], int], Callable[[int], None]]]:
    """(get, set) thread-count functions of every OpenBLAS already loaded (numpy's, scipy's), Linux only."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "openblas" in line.lower()}
    except OSError:
        return []
    controls = []
    for path in sorted(p for p in paths if ".so" in os.path.basename(p)):
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        for prefix, suffix in (("openblas", ""), ("scipy_openblas", ""), ("scipy_openblas", "64_"),
                               ("openblas", "64_")):
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                put.restype, put.argtypes = None, [ctypes.c_int]
                controls.append((get, put))
                break
    return controls


class _SingleThreadedBlas:
    """Holds every loaded OpenBLAS at one thread while any partition runs, then restores its count.

    Nested and concurrent runs share one hold; the last to leave restores.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.controls: list | None = None
        self.holders = 0
        self.saved: list[int] = []

    def __enter__(self) -> None:
        with self.lock:
            if self.controls is None:
                self.controls = _openblas_thread_controls()
            if self.holders == 0:
                self.saved = [get() for get, _ in self.controls]
                for _, put in self.controls:
                    put(1)
            self.holders += 1

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.holders -= 1
            if self.holders == 0:
                for (_, put), count in zip(self.controls, self.saved):
                    put(count)


single_threaded_blas = _SingleThreadedBlas()
