"""Fleet sweeps: ``delegate calibrate --ray`` and ``delegate bench --suite --ray`` on every node of a Ray cluster.

One Ray task per alive node, pinned to it (node affinity, not soft: a node that goes away fails its task instead
of handing it to another node) and holding all of the node's CPUs and GPUs, so that every device of the node is
visible to it and nothing else Ray schedules runs beside the measurement.  Each task runs the code the local
command runs (:func:`delegate.tools.calibrate.calibrate_all`, :func:`delegate.suite.run_suite`) and sends back
its rows (nodes sharing a host in turn); here they become one table keyed by node (hostname, node id) and device
(backend, device name and the fingerprint of the device's stable facts).  The profiles a node calibrated come
back with its rows and are stored here under their fingerprint, so a plan made on this machine for a device of
that fingerprint uses them (and ``delegate plan`` names the file) although the device never ran here.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable

from .errors import DelegateError
from .executor import connect, import_ray, raised


def on_every_node(fn: Callable[..., Any], args: tuple, address: str | None = None) -> list[dict[str, Any]]:
    """``fn(*args)`` once on every alive node of the cluster at ``address`` (or RAY_ADDRESS, else a local Ray);
    per node: ``node`` (hostname), ``node_id`` and ``result``, or ``error`` (``kind``, ``message``).  Nodes
    that share a host run in turn, one of each host at a time: their measurements would take each other's cores
    (two nodes of one 2-core machine calibrating at once: the speed check refused the calibration)."""
    ray = connect(import_ray(), address)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(max_retries=0)(_node_task)
    by_host: dict[str, list[dict[str, Any]]] = {}
    for node in (n for n in ray.nodes() if n.get("Alive")):
        by_host.setdefault(node.get("NodeManagerAddress") or node["NodeID"], []).append(node)
    results: dict[str, dict[str, Any]] = {}
    for turn in range(max((len(nodes) for nodes in by_host.values()), default=0)):
        pending = []
        for node in (nodes[turn] for nodes in by_host.values() if turn < len(nodes)):
            resources = node.get("Resources", {})
            pending.append((node, task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
                num_cpus=resources.get("CPU", 0), num_gpus=resources.get("GPU", 0)).remote(fn, args)))
        for node, ref in pending:
            entry = {"node": node.get("NodeManagerHostname", "?"), "node_id": node["NodeID"]}
            try:
                entry.update(ray.get(ref))
            except Exception as exc:  # Ray's own failure (the node lost, the task's worker killed): its last line
                last = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
                entry["error"] = {"kind": "ExecutionError",
                                  "message": f"the Ray task failed: {type(exc).__name__}: {last}"}
            results[node["NodeID"]] = entry
    return [results[n["NodeID"]] for nodes in by_host.values() for n in nodes]


def _node_task(fn: Callable[..., Any], args: tuple) -> dict[str, Any]:
    """A DelegateError comes back as data: one node's failure is a row of the table, not the sweep's end."""
    try:
        return {"result": fn(*args)}
    except DelegateError as exc:
        return {"error": {"kind": type(exc).__name__, "message": str(exc)}}


def failure(nodes: list[dict[str, Any]]) -> DelegateError | None:
    """The first node's error, rebuilt (its class sets the exit code); None when every node succeeded."""
    for entry in nodes:
        if "error" in entry:
            return raised(entry["error"]["kind"], f"node {entry['node']}: {entry['error']['message']}")
    return None


def device_key(backend: str, info: dict[str, Any]) -> dict[str, Any]:
    """How the table names a device: its backend, a readable name (the CPU model for the host, with the
    engine where the backend has several) and the fingerprint its profile is stored under."""
    from .cost import fingerprint

    name = info.get("cpu_model") if info.get("device") == "host" else None
    name = str(name or info.get("device") or info.get("adapter") or "-")
    if info.get("engine"):
        name += f" ({info['engine']})"
    return {"backend": backend, "device": name, "fingerprint": fingerprint(info)}


def _node_fields(entry: dict[str, Any]) -> dict[str, Any]:
    return {"node": entry["node"], "node_id": entry["node_id"]}


def _nodes_doc(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**_node_fields(e), **({"error": e["error"]} if "error" in e else {})} for e in nodes]


# -- calibrate --------------------------------------------------------------------------

