"""Plugin manager façade: loads backend plugins from entry points and answers who offers what.

Honours a disable list (config ``disable_plugins`` or the ``DELEGATE_DISABLE_PLUGINS``
environment variable, comma separated) and checks that every hook a plugin
implements is a known spec, so a misspelt hook fails loudly instead of silently.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import pluggy

from . import hookspecs
from .backend import ACCELERATOR, API_VERSION, HOST, ROLES, Backend, BackendInfo
from .errors import PluginError

ENTRY_POINT_GROUP = "delegate.backends"
DISABLE_ENV = "DELEGATE_DISABLE_PLUGINS"
HOST_WORD = "cpu"  # what configs and the command line call the host backend
log = logging.getLogger(__name__)


@dataclass
class BackendStatus:
    """What ``delegate backends`` shows for one backend."""

    name: str
    plugin: str
    available: bool
    reason: str
    description: str
    role: str = ACCELERATOR


class PluginManager:
    """Discovers plugins once and hands out backend descriptors by name."""

    def __init__(self, disable: Iterable[str] = (), load_entry_points: bool = True,
                 extra_plugins: Iterable[Any] = (), trace: bool = False):
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        env = [p.strip() for p in os.environ.get(DISABLE_ENV, "").split(",") if p.strip()]
        self.disabled = set(disable) | set(env)
        for name in self.disabled:
            self.pm.set_blocked(name)
        self.load_errors: dict[str, str] = {}
        if load_entry_points:
            self._load_entry_points()
        for plugin in extra_plugins:
            self.pm.register(plugin)
        self.pm.check_pending()
        if trace:
            self.pm.trace.root.setwriter(lambda msg: log.debug("hook: %s", msg.rstrip()))
            self.pm.enable_tracing()
        self._backends: dict[str, tuple[BackendInfo, str]] | None = None

    def _load_entry_points(self) -> None:
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in self.disabled or self.pm.is_registered(ep.name) or self.pm.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must not break discovery
                self.load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
                log.info("backend plugin %r failed to load: %s", ep.name, exc)
                continue
            self.pm.register(plugin, name=ep.name)

    @property
    def hook(self):
        return self.pm.hook

    def backends(self) -> dict[str, tuple[BackendInfo, str]]:
        """name -> (descriptor, plugin name), merged over all plugins."""
        if self._backends is None:
            found: dict[str, tuple[BackendInfo, str]] = {}
            for impl in self.pm.hook.delegate_backends.get_hookimpls():
                try:
                    infos = list(impl.function() or [])
                except Exception as exc:
                    self.load_errors[impl.plugin_name] = f"{type(exc).__name__}: {exc}"
                    continue
                for info in infos:
                    if info.api_version != API_VERSION:
                        self.load_errors[info.name] = (f"speaks plugin API {info.api_version}, "
                                                       f"this delegate speaks {API_VERSION}")
                        continue
                    if info.role not in ROLES:
                        self.load_errors[info.name] = f"declares role {info.role!r}, not one of {', '.join(ROLES)}"
                        continue
                    if info.name in self.disabled:
                        continue
                    found.setdefault(info.name, (info, impl.plugin_name))
            self._backends = found
        return self._backends

    def backend_info(self, name: str) -> BackendInfo:
        backends = self.backends()
        if name in self.disabled:
            raise PluginError(f"backend {name!r} is disabled (disable_plugins or {DISABLE_ENV})")
        if name not in backends:
            known = ", ".join(sorted(backends)) or "none"
            extra = f" ({self.load_errors[name]})" if name in self.load_errors else ""
            raise PluginError(f"unknown backend {name!r}{extra}; installed backends: {known}")
        return backends[name][0]

    def resolve(self, name: str) -> str:
        """The backend a config's name means: ``cpu`` is the host backend, whatever its plugin calls it."""
        if name == HOST_WORD and name not in self.backends():
            return self.host() or name
        return name

    def create(self, name: str, options: Mapping[str, Any] | None = None) -> Backend:
        """Build backend ``name`` with ``options``, its role set from its descriptor and the other plugins'
        custom kernels added: the one way a session gets a backend."""
        info = self.backend_info(name)
        backend = info.factory(dict(options or {}))
        if not isinstance(backend, Backend):
            raise PluginError(f"backend {name!r}: its factory returned {type(backend).__name__}, not a Backend")
        backend.role = info.role
        backend.add_custom_kernels(self.custom_kernels(name))
        return backend

    def host(self) -> str | None:
        """The name of the installed host backend (role HOST), the first one when several are; None when none is."""
        return next((name for name, (info, _) in self.backends().items() if info.role == HOST), None)

    def status(self) -> list[BackendStatus]:
        rows = []
        for name, (info, plugin) in sorted(self.backends().items()):
            try:
                ok, reason = info.available()
            except Exception as exc:
                ok, reason = False, f"availability check failed: {exc}"
            reason = " ".join(str(reason or "").split())  # one line in the table, whatever a driver said
            rows.append(BackendStatus(name, plugin, bool(ok), reason, info.description, info.role))
        for name, err in sorted(self.load_errors.items()):
            if name not in self.backends():
                rows.append(BackendStatus(name, name, False, f"plugin failed to load: {err}", ""))
        return rows

    def custom_kernels(self, backend: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for result in self.pm.hook.delegate_custom_kernels(backend=backend):
            if result:
                merged.update(result)
        return merged

    def graph_passes(self) -> list[Any]:
        return [p for result in self.pm.hook.delegate_graph_passes() if result for p in result]


_MANAGERS: dict[frozenset[str], PluginManager] = {}


def default_manager(disable: Iterable[str] = ()) -> PluginManager:
    """The process-wide manager built from installed entry points, less the plugins in ``disable``
    (the config's ``disable_plugins``); one per disable list, created on first use."""
    key = frozenset(disable)
    if key not in _MANAGERS:
        _MANAGERS[key] = PluginManager(disable=key)
    return _MANAGERS[key]
