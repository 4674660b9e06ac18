"""Model inputs from the command line: .npz / .npy files, images, or seeded random data.

Float data for a quantized input is quantized with the tensor's own scale and
zero point; images are resized and normalised as the config's ``input``
section says.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import ExecutionError, InputError
from .ir import Subgraph, Tensor

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}


def quantize_for(t: Tensor, arr: np.ndarray) -> np.ndarray:
    """Float data -> the input's dtype, using its quantization when it has one."""
    target = numeric_dtype(t)
    if arr.dtype.kind not in "biuf":
        raise ExecutionError(f"input {t.name!r} expects {t.dtype.name} numbers, got an array of {arr.dtype}")
    if arr.dtype == target:
        return arr
    if t.quantization is not None and arr.dtype.kind == "f" and target.kind in "iu":
        q = t.quantization
        info = np.iinfo(target)
        values = np.round(arr / q.scale[0]) + q.zero_point[0]
        return np.clip(values, info.min, info.max).astype(target)
    with np.errstate(invalid="ignore", over="ignore"):
        converted = arr.astype(target)
        if arr.dtype.kind == target.kind == "f":  # floats round to floats
            return converted
        wrong = converted.astype(arr.dtype) != arr  # anything else must keep every value (int32 ids, float32)
    if wrong.any():
        at = tuple(int(i) for i in np.argwhere(wrong)[0])
        raise InputError(f"input {t.name!r} is {target} and {int(wrong.sum())} of the {arr.size} {arr.dtype} values "
                         f"given are not exactly representable in it (the first: {arr[at].item()!r} at {list(at)}); "
                         f"convert the data to {target} first")
    return converted


def numeric_dtype(t: Tensor) -> np.dtype:
    """The numpy dtype of input ``t``; string (and other non-numeric) inputs cannot be fed."""
    if t.dtype.numpy is None:
        raise ExecutionError(f"input {t.name!r} is a {t.dtype.name} tensor; only numeric inputs can be given")
    return t.dtype.numpy


def random_input(t: Tensor, rng: np.random.Generator) -> np.ndarray:
    """Seeded data in a plausible range: [-1, 1) floats, the full range of quantized integers."""
    target = numeric_dtype(t)
    if target.kind == "f":
        return rng.uniform(-1.0, 1.0, t.shape).astype(target)
    if target.kind == "b":
        return rng.integers(0, 2, t.shape).astype(bool)
    if t.quantization is not None:
        info = np.iinfo(target)
        return rng.integers(info.min, info.max, t.shape, endpoint=True).astype(target)
    return rng.integers(0, 10, t.shape).astype(target)


_SIGNATURES = {b"\xff\xd8\xff": "a JPEG image", b"\x89PNG": "a PNG image", b"GIF8": "a GIF image",
               b"BM": "a BMP image", b"PK\x03\x04": "a zip archive (an .npz?)"}


def _check_npy(path: Path, file: str) -> None:
    """Refuse a file that is not .npy before numpy guesses it is a pickle (and advises allow_pickle)."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"\x93NUMPY"):
        return
    what = next((name for magic, name in _SIGNATURES.items() if head.startswith(magic)), "no numpy header")
    raise ExecutionError(f"{file}: {what}, not a .npy array; give images as .png/.jpg files and "
                         f"arrays as .npy/.npz (numpy.save, numpy.savez)")


def load_image(path: Path, t: Tensor, preprocess: dict[str, Any]) -> np.ndarray:
    """An image resized to the input's H x W and normalised (mean/std or range, RGB/BGR)."""
    try:
        from PIL import Image
    except ImportError:
        raise ExecutionError("reading images needs Pillow (pip install pillow)") from None
    if len(t.shape) != 4:
        raise ExecutionError(f"input {t.name!r} has shape {list(t.shape)}; an image needs N,H,W,C")
    _, h, w, c = t.shape
    try:
        img = Image.open(path).convert("RGB" if c == 3 else "L").resize((w, h), Image.BILINEAR)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:  # a bomb: more pixels than Pillow's cap
        raise ExecutionError(f"{path}: cannot read image ({exc})") from None
    arr = np.asarray(img, np.float32).reshape(1, h, w, c)
    if (preprocess.get("color") or "RGB").upper() == "BGR" and c == 3:
        arr = arr[..., ::-1]
    if preprocess.get("mean") is not None or preprocess.get("std") is not None:
        mean = np.asarray(preprocess.get("mean", 0.0), np.float32)
        std = np.asarray(preprocess.get("std", 1.0), np.float32)
        arr = (arr - mean) / std
    else:
        lo, hi = preprocess.get("range") or (-1.0, 1.0)
        arr = lo + arr / 255.0 * (hi - lo)
    return quantize_for(t, arr)


def make_inputs(graph: Subgraph, specs: Sequence[str] | None, config: Any = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs by tensor name from ``--input`` specs; inputs not given get seeded random data."""
    tensors = list(graph.inputs)
    by_name = {t.name: t for t in tensors}
    preprocess = dict(getattr(config, "input", None) or {})
    given: dict[str, np.ndarray] = {}

    def target(key: str) -> Tensor:
        if key in by_name:
            return by_name[key]
        if key.startswith("input_") and key[6:].isdigit() and int(key[6:]) < len(tensors):
            return tensors[int(key[6:])]
        raise ExecutionError(f"unknown input {key!r}; the model's inputs are "
                             f"{', '.join(repr(t.name) for t in tensors)} (or input_0, input_1, ...)")

    for spec in specs or []:
        name, _, file = spec.rpartition("=") if "=" in spec else ("", "", spec)
        path = Path(file)
        if not path.exists():
            raise ExecutionError(f"input file {file} does not exist")
        if path.suffix.lower() == ".npz":
            try:
                with np.load(path) as archive:  # members are read here, where a corrupt one is reported
                    members = {key: archive[key] for key in archive.files}
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
                raise ExecutionError(f"{file}: not a readable .npz ({exc})") from None
            for key, value in members.items():
                t = target(key)
                given[t.name] = quantize_for(t, value)
            continue
        t = target(name) if name else tensors[len(given)] if len(given) < len(tensors) else None
        if t is None:
            raise ExecutionError(f"more --input files than the model's {len(tensors)} inputs")
        if path.suffix.lower() in IMAGE_SUFFIXES:
            given[t.name] = load_image(path, t, preprocess)
        else:
            try:
                _check_npy(path, file)
                given[t.name] = quantize_for(t, np.load(path))
            except InputError:
                raise
            except (OSError, ValueError) as exc:
                raise ExecutionError(f"{file}: not a readable .npy ({exc})") from None
    rng = np.random.default_rng(seed)
    return {t.name: given[t.name] if t.name in given else random_input(t, rng) for t in tensors}
