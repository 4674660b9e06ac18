"""How the GPU kit spells elementwise code per dialect: one formula table, one spelling table per language.

The formulas of the activations, unary and binary ops are written once, as
functions of a :class:`Dialect` ``d`` (``d.k(x)`` a vector constant,
``d.fn(name)`` a builtin's spelling) and of the value expressions; each
dialect renders them into its language (OpenCL C macros, WGSL functions) and
spells what differs, as tinygrad's renderers do.  The epilogue applied to a
kernel's output value ``v`` is rendered from the fused steps' signatures
(:meth:`delegate.gpu.Step.signature`) by :func:`epilogue_lines`; how a step's
operand reaches the kernel (an argument, a uniform, a buffer) stays with the
plugin.  Comparisons give 1 or 0, which the boundary turns into bool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

Formula = Callable[..., str]  # (dialect, value expressions...) -> expression

_ERF_P = 0.3275911  # Abramowitz & Stegun 7.1.26: erf to 1.5e-7 (WGSL has no erf)
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(d: "Dialect", z: str) -> str:
    t = f"({d.k(1)} / ({d.k(1)} + {d.k(_ERF_P)} * {d.fn('abs')}({z})))"
    poly = d.k(_ERF_A[4])
    for a in reversed(_ERF_A[:4]):
        poly = f"({d.k(a)} + {t} * {poly})"
    return f"(sign({z}) * ({d.k(1)} - {t} * {poly} * exp(-({z}) * ({z}))))"


def _select(d: "Dialect", false: str, true: str, condition: str) -> str:
    return f"select({false}, {true}, {condition})"


def _compare(operator: str) -> Formula:
    return lambda d, a, b: _select(d, d.k(0), d.k(1), f"({a}) {operator} ({b})")


UNARY_CODE: dict[str, Formula] = {
    "RELU": lambda d, v: f"max({v}, {d.k(0)})",
    "RELU6": lambda d, v: f"clamp({v}, {d.k(0)}, {d.k(6)})",
    "RELU_N1_TO_1": lambda d, v: f"clamp({v}, {d.k(-1)}, {d.k(1)})",
    "RELU_0_TO_1": lambda d, v: f"clamp({v}, {d.k(0)}, {d.k(1)})",
    # tanh saturates to +-1 in f32 well before 10; clamping keeps exp() in range on every driver.
    "TANH": lambda d, v: f"tanh(clamp({v}, {d.k(-10)}, {d.k(10)}))",
    "LOGISTIC": lambda d, v: f"({d.k(1)} / ({d.k(1)} + exp(-({v}))))",
    "EXP": lambda d, v: f"exp({v})",
    "LOG": lambda d, v: f"log({v})",
    "SQRT": lambda d, v: f"sqrt({v})",
    "RSQRT": lambda d, v: f"{d.fn('rsqrt')}({v})",
    "SQUARE": lambda d, v: f"(({v}) * ({v}))",
    "ABS": lambda d, v: f"{d.fn('abs')}({v})",
    "NEG": lambda d, v: f"(-({v}))",
    "SIN": lambda d, v: f"sin({v})",
    "COS": lambda d, v: f"cos({v})",
    "FLOOR": lambda d, v: f"floor({v})",
    "CEIL": lambda d, v: f"ceil({v})",
    "ROUND": lambda d, v: f"{d.fn('round')}({v})",  # ties to even, as LiteRT's ROUND
    "SIGN": lambda d, v: f"sign({v})",
    "ELU": lambda d, v: f"(max({v}, {d.k(0)}) + (exp(min({v}, {d.k(0)})) - {d.k(1)}))",
    "NONZERO": lambda d, v: _select(d, d.k(0), d.k(1), f"({v}) != {d.k(0)}"),  # CAST to bool
    "HARD_SWISH": lambda d, v: f"(({v}) * clamp(({v}) + {d.k(3)}, {d.k(0)}, {d.k(6)}) / {d.k(6)})",
    # x * LOGISTIC(x), a converter's LOGISTIC and MUL fused into one step (fusion.plan_groups)
    "SWISH": lambda d, v: f"(({v}) * ({d.k(1)} / ({d.k(1)} + exp(-({v})))))",
    "GELU": lambda d, v: f"({d.k(0.5)} * ({v}) * ({d.k(1)} + {_erf(d, f'({v}) * {d.k(math.sqrt(0.5))}')}))",
    "GELU_APPROXIMATE": lambda d, v: (
        f"({d.k(0.5)} * ({v}) * ({d.k(1)} + tanh(clamp({d.k(math.sqrt(2 / math.pi))} * "
        f"(({v}) + {d.k(0.044715)} * ({v}) * ({v}) * ({v})), {d.k(-10)}, {d.k(10)}))))"),
}

# Unary formulas taking one parameter (a vector expression), from the op's options.
PARAMETRIC_CODE: dict[str, Formula] = {
    "LEAKY_RELU": lambda d, v, alpha: f"(max({v}, {d.k(0)}) + ({alpha}) * min({v}, {d.k(0)}))",
}

BINARY_CODE: dict[str, Formula] = {
    "ADD": lambda d, a, b: f"(({a}) + ({b}))",
    "SUB": lambda d, a, b: f"(({a}) - ({b}))",
    "MUL": lambda d, a, b: f"(({a}) * ({b}))",
    "DIV": lambda d, a, b: f"(({a}) / ({b}))",
    "FLOOR_DIV": lambda d, a, b: f"floor(({a}) / ({b}))",
    # LiteRT's float FLOOR_MOD: the remainder of truncation, moved into the sign of the divisor.
    "FLOOR_MOD": lambda d, a, b: _select(
        d, d.fmod(a, b), f"({d.fmod(a, b)} + ({b}))",
        f"({d.fmod(a, b)} != {d.k(0)}) & ((({b}) < {d.k(0)}) != ({d.fmod(a, b)} < {d.k(0)}))"),
    "SQUARED_DIFFERENCE": lambda d, a, b: f"((({a}) - ({b})) * (({a}) - ({b})))",
    "POW": lambda d, a, b: d.pow(d, a, b),
    "MAXIMUM": lambda d, a, b: f"max({a}, {b})",
    "MINIMUM": lambda d, a, b: f"min({a}, {b})",
    "PRELU": lambda d, a, b: f"(max({a}, {d.k(0)}) + ({b}) * min({a}, {d.k(0)}))",
    "LOGICAL_AND": lambda d, a, b: _select(d, d.k(0), d.k(1), f"(({a}) != {d.k(0)}) & (({b}) != {d.k(0)})"),
    "EQUAL": _compare("=="),
    "NOT_EQUAL": _compare("!="),
    "LESS": _compare("<"),
    "LESS_EQUAL": _compare("<="),
    "GREATER": _compare(">"),
    "GREATER_EQUAL": _compare(">="),
}


# Reductions over scalars: (initial value, or None to start from the first element; combination of the running
# value a and the next element b).  REDUCE_ANY and REDUCE_ALL see bools as 1 and 0.
REDUCE_CODE: dict[str, tuple[str | None, Callable[[str, str], str]]] = {
    "SUM": ("0", lambda a, b: f"({a} + {b})"),
    "MEAN": ("0", lambda a, b: f"({a} + {b})"),
    "REDUCE_PROD": ("1", lambda a, b: f"({a} * {b})"),
    "REDUCE_MAX": (None, lambda a, b: f"max({a}, {b})"),
    "REDUCE_MIN": (None, lambda a, b: f"min({a}, {b})"),
    "REDUCE_ANY": (None, lambda a, b: f"max({a}, {b})"),
    "REDUCE_ALL": (None, lambda a, b: f"min({a}, {b})"),
}


def reduction(name: str, first: str) -> tuple[str, str, str]:
    """(initial value, combination of ``total`` and ``value``, result from ``total`` and the region's element
    ``count``, a float) of reduction ``name``; ``first`` spells the region's first element."""
    init, combine = REDUCE_CODE[name]
    return (first if init is None else init), combine("total", "value"), \
        "(total / count)" if name == "MEAN" else "total"


