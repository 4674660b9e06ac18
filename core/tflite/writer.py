"""IR -> TFLite flatbuffer.

Produces files the real LiteRT interpreter loads: tests build single- and
multi-op models through this writer, and CPU partitions can be exported with
it.  ``external_buffers=True`` stores constant data after the flatbuffer
(offset buffers), the layout converters use for models above 2 GiB.
"""

from __future__ import annotations

import os
from pathlib import Path

import flatbuffers
import numpy as np
from ..ir import Model as IRModel
from ..ir import Sparsity, Subgraph
from . import schema

# The generated modules (not the classes the ``tflite`` package re-exports) hold the builder functions.
(Buffer, DimensionMetadata, Int32Vector, Metadata, Model, Operator, OperatorCode, QuantizationParameters,
 SignatureDef, SparsityParameters, SubGraph, Tensor, TensorMap, Uint8Vector, Uint16Vector) = (
    schema.generated_module(name) for name in (
        "Buffer", "DimensionMetadata", "Int32Vector", "Metadata", "Model", "Operator", "OperatorCode",
        "QuantizationParameters", "SignatureDef", "SparsityParameters", "SubGraph", "Tensor", "TensorMap",
        "Uint8Vector", "Uint16Vector"))

_DATA_ALIGNMENT = 16
_PLACEHOLDER = 0x5EED_0FF5_0000_0000  # external-buffer offsets before patching; low bits = buffer index
_INDEX_VECTORS = {np.dtype(np.int32): (1, Int32Vector, "Int32Vector"),
                  np.dtype(np.uint16): (2, Uint16Vector, "Uint16Vector"),
                  np.dtype(np.uint8): (3, Uint8Vector, "Uint8Vector")}


def _ints(builder: flatbuffers.Builder, values, dtype=np.int32) -> int:
    return builder.CreateNumpyVector(np.asarray(list(values), dtype=dtype))


def _aligned_bytes(builder: flatbuffers.Builder, payload: bytes) -> int:
    """A ubyte vector whose data start is 16-byte aligned, as TFLite's schema asks for buffers."""
    builder.StartVector(1, len(payload), _DATA_ALIGNMENT)
    builder.head -= len(payload)
    builder.Bytes[builder.head:builder.head + len(payload)] = payload
    builder.vectorNumElems = len(payload)
    return builder.EndVector()


