"""How much slower each CPU engine's int8 and int16x8 kernels are than its float ones, op class by op class.

Chains of 1 and 9 ops of one class on one shape, float32, int8 and int16 activations (int8 weights); the
difference of the two, per op, is one kernel's time.  With ``--model``: each op of a model compiled alone on
LiteRT's interpreter and timed, summed per cost class, next to its roofline (the default LiteRT profile's
figures): the same ratio on real ops' shapes.  What the CPU plugin's ``kind_scale`` defaults hold.

    python3 docs/benchmarks/cpu_kinds.py [--engine litert|numpy] [--model FILE...]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from delegate import read_model
from delegate.backend import CompileOptions
from delegate.session import RunSettings, Session
from delegate.tflite.builder import GraphBuilder

QUANT = {"int8": (0.05, 3), "int16": (0.01, 0)}
WEIGHT_SCALE = 0.002
OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL", "ADD", "MUL", "LOGISTIC", "MEAN",
       "SOFTMAX")


def chain(opcode: str, kind: str, length: int) -> bytes:
    b = GraphBuilder()
    rng = np.random.default_rng(0)
    q = QUANT.get(kind)
    shape = {"CONV_2D": (1, 32, 32, 64), "DEPTHWISE_CONV_2D": (1, 32, 32, 64)}.get(opcode, (1, 64, 64))
    x = b.input("x", shape, "float32" if q is None else kind, quant=q)

    def weights(i, shape, channels):
        w = rng.standard_normal(shape).astype(np.float32) * 0.05
        if q is None:
            return b.const(f"w{i}", w), b.const(f"b{i}", np.zeros(channels, np.float32))
        return (b.const(f"w{i}", np.clip(np.round(w / WEIGHT_SCALE), -127, 127).astype(np.int8), quant=(WEIGHT_SCALE, 0)),
                b.const(f"b{i}", np.zeros(channels, np.int64 if kind == "int16" else np.int32),
                        quant=(q[0] * WEIGHT_SCALE, 0)))
    source, outputs = x, []
    for i in range(length):
        if opcode == "CONV_2D":
            x = b.op(opcode, [x, *weights(i, (64, 3, 3, 64), 64)], quant=q, options={
                "padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "NONE"})
        elif opcode == "DEPTHWISE_CONV_2D":
            x = b.op(opcode, [x, *weights(i, (1, 3, 3, 64), 64)], quant=q, options={
                "padding": "SAME", "stride_w": 1, "stride_h": 1, "depth_multiplier": 1,
                "fused_activation_function": "NONE"})
        elif opcode == "FULLY_CONNECTED":
            x = b.op(opcode, [x, *weights(i, (64, 64), 64)], quant=q,
                     options={"fused_activation_function": "NONE", "keep_num_dims": True})
        elif opcode == "BATCH_MATMUL":
            x = b.op(opcode, [x, x], quant=q, options={"adj_x": False, "adj_y": False})
        elif opcode in ("ADD", "MUL"):
            x = b.op(opcode, [x, x], quant=q, options={"fused_activation_function": "NONE"})
        elif opcode == "LOGISTIC":  # the int kernels' fixed output scale
            x = b.op(opcode, [x], quant=None if q is None else (1 / 256, -128) if kind == "int8" else (1 / 32768, 0))
        elif opcode == "MEAN":  # a mean does not chain: each reads the input, and each is an output
            outputs.append(b.op(opcode, [source, b.const(f"axis{i}", np.array([2], np.int32))], quant=q,
                                options={"keep_dims": True}))
        elif opcode == "SOFTMAX":
            x = b.op(opcode, [x], quant=None if q is None else (1 / 256, -128) if kind == "int8" else (1 / 32768, 0),
                     options={"beta": 1.0})
    for y in outputs or [x]:
        b.output(y)
    return b.to_bytes()


def per_run_ms(data: bytes, engine: str) -> float:
    session = Session(read_model(data), RunSettings(backends=[("cpu", {"engine": engine})],
                                                    compile=CompileOptions(num_threads=1)))
    t = session.graph.inputs[0]
    x = np.ones(t.shape, t.dtype.name)
    for _ in range(3):
        session.run(x)
    times = []
    for _ in range(21):
        start = time.perf_counter()
        session.run(x)
        times.append(time.perf_counter() - start)
    session.close()
    return float(np.min(times)) * 1e3


def per_op(path: str) -> None:
    """Each op of ``path`` alone on LiteRT (min of 30 runs), summed per opcode and cost class."""
    from delegate.cost import cost_class, op_bytes, op_flops
    from delegate.partition import make_partition
    from delegate_cpu.plugin import DEFAULT_PROFILES, LitertCompiled

    profile = DEFAULT_PROFILES["litert"]
    graph = read_model(open(path, "rb").read()).main
    rows: dict[str, list[float]] = {}
    for op in graph.ops:
        try:
            interpreter = LitertCompiled(make_partition(graph, [op], "cpu", 0), 1).interpreter
            for d in interpreter.get_input_details():
                interpreter.set_tensor(d["index"], np.ones(d["shape"], d["dtype"]))
            interpreter.invoke()
        except (RuntimeError, ValueError):  # an op LiteRT cannot run alone (a shape from a folded constant)
            continue
        times = []
        for _ in range(30):
            start = time.perf_counter()
            interpreter.invoke()
            times.append(time.perf_counter() - start)
        row = rows.setdefault(f"{op.opcode} {cost_class(op)}", [0, 0.0, 0.0])
        row[0] += 1
        row[1] += min(times) * 1e3
        row[2] += profile.roofline_ms(op_flops(op), op_bytes(op))
    print(f"{path}: {sum(r[1] for r in rows.values()):.3f} ms over its ops alone")
    for key, (n, ms, roof) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(f"  {key:40s} {int(n):4d} ops {ms:8.4f} ms  x{ms / max(roof, 1e-9):.1f} roofline")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=["litert", "numpy"], default="litert")
    p.add_argument("--model", nargs="+", help="time each op of these models alone on LiteRT instead")
    args = p.parse_args()
    if args.model:
        for path in args.model:
            per_op(path)
        return
    engine = args.engine
    print(f"{'op':20s} {'float ms':>9s} {'int8 x':>7s} {'int16 x':>8s}")
    for opcode in OPS:
        row = {}
        for kind in ("float", "int8", "int16"):
            try:
                row[kind] = (per_run_ms(chain(opcode, kind, 9), engine) - per_run_ms(chain(opcode, kind, 1), engine)) / 8
            except Exception as exc:  # an engine without the kernel: say so
                row[kind] = f"{type(exc).__name__}"
        base = row["float"]
        ratio = {k: f"{v / base:.1f}" if isinstance(v, float) and isinstance(base, float) else str(v)
                 for k, v in row.items()}
        print(f"{opcode:20s} {base if isinstance(base, str) else format(base, '.4f'):>9s} {ratio['int8']:>7s} "
              f"{ratio['int16']:>8s}", flush=True)


if __name__ == "__main__":
    main()
