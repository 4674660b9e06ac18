"""A drop-in for ``ai_edge_litert.interpreter.Interpreter`` running on delegate's backends.

Existing LiteRT code works by changing one import: the same constructor
arguments, methods, detail dictionaries, signature runners and error types
(every error is also the ValueError / RuntimeError LiteRT raises there).
Each subgraph a caller runs (subgraph 0, or a signature's) gets its own
session; its inputs and outputs live in buffers the interpreter owns, so
``tensor(i)()`` is a live view and, as in LiteRT, nothing that could
reallocate them runs while such a view is held.
"""

from __future__ import annotations

import enum
import os
import sys
import threading
from typing import Any, Callable, Mapping

import numpy as np

from .errors import ExecutionError, InputError, PluginError, UnsupportedOpError
from .ir import DType, Model, Subgraph, Tensor
from .memory import aligned_zeros
from .runtime import ModelState
from .shapes import propagate
from .tflite.reader import read_model


class OpResolverType(enum.Enum):
    """LiteRT's kernel-set choice; accepted for compatibility (the config picks delegate's kernels)."""

    AUTO = 0
    BUILTIN = 1
    BUILTIN_REF = 2
    BUILTIN_WITHOUT_DEFAULT_DELEGATES = 3


def load_delegate(library: str, options: dict | None = None):
    """LiteRT delegates are native libraries for LiteRT's runtime; delegate runs its own backends."""
    raise PluginError(f"cannot load LiteRT delegate {library!r}: delegate runs its own backends, "
                      f"chosen in the config (backends:)")


def _numpy_type(t: Tensor):
    if t.dtype is DType.string:
        return np.bytes_
    return t.dtype.numpy.type if t.dtype.numpy is not None else np.object_


def _sparsity(t: Tensor) -> dict[str, Any]:
    s = t.sparsity
    if s is None:
        return {}
    dims = []
    for d in s.dim_metadata:
        if d.format == "DENSE":
            dims.append({"format": 0, "dense_size": d.dense_size})
        else:
            dims.append({"format": 1, "array_segments": np.asarray(d.array_segments, np.int32),
                         "array_indices": np.asarray(d.array_indices, np.int32)})
    return {"traversal_order": np.asarray(s.traversal_order, np.int32),
            "block_map": np.asarray(s.block_map, np.int32), "dim_metadata": dims}


def _details(t: Tensor) -> dict[str, Any]:
    q = t.quantization
    scales = q.scale.astype(np.float32) if q is not None else np.zeros(0, np.float32)
    zero_points = q.zero_point.astype(np.int32) if q is not None else np.zeros(0, np.int32)
    per_tensor = (float(scales[0]), int(zero_points[0])) if q is not None and scales.size == 1 else (0.0, 0)
    sig = t.shape_signature if t.shape_signature is not None else t.shape
    return {
        "name": t.name,
        "index": t.index,
        "shape": np.array(t.shape, np.int32),
        "shape_signature": np.array(sig, np.int32),
        "dtype": _numpy_type(t),
        "quantization": per_tensor,
        "quantization_parameters": {"scales": scales, "zero_points": zero_points,
                                    "quantized_dimension": q.axis if q is not None else 0, "block_size": 0},
        "sparsity_parameters": _sparsity(t),
    }


def _checked_value(t: Tensor, value: Any) -> np.ndarray:
    """``value`` as ``t`` holds it; like LiteRT, types are never converted (float64 is not float32)."""
    arr = np.asarray(value)
    if t.dtype is DType.string:
        if arr.dtype.kind not in "USO":
            raise InputError(f"Cannot set tensor: got {arr.dtype} for string tensor {t.index} ({t.name!r})")
        if arr.dtype.kind == "S":  # whole items: numpy's bytes_ drops trailing NULs, LiteRT keeps them
            raw, size = arr.tobytes(), arr.itemsize
            items = [raw[i * size:(i + 1) * size] for i in range(arr.size)]
        else:
            items = [v.encode() if isinstance(v, str) else bytes(v) for v in arr.ravel()]
        arr = np.array(items + [None], object)[:-1].reshape(arr.shape)
    elif arr.dtype != t.dtype.numpy:
        raise InputError(f"Cannot set tensor: got value of type {arr.dtype} but expected {t.dtype.name} "
                         f"for tensor {t.index} ({t.name!r})")
    if tuple(arr.shape) != t.shape:
        raise InputError(f"Cannot set tensor: dimension mismatch, got shape {list(arr.shape)} but expected "
                         f"{list(t.shape)} for tensor {t.index} ({t.name!r})")
    return arr


