"""Soak harness: many inferences per backend with memory and handle counts at start and end.

    python -m tests.soak.soak --runs 10000 --model zoo:mobilenet_v1 --backends cpu,opencl,wgpu

A backend leaks when RSS keeps growing after warm-up or open file descriptors
grow; the report gives both, and the exit code is 1 when growth passes the
stated bounds.  The CI runs a short version (tests/test_soak.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from delegate.cli import read_model_arg
from delegate.inputs import random_input
from delegate.session import RunSettings, Session

RSS_GROWTH_BOUND_MB = 20.0
FD_GROWTH_BOUND = 4


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def soak(model_spec: str, backend: str, runs: int, warmup: int = 20) -> dict:
    model, _, _ = read_model_arg(model_spec)
    session = Session(model, RunSettings(backends=[(backend, {}), ("cpu", {"engine": "numpy"})], fallback=False))
    rng = np.random.default_rng(0)
    inputs = session.normalize_inputs([random_input(t, rng) for t in session.graph.inputs])
    for _ in range(warmup):
        session.run_indexed(inputs)
    start_rss, start_fds = rss_mb(), open_fds()
    started = time.perf_counter()
    first = session.run_indexed(inputs)
    for _ in range(runs - 1):
        last = session.run_indexed(inputs)
    seconds = time.perf_counter() - started
    same = all(np.array_equal(first[k], last[k]) for k in first) if runs > 1 else True
    end_rss, end_fds = rss_mb(), open_fds()
    session.close()
    return {"backend": backend, "model": model_spec, "runs": runs, "seconds": round(seconds, 1),
            "rss_start_mb": round(start_rss, 1), "rss_end_mb": round(end_rss, 1),
            "fds_start": start_fds, "fds_end": end_fds, "outputs_stable": same,
            "ok": same and end_rss - start_rss <= RSS_GROWTH_BOUND_MB and end_fds - start_fds <= FD_GROWTH_BOUND}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--model", default="zoo:mobilenet_v1")
    p.add_argument("--backends", default="cpu,opencl,wgpu")
    args = p.parse_args(argv)
    reports = []
    for backend in args.backends.split(","):
        try:
            reports.append(soak(args.model, backend, args.runs))
        except Exception as exc:  # an unavailable backend is reported, the others still run
            reports.append({"backend": backend, "error": f"{type(exc).__name__}: {exc}", "ok": False})
        print(json.dumps(reports[-1]), flush=True)
    return 0 if all(r["ok"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
