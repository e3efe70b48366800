"""Recycled CUDA events: creating one costs a driver call, so events return to a pool."""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as drv

from ._driver import check

__all__ = ("EventPool",)


class EventPool:
    """Recycled CUDA events of one kind (loop thread only)."""

    def __init__(self, flags: Any) -> None:
        self._flags = flags
        self._free: list[Any] = []
        self.created = 0

    def take(self) -> Any:
        """An event, reused or new."""
        if self._free:
            return self._free.pop()
        self.created += 1
        return check(drv.cuEventCreate(self._flags), "cuEventCreate")

    def give(self, event: Any) -> None:
        """Return an event no one waits on any more."""
        self._free.append(event)

    def close(self) -> None:
        """Destroy the idle events."""
        for event in self._free:
            drv.cuEventDestroy(event)
        self._free.clear()
