"""Model fuzzing harness: mutate models byte-wise and structure-wise, then load and run each.

Byte mutations (flips, extreme words, truncation, duplicated slices) attack the
reader; structure mutations (operand shapes, op options, quantization
parameters, constant operands, rewired inputs, custom options) are made on the
IR and written out, so they pass the reader and attack validation, the
kernels, the LiteRT engine and the native loops behind it.  Each case is read,
loaded on the CPU backend and run once on seeded inputs with the numpy engine
(the project's kernels and native loops), then with the default engine (LiteRT
where it takes the model), and the two compared ("disagrees" counts the cases
whose outputs differ past float rounding; integer outputs that differ from the
default engine's count as agreeing where they equal LiteRT's builtin kernels',
the numpy engine's reference: XNNPACK rounds int8 its own way).

Every outcome must be a result or one of the package's errors (a DelegateError
subclass, by class name).  Any other exception, a crash of the process (cases
run in a worker subprocess, restarted after a crash), a case slower than
``--timeout`` seconds or memory past ``--max-memory-mb`` (address-space cap of
the worker) is a failure, and the offending bytes are saved for replay.

    python -m tests.fuzz.fuzz_models --count 4000 --seed 1 --out /tmp/fuzz-crashes

The CI runs a short derandomized batch (tests/test_fuzz.py); the long run is this command.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from delegate.tflite.builder import GraphBuilder
from delegate.tflite.writer import write_model

KINDS = ("bytes", "structure")
# Extreme values a structure mutation writes into shapes, options and constants.
EXTREMES = (0, 1, -1, 2, 3, -2, 7, 255, 256, 1 << 15, (1 << 31) - 1, -(1 << 31), 262_144)
SCALES = (0.0, -1.0, float("nan"), float("inf"), 1e-45, 1e38, 1.0)
ZERO_POINTS = (1 << 40, -129, 256, 128, -1, 0, 1 << 31)


class CaseTimeout(Exception):
    pass


def seed_models() -> list[bytes]:
    """Small builder models covering the ops and operands the hostile-input review attacked:
    convolutions, pads, pools, resizes, reshapes, products, gathers, quantized arithmetic,
    custom ops, signatures and offset buffers."""
    from flatbuffers import flexbuffers

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
    yq = q.op("CONV_2D", [xi, w, None], options={"padding": "VALID", "stride_w": 1, "stride_h": 1}, quant=(0.1, 0))
    q.output(q.op("ADD", [yq, yq], quant=(0.2, 0)))

    c = GraphBuilder()
    x = c.input("x", (1, 6, 6, 4))
    y = c.op("PAD", [x, c.const("p", np.array([[0, 0], [1, 1], [1, 1], [0, 2]], np.int32))])
    y = c.op("DEPTHWISE_CONV_2D", [y, c.const("w", rng.standard_normal((1, 3, 3, 6))), c.const("b", np.zeros(6))],
             options={"padding": "VALID", "stride_w": 1, "stride_h": 1, "depth_multiplier": 1,
                      "dilation_w_factor": 1, "dilation_h_factor": 1})
    y = c.op("AVERAGE_POOL_2D", [y], options={"padding": "SAME", "stride_w": 2, "stride_h": 2, "filter_width": 2,
                                              "filter_height": 2})
    y = c.op("RESIZE_BILINEAR", [y, c.const("size", np.array([4, 4], np.int32))], options={"align_corners": False})
    y = c.op("MEAN", [y, c.const("axes", np.array([1, 2], np.int32))], options={"keep_dims": False})
    y = c.op("FULLY_CONNECTED", [y, c.const("fw", rng.standard_normal((5, 6))), c.const("fb", np.zeros(5))],
             options={"keep_num_dims": False})
    c.output(c.op("GATHER", [y, c.const("i", np.array([0, 2], np.int32))], options={"axis": 1}))

    d = GraphBuilder()
    boxes, scores = d.input("boxes", (1, 8, 4)), d.input("scores", (1, 8, 3))
    anchors = d.const("anchors", np.clip(rng.random((8, 4)), 0.1, 0.9).astype(np.float32))
    options = flexbuffers.Dumps({"max_detections": 4, "max_classes_per_detection": 1, "detections_per_class": 4,
                                 "num_classes": 2, "nms_score_threshold": 0.1, "nms_iou_threshold": 0.5,
                                 "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0,
                                 "use_regular_nms": False})
    d.output(*d.op("TFLite_Detection_PostProcess", [boxes, scores, anchors], custom=True, custom_options=options,
                   num_outputs=4, dtype="float32"))
    t = GraphBuilder()
    x = t.input("x", (1, 3, 3, 2))
    t.output(t.op("Convolution2DTransposeBias", [x, t.const("w", rng.standard_normal((3, 3, 3, 2))),
                                                 t.const("b", np.zeros(3))], custom=True,
                  custom_options=np.array([2, 2, 2], "<i4").tobytes()))
    return [write_model(float_model), write_model(float_model, external_buffers=True), q.to_bytes(),
            c.to_bytes(), d.to_bytes(), t.to_bytes()]


def mutate_bytes(data: bytes, rnd: random.Random) -> bytes:
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


def mutate_structure(data: bytes, rnd: random.Random) -> bytes:
    """One to three IR mutations of the model, written out (retried until one can be written)."""
    from delegate import read_model

    for _ in range(20):
        model = read_model(data)
        graph = model.main
        for _ in range(rnd.randint(1, 3)):
            rnd.choice(_MUTATIONS)(graph, rnd)
        try:
            return write_model(model)
        except Exception:  # a value the schema cannot hold (an int option set to a float...): try another
            continue
    return data


def _shape(graph, rnd):
    t = rnd.choice(graph.tensors)
    shape = list(t.shape)
    if shape and rnd.random() < 0.7:
        shape[rnd.randrange(len(shape))] = rnd.choice(EXTREMES[:9] + (shape[0] * 2 + 1,))
    elif shape and rnd.random() < 0.5:
        shape.pop(rnd.randrange(len(shape)))
    else:
        shape.insert(rnd.randrange(len(shape) + 1), rnd.choice((1, 2, 3)))
    t.shape = tuple(shape)
    if t.shape_signature is not None:
        t.shape_signature = tuple(-1 if s == -1 and i == 0 else d for i, (s, d) in
                                  enumerate(zip(t.shape_signature + (0,) * len(shape), shape)))


def _option(graph, rnd):
    ops = [op for op in graph.ops if op.options]
    if not ops:
        return _custom_options(graph, rnd)
    op = rnd.choice(ops)
    key = rnd.choice(sorted(op.options))
    value = op.options[key]
    if isinstance(value, bool):
        op.options[key] = not value
    elif isinstance(value, int):
        op.options[key] = rnd.choice(EXTREMES)
    elif isinstance(value, float):
        op.options[key] = rnd.choice(SCALES)
    elif isinstance(value, list):
        op.options[key] = [rnd.choice(EXTREMES) for _ in range(rnd.randint(0, 5))]


def _quantization(graph, rnd):
    from delegate.ir import Quantization

    quantized = [t for t in graph.tensors if t.quantization is not None] or graph.tensors
    t = rnd.choice(quantized)
    q = t.quantization or Quantization(np.ones(1, np.float32), np.zeros(1, np.int64))
    scale, zero = q.scale.copy(), q.zero_point.copy()
    what = rnd.randrange(4)
    if what == 0:
        scale[rnd.randrange(scale.size)] = rnd.choice(SCALES)
    elif what == 1:
        zero[rnd.randrange(zero.size)] = rnd.choice(ZERO_POINTS)
    elif what == 2:  # per-channel parameters of the wrong count
        n = rnd.choice((2, 3, 7))
        scale, zero = np.full(n, 0.5, np.float32), np.zeros(n, np.int64)
    t.quantization = Quantization(scale, zero, rnd.choice((q.axis, 0, 3, -1, 9)) if what == 3 else q.axis)


def _constant(graph, rnd):
    constants = [t for t in graph.tensors if t.data is not None and t.data.size and t.data.dtype.kind in "iuf"]
    if not constants:
        return _shape(graph, rnd)
    t = rnd.choice(constants)
    data = np.array(t.data)
    flat = data.reshape(-1)
    value = rnd.choice(EXTREMES if data.dtype.kind in "iu" else SCALES)
    info = np.iinfo(data.dtype) if data.dtype.kind in "iu" else None
    flat[rnd.randrange(flat.size)] = min(max(value, info.min), info.max) if info else value
    t.data = data


def _rewire(graph, rnd):
    ops = [op for op in graph.ops if op.inputs]
    if not ops:
        return
    op = rnd.choice(ops)
    what = rnd.randrange(4)
    if what == 0:
        op.inputs[rnd.randrange(len(op.inputs))] = rnd.choice(graph.tensors)
    elif what == 1:
        op.inputs.append(rnd.choice(graph.tensors))
    elif what == 2 and len(op.inputs) > 1:
        op.inputs.pop(rnd.randrange(len(op.inputs)))
    else:
        op.inputs[rnd.randrange(len(op.inputs))] = None


def _custom_options(graph, rnd):
    ops = [op for op in graph.ops if op.custom]
    if not ops:
        return _option(graph, rnd) if any(op.options for op in graph.ops) else _shape(graph, rnd)
    op = rnd.choice(ops)
    raw = bytearray(op.custom_options or b"")
    what = rnd.randrange(3)
    if what == 0 and raw:
        op.custom_options = bytes(raw[:rnd.randrange(len(raw))])
    elif what == 1 and len(raw) >= 4:
        pos = rnd.randrange(len(raw) - 3)
        raw[pos:pos + 4] = int(rnd.choice(EXTREMES)).to_bytes(4, "little", signed=True)
        op.custom_options = bytes(raw)
    else:
        op.custom_options = bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 24)))


_MUTATIONS = (_shape, _option, _quantization, _constant, _rewire, _custom_options)


def case(seeds: list[bytes], seed: int, i: int) -> tuple[str, bytes]:
    """Case ``i`` of a run: its kind and bytes, a function of (seed, i) alone (a worker restarted
    after a crash regenerates the cases after it)."""
    rnd = random.Random(f"{seed}:{i}")
    kind = KINDS[i % len(KINDS)]
    data = rnd.choice(seeds)
    return kind, (mutate_bytes(data, rnd) if kind == "bytes" else mutate_structure(data, rnd))


def check(data: bytes) -> str:
    """Outcome of one case: read, load on the CPU backend and run once on seeded inputs, with the
    numpy engine (the project's kernels and native loops) and then the default one (LiteRT where it
    takes the model).  "result" (both ran and agree), "disagrees" (both ran, outputs differ past
    float rounding), or the class name of the package error the numpy engine ended in; raises on
    anything else."""
    import delegate
    from delegate import DelegateError

    try:
        session = delegate.load(data, backends=["cpu"], **{"cpu.engine": "numpy"})
        inputs = _inputs(session.graph.inputs)
        ours = session.run(inputs)
    except DelegateError as exc:
        return type(exc).__name__
    try:
        reference = delegate.load(data, backends=["cpu"]).run(inputs)
    except DelegateError:
        return "result"  # validation and our kernels took it; LiteRT refused it cleanly
    if all(_close(ours[k], reference[k]) for k in ours):
        return "result"
    return "result" if _matches_builtin_kernels(data, inputs, list(ours.values())) else "disagrees"


def _matches_builtin_kernels(data: bytes, inputs: list[np.ndarray], ours: list[np.ndarray]) -> bool:
    """Whether integer outputs equal LiteRT's builtin kernels' exactly: the numpy engine's int8 and int16
    kernels are bit-exact with those, where LiteRT's default delegate (XNNPACK) rounds its own way (the
    unmutated MobileNetV2-0.35 int8 fixture differs from it by 23 steps at the output)."""
    if not any(out.dtype.kind in "iu" for out in ours):
        return False
    from delegate.tools.reference import litert_cpu

    try:
        builtin = litert_cpu(data, builtin_kernels=True)(inputs)
    except (RuntimeError, ValueError):
        return False
    return all(a.shape == b.shape and (np.array_equal(a, b) if a.dtype.kind in "iu" else _close(a, b))
               for a, b in zip(ours, builtin))


def _inputs(tensors) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    inputs = []
    for t in tensors:
        dtype = t.dtype.numpy
        if dtype is None or dtype.kind not in "biuf":
            inputs.append(np.zeros(t.shape, dtype or np.float32))
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            inputs.append(rng.integers(max(info.min, -100), min(info.max, 100), t.shape, endpoint=True).astype(dtype))
        else:
            inputs.append(rng.standard_normal(t.shape).astype(dtype))
    return inputs


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to float rounding (relative to the output's range) or one quantization step.  Where
    either is inf or NaN the values are not compared: mutated weights of 1e38 overflow in an order
    that depends on how the sums run."""
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "iub" or b.dtype.kind in "iub":
        return a.size == 0 or int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max()) <= 1
    a, b = a.astype(np.float64), b.astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(b)
    scale = max(float(np.abs(b[finite]).max()) if finite.any() else 0.0, 1.0)
    return not finite.any() or float(np.abs(a[finite] - b[finite]).max()) <= 1e-4 * scale


