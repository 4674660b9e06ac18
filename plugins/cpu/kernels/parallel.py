"""Threads for the CPU kernels: kernels split their own work into chunks; BLAS runs single-threaded.

OpenBLAS's worker threads spin for a while after every call.  Next to the
kernels' own helper threads (and other busy processes) they oversubscribe the
cores, and a GEMM that waits for a descheduled worker stalls for a whole
scheduler slice.  So while a partition runs, BLAS is held to one thread and
large products are split into chunks like every other kernel's work.  Chunks
are shared, not assigned: every thread takes the next chunk left.  Helper
threads are lent to a run for its duration and wait for its jobs spinning,
since waking a sleeping thread costs tens of microseconds per op; whether a
run shares at all is measured (ThreadChoice), as a busy machine has no core
to spare.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import itertools
import os
import queue as queue_module
import statistics
import threading
import time
from collections import deque
from typing import Callable, Iterator, Sequence

_THREADS = contextvars.ContextVar("delegate_cpu_kernel_threads", default=1)


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


def chunks_for(count: int, work: float, min_work: float = 1 << 18) -> list[tuple[int, int]]:
    """At compile time: ``count`` rows as one range per thread, or a single range when ``work`` is small.

    Each range costs its own round of numpy calls, so there are no more than threads;
    a thread that finishes first still takes over a range nobody has started.
    """
    n = threads()
    if n <= 1 or work < min_work:
        return [(0, count)]
    return even_chunks(count, min(n, int(work // (min_work / 2))))


def spread(chunks: Sequence[tuple], alone: Sequence[tuple] | None = None) -> Callable[[Callable[..., None]], None]:
    """At compile time: a runner calling ``fn(*chunk)`` for every chunk, over the kernel's threads.

    numpy and BLAS release the GIL inside their loops, so disjoint parts of one output run in
    parallel; the calling thread works too, with the helpers lent to its run (lent_helpers).
    ``alone`` are the chunks to run instead without helpers; by default the same chunks.
    """
    chunks = list(chunks)
    alone = chunks if alone is None else list(alone)
    helpers = min(threads(), len(chunks)) - 1

    def inline(fn: Callable[..., None]) -> None:
        for chunk in alone:
            fn(*chunk)
    if helpers <= 0:
        return inline

    def shared(fn: Callable[..., None]) -> None:
        crew = _CREW.get()[:helpers]
        if not crew:
            return inline(fn)
        job = _Job(fn, chunks)
        for helper in crew:
            helper.post(job)
        try:
            job.drain()
        finally:
            for helper in crew:
                helper.join()
        if job.error is not None:
            raise job.error
    return shared


def _spin_gate_type():
    """A lock whose waiters spin in C without the GIL (a POSIX spinlock through ctypes), so that a
    waiting thread goes on at once rather than after being woken (tens of microseconds on a
    virtual CPU); a plain lock where there is none."""
    try:
        libc = ctypes.CDLL(None)
        init, lock, unlock = libc.pthread_spin_init, libc.pthread_spin_lock, libc.pthread_spin_unlock
    except (OSError, AttributeError):
        return threading.Lock

    class SpinGate:
        __slots__ = ("word", "ref")

        def __init__(self) -> None:
            self.word = ctypes.c_int(0)
            self.ref = ctypes.byref(self.word)
            init(self.ref, 0)

        def acquire(self) -> None:
            lock(self.ref)

        def release(self) -> None:
            unlock(self.ref)
    return SpinGate


_Gate = _spin_gate_type()


class _Job:
    """Chunks shared by a run's thread and its helpers: each takes the next chunk left."""

    def __init__(self, fn: Callable[..., None], chunks: list[tuple]):
        self.fn, self.queue = fn, iter(chunks)  # next() on a list iterator is atomic under the GIL
        self.error: BaseException | None = None

    def drain(self) -> None:
        for chunk in self.queue:
            self.fn(*chunk)


