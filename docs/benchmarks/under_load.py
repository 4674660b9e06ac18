"""The numpy engine and LiteRT's interpreter, quiet and beside one busy process, at the same threads.

    python3 docs/benchmarks/under_load.py THREADS MODEL...

Per model: each engine in a fresh process (120 runs after 10, p50 and p90 ms), first on the quiet machine,
then with one `while True: pass` process running; for the numpy engine also the median of each team size
its thread choice timed.  One line per model, load and engine."""

import json
import os
import subprocess
import sys
import time

ONE_ENGINE = r'''
import json, sys, time
import numpy as np
model, threads, engine = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if engine == "litert":
    from ai_edge_litert.interpreter import Interpreter
    interpreter = Interpreter(model_path=model, num_threads=threads)
    interpreter.allocate_tensors()
    for d in interpreter.get_input_details():
        interpreter.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    run = interpreter.invoke
else:
    import delegate
    from delegate.inputs import make_inputs
    session = delegate.load(model, backends="[cpu]", **{"cpu.engine": "numpy", "num_threads": threads})
    inputs = session.normalize_inputs(make_inputs(session.graph, None))
    run = lambda: session.run_indexed(inputs)
for _ in range(10):
    run()
times = []
for _ in range(120):
    start = time.perf_counter()
    run()
    times.append((time.perf_counter() - start) * 1e3)
row = {"p50": round(float(np.median(times)), 3), "p90": round(float(np.percentile(times, 90)), 3)}
if engine == "numpy" and hasattr(session.executor.compiled[0].threading, "samples"):
    row["teams"] = {team: round(float(np.median(s)) * 1e3, 2)
                    for team, s in sorted(session.executor.compiled[0].threading.samples.items())}
print(json.dumps(row))
'''


def main() -> None:
    threads, models = sys.argv[1], sys.argv[2:]
    for model in models:
        for load in ("quiet", "busy"):
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load == "busy" else None
            time.sleep(0.3)
            try:
                for engine in ("litert", "numpy"):
                    done = subprocess.run([sys.executable, "-c", ONE_ENGINE, model, threads, engine],
                                          capture_output=True, text=True, timeout=300)
                    out = done.stdout.strip().splitlines()
                    print(os.path.basename(model), threads, load, engine,
                          out[-1] if out else done.stderr.strip()[-200:], flush=True)
            finally:
                if busy is not None:
                    busy.kill()


if __name__ == "__main__":
    main()
