"""Models whose files declare placeholder shapes on intermediates ([], [1], or stale ones), as
converters leave them on DEQUANTIZE outputs and other intermediates.  LiteRT's Prepare steps give
every output the shape its inputs imply, whatever the file says; so must delegate, on every
backend, instead of checking operands against the placeholders (an IndexError in a shape rule, or a
refusal as malformed, before).  LiteRT's XNNPACK delegate aborts the process on some of these
files, so the reference here is its builtin kernels, and the LiteRT engine runs the graph as
validated, written out anew."""

import numpy as np
import pytest

from delegate import CompileOptions, read_model
from delegate.config import load_config
from delegate.interpreter import Interpreter
from delegate.planner import PlacementSettings
from delegate.session import RunSettings, Session
from delegate.tflite.builder import GraphBuilder
from tests.oputil import assert_close, litert_run, require_backend

TOKENS, DIM, UNITS = 197, 24, 16
PLACEHOLDERS = {"scalar": (), "one": (1,), "stale": (2, 3, 4)}


def residual_dequantize(placeholder, weights="int8") -> GraphBuilder:
    """[1, tokens, dim] + DEQUANTIZE([tokens, dim] constant): the ViT residual of operands of two ranks."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, TOKENS, DIM))
    if weights == "int8":
        w = b.const("w", rng.integers(-127, 128, (TOKENS, DIM)).astype(np.int8), quant=(0.01, 0))
    else:
        w = b.const("w", rng.standard_normal((TOKENS, DIM)).astype(np.float16))
    d = b.op("DEQUANTIZE", [w], shape=placeholder, dtype="float32")
    b.output(b.op("ADD", [x, d], shape=(1, TOKENS, DIM)))
    return b


def dense_dequantized_weights(placeholder) -> GraphBuilder:
    """FULLY_CONNECTED whose fp16 weights come through a DEQUANTIZE declared with a placeholder shape."""
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    x = b.input("x", (1, TOKENS, DIM))
    w = b.op("DEQUANTIZE", [b.const("w", rng.standard_normal((UNITS, DIM)).astype(np.float16))], shape=placeholder,
             dtype="float32")
    bias = b.const("bias", rng.standard_normal(UNITS).astype(np.float32))
    b.output(b.op("FULLY_CONNECTED", [x, w, bias], shape=(TOKENS, UNITS)))
    return b


def activation_chain(placeholder) -> GraphBuilder:
    """Placeholders on activations: GELU, MEAN over the features and a broadcast SUB, then the graph output
    itself declared with a placeholder (LiteRT reports the shape it computed)."""
    b = GraphBuilder()
    x = b.input("x", (1, TOKENS, DIM))
    g = b.op("GELU", [x], shape=placeholder)
    mean = b.op("MEAN", [g, b.const("axis", np.array([2], np.int32))], options={"keep_dims": True}, shape=placeholder)
    centred = b.op("SUB", [g, mean], shape=placeholder)
    b.output(b.op("MUL", [centred, b.const("gain", np.linspace(0.5, 1.5, DIM).astype(np.float32))], shape=placeholder))
    return b


MODELS = {f"{fn.__name__}-{label}": (fn, shape) for fn in (residual_dequantize, dense_dequantized_weights,
                                                           activation_chain)
          for label, shape in PLACEHOLDERS.items()}
MODELS.update({f"residual_dequantize_fp16-{label}": (lambda p: residual_dequantize(p, "fp16"), shape)
               for label, shape in PLACEHOLDERS.items()})


def case(name):
    fn, placeholder = MODELS[name]
    data = fn(placeholder).to_bytes()
    x = np.random.default_rng(2).standard_normal((1, TOKENS, DIM)).astype(np.float32)
    return data, x, litert_run(data, [x], builtin=True)


@pytest.mark.parametrize("engine", ["numpy", "litert"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_cpu_engines_run_placeholder_shapes_like_litert(name, engine):
    data, x, expected = case(name)
    it = Interpreter(model_content=data, config=load_config("configs/cpu.yaml", overrides=[f"cpu.engine={engine}"]))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    details = it.get_output_details()
    assert [tuple(d["shape"]) for d in details] == [e.shape for e in expected]
    assert_close([it.get_tensor(d["index"]) for d in details], expected, rtol=1e-5)


@pytest.mark.parametrize("backend", ["opencl", "wgpu"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_gpu_backends_run_placeholder_shapes_like_litert(name, backend):
    """Whatever the GPU backend takes of the graph runs on the inferred shapes (fp32: 5e-4 of the range)."""
    require_backend(backend)
    data, x, expected = case(name)
    model = read_model(data)
    session = Session(model, RunSettings(backends=[(backend, {}), ("cpu", {"engine": "numpy"})],
                                         compile=CompileOptions(precision="fp32", allow_quantized=True),
                                         placement=PlacementSettings(partitioner="greedy"), fallback=False))
    assert any(p.backend == backend for p in session.plan.partitions), f"nothing of {name} went to {backend}"
    out = session.run([x])
    assert_close([out[t.name] for t in session.graph.outputs], expected, rtol=5e-4)


def test_validation_gives_intermediates_their_inferred_shapes():
    """The IR after validation holds the shapes LiteRT computes, not the file's placeholders."""
    from delegate.validate import validate_graph
    graph = read_model(dense_dequantized_weights(()).to_bytes()).main
    validate_graph(graph)
    assert [op.outputs[0].shape for op in graph.ops] == [(UNITS, DIM), (TOKENS, UNITS)]
    assert graph.serialized is None  # the file no longer describes the graph: backends write it anew
