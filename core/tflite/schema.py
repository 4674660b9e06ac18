"""Bridges between the generated TFLite flatbuffer classes (the ``tflite`` package) and the IR.

Builtin options are decoded generically: every option table of the schema is
turned into a dict of snake_case fields (enums by name), and encoded back
through the generated ``<Table>Add<Field>`` functions.  So every builtin the
schema knows has typed options without a hand-written table per op.
"""

from __future__ import annotations

import importlib
import inspect
import re
from functools import lru_cache
from typing import Any

import numpy as np
import tflite
from tflite.ActivationFunctionType import ActivationFunctionType
from tflite.BuiltinOperator import BuiltinOperator
from tflite.BuiltinOptions import BuiltinOptions
from tflite.BuiltinOptions2 import BuiltinOptions2
from tflite.FullyConnectedOptionsWeightsFormat import FullyConnectedOptionsWeightsFormat
from tflite.LSTMKernelType import LSTMKernelType
from tflite.MirrorPadMode import MirrorPadMode
from tflite.Padding import Padding

FILE_IDENTIFIER = b"TFL3"


def _enum_names(cls: type) -> dict[int, str]:
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


BUILTIN_NAMES: dict[int, str] = _enum_names(BuiltinOperator)
BUILTIN_CODES: dict[str, int] = {v: k for k, v in BUILTIN_NAMES.items()}
OPTIONS_NAMES: dict[int, str] = _enum_names(BuiltinOptions)
OPTIONS_CODES: dict[str, int] = {v: k for k, v in OPTIONS_NAMES.items()}
OPTIONS2_NAMES: dict[int, str] = _enum_names(BuiltinOptions2)
OPTIONS2_CODES: dict[str, int] = {v: k for k, v in OPTIONS2_NAMES.items()}

# Option fields whose integers are schema enums; decoded to their names for readability.
ENUM_FIELDS: dict[str, dict[int, str]] = {
    "fused_activation_function": _enum_names(ActivationFunctionType),
    "padding": _enum_names(Padding),
    "mode": _enum_names(MirrorPadMode),
    "kernel_type": _enum_names(LSTMKernelType),
    "weights_format": _enum_names(FullyConnectedOptionsWeightsFormat),
}
_ENUM_CODES = {field: {v: k for k, v in names.items()} for field, names in ENUM_FIELDS.items()}

_SKIP_METHODS = {"Init", "GetRootAs"}


