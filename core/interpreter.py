"""A drop-in for ``ai_edge_litert.interpreter.Interpreter`` running on delegate's backends.

Existing LiteRT code works by changing one import: the same constructor
arguments, the same methods and the same detail dictionaries.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import numpy as np

from .errors import ExecutionError, UnsupportedOpError
from .ir import Model, Tensor
from .shapes import propagate
from .tflite.reader import read_model


def _details(t: Tensor) -> dict[str, Any]:
    q = t.quantization
    scales = q.scale.astype(np.float32) if q is not None else np.zeros(0, np.float32)
    zero_points = q.zero_point.astype(np.int32) if q is not None else np.zeros(0, np.int32)
    per_tensor = (float(scales[0]), int(zero_points[0])) if q is not None and scales.size == 1 else (0.0, 0)
    sig = t.shape_signature if t.shape_signature is not None else t.shape
    return {
        "name": t.name,
        "index": t.index,
        "shape": np.array(t.shape, np.int32),
        "shape_signature": np.array(sig, np.int32),
        "dtype": t.dtype.numpy.type if t.dtype.numpy is not None else np.object_,
        "quantization": per_tensor,
        "quantization_parameters": {"scales": scales, "zero_points": zero_points,
                                    "quantized_dimension": q.axis if q is not None else 0},
        "sparsity_parameters": {},
    }


class Interpreter:
    """LiteRT-compatible interpreter; ``config`` (path or Config) picks backends and precision.

    One instance may be shared by threads: invocations take turns, and each thread's
    set_tensor/invoke/get_tensor see the values it set and the outputs of its own last
    invoke (a value set by another thread is used only where this one set none).
    """

    def __init__(self, model_path: str | os.PathLike | None = None, model_content: bytes | None = None,
                 experimental_delegates: Any = None, num_threads: int | None = None,
                 config: Any = None, **_ignored: Any):
        if (model_path is None) == (model_content is None):
            raise ValueError("give exactly one of model_path or model_content")
        self._model: Model = read_model(model_path if model_path is not None else model_content)
        self._config = config
        self._num_threads = _checked_threads(num_threads)
        self._session = None
        self._values = _ThreadValues()
        self._graph = self._model.main

    # -- set-up -------------------------------------------------------------
    def allocate_tensors(self) -> None:
        from .config import load_config
        from .session import Session, run_settings

        config = self._config
        if config is None or isinstance(config, (str, os.PathLike)):
            overrides = [f"num_threads={self._num_threads}"] if self._num_threads else []
            config = load_config(config, overrides=overrides)
        self._session = Session(self._model, run_settings(config))
        self._values = _ThreadValues()

    def _require_session(self):
        if self._session is None:
            raise ExecutionError("call allocate_tensors() before using the interpreter")
        return self._session

    def get_input_details(self) -> list[dict[str, Any]]:
        return [_details(t) for t in self._graph.inputs]

    def get_output_details(self) -> list[dict[str, Any]]:
        return [_details(t) for t in self._graph.outputs]

    def get_tensor_details(self) -> list[dict[str, Any]]:
        return [_details(t) for t in self._graph.tensors]

    def resize_tensor_input(self, input_index: int, tensor_size, strict: bool = False) -> None:
        """Change an input's shape; shapes downstream are re-inferred at the next allocate_tensors()."""
        t = self._input(input_index)
        new_shape = tuple(int(d) for d in tensor_size)
        if any(d < 0 for d in new_shape):
            raise ExecutionError(f"input {t.name!r}: dimensions must be >= 0, got {list(new_shape)}")
        if strict and t.shape_signature is not None:
            for old, new in zip(t.shape_signature, new_shape):
                if old != -1 and old != new:
                    raise ExecutionError(f"input {t.name!r}: dimension {old} is not dynamic (strict resize)")
        if len(new_shape) != len(t.shape):
            raise ExecutionError(f"input {t.name!r}: cannot change rank from {len(t.shape)} to {len(new_shape)}")
        t.shape = new_shape
        try:
            propagate(self._graph)
        except UnsupportedOpError as exc:
            raise ExecutionError(str(exc)) from None
        self._session = None

    def _input(self, index: int) -> Tensor:
        for t in self._graph.inputs:
            if t.index == index:
                return t
        raise ExecutionError(f"tensor {index} is not an input; inputs are "
                             f"{[t.index for t in self._graph.inputs]}")

    # -- running ------------------------------------------------------------
    def set_tensor(self, tensor_index: int, value: Any) -> None:
        from .session import checked_input

        self._require_session()
        t = self._input(tensor_index)
        self._values.update({t.index: checked_input(t, np.array(value))})

    def invoke(self) -> None:
        session = self._require_session()
        missing = [t.name for t in self._graph.inputs if self._values.get(t.index) is None]
        if missing:
            raise ExecutionError(f"input(s) not set: {', '.join(missing)}")
        inputs = {t.index: self._values.get(t.index) for t in self._graph.inputs}
        self._values.update(session.run_indexed(inputs))

    def get_tensor(self, tensor_index: int, subgraph_index: int = 0) -> np.ndarray:
        self._require_session()
        value = self._values.get(tensor_index)
        if value is not None:
            return np.array(value)
        t = self._graph.tensors[tensor_index] if 0 <= tensor_index < len(self._graph.tensors) else None
        if t is not None and t.data is not None:
            return np.array(t.data)
        raise ExecutionError(f"tensor {tensor_index} has no value (only inputs, outputs and constants are kept)")

    def tensor(self, tensor_index: int) -> Callable[[], np.ndarray]:
        return lambda: self.get_tensor(tensor_index)

    # -- signatures ----------------------------------------------------------
    def get_signature_list(self) -> dict[str, dict[str, list[str]]]:
        return {s.key: {"inputs": sorted(s.inputs), "outputs": sorted(s.outputs)} for s in self._model.signatures}

    def get_signature_runner(self, signature_key: str | None = None) -> "SignatureRunner":
        sigs = {s.key: s for s in self._model.signatures}
        if signature_key is None:
            if len(sigs) != 1:
                raise ValueError(f"give a signature key; the model has {sorted(sigs)}")
            signature_key = next(iter(sigs))
        if signature_key not in sigs:
            raise ValueError(f"unknown signature {signature_key!r}; the model has {sorted(sigs)}")
        if self._session is None:
            self.allocate_tensors()
        return SignatureRunner(self, sigs[signature_key])


