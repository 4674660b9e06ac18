"""Model fuzzing harness: mutate models byte- and field-wise and feed them to the reader and planner.

Every outcome must be a successful plan, ModelFormatError or UnsupportedOpError:
any other exception, a case slower than ``--timeout`` seconds, or memory past
``--max-memory-mb`` (address-space cap on the process) is a failure, and the
offending bytes are saved for replay.

    python -m tests.fuzz.fuzz_models --count 100000 --seed 1 --out /tmp/fuzz-crashes

The CI runs a short derandomized version (tests/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from delegate import ModelFormatError, UnsupportedOpError, read_model
from delegate.tflite.builder import GraphBuilder
from delegate.tflite.writer import write_model


class CaseTimeout(Exception):
    pass


def seed_models() -> list[bytes]:
    """Small builder models covering options, constants, quantization, signatures and offset buffers."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 3), shape_signature=(-1, 8, 8, 3))
    y = b.op("CONV_2D", [x, b.const("w", rng.standard_normal((4, 3, 3, 3))), b.const("b", np.zeros(4))],
             options={"padding": "SAME", "stride_w": 2, "stride_h": 2, "fused_activation_function": "RELU"})
    y = b.op("RESHAPE", [y, b.const("s", np.array([1, 64], np.int32))], options={"new_shape": [1, 64]})
    b.output(b.op("SOFTMAX", [y], options={"beta": 1.0}))
    float_model = b.build()
    q = GraphBuilder()
    xi = q.input("x", (1, 4, 4, 2), "int8", quant=(0.05, 1))
    w = q.const("w", rng.integers(-10, 10, (2, 1, 1, 2)).astype(np.int8), quant=([0.1, 0.2], [0, 0], 0))
    q.output(q.op("CONV_2D", [xi, w, None], options={"padding": "VALID", "stride_w": 1, "stride_h": 1},
                  quant=(0.1, 0)))
    return [write_model(float_model), write_model(float_model, external_buffers=True), q.to_bytes()]


def mutate(data: bytes, rnd: random.Random) -> bytes:
    """One of: flip bytes, overwrite a 32-bit word with an extreme, truncate, duplicate a slice."""
    blob = bytearray(data)
    kind = rnd.randrange(4)
    if kind == 0:
        for _ in range(rnd.randint(1, 8)):
            blob[rnd.randrange(len(blob))] = rnd.randrange(256)
    elif kind == 1:
        pos = rnd.randrange(max(len(blob) - 4, 1))
        value = rnd.choice([0, 1, -1, 0x7FFFFFFF, -0x80000000, rnd.randrange(1 << 32) - (1 << 31), len(blob)])
        blob[pos:pos + 4] = int(value).to_bytes(4, "little", signed=True)
    elif kind == 2:
        blob = blob[:rnd.randrange(len(blob) + 1)]
    else:
        a = rnd.randrange(len(blob))
        b = min(len(blob), a + rnd.randint(1, 64))
        at = rnd.randrange(len(blob))
        blob[at:at] = blob[a:b]
    return bytes(blob)


def check(data: bytes) -> str:
    """Outcome name of one case (read, validate, plan); raises on anything that is not allowed."""
    from delegate import CompileOptions
    from delegate.planner import Planner
    from delegate.plugins import default_manager
    from delegate.session import backend_profiles
    from delegate.validate import validate_graph

    try:
        model = read_model(data)
        validate_graph(model.main)
        backends = {"cpu": default_manager().backend_info("cpu").factory({})}
        Planner(backends, backend_profiles(backends), CompileOptions()).plan(model.main)
    except (ModelFormatError, UnsupportedOpError) as exc:
        return type(exc).__name__
    return "planned"


def run(count: int, seed: int, timeout: float, out: Path | None, extra: list[Path]) -> dict:
    rnd = random.Random(seed)
    seeds = seed_models() + [p.read_bytes() for p in extra]
    outcomes: Counter = Counter()
    failures = []

    def on_alarm(signum, frame):
        raise CaseTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    started = time.perf_counter()
    for i in range(count):
        data = mutate(rnd.choice(seeds), rnd)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            outcomes[check(data)] += 1
        except CaseTimeout:
            failures.append((i, "timeout", data))
        except MemoryError:
            failures.append((i, "memory", data))
        except Exception as exc:  # the thing being hunted
            failures.append((i, f"{type(exc).__name__}: {exc}", data))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    if out is not None and failures:
        out.mkdir(parents=True, exist_ok=True)
        for i, why, data in failures:
            (out / f"case{i}.tflite").write_bytes(data)
            (out / f"case{i}.txt").write_text(why)
    return {"cases": count, "seed": seed, "seconds": round(time.perf_counter() - started, 1),
            "outcomes": dict(outcomes), "failures": [(i, why) for i, why, _ in failures]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=5.0, help="seconds allowed per case")
    p.add_argument("--max-memory-mb", type=int, default=4096, help="address-space cap of this process")
    p.add_argument("--out", type=Path, help="save failing cases here")
    p.add_argument("models", nargs="*", type=Path, help="extra seed models (e.g. real .tflite files)")
    args = p.parse_args(argv)
    cap = args.max_memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    report = run(args.count, args.seed, args.timeout, args.out, args.models)
    print(json.dumps(report, indent=1))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
