"""WGSL assembly: a kernel template plus generated bindings, uniform parameters and epilogue.

A template (``shaders/<name>.wgsl``) computes output vectors and hands each to
``emit(v, pos)``, which applies the epilogue (the fused steps of
:mod:`delegate.gpu.fusion`) and stores it.  Everything that varies with
shapes or weights is a uniform parameter or a buffer, so the source depends
only on the structure of a kernel: identical structures share one shader
module and pipeline on a device.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from string import Template
from typing import Any, Hashable, Sequence

import numpy as np

from delegate.gpu import Step
from delegate.gpu.dialect import WGSL, epilogue_lines
from delegate.gpu.layout import as_nhwc, phwc4_shape
from delegate.gpu.lowering import BroadcastArg, ParamArg, epilogue_operands

PARAM_KINDS = {"int": "i32", "float": "f32", "int4": "vec4<i32>", "float4": "vec4<f32>"}  # the kit's -> WGSL

PARAM_TYPES = {"i32": ("i", 1, 4), "f32": ("f", 1, 4), "vec4<i32>": ("i", 4, 16), "vec4<f32>": ("f", 4, 16)}


@lru_cache(maxsize=None)
def template(name: str) -> str:
    return resources.files("delegate_wgpu").joinpath("shaders", f"{name}.wgsl").read_text()


_FILES = sorted(entry.name[:-5] for entry in resources.files("delegate_wgpu").joinpath("shaders").iterdir()
                if entry.name.endswith(".wgsl"))
MAPPINGS = frozenset(name[4:] for name in _FILES if name.startswith("map_"))  # data movement as gather mappings


def templates() -> list[str]:
    """The templates this dialect has: its shaders (``shaders/<name>.wgsl``) and the data movement it
    writes as mappings of the gather kernel (``map_<name>.wgsl``)."""
    return [name for name in _FILES if not name.startswith("map_")] + sorted(MAPPINGS)


def dims(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """(W, H, S, N) of a tensor's PHWC4 storage: how kernels address it."""
    n, s, h, w, _ = phwc4_shape(shape)
    return w, h, s, n


@dataclass(frozen=True)
class Binding:
    """A storage buffer a kernel reads or writes; ``value`` names it in the program's buffer plan.

    ``element`` is the WGSL element type: PHWC4 vectors, or ``f32`` for host-ordered (NHWC) float32
    values crossing the partition boundary.
    """

    name: str
    value: Hashable
    writable: bool
    element: str = "vec4<S>"


