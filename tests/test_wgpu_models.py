"""Real MediaPipe models on the WebGPU backend (what it supports) and the CPU (the rest), against LiteRT.

Placement uses LiteRT's own rule (greedy: every op the GPU path supports
goes to it), so the test exercises as much of the backend as the model
allows.  fp32 results must be within 5e-4 of each output's range.
"""

import os
from pathlib import Path

import numpy as np
import pytest

from delegate import read_model
from delegate.planner import PlacementSettings, Rule
from delegate.plugins import default_manager
from delegate.session import RunSettings, Session
from tests.oputil import litert_run

_available, _why = default_manager().backend_info("wgpu").available()
pytestmark = pytest.mark.skipif(not _available, reason=f"no WebGPU adapter: {_why}")

MODELS = ["selfie_segmentation.tflite", "face_detection_short_range.tflite", "hand_landmark_lite.tflite",
          "pose_landmark_full.tflite"]
UNPACKED = Path(os.environ.get("DELEGATE_MEDIAPIPE_DIR", "/tmp/mp/x/mediapipe/modules"))
TOLERANCE = 5e-4


def model_path(name: str) -> Path:
    """The model from an unpacked MediaPipe tree, else from the test cache of the mediapipe wheel."""
    found = sorted(UNPACKED.rglob(name)) if UNPACKED.is_dir() else []
    if found:
        return found[0]
    from tests.mediapipe import mediapipe_models
    return mediapipe_models()[name]


def relative_error(actual, expected, floor: float = 1e-6) -> float:
    """Max error over the output's range (at least ``floor``)."""
    scale = max(float(np.abs(expected).max()), floor)
    return float(np.abs(actual.astype(np.float64) - expected).max()) / scale


def run_and_compare(data: bytes, placement: PlacementSettings, precision: str = "fp32",
                    tolerance: float = TOLERANCE, floor: float = 1e-6) -> Session:
    from delegate import CompileOptions
    model = read_model(data)
    session = Session(model, RunSettings(backends=[("wgpu", {}), ("cpu", {})], placement=placement,
                                         compile=CompileOptions(precision=precision)))
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, t.shape).astype(t.dtype.numpy) for t in model.main.inputs]
    out = session.run(inputs)
    for t, expected in zip(session.graph.outputs, litert_run(data, inputs)):
        error = relative_error(out[t.name], expected, floor)
        assert error <= tolerance, f"output {t.name!r}: max error {error:.3g} of its range > {tolerance}"
    return session


@pytest.mark.parametrize("name", MODELS)
def test_model_matches_litert(name):
    data = model_path(name).read_bytes()
    session = run_and_compare(data, PlacementSettings(partitioner="greedy"))
    wgpu = session.backends["wgpu"]
    for decision, op in zip(session.plan.decisions, session.graph.ops):
        supported = wgpu.supports(op, session.settings.compile)
        assert (decision.backend == "wgpu") == bool(supported), f"{op.describe()}: {decision.backend}"
    on_gpu = [c for p, c in zip(session.plan.partitions, session.executor.compiled) if p.backend == "wgpu"]
    assert on_gpu and all(c.describe()["kernels"] > 0 for c in on_gpu)


@pytest.mark.parametrize("name", ["selfie_segmentation.tflite", "face_detection_short_range.tflite"])
def test_fp16_storage_stays_within_a_percent(name):
    """fp16 storage (f32 arithmetic): within 1e-2 of each output's range, taken as at least 1 (random
    inputs leave the segmentation mask near 0, where f16's absolute error of ~5e-4 dominates)."""
    session = run_and_compare(model_path(name).read_bytes(), PlacementSettings(partitioner="greedy"), "fp16",
                              1e-2, floor=1.0)
    expected = "fp16" if session.backends["wgpu"].device_info()["shader_f16"] else "fp32"
    assert session.executor.compiled[0].describe()["precision"] == expected


def test_partitions_alternating_between_wgpu_and_cpu():
    """Upsampling denied to wgpu: the decoder alternates devices, values cross every boundary."""
    data = model_path("selfie_segmentation.tflite").read_bytes()
    placement = PlacementSettings(partitioner="greedy", denies=[Rule(backend="wgpu", op="RESIZE_BILINEAR")])
    session = run_and_compare(data, placement)
    backends = [p.backend for p in session.plan.partitions]
    assert backends.count("wgpu") >= 2 and "cpu" in backends


@pytest.mark.parametrize("name, options", [("mobilenet_v1", dict(alpha=0.25, size=96, classes=20)),
                                           ("deeplab_v3", dict(size=65, classes=5))])
def test_int8_model_through_the_float_view(name, options):
    """Full-int8 zoo models run whole on wgpu as floats rounded onto each tensor's grid (QUANTIZE and
    DEQUANTIZE at the ends included); outputs within 3 steps of the int8 tensor they come from."""
    from delegate import CompileOptions, zoo
    data = zoo.build(name, "int8", **options)
    model = read_model(data)
    session = Session(model, RunSettings(backends=[("wgpu", {}), ("cpu", {})],
                                         compile=CompileOptions(allow_quantized=True),
                                         placement=PlacementSettings(partitioner="greedy")))
    assert [p.backend for p in session.plan.partitions] == ["wgpu"]
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, t.shape).astype(np.float32) for t in model.main.inputs]
    out = session.run(inputs)
    steps = {op.outputs[0].name: op.inputs[0].quantization.scale[0] for op in session.graph.ops
             if op.opcode == "DEQUANTIZE" and op.outputs[0] in session.graph.outputs}
    for t, expected in zip(session.graph.outputs, litert_run(data, inputs, builtin=True)):
        error = float(np.abs(out[t.name].astype(np.float64) - expected).max())
        assert error <= 3.001 * steps[t.name], f"{t.name}: {error / steps[t.name]:.2f} steps off"
