"""A short derandomized run of the model fuzzer, byte and structure mutations alike, each case loaded
and run in a worker subprocess (a crash is counted, not fatal); the long run is its own command
(``python -m tests.fuzz.fuzz_models``, or this file's slow test)."""

import pytest

from tests.fuzz.fuzz_models import KINDS, run
from tests.mediapipe import mediapipe_models


def _check(report, count):
    assert report["failures"] == []
    outcomes = report["outcomes"]
    assert sum(sum(c.values()) for c in outcomes.values()) == count
    for kind in KINDS:
        assert outcomes[kind].get("ModelFormatError", 0) > 0, outcomes
        assert outcomes[kind].get("result", 0) > 0, outcomes
        assert "crash" not in outcomes[kind]


def test_fuzz_byte_and_structure_mutations():
    extra = [mediapipe_models()["hand_recrop.tflite"]]
    _check(run(count=400, seed=7, timeout=10.0, out=None, extra=extra), 400)


@pytest.mark.slow
def test_fuzz_long_run():
    _check(run(count=4000, seed=1, timeout=10.0, out=None, extra=[]), 4000)
