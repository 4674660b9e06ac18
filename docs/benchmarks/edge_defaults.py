"""Check the shipped defaults (configs/edge.yaml) on every corpus model: they must never be slower than
`--backends cpu` (where the accelerators are software devices, PoCL and lavapipe, that is the CPU plan
itself, except for ops the CPU runs through reference loops) and `delegate validate` must pass.

    python3 docs/benchmarks/edge_defaults.py [MODEL ...]

Prints one row per model (backends of the plan's partitions; where that is not the CPU alone, the defaults'
median time over the CPU plan's, the two run alternately in one process; validate's exit status) and exits 1
if any model fails a check.  Not a test: it runs every model, minutes under load."""

import json
import subprocess
import sys
from pathlib import Path

from delegate import zoo

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "edge.yaml"


def litert_runs(path: Path) -> bool:
    """Whether LiteRT itself runs the model on zeros: one MediaPipe model needs MediaPipe's custom ops, and
    LiteRT refuses int16 SQUARED_DIFFERENCE only when it runs (validate has no reference for either)."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter
    try:
        interpreter = Interpreter(model_path=str(path))
        interpreter.allocate_tensors()
        for d in interpreter.get_input_details():
            interpreter.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        interpreter.invoke()
        return True
    except (RuntimeError, ValueError):
        return False


def corpus() -> list[str]:
    """MediaPipe models LiteRT runs, the zoo, the converter fixtures."""
    mediapipe = sorted(str(p) for p in (Path.home() / ".cache/delegate-tests/mediapipe-0.10.21").glob("*.tflite")
                       if litert_runs(p))
    fixtures = sorted(str(p) for p in (ROOT / "tests/fixtures/converter").glob("*.tflite") if litert_runs(p))
    return mediapipe + [f"zoo:{name}" for name in sorted(zoo.ZOO)] + fixtures


def ratio_to_cpu(model: str, runs: int = 20) -> float:
    """Median time of the defaults' plan over the CPU plan's, alternating on the same inputs."""
    from dataclasses import replace

    import numpy as np
    from delegate.cli import read_model_arg
    from delegate.config import load_config
    from delegate.inputs import random_input
    from delegate.session import Session, run_settings
    from delegate.tools.measure import time_alternating

    settings = run_settings(load_config(str(CONFIG)).for_model(model))
    alone = replace(settings, backends=[b for b in settings.backends if b[0] == "cpu"])
    defaults, cpu = (Session(read_model_arg(model)[0], s) for s in (settings, alone))  # a model each
    rng = np.random.default_rng(0)
    inputs = defaults.normalize_inputs([random_input(t, rng) for t in defaults.graph.inputs])
    time_alternating(lambda: defaults.run_indexed(inputs), lambda: cpu.run_indexed(inputs), 3)  # warm-up
    ours, theirs = time_alternating(lambda: defaults.run_indexed(inputs), lambda: cpu.run_indexed(inputs), runs)
    return float(np.median(ours) / np.median(theirs))


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
        ratio = 1.0 if backends == "cpu" else ratio_to_cpu(model) if not backends.startswith("plan") else None
        ok = ratio is not None and ratio <= 1.05 and rc == 0
        failed += not ok
        against = "same plan" if backends == "cpu" else "-" if ratio is None else f"{ratio:.2f}x cpu"
        print(f"{'ok  ' if ok else 'FAIL'} {Path(model).name:45s} plan: {backends:20s} {against:10s} "
              f"validate: {rc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
