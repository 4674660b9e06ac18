"""Check the shipped defaults (configs/edge.yaml) on every corpus model: where the accelerators are software
devices (PoCL, lavapipe) the plan must keep every op on the CPU, and `delegate validate` must pass.

    python3 docs/benchmarks/edge_defaults.py [MODEL ...]

Prints one row per model (backends of the plan's partitions, validate's exit status) and exits 1 if any
model fails either check.  Not a test: it runs every model, minutes under load."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "edge.yaml"
ZOO = ("mobilenet_v1", "mobilenet_v2", "deeplab_v3", "mobilenet_ssd", "posenet", "yolo_tiny", "transformer_block")


def litert_runs(path: Path) -> bool:
    """Whether LiteRT itself loads the model (one MediaPipe model needs MediaPipe's custom ops)."""
    from ai_edge_litert.interpreter import Interpreter
    try:
        Interpreter(model_path=str(path)).allocate_tensors()
        return True
    except (RuntimeError, ValueError):
        return False


def corpus() -> list[str]:
    """MediaPipe models LiteRT runs, the zoo, the converter fixtures."""
    mediapipe = sorted(str(p) for p in (Path.home() / ".cache/delegate-tests/mediapipe-0.10.21").glob("*.tflite")
                       if litert_runs(p))
    fixtures = sorted(str(p) for p in (ROOT / "tests/fixtures/converter").glob("*.tflite"))
    return mediapipe + [f"zoo:{name}" for name in ZOO] + fixtures


def check(model: str) -> tuple[str, int]:
    plan = subprocess.run(["delegate", "plan", model, "--config", str(CONFIG), "--json"],
                          capture_output=True, text=True)
    if plan.returncode:
        backends = f"plan exit {plan.returncode}"
    else:
        backends = ",".join(sorted({p["backend"] for p in json.loads(plan.stdout)["partitions"]}))
    validate = subprocess.run(["delegate", "validate", model, "--config", str(CONFIG)], capture_output=True)
    return backends, validate.returncode


def main() -> int:
    failed = 0
    for model in sys.argv[1:] or corpus():
        backends, rc = check(model)
        ok = backends == "cpu" and rc == 0
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {Path(model).name:45s} plan: {backends:20s} validate: {rc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
