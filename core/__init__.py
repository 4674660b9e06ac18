"""delegate: run TensorFlow Lite models across heterogeneous backends, placed by a cost model."""

from .backend import (Backend, BackendInfo, CompiledPartition, CompileOptions, Partition,
                      Support)
from .errors import (CacheError, CompileError, ConfigError, DatasetError, DelegateError, ExecutionError,
                     InputError, MeasurementError, ModelFormatError, PluginError, UnsupportedOpError)
from .ir import DType, Model, Op, Quantization, Subgraph, Tensor
from .hookspecs import hookimpl
from .tflite.reader import read_model

__version__ = "0.1.0"

__all__ = [
    "Backend", "BackendInfo", "CompiledPartition", "CompileOptions", "Partition", "Support", "hookimpl",
    "CacheError", "CompileError", "ConfigError", "DatasetError", "DelegateError", "ExecutionError", "InputError", "MeasurementError",
    "ModelFormatError",
    "PluginError", "UnsupportedOpError", "DType", "Model", "Op", "Quantization", "Subgraph", "Tensor",
    "read_model", "__version__", "load", "Session", "RunSettings", "Interpreter",
]


def __getattr__(name: str):
    """``delegate.load``, ``delegate.Session`` and ``delegate.Interpreter`` load on first use."""
    if name in ("load", "Session", "RunSettings"):
        from . import session
        return getattr(session, name)
    if name == "Interpreter":
        from .interpreter import Interpreter
        return Interpreter
    raise AttributeError(f"module 'delegate' has no attribute {name!r}")
