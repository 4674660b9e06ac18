"""The JSON Schema (Draft 2020-12) of the YAML configuration.

Kept apart from the loader so the set of keys reads in one place; docs/config.md
describes every key here, and a test checks that it does.  Sections have no
required keys because a config is always layered over the packaged defaults.
``errorMessage`` (the ajv-errors convention) words a ``oneOf`` failure for people.
"""

from __future__ import annotations

import os
from typing import Any

PRECISIONS = ("fp32", "fp16")
PREFERENCES = ("fast_single_answer", "sustained_speed")
PARTITIONERS = ("cost", "greedy")
SEARCHES = ("auto", "estimate", "measure")
CPU_ENGINES = ("numpy", "litert", "auto")
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


# Known options of the first-party backends are checked; the mapping stays open
# because a plugin may accept more than these.
BACKEND_OPTIONS = {
    "opencl": {"platform": NAME, "device": NAME, "device_type": enum("gpu", "cpu", "accelerator", "any")},
    "wgpu": {"power_preference": enum("high-performance", "low-power"),
             "backend_type": enum("vulkan", "metal", "dx12", "gl", "any"), "adapter": NAME},
}

BACKEND = {
    # string keywords apply to a bare name, object keywords to {name, options}
    "type": ["string", "object"],
    "minLength": 1,
    "additionalProperties": False,
    "required": ["name"],
    "properties": {"name": NAME, "options": {"type": "object"}},
    "allOf": [{"if": {"type": "object", "properties": {"name": {"const": name}}},
               "then": {"properties": {"options": {"type": "object", "properties": options}}}}
              for name, options in BACKEND_OPTIONS.items()],
}

MODEL_SETTINGS: dict[str, Any] = {
    "backends": {"type": "array", "minItems": 1, "items": BACKEND},
    "precision": enum(*PRECISIONS),
    "allow_quantized": {"type": "boolean"},
    "inference_preference": enum(*PREFERENCES),
    "partitioner": enum(*PARTITIONERS),
    "placement": section(search=enum(*SEARCHES), budget_s={"type": "number", "exclusiveMinimum": 0,
                                                           "maximum": 3600}),
    "max_delegated_partitions": {"type": "integer", "minimum": 0},
    "min_nodes_per_partition": {"type": "integer", "minimum": 1},
    "pin": {"type": "array", "items": rule(backend_required=True)},
    "deny": {"type": "array", "items": rule(backend_required=False)},
    "serialization": section(dir=OPTIONAL_TEXT, model_token=OPTIONAL_TEXT),
    "accuracy_guard": section(enabled={"type": "boolean"}, max_abs_error=THRESHOLD, max_rel_error=THRESHOLD),
    "cpu": section(engine=enum(*CPU_ENGINES), native={"type": "boolean"}),
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

MODEL = {**section(path=NAME, name=NAME, **MODEL_SETTINGS), "required": ["path"]}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "delegate configuration",
    **section(**MODEL_SETTINGS, **GLOBAL_SETTINGS, models={"type": "array", "items": MODEL}),
}
