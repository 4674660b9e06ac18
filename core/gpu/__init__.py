"""What the GPU backends (OpenCL, WebGPU) share: op rules and the lowering registry (support derived from it),
PHWC4 layout, the float view, fusion.

Nothing here touches a device; a backend adds kernels and a runtime on top.
"""

from .constants import constant_value, dequantize, is_folded_dequantize
from .fusion import Group, Step, plan_groups
from .layout import as_nhwc, from_phwc4, phwc4_shape, same_storage, to_phwc4
from .registry import accepted, lowers, supports
from .support import BINARY, FUSED_ACTIVATIONS, RULES, UNARY, check_op

__all__ = ["constant_value", "dequantize", "is_folded_dequantize", "Group", "Step", "plan_groups", "as_nhwc",
           "from_phwc4", "phwc4_shape", "same_storage", "to_phwc4", "BINARY", "FUSED_ACTIVATIONS", "RULES",
           "UNARY", "check_op", "accepted", "lowers", "supports"]
