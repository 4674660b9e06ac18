"""Graph IR: tensors, ops, subgraphs and the model that holds them.

The IR mirrors what a TFLite flatbuffer expresses (so the writer can give it
back unchanged) while being convenient for passes: every tensor knows its
producer and its uses, ops carry decoded options, and constant data are
zero-copy numpy views of the model bytes.  ``str(subgraph)`` prints a
readable text form that golden tests compare.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np

from .errors import ModelFormatError

# Ops that reach beyond one run of their own subgraph: resource variables, which keep values between runs,
# and the control flow and initialisers that call other subgraphs (their outputs' shapes are a variable's or
# a called subgraph's, declared by the model, not a function of the op's inputs).
STATE_OPS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE", "IF", "WHILE"})


class DType(enum.Enum):
    """Tensor element types, valued by their TFLite ``TensorType`` code."""

    float32 = 0
    float16 = 1
    int32 = 2
    uint8 = 3
    int64 = 4
    string = 5
    bool = 6
    int16 = 7
    complex64 = 8
    int8 = 9
    float64 = 10
    complex128 = 11
    uint64 = 12
    resource = 13
    variant = 14
    uint32 = 15
    uint16 = 16
    int4 = 17
    bfloat16 = 18

    @property
    def numpy(self) -> np.dtype | None:
        """The numpy dtype holding one element, or None when there is none (string, resource)."""
        return _NUMPY.get(self)

    @property
    def itemsize(self) -> int:
        np_dtype = self.numpy
        return 0 if np_dtype is None else np_dtype.itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.float16, DType.float32, DType.float64, DType.bfloat16)

    @classmethod
    def from_numpy(cls, dtype: Any) -> "DType":
        dtype = np.dtype(dtype)
        for member, np_dtype in _NUMPY.items():
            if np_dtype == dtype and member is not DType.int4:
                return member
        raise ValueError(f"no TFLite type for numpy dtype {dtype}")


_NUMPY = {
    DType.float32: np.dtype(np.float32), DType.float16: np.dtype(np.float16),
    DType.int32: np.dtype(np.int32), DType.uint8: np.dtype(np.uint8),
    DType.int64: np.dtype(np.int64), DType.bool: np.dtype(np.bool_),
    DType.int16: np.dtype(np.int16), DType.complex64: np.dtype(np.complex64),
    DType.int8: np.dtype(np.int8), DType.float64: np.dtype(np.float64),
    DType.complex128: np.dtype(np.complex128), DType.uint64: np.dtype(np.uint64),
    DType.uint32: np.dtype(np.uint32), DType.uint16: np.dtype(np.uint16),
    DType.int4: np.dtype(np.int8),
}


@dataclass
class Quantization:
    """Affine quantization: real = scale * (q - zero_point), per tensor or per channel along ``axis``."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = 0
    min: np.ndarray | None = None
    max: np.ndarray | None = None

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantization):
            return NotImplemented
        return (np.array_equal(self.scale, other.scale)
                and np.array_equal(self.zero_point, other.zero_point)
                and (self.axis == other.axis or not self.per_channel))

    def describe(self) -> str:
        if self.per_channel:
            return f"q(axis={self.axis}, {self.scale.size} scales)"
        return f"q(scale={float(self.scale[0]):.6g}, zp={int(self.zero_point[0])})"


@dataclass
class DimensionMetadata:
    """One dimension of a sparse tensor: dense with a size, or CSR segments + indices."""

    format: str  # "DENSE" | "SPARSE_CSR"
    dense_size: int = 0
    array_segments: np.ndarray | None = None
    array_indices: np.ndarray | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DimensionMetadata):
            return NotImplemented
        def same(a, b):
            return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))
        return (self.format == other.format and self.dense_size == other.dense_size
                and same(self.array_segments, other.array_segments)
                and same(self.array_indices, other.array_indices))


@dataclass
class Sparsity:
    """TFLite sparsity parameters (used by DENSIFY inputs)."""

    traversal_order: list[int]
    block_map: list[int]
    dim_metadata: list[DimensionMetadata]


class Tensor:
    """A value in a subgraph: an activation, an input/output, or a constant."""

    def __init__(self, index: int, name: str, dtype: DType, shape: tuple[int, ...], *,
                 shape_signature: tuple[int, ...] | None = None,
                 quantization: Quantization | None = None, sparsity: Sparsity | None = None,
                 data: np.ndarray | None = None, is_variable: bool = False, buffer: int = 0,
                 has_rank: bool = False):
        self.index = index
        self.name = name
        self.dtype = dtype
        self.shape = tuple(int(d) for d in shape)
        self.shape_signature = tuple(shape_signature) if shape_signature is not None else None
        self.quantization = quantization
        self.sparsity = sparsity
        self.data = data
        self.is_variable = is_variable
        self.buffer = buffer
        self.has_rank = has_rank
        self.producer: Op | None = None
        self.uses: list[Op] = []

    @property
    def is_constant(self) -> bool:
        return self.data is not None and not self.is_variable

    @property
    def size(self) -> int:
        return math.prod(map(int, self.shape))  # exact (no int64 wrap), and ~10x quicker than np.prod on a tuple

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_dynamic(self) -> bool:
        return self.shape_signature is not None and any(d < 0 for d in self.shape_signature)

    def type_str(self) -> str:
        dims = []
        sig = self.shape_signature if self.is_dynamic else None
        for i, d in enumerate(self.shape):
            dims.append("?" if sig is not None and i < len(sig) and sig[i] < 0 else str(d))
        return f"{self.dtype.name}[{','.join(dims)}]"

    def __repr__(self) -> str:
        return f"Tensor(#{self.index} {self.name!r} {self.type_str()})"