class _Helper:
    """A helper thread, lent to one run at a time (see lent_helpers).

    While lent it waits for the run's jobs on two gates that the run holds in turn, and
    reports each job done by opening a third; the gates spin (see _spin_gate_type).
    Otherwise it sleeps on a queue.
    """

    def __init__(self, name: str) -> None:
        self.gates = (_Gate(), _Gate())
        self.done = _Gate()
        self.turn = 0
        self.job: _Job | None = None
        self.lent: queue_module.SimpleQueue = queue_module.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            self.lent.get()
            turn = 0
            while True:
                gate = self.gates[turn]
                gate.acquire()
                job = self.job
                gate.release()
                turn ^= 1
                if job is None:
                    break
                try:
                    job.drain()
                except BaseException as exc:  # handed to the run's thread, which re-raises it
                    job.error = exc
                self.done.release()

    def lend(self) -> None:
        self.turn = 0
        self.gates[0].acquire()
        self.lent.put(True)

    def post(self, job: _Job | None) -> None:
        """Hand over the next job (None: the run is over): take the other gate, open this one."""
        if job is not None:
            self.done.acquire()
        self.gates[self.turn ^ 1].acquire()
        self.job = job
        self.gates[self.turn].release()
        self.turn ^= 1

    def join(self) -> None:
        self.done.acquire()
        self.done.release()

    def give_back(self) -> None:
        self.post(None)
        self.gates[self.turn].release()


@contextlib.contextmanager
def lent_helpers(count: int) -> Iterator[None]:
    """Kernels run inside this block share their chunks with up to ``count`` helper threads: as
    many as are free, keeping one core per thread, since lent helpers spin."""
    global _LENT
    with _POOL_LOCK:
        take = max(min(count, (os.cpu_count() or 1) - 1 - _LENT), 0)
        _LENT += take
        crew = [_IDLE.pop() if _IDLE else _Helper(f"delegate-cpu-{next(_NAMES)}") for _ in range(take)]
    for helper in crew:
        helper.lend()
    token = _CREW.set(tuple(crew))
    try:
        yield
    finally:
        _CREW.reset(token)
        for helper in crew:
            helper.give_back()
        with _POOL_LOCK:
            _IDLE.extend(crew)
            _LENT -= take


_CREW: contextvars.ContextVar[tuple[_Helper, ...]] = contextvars.ContextVar("delegate_cpu_crew", default=())
_IDLE: list[_Helper] = []
_LENT = 0
_POOL_LOCK = threading.Lock()
_NAMES = itertools.count()


def _forget_helpers() -> None:
    """In a forked child: the helpers' threads did not come along."""
    global _LENT, _POOL_LOCK
    _IDLE.clear()
    _LENT = 0
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_helpers)


class ThreadChoice:
    """Whether the kernels of one compiled partition share their work among threads, by measurement.

    On a busy machine the helper threads get no core of their own and only add
    handoffs and GIL ping-pong; on an idle one they nearly halve the time.  So
    runs are timed both ways, now and then again, and the faster way is kept.
    """

    PROBE_EVERY = 10

    def __init__(self, helpers: int) -> None:
        self.helpers = helpers
        self.samples: dict[bool, deque] = {True: deque(maxlen=5), False: deque(maxlen=5)}
        self.runs = 0

    def _next(self) -> bool:
        self.runs += 1
        if self.runs == 1:
            return True  # a first run pays for first-touch memory: not a fair sample
        for sharing in (True, False):
            if len(self.samples[sharing]) < 2:
                return sharing
        best = statistics.median(self.samples[True]) <= statistics.median(self.samples[False])
        return best != (self.runs % self.PROBE_EVERY == 0)

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        sharing = self._next()
        start = time.perf_counter()
        with lent_helpers(self.helpers if sharing else 0):
            yield
        if self.runs > 1:
            self.samples[sharing].append(time.perf_counter() - start)


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