def _empty(t: Tensor) -> np.ndarray:
    """A zeroed input buffer, on a cache line as LiteRT's tensors are: the kernels read it in place, and a
    64-byte vector read across two lines costs two loads (a 28x28x192 depthwise layer reading numpy's
    16-byte-aligned array took 49 us against 39 aligned, the 2-core VM)."""
    if t.dtype is DType.string:
        return np.full(t.shape, b"", object)
    return aligned_zeros(t.shape, t.dtype.numpy if t.dtype.numpy is not None else np.int32)


class Interpreter:
    """LiteRT-compatible interpreter; ``config`` (path or Config) picks backends and precision.

    One instance may be shared by threads: invocations take turns, and each thread's
    set_tensor/invoke/get_tensor see the values it set and the outputs of its own last
    invoke (a value set by another thread is used only where this one set none).
    """

    def __init__(self, model_path: str | os.PathLike | None = None, model_content: bytes | None = None,
                 experimental_delegates: Any = None, num_threads: int | None = None,
                 experimental_op_resolver_type: Any = OpResolverType.AUTO,
                 experimental_preserve_all_tensors: bool = False,
                 experimental_disable_delegate_clustering: bool = False,
                 experimental_default_delegate_latest_features: bool = False,
                 experimental_compress_quantization_zero_points: bool = False,
                 experimental_disable_delegate_node_fusion: bool = False,
                 experimental_force_delegate_node_profiling: bool = False, *, config: Any = None):
        if getattr(experimental_op_resolver_type, "name", None) not in OpResolverType.__members__:
            raise InputError(f"Unrecognized passed in op resolver type: {experimental_op_resolver_type}")
        if num_threads is not None:
            if not isinstance(num_threads, int):
                raise InputError("type of num_threads should be int")
            if num_threads < 1:
                raise InputError("num_threads should >= 1")
            from .config_schema import MAX_THREADS
            if num_threads > MAX_THREADS:
                raise InputError(f"num_threads must be at most {MAX_THREADS} on this machine, got {num_threads}")
        if experimental_delegates:
            raise PluginError("experimental_delegates: LiteRT delegates cannot run here; delegate places ops "
                              "on the backends of its config")
        if model_path is not None and model_content is not None:
            raise InputError("Can't both provide `model_path` and `model_content`")
        if model_path is None and model_content is None:
            raise InputError("`model_path` or `model_content` must be specified.")
        self._model: Model = read_model(model_path if model_path is not None else model_content)
        self._config = config
        self._num_threads = num_threads
        self._preserve = bool(experimental_preserve_all_tensors)
        self._experimental_compress_quantization_zero_points = experimental_compress_quantization_zero_points
        # The subgraphs' own inputs and outputs; with preserve_all_tensors every tensor an op computes
        # becomes an output of its subgraph too, so the sessions keep it.
        self._io = [(list(g.inputs), list(g.outputs)) for g in self._model.subgraphs]
        if self._preserve:
            for g, (_, outputs) in zip(self._model.subgraphs, self._io):
                kept = {t.index for t in outputs}
                g.outputs = outputs + [t for op in g.ops for t in op.outputs if t.index not in kept]
        self._sessions: dict[int, Any] = {}
        self._state = ModelState(self._model)  # resource variables, shared by every subgraph's session
        self._buffers = _ThreadBuffers()
        self._lock = threading.Lock()
        # Outputs stay on their devices until read: per subgraph, the outputs its last invoke left unread
        # (whose buffers, which run), and the outputs read since, which the next invoke reads back at once.
        self._pending: dict[int, _Pending] = {}
        self._read: dict[int, set[int]] = {}

    # -- set-up -------------------------------------------------------------
    def _graph(self, subgraph: int) -> Subgraph:
        n = len(self._model.subgraphs)
        if not 0 <= subgraph < n:
            raise InputError(f"Invalid subgraph index {subgraph} exceeds max subgraph index {n}")
        return self._model.subgraphs[subgraph]

    def allocate_tensors(self) -> None:
        self._ensure_safe()
        self._allocate(0)

    def _allocate(self, subgraph: int) -> None:
        """Plan and compile ``subgraph`` for its current input shapes (once per shape change)."""
        if subgraph in self._sessions:
            return
        from .config import load_config
        from .session import Session, run_settings

        config = self._config
        if config is None or isinstance(config, (str, os.PathLike)):
            overrides = [f"num_threads={self._num_threads}"] if self._num_threads else []
            config = load_config(config, overrides=overrides)
        self._graph(subgraph)
        self._sessions[subgraph] = Session(self._model, run_settings(config), subgraph=subgraph, state=self._state,
                                           host_first=True)
        self._buffers.allocate(subgraph, self._io[subgraph][0])
        self._pending.pop(subgraph, None)
        self._read.pop(subgraph, None)

    def _session(self, subgraph: int):
        session = self._sessions.get(subgraph)
        if session is None:
            raise ExecutionError("Invoke called on model that is not ready: call allocate_tensors() first")
        return session

    def _safe_to_run(self) -> bool:
        """Whether no numpy view of the interpreter's buffers is alive (LiteRT's rule, by refcount)."""
        idle = _refcount_unviewed()
        return all(_references(buf) <= idle[buf.base is None] for bufs in self._buffers.mine().values()
                   for buf in bufs.values())

    def _ensure_safe(self) -> None:
        if not self._safe_to_run():
            raise ExecutionError("There is at least 1 reference to internal data in the interpreter in the form "
                                 "of a numpy array or slice; hold the function tensor() returns, not the array")

    # -- details ------------------------------------------------------------
    def num_subgraphs(self) -> int:
        return len(self._model.subgraphs)

    def get_input_details(self) -> list[dict[str, Any]]:
        return [_details(t) for t in self._io[0][0]]

    def get_output_details(self) -> list[dict[str, Any]]:
        return [_details(t) for t in self._io[0][1]]

    def get_tensor_details(self, subgraph_index: int = 0) -> list[dict[str, Any]]:
        n = len(self._model.subgraphs)
        if not 0 <= subgraph_index < n:
            raise InputError(f"subgraph_index is out of range: {subgraph_index} for the model, "
                             f"which has {n} subgraphs.")
        return [_details(t) for t in self._model.subgraphs[subgraph_index].tensors]

    def _tensor(self, tensor_index: int, subgraph_index: int = 0) -> Tensor:
        tensors = self._graph(int(subgraph_index)).tensors
        if not 0 <= int(tensor_index) < len(tensors):
            raise InputError(f"Invalid tensor index {tensor_index} exceeds max tensor index {len(tensors)}")
        return tensors[int(tensor_index)]

    def _get_tensor_details(self, tensor_index: int, subgraph_index: int) -> dict[str, Any]:
        return _details(self._tensor(tensor_index, subgraph_index))

    def _get_op_details(self, op_index: int) -> dict[str, Any]:
        ops = self._model.main.ops
        if not 0 <= int(op_index) < len(ops):
            raise InputError(f"Invalid node index {op_index}")
        op = ops[int(op_index)]
        return {"index": int(op_index), "op_name": op.opcode,
                "inputs": np.array([-1 if t is None else t.index for t in op.inputs], np.int32),
                "outputs": np.array([t.index for t in op.outputs], np.int32),
                "operand_types": [_numpy_type(t) for t in op.inputs if t is not None],
                "result_types": [_numpy_type(t) for t in op.outputs]}

    def _get_ops_details(self) -> list[dict[str, Any]]:
        return [self._get_op_details(i) for i in range(len(self._model.main.ops))]

    @property
    def experimental_compress_quantization_zero_points(self) -> bool:
        return self._experimental_compress_quantization_zero_points

    # -- shapes -------------------------------------------------------------
    def resize_tensor_input(self, input_index: int, tensor_size, strict: bool = False) -> None:
        """Change an input's shape; shapes downstream are re-inferred, buffers remade at allocate_tensors()."""
        self._ensure_safe()
        self._resize(0, input_index, tensor_size, strict)

    def _resize(self, subgraph: int, input_index: int, tensor_size, strict: bool) -> None:
        t = self._input(subgraph, input_index)
        new_shape = tuple(int(d) for d in tensor_size)
        if new_shape == t.shape:
            return
        if strict:
            sig = t.shape_signature if t.shape_signature is not None else t.shape
            if len(sig) != len(new_shape) or any(old != -1 and old != new for old, new in zip(sig, new_shape)):
                raise ExecutionError(f"input {t.name!r}: strict resize may change only the dimensions its "
                                     f"shape signature {list(sig)} leaves unknown (-1)")
        if any(d < 0 for d in new_shape):
            raise InputError(f"input {t.name!r}: dimensions must be >= 0, got {list(new_shape)}")
        if len(new_shape) != len(t.shape):
            raise InputError(f"input {t.name!r}: cannot resize {list(t.shape)} to {list(new_shape)}")
        old_shape, t.shape = t.shape, new_shape
        try:
            propagate(self._graph(subgraph))
        except UnsupportedOpError as exc:
            t.shape = old_shape
            propagate(self._graph(subgraph))
            raise ExecutionError(str(exc)) from None
        self._sessions.pop(subgraph, None)
        self._buffers.drop(subgraph)
        self._pending.pop(subgraph, None)

    def _input(self, subgraph: int, index: int) -> Tensor:
        inputs = self._io[subgraph][0]
        for t in inputs:
            if t.index == index:
                return t
        raise InputError(f"tensor {index} is not an input; inputs are {[t.index for t in inputs]}")

    # -- running ------------------------------------------------------------
    def set_tensor(self, tensor_index: int, value: Any) -> None:
        """Copy ``value`` into an input; whole-model checks wait for invoke()."""
        self._set(0, tensor_index, value)

    def _set(self, subgraph: int, tensor_index: int, value: Any) -> None:
        t = self._tensor(tensor_index, subgraph)
        self._settle(subgraph)
        buffers = self._buffers.mine().get(subgraph)
        if buffers is None or t.index not in buffers:
            raise InputError(f"Cannot set tensor {t.index} ({t.name!r}): only allocated inputs can be set; "
                             f"call allocate_tensors() first")
        value = _checked_value(t, value)
        if buffers[t.index].dtype == object:
            buffers[t.index][...] = value
        else:
            np.copyto(buffers[t.index], value)
        self._buffers.wrote(subgraph)

    def invoke(self) -> None:
        self._invoke(0, ensure_safe=True)

    def _invoke(self, subgraph: int, ensure_safe: bool = False) -> None:
        session = self._session(subgraph)
        with self._lock:  # one run at a time; each thread reads and writes its own buffers
            self._settle_locked(subgraph, superseded=True)
            if ensure_safe:
                self._ensure_safe()
            buffers = self._buffers.mine()[subgraph]

            def keep(results: Mapping[int, np.ndarray], owned: frozenset[int]) -> None:
                """The run's outputs into this thread's output buffers: copied once where a backend reuses its
                own, taken as they are where the run made them for itself (LiteRT's engine copies each
                output out of its interpreter: a second copy of a 1.8 MB output took 120 us on the 2-core VM)."""
                for index, value in results.items():
                    _keep(buffers, index, value, index in owned)
            outputs = [t.index for t in session.output_tensors()]
            read = self._read.get(subgraph)  # None before the first invoke: every output
            wanted = outputs if read is None else [i for i in outputs if i in read]
            run = session.run_into({t.index: buffers[t.index] for t in self._io[subgraph][0]}, keep, wanted)
            left = set(outputs) - set(wanted)
            if left:
                self._pending[subgraph] = _Pending(buffers, run, left)
            self._read[subgraph] = set()
            self._buffers.wrote(subgraph)

    def _settle(self, subgraph: int, index: int | None = None) -> None:
        """Before a look at ``subgraph``'s buffers: its last invoke's outputs still on the devices read into
        the buffers of the thread that invoked, all of them when another thread looks (the next run would
        replace them), else ``index`` alone."""
        if subgraph in self._pending:
            with self._lock:
                self._settle_locked(subgraph, index=index)

    def _settle_locked(self, subgraph: int, index: int | None = None, superseded: bool = False) -> None:
        pending = self._pending.get(subgraph)
        if pending is None:
            return
        if pending.thread != threading.get_ident():
            indices = sorted(pending.indices)
        elif superseded:  # the same thread runs again: nobody can read those values any more
            indices = []
        else:
            indices = [index] if index in pending.indices else []
        session = self._sessions[subgraph]
        for i in indices:
            session.fetch_into(i, pending.run, lambda value, i=i: _keep(pending.buffers, i, value))
            pending.indices.discard(i)
        if superseded or not pending.indices or pending.thread != threading.get_ident():
            del self._pending[subgraph]

    def reset_all_variables(self) -> None:
        """Variable tensors (and resource variables) back to their initial values, as after allocation."""
        for session in self._sessions.values():
            session.reset_state()

    def get_tensor(self, tensor_index: int, subgraph_index: int = 0) -> np.ndarray:
        """A copy of an input, output or constant (every tensor with experimental_preserve_all_tensors)."""
        return np.array(self._value(tensor_index, subgraph_index))

    def _value(self, tensor_index: int, subgraph_index: int) -> np.ndarray:
        t = self._tensor(tensor_index, subgraph_index)
        subgraph = int(subgraph_index)
        self._settle(subgraph, t.index)
        read = self._read.get(subgraph)
        if read is not None:
            read.add(t.index)
        buffers = self._buffers.mine().get(subgraph, {})
        if t.index in buffers:
            return buffers[t.index]
        if t.data is not None and not t.is_variable:
            view = np.asarray(t.data).view()
            view.flags.writeable = False
            return view
        raise InputError(f"tensor {t.index} ({t.name!r}) has no value: only inputs, outputs and constants "
                         f"are kept (experimental_preserve_all_tensors=True keeps every tensor)")

    def tensor(self, tensor_index: int) -> Callable[[], np.ndarray]:
        """A function giving a live numpy view of the tensor's buffer (do not keep the view itself)."""
        return lambda: self._value(tensor_index, 0)[...]

    # -- signatures ----------------------------------------------------------
    def get_signature_list(self) -> dict[str, dict[str, list[str]]]:
        return {s.key: {"inputs": sorted(s.inputs), "outputs": sorted(s.outputs)} for s in self._model.signatures}

    def get_signature_runner(self, signature_key: str | None = None) -> "SignatureRunner":
        if signature_key is None:
            if len(self._model.signatures) != 1:
                raise InputError(f"SignatureDef signature_key is None and model has {len(self._model.signatures)} "
                                 f"Signatures. None is only allowed when the model has 1 SignatureDef")
            signature_key = self._model.signatures[0].key
        return SignatureRunner(self, signature_key)


