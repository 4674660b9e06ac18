"""The JSON Schema (Draft 2020-12) of the YAML configuration.

Kept apart from the loader so the set of keys reads in one place; docs/config.md
describes every key here, and a test checks that it does.  Sections have no
required keys because a config is always layered over the packaged defaults.
``errorMessage`` (the ajv-errors convention) words a ``oneOf`` failure for people.
Backend options are not listed here: each plugin declares its own (``BackendInfo.options``)
and ``installed_schema`` merges them in.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any, Mapping

PRECISIONS = ("fp32", "fp16")
PREFERENCES = ("fast_single_answer", "sustained_speed")
PARTITIONERS = ("cost", "greedy")
SEARCHES = ("auto", "estimate", "measure")
CONCURRENCY = ("sequential", "parallel")
EXECUTORS = ("in-process", "ray")
COLORS = ("RGB", "BGR")
LAYOUTS = ("NHWC",)

NAME: dict[str, Any] = {"type": "string", "minLength": 1}
NUMBER: dict[str, Any] = {"type": "number"}
THRESHOLD: dict[str, Any] = {"type": ["number", "null"], "minimum": 0}
OPTIONAL_TEXT: dict[str, Any] = {"type": ["string", "null"], "minLength": 1}
POSITIVE: dict[str, Any] = {"type": ["number", "null"], "exclusiveMinimum": 0}
# Most CPU threads a run may ask for: more than the machine has only queues them (512 made 513 threads).
MAX_THREADS = max(16, 4 * (os.cpu_count() or 1))


def enum(*choices: str) -> dict[str, Any]:
    return {"enum": list(choices)}


def section(**properties: Any) -> dict[str, Any]:
    """A mapping whose keys are all optional and known."""
    return {"type": "object", "additionalProperties": False, "properties": properties}


def per_channel(**bound: Any) -> dict[str, Any]:
    """One number for every channel, a list with one per channel, or null (not applied)."""
    return {"type": ["number", "array", "null"], **bound, "minItems": 1, "items": {"type": "number", **bound}}


def rule(backend_required: bool) -> dict[str, Any]:
    """A pin/deny rule: exactly one selector (op, index or tensor) and a backend."""
    return {
        **section(op=NAME, index={"type": "integer", "minimum": 0}, tensor=NAME, backend=NAME),
        "required": ["backend"] if backend_required else [],
        "oneOf": [{"required": ["op"]}, {"required": ["index"]}, {"required": ["tensor"]}],
        "errorMessage": "a rule needs exactly one of op, index or tensor",
    }


def options_section(options: Mapping[str, Any]) -> dict[str, Any]:
    """A backend's options as its plugin declares them: checked key by key when it declares any, else open."""
    return section(**options) if options else {"type": "object"}


def backends_schema(options: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``backends`` list; ``options``: per backend name, the options its plugin declares."""
    entry = {
        # string keywords apply to a bare name, object keywords to {name, options}
        "type": ["string", "object"],
        "minLength": 1,
        "additionalProperties": False,
        "required": ["name"],
        "properties": {"name": NAME, "options": {"type": "object"}},
        "allOf": [{"if": {"type": "object", "properties": {"name": {"const": name}}},
                   "then": {"properties": {"options": options_section(declared)}}}
                  for name, declared in options.items() if declared],
    }
    return {"type": "array", "minItems": 1, "items": entry}


MODEL_SETTINGS: dict[str, Any] = {
    "backends": backends_schema({}),
    "precision": enum(*PRECISIONS),
    "allow_quantized": {"type": "boolean"},
    "inference_preference": enum(*PREFERENCES),
    "partitioner": enum(*PARTITIONERS),
    "placement": section(search=enum(*SEARCHES), budget_s={"type": "number", "exclusiveMinimum": 0,
                                                           "maximum": 3600}, host_first={"type": "boolean"}),
    "max_delegated_partitions": {"type": "integer", "minimum": 0},
    "min_nodes_per_partition": {"type": "integer", "minimum": 1},
    "pin": {"type": "array", "items": rule(backend_required=True)},
    "deny": {"type": "array", "items": rule(backend_required=False)},
    "serialization": section(dir=OPTIONAL_TEXT, model_token=OPTIONAL_TEXT),
    "accuracy_guard": section(enabled={"type": "boolean"}, max_abs_error=THRESHOLD, max_rel_error=THRESHOLD),
    "cpu": {"type": "object"},  # the host backend's options (``build``)
    "input": section(
        mean=per_channel(), std=per_channel(exclusiveMinimum=0),
        range={"type": "array", "minItems": 2, "maxItems": 2, "items": NUMBER},
        color=enum(*COLORS), layout=enum(*LAYOUTS)),
    "num_threads": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_THREADS},
    "limits": section(memory_mb=POSITIVE, compile_timeout_s=POSITIVE, run_timeout_s=POSITIVE),
}
"""Keys a ``models:`` entry may set for itself; it inherits the rest from the top level."""

GLOBAL_SETTINGS: dict[str, Any] = {
    "fallback": {"type": "boolean"},
    "validate": section(max_abs_error=THRESHOLD, max_rel_error=THRESHOLD,
                        min_cosine={"type": ["number", "null"], "minimum": -1, "maximum": 1}),
    "disable_plugins": {"type": "array", "uniqueItems": True, "items": NAME},
    "concurrency": enum(*CONCURRENCY),
    "executor": enum(*EXECUTORS),
}
"""Keys that only make sense once per run."""



def build(options: Mapping[str, Mapping[str, Any]], host: str | None) -> dict[str, Any]:
    """The whole schema, with ``options`` (per backend name, its declared options) checked in ``backends``
    entries and the host backend's in the ``cpu`` section (the config's word for the host)."""
    settings = {**MODEL_SETTINGS, "backends": backends_schema(options),
                "cpu": options_section(options.get(host, {}) if host else {})}
    model = {**section(path=NAME, name=NAME, **settings), "required": ["path"]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "delegate configuration",
        **section(**settings, **GLOBAL_SETTINGS, models={"type": "array", "items": model}),
    }


@lru_cache(maxsize=1)
def installed_schema() -> dict[str, Any]:
    """The schema with the options every installed backend's plugin declares."""
    from .plugins import default_manager

    manager = default_manager()
    return build({name: info.options for name, (info, _) in manager.backends().items()}, manager.host())
