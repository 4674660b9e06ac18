"""delegate: run TensorFlow Lite models across heterogeneous backends, placed by a cost model."""

from .backend import (Backend, BackendInfo, CompiledPartition, CompileOptions, Partition,
                      Support)
from .errors import (CacheError, CompileError, ConfigError, DelegateError, ExecutionError,
                     ModelFormatError, PluginError, UnsupportedOpError)
from .ir import DType, Model, Op, Quantization, Subgraph, Tensor
from .hookspecs import hookimpl
from .tflite.reader import read_model

__version__ = "0.1.0"

__all__ = [
    "Backend", "BackendInfo", "CompiledPartition", "CompileOptions", "Partition", "Support", "hookimpl",
    "CacheError", "CompileError", "ConfigError", "DelegateError", "ExecutionError", "ModelFormatError",
    "PluginError", "UnsupportedOpError", "DType", "Model", "Op", "Quantization", "Subgraph", "Tensor",
    "read_model", "__version__",
]
