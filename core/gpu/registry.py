"""Which ops each GPU dialect lowers: support is derived from the lowering handlers registered here.

The kit's own lowering (:mod:`delegate.gpu.lowering`) registers one handler per op family for every
dialect (``@lowers_shared("ADD", templates=("elementwise",))``), naming the kernel templates it
launches; a dialect declares the templates it has (:func:`declare_templates`), and lacking one
refuses the op with that reason.  A dialect may add ops the kit has no handler for with a handler of
its own, registered under its dialect's name (``@lowers("probe", "RELU")``), with a constraint of its
own where its kernel covers less than the kit's rule.  A backend supports an op exactly when
its dialect has a handler for the op, the op passes the kit's rule for it
(:func:`delegate.gpu.support.check_op`: versions, tensors, the op's own
constraint) and the handler's constraint passes; a refusal carries the reason of
the check that failed.  DEQUANTIZE and DENSIFY of a constant are lowered by the kit itself
(folded at compile time, :mod:`delegate.gpu.constants`), so every dialect has it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Callable, Iterable

from ..backend import CompileOptions, Support
from ..ir import Op
from .constants import is_folded_dequantize
from .support import CUSTOM_RULES, RULES, Check, check_op, computed_at_compile_time, rule_for

KIT_LOWERED = frozenset({"DEQUANTIZE", "DENSIFY"})  # of constants: folded at compile time


@dataclass(frozen=True)
class Handler:
    """A dialect's lowering of one op: the function building its kernels, and what it does not cover."""

    lower: Callable[..., None]
    check: Check | None = None
    templates: tuple[str, ...] = ()  # a shared handler's kernel templates, which its dialect must have


_HANDLERS: dict[str, dict[str, Handler]] = {}  # a plugin's own handlers, by dialect
_SHARED: dict[str, Handler] = {}  # the kit's handlers, for every dialect with their templates
_TEMPLATES: dict[str, frozenset[str]] = {}  # the kernel templates each dialect has


def _register(table: dict[str, Handler], owner: str, codes: Iterable[str], made: Handler) -> None:
    for code in codes:
        if code not in RULES and code not in CUSTOM_RULES:
            raise ValueError(f"{owner}: {code} has no rule in delegate.gpu.support")
        if code in table or (owner != "kit" and owner in _TEMPLATES and code in _SHARED):
            raise ValueError(f"{owner}: {code} is lowered twice")
        table[code] = made


def lowers(dialect: str, *codes: str, check: Check | None = None):
    """Register the decorated function as ``dialect``'s own lowering of ``codes`` (op codes the kit has rules for)."""
    def register(fn: Callable[..., None]) -> Callable[..., None]:
        _register(_HANDLERS.setdefault(dialect, {}), dialect, codes, Handler(fn, check))
        return fn
    return register


def lowers_shared(*codes: str, templates: tuple[str, ...], check: Check | None = None):
    """Register the decorated function as the kit's lowering of ``codes`` for every dialect, launching ``templates``."""
    def register(fn: Callable[..., None]) -> Callable[..., None]:
        _register(_SHARED, "kit", codes, Handler(fn, check, tuple(templates)))
        return fn
    return register


def declare_templates(dialect: str, names: Iterable[str]) -> None:
    """``dialect`` has the kernel templates ``names``: the kit's handlers lower for it from now on."""
    _TEMPLATES[dialect] = frozenset(names)
    twice = sorted(set(_HANDLERS.get(dialect, {})) & set(_shared()))
    if twice:
        raise ValueError(f"{dialect}: {', '.join(twice)} lowered twice (the kit lowers them)")


def _shared() -> dict[str, Handler]:
    import_module(".lowering", __package__)  # registers the kit's handlers
    return _SHARED


def _lacking(dialect: str, found: Handler) -> list[str]:
    return sorted(set(found.templates) - _TEMPLATES[dialect])


def handler(dialect: str, op: Op) -> Handler | None:
    """``dialect``'s handler for ``op`` (custom ops only by their custom rule's name), or None."""
    if rule_for(op) is None:
        return None
    shared = _shared().get(op.opcode) if dialect in _TEMPLATES else None
    if shared is not None:
        return None if _lacking(dialect, shared) else shared
    return _HANDLERS.get(dialect, {}).get(op.opcode)


def accepted(dialect: str) -> frozenset[str]:
    """The op codes ``dialect`` lowers (the kit's own included)."""
    shared = {code for code, found in _shared().items() if dialect in _TEMPLATES and not _lacking(dialect, found)}
    return frozenset(_HANDLERS.get(dialect, {})) | shared | KIT_LOWERED


def supports(dialect: str, op: Op, options: CompileOptions) -> Support:
    """Whether ``dialect`` runs ``op``, and why not: the first failing check of the rule, then the handler."""
    if computed_at_compile_time(op):
        return Support.yes()
    found = handler(dialect, op)
    if found is None and rule_for(op) is not None and not is_folded_dequantize(op):
        shared = _shared().get(op.opcode) if dialect in _TEMPLATES else None
        if shared is not None:
            return Support.no(f"{op.opcode} needs the {', '.join(_lacking(dialect, shared))} kernel template, "
                              f"which the {dialect} dialect lacks")
        return Support.no(f"{op.opcode} has no kernel in the {dialect} lowering")
    answer = check_op(op, options)
    if not answer or found is None or found.check is None:
        return answer
    reason = found.check(op)
    return Support.no(reason) if reason else answer