def snake(name: str) -> str:
    """``DilationWFactor`` -> ``dilation_w_factor`` (the schema's own field spelling)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


@lru_cache(maxsize=None)
def options_class(table_name: str):
    """The generated module and class for an option table such as ``Conv2DOptions``."""
    module = importlib.import_module(f"tflite.{table_name}")
    return module, getattr(module, table_name)


@lru_cache(maxsize=None)
def option_fields(table_name: str) -> tuple[tuple[str, bool], ...]:
    """(CamelName, is_vector) for each scalar or vector field of an option table, in schema order."""
    module, cls = options_class(table_name)
    fields = []
    for name, fn in vars(cls).items():
        if (name.startswith("_") or name in _SKIP_METHODS or name.startswith("GetRootAs")
                or name.endswith(("BufferHasIdentifier", "AsNumpy", "Length", "IsNone"))
                or not callable(fn)):
            continue
        params = list(inspect.signature(fn).parameters)
        is_vector = params == ["self", "j"]
        if params != ["self"] and not is_vector:
            continue
        # Nested tables and unions (StableHLO only) are not scalar fields; skip them.
        if not hasattr(module, f"{table_name}Add{name}") and not hasattr(module, f"Add{name}"):
            continue
        if is_vector and not hasattr(cls, f"{name}AsNumpy"):
            continue
        fields.append((name, is_vector))
    return tuple(fields)


def decode_options(table_name: str, table) -> dict[str, Any]:
    """Read an option table (a flatbuffers ``Table``) into a snake_case dict."""
    _, cls = options_class(table_name)
    obj = cls()
    obj.Init(table.Bytes, table.Pos)
    out: dict[str, Any] = {}
    for name, is_vector in option_fields(table_name):
        key = snake(name)
        if is_vector:
            arr = getattr(obj, f"{name}AsNumpy")()
            value: Any = [] if isinstance(arr, int) else arr.tolist()
        else:
            value = getattr(obj, name)()
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            elif key in ENUM_FIELDS and isinstance(value, int):
                value = ENUM_FIELDS[key].get(value, value)
        out[key] = value
    return out


@lru_cache(maxsize=None)
def _absent_options(table_name: str) -> tuple[tuple[str, Any], ...]:
    import flatbuffers

    builder = flatbuffers.Builder(64)
    builder.Finish(encode_options(builder, table_name, {}))
    data = bytes(builder.Output())
    defaults = decode_options(table_name, flatbuffers.table.Table(data, int.from_bytes(data[:4], "little")))

    def zero(key: str, value: Any) -> Any:
        if key in ENUM_FIELDS:
            return ENUM_FIELDS[key].get(0, 0)
        return [] if isinstance(value, list) else "" if isinstance(value, str) else type(value)(0)
    return tuple((key, zero(key, value)) for key, value in defaults.items())


def absent_options(table_name: str) -> dict[str, Any]:
    """The options an op has when its table is absent (or another op's): LiteRT parses none and
    leaves its parameters zero (SOFTMAX's beta 0, not 1), so every field is zero here too."""
    return dict(_absent_options(table_name))


def encode_options(builder, table_name: str, options: dict[str, Any]) -> int:
    """Write a snake_case options dict as an option table; returns its offset."""
    module, _ = options_class(table_name)
    fields = dict(option_fields(table_name))
    vectors = {}
    for key, value in options.items():
        name = camel(key)
        if fields.get(name):
            values = [int(v) for v in value]
            getattr(module, f"{table_name}Start{name}Vector")(builder, len(values))
            for v in reversed(values):
                builder.PrependInt32(v)
            vectors[name] = builder.EndVector()
        elif isinstance(value, str) and key not in _ENUM_CODES:  # a string field (VarHandle's names)
            vectors[name] = builder.CreateString(value)
    getattr(module, f"{table_name}Start")(builder)
    for key, value in options.items():
        name = camel(key)
        if name not in fields:
            raise KeyError(f"{table_name} has no field {key!r}")
        add = getattr(module, f"{table_name}Add{name}")
        if name in vectors:
            add(builder, vectors[name])
            continue
        if key in _ENUM_CODES and isinstance(value, str):
            value = _ENUM_CODES[key][value]
        if isinstance(value, (np.generic,)):
            value = value.item()
        add(builder, value)
    return getattr(module, f"{table_name}End")(builder)


# Builtin ops and the option table each one uses (from the schema's conventions); ops not listed
# take no options.  Used by the builder to pick the table for an op.
_DEFAULT_TABLE_OVERRIDES = {
    "AVERAGE_POOL_2D": "Pool2DOptions", "MAX_POOL_2D": "Pool2DOptions", "L2_POOL_2D": "Pool2DOptions",
    "CONV_2D": "Conv2DOptions", "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
    "MEAN": "ReducerOptions", "SUM": "ReducerOptions", "REDUCE_MAX": "ReducerOptions",
    "REDUCE_MIN": "ReducerOptions", "REDUCE_PROD": "ReducerOptions", "REDUCE_ANY": "ReducerOptions",
    "REDUCE_ALL": "ReducerOptions",
    "MAXIMUM": "MaximumMinimumOptions", "MINIMUM": "MaximumMinimumOptions",
    "LSTM": "LSTMOptions", "UNIDIRECTIONAL_SEQUENCE_LSTM": "UnidirectionalSequenceLSTMOptions",
    "L2_NORMALIZATION": "L2NormOptions", "LOCAL_RESPONSE_NORMALIZATION": "LocalResponseNormalizationOptions",
    "RESIZE_BILINEAR": "ResizeBilinearOptions", "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions",
    "SELECT_V2": "SelectV2Options", "SPLIT_V": "SplitVOptions", "TOPK_V2": "TopKV2Options",
    "EMBEDDING_LOOKUP_SPARSE": "EmbeddingLookupSparseOptions", "BATCH_MATMUL": "BatchMatMulOptions",
    "PADV2": "PadV2Options", "LOG_SOFTMAX": "LogSoftmaxOptions", "NOT_EQUAL": "NotEqualOptions",
    "FLOOR_DIV": "FloorDivOptions", "FLOOR_MOD": "FloorModOptions", "SQUARED_DIFFERENCE": "SquaredDifferenceOptions",
    "GATHER_ND": "GatherNdOptions", "SPACE_TO_BATCH_ND": "SpaceToBatchNDOptions",
    "BATCH_TO_SPACE_ND": "BatchToSpaceNDOptions", "CUMSUM": "CumsumOptions", "HARD_SWISH": "HardSwishOptions",
    "DEPTH_TO_SPACE": "DepthToSpaceOptions", "SPACE_TO_DEPTH": "SpaceToDepthOptions",
}


def options_table_for(opcode: str) -> str | None:
    """The option table a builtin op carries, or None when it takes none."""
    if opcode in _DEFAULT_TABLE_OVERRIDES:
        return _DEFAULT_TABLE_OVERRIDES[opcode]
    guess = camel(opcode.lower()) + "Options"
    return guess if guess in OPTIONS_CODES else None


def generated_module(name: str):
    return importlib.import_module(f"tflite.{name}")


__all__ = [
    "FILE_IDENTIFIER", "BUILTIN_NAMES", "BUILTIN_CODES", "OPTIONS_NAMES", "OPTIONS_CODES",
    "OPTIONS2_NAMES", "OPTIONS2_CODES", "decode_options", "encode_options", "options_table_for",
    "snake", "camel", "tflite",
]
