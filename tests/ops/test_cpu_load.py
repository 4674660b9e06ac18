"""The CPU kernels under load: native teams no larger than the cores the process may use, and no
larger than the cores the machine's load leaves it at each run."""

import contextlib
import os
import threading
import time
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from delegate import CompileOptions, read_model
from delegate.partition import make_partition
from delegate.plugins import default_manager
from delegate.tflite.builder import GraphBuilder
from delegate_cpu.kernels import native, parallel

affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")


def test_free_cores_leave_out_other_runnable_tasks(monkeypatch):
    monkeypatch.setattr(parallel, "available_cores", lambda: 4)
    monkeypatch.setattr(parallel, "_CPUS", 4)
    assert parallel.free_cores("0.20 0.10 0.05 1/310 4242\n") == 4  # only the caller runs
    assert parallel.free_cores("5.00 4.00 3.00 3/310 4242\n") == 2  # two others
    assert parallel.free_cores("9.00 9.00 9.00 12/310 4242\n") == 1  # oversubscribed: the caller alone
    assert parallel.free_cores("unreadable") == 4
    monkeypatch.setattr(parallel, "_CPUS", 16)  # others may run on cores outside the affinity
    assert parallel.free_cores("5.00 4.00 3.00 3/310 4242\n") == 4
    monkeypatch.setattr(parallel, "_CPUS", 4)
    # this process's own workers, still spinning from its last run, are no load; at most the others go
    assert parallel.free_cores("5.00 4.00 3.00 4/310 4242\n", spinning=3) == 4
    assert parallel.free_cores("5.00 4.00 3.00 4/310 4242\n", spinning=1) == 2
    assert parallel.free_cores("5.00 4.00 3.00 1/310 4242\n", spinning=3) == 4


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="no /proc/loadavg here")
def test_free_cores_read_the_load_each_time():
    """/proc/loadavg is read through one kept descriptor, afresh each call: the last task id it names
    is at least that of a thread started between two reads."""
    before = parallel._read_loadavg().split()
    thread = threading.Thread(target=time.sleep, args=(0.05,))
    thread.start()
    after = parallel._read_loadavg().split()
    thread.join()
    assert len(before) == len(after) == 5 and int(after[4]) >= thread.native_id
    assert 1 <= parallel.free_cores() <= parallel.available_cores()


def test_runs_try_the_whole_team_the_spare_cores_half_of_them_and_one_thread(monkeypatch):
    """Each run caps the native team at one of the candidates, each tried before any is chosen; kernels share
    their chunks with helper threads on every team of more than one thread.  (On the machine's own clock an
    empty run's time is jitter, and a run at half a team's fastest drops its samples: 3 runs in 40 left a team
    unsampled after 12.)"""
    monkeypatch.setattr(parallel, "free_cores", lambda spinning=0: 6)
    monkeypatch.setattr(parallel, "available_cores", lambda: 16)
    clock = _Clock(lambda team: 1.0)
    monkeypatch.setattr(parallel.time, "perf_counter", clock.perf_counter)
    for team, tried in ((8, {8, 6, 3, 1}), (2, {2, 1}), (1, {1})):
        limits, sharing = [], []

        def limit(size):
            limits.append(size)
            clock.limit(size)
        choice = parallel.ThreadChoice(limit, team=team)
        for _ in range(12):
            with choice():
                sharing.append(parallel._SHARING.get())
                clock.now += 1.0
        assert set(limits) == tried and set(choice.samples) == tried
        assert sharing == [limit > 1 for limit in limits]


class _Clock:
    """perf_counter for ThreadChoice: each run lasts what ``cost`` says for the team it was given."""

    def __init__(self, cost):
        self.now, self.cost, self.team = 0.0, cost, None

    def limit(self, team):
        self.team = team

    def perf_counter(self):
        return self.now

    def run(self, choice):
        with choice():
            self.now += self.cost(self.team)

    def teams(self, choice, settle: int, runs: int) -> list:
        """The teams of ``runs`` runs after ``settle`` others."""
        taken = []
        for i in range(settle + runs):
            self.run(choice)
            taken.append(self.team)
        return taken[settle:]