def calibrate(settings, address: str | None = None) -> dict[str, Any]:
    """Every node calibrates its backends; each profile it produced is stored here under its fingerprint.

    ``profiles``: a row per node and device (``profile``: where it is stored here, ``node_profile``: on the
    node); ``workloads``, ``skipped``, ``refused``: rows per node and backend, as ``calibrate`` reports them;
    ``speed``: each node's speed check."""
    from .cost import DeviceProfile, save_profile

    nodes = on_every_node(_calibrate_here, (settings,), address)
    doc: dict[str, Any] = {"nodes": _nodes_doc(nodes), "profiles": [], "workloads": [], "skipped": [],
                           "refused": [], "speed": []}
    for entry in nodes:
        report, where = entry.get("result"), _node_fields(entry)
        if report is None:
            continue
        for row, stored in zip(report["profiles"], report["stored"]):
            info = stored["device_info"]
            profile = DeviceProfile(**{k: v for k, v in stored.items() if k in DeviceProfile.__dataclass_fields__})
            path = save_profile(info, profile)
            doc["profiles"].append({**where, **device_key(row["backend"], info), **row, "profile": str(path),
                                    "node_profile": row["profile"]})
        doc["workloads"] += [{**where, "backend": name, **w} for name, ws in report["workloads"].items() for w in ws]
        for key in ("skipped", "refused"):
            doc[key] += [{**where, "backend": name, "reason": why} for name, why in report[key].items()]
        doc["speed"].append({**where, **report["speed"]})
    return doc


def _calibrate_here(settings) -> dict[str, Any]:
    """``calibrate`` on this node, with the profiles it stored (device facts included) to send back."""
    from .tools.calibrate import calibrate_all

    report = calibrate_all(settings)
    report["stored"] = [json.loads(Path(row["profile"]).read_text()) for row in report["profiles"]]
    return report


# -- bench --suite ----------------------------------------------------------------------

def suite(models: list[tuple[str, bytes]], configs: list[str] | None, runs: int, threads: int, preference: str,
          out: Path, command: str, address: str | None = None) -> dict[str, Any]:
    """Every node runs the suite; ``rows``: its rows keyed by node and by the device each configuration runs
    on (its first backend); each node's reports (suite.md, .csv, .png) are written to ``out/HOST-NODEID``."""
    nodes = on_every_node(_suite_here, (models, configs, runs, threads, preference, command), address)
    doc: dict[str, Any] = {"nodes": _nodes_doc(nodes), "rows": [], "files": []}
    for entry in nodes:
        result, where = entry.get("result"), _node_fields(entry)
        if result is None:
            continue
        doc["rows"] += [{**where, **result["devices"][row["config"]], **row} for row in result["rows"]]
        directory = out / f"{entry['node']}-{entry['node_id'][:8]}"
        directory.mkdir(parents=True, exist_ok=True)
        for name, content in result["files"].items():
            (directory / name).write_bytes(content)
            doc["files"].append(str(directory / name))
    return doc


LITERT_GPU = {"backend": "litert", "device": "LiteRT GPU accelerator", "fingerprint": None}


def _suite_here(models, configs, runs, threads, preference, command) -> dict[str, Any]:
    """``bench --suite`` on this node: its rows, the devices its configurations ran on, its report files."""
    from .suite import CONFIGS, run_suite

    with tempfile.TemporaryDirectory(prefix="delegate-suite-") as tmp:
        rows, written = run_suite(models, configs, runs, threads, Path(tmp), lambda label: None, preference,
                                  command)
        files = {p.name: p.read_bytes() for p in written}
    devices = {c.name: _device_of(*c.backends[0], threads) for c in CONFIGS if not configs or c.name in configs}
    devices["litert-gpu"] = LITERT_GPU
    return {"rows": [r.__dict__ for r in rows], "devices": devices, "files": files}


def _device_of(name: str, options: dict[str, Any], threads: int) -> dict[str, Any]:
    """The device a configuration's rows ran on, keyed as its profile is at the suite's thread count."""
    from .config import available_cores
    from .cost import profile_info
    from .plugins import default_manager

    try:
        backend = default_manager().create(name, options)
        info = profile_info(backend, threads or available_cores())
        backend.close()
    except Exception as exc:  # not on this node: its rows say why they failed
        return {"backend": name, "device": f"unavailable ({str(exc).splitlines()[0][:80]})", "fingerprint": None}
    return device_key(name, info)
