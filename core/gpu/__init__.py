"""What the GPU backends (OpenCL, WebGPU) share: op rules and the lowering registry (support derived from it),
PHWC4 layout, the float view, fusion.

Nothing here touches a device; a backend adds kernels and a runtime on top.  The names below are imported
on first use: a GPU plugin's entry point reads only its options module, so a process that runs on the CPU
alone never loads the rules, fusion and layout modules (half a megabyte resident).
"""

from importlib import import_module

_HOMES = {
    "constant_value": "constants", "dequantize": "constants", "is_folded_dequantize": "constants",
    "Group": "fusion", "Step": "fusion", "plan_groups": "fusion",
    "as_nhwc": "layout", "from_phwc4": "layout", "phwc4_shape": "layout", "same_storage": "layout",
    "to_phwc4": "layout",
    "accepted": "registry", "lowers": "registry", "supports": "registry",
    "BINARY": "support", "FUSED_ACTIVATIONS": "support", "RULES": "support", "UNARY": "support",
    "check_op": "support",
}

__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_HOMES[name]}", __name__), name)
    globals()[name] = value
    return value