def _choice_on(monkeypatch, cores: int, cost) -> tuple[_Clock, "parallel.ThreadChoice"]:
    """A thread choice for a team of ``cores`` on a quiet machine of that many, its runs lasting ``cost(team)``."""
    monkeypatch.setattr(parallel, "free_cores", lambda spinning=0: cores)
    monkeypatch.setattr(parallel, "available_cores", lambda: cores)
    clock = _Clock(cost)
    monkeypatch.setattr(parallel.time, "perf_counter", clock.perf_counter)
    return clock, parallel.ThreadChoice(clock.limit, team=cores)


def test_the_fastest_team_wins_and_the_others_are_probed_again(monkeypatch):
    """A load reading that counts this process's own spinning threads (LiteRT's pool after its run) says the
    machine is full; where the whole team is still fastest the runs take it.  Under a busy process the team
    the load leaves can lose to half of it (the scheduler now and then wakes a worker beside the busy
    process and the team waits for it), and when that load goes the whole team wins again through the probes."""
    monkeypatch.setattr(parallel, "free_cores", lambda spinning=0: 1)
    monkeypatch.setattr(parallel, "available_cores", lambda: 16)
    clock = _Clock(lambda team: {16: 1.0, 1: 6.0}[team])
    monkeypatch.setattr(parallel.time, "perf_counter", clock.perf_counter)
    choice = parallel.ThreadChoice(clock.limit, team=16)
    teams = clock.teams(choice, 10, 30)
    assert teams.count(16) >= 27 and 1 in teams  # probes of the others now and then

    monkeypatch.setattr(parallel, "free_cores", lambda spinning=0: 15)  # one core busy for real
    clock.cost = lambda team: {16: 30.0, 12: 20.0, 6: 1.5, 1: 6.0}[team]  # 15 free, rounded to a quarter
    assert clock.teams(choice, 60, 20).count(6) >= 17

    clock.cost = lambda team: {16: 1.0, 12: 1.2, 6: 1.5, 1: 6.0}[team]  # the load is gone
    assert clock.teams(choice, choice.STALE_RUNS + 2 * choice.MOST_RUNS_BETWEEN_PROBES, 20).count(16) >= 17


def test_a_flickering_reading_on_many_cores_keeps_to_few_team_sizes(monkeypatch):
    """Readings of 13 to 16 free cores for a team of 16 give the same candidates as 12 (a quarter's steps)."""
    readings = iter([16, 15, 13, 14] * 50)
    monkeypatch.setattr(parallel, "free_cores", lambda spinning=0: next(readings))
    choice = parallel.ThreadChoice(lambda team: None, team=16)
    for _ in range(40):
        with choice():
            pass
    assert set(choice.samples) <= {16, 12, 8, 6, 1}


