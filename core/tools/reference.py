"""LiteRT as the reference runtime: its CPU interpreter (either kernel set) and its GPU accelerator."""

from __future__ import annotations

import os
import tempfile
from typing import Callable, Sequence

import numpy as np

from ..errors import DelegateError

Runner = Callable[[Sequence[np.ndarray]], list[np.ndarray]]


def litert_interpreter_class():
    """LiteRT's Interpreter class, or a one-line error saying how to install it."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise DelegateError("this needs ai-edge-litert, the reference interpreter "
                            "(pip install 'delegate[reference]')") from None
    return Interpreter


def litert_cpu(data: bytes, threads: int = 1, builtin_kernels: bool = False) -> Runner:
    """LiteRT's interpreter on ``data``: a function from inputs (in input order) to outputs (in output order).

    ``builtin_kernels`` selects LiteRT's reference builtin kernels instead of XNNPACK."""
    Interpreter = litert_interpreter_class()
    kwargs = {}
    if builtin_kernels:
        from ai_edge_litert.interpreter import OpResolverType
        kwargs["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    it = Interpreter(model_content=data, num_threads=max(int(threads), 1), **kwargs)
    it.allocate_tensors()
    ins, outs = it.get_input_details(), it.get_output_details()

    def run(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        for d, x in zip(ins, inputs):
            it.set_tensor(d["index"], x)
        it.invoke()
        return [it.get_tensor(d["index"]) for d in outs]
    return run


def litert_gpu(data: bytes, like: Sequence[np.ndarray]) -> Runner:
    """LiteRT's GPU accelerator (CompiledModel), host buffers in and out; raises where it cannot run.

    ``like``: arrays with the outputs' shapes and dtypes."""
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator

    with tempfile.NamedTemporaryFile(suffix=".tflite", delete=False) as f:
        f.write(data)
    try:
        model = CompiledModel.from_file(f.name, hardware_accel=HardwareAccelerator.GPU | HardwareAccelerator.CPU)
    finally:
        os.unlink(f.name)
    ins, outs = model.create_input_buffers(0), model.create_output_buffers(0)

    def run(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        for buf, x in zip(ins, inputs):
            buf.write(x)
        model.run_by_index(0, ins, outs)
        return [buf.read(e.size, e.dtype).reshape(e.shape) for buf, e in zip(outs, like)]
    return run


# Peak memory, each runtime alone in a fresh process (measure.separate_peak_rss).  Neither script imports the
# other runtime: LiteRT's process must not carry delegate's modules, nor delegate's the CLI's.
_PEAK_RSS = """
def peak_rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024.0 for line in f if line.startswith("VmHWM:"))
"""

LITERT_ALONE_SCRIPT = _PEAK_RSS + """
import sys
import numpy as np
from ai_edge_litert.interpreter import Interpreter
it = Interpreter(model_path=sys.argv[1], num_threads=int(sys.argv[2]))
it.allocate_tensors()
for d in it.get_input_details():
    it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
for _ in range(5):
    it.invoke()
print(peak_rss_mb())
"""

# argv: model, the CLI's --config and --backends ("" where not given), then its --set values.  Zero inputs, as
# LiteRT's script gives: random ones would add numpy.random (1-2 MB resident) that neither runtime needs.
DELEGATE_ALONE_SCRIPT = _PEAK_RSS + """
import sys
import numpy as np
import delegate
from delegate.config import load_config
from delegate.inputs import numeric_dtype
from delegate.session import Session, run_settings
path, config, backends = sys.argv[1], sys.argv[2] or None, sys.argv[3] or None
settings = run_settings(load_config(config, overrides=sys.argv[4:], backends=backends).for_model(path))
with open(path, "rb") as f:
    session = Session(delegate.read_model(f.read()), settings)
inputs = session.normalize_inputs([np.zeros(t.shape, numeric_dtype(t)) for t in session.graph.inputs])
for _ in range(5):
    session.run_indexed(inputs)
print(peak_rss_mb())
"""