def worker(seed: int, start: int, count: int, extra: list[Path], timeout: float, max_memory_mb: int) -> int:
    """Run cases start..count-1, one JSON line each ([index, kind, outcome or None, failure or None])."""
    cap = max_memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    seeds = seed_models() + [p.read_bytes() for p in extra]

    def on_alarm(signum, frame):
        raise CaseTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    for i in range(start, count):
        kind, data = case(seeds, seed, i)
        outcome = failure = None
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            outcome = check(data)
        except CaseTimeout:
            failure = "timeout"
        except MemoryError:
            failure = "memory"
        except Exception as exc:  # the thing being hunted
            failure = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        print(json.dumps([i, kind, outcome, failure]), flush=True)
    return 0


def run(count: int, seed: int, timeout: float, out: Path | None, extra: list[Path],
        max_memory_mb: int = 4096) -> dict:
    """Cases 0..count-1 in a worker subprocess, restarted after each crash; the counts per kind."""
    outcomes = {kind: Counter() for kind in KINDS}
    failures, disagreements, started, next_case = [], [], time.perf_counter(), 0
    root = Path(__file__).resolve().parents[2]
    while next_case < count:
        command = [sys.executable, "-m", "tests.fuzz.fuzz_models", "--worker", "--seed", str(seed), "--start",
                   str(next_case), "--count", str(count), "--timeout", str(timeout),
                   "--max-memory-mb", str(max_memory_mb), *map(str, extra)]
        proc = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env=dict(os.environ, PYTHONPATH=str(root)))
        hung = False
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], timeout + 60)
            if not ready:  # stuck where an alarm cannot reach (inside native code)
                proc.kill()
                hung = True
                break
            line = proc.stdout.readline()
            if not line:
                break
            if not line.startswith("["):
                continue  # something a library printed
            i, kind, outcome, failure = json.loads(line)
            next_case = i + 1
            if failure is None:
                outcomes[kind][outcome] += 1
                if outcome == "disagrees":
                    disagreements.append(i)
            else:
                failures.append((i, kind, failure))
        code = proc.wait()
        if next_case < count and (code != 0 or hung):
            kind = KINDS[next_case % len(KINDS)]
            failures.append((next_case, kind, "hang" if hung else f"crash (exit {code})"))
            outcomes[kind]["crash"] += 1
            next_case += 1
    if out is not None and (failures or disagreements):
        out.mkdir(parents=True, exist_ok=True)
        seeds = seed_models() + [p.read_bytes() for p in extra]
        for i, kind, why in failures + [(i, KINDS[i % len(KINDS)], "disagrees") for i in disagreements]:
            (out / f"case{i}.tflite").write_bytes(case(seeds, seed, i)[1])
            (out / f"case{i}.txt").write_text(f"{kind}: {why}")
    return {"cases": count, "seed": seed, "seconds": round(time.perf_counter() - started, 1),
            "outcomes": {kind: dict(c) for kind, c in outcomes.items()},
            "failures": [list(f) for f in failures], "disagreements": disagreements}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=4000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds allowed per case")
    p.add_argument("--max-memory-mb", type=int, default=4096, help="address-space cap of the worker")
    p.add_argument("--out", type=Path, help="save failing cases here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("models", nargs="*", type=Path, help="extra seed models (e.g. real .tflite files)")
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.seed, args.start, args.count, args.models, args.timeout, args.max_memory_mb)
    report = run(args.count, args.seed, args.timeout, args.out, args.models, args.max_memory_mb)
    print(json.dumps(report, indent=1))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