def test_a_flickering_load_reading_keys_samples_by_the_team_taken(monkeypatch):
    """The load reading flickers (on a quiet 2-core VM between 2 and 1 free cores): a run that the reading
    gave the whole team is a sample of the whole team.  Kept as samples of a "spare cores" mode, fast ones
    ranked that mode first and the next runs, capped at one core, ran 1.5x slower (MobileNetV2 fp32 at 2
    threads: 7.4 ms against 4.8 for streaks of tens of runs)."""
    readings = iter([2, 1] * 100)
    monkeypatch.setattr(parallel, "free_cores", lambda spinning=0: next(readings))
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    clock = _Clock(lambda team: {2: 1.0, 1: 1.6}[team])
    monkeypatch.setattr(parallel.time, "perf_counter", clock.perf_counter)
    choice = parallel.ThreadChoice(clock.limit, team=2)
    assert clock.teams(choice, 10, 40).count(2) >= 40 - 2 * (40 // choice.PROBE_EVERY) - 1  # all but probes (2 runs)
    assert np.allclose(choice.samples[2], 1.0) and np.allclose(choice.samples[1], 1.6)


def test_a_runs_own_spinning_workers_are_not_load_for_the_next(monkeypatch):
    """Back to back, the last run's workers still spin and the kernel counts them runnable: on the H200's
    16 cores runs read 15 runnable tasks and took a team of one (MobileNetV2 int8 at 16 threads: 9.1 ms
    against 1.8 ms with other work between runs).  Right after a shared run its workers are not counted;
    once their spin is over, whatever runs counts again."""
    monkeypatch.setattr(parallel, "available_cores", lambda: 16)
    monkeypatch.setattr(parallel, "_CPUS", 16)
    monkeypatch.setattr(parallel, "_read_loadavg", lambda: "1.00 1.00 1.00 16/310 4242\n")  # 15 besides us
    limits = []
    choice = parallel.ThreadChoice(limits.append, team=16)
    monkeypatch.setattr(parallel, "_RELEASED", [float("-inf"), 0])
    assert choice.candidates() == [16, 1]  # nothing of ours spins yet, so the 15 count as load
    with choice():  # the first run takes the whole team; its 15 workers spin after it
        pass
    assert limits == [16]
    parallel._RELEASED[:] = [time.perf_counter(), 15]  # a shared run of 16 just ended
    assert parallel.team_spinning() == 15 and parallel.free_cores(spinning=parallel.team_spinning()) == 16
    parallel._RELEASED[0] -= 2 * parallel.SPIN_WINDOW_S
    assert parallel.team_spinning() == 0 and parallel.free_cores(spinning=parallel.team_spinning()) == 1


@pytest.mark.skipif(native.native_loops() is None, reason="the native loops do not build here")
def test_team_limit_caps_every_loop():
    loops = native.native_loops()
    x = np.random.default_rng(0).standard_normal((64, 256), np.float32)
    rhs = native.PackedOperand(np.random.default_rng(1).standard_normal((256, 48)).astype(np.float32),
                               loops.panel_lanes)
    shared, alone = np.empty((64, 48), np.float32), np.empty((64, 48), np.float32)
    try:
        loops.packed_product(x, rhs, shared, 4)
        native.limit_team(1)
        assert loops.library.get_team_limit() == 1
        loops.packed_product(x, rhs, alone, 4)
    finally:
        native.limit_team(1 << 30)
    np.testing.assert_array_equal(shared, alone)


def _conv_model() -> bytes:
    b = GraphBuilder()
    x = b.input("x", (1, 64, 64, 64), "float32")
    w = b.const("w", np.ones((64, 3, 3, 64), np.float32))
    b.output(b.op("CONV_2D", [x, w], options={"padding": "SAME", "stride_h": 1, "stride_w": 1}))
    return b.to_bytes()


TEAM_UNDER_AFFINITY = """
import os, sys
from delegate import CompileOptions, read_model
from delegate.partition import make_partition
from delegate.plugins import default_manager
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
g = read_model(open(sys.argv[1], "rb").read()).main
be = default_manager().backend_info("cpu").factory({})
print(be.compile(make_partition(g, g.ops, "cpu", 0), CompileOptions(num_threads=4)).describe()["native_team"])
"""


@affinity
def test_team_follows_a_restricted_affinity(tmp_path):
    """Asked for 4 threads on one allowed core, a partition's team is that one core; with every core
    allowed, as many as its work and the cores give."""
    model = tmp_path / "conv.tflite"
    model.write_bytes(_conv_model())
    done = subprocess.run([sys.executable, "-c", TEAM_UNDER_AFFINITY, str(model)], capture_output=True, text=True,
                          cwd=Path(__file__).parents[2], timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "1"
    g = read_model(model.read_bytes()).main
    be = default_manager().backend_info("cpu").factory({})
    team = be.compile(make_partition(g, g.ops, "cpu", 0), CompileOptions(num_threads=4)).describe()["native_team"]
    assert team == min(4, len(os.sched_getaffinity(0)))


@pytest.mark.parametrize("threads", [1, 2])
def test_blas_is_held_to_one_thread_only_where_a_kernel_may_call_it(monkeypatch, threads):
    """A partition whose kernels are all native calls leaves BLAS's thread count alone during runs (they
    never call it); with a numpy kernel (a TILE) each run holds it to one thread."""
    import delegate_cpu.plugin as plugin
    from delegate.partition import make_partition
    from delegate.plugins import default_manager

    held = []

    @contextlib.contextmanager
    def recording(count):
        held.append(count)
        yield
    monkeypatch.setattr(plugin, "blas_threads", recording)
    monkeypatch.setattr(parallel, "blas_threads", recording)
    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 16), "float32")
    conv = b.op("CONV_2D", [x, b.const("w", np.ones((16, 1, 1, 16), np.float32))],
                options={"padding": "SAME", "stride_h": 1, "stride_w": 1})
    b.output(conv, b.op("TILE", [conv, b.const("multiples", np.array([1, 1, 1, 2], np.int32))], shape=(1, 8, 8, 32)))
    g = read_model(b.to_bytes()).main
    be = default_manager().backend_info("cpu").factory({})
    for ops, holds in ((g.ops[:1], native.native_loops() is None), (g.ops, True)):
        held.clear()
        compiled = be.compile(make_partition(g, ops, "cpu", 0), CompileOptions(num_threads=threads))
        compiled.run({g.inputs[0].index: np.ones((1, 8, 8, 16), np.float32)})
        assert held == ([1] if holds else [])


