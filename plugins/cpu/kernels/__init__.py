"""CPU kernels, one module per op family; importing this package registers them all."""

from . import elementwise  # noqa: F401
