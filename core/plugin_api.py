"""The one surface a backend plugin imports, first-party plugins included.

Everything a plugin needs from delegate is named here: the backend contract and hook marker,
the IR it reads, the errors it raises, and the helpers the first-party plugins share (shape
rules, arena planning, the kernel cache, C libraries built and cached, partition export).  A
name not listed here is delegate's own and may change without notice; ``tests/test_plugins.py``
fails when a plugin module imports anything else of delegate.

One sub-surface: the GPU kit, ``delegate.gpu`` and its modules (layout, lowering registry,
fusion, dialect tables), is imported directly by GPU plugins.  It is not re-exported here
because it is the shared lowering itself, not a set of helpers: a GPU plugin is built on it.
"""

from __future__ import annotations

from .backend import (ACCELERATOR, API_VERSION, HOST, ROLES, Backend, BackendInfo, CompiledPartition,
                      CompileOptions, DeviceValue, Partition, Support)
from .cache import CacheWarning, EntryStore, cache_key, ops_fingerprint
from .config import available_cores
from .cost import DeviceProfile, cost_class, host_profile, op_bytes, op_flops, op_steps
from .errors import (CacheError, CompileError, ConfigError, DelegateError, ExecutionError, InputError,
                     PluginError, UnsupportedOpError)
from .export import partition_model
from .hookspecs import hookimpl
from .ir import STATE_OPS, DType, Model, Op, Quantization, Sparsity, Subgraph, Tensor
from .memory import aligned_zeros, plan_arena
from .native import NativeBuild, load_library
from .partition import make_partition
from .passes import (CLAMPS, Group, channel_slope, constant, dequantize_array, find_groups, folded_into,
                     is_quantized_op, known_at_compile_time)
from .runtime import ModelState, active_state
from .shapes import (detection_postprocess_options, max_unpooling_geometry, mediapipe_pool_params,
                     pool_argmax_geometry, static_op, static_value, transpose_conv_bias_geometry)
from .stdio import native_stderr
from .strided import strided_slice_plan
from .tflite.writer import write_model

GPU_KIT = "delegate.gpu"  # the sub-surface GPU plugins import directly (see the module docstring)

__all__ = [
    # the backend contract
    "API_VERSION", "HOST", "ACCELERATOR", "ROLES", "Backend", "BackendInfo", "CompiledPartition",
    "CompileOptions", "DeviceProfile", "DeviceValue", "Partition", "Support", "hookimpl",
    # errors
    "CacheError", "CompileError", "ConfigError", "DelegateError", "ExecutionError", "InputError", "PluginError",
    "UnsupportedOpError",
    # the IR a plugin reads
    "DType", "Model", "Op", "Quantization", "Sparsity", "Subgraph", "Tensor", "STATE_OPS",
    # helpers the first-party plugins share
    "CacheWarning", "EntryStore", "cache_key", "make_partition", "ops_fingerprint", "partition_model", "plan_arena",
    "ModelState",
    "aligned_zeros",
    "active_state", "detection_postprocess_options", "transpose_conv_bias_geometry", "mediapipe_pool_params",
    "pool_argmax_geometry", "max_unpooling_geometry", "native_stderr",
    "strided_slice_plan", "write_model", "available_cores", "GPU_KIT", "NativeBuild", "load_library",
    # the shared graph passes: compile-time constants and fusion groups (delegate.passes)
    "CLAMPS", "Group", "channel_slope", "constant", "dequantize_array", "find_groups", "folded_into",
    "is_quantized_op", "known_at_compile_time",
    # shape arithmetic on static shapes, computed at compile time (delegate.shapes)
    "static_op", "static_value",
    # the cost model, for a backend's own estimate_ms: an op's work and class, the host's profile at n threads
    "cost_class", "host_profile", "op_bytes", "op_flops", "op_steps",
]