def test_a_team_that_stalls_now_and_then_loses_to_one_thread(monkeypatch):
    """Beside a busy process a team of 2 on 2 cores is fast in most runs and waits for a descheduled worker
    in the others (measured: p50 1.5 ms, p90 41 ms, mean 8.4 ms; one thread 2.4 ms): ranked by the median
    it kept the team; by the average over its last runs one thread wins, and the team is still probed."""
    runs = {2: 0}

    def cost(team):
        if team == 1:
            return 2.4
        runs[2] += 1
        return 41.0 if runs[2] % 4 == 0 else 1.5  # one run in four stalls
    clock, choice = _choice_on(monkeypatch, 2, cost)
    teams = clock.teams(choice, 20, 40)
    assert teams.count(1) >= 34 and 2 in teams


def test_a_rare_stall_does_not_keep_the_fastest_team_out(monkeypatch):
    """On the H100's host, quiet, a run now and then waits tens of ms (a driver thread took a core): by the
    plain average of its last runs a team of 8 that stalled once lost to one thread for the next hundred
    runs (selfie_segmentation at 16 threads: 4.6 ms a run where the team takes 1.9).  The slowest sample
    of a team's window is left out."""
    runs = {8: 0}

    def cost(team):
        if team == 8:
            runs[8] += 1
            return 27.0 if runs[8] == 6 else 1.9  # one stall, early
        return {16: 2.1, 1: 4.6}[team]
    clock, choice = _choice_on(monkeypatch, 16, cost)
    assert clock.teams(choice, 10, 100).count(8) >= 85


def test_a_team_that_stalled_only_at_its_trial_wins_at_its_next_probe(monkeypatch):
    """The first runs of a team of 2 after compiling, beside LiteRT, stalled (49 and 53 ms where it takes 3.6;
    one thread 6.5): its probes' fast runs were averaged with the stalls and one thread was kept through a
    20-run benchmark.  A run at most half the team's fastest sample drops the samples before it."""
    runs = {2: 0}

    def cost(team):
        if team == 1:
            return 6.5
        runs[2] += 1
        return 50.0 if runs[2] <= 3 else 3.6  # the first run and the trial's two stall
    clock, choice = _choice_on(monkeypatch, 2, cost)
    teams = clock.teams(choice, 0, 40)
    first_probe = teams.index(2, 3)  # after the first run and the trial
    assert first_probe <= choice.PROBE_EVERY + 4
    assert teams[first_probe + 2:].count(2) >= len(teams[first_probe + 2:]) - 4
    assert list(choice.samples[2]) and max(choice.samples[2]) < 4.0


