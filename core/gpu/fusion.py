"""Fusion planning shared by the GPU backends: which ops of a partition run as one kernel.

A group is a root op (a convolution, fully connected layer, pooling, an
elementwise op...) followed by the elementwise ops that directly consume its
result: its fused activation, an ADD of another tensor (the residual of a
ResNet block), a MUL by a constant or a per-channel gate, PRELU, further
activations.  The root's kernel applies them as an *epilogue* to each value
before storing it, so the intermediate tensors are never written and each
group costs one launch.  A consumer is absorbed only when it is the sole use
of the value, the value is not needed outside the partition, and the result
keeps the value's shape.

A group runs where its last op was: every tensor it reads was produced
before that point, and nothing else reads the values it keeps in registers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection, Sequence

from ..errors import CompileError
from ..ir import DType, Op, Tensor
from ..passes import Group as PassGroup, constant_chains
from ..passes import chain_link, depthwise_fold_fits, gate_operands  # noqa: F401  (the shared pass's tests)
from .constants import activation_quant, constant_value, int_values, is_folded_dequantize
from .layout import as_nhwc, covers_input, natural_output_shape, same_storage
from .support import BINARY, CONVERSIONS, TRANSPOSE_CONV_BIAS, UNARY, computed_at_compile_time

# Ops whose kernel stores one vector per output position, so it can apply an epilogue there.
EPILOGUE_HOSTS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV", TRANSPOSE_CONV_BIAS,
                            "AVERAGE_POOL_2D", "MAX_POOL_2D", "PAD", "RESIZE_BILINEAR", "SOFTMAX", "STRIDED_SLICE",
                            "MEAN", "DEPTH_TO_SPACE", "CONCATENATION", "PACK"} | set(UNARY) | set(BINARY))


@dataclass(frozen=True)
class Step:
    """One elementwise step of an epilogue.

    ``kind`` is ``unary`` (``name`` an activation, ``params`` its options), ``binary`` (``name`` the op,
    ``operand`` its other input, ``swapped`` when the running value is the op's
    second input), ``quantize`` (round onto the grid ``quant``) or ``swish`` (the value times its
    LOGISTIC rounded onto the grid ``quant``).
    """

    kind: str
    name: str
    operand: Tensor | None = None
    swapped: bool = False
    quant: tuple[float, float, float, float] | None = None
    params: tuple[float, ...] = ()  # a unary op's options that its code takes (LEAKY_RELU's alpha)

    @property
    def scalar(self) -> bool:
        """The operand is one constant value (passed as a number, not read from memory)."""
        return self.operand is not None and self.operand.size == 1 and constant_value(self.operand) is not None

    def signature(self) -> tuple:
        """What the generated code depends on (operand values and grids are arguments)."""
        operand = None if self.operand is None else ("scalar" if self.scalar else "tensor")
        return (self.kind, self.name, operand, self.swapped, self.params)


@dataclass
class Group:
    """A root op and the ops fused into its kernel's epilogue."""

    root: Op
    steps: list[Step] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)

    @property
    def output(self) -> Tensor:
        """The tensor the group stores (the last fused op's result)."""
        return self.ops[-1].outputs[0]

    @property
    def fused(self) -> list[Op]:
        return self.ops[1:]


def activation_steps(op: Op, float_view: bool) -> list[Step]:
    """The op's fused activation, then rounding onto its output grid in the float view (not for a reshape or a
    zero PAD onto its input's own grid: its values lie on it already, so a reshape keeping the PHWC4 bytes runs
    no kernel and a PAD folds into the convolution reading it; an int8 EfficientNet-B0's squeeze-and-excitation
    reshapes ran one each, an int8 MobileNetV2's four PADs too)."""
    steps = []
    act = op.options.get("fused_activation_function", "NONE")
    if act not in ("NONE", None) and op.opcode != "LSTM":
        steps.append(Step("unary", act))
    quant = activation_quant(op.outputs[0]) if float_view and op.outputs else None
    if quant is not None and not (op.opcode in ON_INPUT_GRID and not op.custom and not steps and op.inputs
                                  and activation_quant(op.inputs[0]) == quant):
        steps.append(Step("quantize", "QUANTIZE", quant=quant))
    return steps


