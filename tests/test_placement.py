"""Placement by measurement: candidate plans, costs of what backends really do, the measured search and its
stored decisions, calibration that refuses what it cannot measure, and profiles refitted to measurements."""

import dataclasses
import json
import time
import types
from dataclasses import replace

import numpy as np
import pytest

from delegate import CompileOptions, read_model, zoo
from delegate import plan_search
from delegate.backend import HOST, Backend, Support
from delegate.cost import ACCELERATOR_DEFAULT, DeviceProfile, Observation, cost_class, fingerprint, load_profile, \
    op_bytes, op_flops, profile_info, refit, refit_plan, save_profile
from delegate.errors import CacheError, MeasurementError, PluginError
from delegate.planner import PlacementSettings, Planner
from delegate.session import RunSettings, Session
from delegate.tflite.builder import GraphBuilder
from delegate.tools import calibrate

from tests.test_planner import CPU_DEFAULTS, make_planner


SHAPE = (1, 64, 64, 32)


def elementwise_model(scale=1.0):
    return read_model(elementwise_bytes(scale))


def elementwise_bytes(scale=1.0):
    """Twelve elementwise ops on 512 KiB: enough work that the fake accelerator's estimates win."""
    b = GraphBuilder()
    y = b.input("x", SHAPE)
    c = b.const("c", np.full((SHAPE[-1],), scale, np.float32))
    for _ in range(3):
        y = b.op("ADD", [y, c], options={"fused_activation_function": "NONE"})
        y = b.op("MUL", [y, c], options={"fused_activation_function": "NONE"})
        y = b.op("RELU", [y])
        y = b.op("TANH", [y])
    b.output(y)
    return b.to_bytes()


@pytest.fixture
def profile_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DELEGATE_PROFILE_DIR", str(tmp_path))
    return tmp_path


def chain_problem(n=6):
    b = GraphBuilder()
    x = b.input("x", (1, 8))
    for _ in range(n):
        x = b.op("RELU", [x])
    b.output(x)
    return read_model(b.to_bytes()).main


def test_candidates_cover_the_single_backends_and_are_distinct():
    graph = chain_problem()
    # ops 0,1 and 4,5 run well on the accelerator, 2,3 it cannot run: greedy makes two partitions
    planner = make_planner({0, 1, 4, 5}, [1.0] * 6, [0.1] * 6, 0.01)
    plan = planner.plan(graph)
    names = [c.name for c in plan.candidates]
    assert names[0] == "cpu" and "greedy:gpu" in names
    assigned = [tuple(sorted(c.assignment.items())) for c in plan.candidates]
    assert len(set(assigned)) == len(assigned), "no candidate twice"
    for c in plan.candidates:
        assert c.estimated_ms == pytest.approx(planner.evaluate(graph, c.assignment, planner.capabilities(graph)[0])[0])
    # from estimates: the best single backend, unless a split plan is estimated clearly (0.8x) faster
    single = min((c for c in plan.candidates if c.baseline), key=lambda c: c.estimated_ms)
    split = min(plan.candidates, key=lambda c: c.estimated_ms)
    expected = split if split.estimated_ms < planner.SPLIT_MARGIN * single.estimated_ms else single
    assert plan.chosen == expected.name and plan.estimated_ms == pytest.approx(expected.estimated_ms)
    assert plan.choice in ("lowest estimate of a single backend", "estimated under 0.8x the best single backend")


def test_a_split_plan_must_win_clearly():
    """From estimates, a plan splitting the model between backends (other than LiteRT's greedy rule) is taken
    only when estimated clearly faster than every single backend: its boundaries are the least certain."""
    graph = chain_problem()
    everything = set(range(6))
    # ops 2,3 are cheaper on the CPU: the min cut splits the model, for a little less than greedy's all-GPU plan
    barely = make_planner(everything, [1.0, 1.0, 0.5, 0.5, 1.0, 1.0], [0.8] * 6, 0.0).plan(graph)
    split = min(barely.candidates, key=lambda c: c.estimated_ms)
    assert not split.baseline and split.estimated_ms < barely.estimated_ms
    assert barely.chosen == "greedy:gpu" and barely.choice == "lowest estimate of a single backend"
    clearly = make_planner(everything, [1.0, 1.0, 0.1, 0.1, 1.0, 1.0], [0.5] * 6, 0.0).plan(graph)
    assert clearly.choice == "estimated under 0.8x the best single backend"
    assert [p.backend for p in clearly.partitions] == ["gpu", "cpu", "gpu"]


def test_partition_boundaries_cost_their_fixed_overhead():
    graph = chain_problem()
    planner = make_planner({0, 1, 4, 5}, [1.0] * 6, [0.1] * 6, 0.0)
    costs, _ = planner.capabilities(graph)
    split = {0: "gpu", 1: "gpu", 2: "cpu", 3: "cpu", 4: "gpu", 5: "gpu"}
    without = {**planner.profiles}
    total, _ = planner.evaluate(graph, split, costs)
    ops_only = sum(costs[i][b] for i, b in split.items())
    expected_fixed = 2 * ACCELERATOR_DEFAULT.partition_us * 1e-3 + CPU_DEFAULTS["numpy"].partition_us * 1e-3 + \
        CPU_DEFAULTS["numpy"].run_us * 1e-3  # and the host's cost of one run
    assert total == pytest.approx(ops_only + expected_fixed + sum(c.ms for c in planner.evaluate(graph, split, costs)[1]))
    assert without  # the planner's profiles are the defaults here
    # a gain smaller than two boundaries is not worth taking: everything stays on the CPU
    small_gain = make_planner({0, 1, 4, 5}, [0.03] * 6, [0.01] * 6, 0.0)
    assert all(p.backend == "cpu" for p in small_gain.plan(graph).partitions)


def test_trimmed_candidate_returns_partitions_that_do_not_pay():
    graph = chain_problem()
    # op 0 saves little, ops 4,5 save a lot: trimming greedy keeps only the second partition
    cpu = [0.2, 0.2, 1.0, 1.0, 5.0, 5.0]
    gpu = [0.19, 0.19, 1.0, 1.0, 0.1, 0.1]
    planner = make_planner({0, 1, 4, 5}, cpu, gpu, 0.001, PlacementSettings(max_delegated_partitions=0))
    plan = planner.plan(graph)
    greedy = planner.greedy(graph, "gpu", planner.capabilities(graph)[0])
    trimmed, notes = planner.trim(graph, dict(greedy), planner.capabilities(graph)[0], [])
    assert [i for i, b in sorted(trimmed.items()) if b == "gpu"] == [4, 5]
    assert notes == ["partition of 2 op(s) starting at op #0 returned to cpu: it did not pay for its copies and "
                     "boundaries"]
    # the trimmed plan is among the candidates (under whichever name reached it first)
    assert any(c.assignment == trimmed for c in plan.candidates)


def test_cpu_costs_nothing_for_what_it_folds():
    from delegate_cpu.plugin import CpuBackend

    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 4))
    w16 = b.const("w16", np.ones((4, 1, 1, 4), np.float16))
    w = b.op("DEQUANTIZE", [w16])
    y = b.op("CONV_2D", [x, w, b.const("bias", np.zeros(4, np.float32))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "NONE"})
    y = b.op("RELU", [y])
    y = b.op("TANH", [y])
    b.output(y)
    graph = read_model(b.to_bytes()).main
    cpu = CpuBackend({"engine": "numpy"})
    cpu.role = HOST
    planner = Planner({"cpu": cpu}, {"cpu": CPU_DEFAULTS["numpy"]}, CompileOptions())
    costs, _ = planner.capabilities(graph)
    by_code = {op.opcode: costs[op.index]["cpu"] for op in graph.ops}
    assert by_code["DEQUANTIZE"] == 0.0  # constant: folded at compile time
    assert by_code["RELU"] == 0.0  # the convolution's epilogue applies it
    assert by_code["CONV_2D"] > 0 and by_code["TANH"] > 0  # costed by the roofline


def run_settings(search, preference="fast_single_answer", delay_ms=100.0):
    return RunSettings(backends=[("fakegpu", {"delay_ms": delay_ms}), ("cpu", {"engine": "numpy"})],
                       compile=CompileOptions(inference_preference=preference),
                       placement=PlacementSettings(search=search, budget_s=5.0))


