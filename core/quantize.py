"""Post-training quantization of float models, in the forms TFLite's converter writes.

``fp16``: every float32 constant that a builtin op reads is stored as float16
and widened by a DEQUANTIZE op (version 3) just before its first reader: the
converter's float16-weight models and the MediaPipe models look like this,
and GPU delegates run them with half-size weights.

``int8``: full-integer quantization calibrated on random data.  The float
model runs on the CPU backend for a few seeded random inputs
(:func:`delegate.inputs.random_input`) and the range of every activation is
recorded.  Weights become symmetric per-channel int8, biases int32 at input
scale x weight scale, activations asymmetric per-tensor int8.  Ops whose
integer kernels only move values share one scale between their operands,
and the table-driven activations get the fixed output scales their kernels
assume.  Inputs and outputs stay float32 through QUANTIZE / DEQUANTIZE ops;
ops without a LiteRT int8 kernel (custom ops among them) stay float between
such pairs.  Op versions are the ones the converter gives int8 ops.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from .ir import DType, Model, Op, Quantization, Subgraph, Tensor

MODES = ("fp32", "fp16", "int8")


def quantize(model: Model, mode: str, **calibration) -> Model:
    """A copy of ``model`` in ``mode`` (one of MODES); ``calibration`` (samples, seed) applies to int8."""
    if mode == "fp32":
        return copy.deepcopy(model)
    if mode == "fp16":
        return float16_weights(model)
    if mode == "int8":
        return full_int8(model, **calibration)
    raise ValueError(f"unknown quantization {mode!r}; choose one of {', '.join(MODES)}")


# --- graph editing ----------------------------------------------------------------------------

class _Edit:
    """Changes to one subgraph gathered while walking it, then applied at once by :meth:`commit`."""

    def __init__(self, model: Model, sg: Subgraph):
        self.model, self.sg = model, sg
        self.before: dict[int, list[Op]] = defaultdict(list)
        self.after: dict[int, list[Op]] = defaultdict(list)
        number = model.subgraphs.index(sg)
        # signatures name tensors by index; hold the tensors so the names follow them through renumbering
        self.signatures = [(sig, {k: sg.tensors[i] for k, i in sig.inputs.items()},
                            {k: sg.tensors[i] for k, i in sig.outputs.items()})
                           for sig in model.signatures if sig.subgraph_index == number]

    def tensor(self, name: str, dtype: DType, shape: Sequence[int], quant: Quantization | None = None,
               data: np.ndarray | None = None) -> Tensor:
        t = Tensor(len(self.sg.tensors), name, dtype, tuple(shape), quantization=quant, data=data)
        self.sg.tensors.append(t)
        return t

    def convert(self, opcode: str, version: int, source: Tensor, target: Tensor, *,
                before: Op | None = None, after: Op | None = None) -> None:
        """A QUANTIZE / DEQUANTIZE from ``source`` to ``target``, run just before or just after an existing op."""
        op = Op(-1, opcode, [source], [target], version=version)
        if before is not None:
            self.before[id(before)].append(op)
        else:
            self.after[id(after)].append(op)

    def replace_output(self, old: Tensor, new: Tensor) -> None:
        self.sg.outputs = [new if t is old else t for t in self.sg.outputs]
        for _, _, outputs in self.signatures:
            for key, t in outputs.items():
                if t is old:
                    outputs[key] = new

    def commit(self) -> None:
        """Splice in the new ops, drop the tensors nothing refers to any more, renumber and relink."""
        sg = self.sg
        sg.ops = [new for op in sg.ops for new in (*self.before.pop(id(op), ()), op, *self.after.pop(id(op), ()))]
        used = {id(t) for t in (*sg.inputs, *sg.outputs)}
        used.update(id(t) for op in sg.ops for t in (*op.inputs, *op.outputs, *op.intermediates) if t is not None)
        sg.tensors = [t for t in sg.tensors if id(t) in used]
        for i, t in enumerate(sg.tensors):
            t.index = i
        for i, op in enumerate(sg.ops):
            op.index = i
        sg.link()
        for sig, inputs, outputs in self.signatures:
            sig.inputs = {k: t.index for k, t in inputs.items()}
            sig.outputs = {k: t.index for k, t in outputs.items()}


def _per_tensor(scale: float, zero_point: int) -> Quantization:
    return Quantization(np.array([scale], np.float32), np.array([zero_point], np.int64))


# --- float16 weights ----------------------------------------------------------------------------

def float16_weights(model: Model) -> Model:
    """A copy with every float32 constant of a builtin op stored as float16 behind a DEQUANTIZE.

    Custom ops keep float32 constants: they may read them while preparing, where no op has run yet.
    """
    model = copy.deepcopy(model)
    for sg in model.subgraphs:
        edit = _Edit(model, sg)
        widened: dict[int, Tensor] = {}
        for op in sg.ops:
            if op.custom:
                continue
            for i, t in enumerate(op.inputs):
                if t is None or not t.is_constant or t.dtype is not DType.float32:
                    continue
                if id(t) not in widened:
                    half = edit.tensor(t.name, DType.float16, t.shape, data=np.asarray(t.data).astype(np.float16))
                    widened[id(t)] = edit.tensor(f"{t.name}_dequantize", DType.float32, t.shape)
                    edit.convert("DEQUANTIZE", 3, half, widened[id(t)], before=op)
                op.inputs[i] = widened[id(t)]
        edit.commit()
    return model


# --- full int8: which ops, and how -------------------------------------------------------------

@dataclass(frozen=True)
class Int8Rule:
    """How the converter quantizes one op code to int8."""

    version: int | Callable[[Op], int]
    same_scale: bool = False                  # one scale for every real operand: the kernel only moves values
    fixed_output: tuple[float, int] | None = None  # (scale, zero point) the kernel's output table assumes
    weights: tuple[int, int] | None = None    # (input index, channel axis): symmetric per-channel int8
    bias: int | None = None                   # input index of the int32 bias
    activation: int = 0                       # input index of the activation the bias scale derives from

    def version_of(self, op: Op) -> int:
        return self.version(op) if callable(self.version) else self.version


def _fully_connected_version(op: Op) -> int:
    if len(op.inputs) == 2:
        return 6
    return 5 if op.options.get("keep_num_dims") else 4


def _transpose_conv_version(op: Op) -> int:
    if op.options.get("fused_activation_function", "NONE") != "NONE":
        return 4
    return 3 if op.input(3) is not None else 2


def _resize_version(op: Op) -> int:
    corners = op.opcode == "RESIZE_NEAREST_NEIGHBOR" and op.options.get("align_corners")
    return 3 if op.options.get("half_pixel_centers") or corners else 2


def _mul_version(op: Op) -> int:
    """Version 3 marks an output rescale of 1 or more."""
    a, b, out = op.inputs[0], op.inputs[1], op.outputs[0]
    rescale = float(a.quantization.scale[0]) * float(b.quantization.scale[0]) / float(out.quantization.scale[0])
    return 3 if rescale >= 1.0 else 2


_PROBABILITY = (1 / 256, -128)
INT8_RULES: dict[str, Int8Rule] = {
    "CONV_2D": Int8Rule(3, weights=(1, 0), bias=2),
    "DEPTHWISE_CONV_2D": Int8Rule(3, weights=(1, 3), bias=2),
    "FULLY_CONNECTED": Int8Rule(_fully_connected_version, weights=(1, 0), bias=2),
    "TRANSPOSE_CONV": Int8Rule(_transpose_conv_version, weights=(1, 0), bias=3, activation=2),
    "SOFTMAX": Int8Rule(2, fixed_output=_PROBABILITY),
    "LOGISTIC": Int8Rule(2, fixed_output=_PROBABILITY),
    "TANH": Int8Rule(2, fixed_output=(1 / 128, 0)),
    "MUL": Int8Rule(_mul_version),
    "RESIZE_BILINEAR": Int8Rule(_resize_version, same_scale=True),
    "RESIZE_NEAREST_NEIGHBOR": Int8Rule(_resize_version, same_scale=True),
    **{code: Int8Rule(1, same_scale=True) for code in ("RESHAPE", "SQUEEZE")},
    **{code: Int8Rule(2, same_scale=True) for code in (
        "AVERAGE_POOL_2D", "MAX_POOL_2D", "CONCATENATION", "PAD", "PADV2", "TRANSPOSE", "STRIDED_SLICE", "SLICE",
        "MAXIMUM", "MINIMUM")},
    **{code: Int8Rule(2) for code in ("ADD", "SUB", "MEAN", "SUM", "RSQRT", "BATCH_MATMUL", "GELU", "RELU", "RELU6")},
    **{code: Int8Rule(1) for code in ("LEAKY_RELU", "HARD_SWISH", "PRELU")},
}


def int8_rule(op: Op) -> Int8Rule | None:
    """The rule for ``op``, or None when it stays float: a custom op, an op LiteRT has no int8 kernel for,
    or weights and biases computed at run time (the integer kernels take them as constants)."""
    rule = None if op.custom else INT8_RULES.get(op.opcode)
    if rule is not None and any(t is not None and not t.is_constant
                                for t in (op.input(rule.weights[0]) if rule.weights else None,
                                          op.input(rule.bias) if rule.bias is not None else None)):
        return None
    return rule


def _real(t: Tensor | None) -> bool:
    """A float32 operand: the values quantization maps (shapes, axes and indices are left alone)."""
    return t is not None and t.dtype is DType.float32


# --- calibration -------------------------------------------------------------------------------

def calibrate(model: Model, tensors: Iterable[Tensor], samples: int = 8, seed: int = 0) -> dict[int, tuple[float, float]]:
    """(min, max) of each of ``tensors`` (of the main subgraph, by index) over seeded random inputs.

    A copy of the graph, cut down to the ops these tensors depend on and with all of them as outputs,
    runs on the numpy CPU backend: ops nothing observed depends on (a detection post-process, say) never run.
    """
    from .inputs import random_input
    from .session import RunSettings, Session

    if samples < 1:
        raise ValueError(f"calibration needs at least one sample, not {samples}")
    wanted = {t.index for t in tensors}
    probe = copy.deepcopy(model)
    g = probe.main
    observed = [t for t in g.tensors if t.index in wanted and t.producer is not None]
    needed: set[int] = set()
    pending = [t.producer for t in observed]
    while pending:
        op = pending.pop()
        if id(op) not in needed:
            needed.add(id(op))
            pending.extend(t.producer for t in op.inputs if t is not None and t.producer is not None)
    g.ops = [op for op in g.ops if id(op) in needed]
    g.outputs = observed
    g.link()
    probe.signatures = []
    session = Session(probe, RunSettings(backends=[("cpu", {"engine": "numpy"})]))
    rng = np.random.default_rng(seed)
    lows: dict[int, float] = defaultdict(lambda: np.inf)
    highs: dict[int, float] = defaultdict(lambda: -np.inf)
    for _ in range(samples):
        inputs = {t.index: random_input(t, rng) for t in g.inputs}
        values = {**inputs, **session.run_indexed(inputs)}
        for index in wanted & values.keys():
            lows[index] = min(lows[index], float(np.min(values[index])))
            highs[index] = max(highs[index], float(np.max(values[index])))
    session.close()
    return {index: (lows[index], highs[index]) for index in lows}


def _affine(low: float, high: float) -> Quantization:
    """Asymmetric int8 covering [low, high] and zero, the zero point nudged onto the integer grid."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / 255 if high > low else 1.0
    return _per_tensor(scale, int(np.clip(np.round(-128 - low / scale), -128, 127)))


