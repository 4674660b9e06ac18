"""OpenCL programs: kernel templates instantiated with generated epilogues, built once per source.

A kernel template (``kernels/<name>.cl``) computes one output vector and
calls ``EPILOGUE(v, n, y, x, s)`` before storing it.  A *variant* is a
template plus the signature of the fused steps it applies and the
compile-time constants it is specialised for (tile sizes, a filter size);
the steps' operands (buffers, constants, quantization grids) are kernel
arguments, so the source depends on the structure of a partition, not on
its weights, and identical partitions (or test cases) share one build.

A partition's kernels are found variant by variant: one built earlier in
the process (by any partition, or another candidate plan of the same
model) is reused; with a cache directory, one whose program is stored as a
device binary is loaded from it; the rest are built from source, together,
as one program (or up to ``threads`` programs at once).  Binaries are keyed
by everything that could change them, and each variant's entry names the
binary holding it, so a later process finds a variant in whichever program
first built it.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence

from delegate.plugin_api import CacheWarning, CompileError, EntryStore, cache_key
from delegate.gpu.dialect import OPENCL, epilogue_lines, reduction
from delegate.gpu.plan import LaunchSpec

from . import __version__


@lru_cache(maxsize=None)
def template(name: str) -> str:
    return resources.files("delegate_opencl").joinpath("kernels", f"{name}.cl").read_text()


# Data movement templates written as mappings of gather.cl (MAP_<NAME>), by the kit's template name.
MAPPINGS = frozenset(name.lower() for name in re.findall(r"defined\(MAP_(\w+)\)", template("gather")))


def templates() -> list[str]:
    """The kernel templates this dialect has: ``kernels/<name>.cl`` (the prelude is none) and the
    mappings of the gather kernel."""
    return [entry.name[:-3] for entry in resources.files("delegate_opencl").joinpath("kernels").iterdir()
            if entry.name.endswith(".cl") and entry.name != "prelude.cl"] + sorted(MAPPINGS)


def variant(template_name: str, steps: tuple = (), constants: Sequence[tuple[str, Any]] = (),
            inputs: int = 1) -> Variant:
    """The variant running the kit's template ``template_name`` with the epilogue ``steps`` (signatures) and
    the call's compile-time ``constants`` as macros; a mapping of gather.cl reads ``inputs`` tensors."""
    defines = tuple(define for name, value in constants for define in SPECIALISE[name](value))
    if template_name in MAPPINGS:
        views = any(name == "views" for name, _ in constants)
        return Variant("gather", steps, ((f"MAP_{template_name.upper()}", 1),) + _gather_inputs(inputs, views)
                       + MAPPING_DEFINES.get(template_name, lambda inputs: ())(inputs) + defines)
    return Variant(template_name, steps, defines)


def _gather_inputs(inputs: int, views: bool) -> tuple[tuple[str, str], ...]:
    """The arguments of gather.cl's inputs after the first (each with its view when ``views``), and the
    selection of the one a mapping names."""
    if inputs == 1:
        return ()
    more = range(1, inputs)
    view = (lambda i: f", int4 in{i}_v") if views else (lambda i: "")
    select = (lambda i: f" fv = in{i}_v;") if views else (lambda i: "")
    return (("GATHER_INPUTS", "".join(f", AT(in{i}), int4 in{i}_d, int in{i}_c{view(i)}" for i in more)),
            ("GATHER_SELECT", " ".join(f"if (input == {i}) {{ from = VIEW(const STORAGE, in{i}); fd = in{i}_d; "
                                       f"fc = in{i}_c;{select(i)} }}" for i in more)))


def _concat_ends(inputs: int) -> tuple[tuple[str, str], ...]:
    """MAP_CONCAT's range ends, one per input, and the search for the input holding ``c[axis]``."""
    return (("CONCAT_ENDS", "".join(f", int end{i}" for i in range(inputs))),
            ("CONCAT_FIND", " ".join(f"if (c[axis] >= end{i}) {{ input = {i + 1}; start = end{i}; }}"
                                     for i in range(inputs - 1))))


MAPPING_DEFINES = {"concat": _concat_ends}  # mappings whose arguments depend on how many inputs they read


def _reduction(name: str) -> tuple[tuple[str, str], ...]:
    init, combine, finish = reduction(name, "(first)")
    return (("REDUCE_INIT(first)", init), ("REDUCE(total, value)", combine), ("REDUCE_FINISH(total, count)", finish))


HOST_TYPES = {"float32": "float", "uint8": "uchar", "int8": "char"}

# How a template stores its output (the prelude's STORE_OUT): PHWC4 vectors in the storage type unless the
# variant is specialised with "host_output" (the kit's Lowering.host_write), then NHWC float32 for the host.
STORE_PHWC4 = (("OUT_STORAGE", "STORAGE"),
               ("STORE_OUT(v, out, od, channels, n, y, x, s)",
                "STORE4(mask_tail(v, s, channels), out, vec_index(od, n, y, x, s))"))