def _keep(buffers: dict[int, np.ndarray], index: int, value: np.ndarray, owned: bool = False) -> None:
    """``value`` copied into the output buffer ``index`` (made, or remade for a new shape, as needed); an
    ``owned`` value (made for this run alone, nothing else holds it) becomes the buffer itself."""
    value, kept = np.asarray(value), buffers.get(index)
    if owned and value.flags.c_contiguous and value.flags.writeable and value.base is None:
        buffers[index] = value
    elif kept is None or kept.shape != value.shape or kept.dtype != value.dtype:
        buffers[index] = np.array(value)
    elif kept is not value:
        np.copyto(kept, value)


class _Pending:
    """The outputs an invoke left on the devices: whose buffers they go to, from which run."""

    def __init__(self, buffers: dict[int, np.ndarray], run: int, indices: set[int]):
        self.buffers, self.run, self.indices = buffers, run, indices
        self.thread = threading.get_ident()


def _references(buf: np.ndarray) -> int:
    """``sys.getrefcount`` of the array owning ``buf``'s memory: the buffer itself, or, for an input buffer laid
    on a cache line (a view of a larger array), that array, which every view of the buffer references."""
    return sys.getrefcount(buf if buf.base is None else buf.base)


def _refcount_unviewed() -> tuple[int, int]:
    """What ``_references`` reports for a buffer nobody views, (a view on a cache line, an array of its own),
    measured the way _safe_to_run measures (once: it is the interpreter's own constant, and measuring it cost
    ~3 us an invoke)."""
    if not _UNVIEWED:
        probe = {0: {0: aligned_zeros(1, np.float32), 1: np.zeros(1)}}
        counts = {buf.base is None: _references(buf) for bufs in probe.values() for buf in bufs.values()}
        _UNVIEWED.append((counts[False], counts[True]))
    return _UNVIEWED[0]