class _Writer:
    def __init__(self, model: IRModel, external_buffers: bool):
        self.model = model
        self.external = external_buffers
        self.b = flatbuffers.Builder(1 << 16)
        self.payloads: list[bytes] = [b""]  # buffer 0 is the empty buffer by convention
        self.buffer_of: dict[int, int] = {}
        self.opcodes: dict[tuple[str, bool, int], int] = {}

    def buffer_for(self, data: np.ndarray) -> int:
        key = id(data)
        if key not in self.buffer_of:
            self.buffer_of[key] = len(self.payloads)
            self.payloads.append(np.ascontiguousarray(data).tobytes())
        return self.buffer_of[key]

    def opcode_index(self, opcode: str, custom: bool, version: int) -> int:
        key = (opcode, custom, version)
        if key not in self.opcodes:
            self.opcodes[key] = len(self.opcodes)
        return self.opcodes[key]

    def quantization(self, q) -> int:
        b = self.b
        scale = b.CreateNumpyVector(np.asarray(q.scale, np.float32).ravel())
        zp = b.CreateNumpyVector(np.asarray(q.zero_point, np.int64).ravel())
        mn = b.CreateNumpyVector(np.asarray(q.min, np.float32).ravel()) if q.min is not None else None
        mx = b.CreateNumpyVector(np.asarray(q.max, np.float32).ravel()) if q.max is not None else None
        QuantizationParameters.Start(b)
        QuantizationParameters.AddScale(b, scale)
        QuantizationParameters.AddZeroPoint(b, zp)
        if mn is not None:
            QuantizationParameters.AddMin(b, mn)
        if mx is not None:
            QuantizationParameters.AddMax(b, mx)
        QuantizationParameters.AddQuantizedDimension(b, int(q.axis))
        return QuantizationParameters.End(b)

    def index_vector(self, arr: np.ndarray | None) -> tuple[int, int]:
        if arr is None:
            return 0, 0
        arr = np.asarray(arr)
        kind, module, name = _INDEX_VECTORS.get(arr.dtype, _INDEX_VECTORS[np.dtype(np.int32)])
        values = self.b.CreateNumpyVector(arr.astype(arr.dtype if arr.dtype in _INDEX_VECTORS else np.int32))
        getattr(module, f"{name}Start")(self.b)
        getattr(module, f"{name}AddValues")(self.b, values)
        return kind, getattr(module, f"{name}End")(self.b)

    def sparsity(self, s: Sparsity) -> int:
        b = self.b
        dims = []
        for d in s.dim_metadata:
            seg_type, seg = self.index_vector(d.array_segments)
            idx_type, idx = self.index_vector(d.array_indices)
            DimensionMetadata.Start(b)
            DimensionMetadata.AddFormat(b, 0 if d.format == "DENSE" else 1)
            DimensionMetadata.AddDenseSize(b, int(d.dense_size))
            if seg:
                DimensionMetadata.AddArraySegmentsType(b, seg_type)
                DimensionMetadata.AddArraySegments(b, seg)
            if idx:
                DimensionMetadata.AddArrayIndicesType(b, idx_type)
                DimensionMetadata.AddArrayIndices(b, idx)
            dims.append(DimensionMetadata.End(b))
        order = _ints(b, s.traversal_order)
        block = _ints(b, s.block_map)
        SparsityParameters.StartDimMetadataVector(b, len(dims))
        for d in reversed(dims):
            b.PrependUOffsetTRelative(d)
        dim_vec = b.EndVector()
        SparsityParameters.Start(b)
        SparsityParameters.AddTraversalOrder(b, order)
        SparsityParameters.AddBlockMap(b, block)
        SparsityParameters.AddDimMetadata(b, dim_vec)
        return SparsityParameters.End(b)

    def tensor(self, t) -> int:
        b = self.b
        name = b.CreateString(t.name)
        shape = _ints(b, t.shape)
        sig = _ints(b, t.shape_signature) if t.shape_signature is not None else None
        quant = self.quantization(t.quantization) if t.quantization is not None else None
        sparsity = self.sparsity(t.sparsity) if t.sparsity is not None else None
        buffer = self.buffer_for(t.data) if t.data is not None else 0
        Tensor.Start(b)
        Tensor.AddShape(b, shape)
        Tensor.AddType(b, t.dtype.value)
        Tensor.AddBuffer(b, buffer)
        Tensor.AddName(b, name)
        if quant is not None:
            Tensor.AddQuantization(b, quant)
        if t.is_variable:
            Tensor.AddIsVariable(b, True)
        if sparsity is not None:
            Tensor.AddSparsity(b, sparsity)
        if sig is not None:
            Tensor.AddShapeSignature(b, sig)
        if t.has_rank:
            Tensor.AddHasRank(b, True)
        return Tensor.End(b)

    def operator(self, op, position: dict[int, int]) -> int:
        b = self.b
        inputs = _ints(b, [-1 if t is None else position[id(t)] for t in op.inputs])
        outputs = _ints(b, [position[id(t)] for t in op.outputs])
        intermediates = _ints(b, [position[id(t)] for t in op.intermediates]) if op.intermediates else None
        options_type = op.options_type or (None if op.custom else schema.options_table_for(op.opcode))
        options = None
        if options_type is not None and (op.options or op.options_type):
            options = schema.encode_options(b, options_type, op.options)
        custom = b.CreateNumpyVector(np.frombuffer(op.custom_options, np.uint8)) if op.custom_options else None
        Operator.Start(b)
        Operator.AddOpcodeIndex(b, self.opcode_index(op.opcode, op.custom, op.version))
        Operator.AddInputs(b, inputs)
        Operator.AddOutputs(b, outputs)
        if options is not None:
            if options_type in schema.OPTIONS_CODES:
                Operator.AddBuiltinOptionsType(b, schema.OPTIONS_CODES[options_type])
                Operator.AddBuiltinOptions(b, options)
            else:
                Operator.AddBuiltinOptions2Type(b, schema.OPTIONS2_CODES[options_type])
                Operator.AddBuiltinOptions2(b, options)
        if custom is not None:
            Operator.AddCustomOptions(b, custom)
        if intermediates is not None:
            Operator.AddIntermediates(b, intermediates)
        return Operator.End(b)

    def subgraph(self, sg: Subgraph) -> int:
        b = self.b
        position = {id(t): i for i, t in enumerate(sg.tensors)}
        tensors = [self.tensor(t) for t in sg.tensors]
        ops = [self.operator(op, position) for op in sg.ops]
        name = b.CreateString(sg.name)
        inputs = _ints(b, [position[id(t)] for t in sg.inputs])
        outputs = _ints(b, [position[id(t)] for t in sg.outputs])
        tensor_vec = self.offsets(SubGraph.StartTensorsVector, tensors)
        op_vec = self.offsets(SubGraph.StartOperatorsVector, ops)
        SubGraph.Start(b)
        SubGraph.AddTensors(b, tensor_vec)
        SubGraph.AddInputs(b, inputs)
        SubGraph.AddOutputs(b, outputs)
        SubGraph.AddOperators(b, op_vec)
        SubGraph.AddName(b, name)
        return SubGraph.End(b)

    def offsets(self, start, items: list[int]) -> int:
        start(self.b, len(items))
        for item in reversed(items):
            self.b.PrependUOffsetTRelative(item)
        return self.b.EndVector()

    def named_indices(self, table, add_index, entries: dict[str, int]) -> list[int]:
        """One ``table`` (TensorMap, Metadata: a name and an index) per entry."""
        b, written = self.b, []
        for name, index in entries.items():
            s = b.CreateString(name)
            table.Start(b)
            table.AddName(b, s)
            add_index(b, index)
            written.append(table.End(b))
        return written

    def signature(self, sig) -> int:
        b = self.b

        def tensor_maps(mapping: dict[str, int]) -> int:
            maps = self.named_indices(TensorMap, TensorMap.AddTensorIndex, mapping)
            return self.offsets(SignatureDef.StartInputsVector, maps)

        inputs, outputs = tensor_maps(sig.inputs), tensor_maps(sig.outputs)
        key = b.CreateString(sig.key)
        SignatureDef.Start(b)
        SignatureDef.AddInputs(b, inputs)
        SignatureDef.AddOutputs(b, outputs)
        SignatureDef.AddSignatureKey(b, key)
        SignatureDef.AddSubgraphIndex(b, sig.subgraph_index)
        return SignatureDef.End(b)

    def write(self) -> bytes:
        b, model = self.b, self.model
        subgraphs = [self.subgraph(sg) for sg in model.subgraphs]
        metadata_buffers = {}
        for name, payload in model.metadata.items():
            metadata_buffers[name] = len(self.payloads)
            self.payloads.append(bytes(payload))
        signatures = [self.signature(s) for s in model.signatures]
        metadata = self.named_indices(Metadata, Metadata.AddBuffer, metadata_buffers)
        codes = []
        for (opcode, custom, version) in self.opcodes:
            code = schema.BUILTIN_CODES["CUSTOM"] if custom else schema.BUILTIN_CODES[opcode]
            custom_name = b.CreateString(opcode) if custom else None
            OperatorCode.Start(b)
            OperatorCode.AddDeprecatedBuiltinCode(b, min(code, 127))
            if custom_name is not None:
                OperatorCode.AddCustomCode(b, custom_name)
            OperatorCode.AddVersion(b, version)
            OperatorCode.AddBuiltinCode(b, code)
            codes.append(OperatorCode.End(b))
        # With external buffers the payload offsets are only known after the flatbuffer is
        # finished; write placeholders of fixed width (uint64) and patch them afterwards.
        buffers = []
        for index, payload in enumerate(self.payloads):
            data = _aligned_bytes(b, payload) if payload and not self.external else None
            Buffer.Start(b)
            if data is not None:
                Buffer.AddData(b, data)
            elif payload and self.external:
                Buffer.AddOffset(b, _PLACEHOLDER | index)
                Buffer.AddSize(b, len(payload))
            buffers.append(Buffer.End(b))
        description = b.CreateString(model.description or "delegate")
        code_vec = self.offsets(Model.StartOperatorCodesVector, codes)
        sub_vec = self.offsets(Model.StartSubgraphsVector, subgraphs)
        buf_vec = self.offsets(Model.StartBuffersVector, buffers)
        meta_vec = self.offsets(Model.StartMetadataVector, metadata) if metadata else None
        sig_vec = self.offsets(Model.StartSignatureDefsVector, signatures) if signatures else None
        Model.Start(b)
        Model.AddVersion(b, model.version or 3)
        Model.AddOperatorCodes(b, code_vec)
        Model.AddSubgraphs(b, sub_vec)
        Model.AddDescription(b, description)
        Model.AddBuffers(b, buf_vec)
        if meta_vec is not None:
            Model.AddMetadata(b, meta_vec)
        if sig_vec is not None:
            Model.AddSignatureDefs(b, sig_vec)
        b.Finish(Model.End(b), file_identifier=schema.FILE_IDENTIFIER)
        out = bytes(b.Output())
        return self.append_external(out) if self.external else out

    def append_external(self, flat: bytes) -> bytes:
        """Append payloads after the flatbuffer and patch each Buffer's offset placeholder."""
        blob = bytearray(flat)
        for index, payload in enumerate(self.payloads):
            if not payload:
                continue
            blob.extend(b"\0" * (-len(blob) % _DATA_ALIGNMENT))
            offset = len(blob)
            blob.extend(payload)
            pos = flat.find((_PLACEHOLDER | index).to_bytes(8, "little"))
            blob[pos:pos + 8] = offset.to_bytes(8, "little")
        return bytes(blob)


def write_model(model: IRModel, path: str | os.PathLike | None = None, *, external_buffers: bool = False) -> bytes:
    """Serialise ``model``; also writes it to ``path`` when given.  Returns the bytes."""
    data = _Writer(model, external_buffers).write()
    if path is not None:
        Path(path).write_bytes(data)
    return data
