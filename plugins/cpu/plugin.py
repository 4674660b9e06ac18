"""CPU backend plugin: numpy kernels for every op, with a memory plan computed once per partition."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from delegate import hookimpl
from delegate.backend import Backend, BackendInfo, CompiledPartition, CompileOptions, Partition, Support
from delegate.errors import CompileError
from delegate.ir import Op, Tensor
from delegate.memory import plan_arena

from . import registry


class CpuCompiled(CompiledPartition):
    """Kernels bound to preallocated buffers; ``run`` only calls them in order."""

    def __init__(self, partition: Partition, custom: dict[str, registry.Factory]):
        self.partition = partition
        ops = partition.ops
        external = {t.index for t in partition.inputs}
        outputs = {t.index for t in partition.outputs}
        # Intermediates share one arena by lifetime; partition outputs get their own buffers,
        # since callers read them after the run while the arena is reused by the next one.
        intermediates = [t for op in ops for t in op.outputs if t.index not in outputs]
        self.arena, views = plan_arena(ops, intermediates)
        self.buffers: dict[int, np.ndarray] = dict(views)
        for t in partition.outputs:
            self.buffers[t.index] = np.empty(t.shape, t.dtype.numpy)
        self.steps = []
        for op in ops:
            factory = registry.find_kernel(op, custom)
            if factory is None:
                raise CompileError(f"{op.describe()}: the cpu backend has no kernel for it")
            try:
                run = factory(op)
            except Exception as exc:
                raise CompileError(f"{op.describe()}: cpu kernel setup failed: {exc}") from exc
            self.steps.append((op, run, [self._source(t, external) for t in op.inputs],
                               [self.buffers[t.index] for t in op.outputs]))

    def _source(self, t: Tensor | None, external: set[int]):
        if t is None:
            return None
        if t.index in external:
            return t.index  # filled from the run's inputs
        if t.data is not None:
            return np.asarray(t.data)
        return self.buffers[t.index]

    def run(self, inputs: Mapping[int, Any]) -> dict[int, Any]:
        for op, run, sources, outs in self.steps:
            ins = [inputs[s] if isinstance(s, int) else s for s in sources]
            run(ins, outs)
        return {t.index: self.buffers[t.index] for t in self.partition.outputs}

    def describe(self) -> dict[str, Any]:
        return {"engine": "numpy", "arena_bytes": int(self.arena.nbytes)}


class CpuBackend(Backend):
    name = "cpu"
    layout = "NHWC"
    precisions = ("fp32", "int8")

    def __init__(self, options: Mapping[str, Any] | None = None, custom_kernels: dict | None = None):
        registry.load_all()
        self.options = dict(options or {})
        self.custom = dict(custom_kernels or {})

    def supports(self, op: Op, options: CompileOptions) -> Support:
        if registry.find_kernel(op, self.custom) is None:
            kind = "custom op" if op.custom else "op"
            return Support.no(f"no cpu kernel for {kind} {op.opcode}")
        return Support.yes()

    def compile(self, partition: Partition, options: CompileOptions) -> CompiledPartition:
        return CpuCompiled(partition, self.custom)

    def device_info(self) -> dict[str, Any]:
        return {"backend": self.name, "device": "host", "numpy": np.__version__}


def _factory(options: Mapping[str, Any]) -> CpuBackend:
    from delegate.plugins import default_manager
    return CpuBackend(options, default_manager().custom_kernels("cpu"))


@hookimpl
def delegate_backends():
    return [BackendInfo("cpu", factory=_factory, description="numpy kernels on the host; runs every op")]
