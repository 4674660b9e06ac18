"""Which ops each GPU dialect lowers: support is derived from the lowering handlers registered here.

Each GPU plugin registers the handlers of its lowering under its dialect's name
(``@lowers("opencl", "CONV_2D")``), with a constraint of its own where its
kernel covers less than the kit's rule.  A backend supports an op exactly when
its dialect has a handler for the op, the op passes the kit's rule for it
(:func:`delegate.gpu.support.check_op`: versions, tensors, the op's own
constraint) and the handler's constraint passes; a refusal carries the reason of
the check that failed.  DEQUANTIZE and DENSIFY of a constant are lowered by the kit itself
(folded at compile time, :mod:`delegate.gpu.constants`), so every dialect has it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..backend import CompileOptions, Support
from ..ir import Op
from .constants import is_folded_dequantize
from .support import CUSTOM_RULES, RULES, Check, check_op, rule_for

KIT_LOWERED = frozenset({"DEQUANTIZE", "DENSIFY"})  # of constants: folded at compile time


@dataclass(frozen=True)
class Handler:
    """A dialect's lowering of one op: the function building its kernels, and what it does not cover."""

    lower: Callable[..., None]
    check: Check | None = None


_HANDLERS: dict[str, dict[str, Handler]] = {}


def lowers(dialect: str, *codes: str, check: Check | None = None):
    """Register the decorated function as ``dialect``'s lowering of ``codes`` (op codes the kit has rules for)."""
    def register(fn: Callable[..., None]) -> Callable[..., None]:
        table = _HANDLERS.setdefault(dialect, {})
        for code in codes:
            if code not in RULES and code not in CUSTOM_RULES:
                raise ValueError(f"{dialect}: {code} has no rule in delegate.gpu.support")
            if code in table:
                raise ValueError(f"{dialect}: {code} is lowered twice")
            table[code] = Handler(fn, check)
        return fn
    return register


def handler(dialect: str, op: Op) -> Handler | None:
    """``dialect``'s handler for ``op`` (custom ops only by their custom rule's name), or None."""
    if rule_for(op) is None:
        return None
    return _HANDLERS.get(dialect, {}).get(op.opcode)


def accepted(dialect: str) -> frozenset[str]:
    """The op codes ``dialect`` lowers (the kit's own included)."""
    return frozenset(_HANDLERS.get(dialect, {})) | KIT_LOWERED


def supports(dialect: str, op: Op, options: CompileOptions) -> Support:
    """Whether ``dialect`` runs ``op``, and why not: the first failing check of the rule, then the handler."""
    found = handler(dialect, op)
    if found is None and rule_for(op) is not None and not is_folded_dequantize(op):
        return Support.no(f"{op.opcode} has no kernel in the {dialect} lowering")
    answer = check_op(op, options)
    if not answer or found is None or found.check is None:
        return answer
    reason = found.check(op)
    return Support.no(reason) if reason else answer