def unary_step(op: Op) -> Step:
    """The step computing unary ``op``: its code by name, with the options the code takes."""
    if op.opcode == "LEAKY_RELU":
        return Step("unary", op.opcode, params=(float(op.options.get("alpha", 0.2)),))
    if op.opcode == "GELU" and op.options.get("approximate"):
        return Step("unary", "GELU_APPROXIMATE")
    return Step("unary", op.opcode)


def elementwise_steps(op: Op, value: Tensor, float_view: bool) -> list[Step]:
    """Steps of elementwise ``op`` applied to the running ``value`` (one of its inputs)."""
    if op.opcode == "CAST" and op.outputs[0].dtype is DType.bool and op.inputs[0].dtype is not DType.bool:
        return [Step("unary", "NONZERO")]
    if op.opcode in CONVERSIONS:
        return activation_steps(op, float_view)
    if op.opcode in UNARY:
        return [unary_step(op)] + activation_steps(op, float_view)
    if op.opcode == "ADD_N":  # the running value is the first input (ADD_N is never absorbed)
        return [Step("binary", "ADD", other) for other in op.inputs[1:]] + activation_steps(op, float_view)
    swapped = op.inputs[1] is value and op.inputs[0] is not value
    other = op.inputs[0] if swapped else op.inputs[1]
    return [Step("binary", op.opcode, other, swapped)] + activation_steps(op, float_view)


def is_elementwise(op: Op) -> bool:
    return not op.custom and op.opcode in UNARY + BINARY + CONVERSIONS + ("ADD_N",)


def hosts_epilogue(op: Op) -> bool:
    """Whether following elementwise ops can be fused into the kernel of ``op``.

    Not when the kernel's result needs a relayout afterwards: the epilogue would see the
    positions of the kernel's shape, not of the output the fused ops broadcast against.
    """
    known = op.opcode == TRANSPOSE_CONV_BIAS if op.custom else op.opcode in EPILOGUE_HOSTS
    if not known or len(op.outputs) != 1:
        return False
    return as_nhwc(natural_output_shape(op)) == as_nhwc(op.outputs[0].shape)


def _absorbable(op: Op, value: Tensor, members: Collection[int]) -> bool:
    if id(op) not in members or not is_elementwise(op) or len(op.outputs) != 1 or op.opcode == "ADD_N":
        return False
    if op.outputs[0].shape != value.shape or op.outputs[0].dtype != value.dtype:
        return False
    return op.opcode in UNARY + CONVERSIONS or not (op.inputs[0] is value and op.inputs[1] is value)


def _swish(value: Tensor, keep: Collection[int], members: Collection[int], absorbed: Collection[int],
           float_view: bool) -> tuple[list[Op], tuple | None] | None:
    """([LOGISTIC, MUL], the LOGISTIC's grid) where they compute ``value`` * LOGISTIC(``value``) and nothing else
    reads the LOGISTIC (a converter's swish): one epilogue step, the same operations on the value in registers
    (in the float view of an integer model the LOGISTIC's result rounded onto its grid between them)."""
    if len(value.uses) != 2:
        return None
    logistic = next((u for u in value.uses if u.opcode == "LOGISTIC"), None)
    if logistic is None or len(logistic.outputs) != 1 or logistic.outputs[0].index in keep:
        return None
    sigmoid = logistic.outputs[0]
    product = next((u for u in value.uses if u is not logistic), None)
    if product is None or product.opcode != "MUL" or len(sigmoid.uses) != 1 or sigmoid.uses[0] is not product:
        return None
    gate = activation_steps(logistic, float_view)
    if {id(t) for t in product.inputs} != {id(value), id(sigmoid)} or [s.kind for s in gate] not in ([], ["quantize"]):
        return None
    pair = [logistic, product]
    if any(id(op) not in members or id(op) in absorbed or op.custom for op in pair):
        return None
    if any(op.outputs[0].shape != value.shape or op.outputs[0].dtype != value.dtype for op in pair):
        return None
    return pair, gate[0].quant if gate else None