def test_measured_search_overrules_wrong_estimates_and_is_stored(profile_dir, monkeypatch):
    model = elementwise_model()
    estimated = Session(model, run_settings("estimate"))
    assert estimated.plan.chosen == "greedy:fakegpu"  # its estimates claim 1 us per op
    measured = Session(model, run_settings("measure"))
    plan = measured.plan
    assert plan.chosen == "cpu" and plan.choice == "fastest measured now"
    times = {c.name: c.measured_ms for c in plan.candidates}
    assert times["greedy:fakegpu"] > 100.0 > times["cpu"]  # the fake device sleeps 100 ms a run
    assert measured.run({"x": np.ones(SHAPE, np.float32)})
    # the next load (fast_single_answer, search auto) takes the stored decision without measuring
    monkeypatch.setattr(plan_search, "measure", lambda *a, **k: pytest.fail("measured again"))
    again = Session(model, run_settings("auto"))
    assert again.plan.chosen == "cpu" and again.plan.choice.startswith("stored measured decision of")
    assert {c.name: c.measured_ms for c in again.plan.candidates} == pytest.approx(times, rel=1e-3)
    # other weights are another model: nothing stored for it, so it plans from estimates
    other = Session(elementwise_model(2.0), run_settings("auto"))
    assert other.plan.chosen == "greedy:fakegpu" and other.plan.choice == "lowest estimate of a single backend"
    stored = list((profile_dir / "decisions").glob("*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["chosen"] == "cpu"


def test_a_stored_decision_is_taken_without_searching_the_splits_again(profile_dir, monkeypatch):
    """A load with a decision stored plans the single backends and takes the decision's other candidates as it
    stored them: the split search (most of such a load's choice) does not run.  A decision whose plan puts an op
    where it no longer runs is matched against the whole search instead, and not taken."""
    model = elementwise_model()
    measured = Session(model, run_settings("measure"))
    times = {c.name: c.measured_ms for c in measured.plan.candidates}
    assert measured.plan.chosen == "cpu" and len(times) == 2  # the single backends
    real = Planner.splits
    monkeypatch.setattr(Planner, "splits", lambda *a, **k: pytest.fail("searched the splits again"))
    again = Session(model, run_settings("auto"))
    assert again.plan.chosen == "cpu" and again.plan.choice.startswith("stored measured decision of")
    assert {c.name: c.measured_ms for c in again.plan.candidates} == pytest.approx(times, rel=1e-3)
    assert again.run({"x": np.ones(SHAPE, np.float32)})
    path = next((profile_dir / "decisions").glob("*.json"))
    doc = json.loads(path.read_text())
    doc["assignment"] = {k: "npu" for k in doc["assignment"]}  # no such backend now
    path.write_text(json.dumps(doc))
    searched = []
    monkeypatch.setattr(Planner, "splits", lambda self, *a, **k: searched.append(1) or real(self, *a, **k))
    other = Session(model, run_settings("auto"))
    assert searched and not other.plan.choice.startswith("stored measured decision of")


def test_a_stored_decisions_other_candidates_are_rebuilt_as_stored_where_they_still_run():
    from delegate.planner import Candidate
    cpu = Candidate("cpu", {0: "cpu", 1: "cpu"}, 2.0, baseline=True, host_alone=True)
    doc = {"chosen": "cost:gpu", "precision": "", "assignment": {"0": "gpu", "1": "cpu"},
           "candidates": [{"name": "cpu", "precision": "", "estimated_ms": 2.0, "measured_ms": 1.5,
                           "assignment": {"0": "cpu", "1": "cpu"}},
                          {"name": "cost:gpu", "precision": "", "estimated_ms": 1.0, "measured_ms": 0.9,
                           "assignment": {"0": "gpu", "1": "cpu"}},
                          {"name": "cost:gpu fp16", "precision": "fp16", "estimated_ms": 1.0, "measured_ms": 0.95,
                           "assignment": {"0": "gpu", "1": "cpu"}},
                          {"name": "gone", "precision": "", "estimated_ms": 1.0, "assignment": {"0": "npu", "1": "cpu"}},
                          {"name": "broken", "assignment": {"x": "cpu"}}, "not a candidate"]}
    others = plan_search.stored_others(doc, [cpu], lambda c: "npu" not in c.assignment.values())
    assert [(c.name, c.precision, c.assignment) for c in others] == [
        ("cost:gpu", "", {0: "gpu", 1: "cpu"}), ("cost:gpu fp16", "fp16", {0: "gpu", 1: "cpu"})]
    chosen = plan_search.stored_candidate(doc, [cpu] + others)
    assert chosen is others[0] and chosen.measured_ms == 0.9 and cpu.measured_ms == 1.5
    # a decision file damaged since: no plan, or its broken parts left out, never an exception
    assert plan_search.stored_candidate({"assignment": "x"}, [cpu]) is None
    assert plan_search.stored_candidate({"assignment": {"0": "cpu", "1": "cpu"}, "candidates": "junk"}, [cpu]) is cpu
    damaged = {"assignment": {"0": "cpu", "1": "cpu"},
               "candidates": [{"assignment": {"0": "cpu", "1": "cpu"}, "measured_ms": "fast", "compile_s": [1]}]}
    assert plan_search.stored_candidate(damaged, [cpu]) is cpu and cpu.measured_ms is None and cpu.compile_s is None


def test_the_model_fingerprint_covers_quantization_and_weights():
    """The key of stored decisions: per-channel quantization and weights change it (hashed as bytes, not
    printed: printing per-channel arrays took 97 ms of a load)."""
    from delegate.ir import Quantization
    graph = read_model(elementwise_bytes()).main
    base = plan_search.model_fingerprint(graph)
    assert plan_search.model_fingerprint(read_model(elementwise_bytes()).main) == base
    t = graph.inputs[0]
    t.quantization = Quantization(np.array([0.5, 0.25], np.float32), np.array([0, 1], np.int64), axis=3)
    quantized = plan_search.model_fingerprint(graph)
    t.quantization = Quantization(np.array([0.5, 0.25], np.float32), np.array([0, 2], np.int64), axis=3)
    assert len({base, quantized, plan_search.model_fingerprint(graph)}) == 3
    assert plan_search.model_fingerprint(read_model(elementwise_bytes(2.0)).main) != base


def test_sustained_speed_measures_on_first_load(profile_dir):
    session = Session(elementwise_model(), run_settings("auto", preference="sustained_speed"))
    assert session.plan.choice == "fastest measured now" and session.plan.chosen == "cpu"


def test_search_leaves_a_failing_candidate_out(profile_dir):
    settings = run_settings("measure")
    settings.backends = [("fakegpu", {"delay_ms": 0.0, "lose_after": 0}), ("cpu", {"engine": "numpy"})]
    session = Session(elementwise_model(), settings)
    assert session.plan.chosen == "cpu"
    failed = next(c for c in session.plan.candidates if c.name == "greedy:fakegpu")
    assert failed.measured_ms is None
    assert failed.status == "not measured: partition 0 on fakegpu failed: DeviceLost: fake device disappeared"


def test_fingerprint_uses_stable_facts_only():
    facts = {"backend": "opencl", "device": "X", "driver_version": "1", "compute_units": 8, "global_mem_bytes": 1}
    assert fingerprint(facts) == fingerprint({**facts, "global_mem_bytes": 2, "extensions": ["a"]})
    assert fingerprint(facts) != fingerprint({**facts, "driver_version": "2"})


def test_stored_profile_with_broken_figures_is_not_used(profile_dir):
    facts = {"backend": "opencl", "device": "Y"}
    path = save_profile(facts, DeviceProfile(gflops=10, gbytes_per_s=5, launch_us=1, calibrated_at="2026-01-01"))
    assert load_profile(facts, ACCELERATOR_DEFAULT).source == str(path)
    data = json.loads(path.read_text())
    data["gbytes_per_s"] = -3
    path.write_text(json.dumps(data))
    assert load_profile(facts, ACCELERATOR_DEFAULT).source == "default (accelerator)"


def test_calibrated_transfer_figures_outrank_the_plugins_guess(profile_dir):
    """A copy costs what calibrate measured on this device; the plugin's own figure (the fake device's
    0.05 ms + 1 GB/s) stands only where nothing was measured, or calibrate kept the defaults."""
    model = elementwise_model()
    settings = RunSettings(backends=[("fakegpu", {}), ("cpu", {"engine": "numpy"})],
                           placement=PlacementSettings(search="estimate", partitioner="greedy"))
    tensor = model.subgraphs[0].inputs[0]
    guess = 0.05 + tensor.nbytes / 1e9
    session = Session(model, settings)
    assert session.planner.transfer_cost(tensor, "fakegpu") == pytest.approx(guess)
    info = session.backends["fakegpu"].device_info()
    measured = DeviceProfile(gflops=100.0, gbytes_per_s=100.0, launch_us=5.0, asynchronous=True,
                             transfer_latency_us=4.0, transfer_gbytes_per_s=20.0, calibrated_at="2026-12-06 23:00")
    save_profile(info, measured)
    planner = Session(model, settings).planner
    relayout = tensor.nbytes / (planner.profiles["cpu"].gbytes_per_s * 1e9) * 1e3  # NHWC -> the device's PHWC4
    assert planner.transfer_cost(tensor, "fakegpu") == pytest.approx(0.004 + tensor.nbytes / 20e9 * 1e3 + relayout)
    save_profile(info, replace(measured, defaults_kept={"transfers": "unstable"}))
    assert Session(model, settings).planner.transfer_cost(tensor, "fakegpu") == pytest.approx(guess)


def test_calibration_refuses_unstable_or_impossible_figures():
    with pytest.raises(MeasurementError, match="stable and positive"):
        calibrate.stable_difference("x", "b", lambda: 1e-6, lambda: 2e-6)  # the longer run is never longer
    noisy = iter(np.random.default_rng(0).uniform(0, 1e-3, 10_000))
    with pytest.raises(MeasurementError):
        calibrate.stable_difference("x", "b", lambda: next(noisy) + 1e-4, lambda: next(noisy))
    assert calibrate.stable_difference("x", "b", lambda: 3e-6, lambda: 1e-6, 2) == pytest.approx(1e-6)
    too_fast = DeviceProfile(gflops=10, gbytes_per_s=83886.0, launch_us=1, transfer_latency_us=1,
                             transfer_gbytes_per_s=5)
    with pytest.raises(MeasurementError, match="gbytes_per_s"):
        calibrate.check_bounds("wgpu", too_fast, calibrate.bounds_for({"device_type": "gpu"}))
    no_latency = DeviceProfile(gflops=10, gbytes_per_s=5, launch_us=1, transfer_latency_us=0.0,
                               transfer_gbytes_per_s=5)
    with pytest.raises(MeasurementError, match="transfer_latency_us"):
        calibrate.check_bounds("opencl", no_latency, calibrate.bounds_for({"device_type": "gpu"}))


def test_calibration_whose_machine_changed_speed_stores_nothing(profile_dir, monkeypatch):
    """The reference network timed at both ends of a calibration: over SPEED_DRIFT apart, every backend is refused
    and each profile file is as it was before (an older one put back, a new one gone); within it, kept."""
    settings = RunSettings(backends=[("cpu", {"engine": "numpy"})])
    real_reference = calibrate.reference_ms
    backend = Session(read_model(zoo.build("posenet")), settings).backends["cpu"]
    path = save_profile(profile_info(backend, settings.compile.num_threads),
                        DeviceProfile(gflops=3.0, gbytes_per_s=4.0, launch_us=1.0))
    older = path.read_bytes()
    measured = DeviceProfile(gflops=7.0, gbytes_per_s=8.0, launch_us=2.0)
    monkeypatch.setattr(calibrate, "calibrate_backend", lambda backend, options: measured)
    monkeypatch.setattr(calibrate, "fit_to_workloads", lambda settings, name: [])
    for times, kept in (([1.0, 1.3], False), ([1.0, 1.2], True), ([1.3, 1.0], False)):
        path.write_bytes(older)
        ends = iter(times)
        monkeypatch.setattr(calibrate, "reference_ms", lambda settings: next(ends))
        report = calibrate.calibrate_all(settings)
        assert report["speed"]["start_ms"] == times[0] and report["speed"]["end_ms"] == times[1]
        if kept:
            assert not report["refused"] and report["profiles"][0]["gflops"] == 7.0
            assert json.loads(path.read_text())["gflops"] == 7.0
        else:
            assert report["profiles"] == [] and "speed changed" in report["refused"]["cpu"]
            assert path.read_bytes() == older
    path.unlink()
    ends = iter([1.0, 2.0])
    assert "speed changed" in calibrate.calibrate_all(settings)["refused"]["cpu"] and not path.exists()
    assert real_reference(settings) > 0  # the check itself: the first example network timed on the host


def test_the_speed_check_reads_the_fastest_of_its_bursts(monkeypatch):
    """A burst of other work during one of the reference's bursts is not a change of the machine's speed: the
    fastest burst counts, and only a slowdown lasting through all of them shows."""
    from delegate.tools import measure
    settings = RunSettings(backends=[("cpu", {"engine": "numpy"})])
    monkeypatch.setattr(measure, "settle", lambda run: None)
    for bursts, expected in (([3.0, 1.0, 2.0], 1.0), ([2.0, 2.5, 2.0], 2.0)):
        medians = iter(bursts)
        monkeypatch.setattr(measure, "samples_ms", lambda run, runs, warmup=0: [next(medians)] * runs)
        assert calibrate.reference_ms(settings) == expected
        assert next(medians, None) is None  # every burst was timed


def test_calibration_tries_a_larger_size_when_a_small_one_is_drowned_in_jitter(monkeypatch):
    """A device so fast that the small chains' difference is noise (WebGPU on an H200): the next size is
    measured instead of refusing the whole calibration; the largest size's instability is still refused where
    the device cannot time its own kernels."""
    sizes_tried = []
    monkeypatch.setattr(calibrate.Runner, "resident_pair", staticmethod(lambda b, o, *chains: (chains[0], chains[1])))

    def difference(what, backend, long, short, per=1.0):
        size = sizes_tried[-1]
        if size < 300:
            raise MeasurementError(f"calibrating {backend}: {what} did not come out stable")
        return 1e-3

    def make(n, size, small):
        if n > 1:
            sizes_tried.append(size)
        return size
    monkeypatch.setattr(calibrate, "stable_difference", difference)
    monkeypatch.setattr(calibrate, "device_timed_op", lambda runner: None)  # a device without its own timer
    backend = types.SimpleNamespace(name="wgpu", role="accelerator")
    assert calibrate.work_per_op("x", backend, None, make, (100, 200, 400), 1e-6)[:2] == (1e-3, 400)
    assert sizes_tried == [100, 200, 400]
    with pytest.raises(MeasurementError, match="stable"):
        calibrate.work_per_op("x", backend, None, make, (100, 200), 1e-6)


def test_calibrated_cpu_profile_is_measured():
    from delegate.plugins import default_manager

    for attempt in range(3):  # a refusal means the machine was busy: retry, as the message says
        try:
            cpu = default_manager().create("cpu", {"engine": "numpy"})
            profile = calibrate.calibrate_backend(cpu, CompileOptions())
            break
        except MeasurementError:
            if attempt == 2:
                raise
    assert profile.launch_us > 0 and profile.gflops > 0 and profile.gbytes_per_s > 0 and profile.calibrated_at
    assert profile.transfer_gbytes_per_s == float("inf")  # the host has no transfers


def test_refit_learns_class_corrections_from_measured_ops():
    graph = elementwise_model().main
    profile = DeviceProfile(gflops=1.0, gbytes_per_s=0.1, launch_us=1.0)
    # every op measured at exactly 3x its roofline plus the launch
    op_ms = {op.index: 3 * profile.roofline_ms(op_flops(op), op_bytes(op)) + 1e-3 for op in graph.ops}
    used = refit(profile, [Observation(graph.ops, sum(op_ms.values()) + 0.05, op_ms)], lambda op: False)
    assert used == len(graph.ops) + 1
    assert profile.class_scale["elementwise"] == pytest.approx(3.0)
    assert profile.partition_us == pytest.approx(50.0)
    # a partition timed only whole (the LiteRT engine) fits one correction for every class
    whole = DeviceProfile(gflops=1.0, gbytes_per_s=0.1, launch_us=0.0)
    roof = sum(whole.roofline_ms(op_flops(op), op_bytes(op)) for op in graph.ops)
    refit(whole, [Observation(graph.ops, 2 * roof)], lambda op: False)
    assert whole.class_scale["*"] == pytest.approx(2.0) and whole.scale("conv") == pytest.approx(2.0)
    # more partitions of other sizes: the fit separates a per-op floor (10 us) from the scale (1.5), over all
    # the measurements the profile keeps
    fitted = DeviceProfile(gflops=1.0, gbytes_per_s=0.1, launch_us=0.0)
    for n in (2, 5, 9, 14):
        ops = graph.ops[:min(n, len(graph.ops))] * (1 + n // len(graph.ops))
        roofs = sum(fitted.roofline_ms(op_flops(op), op_bytes(op)) for op in ops[:n])
        refit(fitted, [Observation(ops[:n], n * 0.010 + 1.5 * roofs)], lambda op: False)
    assert fitted.class_floor_us["*"] == pytest.approx(10.0, rel=1e-3)
    assert fitted.class_scale["*"] == pytest.approx(1.5, rel=1e-3)
    assert len(fitted.fit_points["*"]) == 4
    # small partitions with a fixed cost of their own (an engine call, 0.2 ms) do not inflate the per-op floor
    fixed = DeviceProfile(gflops=1.0, gbytes_per_s=0.1, launch_us=0.0)
    for n in (1, 2, 5, 9, 14, 20):
        ops = (graph.ops * (1 + n // len(graph.ops)))[:n]
        roofs = sum(fixed.roofline_ms(op_flops(op), op_bytes(op)) for op in ops)
        refit(fixed, [Observation(ops, 0.2 + n * 0.010 + 1.5 * roofs)], lambda op: False)
    assert fixed.partition_us == pytest.approx(200.0, rel=1e-3)
    # a tiny partition, all fixed costs, leaves the scale where it was
    tiny = DeviceProfile(gflops=1e4, gbytes_per_s=1e3, launch_us=0.0, partition_us=20.0, class_scale={"*": 1.7})
    refit(tiny, [Observation(graph.ops[:1], 0.015)], lambda op: False)
    assert tiny.class_scale["*"] == 1.7
    assert fixed.class_floor_us["*"] == pytest.approx(10.0, rel=1e-3)
    assert fixed.class_scale["*"] == pytest.approx(1.5, rel=1e-3)



def test_tune_then_plan_uses_the_stored_decision(tmp_path, profile_dir):
    import subprocess
    import sys

    model = tmp_path / "m.tflite"
    from delegate.tflite.writer import write_model
    model.write_bytes(write_model(elementwise_model()))
    config = tmp_path / "c.yaml"
    config.write_text("backends: [{name: fakegpu, options: {delay_ms: 100}}, cpu]\ncpu: {engine: numpy}\n")

    def cli(*args):
        proc = subprocess.run([sys.executable, "-m", "delegate.cli", *args, "--config", str(config), str(model),
                               "--json"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    tuned = cli("tune", "--budget", "5")["models"][0]
    assert tuned["chosen"] == "cpu" and tuned["choice"] == "fastest measured now"
    measured = {c["name"]: c["measured_ms"] for c in tuned["candidates"]}
    assert measured["greedy:fakegpu"] > 100 > measured["cpu"]
    # the partitions timed alone, with their ops: an offline replay can rebuild each measured plan
    cpu_rows = [p for p in tuned["partitions"] if p["plan"] == "cpu"]
    assert sorted(i for p in cpu_rows for i in p["op_indices"]) == list(range(len(elementwise_model().main.ops)))
    plan = cli("plan")
    assert plan["chosen"] == "cpu" and plan["choice"].startswith("stored measured decision of")
    # every plan tune timed carries its measurement; one planned since (the refit below moves estimates) says so
    timed = {c["name"]: c["measured_ms"] for c in plan["candidates"] if c["measured_ms"] is not None}
    assert timed and all(measured[name] == ms for name, ms in timed.items())
    assert all(c["status"].startswith("not timed") for c in plan["candidates"] if c["measured_ms"] is None)
    assert set(plan["profiles"]) == {"fakegpu", "cpu"}
    # tune learned what each measured plan cost beyond its partitions timed alone
    stored = {d["device_info"]["backend"]: d for d in (json.loads(p.read_text()) for p in profile_dir.glob("*.json"))}
    assert len(stored["cpu"]["fit_points"]["plan"][0]) == 2 and stored["cpu"]["run_us"] >= 0
    assert stored["fakegpu"]["fit_points"]["plan"][0][1] == 1 and stored["fakegpu"]["boundary_us"] >= 0


def test_tune_leaves_a_plan_out_of_learning_when_profiling_it_would_overrun_the_budget(tmp_path, profile_dir):
    """tune's learning pass shares the search's budget: a measured plan whose profiling (about six runs of it at
    the least) would overrun what is left is not profiled, and the document says so; the fast one still is."""
    import subprocess
    import sys

    model = tmp_path / "m.tflite"
    from delegate.tflite.writer import write_model
    model.write_bytes(write_model(elementwise_model()))
    config = tmp_path / "c.yaml"
    config.write_text("backends: [{name: fakegpu, options: {delay_ms: 400}}, cpu]\ncpu: {engine: numpy}\n")
    proc = subprocess.run([sys.executable, "-m", "delegate.cli", "tune", "--budget", "0.5", "--config", str(config),
                           str(model), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    tuned = json.loads(proc.stdout)["models"][0]
    measured = {c["name"]: c["measured_ms"] for c in tuned["candidates"] if c["measured_ms"] is not None}
    assert measured["greedy:fakegpu"] > 400 > measured["cpu"]
    assert tuned["not_profiled"] == ["greedy:fakegpu"]
    assert {p["plan"] for p in tuned["partitions"]} == {"cpu"}
    assert tuned["search_seconds"] <= tuned["seconds"]
    # the budget is the whole command's, its start-up included: the search gets it less the start-up and the
    # learning pass's share, or the least a search takes
    assert tuned["budget_seconds"] == 0.5 and tuned["start_up_seconds"] > 0
    assert tuned["search_budget_seconds"] == pytest.approx(max(0.4 - tuned["start_up_seconds"], 0.5), abs=0.011)


def test_fp16_allowed_is_not_fp16_obliged(profile_dir):
    """A backend where half precision is not expected to be faster keeps fp32, and the plan says why; the
    measured search times the other precision too."""
    def settings(search):
        s = run_settings(search, delay_ms=0.0)
        s.backends = [("fakegpu", {"fp16_error": 1.0}), ("cpu", {"engine": "numpy"})]
        s.compile = CompileOptions(precision="fp16")
        return s
    x = np.ones(SHAPE, np.float32)
    session = Session(elementwise_model(), settings("estimate"))
    assert session.plan.chosen == "greedy:fakegpu"
    assert "fakegpu: fp16 is allowed but fp32 is used: fakegpu has no half-precision kernels" in session.plan.notes
    cpu = Session(elementwise_model(), RunSettings(backends=[("cpu", {"engine": "numpy"})]))
    (name, expected), = cpu.run(x).items()
    np.testing.assert_allclose(session.run(x)[name], expected, rtol=1e-5)  # the fake's fp16 error is not added
    measured = Session(elementwise_model(), settings("measure"))
    names = {c.name: c.precision for c in measured.plan.candidates}
    assert names["greedy:fakegpu fp16"] == "fp16" and names["greedy:fakegpu"] == ""


def test_refit_of_whole_plans_learns_the_run_and_boundary_costs():
    """A whole plan measured next to its partitions timed alone: what is left is the host's fixed cost of one
    run (here 0.1 ms) and, per accelerator partition, its cost at the boundaries (0.08 ms); medians, so one
    disturbed timing does not move them, and the plan's estimate then carries both."""
    graph = chain_problem()
    planner = make_planner({0, 1, 4, 5}, [1.0] * 6, [0.1] * 6, 0.0)
    profiles = planner.profiles
    rng = np.random.default_rng(0)
    for _ in range(5):
        alone = float(rng.uniform(0.2, 2.0))
        refit_plan(profiles, "cpu", alone + 0.1, [("cpu", alone)])
    refit_plan(profiles, "cpu", 9.0, [("cpu", 1.0)])  # disturbed
    assert profiles["cpu"].run_us == pytest.approx(100.0) and profiles["cpu"].fit_points["plan"]
    for n in (1, 2, 3, 1, 2):
        parts = [("gpu", float(rng.uniform(0.1, 1.0))) for _ in range(n)] + [("cpu", 0.3)] * (n - 1)
        refit_plan(profiles, "cpu", sum(ms for _, ms in parts) + 0.1 + 0.08 * n, parts)
    assert profiles["gpu"].boundary_us == pytest.approx(80.0)
    assert profiles["cpu"].run_us == pytest.approx(100.0)  # plans using the accelerator fit its figure only
    costs, _ = planner.capabilities(graph)
    split = {0: "gpu", 1: "gpu", 2: "cpu", 3: "cpu", 4: "gpu", 5: "gpu"}
    total, copies = planner.evaluate(graph, split, costs)
    partitions = 2 * planner.partition_ms("gpu") + planner.partition_ms("cpu")
    assert total == pytest.approx(sum(costs[i][b] for i, b in split.items()) + sum(c.ms for c in copies) + partitions
                                  + 0.1 + 2 * 0.08)


def test_refit_of_a_queued_device_finds_its_host_launch_cost():
    """Kernels timed on the device, partitions timed on the host: the fit recovers the host's cost per kernel
    (here 20 us, above most kernels' device time) and the partition's own overhead (100 us)."""
    graph = elementwise_model().main
    profile = DeviceProfile(gflops=1.0, gbytes_per_s=0.1, launch_us=5.0, asynchronous=True)
    rng = np.random.default_rng(0)
    observations = []
    for _ in range(6):
        kernels = {op.index: float(rng.uniform(0.002, 0.06)) for op in graph.ops}
        wall = 0.100 + sum(max(0.020, k) for k in kernels.values())
        observations.append(Observation(graph.ops, wall + 0.3, kernels, op_times_include_launch=False,
                                        transfer_ms=0.3))
    refit(profile, observations, lambda op: False)
    assert profile.launch_us == pytest.approx(20.0, rel=0.05)
    assert profile.partition_us == pytest.approx(100.0, rel=0.05)


def test_refit_of_device_events_summing_past_their_partition_takes_their_share():
    """Profiling events that add up to more than the partition's unprofiled time (the H200's OpenCL: up to 3x)
    are inflated by the profiling: each kernel's share of the partition's time is what the fit takes, so the
    refitted estimate of the partition is its time, not the events' sum."""
    from delegate.cost import cost_class

    graph = elementwise_model().main
    profile = DeviceProfile(gflops=100.0, gbytes_per_s=100.0, launch_us=5.0, asynchronous=True)
    rng = np.random.default_rng(1)
    observations = []
    for _ in range(6):
        kernels = {op.index: float(rng.uniform(0.01, 0.06)) for op in graph.ops}
        wall = sum(kernels.values())
        events = {i: 2.5 * k for i, k in kernels.items()}
        observations.append(Observation(graph.ops, wall, events, op_times_include_launch=False))
    refit(profile, observations, lambda op: False)
    estimate = profile.partition_us * 1e-3 + sum(profile.compute_ms(op_flops(op), op_bytes(op), cost_class(op))
                                                 for op in graph.ops)
    assert estimate == pytest.approx(float(np.mean([o.ms for o in observations])), rel=0.15)


def _corpus():
    """The project's corpus: converter fixtures, built-in zoo models and the MediaPipe models LiteRT runs."""
    from pathlib import Path

    from delegate import zoo
    from tests.mediapipe import NEEDS_MEDIAPIPE_OPS, mediapipe_models

    fixtures = sorted(Path(__file__).parent.glob("fixtures/converter/*.tflite"))
    mediapipe = [p for name, p in sorted(mediapipe_models().items()) if name not in NEEDS_MEDIAPIPE_OPS]
    return [(p.name, p.read_bytes()) for p in fixtures + mediapipe] + \
        [(f"zoo:{name}", zoo.build(name)) for name in sorted(zoo.ZOO)]


@pytest.mark.network
def test_shipped_defaults_leave_software_devices_idle(profile_dir):
    """A GPU API served by the host's own cores (PoCL, lavapipe) is slower than the CPU backend's kernels: with
    the shipped defaults every corpus model plans onto the CPU alone, as `--backends cpu` would (on an
    uncalibrated machine: a fresh profile directory).  Not a model whose ops the CPU engine runs through
    reference loops (``kind_scale`` of 10 or more: LiteRT's int16x8 kernels), which the software device
    computes in float: efficientnet_lite_blocks_int16x8 took 4.4 ms with PoCL's OpenCL and 10.6 ms on the CPU
    alone (2-core EPYC, `delegate bench`)."""
    from delegate.config import load_config
    from delegate.plugins import default_manager
    from delegate.session import backend_profiles, instantiate_backends, run_settings
    from delegate.planner import Planner

    settings = run_settings(load_config(None))
    backends, _ = instantiate_backends(settings.backends, default_manager(), True)
    software = [n for n, b in backends.items() if n != "cpu" and b.device_info().get("device_type") == "cpu"]
    assert software, "this test needs the software OpenCL/WebGPU devices the README's setup installs"
    planner = Planner({n: backends[n] for n in software + ["cpu"]},
                      backend_profiles(backends, settings.compile.num_threads), settings.compile, settings.placement)
    cpu = planner.profiles["cpu"]
    for name, data in _corpus():
        graph = read_model(data).main
        plan = planner.plan(graph)
        on = {p.backend for p in plan.partitions}
        if any(cpu.kind_factor(cost_class(op)) >= 10 for op in graph.ops):
            continue
        assert on == {"cpu"}, f"{name}: placed on {on} ({plan.chosen}, estimated {plan.estimated_ms:.3f} ms)"


# how far the refitted estimates of the calibration networks may land from their measured plans (median over
# the six, and the worst: one timing disturbed by other work on a busy machine), per engine: LiteRT is timed
# whole and fitted per class; the numpy engine's op timers run inside its batched call, but its Python ops
# (and their launch) are timed one by one
WORKLOAD_TOLERANCE = {"litert": ((0.75, 1.33), (0.4, 2.5)), "numpy": ((0.4, 2.5), (0.15, 6.0))}


@pytest.mark.parametrize("engine", sorted(WORKLOAD_TOLERANCE))
def test_calibration_fits_the_profile_to_real_networks(tmp_path, monkeypatch, engine):
    """The micro figures alone estimated H200 plans at 0.2-0.5x their time; calibrate then runs networks of
    the project's own (not the zoo's sizes), refits floors and scales to their measured partitions and the
    run cost to their measured plans, and the plans' estimates land near what they measured."""
    monkeypatch.setenv("DELEGATE_PROFILE_DIR", str(tmp_path))
    settings = RunSettings(backends=[("cpu", {"engine": engine})])
    rows = calibrate.fit_to_workloads(settings, "cpu")
    assert [r["workload"].split("(")[0] for r in rows] == [net for net, _ in calibrate.WORKLOADS]
    assert all(r["estimated_ms"] > 0 and r["measured_ms"] > 0 for r in rows)
    ratios = [r["estimated_ms"] / r["measured_ms"] for r in rows]
    (low, high), (least, most) = WORKLOAD_TOLERANCE[engine]
    assert low <= float(np.median(ratios)) <= high and least <= min(ratios) and max(ratios) <= most, rows
    info = profile_info(Session(read_model(zoo.build("posenet")), settings).backends["cpu"],
                        settings.compile.num_threads)
    profile = load_profile(info, CPU_DEFAULTS[engine])
    assert profile.fit_samples > 0 and profile.fitted_at and profile.class_scale
    # each workload's measured plan against its partitions alone: the host's run cost
    assert len(profile.fit_points["plan"]) == len(calibrate.WORKLOADS) and profile.run_us >= 0


def test_a_workload_timed_during_a_burst_of_other_work_is_fitted_from_its_quiet_pass(tmp_path, monkeypatch):
    """A burst of other work slowed one network's whole timing on an H100 host (6.5x); the speed check at both
    ends of a calibration passed and the refit put int8 plans at 2x their time.  Each network is timed in two
    passes and its faster one fitted: a disturbed first pass of one network leaves no trace in the fit."""
    monkeypatch.setenv("DELEGATE_PROFILE_DIR", str(tmp_path))
    real, calls = calibrate._timed_workload, []

    def disturbed(session, inputs):
        ms, timings = real(session, inputs)
        calls.append(ms)
        return (ms * 6, timings) if len(calls) == 2 else (ms, timings)  # the second network's first pass
    monkeypatch.setattr(calibrate, "_timed_workload", disturbed)
    settings = RunSettings(backends=[("cpu", {"engine": "litert"})])
    rows = calibrate.fit_to_workloads(settings, "cpu")
    count = len(calibrate.WORKLOADS)
    assert len(calls) == calibrate.WORKLOAD_PASSES * count
    slow, quiet = rows[1]["passes_ms"]
    assert slow == pytest.approx(6 * calls[1], abs=1e-3) and quiet == pytest.approx(calls[1 + count], abs=1e-3)
    assert rows[1]["measured_ms"] == pytest.approx(quiet, abs=1e-3) and quiet < slow
    info = profile_info(Session(read_model(zoo.build("posenet")), settings).backends["cpu"],
                        settings.compile.num_threads)
    plans = load_profile(info, CPU_DEFAULTS["litert"]).fit_points["plan"]
    assert len(plans) == count and all(abs(p[1] - slow) > 1e-6 for p in plans)


def test_host_profiles_are_kept_per_thread_count(profile_dir):
    """A host profile fitted at one thread is not the one of a plan at two: each thread count has its own
    file, a count never measured gets the per-thread defaults shared among the threads, and the plan says
    which."""
    model = read_model(zoo.build("posenet"))
    one, two = (RunSettings(compile=CompileOptions(num_threads=n)) for n in (1, 2))
    session = Session(model, one)
    backend = session.backends["cpu"]
    default = backend.default_profile()
    save_profile(profile_info(backend, 1), DeviceProfile(gflops=3.0, gbytes_per_s=4.0, launch_us=1.0,
                                                         fitted_at="now", fit_samples=5))
    session.close()
    at_one, at_two = Session(model, one), Session(model, two)
    assert at_one.profiles["cpu"].gflops == 3.0 and at_one.profiles["cpu"].source.endswith(" at 1 thread(s)")
    assert at_two.profiles["cpu"].gflops == default.gflops and at_two.profiles["cpu"].threads == 2
    assert at_two.profiles["cpu"].source == default.source + " shared by 2 threads"
    assert fingerprint(profile_info(backend, 1)) != fingerprint(profile_info(backend, 2))
    save_profile(profile_info(backend, 2), DeviceProfile(gflops=5.0, gbytes_per_s=4.0, launch_us=1.0,
                                                         fitted_at="now", fit_samples=5))
    again = Session(model, two)
    assert again.profiles["cpu"].gflops == 5.0  # stored at this count: used as measured, never multiplied
    for s in (at_one, at_two, again):
        s.close()


def test_one_threads_figures_are_shared_as_far_as_an_op_fills_the_threads():
    """Per-thread figures at n threads: an op gives each thread ``thread_grain_us`` of its roofline at least
    (a small op's tiles do not fill a team), never more threads than n, and a kernel the engine runs on one
    thread (``serial_kinds``) gets one."""
    profile = DeviceProfile(gflops=1.0, gbytes_per_s=1e9, launch_us=0.0, threads=8, thread_grain_us=10.0,
                            serial_kinds=("int16",))
    one = DeviceProfile(gflops=1.0, gbytes_per_s=1e9, launch_us=0.0)
    for flops, threads in ((5e3, 1.0), (40e3, 4.0), (1e6, 8.0)):  # 5, 40 and 1000 us at one thread
        assert profile.roofline_ms(flops, 0.0, "conv") == pytest.approx(one.roofline_ms(flops, 0.0) / threads)
    assert profile.roofline_ms(1e6, 0.0, "conv/int16") == pytest.approx(one.roofline_ms(1e6, 0.0))
    profile.thread_grain_us = 0.0  # no grain: every op on every thread
    assert profile.roofline_ms(5e3, 0.0, "conv") == pytest.approx(one.roofline_ms(5e3, 0.0) / 8)


def test_kinds_an_engine_runs_through_slow_kernels_cost_as_such(profile_dir):
    """LiteRT runs int16x8 ops through reference loops, tens of times slower than its float kernels
    (docs/benchmarks/cpu_kinds.py): its default profile costs them so, a calibrated profile fitted on float
    networks only keeps that knowledge, and a measurement of the kind itself replaces it."""
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures" / "converter"
    settings = RunSettings(backends=[("cpu", {"engine": "litert"})])
    sessions = {kind: Session(read_model((fixtures / f"efficientnet_lite_blocks_{kind}.tflite").read_bytes()),
                              settings) for kind in ("fp32", "int16x8", "int8")}
    convs = {kind: sum(s.planner.op_cost(op, "cpu") for op in s.graph.ops if op.opcode == "CONV_2D")
             for kind, s in sessions.items()}
    assert convs["int16x8"] > 20 * convs["fp32"]  # the same convolutions, reference loops
    assert convs["int8"] < 2 * convs["fp32"]  # XNNPACK's int8 kernels are not
    assert sessions["int16x8"].plan.estimated_ms > 10 * sessions["fp32"].plan.estimated_ms
    info = sessions["fp32"].backends["cpu"].device_info()
    default = CPU_DEFAULTS["litert"]
    save_profile(info, DeviceProfile(gflops=100.0, gbytes_per_s=10.0, launch_us=0.1, class_scale={"conv": 0.5},
                                     calibrated_at="now"))
    calibrated = load_profile(info, default)
    assert calibrated.scale("conv/int16") == pytest.approx(0.5 * default.kind_factor("conv/int16"))
    assert calibrated.scale("conv/int8") == 0.5 and calibrated.kind_factor("matmul/int8") == 1.0
    slow = sessions["int16x8"].graph.ops
    refit(calibrated, [Observation(slow, 3.0)], lambda op: op.opcode in ("SHAPE", "STRIDED_SLICE", "PACK"))
    assert "conv/int16" in calibrated.class_scale  # measured: the factor no longer applies
    assert calibrated.scale("conv/int16") == calibrated.class_scale["conv/int16"]
    for s in sessions.values():
        s.close()


def test_refit_of_host_op_timers_takes_their_share_and_finds_the_launch():
    """The numpy engine's op timers time each op alone (up to twice what it costs inside the batched call) and
    include its launch, which inside a network is not the launch of calibrate's chains: the fit takes each op's
    share of the partition's time and finds the launch as the lines' least cost at zero work."""
    from delegate.cost import cost_class

    graph = read_model(zoo.build("mobilenet_v1", alpha=0.25, size=64)).main
    profile = DeviceProfile(gflops=50.0, gbytes_per_s=20.0, launch_us=15.0)
    truth = {"conv": 1.0, "depthwise": 4.0}
    took = {op.index: 0.002 + truth.get(cost_class(op), 2.0) * profile.roofline_ms(op_flops(op), op_bytes(op))
            for op in graph.ops}
    timed = {i: 2 * ms for i, ms in took.items()}
    refit(profile, [Observation(graph.ops, sum(took.values()), timed)], lambda op: False)
    assert profile.launch_us == pytest.approx(2.0, rel=0.05)
    assert profile.scale("conv") == pytest.approx(1.0, rel=0.05) and profile.scale("depthwise") == pytest.approx(4.0, rel=0.05)
    estimate = profile.partition_us * 1e-3 + sum(profile.compute_ms(op_flops(op), op_bytes(op), cost_class(op))
                                                 for op in graph.ops)
    assert estimate == pytest.approx(sum(took.values()), rel=0.05)


def test_refit_of_ops_timed_alone_takes_off_the_engine_call_each_paid():
    """Ops timed alone (LiteRT's engine: a one-op model each) each pay an engine call that the network's run
    pays once: their excess over the partition comes off as a cost common to every op, so the large ops keep
    their own time (scaled in proportion, a transformer's matrix products came out at a third of theirs)."""
    from delegate.cost import cost_class

    graph = read_model(zoo.build("mobilenet_v1", alpha=0.25, size=64)).main
    profile = DeviceProfile(gflops=50.0, gbytes_per_s=20.0, launch_us=0.0)
    took = {op.index: 0.0005 + profile.roofline_ms(op_flops(op), op_bytes(op)) for op in graph.ops}
    alone = {i: ms + 0.003 for i, ms in took.items()}  # 3 us of engine call each
    refit(profile, [Observation(graph.ops, sum(took.values()), alone, op_times_alone=True)], lambda op: False)
    estimate = sum(profile.compute_ms(op_flops(op), op_bytes(op), cost_class(op)) for op in graph.ops)
    assert estimate == pytest.approx(sum(took.values()), rel=0.05)
    largest = max(graph.ops, key=lambda op: took[op.index])
    assert profile.compute_ms(op_flops(largest), op_bytes(largest), cost_class(largest)) == pytest.approx(
        took[largest.index], rel=0.15)


def test_refit_of_large_host_ops_only_draws_no_floor_for_small_ones():
    """A line through large ops only says nothing of a floor: MobileNetV2's convolutions timed by the numpy
    engine (rooflines of 17-380 us, their efficiencies scattered) drew a start of 37 us that a model of small
    convolutions then paid per op, 3x its time.  Beyond FLOOR_REACH_MS the line keeps its floor and launch and
    fits the scale, so a small op of the same efficiency costs what it measures."""
    from delegate.cost import FLOOR_REACH_MS

    graph = read_model(zoo.build("mobilenet_v1", alpha=1.0, size=224)).main
    profile = DeviceProfile(gflops=5.0, gbytes_per_s=2.0, launch_us=0.1)
    ops = [op for op in graph.ops if profile.roofline_ms(op_flops(op), op_bytes(op)) > 0.02]
    # the smaller of these large ops the less efficient: a least-squares line through them starts at 10 us
    took = {op.index: 1.2 * profile.roofline_ms(op_flops(op), op_bytes(op)) + 0.01 for op in ops}
    refit(profile, [Observation(ops, sum(took.values()), took)], lambda op: False)
    assert profile.launch_us == pytest.approx(0.1)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 8))
    b.output(b.op("CONV_2D", [x, b.const("w", np.ones((8, 1, 1, 8), np.float32)), b.const("b", np.zeros(8, np.float32))],
                  options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "dilation_w_factor": 1,
                           "dilation_h_factor": 1, "fused_activation_function": "NONE"}))
    small = read_model(b.to_bytes()).main.ops[0]
    roof = profile.roofline_ms(op_flops(small), op_bytes(small))
    assert roof < FLOOR_REACH_MS and cost_class(small) == "conv"
    assert profile.compute_ms(op_flops(small), op_bytes(small), cost_class(small)) < 2.0 * roof + 0.001


def test_refit_of_one_large_plan_does_not_make_its_gap_every_plans_run_cost():
    """The host's run cost (a whole plan less its partitions timed alone) is held towards none, as much as one
    plan of RUN_PRIOR_MS: one large plan's gap (MobileNetV2 alternating with LiteRT: 0.63 ms of 5.35) is not a
    cost every plan pays; many small plans that agree set it."""
    planner = make_planner({0, 1}, [1.0] * 6, [0.1] * 6, 0.0)
    profiles = planner.profiles
    refit_plan(profiles, "cpu", 5.98, [("cpu", 5.35)])
    assert profiles["cpu"].run_us == 0.0
    for alone in (0.1, 0.2, 0.15, 0.3, 0.12):
        refit_plan(profiles, "cpu", alone + 0.02, [("cpu", alone)])
    assert profiles["cpu"].run_us == pytest.approx(20.0)


def test_refit_of_skewed_host_op_times_keeps_each_class_sum():
    """Op times are skewed: most ops of a class sit on one line, a few run far above it.  The line through the
    typical op would under-estimate every plan (a sum); the fit keeps the typical op's shape and moves the
    line so each class's estimated sum over the measured ops is their measured sum."""
    from delegate.cost import cost_class

    graph = read_model(zoo.build("mobilenet_v1", alpha=0.25, size=64)).main
    profile = DeviceProfile(gflops=50.0, gbytes_per_s=20.0, launch_us=15.0)
    rng = np.random.default_rng(3)
    took = {}
    for op in graph.ops:
        slow = 6.0 if rng.random() < 0.15 else 1.0  # one op in seven runs six times slower than the line
        took[op.index] = 0.002 + slow * profile.roofline_ms(op_flops(op), op_bytes(op))
    refit(profile, [Observation(graph.ops, sum(took.values()), took)], lambda op: False)
    by_class: dict[str, list[float]] = {}
    for op in graph.ops:
        estimate = profile.compute_ms(op_flops(op), op_bytes(op), cost_class(op))
        entry = by_class.setdefault(cost_class(op), [0.0, 0.0])
        entry[0] += estimate
        entry[1] += took[op.index]
    for klass, (estimated, measured) in by_class.items():
        assert estimated == pytest.approx(measured, rel=0.02), klass


def test_measured_search_predicts_a_cold_compile_for_kernels_not_built_yet():
    """A plan on a backend that compiled at its precision already is predicted at the quickest compile plus
    that backend's first compile's share for its ops not compiled yet (the kernels built are reused); one at
    another precision builds a kernel set of its own, predicted as long as that backend's first compile, and
    is left out where that would overrun the budget (selfie_segmentation on the H200: OpenCL alone compiled
    in 5.6 s, at fp16 in 4.7 s, and tune took 14.4 s of a 10 s budget)."""
    import time as clock
    from delegate.planner import Candidate

    built = []

    def build(candidate):
        cold = candidate.name == "greedy:gpu" or candidate.precision == "fp16"
        clock.sleep(0.4 if cold else 0.01)
        built.append(candidate.name)
        return lambda: None

    candidates = [Candidate("cpu", {i: "cpu" for i in range(4)}, 1.0, baseline=True, host_alone=True),
                  Candidate("greedy:gpu", {0: "gpu", 1: "gpu", 2: "gpu", 3: "cpu"}, 1.0, baseline=True),
                  Candidate("cost:gpu", {0: "gpu", 1: "cpu", 2: "cpu", 3: "cpu"}, 1.0),
                  Candidate("greedy:gpu fp16", {0: "gpu", 1: "gpu", 2: "gpu", 3: "cpu"}, 1.0, precision="fp16")]
    plan_search.measure(candidates, build, budget_s=0.7)
    assert built == ["cpu", "greedy:gpu", "cost:gpu"]
    assert candidates[3].status == "not measured: the budget ran out"
    history = plan_search.CompileHistory()
    history.add(candidates[0], 0.01)
    history.add(candidates[1], 0.4)
    assert history.predicted_s(candidates[2]) == pytest.approx(0.01)  # its gpu op was built already
    assert history.predicted_s(candidates[3]) == pytest.approx(0.4)  # another precision: cold
    # a gpu op the gpu never compiled: a third of its first compile (three ops) on top of the quickest
    wider = Candidate("cost:gpu wider", {0: "cpu", 1: "cpu", 2: "gpu", 3: "gpu"}, 1.0)
    assert history.predicted_s(wider) == pytest.approx(0.01 + 0.4 / 3)
    # a backend that never compiled: as long as the longest compile so far
    other = Candidate("cost:npu", {0: "npu", 1: "cpu"}, 1.0)
    assert history.predicted_s(other) == pytest.approx(0.4)


def test_measured_search_compiles_the_single_backends_side_by_side():
    """The single backends compile at once, one thread each (OpenCL's and WebGPU's cold compiles took 5.6-5.9
    and 2.3-2.9 s one after the other on the H200); the others after them, one at a time; the first runs
    one candidate at a time."""
    import threading
    from delegate.planner import Candidate

    together = threading.Barrier(3, timeout=5)  # broken unless the three single backends build at once
    running, overlapped = [], []

    def build(candidate):
        if candidate.baseline:
            together.wait()
        elif together.n_waiting:
            overlapped.append(candidate.name)

        def run():
            running.append(candidate.name)
            overlapped.extend(["run"] if len(running) > 1 else [])
            running.remove(candidate.name)
        return run

    candidates = [Candidate("cpu", {0: "cpu"}, 1.0, baseline=True, host_alone=True),
                  Candidate("greedy:gpu", {0: "gpu"}, 1.0, baseline=True),
                  Candidate("greedy:npu", {0: "npu"}, 1.0, baseline=True),
                  Candidate("cost", {0: "gpu"}, 0.5)]
    winner = plan_search.measure(candidates, build, budget_s=5.0)
    assert all(c.measured_ms is not None and c.compile_s is not None for c in candidates), \
        [c.status for c in candidates]
    assert not together.broken and not overlapped and winner in candidates


def test_measured_search_finds_the_other_candidates_while_the_single_backends_compile():
    """The min cuts are searched on the calling thread while the single backends compile (pose_landmark_full
    on the H100: six min cuts took 4 s, OpenCL's cold compile 7 s, one after the other); what that search
    finds is then compiled and timed like the others."""
    import threading
    from delegate.planner import Candidate

    searched = threading.Event()

    def build(candidate):
        if candidate.baseline:
            assert searched.wait(timeout=5), "the other candidates were not searched during the compile"
        return lambda: None

    split = Candidate("cost:gpu", {0: "gpu", 1: "cpu"}, 0.5)

    def more():
        searched.set()
        return [split]

    candidates = [Candidate("cpu", {0: "cpu", 1: "cpu"}, 1.0, baseline=True, host_alone=True),
                  Candidate("greedy:gpu", {0: "gpu", 1: "gpu"}, 1.0, baseline=True)]
    winner = plan_search.measure(candidates, build, budget_s=5.0, more=more)
    assert all(c.measured_ms is not None for c in candidates), [c.status for c in candidates]
    assert split.measured_ms is not None and split.compile_s is not None
    assert winner in candidates + [split]


def test_measured_search_stops_a_hopeless_candidate_at_its_first_timed_run():
    """A candidate over HOPELESS_MARGIN times the leader at its first timed run runs no more (WebGPU on
    lavapipe, ~0.9 s a run against the CPU's 11 ms, took nine runs before); one only somewhat slower still
    runs the minimum rounds before STOP_MARGIN may stop it.  A candidate other than the single backends estimated
    over that margin is not compiled at all."""
    import time as clock
    from delegate.planner import Candidate

    runs = {"cpu": 0, "greedy:slow": 0, "greedy:close": 0}

    def build(candidate):
        delay = {"cpu": 0.001, "greedy:slow": 0.02, "greedy:close": 0.0015}[candidate.name]

        def run():
            runs[candidate.name] += 1
            clock.sleep(delay)
        return run

    candidates = [Candidate("cpu", {0: "cpu"}, 1.0, baseline=True, host_alone=True),
                  Candidate("greedy:slow", {0: "gpu"}, 1.0, baseline=True),
                  Candidate("greedy:close", {0: "npu"}, 1.0, baseline=True),
                  Candidate("cost:gpu fp16", {0: "gpu"}, 10.0)]  # not a single backend: not even compiled
    winner = plan_search.measure(candidates, build, budget_s=30.0)
    slow, close = candidates[1], candidates[2]
    assert winner.name == "cpu"
    assert candidates[3].measured_ms is None and candidates[3].status == "not measured: estimated over 3.0x the best"
    # its first (untimed) run, then a round's settling run (one: it is over SWITCH_SETTLE_MS) and one timed run
    assert runs["greedy:slow"] == 3 and slow.status.startswith("stopped after 1 run: over 3.0x")
    assert slow.measured_ms >= 20
    assert runs["greedy:close"] >= 1 + plan_search.MIN_ROUNDS * plan_search.RUNS_PER_ROUND
    assert close.measured_ms < slow.measured_ms


def test_measured_search_times_a_candidate_once_it_has_settled_after_another():
    """Right after an accelerator plan ran, the CPU alone ran up to 1.45x slower for its next ~1.5 ms (an H100
    host, LiteRT at 16 threads): timed after one untimed run it lost to a plan 1.3x slower back to back.  Each
    round lets a candidate settle (``measure.settle``) before timing it, so the faster plan wins."""
    import time as clock
    from delegate.planner import Candidate
    from delegate.tools.measure import SWITCH_SETTLE_MS, settle

    last = {"name": None, "switched": 0.0}

    def busy(seconds):
        end = clock.perf_counter() + seconds
        while clock.perf_counter() < end:
            pass

    def build(candidate):
        def run():
            now = clock.perf_counter()
            if last["name"] != candidate.name:
                last.update(name=candidate.name, switched=now)
            if candidate.name == "cpu":  # 0.4 ms back to back, 0.6 ms within 1.5 ms of a switch
                busy(0.0006 if now - last["switched"] < 0.0015 else 0.0004)
            else:
                busy(0.0005)
        return run

    candidates = [Candidate("cpu", {0: "cpu"}, 1.0, baseline=True, host_alone=True),
                  Candidate("greedy:gpu", {0: "gpu"}, 1.0, baseline=True)]
    winner = plan_search.measure(candidates, build, budget_s=2.0)
    assert winner.name == "cpu", [(c.name, c.measured_ms) for c in candidates]
    assert candidates[0].measured_ms < 0.48 < candidates[1].measured_ms
    starts = []  # settle runs until SWITCH_SETTLE_MS passed and starts no run after that
    started = clock.perf_counter()
    settle(lambda: starts.append(clock.perf_counter()) or busy(0.0004))
    assert (clock.perf_counter() - started) * 1e3 >= SWITCH_SETTLE_MS
    assert all((t - started) * 1e3 < SWITCH_SETTLE_MS for t in starts[1:])
    starts.clear()
    settle(lambda: starts.append(clock.perf_counter()) or busy(0.003))
    assert len(starts) == 1


def test_measured_search_does_not_wait_past_its_budget_for_a_cold_compile(profile_dir):
    """pose_landmark_full's OpenCL kernels took 10-14 s to build cold on H100 hosts and tune took 14.7 s of a
    10 s budget waiting for them: an accelerator alone still compiling when the budget runs out is left out
    (the host alone is always waited for), and the decision is not stored, so the next search times it."""
    import threading
    import time as clock
    from delegate.planner import Candidate

    release = threading.Event()

    def build(candidate):
        if not candidate.host_alone:
            release.wait(10)  # a driver's cold compile
        return lambda: None

    candidates = [Candidate("cpu", {0: "cpu"}, 3.0, baseline=True, host_alone=True),
                  Candidate("greedy:gpu", {0: "gpu"}, 1.0, baseline=True)]
    start = clock.perf_counter()
    try:
        winner = plan_search.measure(candidates, build, budget_s=0.5)
        waited = clock.perf_counter() - start
    finally:
        release.set()
    assert winner.name == "cpu" and winner.measured_ms is not None and waited < 2.0
    assert candidates[1].status == plan_search.OUTLASTED and candidates[1].measured_ms is None
    assert plan_search.save_decision("k", winner, candidates) is None
    assert not (profile_dir / "decisions").exists()
    candidates[1].status = "stopped after 3 runs: over 1.3x the leader"
    assert plan_search.save_decision("k", winner, candidates).exists()


def test_tune_says_a_decision_without_a_cold_compile_is_not_stored(tmp_path, profile_dir):
    """tune on an H100 host printed "stored for the next load" for a decision it had not stored (OpenCL still
    compiling at the budget's end): the report says what happened, and the next load plans afresh."""
    import subprocess
    import sys
    from delegate.tflite.writer import write_model

    model = tmp_path / "m.tflite"
    model.write_bytes(write_model(elementwise_model()))
    config = tmp_path / "c.yaml"
    config.write_text("backends: [{name: fakegpu, options: {compile_ms: 3000}}, cpu]\ncpu: {engine: numpy}\n")

    def cli(*args, json_out=True):
        proc = subprocess.run([sys.executable, "-m", "delegate.cli", *args, "--config", str(config), str(model)]
                              + (["--json"] if json_out else []), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout) if json_out else proc.stdout
    tuned = cli("tune", "--budget", "1")["models"][0]
    assert tuned["chosen"] == "cpu" and tuned["stored"] is False
    assert plan_search.NOT_STORED in tuned["choice"]
    assert {c["name"]: c["status"] for c in tuned["candidates"]}["greedy:fakegpu"] == plan_search.OUTLASTED
    assert not (profile_dir / "decisions").exists() or not any((profile_dir / "decisions").iterdir())
    text = " ".join(cli("tune", "--budget", "1", json_out=False).split())
    assert "not stored" in text and "stored for the next load" not in text


def test_measured_search_compiles_what_still_fits_its_budget():
    """Compiling cold took seconds per candidate on the H200, and tune overran its 10 s budget (13 s): a
    candidate is compiled only where the quickest compile so far still fits; the single backends
    (what the plan must never be slower than) while any budget is left, the host's always.  Where a backend's
    first compile took most of the budget (its driver's one-time costs) and later ones are quick, the other
    candidates are still timed (MobileNetV2 on the H100: tune stopped at 6.3 s of 10 with the cost plans
    unmeasured, each compiling in under 0.5 s)."""
    import time as clock
    from delegate.planner import Candidate

    built = []

    def build(candidate):
        clock.sleep(0.2)
        built.append(candidate.name)
        return lambda: None

    candidates = [Candidate("cpu", {0: "cpu"}, 3.0, baseline=True, host_alone=True),
                  Candidate("greedy:gpu", {0: "gpu"}, 2.0, baseline=True)]
    candidates += [Candidate(f"cost {i}", {0: "gpu"}, 1.0 + i / 10) for i in range(6)]
    winner = plan_search.measure(candidates, build, budget_s=1.0)
    assert sorted(built[:2]) == ["cpu", "greedy:gpu"] and 3 <= len(built) <= 5
    skipped = [c for c in candidates if c.name not in built]
    assert skipped and all(c.status == "not measured: the budget ran out" for c in skipped)
    assert winner.name in built and winner.measured_ms is not None
    # the budget counts from when the caller's search began (its backends' set-up included): begun 0.6 s
    # before, the single backends are compiled, and then no other compile of 0.2 s fits
    built.clear()
    for c in candidates:
        c.status, c.measured_ms = "", None
    plan_search.measure(candidates, build, budget_s=1.0, started=clock.perf_counter() - 0.6)
    assert sorted(built) == ["cpu", "greedy:gpu"]
    # begun past the whole budget (a cold set-up), only the host alone is: a cold accelerator compile of
    # seconds would overrun it (MobileNetV2 on the H100: tune --budget 10 took 12.2 s)
    built.clear()
    for c in candidates:
        c.status, c.measured_ms = "", None
    plan_search.measure(candidates, build, budget_s=1.0, started=clock.perf_counter() - 1.1)
    assert built == ["cpu"] and candidates[1].status == "not measured: the budget ran out"

    def first_slow(candidate):
        clock.sleep(0.5 if candidate.name == "greedy:gpu" else 0.01)  # the accelerator's first compile
        built.append(candidate.name)
        return lambda: None
    built.clear()
    for c in candidates:
        c.status, c.measured_ms = "", None
    plan_search.measure(candidates, first_slow, budget_s=2.0, started=clock.perf_counter() - 0.9)
    assert len(built) == len(candidates) and all(c.measured_ms is not None for c in candidates)
    # each candidate's compile is reported as it was timed (where the budget went)
    assert candidates[1].compile_s >= 0.5 and all(c.compile_s < 0.5 for c in candidates if c is not candidates[1])
    assert candidates[1].to_dict()["compile_s"] >= 0.5


def test_refit_of_partitions_timed_whole_fits_each_op_class():
    """An engine timed only whole (LiteRT) whose depthwise convolutions run 6x further from the roofline
    than its convolutions: one correction for all classes cannot fit both; the per-class fit does, and
    estimates a partition it never saw within 10%."""
    from delegate.cost import cost_class

    graph = read_model(zoo.build("mobilenet_v1", alpha=0.25, size=64)).main
    profile = DeviceProfile(gflops=50.0, gbytes_per_s=20.0, launch_us=0.0)
    truth = {"conv": (0.004, 1.0), "depthwise": (0.002, 6.0)}

    def took(ops):
        total = 0.05
        for op in ops:
            floor, scale = truth.get(cost_class(op), (0.003, 2.0))
            total += floor + scale * profile.roofline_ms(op_flops(op), op_bytes(op))
        return total
    rng = np.random.default_rng(0)
    ops = graph.ops
    for _ in range(40):
        start = int(rng.integers(0, len(ops) - 4))
        part = ops[start:start + int(rng.integers(3, len(ops) - start + 1))]
        refit(profile, [Observation(part, took(part))], lambda op: False)
    assert profile.class_scale["depthwise"] > 3 * profile.class_scale["conv"]
    unseen = ops[1:len(ops) // 2]
    estimate = profile.partition_us * 1e-3 + sum(profile.compute_ms(op_flops(op), op_bytes(op), cost_class(op))
                                                 for op in unseen)
    assert estimate == pytest.approx(took(unseen), rel=0.10)
    # an int8 convolution falls back to the convolutions' fit while none of its kind was measured
    assert profile.scale("conv/int8") == profile.class_scale["conv"]


def test_refit_moves_a_class_seen_once_to_what_it_measured():
    """LiteRT's int16x8 kernels ran tens of times further from the roofline than the float ones on the H200: one
    partition of that kind is evidence enough to move its classes most of the way there, while the classes
    measured in many partitions keep their fit."""
    from pathlib import Path

    from delegate.cost import cost_class

    fixtures = Path(__file__).parent / "fixtures" / "converter"
    floats = read_model((fixtures / "efficientnet_lite_blocks_fp32.tflite").read_bytes()).main.ops
    slow = read_model((fixtures / "efficientnet_lite_blocks_int16x8.tflite").read_bytes()).main.ops
    profile = DeviceProfile(gflops=50.0, gbytes_per_s=20.0, launch_us=0.0)

    def took(ops):
        return 0.02 + sum(0.002 + (25.0 if cost_class(op).endswith("/int16") else 2.0)
                          * profile.roofline_ms(op_flops(op), op_bytes(op)) for op in ops)
    rng = np.random.default_rng(0)
    for _ in range(30):
        start = int(rng.integers(0, len(floats) - 4))
        part = floats[start:start + int(rng.integers(3, len(floats) - start + 1))]
        refit(profile, [Observation(part, took(part))], lambda op: False)
    refit(profile, [Observation(slow, took(slow))], lambda op: False)

    def estimate(ops):
        return profile.partition_us * 1e-3 + sum(profile.compute_ms(op_flops(op), op_bytes(op), cost_class(op))
                                                 for op in ops)
    once = estimate(slow)
    assert once == pytest.approx(took(slow), rel=0.3)
    assert estimate(floats) == pytest.approx(took(floats), rel=0.10)
    refit(profile, [Observation(slow[len(slow) // 3:], took(slow[len(slow) // 3:]))], lambda op: False)
    assert abs(estimate(slow) - took(slow)) < abs(once - took(slow))  # more evidence, nearer still


def test_refit_of_ops_at_a_kernels_least_time_fits_a_floor_not_a_scale():
    """On a fast GPU (the H200) an elementwise kernel takes its least time, ~6 us, whatever its bytes
    (0.005-0.01 us at the roofline): rooflines too alike for a line are a floor, not a 600x slower memory,
    so an op with ten times the bytes costs its floor and ten rooflines, not ten times its time."""
    from delegate.cost import cost_class

    graph = elementwise_model().main
    profile = DeviceProfile(gflops=2000.0, gbytes_per_s=3000.0, launch_us=2.0, asynchronous=True)
    kernels = {op.index: 0.006 + 0.0001 * (op.index % 3) for op in graph.ops}
    refit(profile, [Observation(graph.ops, 0.2, kernels, op_times_include_launch=False)], lambda op: False)
    op = graph.ops[0]
    klass = cost_class(op)
    roof_us = profile.roofline_ms(op_flops(op), op_bytes(op)) * 1e3
    assert profile.class_floor_us[klass] == pytest.approx(6.1 - roof_us, abs=0.1) and profile.class_scale[klass] == 1.0
    ten_times = profile.floor_ms(klass) + 10 * profile.roofline_ms(op_flops(op), op_bytes(op)) * profile.scale(klass)
    assert ten_times < 0.012  # a pure scale would say ~0.06


def test_stored_measurements_follow_the_plan_not_its_name():
    """A refitted profile can give a candidate name a different assignment than the one a stored decision
    timed: the measurement stays with the assignment, and the new plan says it was never timed."""
    from delegate.planner import Candidate
    from delegate.plan_search import stored_candidate

    doc = {"assignment": {"0": "cpu", "1": "cpu"}, "precision": "",
           "candidates": [{"name": "cpu", "precision": "", "measured_ms": 1.0, "assignment": {"0": "cpu", "1": "cpu"}},
                          {"name": "cost:gpu", "precision": "", "measured_ms": 3.0,
                           "assignment": {"0": "gpu", "1": "cpu"}}]}
    cpu = Candidate("cpu", {0: "cpu", 1: "cpu"}, 1.2)
    moved = Candidate("cost:gpu", {0: "gpu", 1: "gpu"}, 0.9)
    assert stored_candidate(doc, [cpu, moved]) is cpu
    assert cpu.measured_ms == 1.0
    assert moved.measured_ms is None and moved.status.startswith("not timed")


def test_litert_reference_kinds_do_not_speed_up_with_threads():
    """LiteRT's int16x8 and int8 attention kernels run on one thread whatever num_threads (the fixtures take
    the same time at 1 and 2 threads): at n threads they cost what they cost at one, while its threaded
    kinds share a large op among the threads."""
    from delegate.plugins import default_manager
    from delegate.session import backend_profiles

    cpu = default_manager().create("cpu", {"engine": "litert"})
    one, four = (backend_profiles({"cpu": cpu}, n)["cpu"] for n in (1, 4))
    flops = 1e9  # a large op: every thread gets its grain
    for klass in ("conv/int16", "batch_matmul/int8"):
        assert four.compute_ms(flops, 0.0, klass) == pytest.approx(one.compute_ms(flops, 0.0, klass))
    for klass in ("depthwise/int8", "conv"):
        assert four.compute_ms(flops, 0.0, klass) == pytest.approx(one.compute_ms(flops, 0.0, klass) / 4, rel=1e-3)
    assert cpu.default_profile().threads == 1  # the default untouched


def test_calibration_keeps_default_transfers_it_cannot_measure(monkeypatch):
    """PoCL's round trips alone vary 51-165 us between batches here: the transfer latency's halves never agree.
    The device's own figures still stand; its transfer figures stay the backend's defaults, and the profile
    (and so every plan) says so."""
    fake = types.SimpleNamespace(resident=lambda n: None)
    monkeypatch.setattr(calibrate, "_launch_seconds", lambda backend, options, shape: (5e-6, fake))
    monkeypatch.setattr(calibrate, "per_run_seconds", lambda batch: 1e-4)
    monkeypatch.setattr(calibrate, "work_per_op",
                        lambda what, backend, options, make, sizes, launch: (1e-4, sizes[-1], fake))
    monkeypatch.setattr(calibrate, "Runner", lambda *args, **kwargs: fake)

    def unstable(name, tiny, stream):
        raise MeasurementError(f"calibrating {name}: the host transfer latency did not come out stable")
    monkeypatch.setattr(calibrate, "_transfer_seconds", unstable)
    monkeypatch.setattr(calibrate, "_transfer_by_copies", lambda name, *args: unstable(name, None, None))
    default = DeviceProfile(gflops=100.0, gbytes_per_s=50.0, launch_us=20.0, transfer_latency_us=30.0,
                            transfer_gbytes_per_s=12.0)
    backend = types.SimpleNamespace(name="opencl", role="accelerator", default_profile=lambda: default,
                                    device_info=lambda: {"backend": "opencl", "device_type": "gpu"})
    profile = calibrate.calibrate_backend(backend, CompileOptions())
    assert (profile.transfer_latency_us, profile.transfer_gbytes_per_s) == (30.0, 12.0)
    assert "stable" in profile.defaults_kept["transfers"] and profile.gbytes_per_s > 0 and profile.calibrated_at
    assert "defaults kept for transfers" in profile.describe()


def test_calibration_measures_transfers_from_the_tensors_a_run_copies(monkeypatch):
    """Where resident and waited-for runs do not give a positive difference (WebGPU on the H100: the latency
    came out at -109 us), round trips alone do: three tiny input/output pairs against one give four copies'
    latency (less two pools' launches), a large input against a tiny one the upload's time (less the device's
    read of it).  A round trip here: 40 us, each copy 12 us plus its bytes at 8 GB/s, each pool 3 us plus its
    input at 2,000 GB/s."""
    tiny_shape, large_shape = (1, 2, 2, 4), (1, 256, 256, 32)

    class Timed:
        def __init__(self, backend, options, model):
            inputs = model.main.inputs
            nbytes = sum(4 * int(np.prod(t.shape)) for t in inputs)
            self.seconds = (40e-6 + len(inputs) * (2 * 12e-6 + 3e-6) + nbytes / 8e9 + nbytes / 2000e9
                            + sum(4 * int(np.prod(t.shape)) for t in model.main.outputs) / 8e9)

        def round_trip(self, n):
            pass
    monkeypatch.setattr(calibrate, "Runner", Timed)
    monkeypatch.setattr(calibrate, "per_run_seconds", lambda batch: batch.__self__.seconds)
    latency_s, upload_s = calibrate._transfer_by_copies("wgpu", None, None, tiny_shape, large_shape, 3e-6, 2000.0)
    assert latency_s == pytest.approx(12e-6, rel=0.02)
    assert 4 * np.prod(large_shape) / upload_s / 1e9 == pytest.approx(8.0, rel=0.01)


class SoftwareDevice(Backend):
    """An accelerator on the host's cores (PoCL, lavapipe): planning only."""

    def __init__(self, name, device):
        self.name, self.device, self.role = name, device, "accelerator"

    def supports(self, op, options):
        return Support.yes()

    def compile(self, partition, options):
        raise NotImplementedError("planning-only backend")

    def default_profile(self):
        from delegate.gpu.profile import HOST_CORES
        return HOST_CORES

    def device_info(self):
        return {"backend": self.name, "device": self.device, "device_type": "cpu"}


def test_a_device_never_measured_borrows_a_measured_ones_figures(profile_dir):
    """After a bench had fitted PoCL's profile (the defaults proved 2x optimistic) and left lavapipe's at
    the same defaults, the never-measured lavapipe looked cheapest and the plan went there, 3.7x slower than
    the CPU.  A device of the same kind and defaults now plans with the measured one's figures, says so,
    and keeps its own measurements apart: its first fit makes it its own."""
    from delegate.cost import measured
    from delegate.session import backend_profiles

    fitted, fresh = SoftwareDevice("fitted", "pocl"), SoftwareDevice("fresh", "lavapipe")
    profile = load_profile(fitted.device_info(), fitted.default_profile())
    refit(profile, [Observation(chain_problem().ops, 2.0, {op.index: 0.3 for op in chain_problem().ops})],
          lambda op: False)
    save_profile(fitted.device_info(), profile)
    profiles = backend_profiles({"fitted": fitted, "fresh": fresh})
    lent, own = profiles["fresh"], profiles["fitted"]
    assert measured(own) and not measured(lent)
    assert (lent.launch_us, lent.partition_us, lent.class_scale) == (own.launch_us, own.partition_us, own.class_scale)
    assert lent.describe().startswith("not measured; fitted's figures") and not lent.fit_points
    refit(lent, [Observation(chain_problem().ops, 1.0, {op.index: 0.1 for op in chain_problem().ops})],
          lambda op: False)
    assert measured(lent) and not lent.describe().startswith("not measured")
    other = SoftwareDevice("other-kind", "npu")
    other.device_info = lambda: {"backend": "other-kind", "device_type": "npu"}
    assert backend_profiles({"fitted": fitted, "other-kind": other})["other-kind"].describe() == "default (cpu-device)"


def test_a_device_on_the_host_cores_never_measured_is_no_faster_than_the_host(profile_dir):
    """PoCL's default figures put a ViT block's int8 BATCH_MATMULs at a quarter of the CPU's estimate; that
    plan ran 4.5x the CPU alone.  Until measured, a device on the host's own cores costs each op at least
    what the host does; once measured, its own figures count."""
    import copy

    from delegate.gpu.profile import HOST_CORES
    from tests.test_planner import TableBackend

    graph = chain_problem()
    ops = set(range(len(graph.ops)))

    def planner(fitted_at):
        device = TableBackend("pocl", ops, [0.01] * len(ops), 0.0)
        device.device_info = lambda: {"backend": "pocl", "device_type": "cpu"}
        backends = {"pocl": device, "cpu": TableBackend("cpu", ops, [1.0] * len(ops), 0.0, accelerator=False)}
        profiles = {"pocl": dataclasses.replace(copy.deepcopy(HOST_CORES), fitted_at=fitted_at),
                    "cpu": copy.deepcopy(CPU_DEFAULTS["numpy"])}
        return Planner(backends, profiles, CompileOptions(), PlacementSettings())

    never = planner("")
    costs, _ = never.capabilities(graph)
    assert all(c["pocl"] == c["cpu"] == 1.0 for c in costs.values())
    plan = never.plan(graph)
    assert {p.backend for p in plan.partitions} == {"cpu"}
    # no op is cheaper there: no plan using it can beat the CPU alone, and its min cuts are not searched
    assert not any(c.name.startswith(("cost:", "trimmed:")) for c in plan.candidates)
    assert {p.backend for p in planner("2026-12-04 12:00").plan(graph).partitions} == {"pocl"}


def test_a_slope_fitted_on_small_ops_is_not_extrapolated_past_them(profile_dir):
    """The H200's LiteRT MEANs took 5-36 us for rooflines of 0.01-0.24 us (their overheads), which fitted a
    scale of 85, and MobileNetV2's 1.8 us MEAN was estimated at 84 us for the 5 it took: beyond the largest
    op a class was fitted to, an op's work grows at its roofline (times its kind's known slowness, or on a host
    at n threads its one thread's roofline where that is slower)."""
    p = DeviceProfile(gflops=1.0, gbytes_per_s=1.0, launch_us=0.0, class_scale={"reduce": 100.0},
                      class_reach_ms={"reduce": 0.001}, kind_scale={"int16": 10.0})
    assert p.compute_ms(0.0, 500.0, "reduce") == pytest.approx(0.05)  # within reach: the fitted line
    assert p.compute_ms(0.0, 1e6, "reduce") == pytest.approx(0.1 + 0.999)  # past it: the roofline
    p.class_scale["reduce/int16"] = 100.0
    assert p.compute_ms(0.0, 1e6, "reduce/int16") == pytest.approx(0.1 + 0.999 * 10.0)
    assert DeviceProfile(gflops=1.0, gbytes_per_s=1.0, launch_us=0.0, class_scale={"reduce": 100.0}
                         ).compute_ms(0.0, 1e6, "reduce") == pytest.approx(100.0)  # a profile never fitted
    # a host profile at 7 threads: past the reach a slow class goes on at one thread's roofline (vit_tiny_block's
    # BATCH_MATMULs at 16 threads ran 25x their roofline, far beyond the small ones fitted)
    p.thread_speedup = 7.0
    assert p.compute_ms(0.0, 1e6, "reduce") == pytest.approx(0.1 + 0.999 * 7.0)
    assert p.compute_ms(0.0, 1e6, "reduce/int16") == pytest.approx(0.1 + 0.999 * 10.0)  # its kind's slowness
    graph = chain_problem()
    fitted = DeviceProfile(gflops=1.0, gbytes_per_s=1.0, launch_us=0.0)
    refit(fitted, [Observation(graph.ops, 2.0, {op.index: 0.3 for op in graph.ops})], lambda op: False)
    assert fitted.class_reach_ms[cost_class(graph.ops[0])] == pytest.approx(
        max(fitted.roofline_ms(op_flops(op), op_bytes(op)) for op in graph.ops))


def test_partitions_timed_whole_scale_by_the_time_they_explain():
    """One partition of 1.45 ms and a tiny one of 5 us (mostly fixed costs, its roofline just a tenth of
    its time) gave a scale of 5.4 as the median of their two ratios, and the CPU's estimates went 3x over
    what it measured; the ratio of the sums is the big partition's."""
    from delegate.cost import _whole_fit

    profile = DeviceProfile(gflops=450.0, gbytes_per_s=21.9, launch_us=0.0)
    rows = np.array([[3.0, 0.00015, 0.0057], [3.0, 0.0005, 0.0050], [13.0, 1.624, 1.451]])
    _, _, scale = _whole_fit(rows, profile)
    assert scale == pytest.approx((0.0050 + 1.451) / (0.0005 + 1.624), rel=1e-6)


def test_a_partition_run_at_another_thread_count_does_not_refit_the_profile(profile_dir):
    """LiteRT's thread trial (sustained_speed) may run a small partition at one thread where the session has
    two: its time belongs to the one-thread profile, and refitting the two-thread one to it would teach it
    the wrong speed."""
    from delegate.tools.measure import learn_from, profile_partitions

    settings = RunSettings(backends=[("cpu", {"engine": "litert"})], compile=CompileOptions(num_threads=2))
    session = Session(read_model(zoo.build("mobilenet_v1", alpha=0.25, size=64)), settings)
    inputs = session.normalize_inputs(session._random_inputs())
    timings = profile_partitions(session.executor, inputs, runs=2)
    (compiled,) = session.executor.compiled
    described = compiled.describe()
    assert described["threads"] == 2
    compiled.describe = lambda: {**described, "threads": 1}
    assert learn_from(session, session.executor, timings) == []
    compiled.describe = lambda: described
    assert len(learn_from(session, session.executor, timings)) == 1
    session.close()


def test_a_class_whose_roofline_is_a_sliver_keeps_its_prior_scale():
    """Two partitions timed whole where the elementwise ops' roofline is under SCALE_SHARE of the time: the
    time they leave unexplained is floors and fixed costs, not a 70x slower elementwise kernel (which the
    H200's calibration fitted, and vit_tiny_block_int8 was then estimated at 13x its time)."""
    from delegate.cost import SCALE_SHARE, _class_fit

    profile = DeviceProfile(gflops=1000.0, gbytes_per_s=100.0, launch_us=0.0, class_scale={"*": 1.5})
    rows = [[0.09, "conv", 4.0, 0.04, "elementwise", 14.0, 0.0016],
            [0.20, "conv", 6.0, 0.12, "elementwise", 10.0, 0.0020]]
    assert max(r[6] / r[0] for r in rows) < SCALE_SHARE
    fitted = _class_fit(rows, profile)
    assert fitted["elementwise"][1] == pytest.approx(1.5)
    assert fitted["conv"][1] != pytest.approx(1.5)


def test_a_host_partition_at_fewer_threads_is_estimated_at_them(profile_dir):
    """LiteRT's thread trial may keep one thread for a small partition where the session has two: the
    partition's estimate (and bench's estimated-vs-measured row) is then the one-thread profile's."""
    settings = RunSettings(backends=[("cpu", {"engine": "litert"})], compile=CompileOptions(num_threads=2))
    session = Session(read_model(zoo.build("mobilenet_v1")), settings)
    (partition,), (compiled,) = session.executor.partitions, session.executor.compiled
    at_two = session.partition_estimate(partition)
    assert at_two == session.planner.partition_estimate(session.graph, partition)
    described = compiled.describe()
    compiled.describe = lambda: {**described, "threads": 1}
    at_one = session.partition_estimate(partition)
    assert at_one > 1.3 * at_two  # the default throughput is per thread
    session.close()


def test_a_work_figure_the_host_clock_cannot_settle_is_taken_from_the_devices_timer(monkeypatch):
    """On the H200 WebGPU's calibration was refused: the host's clock across queues of runs disagreed with
    itself by 209% on 128 MiB pools.  A device that times its own kernels gives the figure instead; the host,
    whose op timers are the same clock, still refuses it."""
    pytest.importorskip("pyopencl")
    from delegate.plugins import default_manager
    from delegate_opencl.device import probe
    if not probe()[0]:
        pytest.skip("no OpenCL device here")

    def unstable(what, backend, *args, **kwargs):
        raise MeasurementError(f"calibrating {backend}: {what} did not come out stable")
    monkeypatch.setattr(calibrate, "stable_difference", unstable)

    def pools(n, rows, small):
        return calibrate._chain(n, (1, rows, 256, 32), 2, small)
    manager = default_manager()
    seconds, rows, _ = calibrate.work_per_op("the streaming op time", manager.create("opencl", {}), CompileOptions(),
                                             pools, (64,), 1e-6)
    assert rows == 64 and 0 < seconds < 1.0
    with pytest.raises(MeasurementError, match="did not come out stable"):
        calibrate.work_per_op("the streaming op time", manager.create("cpu", {}), CompileOptions(), pools, (64,), 1e-6)


def test_numpy_engine_costs_its_batched_native_ops_apart_from_its_numpy_steps():
    """The numpy engine runs a float ADD of two like operands inside its partition's batched native call and one
    broadcasting along a middle axis as a numpy step: two kinds of kernel in one class.  The engine names the
    step's kind, so a fit of steps (calibrate's transformer blocks: ~10 us each) is not what a MediaPipe
    model's native ADDs (~1 us) are estimated at, and both lines are fitted from their own ops."""
    from delegate_cpu.kernels.native import kernel_loops
    from delegate_cpu.plugin import CpuBackend

    if kernel_loops() is None:
        pytest.skip("the native loops do not build on this machine (no C compiler)")
    b = GraphBuilder()
    x, y, z = b.input("x", (1, 8, 8, 16)), b.input("y", (1, 8, 8, 16)), b.input("z", (1, 1, 8, 16))
    native = b.op("ADD", [x, y], options={"fused_activation_function": "NONE"})
    step = b.op("ADD", [native, z], options={"fused_activation_function": "NONE"})
    b.output(step)
    ops = read_model(b.to_bytes()).main.ops
    engine = CpuBackend({"engine": "numpy"})
    assert [engine.cost_class(op) for op in ops] == ["elementwise", "elementwise/step"]
    assert [CpuBackend({"engine": "litert"}).cost_class(op) for op in ops] == ["elementwise", "elementwise"]
    profile = DeviceProfile(gflops=50.0, gbytes_per_s=20.0, launch_us=0.0)
    took = {ops[0].index: 0.001 + profile.roofline_ms(op_flops(ops[0]), op_bytes(ops[0])),
            ops[1].index: 0.010 + 2 * profile.roofline_ms(op_flops(ops[1]), op_bytes(ops[1]))}
    refit(profile, [Observation(ops, sum(took.values()), took)], lambda op: False, engine.cost_class)
    for op in ops:
        estimate = profile.compute_ms(op_flops(op), op_bytes(op), engine.cost_class(op))
        assert estimate == pytest.approx(took[op.index], rel=0.1), engine.cost_class(op)


def test_layout_ops_copying_in_short_runs_are_their_own_kind():
    """LiteRT copies a channel PAD pixel by pixel (MediaPipe's face detector on an H100 host at 16 threads: 10-130
    us each for rooflines of 0.3-5.5 us) and a RESHAPE as one block: a layout op whose runs average under
    SHORT_RUN_BYTES is the kind "strided", fitted apart; a spatial PAD of long rows and a RESHAPE are not."""
    from delegate.cost import SHORT_RUN_BYTES, contiguous_runs

    b = GraphBuilder()
    x = b.input("x", (1, 16, 16, 24))
    channels = b.op("PAD", [x, b.const("p1", np.array([[0, 0], [0, 0], [0, 0], [0, 8]], np.int32))])
    rows = b.op("PAD", [channels, b.const("p2", np.array([[0, 0], [1, 1], [0, 0], [0, 0]], np.int32))])
    flat = b.op("RESHAPE", [rows, b.const("s", np.array([1, 18 * 16, 32], np.int32))], options={"new_shape": [1, 288, 32]})
    b.output(flat)
    pad_channels, pad_rows, reshape = read_model(b.to_bytes()).main.ops
    assert contiguous_runs(pad_channels) == 16 * 16 and cost_class(pad_channels) == "layout/strided"
    assert contiguous_runs(pad_rows) == 1 and cost_class(pad_rows) == "layout"  # one run of rows before the pad
    assert contiguous_runs(reshape) == 1 and cost_class(reshape) == "layout"
    assert pad_channels.outputs[0].nbytes < SHORT_RUN_BYTES * contiguous_runs(pad_channels)


def host_first_settings(search="estimate", **fake):
    return RunSettings(backends=[("fakegpu", {"delay_ms": 0.0, **fake}), ("cpu", {"engine": "numpy"})],
                       placement=PlacementSettings(search=search, budget_s=5.0))


def test_the_host_serves_the_first_runs_while_the_chosen_plan_compiles(profile_dir):
    model, x = elementwise_model(), {"x": np.linspace(-2, 2, int(np.prod(SHAPE)), dtype=np.float32).reshape(SHAPE)}
    expected = Session(model, RunSettings(backends=[("cpu", {"engine": "numpy"})])).run(x)
    for slow in ({"compile_ms": 800}, {"start_ms": 800}):  # a cold compile; a driver's slow first start
        session = Session(model, host_first_settings(**slow), host_first=True)
        assert session.init_ms < 800 and session.ready_ms is None  # the load waited for neither
        assert any("the first runs go to cpu alone" in n for n in session.plan.notes)
        first = session.run(x)  # served by the CPU alone meanwhile
        np.testing.assert_allclose(first["y"] if "y" in first else next(iter(first.values())),
                                   next(iter(expected.values())), rtol=1e-6)
        assert [p.backend for p in session.executor.partitions] == ["fakegpu"]  # waits for the chosen plan
        assert session.plan.chosen == "greedy:fakegpu" and list(session.backends) == ["fakegpu", "cpu"]
        assert session.ready_ms >= 800 > session.init_ms
        later = session.run(x)
        np.testing.assert_allclose(next(iter(later.values())), next(iter(expected.values())), rtol=1e-6)
        assert any("went to cpu alone while the accelerators started and this plan was chosen and compiled" in n
                   for n in session.plan.notes)
        assert not any("the first runs go to" in n for n in session.plan.notes)
    # without host_first (the CLI's tools) or with placement.host_first off, the load waits
    for waited in (Session(model, host_first_settings(compile_ms=300)), Session(model, host_first_settings(start_ms=300)),
                   Session(model, replace(host_first_settings(compile_ms=300),
                                          placement=PlacementSettings(search="estimate", host_first=False)),
                           host_first=True)):
        assert waited.init_ms >= 300 and waited.ready_ms == waited.init_ms
        assert [p.backend for p in waited._serving.partitions] == ["fakegpu"]


def test_an_accelerator_failing_to_start_meanwhile_leaves_the_host_serving(profile_dir):
    """Started on the preparing thread, an accelerator whose driver fails is skipped as at load: the plan says
    why, the CPU alone runs the model; an unknown backend name still fails the load itself."""
    model, x = elementwise_model(), {"x": np.ones(SHAPE, np.float32)}
    session = Session(model, host_first_settings(start_ms=400, fail_start=True), host_first=True)
    assert session.ready_ms is None
    np.testing.assert_allclose(next(iter(session.run(x).values())),
                               next(iter(Session(model, RunSettings(backends=[("cpu", {"engine": "numpy"})])).run(x)
                                         .values())), rtol=1e-6)
    session.wait_until_ready()
    assert session.plan.chosen == "cpu" and list(session.backends) == ["cpu"]
    assert any("fakegpu skipped" in n and "simulated driver failure" in n for n in session.plan.notes)
    with pytest.raises(PluginError, match="unknown backend 'nosuch'"):
        Session(model, replace(host_first_settings(), backends=[("nosuch", {}), ("cpu", {})]), host_first=True)


def test_a_compile_that_is_ready_at_once_is_used_from_the_first_run(profile_dir):
    session = Session(elementwise_model(), host_first_settings(), host_first=True)
    assert session.ready_ms == session.init_ms
    assert [p.backend for p in session._serving.partitions] == ["fakegpu"]
    assert not any("alone" in n for n in session.plan.notes)


def test_estimates_too_close_to_call_are_measured_while_the_host_serves(profile_dir, monkeypatch):
    model = elementwise_model()
    monkeypatch.setattr(plan_search, "estimates_too_close", lambda candidates: True)
    # the fake device claims 1 us per op but sleeps 50 ms a run: only measuring finds the CPU faster
    session = Session(model, host_first_settings("auto", delay_ms=50.0, compile_ms=400), host_first=True)
    assert session.ready_ms is None and any("the first runs go to cpu alone" in n for n in session.plan.notes)
    assert np.isfinite(next(iter(session.run({"x": np.ones(SHAPE, np.float32)}).values()))).all()
    assert session.executor is not None  # waits for the measurement
    assert session.plan.chosen == "cpu" and session.plan.choice == "measured meanwhile"
    assert any("this plan was chosen by measurement and compiled" in n for n in session.plan.notes)
    times = {c.name: c.measured_ms for c in session.plan.candidates}
    assert times["greedy:fakegpu"] > 50.0 > times["cpu"]
    # stored: the next load takes the decision and has nothing to prepare
    monkeypatch.setattr(plan_search, "measure", lambda *a, **k: pytest.fail("measured again"))
    again = Session(model, host_first_settings("auto", delay_ms=50.0, compile_ms=400), host_first=True)
    assert again.plan.chosen == "cpu" and again.plan.choice.startswith("stored measured decision of")
    assert again.ready_ms == again.init_ms


def test_estimates_far_apart_are_not_too_close():
    from delegate.planner import Candidate

    host = Candidate("cpu", {}, 1.0, host_alone=True)
    assert plan_search.estimates_too_close([host, Candidate("greedy:x", {}, 0.8)])
    assert plan_search.estimates_too_close([host, Candidate("greedy:x", {}, 1.4)])
    assert not plan_search.estimates_too_close([host, Candidate("greedy:x", {}, 0.5)])
    assert not plan_search.estimates_too_close([host, Candidate("greedy:x", {}, 4.0)])
    assert not plan_search.estimates_too_close([host])


def test_an_error_while_preparing_meanwhile_is_raised_at_the_next_run(profile_dir, monkeypatch):
    def failing(self, partitions):
        time.sleep(0.5)
        raise CacheError("the serialization dir is not safe")
    monkeypatch.setattr(Session, "_compile_all", failing)
    session = Session(elementwise_model(), host_first_settings(), host_first=True)
    with pytest.raises(CacheError, match="not safe"):
        for _ in range(100):  # served meanwhile until the failure is known
            session.run({"x": np.ones(SHAPE, np.float32)})
            time.sleep(0.02)


def test_a_model_with_state_is_never_served_by_a_stand_in(profile_dir):
    from tests.test_state import lstm_model

    settings = RunSettings(backends=[("fakegpu", {"compile_ms": 300}), ("cpu", {"engine": "numpy"})],
                           placement=PlacementSettings(search="estimate"))
    session = Session(read_model(lstm_model()), settings, host_first=True)
    assert session.ready_ms == session.init_ms


def test_the_interpreter_answers_from_the_host_while_its_plan_compiles(profile_dir, tmp_path):
    from delegate import Interpreter

    config = tmp_path / "slow.yaml"
    config.write_text("backends: [{name: fakegpu, options: {compile_ms: 800}}, cpu]\n"
                      "cpu: {engine: numpy}\nplacement: {search: estimate}\n")
    it = Interpreter(model_content=elementwise_bytes(), config=str(config))
    started = time.perf_counter()
    it.allocate_tensors()
    assert time.perf_counter() - started < 0.8  # the compile goes on behind the first answers
    x = np.linspace(-1, 1, int(np.prod(SHAPE)), dtype=np.float32).reshape(SHAPE)
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    first = it.get_tensor(it.get_output_details()[0]["index"]).copy()
    time.sleep(1.0)
    it.invoke()  # the chosen plan by now
    np.testing.assert_allclose(it.get_tensor(it.get_output_details()[0]["index"]), first, rtol=1e-6)
    assert [p.backend for p in it._sessions[0]._serving.partitions] == ["fakegpu"]


def test_an_accelerator_alone_estimated_far_slower_than_the_cpu_alone_is_not_compiled():
    """Estimates were never five times off: a single backend estimated over NEVER_ALONE_MARGIN times the CPU
    alone is not compiled (its cold compile and its runs would take the budget); one within it is."""
    from delegate.planner import Candidate

    built = []

    def build(candidate):
        built.append(candidate.name)
        return lambda: None

    candidates = [Candidate("cpu", {0: "cpu"}, 1.0, baseline=True, host_alone=True),
                  Candidate("greedy:hopeless", {0: "gpu"}, 5.5, baseline=True),
                  Candidate("greedy:worse", {0: "npu"}, 4.5, baseline=True)]
    plan_search.measure(candidates, build, budget_s=30.0)
    assert sorted(built) == ["cpu", "greedy:worse"]
    assert candidates[1].status == "not measured: estimated over 5x the CPU alone"
    assert candidates[2].measured_ms is not None


def test_a_fused_kernels_time_is_learned_on_the_op_it_is_costed_to(profile_dir):
    """OpenCL's events name a kernel by its first op: the depthwise convolution a 1x1 convolution's kernel
    computes while staging its input.  The planner costs that kernel to the 1x1 convolution (its group's
    anchor) and the fold, so the refit dropped the kernel's time as a folded op's and kept it, with
    ``store_ops``, as the depthwise op's own: it now goes to the anchor, and is stored as no op's own time."""
    pytest.importorskip("pyopencl")
    from delegate.cost import op_signature
    from delegate.passes import folded_into
    from delegate.tools.measure import learn_from, on_anchors, profile_partitions
    from delegate_opencl.device import probe
    if not probe()[0]:
        pytest.skip("no OpenCL device here")

    assert on_anchors({6: 0.5, 9: 0.0, 2: 0.25}, {6: 9, 3: 2}) == {9: 0.5, 2: 0.25}
    settings = RunSettings(backends=[("opencl", {}), ("cpu", {})],
                           placement=PlacementSettings(partitioner="greedy", search="estimate", host_first=False))
    session = Session(read_model(zoo.build("mobilenet_v1", alpha=0.25, size=64)), settings)
    groups, _ = session.planner.groups(session.graph)
    depthwise = {i: a for i, (a, kind) in folded_into(groups["opencl"]).items() if kind == "depthwise_pointwise"}
    assert depthwise  # the network's depthwise convolutions fold into the 1x1 ones reading them
    timings = profile_partitions(session.executor, session.normalize_inputs(session._random_inputs()), runs=2)
    (timed,) = [t for t in timings if t.backend == "opencl"]
    assert set(depthwise) <= set(timed.op_ms)  # the timer names the fused kernels by their depthwise op
    learn_from(session, session.executor, timings, store_ops=True)
    stored = session.profiles["opencl"].measured_op_ms
    ops = {op.index: op for op in session.graph.ops}
    kernels = on_anchors(timed.op_ms, depthwise)
    for dw, anchor in depthwise.items():
        assert kernels[anchor] >= timed.op_ms[dw] > 0
        # neither op's own time: the kernel's is learned as the fold's cost (below), which a stored time of the
        # anchor would count twice
        assert op_signature(ops[dw]) not in stored
        assert stored.get(op_signature(ops[anchor])) != kernels[anchor]
    # the fused kernels were fitted as their anchors' work and the folds', which the estimates now count
    profile = session.profiles["opencl"]
    assert "depthwise_pointwise" in profile.folded_channel_us
    fold_ms = session.planner.fold_ms(session.graph, "opencl")
    for dw in depthwise:
        assert fold_ms[dw] == profile.folded_ms("depthwise_pointwise", ops[dw].inputs[0].shape[-1])
    session.close()


def test_refit_learns_what_a_folded_depthwise_convolution_adds_to_its_readers_kernel():
    """OpenCL computes a depthwise convolution inside the 1x1 convolution reading it: on an H100 that kernel
    took ~0.4 us more per input channel than the 1x1 convolution's own estimate (face_detection's plan
    estimated at 0.73x its time).  The refit fits the anchors' class without those kernels and the fold's cost
    per channel from what they took beyond it; the estimate of a partition then counts it."""
    from delegate.cost import FOLDED, op_class

    graph = read_model(zoo.build("mobilenet_v1", alpha=0.5, size=96)).main
    profile = DeviceProfile(gflops=1000.0, gbytes_per_s=100.0, launch_us=2.0, asynchronous=True)
    line = DeviceProfile(gflops=1000.0, gbytes_per_s=100.0, launch_us=2.0, asynchronous=True,
                         class_floor_us={op_class(op): 8.0 for op in graph.ops}, class_scale={"*": 1.0})
    folds, folded = {}, set()
    for op in graph.ops:
        reader = op.outputs[0].uses[0] if len(op.outputs[0].uses) == 1 else None
        if op.opcode == "DEPTHWISE_CONV_2D" and reader is not None and reader.opcode == "CONV_2D":
            folds[reader.index] = [("depthwise_pointwise", float(op.inputs[0].shape[-1]))]
            folded.add(op.index)
    assert len(folds) > 5
    kernels = {op.index: line.compute_ms(op_flops(op), op_bytes(op), cost_class(op))
               + sum(0.4e-3 * channels for _, channels in folds.get(op.index, []))
               for op in graph.ops if op.index not in folded}
    observation = Observation(graph.ops, sum(kernels.values()) + 0.05, kernels, op_times_include_launch=False,
                              folds=folds)
    refit(profile, [observation, observation], lambda op: op.index in folded)
    assert len(profile.fit_points[FOLDED]) == 2 * len(folds)
    assert profile.folded_channel_us["depthwise_pointwise"] == pytest.approx(0.4, rel=0.05)
    assert profile.folded_ms("depthwise_pointwise", 64) == pytest.approx(0.0256, rel=0.05)
    assert profile.folded_ms("pad", 64) == 0.0  # a fold that becomes addressing


def test_refit_of_a_class_measured_at_two_sizes_draws_a_line_through_both():
    """Two networks of one class at different work (calibrate's two sequence LSTMs, 16x the work apart) give a
    line: with a floor alone fitted through them, an H100 host's estimates of both came out at their mean
    (0.61x and 1.99x their time), and a third LSTM between them 1.40x."""
    from delegate.cost import op_steps

    profile = DeviceProfile(gflops=50.0, gbytes_per_s=20.0, launch_us=0.0)
    observations, lstms = [], []
    for features, units in ((8, 16), (32, 64)):
        graph = read_model(zoo.build("lstm_classifier", steps=16, features=features, units=units)).main
        lstm = next(op for op in graph.ops if cost_class(op) == "recurrent")
        took = 0.016 + 60.0 * profile.roofline_ms(op_flops(lstm), op_bytes(lstm))  # 1 us a step and 60x the roofline
        lstms.append((lstm, took))
        observations.append(Observation([lstm], took, {lstm.index: took}, op_times_alone=True))
    refit(profile, observations, lambda op: False)
    for lstm, took in lstms:
        assert profile.compute_ms(op_flops(lstm), op_bytes(lstm), "recurrent", op_steps(lstm)) == pytest.approx(took, rel=0.1)


def test_a_plan_of_several_backends_must_clearly_beat_the_single_backends():
    """A split plan (or another precision) measured within CLEAR_WIN of the fastest single backend alone gives way
    to it, and says so; one that beats it clearly is kept."""
    import time as clock
    from delegate.planner import Candidate

    def busy(seconds):
        end = clock.perf_counter() + seconds
        while clock.perf_counter() < end:
            pass

    for split_ms, kept in ((0.49, "cpu"), (0.35, "cost:gpu")):
        delays = {"cpu": 0.50, "greedy:gpu": 0.70, "cost:gpu": split_ms}
        candidates = [Candidate("cpu", {0: "cpu", 1: "cpu"}, 1.0, baseline=True, host_alone=True),
                      Candidate("greedy:gpu", {0: "gpu", 1: "gpu"}, 1.0, baseline=True),
                      Candidate("cost:gpu", {0: "gpu", 1: "cpu"}, 1.0)]
        winner = plan_search.measure(candidates, lambda c: lambda: busy(delays[c.name] * 1e-3), budget_s=3.0)
        assert winner.name == kept, [(c.name, c.measured_ms, c.status) for c in candidates]
        split = candidates[2]
        assert split.status.startswith("within 5% of cpu") == (kept == "cpu" and split.measured_ms < winner.measured_ms)
