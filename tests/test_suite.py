"""``delegate bench --suite``: rows against LiteRT, reports written, and models LiteRT cannot run timed alone."""

import numpy as np
import pytest

from delegate import suite
from delegate.tflite.builder import GraphBuilder


@pytest.fixture
def model_bytes():
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 4))
    w = b.const("w", rng.standard_normal((6, 3, 3, 4)).astype(np.float32))
    b.output(b.op("CONV_2D", [x, w, b.const("b", np.zeros(6, np.float32))],
                  options={"padding": "SAME", "stride_h": 1, "stride_w": 1}))
    return b.to_bytes()


def _run(tmp_path, data):
    return suite.run_suite([("tiny", data)], ["cpu-numpy", "cpu-litert"], runs=3, threads=1, out=tmp_path,
                           progress=lambda _: None)


def test_rows_compare_with_litert_and_reports_are_written(tmp_path, model_bytes, capfd):
    rows, written = _run(tmp_path, model_bytes)
    ours = {r.config: r for r in rows}
    for name in ("cpu-numpy", "cpu-litert"):
        row = ours[name]
        assert row.status == "ok", row.status
        assert row.p50_ms > 0 and row.litert_ms > 0 and row.ratio == pytest.approx(row.p50_ms / row.litert_ms)
        assert row.max_error < 1e-5
    assert "litert-gpu" in ours
    gpu = ours["litert-gpu"].status  # where LiteRT's GPU accelerator cannot start: why, in one line of words
    assert gpu == "ok" or (gpu.startswith("unavailable: ") and "litert_compiled_model.h" not in gpu), gpu
    assert "INFO: [" not in capfd.readouterr().err  # its registry and driver logs go to the log
    table = (tmp_path / "suite.md").read_text()
    assert "| tiny | cpu-numpy |" in table and "Command: `delegate" in table
    assert {p.name for p in written} >= {"suite.md", "suite.csv"}


def test_a_model_litert_cannot_run_is_timed_without_a_reference(tmp_path, model_bytes, monkeypatch):
    def refuse(data, threads):
        raise RuntimeError("Encountered unresolved custom op: SomeCustomOp.\nmore detail")
    monkeypatch.setattr(suite, "litert_cpu", refuse)
    rows, _ = _run(tmp_path, model_bytes)
    numpy_row = next(r for r in rows if r.config == "cpu-numpy")
    assert numpy_row.p50_ms > 0 and numpy_row.ratio is None and numpy_row.max_error is None
    assert numpy_row.status == "LiteRT cannot run it: Encountered unresolved custom op: SomeCustomOp."
    gpu_row = next(r for r in rows if r.config == "litert-gpu")
    assert gpu_row.status.startswith("unavailable: LiteRT cannot run it") and gpu_row.p50_ms is None


def test_a_reference_slowed_by_alternation_is_flagged(tmp_path, model_bytes, monkeypatch):
    """LiteRT much slower alternating with us than alone means we left work on the cores: the row says so."""
    alternate = suite.time_alternating

    def slowed(ours, theirs, runs):
        mine, ref = alternate(ours, theirs, runs)
        return mine, [t * 3 + 1.0 for t in ref]
    monkeypatch.setattr(suite, "time_alternating", slowed)
    rows, _ = _run(tmp_path, model_bytes)
    row = next(r for r in rows if r.config == "cpu-numpy")
    assert row.status.startswith("LiteRT slowed alternating"), row.status


def test_native_failures_read_as_one_line():
    from delegate.stdio import native_reason
    lines = ["INFO: [environment.cc:36] Creating LiteRT environment with options",
             "ERROR: [delegate_webgpu.cc:359] Failed to initialize WebGPU environment: INTERNAL: No adapters found",
             "E0000 00:00:1796162111.986669    2589 delegate_webgpu.cc:736] Failed to get or create the environment"]
    located = "ERROR: [./litert/cc/litert_compiled_model.h:1961]\n└ ERROR: [litert/runtime/compiled_model.cc:1036]"
    assert native_reason(lines, located) == "Failed to initialize WebGPU environment: INTERNAL: No adapters found"
    assert native_reason(lines[2:], located) == "Failed to get or create the environment"
    assert native_reason([], located) == ""
    assert native_reason([], "ERROR: [a.h:1]\n└ ERROR: [b.cc:2] it broke") == "it broke"


def test_the_chart_labels_do_not_overlap_and_the_legend_is_beside_the_bars():
    rows = [suite.Row(m, c, ratio=r) for m, ratios in [("zoo:mobilenet_v1", (0.4, 1.3, 9.0)),
                                                       ("pose_landmark_full", (0.9, 3.5, 27.0)),
                                                       ("selfie_segmentation", (0.3, 1.1, 14.0))]
            for c, r in zip(("cpu-litert", "opencl-fp32", "wgpu-fp32"), ratios)]
    fig = suite.draw_chart(rows, "x86_64, 2 cores, 2026-12-01 23:00")
    fig.canvas.draw()
    ax, renderer = fig.axes[0], fig.canvas.get_renderer()
    labels = [t for t in ax.get_yticklabels(which="both") if t.get_text() and t.get_visible()
              and ax.get_ylim()[0] <= t.get_position()[1] <= ax.get_ylim()[1]]
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.y0)
    assert len(boxes) >= 3 and all(a.y1 <= b.y0 for a, b in zip(boxes, boxes[1:]))
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1
    assert "2 cores, 2026-12-01 23:00" in ax.get_title()


def test_without_matplotlib_the_report_says_why_there_is_no_chart(tmp_path, model_bytes, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rows, written = suite.run_suite([("tiny", model_bytes)], ["cpu-numpy"], runs=2, threads=1, out=tmp_path,
                                    progress=lambda _: None)
    assert "suite.png" not in {p.name for p in written}
    assert "No chart: matplotlib is not installed" in (tmp_path / "suite.md").read_text()
