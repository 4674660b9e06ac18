"""CPU plan estimates against measurements over the corpus, one `delegate bench` per model.

Each model is benched in a fresh copy of one profile directory (the defaults, or a calibrated one), so that
every estimate comes from that profile alone and not from what the previous models' benches taught it.  Next
to the median (what bench reports) the fastest of the timed runs: on a machine shared with other work the
median of a large model grows with the load, its fastest run much less.

    python3 docs/benchmarks/cpu_estimates.py --engine litert [--calibrate] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from delegate import zoo

ROOT = Path(__file__).resolve().parents[2]
MEDIAPIPE = Path.home() / ".cache/delegate-tests/mediapipe-0.10.21"


def corpus() -> list[str]:
    fixtures = sorted(str(p) for p in (ROOT / "tests/fixtures/converter").glob("*.tflite")
                      if not p.stem.endswith("_buffer_offset"))
    return fixtures + [f"zoo:{n}" for n in sorted(zoo.ZOO)] + sorted(str(p) for p in MEDIAPIPE.glob("*.tflite"))


def delegate(args: list[str], profiles: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DELEGATE_PROFILE_DIR": profiles}
    return subprocess.run([sys.executable, "-m", "delegate.cli", *args], capture_output=True, text=True, env=env)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=["litert", "numpy"], default="litert")
    p.add_argument("--calibrate", action="store_true", help="run `delegate calibrate --backends cpu` first")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("models", nargs="*", help="default: the whole corpus")
    args = p.parse_args()
    engine = ["--set", f"cpu.engine={args.engine}"]
    base = tempfile.mkdtemp(prefix="delegate-profiles-")
    if args.calibrate:
        done = delegate(["calibrate", "--backends", "cpu", *engine, "--set", "num_threads=1"], base)
        if done.returncode:  # refused (exit 11: the machine was busy) or failed: say why
            print((done.stderr.strip() or done.stdout.strip())[-600:], file=sys.stderr)
            return done.returncode
    rows = []
    print(f"{'model':36s} {'estimated':>9s} {'median':>9s} {'ratio':>7s} {'fastest':>9s} {'ratio':>7s}")
    for model in args.models or corpus():
        profiles = tempfile.mkdtemp(prefix="delegate-profiles-")
        shutil.copytree(base, profiles, dirs_exist_ok=True)
        runs = Path(profiles) / "runs.csv"
        done = delegate(["bench", model, "--backends", "cpu", *engine, "--set", "num_threads=1",
                         "--runs", str(args.runs), "--json", "--csv", str(runs)], profiles)
        fastest = min((float(line.split(",")[1]) for line in runs.read_text().splitlines()[1:]), default=0.0) \
            if runs.exists() else 0.0
        shutil.rmtree(profiles)
        name = model.removeprefix(str(ROOT) + "/").rsplit("/", 1)[-1].removesuffix(".tflite")
        if done.returncode:
            print(f"{name}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}",
                  file=sys.stderr)
            continue
        doc = json.loads(done.stdout)
        rows.append({"model": name, "estimated_ms": doc["estimated_ms"], "measured_ms": doc["median_ms"],
                     "ratio": round(doc["estimated_ms"] / doc["median_ms"], 3), "fastest_ms": round(fastest, 4),
                     "ratio_to_fastest": round(doc["estimated_ms"] / fastest, 3)})
        print(f"{name:36s} {doc['estimated_ms']:9.3f} {doc['median_ms']:9.3f} {rows[-1]['ratio']:7.2f} "
              f"{fastest:9.3f} {rows[-1]['ratio_to_fastest']:7.2f}", flush=True)
    shutil.rmtree(base)
    within = sum(0.75 <= r["ratio"] <= 1.25 for r in rows)
    fast = sum(0.75 <= r["ratio_to_fastest"] <= 1.25 for r in rows)
    print(f"engine {args.engine}, {'calibrated' if args.calibrate else 'defaults'}: {within} of {len(rows)} "
          f"estimates within ±25% of the median, {fast} of the fastest run; load {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
