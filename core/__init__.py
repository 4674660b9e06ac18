"""delegate: run TensorFlow Lite models across heterogeneous backends, placed by a cost model."""

from .errors import (CacheError, CompileError, ConfigError, DelegateError, ExecutionError,
                     ModelFormatError, PluginError, UnsupportedOpError)
from .ir import DType, Model, Op, Quantization, Subgraph, Tensor
from .tflite.reader import read_model

__version__ = "0.1.0"

__all__ = [
    "CacheError", "CompileError", "ConfigError", "DelegateError", "ExecutionError", "ModelFormatError",
    "PluginError", "UnsupportedOpError", "DType", "Model", "Op", "Quantization", "Subgraph", "Tensor",
    "read_model", "__version__",
]
