"""The host's cost of an OpenCL launch on this device, through enqueue.c as partitions enqueue their kernels.

    python3 docs/benchmarks/opencl_launches.py trivial            # by argument count and kind
    python3 docs/benchmarks/opencl_launches.py partition MODEL    # each launch of MODEL's OpenCL partition

trivial: 64 launches of a one-line kernel with 1-24 buffer arguments (one buffer each time, distinct buffers of
4 KiB or 4 MiB, one buffer with int offsets, or pointers into shared virtual memory), or int or int4 arguments,
as 64 kernel objects and as one, median of 60 runs: microseconds per launch, and the wait after the last.
partition: MODEL whole on OpenCL (greedy, fp32), each launch enqueued 64 times alone (median of 40), with its
tensor and argument counts and work sizes, the partition's launches together, and the device's own time for them:
all enqueued behind a user event, then released and drained (no host enqueue in the way; median of 40).  One JSON
document on stdout."""

import json
import sys
import time

import numpy as np
import pyopencl as cl

from delegate_opencl.enqueue import PreparedLaunches, native_enqueue


def per_launch(native, queue, launches, reps: int) -> tuple[float, float]:
    """Microseconds per launch of enqueueing ``launches`` in one call, and of the wait after it (medians)."""
    prepared = PreparedLaunches(native, launches)
    for _ in range(3):
        prepared.enqueue(cl, queue)
        queue.finish()
    enqueue, wait = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        prepared.enqueue(cl, queue)
        t1 = time.perf_counter()
        queue.finish()
        enqueue.append(t1 - t0)
        wait.append(time.perf_counter() - t1)
    return round(float(np.median(enqueue)) / len(launches) * 1e6, 3), round(float(np.median(wait)) * 1e6, 1)


def drained_ms(native, context, queue, launches, reps: int) -> float:
    """Milliseconds from releasing ``launches``, enqueued behind an unset user event, to the queue drained
    (median): what the device takes for them when the host's enqueue is not in the way."""
    prepared = PreparedLaunches(native, launches)
    times = []
    for _ in range(reps):
        gate = cl.UserEvent(context)
        cl.enqueue_marker(queue, wait_for=[gate])
        prepared.enqueue(cl, queue)
        queue.flush()
        time.sleep(0.005)
        start = time.perf_counter()
        gate.set_status(cl.command_execution_status.COMPLETE)
        queue.finish()
        times.append(time.perf_counter() - start)
    return round(float(np.median(times)) * 1e3, 4)


def trivial() -> dict:
    device = cl.get_platforms()[0].get_devices()[0]
    context = cl.Context(devices=[device])
    queue = cl.CommandQueue(context)
    native = native_enqueue(cl)
    out = {"device": device.name}
    buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE, 4 * 1024)
    kinds = ("buffer", "distinct buffer", "distinct 4 MiB buffer", "offset into one buffer", "svm pointer", "int",
             "int4")
    for kind in kinds:
        if kind == "svm pointer" and not device.svm_capabilities:
            out[kind] = "the device has no shared virtual memory"
            continue
        for n in (1, 2, 4, 8, 16, 24):
            program, args = _trivial_kernel(context, buffer, kind, n)
            kernels = []
            for _ in range(64):
                kernel = cl.Kernel(program, "k")
                kernel.set_args(*args)
                kernels.append((kernel, (1024, 1, 1), (64, 1, 1)))
            out[f"{kind} x{n}, 64 kernel objects"] = per_launch(native, queue, kernels, 60)
            out[f"{kind} x{n}, one kernel object"] = per_launch(native, queue, kernels[:1] * 64, 60)
    return out


def _trivial_kernel(context, buffer, kind: str, n: int):
    """A one-line kernel reading ``n`` arguments of ``kind``, and those arguments: one buffer ``n`` times, ``n``
    distinct buffers (4 KiB or 4 MiB each), one buffer with ``n`` int offsets into it, or a buffer and ``n``
    int / int4 scalars."""
    if kind.endswith("buffer") and kind != "offset into one buffer":
        params = ", ".join(f"__global float* a{i}" for i in range(n))
        body, target = " + ".join(f"a{i}[i]" for i in range(n)), "a0"
        size = 4 << 20 if "MiB" in kind else 4 * 1024
        args = [buffer] * n if kind == "buffer" else [cl.Buffer(context, cl.mem_flags.READ_WRITE, size)
                                                        for _ in range(n)]
    elif kind == "svm pointer":  # n pointers into one coarse-grained shared virtual memory allocation
        params = ", ".join(f"__global float* a{i}" for i in range(n))
        body, target = " + ".join(f"a{i}[i]" for i in range(n)), "a0"
        memory = cl.svm_empty(context, cl.svm_mem_flags.READ_WRITE, n * 1024, np.float32)
        args = [cl.SVM(memory[1024 * j:]) for j in range(n)]
    elif kind == "offset into one buffer":
        params = "__global float* o, " + ", ".join(f"int a{i}" for i in range(n))
        body, target = " + ".join(f"o[a{i} + i]" for i in range(n)), "o"
        args = [cl.Buffer(context, cl.mem_flags.READ_WRITE, n * 4 * 1024)] + [np.int32(1024 * j) for j in range(n)]
    else:
        params = "__global float* o, " + ", ".join(f"{kind} a{i}" for i in range(n))
        body = " + ".join(f"(float)a{i}" + (".x" if kind == "int4" else "") for i in range(n))
        target = "o"
        args = [buffer] + [np.int32(j) if kind == "int" else cl.cltypes.make_int4(j, 0, 0, 0) for j in range(n)]
    program = cl.Program(context, f"__kernel void k({params}) {{ int i = get_global_id(0); "
                                  f"{target}[i] = {body}; }}").build()
    return program, args


def partition(model: str) -> dict:
    import delegate
    session = delegate.load(model, backends="[opencl,cpu]", partitioner="greedy", precision="fp32",
                            **{"placement.search": "estimate"})
    compiled = next(c for c in session.executor.compiled if getattr(c, "prepared", None) is not None)
    native, queue = compiled.prepared.native, compiled.device.queue
    # "tensors": the launch's tensors and constants, each a byte offset into the partition's one arena buffer
    rows = [{"label": spec.label, "tensors": sum(1 for kind, _ in spec.args if kind == "buffer"),
             "args": len(spec.args), "work": list(launch[1]), "local": list(launch[2]) if launch[2] else None,
             "us": per_launch(native, queue, [launch] * 64, 40)[0]}
            for spec, launch in zip(compiled.plan.launches, compiled.launches)]
    whole, wait = per_launch(native, queue, compiled.launches, 40)
    drained = drained_ms(native, compiled.device.context, queue, compiled.launches, 40)
    return {"model": model.rsplit("/", 1)[-1], "launches": len(rows), "together_us_per_launch": whole,
            "wait_after_us": wait, "device_drain_ms": drained, "each": rows}


if __name__ == "__main__":
    print(json.dumps(trivial() if sys.argv[1] == "trivial" else partition(sys.argv[2])))
