"""The 14 real models of the mediapipe==0.10.21 wheel, fetched once into a cache."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

WHEEL = "mediapipe==0.10.21"
CACHE = Path(os.environ.get("DELEGATE_TEST_CACHE", Path.home() / ".cache" / "delegate-tests"))
# The model needing MediaPipe-only custom ops (Landmarks2TransformMatrix, TransformLandmarks,
# TransformTensorBilinear) that neither LiteRT's pip interpreter nor delegate provides.
NEEDS_MEDIAPIPE_OPS = {"face_landmark_with_attention.tflite"}


def mediapipe_models() -> dict[str, Path]:
    """name -> path of every .tflite in the wheel; skips the calling test when offline."""
    target = CACHE / "mediapipe-0.10.21"
    marker = target / ".complete"
    if not marker.exists():
        target.mkdir(parents=True, exist_ok=True)
        wheels = list(CACHE.glob("mediapipe-0.10.21-*.whl"))
        if not wheels:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(CACHE), WHEEL],
                                  capture_output=True, text=True, timeout=600)
            wheels = list(CACHE.glob("mediapipe-0.10.21-*.whl"))
            if proc.returncode != 0 or not wheels:
                pytest.skip(f"cannot download {WHEEL} (offline?): {proc.stderr.strip().splitlines()[-1:]}")
        with zipfile.ZipFile(wheels[0]) as z:
            for name in z.namelist():
                if name.endswith(".tflite"):
                    (target / Path(name).name).write_bytes(z.read(name))
        marker.touch()
    return {p.name: p for p in sorted(target.glob("*.tflite"))}
