"""Whole real models end to end on the CPU backend against both of LiteRT's kernel sets."""

import numpy as np
import pytest

from delegate import UnsupportedOpError, read_model
from delegate.session import RunSettings, Session
from tests.mediapipe import NEEDS_MEDIAPIPE_OPS, mediapipe_models
from tests.oputil import litert_run

MODELS = mediapipe_models()
RUNNABLE = sorted(set(MODELS) - NEEDS_MEDIAPIPE_OPS)
# LiteRT's own two CPU kernel sets differ by up to ~2e-4 of the output range on float models.
TOLERANCE = 2e-4


def random_inputs(model, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, t.shape).astype(t.dtype.numpy) for t in model.main.inputs]


def worst_error(actual, expected):
    worst = 0.0
    for a, e in zip(actual, expected):
        scale = max(float(np.abs(e).max()), 1e-6)
        worst = max(worst, float(np.abs(a.astype(np.float64) - e).max()) / scale)
    return worst


@pytest.mark.parametrize("name", RUNNABLE)
def test_matches_litert(name):
    """Within 2e-4 of the output range of each LiteRT kernel set, or, where those two disagree more
    with each other (deep nets on random inputs), no further from either than they are apart."""
    data = MODELS[name].read_bytes()
    model = read_model(data)
    session = Session(model, RunSettings(backends=[("cpu", {"engine": "numpy"})]))
    inputs = random_inputs(model)
    out = session.run(inputs)
    actual = [out[t.name] for t in session.graph.outputs]
    references = {"xnnpack": litert_run(data, inputs)}
    try:
        references["builtin"] = litert_run(data, inputs, builtin=True)
    except RuntimeError as exc:  # the builtin resolver lacks MediaPipe's Convolution2DTransposeBias
        assert "Convolution2DTransposeBias" in str(exc)
    bound = max(TOLERANCE, worst_error(*references.values()) if len(references) == 2 else 0.0)
    for label, reference in references.items():
        error = worst_error(actual, reference)
        assert error <= bound, f"{name}: max error {error:.3g} of the output range vs {label} > {bound:.3g}"


def test_mediapipe_only_ops_named():
    model = read_model(MODELS["face_landmark_with_attention.tflite"].read_bytes())
    with pytest.raises(UnsupportedOpError) as info:
        Session(model, RunSettings())
    message = str(info.value)
    assert "cannot run on any backend" in message
    assert any(code in message for code in ("Landmarks2TransformMatrix", "TransformLandmarks",
                                            "TransformTensorBilinear"))