class _ScaleGroups:
    """Tensors that must share quantization (union-find), with the union of their ranges."""

    def __init__(self, ranges: dict[int, tuple[float, float]]):
        self.ranges = ranges
        self.parent: dict[int, int] = {}
        self.fixed: dict[int, tuple[float, int]] = {}

    def root(self, index: int) -> int:
        while self.parent.get(index, index) != index:
            index = self.parent[index]
        return index

    def join(self, tensors: list[Tensor]) -> None:
        roots = {self.root(t.index) for t in tensors}
        if not roots:
            return
        first = roots.pop()
        for r in roots:
            self.parent[r] = first
            if r in self.fixed:
                self.fixed.setdefault(first, self.fixed.pop(r))

    def fix(self, t: Tensor, params: tuple[float, int]) -> None:
        self.fixed.setdefault(self.root(t.index), params)

    def params(self) -> dict[int, Quantization]:
        """Quantization of every tensor with a range, by tensor index."""
        spans: dict[int, tuple[float, float]] = {}
        for index, (low, high) in self.ranges.items():
            lo, hi = spans.get(self.root(index), (low, high))
            spans[self.root(index)] = (min(lo, low), max(hi, high))
        by_root = {r: _per_tensor(*self.fixed[r]) if r in self.fixed else _affine(*span) for r, span in spans.items()}
        return {index: by_root[self.root(index)] for index in self.ranges}


