"""Each kernel of a model's OpenCL plan timed on the device, and the gaps between them.

    python3 docs/benchmarks/opencl_kernels.py MODEL [--precision fp32|fp16]

MODEL whole on OpenCL (greedy), run 30 times, then 60 runs with profiling events on every launch; of the last
50: per launch the median of its device time (``profile.end - profile.start``) and of the gap from its end to
the next launch's start.  The first line sums them (the device's span of a run, the kernels' time, the gaps'),
then one line per launch, largest first with --sort.  Tells whether a plan waits on its kernels or between them."""

import argparse
import json

import numpy as np

import delegate
from delegate.inputs import make_inputs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16"])
    p.add_argument("--sort", action="store_true", help="launches largest first")
    args = p.parse_args()
    session = delegate.load(args.model, None, backends="[opencl,cpu]", partitioner="greedy",
                            precision=args.precision, **{"placement.search": "estimate"})
    session.wait_until_ready()
    inputs = session.normalize_inputs(make_inputs(session.graph, None))
    for _ in range(30):
        session.run_indexed(inputs)
    compiled = next(c for c in session.executor.compiled if hasattr(c, "set_profiling"))
    compiled.set_profiling(True)
    for _ in range(60):
        session.run_indexed(inputs)
    runs = compiled.profiled[10:]
    runs[-1][-1].wait()
    device = np.array([[e.profile.end - e.profile.start for e in run] for run in runs]) / 1e3
    gaps = np.array([[run[i + 1].profile.start - run[i].profile.end for i in range(len(run) - 1)] for run in runs]) / 1e3
    span = np.array([run[-1].profile.end - run[0].profile.start for run in runs]) / 1e3
    labels = [spec.label for spec in compiled.plan.launches]
    print(json.dumps({"model": args.model.rsplit("/", 1)[-1], "launches": len(labels),
                      "span_us": round(float(np.median(span)), 1),
                      "kernels_us": round(float(np.median(device.sum(1))), 1),
                      "gaps_us": round(float(np.median(gaps.sum(1))), 1),
                      "kernel_median_us": round(float(np.median(device)), 2),
                      "gap_median_us": round(float(np.median(gaps)), 2) if gaps.size else None}))
    rows = [{"launch": labels[i], "kernel_us": round(float(np.median(device[:, i])), 2),
             "gap_after_us": round(float(np.median(gaps[:, i])), 2) if i < len(labels) - 1 else None}
            for i in range(len(labels))]
    for row in sorted(rows, key=lambda r: -r["kernel_us"]) if args.sort else rows:
        print(json.dumps(row))
    session.close()


if __name__ == "__main__":
    main()