@dataclass
class Kernel:
    """One dispatch being described: template, buffers, uniform parameters, epilogue, work size."""

    template: str
    label: str
    ops: list[int] = field(default_factory=list)  # indices of the ops it computes (for profiles)
    invocations: int = 0  # flat kernels: work items, in workgroups of the backend's workgroup_size
    workgroup: tuple[int, int, int] | None = None  # tiled kernels: their own workgroup shape ...
    grid: tuple[int, int, int] | None = None  # ... and how many workgroups along each axis
    half: bool = False  # its multiply-adds may run in f16 (when the storage is f16)
    tiling: str = ""  # how a tiled kernel divides its work
    variants: list["Kernel"] = field(default_factory=list)  # other tilings, for tuning to time
    bindings: list[Binding] = field(default_factory=list)
    params: list[tuple[str, str, Any]] = field(default_factory=list)
    substitutions: dict[str, str] = field(default_factory=dict)
    epilogue: list[str] = field(default_factory=list)
    helpers: list[str] = field(default_factory=list)
    out: str = "dst"

    # -- declarations ----------------------------------------------------
    def read(self, name: str, value: Hashable, element: str = "vec4<S>") -> "Kernel":
        self.bindings.append(Binding(name, value, False, element))
        return self

    def write(self, name: str, value: Hashable, element: str = "vec4<S>") -> "Kernel":
        self.bindings.append(Binding(name, value, True, element))
        return self

    def tile(self, workgroup: Sequence[int], grid: Sequence[int]) -> "Kernel":
        """Dispatch as ``grid`` workgroups of shape ``workgroup`` instead of flat work items."""
        self.workgroup = tuple(int(v) for v in workgroup)  # type: ignore[assignment]
        self.grid = tuple(int(v) for v in grid)  # type: ignore[assignment]
        return self

    def param(self, name: str, wgsl_type: str, value: Any) -> "Kernel":
        if wgsl_type not in PARAM_TYPES:
            raise ValueError(f"unsupported parameter type {wgsl_type}")
        self.params.append((name, wgsl_type, value))
        return self

    def uniform(self, arg: ParamArg) -> str:
        """Declare a parameter of the kit's contract as a uniform field; returns its expression."""
        self.param(arg.name, PARAM_KINDS[arg.kind], arg.value)
        return f"p.{arg.name}"

    def tensor(self, name: str, value: Hashable, shape: Sequence[int], writable: bool = False,
               element: str = "vec4<S>") -> "Kernel":
        """A PHWC4 tensor (``element`` f32: the same values in host order) with its dims (``p.<name>_d``)
        and channel count (``p.<name>_c``)."""
        (self.write if writable else self.read)(name, value, element)
        self.param(f"{name}_d", "vec4<i32>", dims(shape))
        return self.param(f"{name}_c", "i32", as_nhwc(shape)[3])

    def broadcast(self, name: str, value: Hashable, shape: Sequence[int], splat: bool) -> str:
        """Bind a tensor read at output positions, dimensions of size 1 broadcast (and a single channel
        splat over all when ``splat``); returns the read expression."""
        self.read(name, value)
        self.param(f"{name}_d", "vec4<i32>", dims(shape))
        self.helpers.append(
            f"fn broadcast_{name}(o: Pos) -> V {{\n"
            f"  let d = p.{name}_d;\n"
            f"  let v = {name}_at(vidx(d, select(o.n, 0, d.w == 1), select(o.y, 0, d.y == 1), "
            f"select(o.x, 0, d.x == 1), select(o.s, 0, d.z == 1)));\n"
            f"  return {'V(v.x)' if splat else 'v'};\n}}")
        return f"broadcast_{name}(o)"

    def output(self, value: Hashable, shape: Sequence[int], steps: Sequence[Step] = (), host: bool = False) -> "Kernel":
        """The stored tensor, in host order (NHWC float32) with ``host``; work items default to one per
        output vector; ``steps`` form the epilogue."""
        self.tensor(self.out, value, shape, writable=True, element="f32" if host else "vec4<S>")
        self.param("count", "i32", int(np.prod(dims(shape))))
        self.invocations = int(np.prod(dims(shape)))
        operands = epilogue_operands(steps, shape)

        def operand(k: int, _signature: tuple) -> str:
            arg = operands[k]
            if isinstance(arg, BroadcastArg):
                return self.broadcast(arg.name, arg.value, arg.shape, arg.splat)
            return f"V({self.uniform(arg)})"

        def grid(k: int) -> str:
            return self.uniform(operands[k])
        self.epilogue = epilogue_lines(WGSL, [step.signature() for step in steps], operand, grid)
        return self

    # -- generated code --------------------------------------------------
    def source(self, storage: str, workgroup: int) -> str:
        """The complete WGSL of this kernel for storage type ``f32`` or ``f16``."""
        x, y, z = self.workgroup or (workgroup, 1, 1)
        prelude = Template(template("common")).substitute(
            ENABLE="enable f16;" if storage == "f16" else "", STORAGE=storage, WG_X=x, WG_Y=y, WG_Z=z,
            ARITH="f16" if self.half and storage == "f16" else "f32")
        parts = [prelude, WGSL.definitions(), self._declarations()]
        parts.extend(self.helpers)
        out = next((b for b in self.bindings if b.name == self.out and b.writable), None)
        if out is not None:
            parts.append(self._emit(out.element != "vec4<S>"))
        parts.append(Template(template(self.template)).substitute(self.substitutions))
        return "\n\n".join(parts) + "\n"

    def _emit(self, host: bool) -> str:
        """``emit``, the one store of every template's output: the epilogue, then the vector stored in
        PHWC4, or (``host``) its channels in host order, NHWC float32, for the host to read as they are."""
        out, body = self.out, "\n  ".join(self.epilogue)
        if host:
            store = (f"let first = ((o.n * p.{out}_d.y + o.y) * p.{out}_d.x + o.x) * p.{out}_c + o.s * 4;\n"
                     f"  for (var lane = 0; lane < min(4, p.{out}_c - o.s * 4); lane++) {{\n"
                     f"    {out}[first + lane] = v[lane];\n  }}")
        else:
            store = f"{out}_store(vidx(p.{out}_d, o.n, o.y, o.x, o.s), mask_tail(v, o.s, p.{out}_c));"
        return f"fn emit(value: V, o: Pos) {{\n  var v = value;\n  {body}\n  {store}\n}}"

    def _declarations(self) -> str:
        lines = []
        for i, b in enumerate(self.bindings):
            access = "read_write" if b.writable else "read"
            lines.append(f"@group(0) @binding({i}) var<storage, {access}> {b.name}: array<{b.element}>;")
            if b.element != "vec4<S>":
                continue
            if b.writable:
                lines.append(f"fn {b.name}_store(i: i32, v: V) {{ {b.name}[i] = vec4<S>(v); }}")
            else:
                lines.append(f"fn {b.name}_at(i: i32) -> V {{ return V({b.name}[i]); }}")
                lines.append(f"fn {b.name}_lane(i: i32) -> f32 {{ return f32({b.name}[i >> 2u][i & 3]); }}")
        fields = "\n".join(f"  {name}: {wgsl_type}," for name, wgsl_type, _ in self.params) or "  unused: i32,"
        lines.append(f"struct Params {{\n{fields}\n}}")
        lines.append(f"@group(0) @binding({len(self.bindings)}) var<uniform> p: Params;")
        return "\n".join(lines)

    def params_bytes(self) -> bytes:
        """The uniform buffer contents, laid out by WGSL's uniform rules (vec4 aligned to 16 bytes)."""
        out = bytearray()
        for _, wgsl_type, value in self.params:
            code, count, align = PARAM_TYPES[wgsl_type]
            out.extend(bytes(-len(out) % align))
            values = [value] if count == 1 else list(value)
            if len(values) != count:
                raise ValueError(f"parameter of type {wgsl_type} needs {count} values, got {values}")
            out.extend(struct.pack(f"<{count}{code}", *values))
        if not out:
            out.extend(bytes(4))  # the placeholder field of an empty struct
        out.extend(bytes(-len(out) % 16))
        return bytes(out)
