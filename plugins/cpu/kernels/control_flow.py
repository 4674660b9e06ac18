"""Control flow and resource variables: IF, WHILE, CALL_ONCE, VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE.

Called subgraphs run through ``call_subgraph``, the one place a subgraph runs inside another: it
compiles the callee once per model instance (numpy kernels over the whole subgraph) and keeps it
in that instance's ModelState, next to the resource variables.  A resource tensor holds its
variable's name (container/shared_name), as LiteRT's holds a resource id.
"""

from __future__ import annotations

import numpy as np

from delegate.plugin_api import ExecutionError, ModelState, Op, Partition, active_state

from ..registry import kernel


def call_subgraph(state: ModelState, index: int, args: list[np.ndarray]) -> list[np.ndarray]:
    """Run subgraph ``index`` of the state's model on ``args`` (its inputs in order); copies of its outputs."""
    from ..plugin import CpuCompiled

    graph = state.model.subgraphs[index]
    if len(args) != len(graph.inputs):
        raise ExecutionError(f"subgraph {index} ({graph.name!r}) takes {len(graph.inputs)} inputs, "
                             f"the calling op gives {len(args)}")
    compiled = state.callees.get(index)
    if compiled is None:
        produced = {t.index for op in graph.ops for t in op.outputs}
        outputs = [t for t in graph.outputs if t.index in produced]
        inputs = [t for t in graph.inputs if not t.is_constant]
        whole = Partition(-1, "cpu", list(graph.ops), inputs, outputs, graph)
        compiled = state.callees[index] = CpuCompiled(whole, {})
    given = {t.index: np.asarray(a) for t, a in zip(graph.inputs, args)}
    results = compiled.run(given)
    out = []
    for t in graph.outputs:
        value = results.get(t.index, given.get(t.index))
        out.append(np.array(t.data if value is None else value))
    return out


def _write(outs: list[np.ndarray], values: list[np.ndarray], what: str) -> None:
    for i, (dst, src) in enumerate(zip(outs, values)):
        if dst.shape != src.shape:
            raise ExecutionError(f"{what}: output {i} has shape {list(src.shape)}, "
                                 f"the op declares {list(dst.shape)}")
        dst[...] = src


@kernel("IF")
def if_op(op: Op):
    then_index, else_index = int(op.options["then_subgraph_index"]), int(op.options["else_subgraph_index"])

    def run(ins, outs):
        branch = then_index if bool(np.asarray(ins[0]).ravel()[0]) else else_index
        _write(outs, call_subgraph(active_state(), branch, list(ins[1:])), op.describe())
    return run


@kernel("WHILE")
def while_op(op: Op):
    cond_index, body_index = int(op.options["cond_subgraph_index"]), int(op.options["body_subgraph_index"])

    def run(ins, outs):
        state = active_state()
        values = [np.array(v) for v in ins]
        while bool(call_subgraph(state, cond_index, values)[0].ravel()[0]):
            values = call_subgraph(state, body_index, values)
        _write(outs, values, op.describe())
    return run


@kernel("CALL_ONCE")
def call_once(op: Op):
    index = int(op.options["init_subgraph_index"])

    def run(ins, outs):
        state = active_state()
        if index not in state.initialised:
            state.initialised.add(index)
            call_subgraph(state, index, [])
    return run


@kernel("VAR_HANDLE")
def var_handle(op: Op):
    name = f"{op.options.get('container') or ''}/{op.options.get('shared_name') or ''}"

    def run(ins, outs):
        outs[0].fill(name)
    return run


def _variable(handle: np.ndarray) -> str:
    return str(np.asarray(handle).ravel()[0])


@kernel("READ_VARIABLE")
def read_variable(op: Op):
    def run(ins, outs):
        name = _variable(ins[0])
        value = active_state().resources.get(name)
        if value is None:
            raise ExecutionError(f"{op.describe()}: resource variable {name!r} is read before any assignment")
        _write(outs, [value], op.describe())
    return run


@kernel("ASSIGN_VARIABLE")
def assign_variable(op: Op):
    def run(ins, outs):
        state, name = active_state(), _variable(ins[0])
        old = state.resources.get(name)
        if old is not None and (old.shape != np.shape(ins[1]) or old.dtype != np.asarray(ins[1]).dtype):
            raise ExecutionError(f"{op.describe()}: resource variable {name!r} holds {old.dtype}{list(old.shape)}, "
                                 f"cannot assign {np.asarray(ins[1]).dtype}{list(np.shape(ins[1]))}")
        state.resources[name] = np.array(ins[1])
    return run
