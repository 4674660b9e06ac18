"""Hook specifications: the contract between delegate and its backend plugins.

A plugin is a module (or object) with functions marked ``@hookimpl`` and is
found through the ``delegate.backends`` entry-point group::

    # pyproject.toml of a third-party plugin
    [project.entry-points."delegate.backends"]
    mygpu = "mygpu_delegate.plugin"

    # mygpu_delegate/plugin.py (a plugin imports delegate only through delegate.plugin_api)
    from delegate.plugin_api import HOST, BackendInfo, hookimpl

    @hookimpl
    def delegate_backends():
        return [BackendInfo("mygpu", factory=MyGpuBackend, available=probe)]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

import pluggy

PROJECT = "delegate"
if TYPE_CHECKING:
    from .backend import BackendInfo

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def delegate_backends() -> Iterable[BackendInfo]:
    """Return the backends this plugin offers (registration hook; results of all plugins are merged).

    Each is a :class:`delegate.BackendInfo` naming the backend, its factory, an
    availability probe that never raises, its role (one host per session) and its options::

        @hookimpl
        def delegate_backends():
            return [BackendInfo("cpu", factory=CpuBackend, role=HOST, options={"engine": {"enum": ["numpy"]}})]
    """


@hookspec
def delegate_custom_kernels(backend: str) -> dict[str, Any] | None:
    """Contribute kernels for custom ops to an existing backend (all results merged).

    Receives the backend name; returns ``{custom_code: kernel}`` in the form that
    backend documents (for ``cpu``: a factory ``fn(op) -> run(inputs, outputs)``),
    or None when the plugin has nothing for it::

        @hookimpl
        def delegate_custom_kernels(backend):
            if backend == "cpu":
                return {"MyCustomOp": my_custom_op_factory}
    """


@hookspec
def delegate_graph_passes() -> Iterable[Any] | None:
    """Contribute graph passes run before placement (all results merged, in plugin order).

    A pass is a callable ``fn(subgraph) -> bool`` that rewrites the graph in
    place and returns whether it changed anything::

        @hookimpl
        def delegate_graph_passes():
            return [fold_my_pattern]
    """


@hookspec
def delegate_plan_ready(plan: Any) -> None:
    """Observe a finished placement plan (e.g. to log or export it); return value ignored.

    Called again with each new revision (``plan.revision``), e.g. when a partition falls back to the host;
    a plan once given is never changed afterwards::

        @hookimpl
        def delegate_plan_ready(plan):
            print(plan.summary())
    """
