"""Partition formation helpers shared by the planner and the runtime."""

from __future__ import annotations

from typing import Sequence

from .backend import Partition
from .ir import Op, Subgraph


def make_partition(graph: Subgraph, ops: Sequence[Op], backend: str, index: int) -> Partition:
    """A partition of ``ops`` with its boundary tensors (constants stay inside the partition)."""
    inside = {id(op) for op in ops}
    produced = {t.index for op in ops for t in op.outputs}
    graph_outputs = {t.index for t in graph.outputs}
    inputs, seen = [], set()
    for op in ops:
        for t in op.inputs:
            if t is None or t.index in produced or t.index in seen or t.is_constant or t.is_variable:
                continue
            seen.add(t.index)
            inputs.append(t)
    outputs = []
    for op in ops:
        for t in op.outputs:
            if t.index in graph_outputs or any(id(u) not in inside for u in t.uses):
                outputs.append(t)
    return Partition(index, backend, list(ops), inputs, outputs, graph)