def _checked_threads(num_threads: Any) -> int | None:
    """LiteRT's num_threads (-1 or None: the default), bounded like the config's key."""
    from .config_schema import MAX_THREADS

    if num_threads is None or num_threads == -1:
        return None
    if isinstance(num_threads, bool) or not isinstance(num_threads, (int, np.integer)) or \
            not 1 <= num_threads <= MAX_THREADS:
        raise ValueError(f"num_threads must be -1 or 1..{MAX_THREADS} (this machine), got {num_threads!r}")
    return int(num_threads)


class _ThreadValues:
    """Tensor values per thread over the values last set or produced by any thread."""

    def __init__(self):
        self._shared: dict[int, np.ndarray] = {}
        self._local = threading.local()

    def _mine(self) -> dict[int, np.ndarray]:
        if not hasattr(self._local, "values"):
            self._local.values = {}
        return self._local.values

    def update(self, values: dict[int, np.ndarray]) -> None:
        self._mine().update(values)
        self._shared.update(values)

    def get(self, index: int) -> np.ndarray | None:
        mine = self._mine()
        return mine[index] if index in mine else self._shared.get(index)


class SignatureRunner:
    """Calls a signature with keyword inputs and returns its outputs by signature name."""

    def __init__(self, interpreter: Interpreter, signature):
        self._interpreter = interpreter
        self._signature = signature

    def get_input_details(self) -> dict[str, dict[str, Any]]:
        g = self._interpreter._graph
        return {name: _details(g.tensors[i]) for name, i in self._signature.inputs.items()}

    def get_output_details(self) -> dict[str, dict[str, Any]]:
        g = self._interpreter._graph
        return {name: _details(g.tensors[i]) for name, i in self._signature.outputs.items()}

    def __call__(self, **inputs: Any) -> dict[str, np.ndarray]:
        unknown = set(inputs) - set(self._signature.inputs)
        if unknown:
            raise ValueError(f"unknown signature input(s) {sorted(unknown)}; expected {sorted(self._signature.inputs)}")
        for name, value in inputs.items():
            self._interpreter.set_tensor(self._signature.inputs[name], value)
        self._interpreter.invoke()
        return {name: self._interpreter.get_tensor(i) for name, i in self._signature.outputs.items()}
