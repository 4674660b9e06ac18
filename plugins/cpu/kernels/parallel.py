"""Threads for the CPU kernels: kernels split their own work into chunks; BLAS runs single-threaded.

OpenBLAS's worker threads spin for a while (up to a tenth of a second) after
every call.  Next to the kernels' own helper threads they oversubscribe the
cores, and after a run they keep taking cores from whatever the process does
next: on two cores, LiteRT alternating with us ran at half speed.  So BLAS is
held to one thread during runs and large products are split into chunks like
every other kernel's work (ThreadChoice picks between sharing them with helper
threads and one thread).  Chunks are shared, not assigned: every thread takes
the next chunk left, so a helper that starts late (on a loaded machine) costs
nothing but its missing help.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import math
import os
import queue as queue_module
import threading
import time
from collections import deque
from typing import Callable, Iterator, Sequence

from delegate.plugin_api import available_cores

from .common import start_scratch_op

_THREADS = contextvars.ContextVar("delegate_cpu_kernel_threads", default=1)
_NATIVE = contextvars.ContextVar("delegate_cpu_native_loops", default=True)
_TEAM = contextvars.ContextVar("delegate_cpu_native_team", default=None)


@contextlib.contextmanager
def kernel_threads(count: int, native: bool | None = None, team: int | None = None) -> Iterator[None]:
    """Kernels built inside this block may split their work over ``count`` threads (CompileOptions.num_threads),
    and use the native loops unless ``native`` is False (``cpu: {native: false}``; None keeps the setting),
    sharing those among ``team`` threads (default ``count``; see native.partition_team)."""
    token = _THREADS.set(max(int(count or 1), 1))
    native_token = _NATIVE.set(_NATIVE.get() if native is None else bool(native))
    team_token = _TEAM.set(team)
    try:
        yield
    finally:
        _TEAM.reset(team_token)
        _NATIVE.reset(native_token)
        _THREADS.reset(token)


def threads() -> int:
    """At compile time: how many threads the kernel being built may use."""
    return _THREADS.get()


def native_team() -> int:
    """At compile time: how many threads the native loops of the kernel being built share."""
    return min(_TEAM.get() or _THREADS.get(), _THREADS.get())


def native_allowed() -> bool:
    """At compile time: whether the kernel being built may use the native loops."""
    return _NATIVE.get()


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
    parallel; the calling thread works too.  ``alone`` are the chunks to run instead when the
    run keeps to one thread (see ThreadChoice); by default the same chunks.
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
        if not _SHARING.get():
            return inline(fn)
        job = _Job(fn, chunks)
        for helper in _helpers(helpers):
            helper.put(job)
        try:
            job.drain()
        finally:
            job.join(helpers)
    return shared


class _Job:
    """Chunks shared by the caller and helper threads; a helper that has not started when the
    caller is done is skipped, not waited for."""

    def __init__(self, fn: Callable[..., None], chunks: list[tuple]):
        self.fn, self.queue = fn, iter(chunks)  # next() on a list iterator is atomic under the GIL
        self.done = threading.Semaphore(0)
        self.lock = threading.Lock()
        self.started = self.cancelled = 0
        self.error: BaseException | None = None

    def drain(self) -> None:
        for chunk in self.queue:
            self.fn(*chunk)

    def help(self) -> None:
        """Run by a helper thread: take chunks unless the caller has stopped waiting."""
        with self.lock:
            if self.cancelled:
                self.cancelled -= 1
                return
            self.started += 1
        try:
            start_scratch_op()
            self.drain()
        except BaseException as exc:  # handed to the caller, which re-raises it
            self.error = exc
        self.done.release()

    def join(self, helpers: int) -> None:
        with self.lock:
            waiting = self.started
            self.cancelled = helpers - self.started
        for _ in range(waiting):
            self.done.acquire()
        if self.error is not None:
            raise self.error


def _helpers(count: int) -> list[queue_module.SimpleQueue]:
    """The job queues of ``count`` process-wide helper threads, started on first use."""
    with _HELPERS_LOCK:
        while len(_HELPERS) < count:
            jobs: queue_module.SimpleQueue = queue_module.SimpleQueue()
            threading.Thread(target=_serve, args=(jobs,), name=f"delegate-cpu-{len(_HELPERS)}", daemon=True).start()
            _HELPERS.append(jobs)
        return _HELPERS[:count]


def _serve(jobs: queue_module.SimpleQueue) -> None:
    while True:
        jobs.get().help()


_HELPERS: list[queue_module.SimpleQueue] = []
_HELPERS_LOCK = threading.Lock()


_SHARING = contextvars.ContextVar("delegate_cpu_share_work", default=True)


def free_cores(loadavg: str | None = None, spinning: int = 0) -> int:
    """How many cores of this process's affinity the machine's load leaves it now: the CPUs less the
    tasks the kernel counts runnable besides the calling thread (/proc/loadavg's fourth field, a count
    of this instant where its averages trail by a minute) and besides ``spinning`` of this process's own
    (its native team's workers, still spinning from the last run: see team_spinning), at least 1 and at
    most the affinity's; all of the affinity where the count cannot be read.  ``loadavg``: that file's
    text, read when None."""
    cores = available_cores()
    try:
        if loadavg is None:
            loadavg = _read_loadavg()
        running = int(loadavg.split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return cores
    others = running - 1 - min(max(spinning, 0), max(running - 1, 0))
    return max(1, min(cores, (_CPUS or cores) - others))


_CPUS = os.cpu_count()  # the machine's (reading it costs ~5 us a run)


# Workers of a native team wait spinning after a run (GOMP_SPINCOUNT, native.SPIN_COUNT) and the kernel
# counts them runnable: on the H200's 16 cores, runs back to back read 15 runnable tasks, all this
# process's own, and took a team of one (MobileNetV2 int8 at 16 threads: 9.1 ms, 1.8 ms with other work
# between runs).  A run's workers are not counted as load for this long after it (their spin lasts
# ~0.1-0.5 ms; a longer window only lets real load that came meanwhile go uncounted until it expires).
SPIN_WINDOW_S = 0.002
_RELEASED = [float("-inf"), 0]  # when the last shared run ended (perf_counter), and its team's workers


def team_spinning() -> int:
    """How many of this process's native workers may still be spinning from the last shared run."""
    ended, workers = _RELEASED
    return workers if time.perf_counter() - ended < SPIN_WINDOW_S else 0


_LOADAVG: list[int] = []  # the descriptor of /proc/loadavg, once opened


def _read_loadavg() -> str:
    """/proc/loadavg's text, read through a descriptor kept open: opening it costs ~27 us a run on a
    virtual machine, a read at offset 0 (the kernel regenerates the text) ~1 us."""
    with _LOADAVG_LOCK:
        if not _LOADAVG:
            _LOADAVG.append(os.open("/proc/loadavg", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
    return os.pread(_LOADAVG[0], 256, 0).decode("ascii", "replace")


_LOADAVG_LOCK = threading.Lock()


class ThreadChoice:
    """How many threads the kernels of one compiled partition use, chosen by measurement.

    Each run takes a team: the partition's whole team, the cores the machine's load leaves
    (see free_cores), half of those, or one thread.  With more than one thread the kernels'
    chunks are shared with helper threads and the native loops run on that team; alone, one
    thread does everything.  Either way BLAS is held to one thread (see the module docstring).
    Why time them: the load reading is an instant's count of runnable tasks and cannot tell a
    busy process from threads of this one that only spin after their own work (LiteRT's pool
    after its partition, or a benchmark alternating with it: every run read a full machine and
    ran alone, MobileNetV2 at 16 threads on the H200 5.7 ms against 1.8).  And a team as large
    as the cores left is not safe either: the scheduler, waking the workers each run, now and
    then puts one beside the busy process, and the whole team waits for it (H200, one busy
    process, MobileNetV2 fp32 p50: 16 threads 52.6 ms, 15 34.1, 12 5.1, 8 2.9, 1 11.4).  So
    the candidate teams are timed, now and then again, keyed by the team a run actually took,
    and the fastest on average over its last SAMPLES runs is kept: never much slower than one
    thread.  The average, not the median: a team beside a busy process is fast in most runs and
    waits tens of ms in the others (2 cores, one busy process, selfie_segmentation at 2 threads:
    p50 1.5 ms, p90 41 ms, mean 8.4 ms, against 2.4 ms on one thread), and a median keeps it.
    The slowest of three or more samples is left out: a single stall (a driver thread taking a core
    for a moment) must not keep a team out for the next STALE_RUNS (on the H100's host, quiet,
    selfie_segmentation at 16 threads ran on one thread at 4.6 ms where a team of 8 took 1.9).
    Samples older than STALE_RUNS runs do not count (the latest always does), so that a team timed
    under a load that has gone wins again after a few probes.  A probe that loses doubles the runs to
    the next one (up to MOST_RUNS_BETWEEN_PROBES: probing a stalling team every tenth run made the runs
    1.8x slower on average than one thread alone, and probing a team 1.45x slower every tenth run cost
    MobileNetV2 at 2 threads here 11% of its mean time and 40% at p90, three runs in twelve off the leader);
    one that wins, a change of leader, or a leader's run over twice its average (a load arriving) brings
    them back to PROBE_EVERY, the last probing at once.  Between probes the leader runs without a load reading
    or a ranking (~8 us a run on the 2-core VM, a fifth of an empty model's run); the run after a probe or a
    trial ranks again.  ``limit_team(n)`` caps the native loops' team for the run (native.limit_team).
    """

    PROBE_EVERY = 10
    MOST_RUNS_BETWEEN_PROBES = 80
    SAMPLES = 8
    STALE_RUNS = 100

    def __init__(self, limit_team: Callable[[int], None] | None = None, blas: bool = True, team: int = 1) -> None:
        self.samples: dict[int, deque] = {}  # team size -> seconds of its last runs
        self.sampled_at: dict[int, deque] = {}  # team size -> the run numbers of those samples
        self.runs = self.probes = 0
        self.probe_every, self.next_probe = self.PROBE_EVERY, self.PROBE_EVERY
        self.leader: int | None = None
        self.probing: int | None = None  # the team of the probe under way
        self.last_team: int | None = None  # the team of the last run
        self.trying = False  # whether the probe under way is a team's first trial
        self.ranked = False  # whether the leader was ranked since the last probe or trial ended
        self.limit_team = limit_team
        self.blas = blas  # whether the kernels may call BLAS (else its thread count is left alone)
        self.team = team  # the native loops' team of the partition (native.partition_team)

    def candidates(self) -> list[int]:
        """The teams worth timing now, largest first: whole, what the load leaves, half of that, one.  What the
        load leaves is rounded down to a quarter of the team, so that a reading that flickers (15, 13, 14 on
        a quiet 16 cores) does not make every run a first trial of another size."""
        quarter = max(1, self.team // 4)
        spare = max(1, min(self.team, free_cores(spinning=team_spinning())) // quarter * quarter)
        return sorted({self.team, spare, max(1, spare // 2), 1}, reverse=True)

    def _next(self) -> int:
        self.runs += 1
        if self.runs == 1:
            return self.team  # a first run pays for first-touch memory: not a fair sample
        if self.probing is not None:
            return self.probing  # a probe's or a trial's second run (see __call__)
        if self.ranked and self.runs < self.next_probe:
            return self.leader  # between probes the load is not read (a reading and a ranking cost ~8 us a run)
        teams, self.ranked = self.candidates(), True
        for team in teams:
            if len(self.samples.get(team, ())) < 2:
                self.probing, self.trying = team, True  # a first trial, two runs as a probe (see __call__)
                return team
        ranked = sorted(teams, key=self.average)
        if ranked[0] != self.leader:
            self.leader, self.probe_every = ranked[0], self.PROBE_EVERY
            self.next_probe = min(self.next_probe, self.runs + self.probe_every)
        if self.runs < self.next_probe or len(ranked) == 1:
            return ranked[0]
        self.probes += 1  # the others in turn, so a team that lost under a passing load can win again
        self.probing = ranked[1 + self.probes % (len(ranked) - 1)]
        return self.probing

    def _probed(self, seconds: float) -> None:
        """After a probe: the runs to the next one, doubled where it lost (see the class docstring)."""
        lost = self.leader is not None and seconds > self.average(self.leader)
        self.probe_every = min(2 * self.probe_every, self.MOST_RUNS_BETWEEN_PROBES) if lost else self.PROBE_EVERY
        self.next_probe, self.probing = self.runs + self.probe_every, None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        team = self._next()
        if self.limit_team is not None:
            self.limit_team(team)
        token = _SHARING.set(team > 1)
        start = time.perf_counter()
        try:
            with blas_threads(1) if self.blas else contextlib.nullcontext():
                yield
        finally:
            _SHARING.reset(token)
            end = time.perf_counter()
            if team > 1:
                _RELEASED[:] = [end, team - 1]
        # Only a run on the team of the run before is a sample: the first on another team size wakes the
        # threads the last one left asleep, and that is the change's cost, not the team's (on the H100's
        # host, quiet, MobileNetV2 int8: a probe of 16 threads after runs on one took 70-78 ms where 16 take
        # under 1 once settled, and the choice kept one thread, 9-12 ms a run, for a hundred runs).  So a
        # probe (and a team's first trial) lasts two runs, and the leader's first run after it is not a sample:
        # a trial of a single run, on a reading that flickered back at once, left the team unsampled and
        # tried again on every flicker.
        settled, self.last_team = team == self.last_team, team
        if self.runs > 1 and settled:
            # (over twice the least sample first: a cheap test that most runs fail, before the average's)
            slowed = team == self.leader and self.probing is None and bool(self.samples.get(team)) \
                and end - start > 2 * min(self.samples[team]) and end - start > 2 * self.average(team)
            self._sample(team, end - start)
            if self.probing == team and self.trying:
                self.probing, self.trying, self.ranked = None, False, False
            elif self.probing == team:
                self._probed(end - start)
                self.ranked = False
            elif slowed:  # a load may have come: the others are probed again from the next run
                self.probe_every, self.next_probe = self.PROBE_EVERY, self.runs + 1

    def _sample(self, team: int, seconds: float) -> None:
        """Keep a run's time.  One at most half the fastest of the team's samples so far marks a change:
        those were taken under a load that has gone, and are dropped.  A team that stalled at its trial
        (palm_detection_lite at 2 threads here, the first runs after compiling beside LiteRT: 49 and 53 ms
        where the team takes 3.6) was otherwise kept out for STALE_RUNS runs, its probes' fast runs
        averaged with the stalls: one thread, 6.5 ms a run, all through a 20-run benchmark.  A team that
        stalls now and then keeps fast samples among its slow ones, so a fast run changes nothing there."""
        samples = self.samples.setdefault(team, deque(maxlen=self.SAMPLES))
        at = self.sampled_at.setdefault(team, deque(maxlen=self.SAMPLES))
        if samples and seconds <= 0.5 * min(samples):
            samples.clear()
            at.clear()
        samples.append(seconds)
        at.append(self.runs)

    def average(self, team: int) -> float:
        """Seconds a run of ``team`` takes on average, over its samples of the last STALE_RUNS runs but
        the slowest (see the class docstring)."""
        recent = [seconds for seconds, run in zip(self.samples[team], self.sampled_at[team])
                  if run > self.runs - self.STALE_RUNS] or [self.samples[team][-1]]
        kept = sorted(recent)[:-1] if len(recent) >= 3 else recent
        return math.fsum(kept) / len(kept)


def loaded_openblas() -> list[ctypes.CDLL]:
    """Every OpenBLAS already loaded in the process (numpy's, scipy's), Linux only."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "openblas" in line.lower()}
    except OSError:
        return []
    libraries = []
    for path in sorted(p for p in paths if ".so" in os.path.basename(p)):
        try:
            libraries.append(ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY))
        except OSError:
            continue
    return libraries


def _openblas_thread_controls() -> list[tuple[Callable[[], int], Callable[[int], None]]]:
    """(get, set) thread-count functions of every loaded OpenBLAS."""
    controls = []
    for lib in loaded_openblas():
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


class _BlasThreads:
    """``with blas_threads(n)``: every loaded OpenBLAS runs on ``n`` threads inside, then gets its
    own count back.  Nested and concurrent holds share the first one's count; the last to
    leave restores."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.controls: list | None = None
        self.holders = 0
        self.saved: list[int] = []

    @contextlib.contextmanager
    def __call__(self, count: int) -> Iterator[None]:
        with self.lock:
            if self.controls is None:
                self.controls = _openblas_thread_controls()
            if self.holders == 0:
                self.saved = [get() for get, _ in self.controls]
                for _, put in self.controls:
                    put(count)
            self.holders += 1
        try:
            yield
        finally:
            with self.lock:
                self.holders -= 1
                if self.holders == 0:
                    for (_, put), saved in zip(self.controls, self.saved):
                        put(saved)


blas_threads = _BlasThreads()
