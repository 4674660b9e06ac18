"""How the GPU kit spells elementwise code per dialect: one formula table, one spelling table per language.

The formulas of the activations and binary ops are written once, against a
vector constant ``k(x)``; each :class:`Dialect` renders them into its
language (OpenCL C macros, WGSL functions) and spells what differs (the
vector type, overrides where the language has no common form), as tinygrad's
renderers do.  The epilogue applied to a kernel's output value ``v`` is
rendered from the fused steps' signatures (:meth:`delegate.gpu.Step.signature`)
by :func:`epilogue_lines`; how a step's operand reaches the kernel (an argument,
a uniform, a buffer) stays with the plugin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

Formula = Callable[..., str]  # (value expressions..., k) -> expression; k(x) spells a vector constant
# None: the languages have no common form, each dialect spells the op in its overrides.

UNARY_CODE: dict[str, Formula | None] = {
    "RELU": lambda v, k: f"max({v}, {k(0)})",
    "RELU6": lambda v, k: f"clamp({v}, {k(0)}, {k(6)})",
    "RELU_N1_TO_1": lambda v, k: f"clamp({v}, {k(-1)}, {k(1)})",
    # tanh saturates to +-1 in f32 well before 10; clamping keeps exp() in range on every driver.
    "TANH": lambda v, k: f"tanh(clamp({v}, {k(-10)}, {k(10)}))",
    "LOGISTIC": lambda v, k: f"({k(1)} / ({k(1)} + exp(-({v}))))",
    "EXP": lambda v, k: f"exp({v})",
    "HARD_SWISH": lambda v, k: f"(({v}) * clamp(({v}) + {k(3)}, {k(0)}, {k(6)}) / {k(6)})",
}

BINARY_CODE: dict[str, Formula | None] = {
    "ADD": lambda a, b, k: f"(({a}) + ({b}))",
    "SUB": lambda a, b, k: f"(({a}) - ({b}))",
    "MUL": lambda a, b, k: f"(({a}) * ({b}))",
    "MAXIMUM": lambda a, b, k: f"max({a}, {b})",
    "MINIMUM": lambda a, b, k: f"min({a}, {b})",
    "PRELU": lambda a, b, k: f"(max({a}, {k(0)}) + ({b}) * min({a}, {k(0)}))",
    "LOGICAL_AND": None,
}


@dataclass(frozen=True)
class Dialect:
    """One GPU language's spelling of the kit's elementwise code.

    ``vector`` spells a vector constant of a number; ``unary_def`` and ``binary_def``
    render a named definition from its body; ``unary_call`` and ``binary_call`` call one;
    ``overrides`` replace formulas the language cannot share.
    """

    name: str
    vector: Callable[[float], str]
    unary_def: Callable[[str, str], str]
    binary_def: Callable[[str, str], str]
    unary_call: Callable[[str, str], str]
    binary_call: Callable[[str, str, str], str]
    quantize_call: Callable[[str, str], str] = lambda v, grid: f"fake_quant({v}, {grid})"
    overrides: Mapping[str, Formula] = field(default_factory=dict)

    def formula(self, name: str) -> Formula:
        found = self.overrides.get(name) or UNARY_CODE.get(name) or BINARY_CODE.get(name)
        if found is None:
            raise ValueError(f"the {self.name} dialect has no code for {name}")
        return found

    def definitions(self) -> str:
        """Every unary and binary op of the formula tables, defined in this dialect."""
        k = lambda x: self.vector(float(x))  # noqa: E731
        lines = [self.unary_def(name, self.formula(name)("v", k)) for name in UNARY_CODE]
        lines += [self.binary_def(name, self.formula(name)("a", "b", k)) for name in BINARY_CODE]
        return "\n".join(lines) + "\n"


def epilogue_lines(dialect: Dialect, steps: Sequence[tuple], operand: Callable[[int, tuple], str],
                   grid: Callable[[int], str]) -> list[str]:
    """Statements applying the steps (by signature) to ``v``; ``operand(i, step)`` spells step i's other
    operand and ``grid(i)`` its quantization grid, as the plugin passes them."""
    lines = []
    for i, step in enumerate(steps):
        kind, name, _, swapped = step
        if kind == "unary":
            lines.append(f"v = {dialect.unary_call(name, 'v')};")
        elif kind == "quantize":
            lines.append(f"v = {dialect.quantize_call('v', grid(i))};")
        elif kind == "binary":
            other = operand(i, step)
            lhs, rhs = (other, "v") if swapped else ("v", other)
            lines.append(f"v = {dialect.binary_call(name, lhs, rhs)};")
        else:
            raise ValueError(f"unknown epilogue step kind {kind!r}")
    return lines


def unary_chain(dialect: Dialect, steps: Sequence[tuple], value: str) -> str:
    """The expression applying unary steps (by signature) to ``value``, for a producer fused into a reader."""
    for kind, name, _, _ in steps:
        if kind != "unary":
            raise ValueError(f"only unary steps chain into an expression, not {kind!r}")
        value = dialect.unary_call(name, value)
    return value


OPENCL = Dialect(
    "opencl",
    vector=lambda x: f"(FLT4)({x!r}f)",
    unary_def=lambda name, body: f"#define ACT_{name}(v) {body}",
    binary_def=lambda name, body: f"#define BIN_{name}(a, b) {body}",
    unary_call=lambda name, v: f"ACT_{name}({v})",
    binary_call=lambda name, a, b: f"BIN_{name}({a}, {b})",
    overrides={"LOGICAL_AND": lambda a, b, k: f"logical_and({a}, {b})"},
)

WGSL = Dialect(
    "wgsl",
    vector=lambda x: f"V({x!r})",
    unary_def=lambda name, body: f"fn unary_{name}(v: V) -> V {{ return {body}; }}",
    binary_def=lambda name, body: f"fn binary_{name}(a: V, b: V) -> V {{ return {body}; }}",
    unary_call=lambda name, v: f"unary_{name}({v})",
    binary_call=lambda name, a, b: f"binary_{name}({a}, {b})",
    overrides={"LOGICAL_AND": lambda a, b, k: f"select({k(0)}, {k(1)}, ({a} != {k(0)}) & ({b} != {k(0)}))"},
)