_UNVIEWED: list[tuple[int, int]] = []


class _ThreadBuffers:
    """Each thread's own input and output buffers, laid out as allocate_tensors() last laid them out, so an
    Interpreter shared by threads gives every thread the answer to its own inputs (set_tensor, invoke and
    get_tensor of one thread see only that thread's values).  A thread's first look copies the values
    some thread wrote last, so values set before threads start are seen by all of them."""

    def __init__(self):
        self._layout: dict[int, tuple[int, list[Tensor]]] = {}  # subgraph -> (generation, input tensors)
        self._generation = 0
        self._changes = 0  # layouts allocated or dropped: a thread's view of its buffers stands until this moves
        self._local = threading.local()
        self._latest: dict[int, tuple[int, dict[int, np.ndarray]]] = {}  # the buffers written last, by subgraph

    def allocate(self, subgraph: int, inputs: list[Tensor]) -> None:
        self._generation += 1
        self._changes += 1
        self._layout[subgraph] = (self._generation, list(inputs))

    def drop(self, subgraph: int) -> None:
        self._layout.pop(subgraph, None)
        self._changes += 1

    def wrote(self, subgraph: int) -> None:
        """This thread just wrote ``subgraph``'s buffers: threads that look later start from them."""
        self._latest[subgraph] = self._local.held[subgraph]

    def mine(self) -> dict[int, dict[int, np.ndarray]]:
        """This thread's buffers by subgraph (fresh ones for a layout it has not seen); the view of the last call
        while no layout changed (set_tensor, invoke and get_tensor each look: ~2 us a look)."""
        changes, seen = self._changes, getattr(self._local, "view", None)
        if seen is not None and seen[0] == changes:
            return seen[1]
        held = getattr(self._local, "held", None)
        if held is None:
            held = self._local.held = {}
        for subgraph in [sg for sg in held if sg not in self._layout]:
            del held[subgraph]
        for subgraph, (generation, inputs) in self._layout.items():
            if held.get(subgraph, (None,))[0] != generation:
                latest = self._latest.get(subgraph)
                held[subgraph] = (generation, {i: np.array(b) for i, b in latest[1].items()}) \
                    if latest is not None and latest[0] == generation else \
                    (generation, {t.index: _empty(t) for t in inputs})
        view = {sg: bufs for sg, (_, bufs) in held.items()}
        self._local.view = (changes, view)
        return view


