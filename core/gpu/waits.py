"""The limit on a wait for a run's device work (``limits.run_timeout_s``), which a GPU backend whose runs only
enqueue applies itself (``Backend.bound_waits``), and the error a wait past it raises."""

from __future__ import annotations


class WaitLimit:
    """Seconds a wait for a run's device work may take (None: no limit), shared by a backend's compiled
    partitions and set by its ``bound_waits``."""

    def __init__(self, seconds: float | None = None):
        self.seconds = seconds

    def exceeded(self) -> TimeoutError:
        """The error of a wait that lasted ``seconds``: the runtime fails the partition with it (fallback)."""
        return TimeoutError(f"the device did not finish a run within {self.seconds:g} s (limits.run_timeout_s)")
