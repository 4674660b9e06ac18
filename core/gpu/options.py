"""Checks on a GPU backend's options, with errors that name the backend and what is valid."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import PluginError


def check_keys(backend: str, options: Mapping[str, Any], keys: Sequence[str]) -> None:
    unknown = sorted(set(options) - set(keys))
    if unknown:
        raise PluginError(f"{backend} backend: unknown option(s) {', '.join(unknown)}; "
                          f"valid options: {', '.join(keys)}")


def choice(backend: str, options: Mapping[str, Any], key: str, default: str, allowed: Sequence[str]) -> str:
    """The option ``key`` lower-cased, which must be one of ``allowed``."""
    value = str(options.get(key, default)).lower()
    if value not in allowed:
        raise PluginError(f"{backend} backend: {key} {value!r} is not one of {', '.join(allowed)}")
    return value
