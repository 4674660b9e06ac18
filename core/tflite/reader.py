"""TFLite flatbuffer -> IR.

The reader trusts nothing in the file: every index, length, offset and shape
is checked before use, so a corrupt or hostile model ends in one
``ModelFormatError`` naming what is wrong and where, never in another
exception, a hang, or an allocation larger than ``max_tensor_bytes``.
Constant data stay zero-copy views of the model bytes.
"""

from __future__ import annotations

import os
import re
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
from tflite.Model import Model as FbModel

from ..errors import ModelFormatError
from ..ir import DimensionMetadata, DType, Model, Op, Quantization, SignatureDef, Sparsity, Subgraph, Tensor
from . import schema

DEFAULT_MAX_TENSOR_BYTES = 2 << 30  # a model claiming a larger tensor is refused before anything is allocated
_CUSTOM = schema.BUILTIN_CODES["CUSTOM"]
_PAST_END = re.compile(r"at offset (\d+) \(actual buffer size is (\d+)\)")  # struct.error reading past the end


@contextmanager
def _where(what: str) -> Iterator[None]:
    """Turn low-level decoding failures into a ModelFormatError that says where they happened."""
    try:
        yield
    except ModelFormatError:
        raise
    except (IndexError, struct.error, ValueError, TypeError, OverflowError, UnicodeDecodeError,
            AttributeError, KeyError, MemoryError, RecursionError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        past_end = _PAST_END.search(detail) if isinstance(exc, struct.error) else None
        if past_end:
            raise ModelFormatError(f"{what}: truncated model: it refers to byte {past_end[1]} of a "
                                   f"{past_end[2]}-byte file (cut short, or an offset past its end)") from None
        raise ModelFormatError(f"{what}: malformed flatbuffer data ({detail})") from None


class _Reader:
    def __init__(self, data: bytes, max_tensor_bytes: int):
        self.data = data
        self.size = len(data)
        self.max_tensor_bytes = max_tensor_bytes
        self.fb = FbModel.GetRootAs(data, 0)
        self.opcodes: list[tuple[str, bool, int]] = []
        self.buffers: list[np.ndarray | None] = []

    # -- bounds helpers -------------------------------------------------
    def length(self, obj, field: str, what: str, elem_size: int = 4) -> int:
        n = getattr(obj, f"{field}Length")()
        if n < 0 or n * elem_size > self.size:
            raise ModelFormatError(f"{what}: {field} claims {n} entries, more than the file can hold")
        return n

    def ints(self, obj, field: str, what: str) -> np.ndarray:
        self.length(obj, field, what)
        arr = getattr(obj, f"{field}AsNumpy")()
        return np.zeros(0, np.int32) if isinstance(arr, int) else arr

    # -- model ----------------------------------------------------------
    def read(self) -> Model:
        fb = self.fb
        with _where("model header"):
            version = fb.Version()
            description = fb.Description()
            description = description.decode("utf-8", "replace") if description else ""
        self.read_buffers()
        self.read_opcodes()
        n_sub = self.length(fb, "Subgraphs", "model")
        if n_sub == 0:
            raise ModelFormatError("model has no subgraphs")
        subgraphs = [self.read_subgraph(i) for i in range(n_sub)]
        for sg in subgraphs:
            for op in sg.ops:
                for key, value in op.options.items():
                    if key.endswith("subgraph_index") and not 0 <= int(value) < n_sub:
                        raise ModelFormatError(f"subgraph {sg.name!r} {op.describe()}: {key} {value} "
                                               f"is outside 0..{n_sub - 1}")
            sg.topological_order()  # raises on cycles
        subgraphs[0].serialized = (self.data, len(subgraphs[0].ops))
        return Model(subgraphs, self.read_signatures(subgraphs), self.read_metadata(), description, version)

    def read_buffers(self) -> None:
        fb = self.fb
        n = self.length(fb, "Buffers", "model")
        for i in range(n):
            with _where(f"buffer {i}"):
                buf = fb.Buffers(i)
                offset, size = buf.Offset(), buf.Size()
                if offset > 1:
                    if offset + size > self.size:
                        raise ModelFormatError(f"buffer {i}: data at offset {offset} size {size} "
                                               f"lies outside the {self.size}-byte file")
                    self.buffers.append(np.frombuffer(self.data, np.uint8, size, offset))
                    continue
                self.length(buf, "Data", f"buffer {i}", 1)
                arr = buf.DataAsNumpy()
                self.buffers.append(None if isinstance(arr, int) or arr.size == 0 else arr)

    def read_opcodes(self) -> None:
        fb = self.fb
        n = self.length(fb, "OperatorCodes", "model")
        for i in range(n):
            with _where(f"operator code {i}"):
                oc = fb.OperatorCodes(i)
                code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
                version = oc.Version()
                if code == _CUSTOM:
                    custom = oc.CustomCode()
                    name = custom.decode("utf-8", "replace") if custom else "CUSTOM"
                    self.opcodes.append((name, True, version))
                else:
                    self.opcodes.append((schema.BUILTIN_NAMES.get(code, f"BUILTIN_{code}"), False, version))

    def read_subgraph(self, si: int) -> Subgraph:
        with _where(f"subgraph {si}"):
            fsg = self.fb.Subgraphs(si)
            name = fsg.Name()
            name = name.decode("utf-8", "replace") if name else ("main" if si == 0 else f"subgraph_{si}")
        n_t = self.length(fsg, "Tensors", f"subgraph {si}")
        tensors = [self.read_tensor(fsg, si, ti) for ti in range(n_t)]

        def tensor_at(idx: int, what: str, optional: bool = False) -> Tensor | None:
            if optional and idx == -1:
                return None
            if not 0 <= idx < n_t:
                raise ModelFormatError(f"subgraph {si} {what}: tensor index {idx} is outside 0..{n_t - 1}")
            return tensors[idx]

        n_ops = self.length(fsg, "Operators", f"subgraph {si}")
        ops = []
        produced: dict[int, int] = {}
        for oi in range(n_ops):
            with _where(f"subgraph {si} op #{oi}"):
                fop = fsg.Operators(oi)
                op = self.read_op(fop, si, oi, tensor_at)
            for t in op.outputs:
                if t.index in produced:
                    raise ModelFormatError(f"subgraph {si} op #{oi}: tensor {t.index} is already produced "
                                           f"by op #{produced[t.index]}")
                produced[t.index] = oi
            ops.append(op)
        with _where(f"subgraph {si} inputs/outputs"):
            inputs = [tensor_at(int(i), "input") for i in self.ints(fsg, "Inputs", f"subgraph {si}")]
            outputs = [tensor_at(int(i), "output") for i in self.ints(fsg, "Outputs", f"subgraph {si}")]
        return Subgraph(name, tensors, ops, inputs, outputs)

    def read_tensor(self, fsg, si: int, ti: int) -> Tensor:
        what = f"subgraph {si} tensor {ti}"
        with _where(what):
            ft = fsg.Tensors(ti)
            code = ft.Type()
            try:
                dtype = DType(code)
            except ValueError:
                raise ModelFormatError(f"{what}: unknown tensor type code {code}") from None
            shape = tuple(int(d) for d in self.ints(ft, "Shape", what))
            sig = None if ft.ShapeSignatureIsNone() else tuple(int(d) for d in self.ints(ft, "ShapeSignature", what))
            name = ft.Name()
            name = name.decode("utf-8", "replace") if name else f"tensor_{ti}"
            if any(d < 0 for d in shape):
                raise ModelFormatError(f"{what} ({name!r}): negative dimension in shape {list(shape)}")
            if sig is not None and any(d < -1 for d in sig):
                raise ModelFormatError(f"{what} ({name!r}): invalid shape signature {list(sig)}")
            elements = 1
            for d in shape:
                elements *= d
            if elements * max(dtype.itemsize, 1) > self.max_tensor_bytes:
                raise ModelFormatError(f"{what} ({name!r}): shape {list(shape)} needs more than the "
                                       f"{self.max_tensor_bytes} bytes allowed per tensor")
            quant = self.read_quantization(ft.Quantization(), what)
            sparsity = self.read_sparsity(ft.Sparsity(), what)
            buffer_index = ft.Buffer()
            if not 0 <= buffer_index < max(len(self.buffers), 1):
                raise ModelFormatError(f"{what} ({name!r}): buffer index {buffer_index} is outside "
                                       f"0..{len(self.buffers) - 1}")
            raw = self.buffers[buffer_index] if self.buffers else None
            data = None
            if raw is not None:
                data = self.tensor_data(raw, dtype, shape, sparsity, f"{what} ({name!r})")
            return Tensor(ti, name, dtype, shape, shape_signature=sig, quantization=quant, sparsity=sparsity,
                          data=data, is_variable=bool(ft.IsVariable()), buffer=buffer_index,
                          has_rank=bool(ft.HasRank()))

    def tensor_data(self, raw: np.ndarray, dtype: DType, shape, sparsity, what: str) -> np.ndarray:
        if dtype in (DType.string, DType.resource, DType.variant) or dtype.numpy is None:
            return raw
        if dtype is DType.int4:
            return raw  # packed nibbles; kernels unpack on use
        item = dtype.itemsize
        if raw.size % item:
            raise ModelFormatError(f"{what}: buffer of {raw.size} bytes is not a whole number of {dtype.name}")
        values = raw.view(dtype.numpy) if raw.size else raw.astype(dtype.numpy)
        if sparsity is not None:
            return values  # the compressed values; DENSIFY expands them
        expected = 1
        for d in shape:
            expected *= d
        if values.size != expected:
            raise ModelFormatError(f"{what}: buffer holds {values.size} values but shape {list(shape)} "
                                   f"needs {expected}")
        return values.reshape(shape)

    def read_quantization(self, fq, what: str) -> Quantization | None:
        if fq is None:
            return None
        scale = self.ints(fq, "Scale", what).astype(np.float32)
        if scale.size == 0:
            return None
        zp = self.ints(fq, "ZeroPoint", what).astype(np.int64)
        if zp.size == 0:
            zp = np.zeros(scale.size, np.int64)
        if zp.size != scale.size:
            raise ModelFormatError(f"{what}: {scale.size} quantization scales but {zp.size} zero points")
        mn = self.ints(fq, "Min", what)
        mx = self.ints(fq, "Max", what)
        return Quantization(scale, zp, int(fq.QuantizedDimension()),
                            mn.astype(np.float32) if mn.size else None, mx.astype(np.float32) if mx.size else None)

    def read_sparsity(self, fs, what: str) -> Sparsity | None:
        if fs is None:
            return None
        order = [int(x) for x in self.ints(fs, "TraversalOrder", what)]
        block_map = [int(x) for x in self.ints(fs, "BlockMap", what)]
        dims = []
        for j in range(self.length(fs, "DimMetadata", what)):
            fd = fs.DimMetadata(j)
            fmt = "DENSE" if fd.Format() == 0 else "SPARSE_CSR"
            dims.append(DimensionMetadata(fmt, int(fd.DenseSize()),
                                          self.index_vector(fd.ArraySegmentsType(), fd.ArraySegments(), what),
                                          self.index_vector(fd.ArrayIndicesType(), fd.ArrayIndices(), what)))
        return Sparsity(order, block_map, dims)

    def index_vector(self, kind: int, table, what: str) -> np.ndarray | None:
        if kind == 0 or table is None:
            return None
        names = {1: "Int32Vector", 2: "Uint16Vector", 3: "Uint8Vector"}
        if kind not in names:
            raise ModelFormatError(f"{what}: unknown sparse index vector type {kind}")
        obj = getattr(schema.generated_module(names[kind]), names[kind])()
        obj.Init(table.Bytes, table.Pos)
        return self.ints(obj, "Values", what)

    def read_op(self, fop, si: int, oi: int, tensor_at) -> Op:
        where = f"op #{oi}"
        code_index = fop.OpcodeIndex()
        if not 0 <= code_index < len(self.opcodes):
            raise ModelFormatError(f"subgraph {si} {where}: opcode index {code_index} is outside "
                                   f"0..{len(self.opcodes) - 1}")
        opcode, custom, version = self.opcodes[code_index]
        where = f"{where} ({opcode})"
        inputs = [tensor_at(int(i), where, optional=True) for i in self.ints(fop, "Inputs", where)]
        outputs = [tensor_at(int(i), where) for i in self.ints(fop, "Outputs", where)]
        intermediates = [tensor_at(int(i), where) for i in self.ints(fop, "Intermediates", where)]
        options, options_type = {}, None
        otype = fop.BuiltinOptionsType()
        if otype != 0:
            options_type = schema.OPTIONS_NAMES.get(otype)
            if options_type is None:
                raise ModelFormatError(f"subgraph {si} {where}: unknown builtin options type {otype}")
            options = schema.decode_options(options_type, fop.BuiltinOptions())
        else:
            otype2 = fop.BuiltinOptions2Type()
            if otype2 != 0:
                options_type = schema.OPTIONS2_NAMES.get(otype2)
                if options_type is None:
                    raise ModelFormatError(f"subgraph {si} {where}: unknown builtin options type {otype2}")
                options = schema.decode_options(options_type, fop.BuiltinOptions2())
        expected = None if custom else schema.options_table_for(opcode)
        if expected is not None and options_type != expected:
            options, options_type = schema.absent_options(expected), expected
        custom_options = None
        if not fop.CustomOptionsIsNone():
            self.length(fop, "CustomOptions", where, 1)
            custom_options = fop.CustomOptionsAsNumpy().tobytes()
        large_off, large_size = fop.LargeCustomOptionsOffset(), fop.LargeCustomOptionsSize()
        if large_off > 1:
            if large_off + large_size > self.size:
                raise ModelFormatError(f"subgraph {si} {where}: custom options at offset {large_off} "
                                       f"lie outside the file")
            custom_options = bytes(self.data[large_off:large_off + large_size])
        return Op(oi, opcode, inputs, outputs, version=version, options=options, custom=custom,
                  custom_options=custom_options, intermediates=intermediates, options_type=options_type)

    def read_signatures(self, subgraphs: list[Subgraph]) -> list[SignatureDef]:
        fb, sigs = self.fb, []
        for i in range(self.length(fb, "SignatureDefs", "model")):
            what = f"signature {i}"
            with _where(what):
                fs = fb.SignatureDefs(i)
                sub = fs.SubgraphIndex()
                if not 0 <= sub < len(subgraphs):
                    raise ModelFormatError(f"{what}: subgraph index {sub} is outside 0..{len(subgraphs) - 1}")
                n_t = len(subgraphs[sub].tensors)

                def tensor_map(field: str) -> dict[str, int]:
                    out = {}
                    for j in range(self.length(fs, field, what)):
                        tm = getattr(fs, field)(j)
                        idx = tm.TensorIndex()
                        if not 0 <= idx < n_t:
                            raise ModelFormatError(f"{what}: tensor index {idx} is outside 0..{n_t - 1}")
                        out[(tm.Name() or b"").decode("utf-8", "replace")] = int(idx)
                    return out

                key = (fs.SignatureKey() or b"").decode("utf-8", "replace")
                sigs.append(SignatureDef(key, int(sub), tensor_map("Inputs"), tensor_map("Outputs")))
        return sigs

    def read_metadata(self) -> dict[str, bytes]:
        fb, out = self.fb, {}
        for i in range(self.length(fb, "Metadata", "model")):
            with _where(f"metadata {i}"):
                fm = fb.Metadata(i)
                idx = fm.Buffer()
                if not 0 <= idx < len(self.buffers):
                    raise ModelFormatError(f"metadata {i}: buffer index {idx} is outside "
                                           f"0..{len(self.buffers) - 1}")
                raw = self.buffers[idx]
                out[(fm.Name() or b"").decode("utf-8", "replace")] = b"" if raw is None else raw.tobytes()
        return out


def read_model(source: bytes | bytearray | memoryview | str | os.PathLike,
               max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> Model:
    """Parse a ``.tflite`` file (path) or its bytes into a :class:`Model`.

    Raises ModelFormatError, naming the op or tensor index, for anything malformed.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ModelFormatError(f"{path}: no such model file") from None
        except IsADirectoryError:
            raise ModelFormatError(f"{path}: is a directory, not a model file") from None
        except OSError as exc:
            raise ModelFormatError(f"{path}: cannot read model file ({exc.strerror})") from None
    else:
        data = bytes(source)
    if len(data) < 8:
        raise ModelFormatError(f"model is {len(data)} bytes, too short for a TFLite flatbuffer")
    if data[4:8] != schema.FILE_IDENTIFIER:
        raise ModelFormatError(f"not a TFLite model: file identifier is {bytes(data[4:8])!r}, "
                               f"expected {schema.FILE_IDENTIFIER!r}")
    root = struct.unpack_from("<I", data, 0)[0]
    if root + 4 > len(data):
        raise ModelFormatError(f"truncated model: root table offset {root} is past the end "
                               f"of the {len(data)}-byte file")
    with _where("model"):
        return _Reader(data, max_tensor_bytes).read()