class SignatureRunner:
    """Calls a signature with keyword inputs and returns its outputs by signature name.

    Inputs of another shape resize the signature's subgraph first, as LiteRT's runner does.
    """

    def __init__(self, interpreter: Interpreter | None = None, signature_key: str | None = None):
        if not interpreter:
            raise InputError("None interpreter provided.")
        if not signature_key:
            raise InputError("None signature_key provided.")
        signatures = {s.key: s for s in interpreter._model.signatures}
        if signature_key not in signatures:
            raise InputError(f'Invalid signature_key provided: "{signature_key}".')
        self._interpreter = interpreter
        self._signature = signatures[signature_key]
        self._subgraph = self._signature.subgraph_index

    def _details(self, mapping: dict[str, int]) -> dict[str, dict[str, Any]]:
        return {name: self._interpreter._get_tensor_details(i, self._subgraph) for name, i in mapping.items()}

    def get_input_details(self) -> dict[str, dict[str, Any]]:
        return self._details(self._signature.inputs)

    def get_output_details(self) -> dict[str, dict[str, Any]]:
        return self._details(self._signature.outputs)

    def __call__(self, **inputs: Any) -> dict[str, np.ndarray]:
        expected = self._signature.inputs
        if len(inputs) != len(expected):
            raise InputError(f"Invalid number of inputs provided for running a SignatureDef, "
                             f"expected {len(expected)} vs provided {len(inputs)}")
        it, sub = self._interpreter, self._subgraph
        for name, value in inputs.items():
            if name not in expected:
                raise InputError(f"Invalid Input name ({name}) for SignatureDef")
            it._resize(sub, expected[name], np.shape(value), False)
        it._allocate(sub)
        for name, value in inputs.items():
            it._set(sub, expected[name], value)
        it._invoke(sub)
        return {name: it.get_tensor(i, sub) for name, i in self._signature.outputs.items()}


class InterpreterWithCustomOps(Interpreter):
    """LiteRT's interpreter with custom-op registerers; delegate's custom kernels come from plugins
    (the ``delegate_custom_kernels`` hook), so registerers other than none are refused."""

    def __init__(self, custom_op_registerers: list | None = None, **kwargs: Any):
        if custom_op_registerers:
            raise PluginError("custom_op_registerers register kernels into LiteRT's resolver; give delegate "
                              "custom kernels through a plugin's delegate_custom_kernels hook instead")
        super().__init__(**kwargs)
