"""Short soak: repeated inferences keep memory, handles and outputs stable (the long run is its own command)."""

from tests.soak.soak import soak


def test_cpu_soak_is_stable():
    report = soak("zoo:posenet", "cpu", runs=100)
    assert report["outputs_stable"]
    assert report["ok"], report