def _wgsl_pow(d: "Dialect", a: str, b: str) -> str:
    """C's pow from WGSL's (defined only for a positive base): |a|^b, negated for a negative base and an
    odd integer exponent, 1 for a zero exponent; a negative base and fractional exponent stays NaN."""
    magnitude = f"pow(abs({a}), {b})"
    integer = f"(floor({b}) == ({b}))"
    odd = f"(({integer}) & (fract(({b}) * {d.k(0.5)}) != {d.k(0)}))"
    signed = _select(d, magnitude, f"(-{magnitude})", f"(({a}) < {d.k(0)}) & {odd}")
    real = _select(d, signed, f"pow({a}, {b})", f"(({a}) < {d.k(0)}) & !{integer}")
    return _select(d, real, d.k(1), f"({b}) == {d.k(0)}")


@dataclass(frozen=True)
class Dialect:
    """One GPU language's spelling of the kit's elementwise code.

    ``vector`` spells a vector constant of a number; ``unary_def`` and ``binary_def`` render a
    named definition from its parameters and body; ``unary_call`` and ``binary_call`` call one;
    ``builtins`` spell the builtins whose names differ.
    """

    name: str
    vector: Callable[[float], str]
    unary_def: Callable[[str, Sequence[str], str], str]
    binary_def: Callable[[str, str], str]
    unary_call: Callable[[str, Sequence[str]], str]
    binary_call: Callable[[str, str, str], str]
    fmod: Callable[[str, str], str]
    pow: Callable[["Dialect", str, str], str]
    builtins: Mapping[str, str] = field(default_factory=dict)
    quantize_call: Callable[[str, str], str] = lambda v, grid: f"fake_quant({v}, {grid})"

    def k(self, x: float) -> str:
        return self.vector(float(x))

    def fn(self, name: str) -> str:
        return self.builtins.get(name, name)

    def definitions(self) -> str:
        """Every op of the formula tables, defined in this dialect."""
        lines = [self.unary_def(name, ["v"], formula(self, "v")) for name, formula in UNARY_CODE.items()]
        lines += [self.unary_def(name, ["v", "p0"], formula(self, "v", "p0"))
                  for name, formula in PARAMETRIC_CODE.items()]
        lines += [self.binary_def(name, formula(self, "a", "b")) for name, formula in BINARY_CODE.items()]
        return "\n".join(lines) + "\n"

    def unary(self, name: str, value: str, params: Sequence[float] = ()) -> str:
        """A call of unary ``name`` on ``value``, its parameters spelled as vector constants."""
        return self.unary_call(name, [value, *(self.k(p) for p in params)])


