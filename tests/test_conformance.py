"""The conformance matrix: every case of tests/conformance_cases.py on every installed backend and
every precision it declares, against LiteRT.

A cell passes when the backend's outputs are within its precision's bound, or when the backend
refuses the case as ``REFUSALS`` expects (with a word of its reason).  A support answer without a
correct kernel fails here, and so does a refusal nobody expected; an op that a GPU lowering accepts
without a case fails ``test_every_accepted_op_has_a_case``.  See docs/conformance.md.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from delegate import CompileOptions, read_model
from delegate.plugins import default_manager
from delegate.validate import validate_graph
from tests.conformance_cases import CASES, Case
from tests.oputil import assert_close, delegate_run, litert_run, require_backend

# Backend options per column: the CPU backend runs its numpy kernels or LiteRT's interpreter.
ENGINES = {"cpu": [{"engine": "numpy"}, {"engine": "litert"}]}
TEST_DOUBLES = {"fakegpu"}  # tests/fake_plugin: a stand-in for plugin tests, not a backend to conform


def _columns() -> list[tuple[str, dict, str]]:
    """(backend, options, precision) for every installed backend and each precision it declares (fp32
    alone where it cannot be built here: its cells skip, saying why)."""
    columns = []
    manager = default_manager()
    for name in sorted(set(manager.backends()) - TEST_DOUBLES):
        for options in ENGINES.get(name, [{}]):
            info = manager.backend_info(name)
            precisions = info.factory(options).precisions if info.available()[0] else ("fp32",)
            columns += [(name, options, precision) for precision in precisions]
    return columns


COLUMNS = _columns()

# Of each output's range (at least 1): fp32 arithmetic differs in its last bits, fp16 storage keeps 11
# significant bits; quantized outputs within one step, other integer and bool outputs exact.  The CPU
# backend follows LiteRT's kernels: 1e-5, and quantized outputs exact.
BOUNDS = {"fp32": 5e-4, "fp16": 2e-2}
CPU_BOUND = 1e-5


def quantized_steps(expected, precision: str) -> int:
    """How many steps a GPU's quantized output may be off: one, or under fp16 (11 significant bits) a few
    roundings of the largest value's magnitude in steps, M·2^-9, which stays one for int8's ±127 and is
    tens of steps for int16's ±32767."""
    if precision != "fp16":
        return 1
    largest = max((int(np.abs(e.astype(np.int64)).max()) for e in expected if e.size), default=0)
    return max(1, -(-largest // 512))

# (case id, op code or case kind, backend) -> words of the reason the backend must give when it refuses
# (case ids first, then op codes, then kinds); rank-5 and rank-6 operands do not fit the GPU layout.
GPUS = ("opencl", "wgpu")
NO_GPU_KERNEL = ("RFFT2D", "REAL", "IMAG", "BROADCAST_TO",
                 "FILL", "GATHER_ND", "SHAPE", "L2_NORMALIZATION", "L2_POOL_2D",
                 "LOG_SOFTMAX", "LOGICAL_NOT", "LOGICAL_OR", "UNIDIRECTIONAL_SEQUENCE_LSTM")
REFUSALS = {**{(op, gpu): "no GPU kernel" for op in NO_GPU_KERNEL for gpu in GPUS},
            **{("quantized", gpu): "quantized" for gpu in GPUS}, **{("hybrid", gpu): "" for gpu in GPUS},
            **{("GATHER:runtime_indices", gpu): "runtime indices" for gpu in GPUS},
            **{("RESHAPE:int8_onto_another_grid", gpu): "another grid" for gpu in GPUS}}
GPU_RANK_LIMIT = 4



@lru_cache(maxsize=None)
def _built(case: Case):
    """The case's model, inputs and LiteRT's model, once for all its cells."""
    return case.make()


@lru_cache(maxsize=None)
def _graph(case: Case):
    """The case's graph, read once for the questions asked of it (each run reads its own copy)."""
    return read_model(_built(case)[0]).main


@lru_cache(maxsize=None)
def _backend(backend: str, engine: str | None):
    return default_manager().backend_info(backend).factory({"engine": engine} if engine else {})


@lru_cache(maxsize=None)
def _expected(case: Case, builtin: bool) -> list[np.ndarray]:
    model, inputs, reference = _built(case)
    if case.numpy_reference is not None:
        return case.numpy_reference(inputs)
    try:
        return litert_run(reference or model, inputs, builtin=builtin)
    except (RuntimeError, ValueError) as exc:
        pytest.fail(f"LiteRT refuses a case of the matrix: {exc}")


def _expected_refusal(case: Case, backend: str) -> tuple[str, ...]:
    """The words one of which the backend's reason must hold (any of the case's reasons may come
    first); empty when it must run the case."""
    words = tuple(REFUSALS[key, backend] for key in (case.id, case.op, case.kind) if (key, backend) in REFUSALS)[:1]
    if backend in GPUS:
        ranks = [len(t.shape) for op in _graph(case).ops for t in op.inputs if t is not None]
        if max(ranks) > GPU_RANK_LIMIT:
            words += ("rank",)
    return words


# A backend's integer precision ("int8": the CPU's integer kernels) applies to the cases with integer
# tensors; its float cases are the fp32 column's.
INTEGER_KINDS = ("quantized", "hybrid")
CELLS = [(case, backend, options, precision) for case in CASES for backend, options, precision in COLUMNS
         if precision != "int8" or case.kind in INTEGER_KINDS]


def _cell_id(case: Case, backend: str, options: dict, precision: str) -> str:
    engine = options.get("engine")
    return f"{case.id}-{backend}{'-' + engine if engine else ''}-{precision}"


@pytest.mark.parametrize("case,backend,options,precision", CELLS, ids=[_cell_id(*cell) for cell in CELLS])
def test_conformance(case: Case, backend: str, options: dict, precision: str):
    engine = options.get("engine")
    require_backend(backend)
    model, inputs, _ = _built(case)
    # The LiteRT engine runs LiteRT's default kernels; the other backends are held to the case's reference.
    expected = _expected(case, case.reference == "builtin" and engine != "litert")
    compile_options = CompileOptions(precision=precision, allow_quantized=case.allow_quantized)
    refusal = _expected_refusal(case, backend)
    answers = [_backend(backend, engine).supports(op, compile_options) for op in _graph(case).ops]
    if refusal:
        refused = [a for a in answers if not a]
        assert refused, f"{backend} claims support for a case it must refuse ({' or '.join(refusal)})"
        assert any(word in refused[0].reason for word in refusal), refused[0].reason
        return
    assert all(answers), f"{backend} refuses: {[a.reason for a in answers if not a]}"
    actual = delegate_run(model, inputs, backend, compile_options, options or None)
    quantized = any(t.quantization is not None for t in _graph(case).outputs)
    if backend == "cpu":
        assert_close(actual, expected, rtol=CPU_BOUND, atol=CPU_BOUND, lsb=0)
    else:
        steps = quantized_steps(expected, precision) if quantized else 0
        assert_close(actual, expected, rtol=BOUNDS.get(precision, BOUNDS["fp32"]), atol=0.0, lsb=steps)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cases_pass_validation(case: Case):
    """Every case is a well-formed model: the load-time checks (shape rules included) accept it, as LiteRT does."""
    validate_graph(read_model(_built(case)[0]).main)  # a copy: validation settles shapes in place


# Ops the matrix's one-subgraph models cannot hold, and where they are checked against LiteRT instead.
ELSEWHERE = {**{op: "tests/test_control_flow.py (subgraphs and resource variables)"
                for op in ("IF", "WHILE", "CALL_ONCE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE")},
             "TFLite_Detection_PostProcess": "tests/ops/test_custom_ops.py (custom options)"}


def _claimed(backend: str) -> set[str]:
    """The op codes a backend claims: its GPU lowerings' handlers, or the CPU's numpy kernels."""
    if backend == "cpu":
        from delegate_cpu import registry
        registry.load_all()
        return set(registry.FLOAT_KERNELS) | set(registry.QUANT_KERNELS) | set(registry.HYBRID_KERNELS)
    from delegate.gpu.registry import accepted
    __import__({"opencl": "delegate_opencl.lowering", "wgpu": "delegate_wgpu.kernels"}[backend])
    return accepted(backend)


@pytest.mark.parametrize("backend", sorted({backend for backend, _, _ in COLUMNS}))
def test_every_claimed_op_has_a_case(backend):
    """An op a backend claims appears in a case's model (or is listed in ELSEWHERE with its test)."""
    require_backend(backend)
    covered = {op.opcode for case in CASES for op in _graph(case).ops}
    missing = _claimed(backend) - covered - set(ELSEWHERE)
    assert not missing, f"{backend} claims ops without a conformance case: {sorted(missing)}"
