"""Export a partition as a standalone TFLite model (for LiteRT-backed CPU execution and debugging)."""

from __future__ import annotations

import copy

from .backend import Partition
from .ir import Model, Op, Subgraph, Tensor


def partition_model(partition: Partition) -> Model:
    """A one-subgraph model holding just the partition: its boundary tensors become the model's I/O.

    Tensors and ops are copied, so the source graph is left untouched.
    """
    tensors: dict[int, Tensor] = {}

    def clone(t: Tensor | None) -> Tensor | None:
        if t is None:
            return None
        if t.index not in tensors:
            c = copy.copy(t)
            c.index = len(tensors)
            c.producer, c.uses = None, []
            tensors[t.index] = c
        return tensors[t.index]

    inputs = [clone(t) for t in partition.inputs]
    ops = []
    for op in partition.ops:
        ops.append(Op(len(ops), op.opcode, [clone(t) for t in op.inputs], [clone(t) for t in op.outputs],
                      version=op.version, options=dict(op.options), custom=op.custom,
                      custom_options=op.custom_options, options_type=op.options_type,
                      intermediates=[clone(t) for t in op.intermediates]))
    outputs = [clone(t) for t in partition.outputs]
    graph = Subgraph(f"partition_{partition.index}", list(tensors.values()), ops, inputs, outputs)
    return Model([graph], description=f"partition {partition.index} of {partition.graph.name}")
