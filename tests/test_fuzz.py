"""A short derandomized run of the model fuzzer (the long one is its own command; see README)."""

from tests.fuzz.fuzz_models import run
from tests.mediapipe import mediapipe_models


def test_fuzz_builder_and_real_models():
    extra = [mediapipe_models()["hand_recrop.tflite"]]
    report = run(count=400, seed=7, timeout=5.0, out=None, extra=extra)
    assert report["failures"] == []
    assert sum(report["outcomes"].values()) == 400
    assert report["outcomes"].get("ModelFormatError", 0) > 0
