"""Recycled CUDA events: creating one costs a driver call, so events return to a pool."""

from __future__ import annotations

from typing import Any

import attrs
from cuda.bindings import driver as drv

from ._driver import check

__all__ = ("EventPool", "EventStatistics")


@attrs.frozen(kw_only=True)
class EventStatistics:
    """Counts of a CUDA backend's event pools, frozen at ``CudaBackend.event_statistics()``.

    Attributes:
        created: completion events created so far (a steady state creates none: they are
            recycled).
        idle: completion events back in the pool.
        timing_created: timing events (``timing=True``) created so far.
        timing_idle: timing events back in the pool.
    """

    created: int
    idle: int
    timing_created: int
    timing_idle: int


class EventPool:
    """Recycled CUDA events of one kind (loop thread only)."""

    def __init__(self, flags: Any) -> None:
        self._flags = flags
        # The idle events; the reactor's hot half and the fast path take and give them here
        # directly (a list's pop and append), the rest through take() and give().
        self.idle: list[Any] = []
        self.created = 0

    def take(self) -> Any:
        """An event, reused or new."""
        if self.idle:
            return self.idle.pop()
        self.created += 1
        return check(drv.cuEventCreate(self._flags), "cuEventCreate")

    def give(self, event: Any) -> None:
        """Return an event no one waits on any more."""
        self.idle.append(event)

    def close(self) -> None:
        """Destroy the idle events."""
        for event in self.idle:
            drv.cuEventDestroy(event)
        self.idle.clear()