class Op:
    """One operator application: a builtin (``CONV_2D``) or a custom code, with decoded options."""

    def __init__(self, index: int, opcode: str, inputs: list[Tensor | None], outputs: list[Tensor], *,
                 version: int = 1, options: dict[str, Any] | None = None, custom: bool = False,
                 custom_options: bytes | None = None, intermediates: list[Tensor] | None = None,
                 options_type: str | None = None):
        self.index = index
        self.opcode = opcode
        self.version = version
        self.custom = custom
        self.inputs = inputs
        self.outputs = outputs
        self.options = options if options is not None else {}
        self.options_type = options_type
        self.custom_options = custom_options
        self.intermediates = intermediates or []

    def input(self, i: int) -> Tensor | None:
        """The i-th input, or None when absent (optional input given as -1 or not at all)."""
        return self.inputs[i] if i < len(self.inputs) else None

    @property
    def name(self) -> str:
        return self.opcode

    def describe(self) -> str:
        return f"op #{self.index} ({self.opcode} v{self.version})"

    def __repr__(self) -> str:
        return f"Op(#{self.index} {self.opcode} v{self.version})"


@dataclass
class SignatureDef:
    """A named entry point: signature input/output names mapped to tensors of one subgraph."""

    key: str
    subgraph_index: int
    inputs: dict[str, int]
    outputs: dict[str, int]


class Subgraph:
    """Ops in execution order over a list of tensors, with designated inputs and outputs."""

    def __init__(self, name: str, tensors: list[Tensor], ops: list[Op], inputs: list[Tensor],
                 outputs: list[Tensor]):
        self.name = name
        self.tensors = tensors
        self.ops = ops
        self.inputs = inputs
        self.outputs = outputs
        # The .tflite bytes this is the main subgraph of, with its op count then (set by the reader):
        # a backend running the whole subgraph unchanged may hand those on instead of writing it out.
        self.serialized: tuple[bytes, int] | None = None
        self.link()

    def link(self) -> None:
        """Recompute every tensor's producer and uses from the ops."""
        for t in self.tensors:
            t.producer, t.uses = None, []
        for op in self.ops:
            for t in op.inputs:
                if t is not None and op not in t.uses:
                    t.uses.append(op)
            for t in op.outputs:
                t.producer = op

    def topological_order(self) -> list[Op]:
        """Ops ordered so each runs after the producers of its inputs; raises on a cycle.

        Files list ops in execution order, so that order is kept whenever it is valid.
        """
        position = {id(op): i for i, op in enumerate(self.ops)}
        deps = {i: {position[id(t.producer)] for t in op.inputs if t is not None and t.producer is not None}
                for i, op in enumerate(self.ops)}
        if all(d < i for i, ds in deps.items() for d in ds):
            return list(self.ops)
        from graphlib import CycleError, TopologicalSorter
        try:
            order = list(TopologicalSorter(deps).static_order())
        except CycleError as exc:
            raise ModelFormatError(
                f"subgraph {self.name!r}: ops form a cycle through op #{self.ops[exc.args[1][0]].index}"
            ) from None
        return [self.ops[i] for i in order]

    def opcode_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.opcode] = counts.get(op.opcode, 0) + 1
        return counts

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __str__(self) -> str:
        return format_subgraph(self)


@dataclass
class Model:
    """A whole TFLite model: subgraphs (0 is main), signatures, metadata and description."""

    subgraphs: list[Subgraph]
    signatures: list[SignatureDef] = field(default_factory=list)
    metadata: dict[str, bytes] = field(default_factory=dict)
    description: str = ""
    version: int = 3

    @property
    def main(self) -> Subgraph:
        return self.subgraphs[0]

    def all_ops(self) -> Iterable[Op]:
        for sg in self.subgraphs:
            yield from sg.ops

    def __str__(self) -> str:
        parts = [str(sg) for sg in self.subgraphs]
        for sig in self.signatures:
            parts.append(f"signature {sig.key!r} -> subgraph {sig.subgraph_index}: "
                         f"inputs {sorted(sig.inputs)} outputs {sorted(sig.outputs)}")
        return "\n".join(parts)


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format_value(v) for v in value) + "]"
    return str(value)


def _format_operand(t: Tensor | None) -> str:
    if t is None:
        return "_"
    text = f"%{t.index}"
    if t.is_constant:
        text += f":const {t.type_str()}"
    return text


def format_subgraph(sg: Subgraph) -> str:
    """Readable text IR in the style of torch.fx: one line per op, operands as %index."""
    def decl(t: Tensor) -> str:
        q = f" {t.quantization.describe()}" if t.quantization else ""
        return f"%{t.index} {t.name!r}: {t.type_str()}{q}"

    lines = [f"subgraph {sg.name!r} ({', '.join(decl(t) for t in sg.inputs)})"]
    for op in sg.ops:
        outs = ", ".join(decl(t) for t in op.outputs)
        args = ", ".join(_format_operand(t) for t in op.inputs)
        opts = ""
        if op.options:
            opts = " {" + ", ".join(f"{k}={_format_value(v)}" for k, v in op.options.items()) + "}"
        elif op.custom_options:
            opts = f" {{custom_options: {len(op.custom_options)} bytes}}"
        kind = "custom " if op.custom else ""
        lines.append(f"  #{op.index} {outs} = {kind}{op.opcode}.v{op.version}({args}){opts}")
    lines.append(f"  return {', '.join('%' + str(t.index) for t in sg.outputs)}")
    return "\n".join(lines)