def test_the_first_runs_after_a_change_of_team_are_not_samples(monkeypatch):
    """The first run on another team size wakes the threads the last one left asleep: that cost is the
    change's, not the team's.  On the H100's host a probe of 16 threads after runs on one took 70-78 ms
    (0.73 ms once settled), and the thread choice kept one thread (9-12 ms a run) for a hundred runs; the
    leader's first run after a probe paid it too (8 threads: 5.3-5.9 ms against 2.1).  A probe lasts two runs
    and only the second is a sample; the leader's first run after it is not one."""
    monkeypatch.setattr(parallel, "free_cores", lambda spinning=0: 16)
    monkeypatch.setattr(parallel, "available_cores", lambda: 16)
    last = [None]

    def cost(team):
        woken = 70.0 if last[0] is not None and team > last[0] else 0.0  # waking the threads left asleep
        last[0] = team
        return {16: 0.73, 8: 2.1, 1: 9.5}[team] + woken
    clock = _Clock(cost)
    monkeypatch.setattr(parallel.time, "perf_counter", clock.perf_counter)
    choice = parallel.ThreadChoice(clock.limit, team=16)
    teams = clock.teams(choice, 20, 100)
    assert teams.count(16) >= 100 - 2 * (100 // choice.PROBE_EVERY) - 2
    assert max(choice.samples[16]) < 1.0 and max(choice.samples[8]) < 3.0


def test_a_flickering_reading_tries_each_team_once(monkeypatch):
    """A reading that flickers between a quiet 16 and 13 free cores gives two sets of candidates.  A trial of a
    single run was not a sample (the change's run) and a flicker back left the team untried: it was tried
    again on every flicker (the H100's host: 20 runs of 160 on a team of 6 at twice the whole team's time)."""
    readings = iter([16, 13] * 200)
    monkeypatch.setattr(parallel, "free_cores", lambda spinning=0: next(readings))
    monkeypatch.setattr(parallel, "available_cores", lambda: 16)
    clock = _Clock(lambda team: {16: 1.2, 12: 1.5, 8: 1.8, 6: 2.3, 1: 8.3}[team])
    monkeypatch.setattr(parallel.time, "perf_counter", clock.perf_counter)
    choice = parallel.ThreadChoice(clock.limit, team=16)
    teams = clock.teams(choice, 0, 160)
    assert teams.count(16) >= 160 - 2 * (160 // choice.PROBE_EVERY) - 3 * 4 - 1  # probes, and 4 teams' trials


def test_a_team_that_keeps_losing_its_probes_is_probed_less_often(monkeypatch):
    """On a quiet 2-core VM one thread ran MobileNetV2 1.45x slower than two: probed every tenth run (each probe
    two runs, and the leader's first run after it waking its threads), three runs in twelve were off the leader,
    11% of the mean time and 40% at p90.  A probe that loses doubles the runs to the next, up to
    MOST_RUNS_BETWEEN_PROBES; a load arriving still turns the choice within a few runs (the leader's run over
    twice its average probes again at once)."""
    clock, choice = _choice_on(monkeypatch, 2, lambda team: {2: 1.0, 1: 1.45}[team])
    teams = clock.teams(choice, 20, 300)
    assert teams.count(1) <= 2 * (300 // choice.MOST_RUNS_BETWEEN_PROBES + 3)  # ~60 at a probe every tenth run
    clock.cost = lambda team: {2: 4.0, 1: 1.45}[team]  # a busy process: the team of 2 stalls
    assert clock.teams(choice, 12, 40).count(1) >= 36


def test_the_leader_runs_between_probes_without_reading_the_load(monkeypatch):
    """A load reading and a ranking cost ~8 us a run (a fifth of an empty model's run on the 2-core VM):
    between probes the leader runs without them, and the run after a probe ranks again."""
    readings = []
    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    clock = _Clock(lambda team: {2: 1.0, 1: 2.0}[team])
    monkeypatch.setattr(parallel.time, "perf_counter", clock.perf_counter)
    monkeypatch.setattr(parallel, "free_cores", lambda spinning=0: readings.append(1) or 2)
    choice = parallel.ThreadChoice(clock.limit, team=2)
    teams = clock.teams(choice, 10, 200)
    assert teams.count(2) >= 190  # the fastest team keeps the lead
    # a reading at most on each probe's first run and on the run after its last, not on every run
    assert choice.probes >= 2 and len(readings) <= 10 + 2 * (choice.probes + 2)