def rounded_swish(dialect: Dialect, value: str, grid: str) -> str:
    """``value`` times its LOGISTIC rounded onto ``grid``, as the LOGISTIC's own kernel would have stored it (a
    swish step in an integer model's float view)."""
    return dialect.binary_call("MUL", value, dialect.quantize_call(dialect.unary("LOGISTIC", value), grid))


def epilogue_lines(dialect: Dialect, steps: Sequence[tuple], operand: Callable[[int, tuple], str],
                   grid: Callable[[int], str]) -> list[str]:
    """Statements applying the steps (by signature) to ``v``; ``operand(i, step)`` spells step i's other
    operand and ``grid(i)`` its quantization grid, as the plugin passes them."""
    lines = []
    for i, step in enumerate(steps):
        kind, name, _, swapped, params = step
        if kind == "unary":
            lines.append(f"v = {dialect.unary(name, 'v', params)};")
        elif kind == "quantize":
            lines.append(f"v = {dialect.quantize_call('v', grid(i))};")
        elif kind == "swish":
            lines.append(f"v = {rounded_swish(dialect, 'v', grid(i))};")
        elif kind == "binary":
            other = operand(i, step)
            lhs, rhs = (other, "v") if swapped else ("v", other)
            lines.append(f"v = {dialect.binary_call(name, lhs, rhs)};")
        else:
            raise ValueError(f"unknown epilogue step kind {kind!r}")
    return lines


def unary_chain(dialect: Dialect, steps: Sequence[tuple], value: str,
                grid: Callable[[int], str] | None = None) -> str:
    """The expression applying unary steps (by signature) to ``value``, for a producer fused into a reader; with
    ``grid`` (step i's quantization grid, as the plugin passes it) its rounding steps too."""
    for i, (kind, name, _, _, params) in enumerate(steps):
        if kind == "unary":
            value = dialect.unary(name, value, params)
        elif kind == "quantize" and grid is not None:
            value = dialect.quantize_call(value, grid(i))
        elif kind == "swish" and grid is not None:
            value = rounded_swish(dialect, value, grid(i))
        else:
            raise ValueError(f"a {kind!r} step does not chain into an expression here")
    return value


OPENCL = Dialect(
    "opencl",
    vector=lambda x: f"(FLT4)({x!r}f)",
    unary_def=lambda name, params, body: f"#define ACT_{name}({', '.join(params)}) {body}",
    binary_def=lambda name, body: f"#define BIN_{name}(a, b) {body}",
    unary_call=lambda name, args: f"ACT_{name}({', '.join(args)})",
    binary_call=lambda name, a, b: f"BIN_{name}({a}, {b})",
    fmod=lambda a, b: f"fmod({a}, {b})",
    pow=lambda d, a, b: f"pow({a}, {b})",
    builtins={"abs": "fabs", "round": "rint"},
)

WGSL = Dialect(
    "wgsl",
    vector=lambda x: f"V({x!r})",
    unary_def=lambda name, params, body: (
        f"fn unary_{name}({', '.join(f'{p}: V' for p in params)}) -> V {{ return {body}; }}"),
    binary_def=lambda name, body: f"fn binary_{name}(a: V, b: V) -> V {{ return {body}; }}",
    unary_call=lambda name, args: f"unary_{name}({', '.join(args)})",
    binary_call=lambda name, a, b: f"binary_{name}({a}, {b})",
    fmod=lambda a, b: f"(({a}) % ({b}))",
    pow=_wgsl_pow,
    builtins={"rsqrt": "inverseSqrt"},
)
