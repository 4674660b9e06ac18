"""A short derandomized run of the model fuzzer, byte and structure mutations alike, each case loaded
and run in a worker subprocess (a crash is counted, not fatal); the long run is its own command
(``python -m tests.fuzz.fuzz_models``, or this file's slow test)."""

from pathlib import Path

import numpy as np
import pytest

import delegate
from tests.fuzz import fuzz_models
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


def test_int8_outputs_are_judged_against_litert_builtin_kernels():
    """The int8 MobileNetV2-0.35 fixture, unmutated: LiteRT's default engine (XNNPACK) rounds its int8 arithmetic
    its own way (23 steps apart at the output), the numpy engine equals LiteRT's builtin kernels: a result, not a
    disagreement; a wrong integer output is one."""
    data = (Path(__file__).parent / "fixtures" / "converter" / "mobilenet_v2_035_96_int8.tflite").read_bytes()
    assert fuzz_models.check(data) == "result"
    session = delegate.load(data, backends=["cpu"], **{"cpu.engine": "numpy"})
    inputs = fuzz_models._inputs(session.graph.inputs)
    ours = [v.copy() for v in session.run(inputs).values()]
    assert fuzz_models._matches_builtin_kernels(data, inputs, ours)
    ours[0].flat[0] = np.int8(ours[0].flat[0] ^ 1)
    assert not fuzz_models._matches_builtin_kernels(data, inputs, ours)
