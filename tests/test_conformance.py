"""Conformance matrix: one table of op cases run on every backend and precision against LiteRT.

``CASES`` holds the op cases (shapes, options, dtypes), ``TOLERANCES`` the error each
backend and precision may have, ``REFUSALS`` the cases a backend must refuse (with
a word of its reason).  Every cell either matches LiteRT within its tolerance or is
refused as listed: a support answer without a correct kernel fails here, and so
does a refusal nobody expected.  Float cases compare with LiteRT's default kernels,
integer and hybrid ones with its builtin kernels (see tests/ops/test_hybrid.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from delegate import CompileError, CompileOptions, read_model
from delegate.plugins import default_manager
from delegate.tflite.builder import GraphBuilder
from delegate.validate import validate_graph
from tests.oputil import assert_close, delegate_run, litert_run, require_backend

ARITHMETIC = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE")
COMPARISONS = ("LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL")
DIVISIONS = ("DIV", "FLOOR_DIV", "FLOOR_MOD")
# Operand shapes of every rank combination LiteRT's kernels broadcast (numpy's rules).
RANKS = [((1, 197, 192), (197, 192)), ((197, 192), (1, 197, 192)), ((2, 3, 4, 5), (5,)), ((5,), (2, 3, 4, 5)),
         ((4, 1, 5), (2, 1, 4, 1, 1)), ((2, 1, 3), (4, 1)), ((1, 4, 3), (1, 1, 3)), ((), (2, 3)),
         ((1, 2, 1, 3, 1, 2), (2, 1, 3, 4, 1))]
QUANT = {"int8": (0.05, 3), "int16": (0.01, 0)}


@dataclass(frozen=True)
class Case:
    id: str
    op: str
    kind: str  # with ``op``, the key of REFUSALS: which family of cases this is
    build: Callable[[np.random.Generator], tuple[bytes, list[np.ndarray]]]
    dtype: str = "float32"


def _binary(op: str, a: tuple, b: tuple, dtype: str, constant: bool):
    def build(rng):
        g = GraphBuilder()
        q = QUANT.get(dtype)

        def values(shape):
            if dtype == "float32":
                v = rng.standard_normal(shape).astype(np.float32)
                if op in COMPARISONS:  # quarters: exact in half precision too, and with ties for EQUAL
                    return np.round(v * 4) / np.float32(4)
                return v + np.float32(3) if op == "DIV" else v
            return rng.integers(-100, 100, shape).astype(dtype)
        x = g.input("x", a, dtype, quant=q)
        y_values = values(b)
        if op in DIVISIONS and dtype != "float32":  # never at the divisor's zero (point)
            y_values[(y_values == 0) | (y_values == q[1])] = 7
        y = g.const("y", y_values, dtype, quant=q) if constant else g.input("y", b, dtype, quant=q)
        boolean = op in COMPARISONS
        g.output(g.op(op, [x, y], dtype="bool" if boolean else None, quant=None if boolean else q))
        return g.to_bytes(), [values(a)] + ([] if constant else [y_values])
    return build


# Unary float ops, on inputs inside their domains (positive where a log or root needs it).
UNARY = ("RELU", "RELU6", "RELU_N1_TO_1", "LOGISTIC", "TANH", "EXP", "LOG", "SQRT", "RSQRT", "SQUARE", "ABS", "NEG",
         "SIN", "COS", "FLOOR", "CEIL", "ROUND", "SIGN", "HARD_SWISH", "GELU", "ELU", "LEAKY_RELU")
POSITIVE = ("LOG", "SQRT", "RSQRT")


def _unary(op: str, shape: tuple):
    def build(rng):
        g = GraphBuilder()
        x = g.input("x", shape)
        g.output(g.op(op, [x], options={"alpha": 0.2} if op == "LEAKY_RELU" else None))
        values = (rng.standard_normal(shape) * 3).astype(np.float32)
        return g.to_bytes(), [np.abs(values) + np.float32(0.1) if op in POSITIVE else values]
    return build


def _grouped_conv(groups: int):
    def build(rng):
        g = GraphBuilder()
        x = g.input("x", (1, 6, 5, 4 * groups))
        w = g.const("w", rng.standard_normal((2 * groups, 3, 3, 4)).astype(np.float32))
        g.output(g.op("CONV_2D", [x, w, g.const("b", rng.standard_normal(2 * groups).astype(np.float32))],
                      options={"padding": "SAME", "stride_h": 1, "stride_w": 1}))
        return g.to_bytes(), [rng.standard_normal((1, 6, 5, 4 * groups)).astype(np.float32)]
    return build


def _hybrid_fully_connected(asymmetric: bool):
    def build(rng):
        g = GraphBuilder()
        x = g.input("x", (3, 20))
        w = g.const("w", rng.integers(-127, 128, (8, 20)).astype(np.int8), quant=(0.01, 0))
        g.output(g.op("FULLY_CONNECTED", [x, w, g.const("b", rng.standard_normal(8).astype(np.float32))],
                      dtype="float32", options={"asymmetric_quantize_inputs": asymmetric}))
        return g.to_bytes(), [(rng.standard_normal((3, 20)) * 2).astype(np.float32)]
    return build


def _hybrid_conv(opcode: str, per_channel: bool):
    """A dynamic-range CONV_2D or DEPTHWISE_CONV_2D: int8 weights with one scale or one per channel."""
    def build(rng):
        g = GraphBuilder()
        x = g.input("x", (2, 7, 6, 4))
        shape, axis = ((6, 3, 3, 4), 0) if opcode == "CONV_2D" else ((1, 3, 3, 4), 3)
        channels = shape[axis]
        scales = rng.uniform(0.002, 0.02, channels) if per_channel else np.full(channels, 0.01)
        w = g.const("w", rng.integers(-127, 128, shape).astype(np.int8),
                    quant=(scales.astype(np.float32), np.zeros(channels, np.int64), axis))
        options = {"padding": "SAME", "stride_h": 1, "stride_w": 1}
        if opcode == "DEPTHWISE_CONV_2D":
            options["depth_multiplier"] = 1
        g.output(g.op(opcode, [x, w, g.const("b", rng.standard_normal(channels).astype(np.float32))], dtype="float32",
                      options=options))
        return g.to_bytes(), [rng.standard_normal((2, 7, 6, 4)).astype(np.float32)]
    return build


def _reduce_prod(dtype: str):
    def build(rng):
        g = GraphBuilder()
        x = g.input("x", (2, 3, 4), dtype, quant=QUANT[dtype])
        g.output(g.op("REDUCE_PROD", [x, g.const("axes", np.array([1], np.int32))], dtype=dtype,
                      quant=(QUANT[dtype][0] ** 2 * 4, 0)))
        return g.to_bytes(), [rng.integers(-100, 100, (2, 3, 4)).astype(dtype)]
    return build


def _rfft2d(rng):
    g = GraphBuilder()
    x = g.input("x", (2, 6, 7))
    spectrum = g.op("RFFT2D", [x, g.const("fft_length", np.array([8, 8], np.int32))], dtype="complex64")
    g.output(g.op("COMPLEX_ABS", [spectrum], dtype="float32"), spectrum)
    return g.to_bytes(), [rng.standard_normal((2, 6, 7)).astype(np.float32)]


CASES: list[Case] = (
    [Case(f"{op}-{a}-{b}-{'const' if c else 'input'}", op, "elementwise", _binary(op, a, b, "float32", c))
     for op in ARITHMETIC for a, b in RANKS for c in (False, True)]
    + [Case(f"{op}-{a}-{b}", op, "elementwise", _binary(op, a, b, "float32", False))
       for op in COMPARISONS for a, b in RANKS[:4]]
    + [Case(f"{op}-{shape}", op, "unary", _unary(op, shape)) for op in UNARY for shape in ((1, 5, 4, 6), (3, 7))]
    + [Case(f"{op}-{dtype}-{a}-{b}", op, "quantized", _binary(op, a, b, dtype, False), dtype)
       for dtype in QUANT for op in ("ADD", "SUB", "MUL", "LESS", "EQUAL", "NOT_EQUAL", "GREATER_EQUAL", *DIVISIONS)
       for a, b in RANKS if not (dtype == "int16" and op == "MUL")]
    + [Case(f"REDUCE_PROD-{dtype}", "REDUCE_PROD", "quantized", _reduce_prod(dtype), dtype) for dtype in QUANT]
    + [Case("RFFT2D-COMPLEX_ABS", "RFFT2D", "spectral", _rfft2d)]
    + [Case(f"CONV_2D-groups{g}", "CONV_2D", "grouped_conv" if g > 1 else "conv", _grouped_conv(g)) for g in (1, 2, 4)]
    + [Case(f"{op}-hybrid-{'per-channel' if p else 'per-tensor'}", op, "hybrid", _hybrid_conv(op, p), "hybrid")
       for op in ("CONV_2D", "DEPTHWISE_CONV_2D") for p in (False, True)]
    + [Case(f"FULLY_CONNECTED-hybrid-{'asym' if a else 'sym'}", "FULLY_CONNECTED", "hybrid", _hybrid_fully_connected(a), "hybrid")
       for a in (False, True)]
)

# (backend, engine): the matrix's columns.
BACKENDS = [("cpu", "numpy"), ("cpu", "litert"), ("opencl", None), ("wgpu", None)]
PRECISIONS = ("fp32", "fp16")

# (rtol against the output range, integer LSB) per backend and precision; float32 arithmetic
# differs in its last bits, fp16 storage keeps 11 significant bits.
TOLERANCES = {("cpu", "fp32"): (1e-5, 0), ("opencl", "fp32"): (1e-4, 0), ("wgpu", "fp32"): (1e-4, 0),
              ("opencl", "fp16"): (3e-3, 0), ("wgpu", "fp16"): (3e-3, 0)}

# (op code or kind, backend) -> words of the reason the backend must give when it refuses (op
# codes first, then kinds); rank-5 and rank-6 operands do not fit the GPU layout.
GPUS = ("opencl", "wgpu")
NO_GPU_KERNEL = ("RFFT2D", "CEIL", "ROUND")
REFUSALS = {**{(op, gpu): "no GPU kernel" for op in NO_GPU_KERNEL for gpu in GPUS},
            **{("quantized", gpu): "quantized" for gpu in GPUS}, **{("hybrid", gpu): "" for gpu in GPUS}}
GPU_RANK_LIMIT = 4

# (op, kind, backend, engine) cells that may fail with a CompileError tracked elsewhere: the LiteRT
# engine invokes each partition once at compile time on inputs nobody set, and LiteRT's integer
# divisions then stop on a zero divisor (issue 16's stateful-execution point: nothing may run a
# partition before the user does).
KNOWN_COMPILE_FAILURES = {(op, "quantized", "cpu", "litert") for op in DIVISIONS}


def _expected_refusal(case: Case, backend: str, model: bytes) -> tuple[str, ...]:
    """The words one of which the backend's reason must hold (any of the case's reasons may come
    first); empty when it must run the case."""
    words = tuple(REFUSALS[key, backend] for key in (case.op, case.kind) if (key, backend) in REFUSALS)[:1]
    if backend in GPUS:
        ranks = [len(t.shape) for op in read_model(model).main.ops for t in op.inputs if t is not None]
        if max(ranks) > GPU_RANK_LIMIT:
            words += ("rank",)
    return words


CELLS = [(case, backend, engine, precision) for case in CASES for backend, engine in BACKENDS
         for precision in PRECISIONS if (backend, precision) in TOLERANCES]


@pytest.mark.parametrize("case,backend,engine,precision", CELLS,
                         ids=[f"{c.id}-{b}{'-' + e if e else ''}-{p}" for c, b, e, p in CELLS])
def test_conformance(case: Case, backend: str, engine: str | None, precision: str, request):
    if (case.op, case.kind, backend, engine) in KNOWN_COMPILE_FAILURES:
        request.applymarker(pytest.mark.xfail(raises=CompileError, reason="the LiteRT engine invokes at compile time"))
    require_backend(backend)
    rng = np.random.default_rng(len(case.id))
    model, inputs = case.build(rng)
    # The numpy engine follows the builtin kernels where the two sets differ; the LiteRT engine is the default set.
    builtin = case.dtype != "float32" and engine != "litert"
    try:
        expected = litert_run(model, inputs, builtin=builtin)
    except (RuntimeError, ValueError) as exc:
        pytest.fail(f"LiteRT refuses a case of the matrix: {exc}")
    options = CompileOptions(precision=precision)
    refusal = _expected_refusal(case, backend, model)
    be = default_manager().backend_info(backend).factory({"engine": engine} if engine else {})
    answers = [be.supports(op, options) for op in read_model(model).main.ops]
    if refusal:
        refused = [a for a in answers if not a]
        assert refused, f"{backend} claims support for a case it must refuse ({' or '.join(refusal)})"
        assert any(word in refused[0].reason for word in refusal), refused[0].reason
        return
    assert all(answers), f"{backend} refuses: {[a.reason for a in answers if not a]}"
    rtol, lsb = TOLERANCES[backend, precision]
    actual = delegate_run(model, inputs, backend, options, {"engine": engine} if engine else None)
    assert_close(actual, expected, rtol=rtol, atol=rtol, lsb=lsb)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cases_pass_validation(case: Case):
    """Every case is a well-formed model: the load-time checks (shape rules included) accept it, as LiteRT does."""
    model, _ = case.build(np.random.default_rng(0))
    validate_graph(read_model(model).main)