def plan_groups(ops: Sequence[Op], keep: Collection[int], *, float_view: bool = False,
                can_host: Callable[[Op], bool] = hosts_epilogue, compiling: bool = True) -> list[Group]:
    """Groups of ``ops`` (topologically ordered) in the order their kernels must run.

    ``keep`` holds the indices of tensors that must be stored (partition
    outputs); ``can_host(op)`` says whether the backend's kernel for ``op``
    takes an epilogue of following ops.  Folded DEQUANTIZE ops and shape arithmetic computed at compile time
    form no group; ``compiling``, the latter's value may not leave the partition (the lowering computes none:
    the planner keeps such ops with their reader, ``Planner.with_readers``).
    """
    members = {id(op) for op in ops}
    position = {id(op): i for i, op in enumerate(ops)}
    absorbed: set[int] = set()
    groups: list[Group] = []
    for op in ops:
        if computed_at_compile_time(op):
            if compiling and any(t.index in keep for t in op.outputs):
                raise CompileError(f"{op.describe()}: shape arithmetic computed at compile time is a partition "
                                   f"output; the GPU lowering computes no value for other partitions")
            continue
        if id(op) in absorbed or is_folded_dequantize(op):
            continue
        if is_elementwise(op):
            group = Group(op, elementwise_steps(op, op.inputs[0], float_view), [op])
        else:
            group = Group(op, activation_steps(op, float_view), [op])
        if can_host(op) and len(op.outputs) == 1:  # a kernel storing several outputs takes no epilogue
            value = op.outputs[0]
            while value.index not in keep:
                if len(value.uses) == 1 and id(value.uses[0]) not in absorbed and \
                        _absorbable(value.uses[0], value, members):
                    followers = [value.uses[0]]
                    group.steps += elementwise_steps(followers[0], value, float_view)
                elif (swish := _swish(value, keep, members, absorbed, float_view)):
                    followers, gate = swish
                    step = Step("unary", "SWISH") if gate is None else Step("swish", "SWISH", quant=gate)
                    group.steps += [step] + activation_steps(followers[1], float_view)
                else:
                    break
                group.ops += followers
                absorbed.update(id(f) for f in followers)
                value = followers[-1].outputs[0]
        groups.append(group)
    groups.sort(key=lambda g: position[id(g.ops[-1])])
    return groups


# -- groups done by the kernel reading their result ---------------------------------------------
# The decisions are the kit's; which folds a dialect's kernels implement, and for which readers,
# is declared by the dialect as a ReaderFolds.  Entry points: reader_folds (a partition's groups)
# and placement_groups (the kernels of a graph, for placement and the cost estimate).

@dataclass(frozen=True)
class ReaderFolds:
    """Which groups a dialect's kernels compute inside the kernel reading their result.

    Each field but ``nested`` is None (the dialect does not fold that kind) or a test of the reader:
    ``pad`` a zero PAD of rows and columns, read by a convolution as extra padding; ``gate`` a product
    by one value per channel (a squeeze-and-excitation gate), scaled as a 1x1 convolution reads it (in the
    float view of an integer model rounded onto the product's grid there: ``gate_grid``);
    ``depthwise`` a depthwise convolution (activations and roundings only after it, as a chain's)
    computed where a 1x1 convolution stages its input; ``chain`` a 1x1 convolution of one pixel, through
    activations (and the float view's rounding steps, whose grids ``chain_grids`` gives), run in one
    kernel with the 1x1 convolution reading it; ``reshape`` a reshape moving elements between slices,
    read by a concatenation through the reshape's view of its input.  ``nested``: a folded group may
    itself read the result of another folded group.
    """

    pad: Callable[[Op], bool] | None = None
    gate: Callable[[Op], bool] | None = None
    depthwise: Callable[[Op], bool] | None = None
    chain: Callable[[Op], bool] | None = None
    reshape: Callable[[Op], bool] | None = None
    nested: bool = False


# The fusion kinds of the shared graph passes (delegate.passes.FUSIONS) each reader fold is, so that
# placement groups exactly what a dialect's lowering folds (fusions_of).
PASS_KINDS = {"pad": "pad", "gate": "gate", "depthwise": "depthwise_pointwise", "chain": "chain", "reshape": "reshape"}


