"""Structural check of a graph before placement: every op's operands must fit the op.

Output shapes declared in the file are compared with those the op's shape rule
derives from its inputs, as TFLite's Prepare step would; a mismatch or an
operand the op cannot use is a ModelFormatError naming the op, so no kernel
ever sees an inconsistent model.  Custom ops with a rule (TFLite_Detection_PostProcess)
have their outputs sized by it, as LiteRT's Prepare does whatever the file declares
(converters write placeholders).  Ops without a shape rule are left to their backend.
"""

from __future__ import annotations

from .errors import DelegateError, ModelFormatError, UnsupportedOpError
from .ir import Subgraph
from .shapes import has_rule, infer_output_shapes, propagate


def validate_graph(graph: Subgraph) -> None:
    """Raise ModelFormatError for the first op whose operands do not fit it.

    In a model with dynamic input dimensions the file's intermediate shapes are
    placeholders (converters write batch 1 even past a SPACE_TO_BATCH_ND), so
    they are first recomputed from the inputs, as TFLite does when preparing.
    """
    if any(t.is_dynamic for t in graph.inputs):
        try:
            propagate(graph, strict=False)
        except DelegateError as exc:
            raise ModelFormatError(str(exc)) from None
        except Exception as exc:
            raise ModelFormatError(f"shapes do not follow from the inputs ({type(exc).__name__}: {exc})") from None
    for op in graph.ops:
        if not has_rule(op.opcode):
            continue
        if op.custom:
            _size_outputs(op)
            continue
        if not op.outputs:
            raise ModelFormatError(f"{op.describe()}: has no outputs")
        try:
            shapes = infer_output_shapes(op, len(op.outputs))
        except UnsupportedOpError:
            continue  # its shape depends on values computed at run time; the declared one stands
        except DelegateError as exc:
            raise ModelFormatError(f"{op.describe()}: {exc}") from None
        except Exception as exc:
            raise ModelFormatError(f"{op.describe()}: operands do not fit the op "
                                   f"({type(exc).__name__}: {exc})") from None
        if len(shapes) != len(op.outputs):
            raise ModelFormatError(f"{op.describe()}: has {len(op.outputs)} outputs, its operands give {len(shapes)}")
        for t, shape in zip(op.outputs, shapes):
            if tuple(shape) != t.shape and t.size != 0:
                raise ModelFormatError(f"{op.describe()}: output tensor {t.index} ({t.name!r}) has shape "
                                       f"{list(t.shape)} but its inputs give {list(shape)}")


def _size_outputs(op) -> None:
    try:
        shapes = infer_output_shapes(op, len(op.outputs))
    except DelegateError as exc:
        raise ModelFormatError(f"{op.describe()}: {exc}") from None
    except Exception as exc:
        raise ModelFormatError(f"{op.describe()}: operands do not fit the op ({type(exc).__name__}: {exc})") from None
    if len(shapes) != len(op.outputs):
        raise ModelFormatError(f"{op.describe()}: has {len(op.outputs)} outputs, its operands give {len(shapes)}")
    for t, shape in zip(op.outputs, shapes):
        t.shape = tuple(int(d) for d in shape)
