"""A GPU backend's device facts remembered between processes, so that planning needs no open device.

Opening a device costs seconds and memory (this 2-core machine, 2026-12-04: the shipped defaults started
MediaPipe pose_landmark_full in 7.0 s and 289 MB against 1.8 s and 119 MB with the CPU alone, for a plan that
left PoCL and lavapipe idle; wgpu-py spends most of its 3.5 s parsing its C types), while planning needs only
what a device supports, its limits and its kind.  The facts are stored per backend, device request and
environment: the versions of the packages, the environment variables, and the driver manifests (with the
libraries they name) that the plugin says select its driver.  A changed environment is another key; a device
that opens with other facts than remembered replaces them (``Remembered.check``)."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping

from ..digest import sha256
from ..errors import PluginError

_LIBRARY = re.compile(r"(/[^\s\"']+\.(?:so[.\d]*|dylib|dll))")  # a driver library a manifest names
MANIFESTS = (".json", ".icd")  # Vulkan ICD and OpenCL vendor files


@dataclass(frozen=True)
class Environment:
    """What selects a plugin's driver: distributions, environment variables (a name ending in ``*`` is a
    prefix), and globs of driver manifests (``~`` expands); a variable naming a file or a directory of
    manifests adds those."""

    packages: tuple[str, ...] = ()
    variables: tuple[str, ...] = ()
    manifests: tuple[str, ...] = ()

    def signature(self) -> dict[str, Any]:
        """The versions, values and file stats (size, mtime) that, unchanged, leave the devices unchanged."""
        versions = {}
        for name in self.packages:
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                versions[name] = None
        values = {}
        for name in self.variables:
            if name.endswith("*"):
                values.update({k: v for k, v in os.environ.items() if k.startswith(name[:-1])})
            else:
                values[name] = os.environ.get(name)
        files = set()
        for pattern in self.manifests:
            files.update(glob.glob(os.path.expanduser(pattern)))
        for value in values.values():
            for part in (value or "").split(os.pathsep):
                if os.path.isdir(part):
                    files.update(p for suffix in MANIFESTS for p in glob.glob(os.path.join(part, "*" + suffix)))
                elif os.path.isabs(part):
                    files.add(part)
        stats = {}
        for path in sorted(files):
            stats[path] = _stat(path)
            if path.endswith(MANIFESTS):
                try:
                    named = _LIBRARY.findall(Path(path).read_text(errors="replace")[:65536])
                except OSError:
                    continue
                stats.update({lib: _stat(lib) for lib in named})
        return {"packages": versions, "variables": values, "files": stats, "cpus": os.cpu_count()}


def importable(module: str) -> bool:
    """Whether ``module`` would import, without importing it (remembered facts do not outlive the package)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _stat(path: str) -> list[int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_size, info.st_mtime_ns]


def _directory() -> Path:
    from ..cost import profile_dir
    return profile_dir() / "devices"


class Remembered:
    """The remembered facts of one backend's device for one request in this environment."""

    def __init__(self, backend: str, request: Mapping[str, Any], environment: Environment):
        key = json.dumps({"backend": backend, "request": dict(request), "environment": environment.signature()},
                         sort_keys=True, default=str)
        self.backend = backend
        self.path = _directory() / f"{backend}-{sha256(key.encode()).hexdigest()[:20]}.json"

    def facts(self) -> dict[str, Any] | None:
        """The facts stored for this key, or None (none yet, or unreadable)."""
        try:
            facts = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return facts if isinstance(facts, dict) and facts.get("backend") == self.backend else None

    def store(self, facts: Mapping[str, Any]) -> None:
        """Keep ``facts`` for the next process; a directory that cannot be written only loses the shortcut."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(dict(facts), sort_keys=True, default=str))
            os.replace(tmp, self.path)
        except OSError:
            pass

    def check(self, planned_with: Mapping[str, Any], live: Mapping[str, Any]) -> str | None:
        """After the device opened: None when its facts are those the plan used, else why not (the live ones
        are stored, so the next load plans with them)."""
        if _canonical(planned_with) == _canonical(live):
            return None
        self.store(live)
        changed = sorted(k for k in set(planned_with) | set(live) if planned_with.get(k) != live.get(k))
        return (f"the device's facts changed since they were remembered ({', '.join(changed[:5])}): "
                f"this load planned with the old ones; the next plans with the new")


def _canonical(facts: Mapping[str, Any]) -> str:
    return json.dumps(dict(facts), sort_keys=True, default=str)


class LazyDevice:
    """A GPU backend's device: planned with from its remembered facts (opened at once where there are none),
    opened when first used, and then held to the facts the plan used."""

    def __init__(self, backend: str, store: Remembered, module: str, import_module: Callable[[], Any],
                 open_device: Callable[[], Any], facts_of: Callable[[Any], Mapping[str, Any]]):
        if not importable(module):
            import_module()  # raises, saying how to install it
        self.backend, self.store, self.open_device, self.facts_of = backend, store, open_device, facts_of
        self.handle = None
        self.facts = store.facts()
        if self.facts is None:
            self.handle = open_device()
            self.facts = dict(facts_of(self.handle))
            store.store(self.facts)

    def opened(self) -> Any:
        """The open device (context, queue...), opened now if planning used remembered facts."""
        if self.handle is None:
            handle = self.open_device()
            changed = self.store.check(self.facts, self.facts_of(handle))
            if changed:
                raise PluginError(f"{self.backend} backend: {changed}")
            self.handle = handle
        return self.handle
