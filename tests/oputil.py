"""Golden comparison helpers: run a model in LiteRT and in delegate on the same inputs."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest

from delegate import CompileOptions, read_model
from delegate.partition import make_partition
from delegate.plugins import default_manager
from delegate.runtime import Executor

litert = pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert (the reference) is not installed")


def litert_run(model: bytes, inputs: Sequence[np.ndarray], builtin: bool = False) -> list[np.ndarray]:
    """Outputs of LiteRT's interpreter; ``builtin=True`` uses its reference kernels instead of XNNPACK."""
    kwargs = {}
    if builtin:
        kwargs["experimental_op_resolver_type"] = litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    it = litert.Interpreter(model_content=model, **kwargs)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], np.asarray(x, d["dtype"]))
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def delegate_run(model: bytes, inputs: Sequence[np.ndarray], backend: str = "cpu",
                 options: CompileOptions | None = None, backend_options: dict | None = None) -> list[np.ndarray]:
    """Outputs of delegate with the whole graph as one partition on ``backend``."""
    m = read_model(model)
    g = m.main
    be = default_manager().backend_info(backend).factory(backend_options or {})
    options = options or CompileOptions()
    for op in g.ops:
        answer = be.supports(op, options)
        if not answer:
            raise AssertionError(f"{backend} refuses {op.describe()}: {answer.reason}")
    ex = Executor(g, [make_partition(g, g.ops, backend, 0)], {backend: be}, options)
    out = ex.run({t.index: np.asarray(x, t.dtype.numpy) for t, x in zip(g.inputs, inputs)})
    return [out[t.index] for t in g.outputs]


def assert_close(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], rtol: float = 1e-5,
                 atol: float = 1e-6, lsb: int = 1) -> None:
    """Float (and complex) outputs within rtol/atol (relative to the output range); integer outputs within
    ``lsb``."""
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, f"output {i}: shape {a.shape} != {e.shape}"
        if e.dtype.kind in "fc":
            scale = max(float(np.abs(e).max()) if e.size else 0.0, 1.0)
            err = float(np.abs(a.astype(np.result_type(e.dtype, np.float64)) - e).max()) if e.size else 0.0
            assert err <= atol + rtol * scale, f"output {i}: max abs error {err:.3g} > {atol + rtol * scale:.3g}"
        elif e.dtype == np.bool_:
            assert np.array_equal(a, e), f"output {i}: boolean outputs differ"
        else:
            err = int(np.abs(a.astype(np.int64) - e.astype(np.int64)).max()) if e.size else 0
            assert err <= lsb, f"output {i}: max error {err} LSB > {lsb}"


def check_against_litert(model: bytes, inputs: Sequence[np.ndarray], backend: str = "cpu", *,
                         rtol: float = 1e-5, atol: float = 1e-6, lsb: int = 1, builtin: bool = False,
                         options: CompileOptions | None = None, backend_options: dict | None = None) -> None:
    expected = litert_run(model, inputs, builtin=builtin)
    actual = delegate_run(model, inputs, backend, options, backend_options)
    assert_close(actual, expected, rtol=rtol, atol=atol, lsb=lsb)


def assert_round_trip(data: bytes, external: bool) -> bytes:
    """Read -> write -> read gives the same text IR and constants; returns the rewritten bytes."""
    from delegate.tflite.writer import write_model

    model = read_model(data)
    rewritten = write_model(model, external_buffers=external)
    again = read_model(rewritten)
    assert str(again) == str(model)
    for a, b in zip(model.main.tensors, again.main.tensors):
        if a.data is not None:
            np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    return rewritten


def require_backend(name: str) -> None:
    """Skip, saying why, where a backend is not installed or has no device here (CI has all of them)."""
    from delegate.errors import PluginError
    try:
        ok, why = default_manager().backend_info(name).available()
    except PluginError as exc:  # its plugin is not installed
        ok, why = False, str(exc)
    if not ok:
        pytest.skip(f"{name} is not available here: {why}")
