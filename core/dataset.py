"""Datasets for ``eval`` and ``map``: a folder of images, ``.npy``/``.npz`` shards, or Parquet (through Ray Data).

A sample is one row of the model's batch dimension: an image (preprocessed by the
config's ``input`` section, as ``run`` does), or one row along the first axis of a
shard's arrays.  Every shard's shapes and dtypes are checked when the dataset is
opened, before any model runs; images are checked as they are read.  A dataset is
picklable, so Ray actors read their own batches (``decode``) instead of the driver
shipping the data to them.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import DatasetError, ExecutionError
from .inputs import IMAGE_SUFFIXES, load_image, quantize_for
from .ir import Tensor

ARRAY_SUFFIXES = {".npy", ".npz"}
PARQUET_SUFFIX = ".parquet"


@dataclass(frozen=True)
class Shard:
    """One array file and how many samples it holds."""

    path: str
    rows: int


class Dataset:
    """Samples by id (``file`` for images, ``file:row`` for shards), read in chunks of ``batch`` samples."""

    def __init__(self, spec: str, inputs: Sequence[Tensor], preprocess: Mapping[str, Any], batch: int):
        self.spec, self.inputs, self.preprocess, self.batch = spec, list(inputs), dict(preprocess), batch
        self.images: list[str] = []
        self.shards: list[Shard] = []
        self.parquet = False
        self._open: dict[str, Any] = {}  # this process's open shard; never pickled

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": {}}

    @property
    def size(self) -> int:
        return len(self.images) + sum(s.rows for s in self.shards)

    @property
    def chunks(self) -> int:
        return -(-self.size // self.batch)

    def chunk_ids(self, chunk: int) -> list[str]:
        start, stop = chunk * self.batch, min((chunk + 1) * self.batch, self.size)
        if self.images:
            return self.images[start:stop]
        ids, offset = [], 0
        for shard in self.shards:
            lo, hi = max(start - offset, 0), min(stop - offset, shard.rows)
            ids += [f"{shard.path}:{row}" for row in range(lo, hi)]
            offset += shard.rows
        return ids

    def decode(self, batch: Mapping[str, np.ndarray]) -> tuple[list[str], dict[str, np.ndarray]]:
        """(ids, inputs by tensor name, each with the samples along axis 0) of one batch as the executor
        hands it over: ``{"chunk": [i]}`` for files, the columns themselves for Parquet."""
        if self.parquet:
            return self._columns(batch)
        ids = [i for chunk in np.asarray(batch["chunk"]).ravel() for i in self.chunk_ids(int(chunk))]
        return ids, self._load(ids)

    def _load(self, ids: list[str]) -> dict[str, np.ndarray]:
        if self.images:
            t = self.inputs[0]
            root = Path(self.spec)
            try:
                return {t.name: np.concatenate([load_image(root / i, t, self.preprocess) for i in ids])}
            except ExecutionError as exc:  # an unreadable image: the dataset's fault, named by its file
                raise DatasetError(str(exc)) from None
        rows: dict[str, list[np.ndarray]] = {t.name: [] for t in self.inputs}
        for sample in ids:
            path, _, row = sample.rpartition(":")
            arrays = self._arrays(path)
            for t in self.inputs:
                rows[t.name].append(arrays[t.name][int(row)])
        return {t.name: quantize_for(t, np.stack(rows[t.name])) for t in self.inputs}

    def _arrays(self, path: str) -> dict[str, np.ndarray]:
        if path not in self._open:
            self._open.clear()
            if path.endswith(".npy"):
                self._open[path] = {self.inputs[0].name: np.load(path, mmap_mode="r")}
            else:
                with np.load(path) as archive:
                    self._open[path] = {t.name: archive[_member(archive.files, t, self.inputs, path)]
                                        for t in self.inputs}
        return self._open[path]

    def _columns(self, batch: Mapping[str, np.ndarray]) -> tuple[list[str], dict[str, np.ndarray]]:
        ids = [str(i) for i in batch["id"]] if "id" in batch else []
        inputs = {}
        for t in self.inputs:
            column = batch[_member(list(batch), t, self.inputs, self.spec)]
            rows = np.stack([np.asarray(v) for v in column]) if column.dtype == object else np.asarray(column)
            want = int(np.prod(t.shape[1:]))
            if rows.size != len(column) * want:
                raise DatasetError(f"{self.spec}: column for input {t.name!r} holds {rows.size // max(len(column), 1)}"
                                   f" values per row; the input takes {want} ({list(t.shape[1:])})")
            inputs[t.name] = quantize_for(t, rows.reshape((len(column),) + tuple(t.shape[1:])))
        return ids, inputs


def open_dataset(spec: str, inputs: Sequence[Tensor], preprocess: Mapping[str, Any], batch: int) -> Dataset:
    """A checked dataset: ``spec`` is a folder of images or of array shards, one shard, or Parquet."""
    ds = Dataset(spec, inputs, preprocess, batch)
    path = Path(spec)
    if not path.exists():
        raise DatasetError(f"{spec}: no such dataset (give a folder of images, .npy/.npz shards or Parquet)")
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")) if path.is_dir() \
        else [path]
    kinds = {_kind(p) for p in files} - {None}
    if not kinds:
        raise DatasetError(f"{spec}: no images ({', '.join(sorted(IMAGE_SUFFIXES))}), .npy/.npz shards or "
                           f".parquet files in it")
    if len(kinds) > 1:
        raise DatasetError(f"{spec}: mixes {' and '.join(sorted(kinds))} files; give one kind per dataset")
    kind = kinds.pop()
    chosen = [p for p in files if _kind(p) == kind]
    if kind == "parquet":
        ds.parquet = True
    elif kind == "image":
        if len(inputs) != 1 or len(inputs[0].shape) != 4:
            raise DatasetError(f"{spec}: a folder of images feeds a model of one N,H,W,C input; this model takes "
                               f"{', '.join(f'{t.name} {list(t.shape)}' for t in inputs)}: give .npz shards")
        ds.images = [str(p.relative_to(path)) for p in chosen]
    else:
        ds.shards = [_check_shard(p, inputs) for p in chosen]
        if not ds.size:
            raise DatasetError(f"{spec}: its shards hold no samples")
    return ds


def _kind(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix in ARRAY_SUFFIXES:
        return "array"
    return "parquet" if suffix == PARQUET_SUFFIX else None


def _member(names: Sequence[str], t: Tensor, inputs: Sequence[Tensor], where: str) -> str:
    """The shard member or column holding input ``t``: its tensor name or ``input_N``."""
    for key in (t.name, f"input_{inputs.index(t)}"):
        if key in names:
            return key
    raise DatasetError(f"{where}: nothing for input {t.name!r} (name it {t.name!r} or input_{inputs.index(t)}); "
                       f"it holds {', '.join(map(repr, names)) or 'nothing'}")


def _check_shard(path: Path, inputs: Sequence[Tensor]) -> Shard:
    """Shapes and dtypes from the headers alone: every input present with (n, *sample shape), one n."""
    if path.suffix.lower() == ".npy":
        if len(inputs) != 1:
            raise DatasetError(f"{path}: a .npy shard feeds a model of one input; this model has {len(inputs)}: "
                               f"give .npz shards with one member per input")
        headers = {inputs[0].name: _npy_header(path, open(path, "rb"))}
    else:
        try:
            with zipfile.ZipFile(path) as archive:
                names = [n[:-4] for n in archive.namelist() if n.endswith(".npy")]
                headers = {t.name: _npy_header(path, archive.open(_member(names, t, inputs, str(path)) + ".npy"))
                           for t in inputs}
        except (zipfile.BadZipFile, OSError) as exc:
            raise DatasetError(f"{path}: not a readable .npz ({exc})") from None
    rows = set()
    for t in inputs:
        shape, dtype = headers[t.name]
        if tuple(shape[1:]) != tuple(t.shape[1:]) or len(shape) != len(t.shape):
            raise DatasetError(f"{path}: input {t.name!r} has shape {list(shape)}; samples of this model are "
                               f"[n, {', '.join(map(str, t.shape[1:]))}]")
        if dtype.kind not in "biuf":
            raise DatasetError(f"{path}: input {t.name!r} holds {dtype} values, not numbers")
        rows.add(shape[0])
    if len(rows) != 1:
        raise DatasetError(f"{path}: its inputs hold different numbers of samples ({sorted(rows)})")
    return Shard(str(path), rows.pop())


def _npy_header(path: Path, f) -> tuple[tuple[int, ...], np.dtype]:
    with f:
        try:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
        except (ValueError, OSError, EOFError) as exc:
            raise DatasetError(f"{path}: not a readable .npy array ({exc})") from None
    return shape, dtype

