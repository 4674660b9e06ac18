"""A small API to make TFLite models in a few lines (tests, the zoo, the default model).

    b = GraphBuilder()
    x = b.input("x", (1, 8, 8, 3))
    y = b.op("CONV_2D", [x, b.const("w", w), b.const("b", bias)],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1})
    b.output(b.op("RELU", [y]))
    tflite_bytes = b.to_bytes()

Output shapes are inferred by :mod:`delegate.shapes` unless given.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..ir import DType, Model, Op, Quantization, SignatureDef, Subgraph, Tensor
from . import schema
from .writer import write_model


def make_quantization(quant: Any) -> Quantization | None:
    """Accept a Quantization, (scale, zero_point) or (scales, zero_points, axis)."""
    if quant is None or isinstance(quant, Quantization):
        return quant
    scale, zero_point, *rest = quant
    return Quantization(np.atleast_1d(np.asarray(scale, np.float32)),
                        np.atleast_1d(np.asarray(zero_point, np.int64)), int(rest[0]) if rest else 0)


def _dtype(value: Any) -> DType:
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in DType.__members__:
        return DType[value]
    return DType.from_numpy(value)


class GraphBuilder:
    """Builds one subgraph (plus signature) and serialises it through the writer."""

    def __init__(self, name: str = "main", description: str = "delegate builder"):
        self.name = name
        self.description = description
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self.metadata: dict[str, bytes] = {}
        self._names: set[str] = set()

    def _unique(self, name: str) -> str:
        base, n = name, 1
        while name in self._names:
            name, n = f"{base}_{n}", n + 1
        self._names.add(name)
        return name

    def tensor(self, name: str, shape: Sequence[int], dtype: Any = "float32", *, quant: Any = None,
               data: np.ndarray | None = None, shape_signature: Sequence[int] | None = None,
               is_variable: bool = False) -> Tensor:
        t = Tensor(len(self.tensors), self._unique(name), _dtype(dtype), tuple(shape),
                   quantization=make_quantization(quant), data=data, is_variable=is_variable,
                   shape_signature=tuple(shape_signature) if shape_signature is not None else None)
        self.tensors.append(t)
        return t

    def input(self, name: str, shape: Sequence[int], dtype: Any = "float32", *, quant: Any = None,
              shape_signature: Sequence[int] | None = None) -> Tensor:
        t = self.tensor(name, shape, dtype, quant=quant, shape_signature=shape_signature)
        self.inputs.append(t)
        return t

    def const(self, name: str, data: Any, dtype: Any = None, *, quant: Any = None) -> Tensor:
        arr = np.asarray(data)
        if dtype is not None:
            arr = arr.astype(_dtype(dtype).numpy)
        elif arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        elif arr.dtype == np.int64 and not isinstance(data, np.ndarray):
            arr = arr.astype(np.int32)
        arr = np.array(arr, order="C")  # (ascontiguousarray would make a scalar one-dimensional)
        return self.tensor(name, arr.shape, arr.dtype, quant=quant, data=arr)

    def op(self, opcode: str, inputs: Sequence[Tensor | None], *, options: dict[str, Any] | None = None,
           version: int = 1, custom: bool = False, custom_options: bytes | None = None,
           outputs: Sequence[Tensor] | None = None, shape: Sequence[int] | None = None,
           shapes: Sequence[Sequence[int]] | None = None, dtype: Any = None, quant: Any = None,
           name: str | None = None, num_outputs: int = 1) -> Any:
        """Append an op; returns its output tensor (or the list, for several outputs)."""
        if not custom and opcode not in schema.BUILTIN_CODES:
            raise ValueError(f"unknown builtin op {opcode!r}")
        options = dict(options or {})
        op = Op(len(self.ops), opcode, list(inputs), [], version=version, options=options, custom=custom,
                custom_options=custom_options,
                options_type=None if custom else schema.options_table_for(opcode))
        if outputs is None:
            first = next((t for t in inputs if t is not None), None)
            out_dtype = _dtype(dtype) if dtype is not None else (first.dtype if first else DType.float32)
            if shapes is None:
                if shape is not None:
                    shapes = [shape]
                else:
                    from ..shapes import infer_output_shapes
                    shapes = infer_output_shapes(op, num_outputs)
            base = name or opcode.lower()
            outputs = [self.tensor(base if len(shapes) == 1 else f"{base}:{i}", s, out_dtype, quant=quant)
                       for i, s in enumerate(shapes)]
        op.outputs = list(outputs)
        self.ops.append(op)
        return op.outputs[0] if len(op.outputs) == 1 else op.outputs

    def output(self, *tensors: Tensor) -> None:
        self.outputs.extend(tensors)

    def subgraph(self) -> Subgraph:
        return Subgraph(self.name, self.tensors, self.ops, self.inputs, self.outputs)

    def signature(self, key: str, subgraph_index: int = 0) -> SignatureDef:
        return SignatureDef(key, subgraph_index, {t.name: t.index for t in self.inputs},
                            {t.name: t.index for t in self.outputs})

    def build(self, signature_key: str | None = "serving_default") -> Model:
        sigs = [self.signature(signature_key)] if signature_key else []
        return Model([self.subgraph()], sigs, dict(self.metadata), self.description)

    def to_bytes(self, **kwargs) -> bytes:
        return write_model(self.build(), **kwargs)


def build_model(*builders: GraphBuilder, signatures: Sequence[str | None] | None = None) -> bytes:
    """One model of several subgraphs (``builders[i]`` is subgraph i, as control-flow options index them).

    ``signatures[i]`` names subgraph i's signature (None: no signature); by default only subgraph 0 has
    one, ``serving_default``.
    """
    keys = list(signatures) if signatures is not None else ["serving_default"] + [None] * (len(builders) - 1)
    sigs = [b.signature(key, i) for i, (b, key) in enumerate(zip(builders, keys)) if key]
    return write_model(Model([b.subgraph() for b in builders], sigs, {}, builders[0].description))