def _symmetric_scales(w: np.ndarray, axis: int) -> np.ndarray:
    others = tuple(a for a in range(w.ndim) if a != axis)
    peak = np.abs(w).max(axis=others).astype(np.float64)
    return np.where(peak > 0, peak / 127, 1.0).astype(np.float32)


def _channels(values: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """Per-channel values shaped to broadcast along ``axis`` of an ``ndim``-dimensional array."""
    shape = [1] * ndim
    shape[axis] = -1
    return values.reshape(shape)


def _quantized_constants(op: Op, rule: Int8Rule, params: dict[int, Quantization]
                         ) -> dict[int, tuple[DType, np.ndarray, Quantization]]:
    """(dtype, data, quantization) of each float constant input of a quantized op, by input index."""
    out = {}
    weight_scales = None
    if rule.weights is not None:
        index, axis = rule.weights
        w = np.asarray(op.inputs[index].data, np.float64)
        weight_scales = _symmetric_scales(w, axis)
        q = np.clip(np.round(w / _channels(weight_scales.astype(np.float64), axis, w.ndim)), -127, 127)
        out[index] = DType.int8, q.astype(np.int8), Quantization(weight_scales, np.zeros(weight_scales.size, np.int64),
                                                               axis)
    if rule.bias is not None and op.input(rule.bias) is not None:
        input_scale = np.float64(params[op.inputs[rule.activation].index].scale[0])
        scales = (input_scale * weight_scales.astype(np.float64)).astype(np.float32)
        bounds = np.iinfo(np.int32)
        q = np.clip(np.round(np.asarray(op.inputs[rule.bias].data, np.float64) / scales), bounds.min, bounds.max)
        out[rule.bias] = DType.int32, q.astype(np.int32), Quantization(scales, np.zeros(scales.size, np.int64), 0)
    for i, t in enumerate(op.inputs):
        if i not in out and _real(t) and t.is_constant:
            quant = params[t.index]
            q = np.clip(np.round(np.asarray(t.data, np.float64) / float(quant.scale[0])) + int(quant.zero_point[0]),
                        -128, 127)
            out[i] = DType.int8, q.astype(np.int8), quant
    return out


# --- full int8 ---------------------------------------------------------------------------------

def full_int8(model: Model, samples: int = 8, seed: int = 0) -> Model:
    """A full-integer copy of ``model``'s main subgraph, calibrated on ``samples`` random inputs.

    The model keeps its float32 inputs and outputs (a QUANTIZE after each input, a DEQUANTIZE before
    each output); boundary tensors keep their names, so signatures and output names do not change.
    """
    model = copy.deepcopy(model)
    sg = model.main
    rules = {id(op): rule for op in sg.ops if (rule := int8_rule(op)) is not None}
    quantized = [op for op in sg.ops if id(op) in rules]
    params = _activation_params(model, quantized, rules, samples, seed)

    for op in quantized:
        for t in op.outputs:
            if _real(t):
                t.dtype, t.quantization = DType.int8, params[t.index]
    edit = _Edit(model, sg)
    as_int8: dict[int, Tensor] = {}
    as_float: dict[int, Tensor] = {}
    for op in list(sg.ops):
        rule = rules.get(id(op))
        if rule is None:
            for i, t in enumerate(op.inputs):
                if t is not None and id(t.producer) in rules:
                    if t.index not in as_float:
                        as_float[t.index] = edit.tensor(f"{t.name}_dequantize", DType.float32, t.shape)
                        edit.convert("DEQUANTIZE", 2, t, as_float[t.index], before=op)
                    op.inputs[i] = as_float[t.index]
            continue
        for i, (dtype, data, quant) in _quantized_constants(op, rule, params).items():
            op.inputs[i] = edit.tensor(op.inputs[i].name, dtype, data.shape, quant, data)
        for i, t in enumerate(op.inputs):
            if _real(t):
                if t.index not in as_int8:
                    as_int8[t.index] = edit.tensor(f"{t.name}_int8", DType.int8, t.shape, params[t.index])
                    edit.convert("QUANTIZE", 1, t, as_int8[t.index], before=op)
                op.inputs[i] = as_int8[t.index]
    for t in list(sg.outputs):
        if id(t.producer) in rules:
            output = edit.tensor(t.name, DType.float32, t.shape)
            t.name = f"{t.name}_int8"
            edit.convert("DEQUANTIZE", 2, t, output, after=t.producer)
            edit.replace_output(t, output)
    for op in quantized:
        op.version = rules[id(op)].version_of(op)
    edit.commit()
    return model


def _activation_params(model: Model, quantized: list[Op], rules: dict[int, Int8Rule], samples: int, seed: int
                       ) -> dict[int, Quantization]:
    """Per-tensor int8 quantization of every real operand of the quantized ops, weights and biases aside."""
    activations = [t for op in quantized for t in (*op.inputs, *op.outputs) if _real(t) and not t.is_constant]
    ranges = calibrate(model, activations, samples, seed)
    for op in quantized:  # other constants take their range from their values
        rule = rules[id(op)]
        special = {rule.bias, rule.weights[0] if rule.weights else None}
        for i, t in enumerate(op.inputs):
            if _real(t) and t.is_constant and i not in special:
                ranges[t.index] = (float(np.min(t.data)), float(np.max(t.data)))
    groups = _ScaleGroups(ranges)
    for op in quantized:
        rule = rules[id(op)]
        if rule.same_scale:
            groups.join([t for t in (*op.inputs, *op.outputs) if _real(t)])
        if rule.fixed_output is not None:
            groups.fix(op.outputs[0], rule.fixed_output)
    return groups.params()
