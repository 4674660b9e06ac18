"""``delegate map MODEL DATASET --out DIR``: batch inference over a dataset, outputs written as shards.

Shards hold ``--shard-size`` samples each, in dataset order: ``part-NNNNN.npz`` in
process, ``part-NNNNN.parquet`` on Ray (one column per output, Ray's tensor
type), each with an ``id`` of every sample; ``map.json`` summarises the run and
lists the files.  ``--out`` must be empty or new: a directory holding only a
previous map's files (those its ``map.json`` lists) is replaced with
``--overwrite``; anything else in it is never touched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DatasetError
from .executor import RayOptions, Throughput, batched_model, resolve_configurations, run_batches, to_runs

SUMMARY = "map.json"


class MapWorker:
    """One session, built once (per Ray actor); a batch in, its outputs by tensor name out."""

    def __init__(self, data: bytes, batch: int, configuration, dataset):
        from .session import Session
        from .tflite.reader import read_model

        self.batch, self.dataset = batch, dataset
        self.session = Session(read_model(data), configuration.settings)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, inputs = self.dataset.decode(batch)
        parts = [{k: v[:n] for k, v in self.session.run(named).items()} for n, named in to_runs(inputs, self.batch)]
        outputs = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return {"id": np.asarray(ids or [""] * len(next(iter(outputs.values()))), dtype=object), **outputs}


def prepare_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` holding anything but a previous map's own files; with ``--overwrite``, remove those."""
    if out.exists() and not out.is_dir():
        raise DatasetError(f"--out {out}: is a file, not a directory")
    present = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not present:
        out.mkdir(parents=True, exist_ok=True)
        return
    ours = set()
    try:
        ours = {SUMMARY, *json.loads((out / SUMMARY).read_text())["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    others = [name for name in present if name not in ours or not (out / name).is_file()]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise DatasetError(f"--out {out}: holds files map did not write ({shown}); give an empty or new directory")
    if not overwrite:
        raise DatasetError(f"--out {out}: holds a previous map's outputs; add --overwrite to replace them")
    for name in present:
        (out / name).unlink()


class ShardWriter:
    """Samples buffered into shards of ``size``; ``map.json`` rewritten after each, so an interrupted run's
    files are still known to be ours."""

    def __init__(self, out: Path, parquet: bool, size: int, summary: dict[str, Any]):
        self.out, self.parquet, self.size, self.summary = out, parquet, size, summary
        self.pending: list[dict[str, np.ndarray]] = []
        self.files: list[str] = []
        self.samples = self.added = 0
        self._save()

    def add(self, batch: dict[str, np.ndarray]) -> None:
        if not any(batch["id"]):  # Parquet without an id column: samples numbered in dataset order
            batch["id"] = np.asarray([f"#{self.added + j}" for j in range(len(batch["id"]))], dtype=object)
        self.added += len(batch["id"])
        self.pending.append(batch)
        while sum(len(b["id"]) for b in self.pending) >= self.size:
            self._flush(self.size)

    def close(self, seconds: float) -> dict[str, Any]:
        while self.pending:
            self._flush(self.size)
        self.summary.update(complete=True, seconds=round(seconds, 3),
                            samples_per_s=round(self.samples / seconds, 2) if seconds else None)
        self._save()
        return self.summary

    def _flush(self, size: int) -> None:
        merged = {k: np.concatenate([b[k] for b in self.pending]) for k in self.pending[0]}
        shard = {k: v[:size] for k, v in merged.items()}
        rest = {k: v[size:] for k, v in merged.items()}
        self.pending = [rest] if len(rest["id"]) else []
        name = f"part-{len(self.files):05d}." + ("parquet" if self.parquet else "npz")
        if self.parquet:
            _write_parquet(self.out / name, shard)
        else:
            np.savez(self.out / name, **{k: v.astype(str) if k == "id" else v for k, v in shard.items()})
        self.files.append(name)
        self.samples += len(shard["id"])
        if "outputs" not in self.summary:
            self.summary["outputs"] = [{"name": k, "shape": list(v.shape[1:]), "dtype": str(v.dtype)}
                                       for k, v in shard.items() if k != "id"]
        self._save()

    def _save(self) -> None:
        self.summary.update(files=list(self.files), samples=self.samples)
        (self.out / SUMMARY).write_text(json.dumps(self.summary, indent=2) + "\n")


def _write_parquet(path: Path, shard: dict[str, np.ndarray]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ray.data.extensions import ArrowTensorArray

    columns = {k: pa.array(v.astype(str)) if k == "id" else ArrowTensorArray.from_numpy(v) for k, v in shard.items()}
    pq.write_table(pa.table(columns), path)


def read_outputs(out: str | Path) -> dict[str, np.ndarray]:
    """A map's outputs (and ``id``) as whole arrays, from its shards in order; either format."""
    out = Path(out)
    files = json.loads((out / SUMMARY).read_text())["files"]
    parts = []
    for name in files:
        if name.endswith(".npz"):
            with np.load(out / name) as archive:
                parts.append({k: archive[k] for k in archive.files})
        else:
            import pyarrow.parquet as pq
            import ray.data.extensions  # noqa: F401  (registers the tensor type the columns are stored as)
            table = pq.read_table(out / name)
            parts.append({k: np.asarray(table.column(k).combine_chunks().to_numpy(zero_copy_only=False))
                          for k in table.column_names})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}


def batch_map(model_spec: str, dataset_spec: str, config, out: str | Path, batch: int = 1, threads: int = 1,
              ray: RayOptions | None = None, overwrite: bool = False, shard_size: int = 1024,
              progress=lambda done, total: None) -> dict[str, Any]:
    """The summary of ``map`` (also written to ``out/map.json``); the Python form of the command."""
    from .cli import read_model_arg
    from .dataset import open_dataset
    from .session import run_settings
    from .tflite.reader import read_model

    _, data, label = read_model_arg(model_spec)
    (configuration,) = resolve_configurations([], model_spec, run_settings(config.for_model(model_spec)), threads)
    data, per_run, note = batched_model(data, batch)
    dataset = open_dataset(dataset_spec, read_model(data).main.inputs, config.input, batch)
    if ray is not None:
        from .executor import import_ray
        import_ray()  # before --out is touched
    out = Path(out)
    prepare_out(out, overwrite)
    writer = ShardWriter(out, ray is not None, shard_size, {
        "model": label, "dataset": dataset_spec, "batch": per_run, "threads": threads,
        "executor": "ray" if ray else "in-process", "complete": False, "notes": [note] if note else []})
    clock = Throughput()
    for part in run_batches(dataset, MapWorker, (data, per_run, configuration, dataset), ray, threads,
                            configuration.uses_gpu, lambda n: progress(n, dataset.size or None), clock=clock):
        writer.add(part)
    throughput = clock.report()
    writer.summary["throughput"] = throughput
    summary = writer.close(throughput["wall_s"])
    if not summary["samples"]:
        raise DatasetError(f"{dataset_spec}: the dataset holds no samples")
    return summary


def cmd_map(args) -> int:
    from .cli import console, emit_json, load_cli_config
    from .evaluate import throughput_line
    from .stdio import progress
    from .executor import ray_options

    config = load_cli_config(args)
    threads = args.threads or config.compile_options().num_threads
    with progress("map", None, "samples") as advance:
        summary = batch_map(args.model, args.dataset, config, args.out, args.batch, threads,
                            ray_options(args, config), args.overwrite, args.shard_size,
                            lambda n, total: advance(parts=n, total=total))
    if args.json:
        emit_json(summary)
        return 0
    c = console()
    c.print(f"[bold]{summary['model']}[/bold] on {summary['dataset']}: {summary['samples']} samples, "
            f"{summary['executor']}, batch {summary['batch']}, {summary['seconds']:.1f} s "
            f"({summary['samples_per_s']:.1f} samples/s)")
    c.print(throughput_line(summary["throughput"]))
    for note in summary["notes"]:
        c.print(f"note: {note}")
    c.print(f"written: {len(summary['files'])} shard(s) and {SUMMARY} in {args.out}")
    return 0