def fusions_of(folds: ReaderFolds) -> frozenset[str]:
    """The fusions a GPU backend declares to the planner (``Backend.fusions``) for a lowering with
    ``folds``: every kit kernel folds constant DEQUANTIZEs and applies activations and elementwise
    epilogues; the ops done inside a reader's kernel are the dialect's folds."""
    return frozenset({"constant", "activation", "epilogue"} |
                     {kind for name, kind in PASS_KINDS.items() if getattr(folds, name) is not None})


def pointwise(op: Op) -> bool:
    """A 1x1 convolution with stride 1 and constant weights: a matrix product over pixels."""
    if op.opcode != "CONV_2D" or op.custom:
        return False
    weights = op.inputs[1]
    return (constant_value(weights) is not None and tuple(weights.shape[1:3]) == (1, 1)
            and op.options.get("stride_h", 1) == op.options.get("stride_w", 1) == 1)


def is_matmul(op: Op) -> bool:
    """A convolution that is a matrix product: 1x1 with stride 1, or an undilated window covering the
    whole unpadded input, which gives one output pixel per image."""
    if op.opcode != "CONV_2D" or op.custom:
        return False
    if pointwise(op):
        return True
    o, (_, kh, kw, _) = op.options, op.inputs[1].shape
    undilated = o.get("dilation_h_factor", 1) == o.get("dilation_w_factor", 1) == 1
    return undilated and covers_input(op, op.inputs[0].shape, kh, kw)


def read_by(value: Tensor, readers: Collection[str]) -> Op | None:
    """The one op reading ``value``, when it is one of ``readers`` taking it as its input 0."""
    if len(value.uses) != 1 or value.uses[0].custom or value.uses[0].opcode not in readers:
        return None
    return value.uses[0] if value.uses[0].inputs[0] is value else None


def zero_pad_of_rows_and_columns(op: Op) -> bool:
    """A PAD (with zeros) of only H and W of a 4-D tensor."""
    if op.opcode != "PAD" or op.custom or len(op.inputs[0].shape) != 4:
        return False
    pads = int_values(op.input(1))
    return pads is not None and pads[0] == pads[1] == pads[6] == pads[7] == 0


RESHAPES = ("RESHAPE", "EXPAND_DIMS", "SQUEEZE")
# Ops whose every output value is an input value or zero: onto their input's own grid they round nothing.
ON_INPUT_GRID = RESHAPES + ("PAD",)


def moves_elements(op: Op) -> bool:
    """A reshape whose kernel moves elements between slices (one keeping the PHWC4 bytes runs none)."""
    return op.opcode in RESHAPES and not op.custom and not same_storage(op.inputs[0].shape, op.outputs[0].shape)


def chain_grids(group: Group) -> dict[int, tuple]:
    """The grids of a chained or staged depthwise group's rounding steps (an integer model's float view), by
    step index: its reader's kernel takes them as arguments."""
    return {i: step.quant for i, step in enumerate(group.steps) if step.kind in ("quantize", "swish")}


def gate_grid(group: Group) -> tuple | None:
    """The grid a folded gate product rounds onto where its reader stages it (an integer model's float view),
    else None."""
    return group.steps[1].quant if len(group.steps) == 2 else None


def fold_kind(group: Group, folds: ReaderFolds) -> str | None:
    """How ``group`` is done by the kernel of the one op reading its result ("pad", "gate",
    "depthwise", "chain", "reshape"), or None when it runs its own kernel."""
    # the steps a reader's staging applies: activations, and the float view's roundings (``chain_grids``)
    root, rounding_or_unary = group.root, all(step.kind in ("unary", "quantize", "swish") for step in group.steps)
    if root.custom:
        return None
    if folds.reshape and not group.fused and not group.steps and moves_elements(root) and len(group.output.uses) == 1:
        reader = group.output.uses[0]
        return "reshape" if reader.opcode == "CONCATENATION" and not reader.custom and folds.reshape(reader) else None
    if folds.pad and not group.fused and not group.steps and zero_pad_of_rows_and_columns(root):
        reader = read_by(group.output, ("CONV_2D", "DEPTHWISE_CONV_2D"))
        return "pad" if reader is not None and folds.pad(reader) else None
    reader = read_by(group.output, ("CONV_2D",))
    if reader is None or not pointwise(reader):
        return None
    if (folds.gate and root.opcode == "MUL" and not group.fused and gate_operands(root) and folds.gate(reader)
            and [step.kind for step in group.steps] in (["binary"], ["binary", "quantize"])):
        return "gate"
    if folds.depthwise and root.opcode == "DEPTHWISE_CONV_2D" and rounding_or_unary and depthwise_fold_fits(reader) \
            and folds.depthwise(reader):
        return "depthwise"
    if folds.chain and chain_link(root) and chain_link(reader) and rounding_or_unary and folds.chain(root) \
            and folds.chain(reader):
        return "chain"
    return None


