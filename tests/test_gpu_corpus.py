"""The whole corpus on each GPU backend (PoCL and lavapipe here): the share of its ops a GPU backend
accepts, and every model with what it accepts placed there matching LiteRT.

Every op a GPU backend supports is placed on it (greedy partitioner, no partition limit);
the rest runs on the CPU, so mixed plans and boundary copies are exercised as well.
"""

import numpy as np
import pytest

from delegate import CompileOptions, read_model, zoo
from delegate.planner import PlacementSettings
from delegate.plugins import default_manager
from delegate.session import RunSettings, Session
from tests.mediapipe import NEEDS_MEDIAPIPE_OPS, mediapipe_models
from tests.oputil import litert_run, require_backend
from tests.test_converter_models import FIXTURES, MANIFEST

# fp32 on a GPU backend: within this fraction of each output's range of LiteRT's result (or within twice
# what separates LiteRT's two kernel sets, where that is more).
TOLERANCE = 5e-4
# The share of the corpus's ops (every model, quantized ones included) each GPU backend must accept.
OP_SHARE = 0.97


def corpus() -> list[tuple[str, bytes]]:
    models = [(name, path.read_bytes()) for name, path in mediapipe_models().items()
              if name not in NEEDS_MEDIAPIPE_OPS]
    models += [(f"zoo:{name}", zoo.build(name)) for name in sorted(zoo.ZOO)]
    models += [(name, (FIXTURES / name).read_bytes()) for name in sorted(MANIFEST)
               if MANIFEST[name]["mode"] in ("fp32", "fp16")]
    return models


CORPUS = corpus()


@pytest.mark.parametrize("backend", ["opencl", "wgpu"])
def test_corpus_op_share(backend):
    """Of all the corpus's ops (the models above, those with MediaPipe's own ops and the quantized fixtures
    too), the backend accepts at least OP_SHARE."""
    require_backend(backend)
    models = [data for _, data in CORPUS]
    models += [path.read_bytes() for name, path in mediapipe_models().items() if name in NEEDS_MEDIAPIPE_OPS]
    models += [(FIXTURES / name).read_bytes() for name in sorted(MANIFEST) if MANIFEST[name]["mode"] not in
               ("fp32", "fp16")]
    be = default_manager().backend_info(backend).factory({})
    options = CompileOptions(allow_quantized=True)
    answers = [bool(be.supports(op, options)) for data in models for op in read_model(data).main.ops]
    share = sum(answers) / len(answers)
    assert share >= OP_SHARE, f"{backend} accepts {sum(answers)} of {len(answers)} ops ({share:.1%})"


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """Largest difference as a fraction of the expected output's range."""
    return float(np.abs(actual.astype(np.float64) - expected).max()) / max(float(np.abs(expected).max()), 1e-6)


def reference(data: bytes, model, inputs) -> dict[str, tuple[np.ndarray, float]]:
    """Per output: LiteRT's builtin kernels' result, and how far LiteRT's XNNPACK kernels are from it (an
    output that deep chains make ill-conditioned differs between LiteRT's own two kernel sets too).  Where
    LiteRT's pip interpreter lacks one of the model's custom ops (MediaPipe's Convolution2DTransposeBias):
    the CPU backend's result, its kernel for that op checked against LiteRT's builtin equivalent
    (tests/ops/test_custom_ops.py)."""
    if any(op.custom for op in model.main.ops):
        cpu = Session(read_model(data), RunSettings(backends=[("cpu", {"engine": "numpy"})])).run(inputs)
        return {name: (value, 0.0) for name, value in cpu.items()}
    names = [t.name for t in model.main.outputs]
    builtin, xnnpack = litert_run(data, inputs, builtin=True), litert_run(data, inputs)
    return {name: (e, relative_error(x, e)) for name, e, x in zip(names, builtin, xnnpack)}


@pytest.fixture(scope="module")
def litert_results():
    return {}


@pytest.mark.parametrize("backend", ["opencl", "wgpu"])
@pytest.mark.parametrize("label", [label for label, _ in CORPUS])
def test_corpus_model_matches_litert(backend, label, litert_results):
    require_backend(backend)
    data = dict(CORPUS)[label]
    model = read_model(data)
    rng = np.random.default_rng(0)
    inputs = []
    for t in model.main.inputs:
        lookups = [op for op in t.uses if op.opcode == "GATHER" and op.inputs[1] is t]
        if lookups:
            inputs.append(rng.integers(0, lookups[0].inputs[0].shape[0], t.shape).astype(t.dtype.numpy))
        else:
            inputs.append(rng.uniform(-1, 1, t.shape).astype(t.dtype.numpy))
    if label not in litert_results:
        litert_results[label] = reference(data, model, inputs)
    expected = litert_results[label]
    session = Session(model, RunSettings(backends=[(backend, {}), ("cpu", {"engine": "numpy"})],
                                         compile=CompileOptions(precision="fp32", allow_quantized=True),
                                         placement=PlacementSettings(partitioner="greedy"), fallback=False))
    placed = sum(len(p.ops) for p in session.plan.partitions if p.backend == backend)
    assert placed > 0, f"nothing of {label} was placed on {backend}"
    actual = session.run(inputs)
    for name, (e, spread) in expected.items():
        error = relative_error(actual[name], e)
        assert error <= max(TOLERANCE, 2 * spread), \
            f"{label} on {backend}: output {name!r} off by {error:.3g} of its range (LiteRT's kernel sets: {spread:.3g})"