STORE_HOST = (("OUT_STORAGE", "float"),
              ("STORE_OUT(v, out, od, channels, n, y, x, s)", "host_store(TO_ACC4(v), out, od, channels, n, y, x, s)"))

# A kit call's constant -> the macros spelling it (the group: work items sharing one output's sum; the
# element type and channels of a partition input read in host order; an output stored in host order;
# gather inputs read through views).
SPECIALISE = {"reduction": _reduction, "group": lambda group: (("GROUP", group),),
              "host_input": lambda dtype: (("HOST_INPUT", HOST_TYPES[dtype]),),
              "host_channels": lambda channels: (("HOST_CHANNELS", channels),),
              "host_output": lambda _: STORE_HOST, "views": lambda _: (("GATHER_VIEWS", 1),)}


@dataclass(frozen=True)
class Variant:
    """A kernel template with the signature of its epilogue (see :meth:`delegate.gpu.Step.signature`)
    and the macros it is specialised with, as (name, value) pairs."""

    template: str
    epilogue: tuple[tuple, ...] = ()
    defines: tuple[tuple[str, Any], ...] = ()


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def variant_of(launch: LaunchSpec) -> Variant:
    """The variant a plan's launch instantiates (its parameters hold the epilogue and the defines)."""
    return Variant(launch.kernel, _tuples(launch.params["epilogue"]), _tuples(launch.params["defines"]))


def epilogue_code(epilogue: Sequence[tuple]) -> tuple[str, str]:
    """(extra kernel parameters, statement) implementing the epilogue steps on the value ``v``."""
    params: list[str] = []

    def operand(i: int, step: tuple) -> str:
        if step[2] == "scalar":
            params.append(f"float e{i}")
            return f"(FLT4)((FLT)e{i})"
        params.append(f"AT(e{i}), int4 e{i}_dims, int e{i}_splat")
        return f"read_bcast(VIEW(const STORAGE, e{i}), e{i}_dims, e{i}_splat, n, y, x, s)"

    def grid(i: int) -> str:
        params.append(f"float4 e{i}")
        return f"e{i}"
    body = epilogue_lines(OPENCL, epilogue, operand, grid)
    return "".join(", " + p for p in params), "do { " + " ".join(body) + " } while (0)"


def kernel_name(variant: Variant, index: int) -> str:
    return f"{variant.template}_{index}"


def program_source(variants: Sequence[Variant], defines: Sequence[str]) -> str:
    """One program holding every variant, each as ``<template>_<index>``."""
    parts = [f"#define {d}" for d in defines] + [template("prelude"), OPENCL.definitions()]
    for i, variant in enumerate(variants):
        params, body = epilogue_code(variant.epilogue)
        parts += [f"#define KERNEL_NAME {kernel_name(variant, i)}", f"#define EPILOGUE_PARAMS {params}",
                  f"#define EPILOGUE(v, n, y, x, s) {body}"]
        given = {name.split("(")[0] for name, _ in variant.defines}
        defines = variant.defines + tuple(d for d in STORE_PHWC4 if d[0].split("(")[0] not in given)
        parts += [f"#define {name} {value}" for name, value in defines]
        parts += [template(variant.template), "#undef KERNEL_NAME", "#undef EPILOGUE_PARAMS", "#undef EPILOGUE"]
        parts += [f"#undef {name.split('(')[0]}" for name, _ in defines]
    return "\n".join(parts) + "\n"


@dataclass
class Built:
    program: Any
    key: str
    origin: str  # "memory" (built earlier in this process), "cache" (device binary from disk), "source"
    seconds: float


MIN_CHUNK = 4  # variants per program, at least, when the kernels to build are split into several programs