def reader_folds(groups: Sequence[Group], keep: Collection[int], folds: ReaderFolds) -> dict[int, tuple[str, Group]]:
    """The groups of a partition done by their reader's kernel: stored tensor index -> (kind, group).

    A group folds only when its result is not kept (a partition output) and its reader is in the
    partition; without ``folds.nested`` a folded group reads no folded result, and a chain never does.
    """
    members = {id(op) for g in groups for op in g.ops}
    found: dict[int, tuple[str, Group]] = {}
    for group in groups:
        if group.output.index in keep or len(group.output.uses) != 1 or id(group.output.uses[0]) not in members:
            continue
        if not folds.nested and group.root.inputs[0].index in found:
            continue
        kind = fold_kind(group, folds)
        if kind == "chain" and group.root.inputs[0].index in found:
            continue  # the chain's kernel computes its first convolution from that convolution's own input
        if kind is not None:
            found[group.output.index] = (kind, group)
    return found


def runs_no_kernel(op: Op, float_view: bool) -> bool:
    """Whether ``op`` costs no kernel wherever it is: a folded DEQUANTIZE, or a reshape keeping the PHWC4
    bytes that rounds nothing (in the float view a quantized one rounds onto its grid, in a kernel).  What
    a reader's kernel does for its source depends on the partition: ``placement_groups``."""
    if is_folded_dequantize(op) or computed_at_compile_time(op):
        return True
    return (op.opcode in RESHAPES and not op.custom and not moves_elements(op)
            and not activation_steps(op, float_view))


def placement_groups(ops: Sequence[Op], keep: Collection[int], folds: ReaderFolds, *, float_view: bool,
                     can_host: Callable[[Op], bool] = hosts_epilogue) -> list[PassGroup]:
    """The kernels a GPU lowering makes of ``ops``, as the planner's groups (``Backend.placement_groups``):
    each kernel's root with its epilogue, the groups its kernel does while reading them (``reader_folds``),
    and the constant DEQUANTIZEs they read.  Placement then keeps a kernel whole, and its cost counts
    the kernels the lowering runs, not one per op."""
    groups = plan_groups(ops, keep, float_view=float_view, can_host=can_host, compiling=False)
    folded = reader_folds(groups, keep, folds)
    owner = {id(op): g for g in groups for op in g.ops}

    def kernel_of(g: Group) -> Group:
        while g.output.index in folded:
            g = owner[id(g.output.uses[0])]
        return g
    members: dict[int, list[tuple[Op, str]]] = {id(g): [] for g in groups if g.output.index not in folded}
    for g in groups:
        host = kernel_of(g)
        kind = "epilogue" if host is g else PASS_KINDS[folded[g.output.index][0]]
        entries = members[id(host)]
        entries += [(op, kind) for op in (g.fused if host is g else g.ops)]
        for op in g.ops:
            entries += [(c, "constant") for c in constant_chains(op, keep) + _static_operands(op, keep)]
    return [PassGroup(g.root, tuple(op for op, _ in members[id(g)]), tuple(kind for _, kind in members[id(g)]))
            for g in groups if members.get(id(g))]


def _static_operands(op: Op, keep: Collection[int]) -> list[Op]:
    """The ops computed at compile time (``computed_at_compile_time``) making ``op``'s operands, producers
    first: placement keeps them with their reader, which they cost nothing beside."""
    found: list[Op] = []
    for t in op.inputs:
        source = t.producer if t is not None and t.index not in keep else None
        if source is not None and computed_at_compile_time(source):
            found += _static_operands(source, keep) + [source]
    return found
