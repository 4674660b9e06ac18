"""Plugin manager façade: loads backend plugins from entry points and answers who offers what.

Honours a disable list (config ``disable_plugins`` or the ``DELEGATE_DISABLE_PLUGINS``
environment variable, comma separated) and checks that every hook a plugin
implements is a known spec, so a misspelt hook fails loudly instead of silently.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Iterable

import pluggy

from . import hookspecs
from .backend import API_VERSION, BackendInfo
from .errors import PluginError

ENTRY_POINT_GROUP = "delegate.backends"
DISABLE_ENV = "DELEGATE_DISABLE_PLUGINS"
log = logging.getLogger(__name__)


@dataclass
class BackendStatus:
    """What ``delegate backends`` shows for one backend."""

    name: str
    plugin: str
    available: bool
    reason: str
    description: str


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

    def status(self) -> list[BackendStatus]:
        rows = []
        for name, (info, plugin) in sorted(self.backends().items()):
            try:
                ok, reason = info.available()
            except Exception as exc:
                ok, reason = False, f"availability check failed: {exc}"
            reason = " ".join(str(reason or "").split())  # one line in the table, whatever a driver said
            rows.append(BackendStatus(name, plugin, bool(ok), reason, info.description))
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