def build_chunks(variants: list, threads: int) -> list[list]:
    """``variants`` split, in order, into at most ``threads`` programs of at least MIN_CHUNK variants
    each (every program repeats the prelude, so tiny ones cost more than they save)."""
    count = max(1, min(threads, len(variants) // MIN_CHUNK))
    size = -(-len(variants) // count)
    return [variants[i:i + size] for i in range(0, len(variants), size)]


@dataclass
class Kernels:
    """Where each variant's kernel is, (program, kernel name), and the programs that hold them."""

    found: dict[Variant, tuple[Any, str]]
    programs: list[Built]


class ProgramBuilder:
    """Builds programs for one device, reusing earlier builds of the same source or the same variants."""

    BUILD_OPTIONS = ("-cl-std=CL1.2",)

    def __init__(self, cl, context, device, facts: dict[str, Any]):
        self.cl, self.context, self.device, self.facts = cl, context, device, facts
        self.memo: dict[str, Any] = {}  # program key -> program
        self.kernels_built: dict[tuple, tuple[Any, str, str]] = {}  # (defines, variant) -> program, name, key

    def key(self, source: str) -> str:
        return cache_key({**self._device_fields(), "source": hashlib.sha256(source.encode()).hexdigest()})

    def variant_key(self, variant: Variant, defines: Sequence[str]) -> str:
        return cache_key({**self._device_fields(), "defines": list(defines), "variant": repr(variant)})

    def _device_fields(self) -> dict[str, Any]:
        return {"platform": self.facts["platform"], "device": self.facts["device"],
                "driver": self.facts["driver_version"], "plugin": __version__, "options": self.BUILD_OPTIONS}

    def kernels(self, variants: Sequence[Variant], defines: Sequence[str], cache: EntryStore | None,
                threads: int = 1) -> Kernels:
        """Every variant's kernel: reused from this process, loaded from ``cache``, or built now (the
        missing ones only, as up to ``threads`` programs built at once: the driver's compiler runs with the
        GIL released)."""
        defines = tuple(defines)
        found: dict[Variant, tuple[Any, str]] = {}
        programs: dict[str, Built] = {}
        missing = []
        for variant in variants:
            start = time.perf_counter()
            hit = self.kernels_built.get((defines, variant))
            origin = "memory"
            if hit is None and cache is not None:
                hit, origin = self._stored_kernel(variant, defines, cache), "cache"
            if hit is None:
                missing.append(variant)
                continue
            program, name, key = hit
            self.kernels_built[(defines, variant)] = hit
            found[variant] = (program, name)
            if origin == "memory" and cache is not None:
                self._remember(variant, defines, cache, program, name, key)  # a cache this process had not seen
            if key not in programs:
                programs[key] = Built(program, key, origin, time.perf_counter() - start)
        chunks = build_chunks(missing, threads) if missing else []
        sources = [program_source(chunk, defines) for chunk in chunks]
        if len(sources) > 1:
            with ThreadPoolExecutor(len(sources), thread_name_prefix="delegate-opencl-build") as pool:
                built = list(pool.map(lambda source: self.build(source, cache), sources))
        else:
            built = [self.build(source, cache) for source in sources]
        for chunk, b in zip(chunks, built):
            programs.setdefault(b.key, b)
            for i, variant in enumerate(chunk):
                name = kernel_name(variant, i)
                self.kernels_built[(defines, variant)] = (b.program, name, b.key)
                found[variant] = (b.program, name)
                if cache is not None:
                    self._remember(variant, defines, cache, b.program, name, b.key)
        return Kernels(found, list(programs.values()))

    def _remember(self, variant: Variant, defines: tuple, cache: EntryStore, program, name: str, key: str) -> None:
        """The variant's entry in ``cache``, naming the stored binary that holds it (stored too if missing)."""
        entry = self.variant_key(variant, defines)
        if cache.has(entry, "kernel"):
            return
        if not cache.has(key, "bin"):
            cache.store(key, "bin", self._binary(program))
        cache.store(entry, "kernel", json.dumps({"program": key, "name": name}).encode())

    def _stored_kernel(self, variant: Variant, defines: tuple, cache: EntryStore) -> tuple[Any, str, str] | None:
        """The variant's kernel from the stored binary its entry names, or None."""
        raw = cache.load(self.variant_key(variant, defines), "kernel")
        try:
            entry = json.loads(raw) if raw is not None else None
            key, name = entry["program"], entry["name"]
            if not (isinstance(key, str) and isinstance(name, str)):
                return None
        except (ValueError, TypeError, KeyError):
            return None
        program = self.memo.get(key)
        if program is None:
            binary = cache.load(key, "bin")
            program = self._from_binary(binary) if binary is not None else None
            if program is None:
                return None
            self.memo[key] = program
        return program, name, key

    def build(self, source: str, cache: EntryStore | None) -> Built:
        key = self.key(source)
        start = time.perf_counter()
        program, origin = self.memo.get(key), "memory"
        if program is None:
            binary = cache.load(key, "bin") if cache else None
            program = self._from_binary(binary) if binary is not None else None
            origin = "cache" if program is not None else "source"
            self.memo[key] = program = program or self._from_source(source)
        # A build this process made earlier reaches a cache directory it had not seen yet.
        if cache and (origin == "source" or (origin == "memory" and not cache.has(key, "bin"))):
            cache.store(key, "bin", self._binary(program))
        return Built(program, key, origin, time.perf_counter() - start)

    def _from_source(self, source: str):
        cl = self.cl
        try:
            return cl.Program(self.context, source).build(options=list(self.BUILD_OPTIONS), devices=[self.device])
        except cl.RuntimeError as exc:
            raise CompileError(f"OpenCL program failed to build on {self.facts['device']}", log=str(exc)) from None

    def _from_binary(self, binary: bytes):
        cl = self.cl
        try:
            return cl.Program(self.context, [self.device], [binary]).build(options=list(self.BUILD_OPTIONS))
        except (cl.Error, ValueError) as exc:
            warnings.warn(f"cached OpenCL binary was rejected by the driver ({exc}); rebuilding from source",
                          CacheWarning, stacklevel=4)
            return None

    def _binary(self, program) -> bytes:
        index = list(program.get_info(self.cl.program_info.DEVICES)).index(self.device)
        return bytes(program.get_info(self.cl.program_info.BINARIES)[index])
