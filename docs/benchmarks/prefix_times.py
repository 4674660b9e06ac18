"""Where in a network the numpy engine and LiteRT's interpreter part: each run on prefixes of the model.

    python3 docs/benchmarks/prefix_times.py MODEL THREADS LAST_OP[,LAST_OP...]

LiteRT's Python interpreter times no op of a model it runs whole, and an op run alone (a one-op model, its
weights and input hot in the caches) is not the op inside the network, whose weights come cold after the ops
before it.  So each prefix of the model up to (and including) each LAST_OP is written as a model of its own
and run by both engines, back to back, the same input (the model's first input, random) in each: the best of
three medians of 60 runs after 10, no output copied.  A prefix's time less the one before it is what that
stretch of ops costs inside the network.  One line per prefix: both times, both stretches' costs and their
ratio.  The model's ops must run in the order they are stored (a chain of stretches, as MobileNets are)."""

import sys

import numpy as np

import delegate
from delegate.export import partition_model
from delegate.inputs import make_inputs
from delegate.partition import make_partition
from delegate.tflite.reader import read_model
from delegate.tflite.writer import write_model
from delegate.tools.measure import alone_median

ROUNDS, RUNS, WARMUP = 3, 60, 10


def prefix_ms(graph, last: int, threads: int, first_input: np.ndarray) -> tuple[float, float]:
    """LiteRT's and the numpy engine's time on the ops up to ``last``."""
    from ai_edge_litert.interpreter import Interpreter

    data = write_model(partition_model(make_partition(graph, graph.ops[:last + 1], "cpu", 0)))
    interpreter = Interpreter(model_content=data, num_threads=threads)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], first_input)
    session = delegate.load(data, backends="[cpu]", **{"cpu.engine": "numpy", "num_threads": threads})
    try:
        inputs = session.normalize_inputs({session.graph.inputs[0].name: first_input})
        ours = lambda: session.run_into(inputs, lambda outputs, owned: None)  # noqa: E731
        return (min(alone_median(interpreter.invoke, RUNS, WARMUP) for _ in range(ROUNDS)),
                min(alone_median(ours, RUNS, WARMUP) for _ in range(ROUNDS)))
    finally:
        session.close()


def main() -> None:
    model, threads, lasts = sys.argv[1], int(sys.argv[2]), [int(v) for v in sys.argv[3].split(",")]
    graph = read_model(open(model, "rb").read()).subgraphs[0]
    first_input = next(iter(make_inputs(graph, None).values()))
    before = (0.0, 0.0)
    for last in lasts:
        litert, ours = prefix_ms(graph, last, threads, first_input)
        op = graph.ops[last]
        stretch = (litert - before[0], ours - before[1])
        print(f"ops ..{last:3d} ({op.opcode} {tuple(op.outputs[0].shape)}): litert {litert:6.3f} ms, numpy engine "
              f"{ours:6.3f} | this stretch: litert {stretch[0]:6.3f}, numpy engine {stretch[1]:6.3f}, ratio "
              f"{stretch[1] / stretch[0] if stretch[0] > 0 else float('nan'):.2f}")
        before = (litert, ours)


if __name__ == "__main__":
    main()
