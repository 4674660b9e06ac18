"""Tilings chosen by timing on the device, for ``inference_preference: sustained_speed``.

A program planned with variants is made real once; each tiled dispatch is then timed with
each of its tilings on the partition's own buffers, and the fastest replaces the planned
one.  The program that comes out has no variants left, so the plan cache stores the choice
and later compiles on the same device skip the timing.
"""

from __future__ import annotations

import time
from dataclasses import replace

from .compiled import Launch, Timestamps, WgpuCompiled, handles
from .device import import_wgpu, map_for_reading

REPEATS = 8  # dispatches per timing, so launch overhead and clock granularity matter little
TRIALS = 3  # timings per tiling; the fastest counts


class _Stopwatch:
    """Milliseconds of REPEATS back-to-back dispatches: GPU timestamps where the adapter has them,
    else the host's clock around a submission and its completion."""

    def __init__(self, compiled: WgpuCompiled):
        usage = import_wgpu().BufferUsage
        device, self.native = compiled.context.device, compiled.native
        self.timestamps = Timestamps(compiled.context, self.native, 2) if compiled.context.timestamps else None
        self.source = device.create_buffer(size=4, usage=usage.COPY_SRC)
        self.done = device.create_buffer(size=4, usage=usage.MAP_READ | usage.COPY_DST)

    def __call__(self, launch: Launch) -> float:
        best, native = float("inf"), self.native
        for _ in range(TRIALS):
            encoder = native.encoder()
            try:
                compute = native.begin_pass(encoder)
                try:
                    if self.timestamps:
                        self.timestamps.stamp(compute, 0)
                    native.record(compute, (handles(launch),) * REPEATS)
                    if self.timestamps:
                        self.timestamps.stamp(compute, 1)
                finally:
                    native.end_pass(compute)
                if self.timestamps:
                    self.timestamps.resolve(encoder)
                else:
                    native.copy(encoder, self.source._internal, 0, self.done._internal, 0, 4)
                started = time.perf_counter()
                native.submit(encoder)
            finally:
                native.release(encoder)
            if self.timestamps:
                best = min(best, float(self.timestamps.read()[0]))
            else:
                map_for_reading(self.done, poll=self.native.poll)
                self.done.unmap()
                best = min(best, (time.perf_counter() - started) * 1e3)
        return best


def tune(compiled: WgpuCompiled) -> None:
    """Give every dispatch with variants its fastest tiling, in ``compiled`` and its program."""
    program = compiled.program
    stopwatch = _Stopwatch(compiled)
    for index, variants in program.variants.items():
        spec, launch = program.launches[index], compiled.launches[index]
        best = (stopwatch(launch), spec, launch)
        for variant in variants:
            if variant.source not in program.shaders:
                program.shaders.append(variant.source)
            candidate = replace(spec, work=list(variant.groups), params={
                **spec.params, "shader": program.shaders.index(variant.source), "tiling": variant.tiling})
            trial = compiled.launch(candidate)
            best = min(best, (stopwatch(trial), candidate, trial), key=lambda b: b[0])
        _, program.launches[index], compiled.launches[index] = best
        program.facts["tilings"][spec.label] = program.launches[index].params["tiling"]
    compiled.prepare_encoding()
    program.variants = {}
    _drop_unused_shaders(program)
    program.facts["shaders"] = len(program.shaders)


def _drop_unused_shaders(program) -> None:
    specs = program.launches + [t.convert for t in program.inputs + program.outputs if t.convert]
    used = sorted({d.params["shader"] for d in specs})
    renumber = {old: new for new, old in enumerate(used)}
    program.shaders = [program.shaders[i] for i in used]
    for d in specs:
        d.params["shader"] = renumber[d.params["shader"]]
