"""CPU kernels, one module per op family; importing this package registers them all."""

from . import activations, batch_space, control_flow, conv, convert, custom, elementwise, hybrid, lstm  # noqa: F401
from . import pool, reduce, resize, shape_ops, spectral  # noqa: F401
from . import quantized, quant_lstm  # noqa: F401
