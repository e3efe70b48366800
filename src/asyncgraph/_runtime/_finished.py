"""A flag set once on the loop's thread, which other threads may wait for (a download's end, for
the host backend's worker threads).

Most such flags are never waited for: a copy or a download between two dispatches of one CUDA
backend is only asked ``is_set()``. A ``threading.Event`` costs a lock and a condition to make and
takes the lock to set, about 3 µs a copy on the copy path; :class:`Finished` makes one only when a
thread waits.
"""

from __future__ import annotations

import threading
from typing import ClassVar

__all__ = ("Download", "Finished")


class Finished:
    """``set()`` once, ``is_set()``, and ``wait()`` from any thread, as ``threading.Event``."""

    __slots__ = ("_event", "_set")

    _making: ClassVar[threading.Lock] = threading.Lock()  # two waiters make one event

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def set(self) -> None:
        """Set the flag, waking the threads that wait."""
        self._set = True
        event = self._event
        if event is not None:
            event.set()

    def is_set(self) -> bool:
        """Whether :meth:`set` was called."""
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is set, or *timeout* seconds passed; whether it is set."""
        if self._set:
            return True
        with Finished._making:
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        if self.is_set():  # set() ran before the event was there to set
            event.set()
        return event.wait(timeout)


class Download:
    """A download in progress, a read use of its buffer (``finished`` once the copy is done)."""

    __slots__ = ("event", "finished")

    def __init__(self) -> None:
        self.finished = Finished()
        self.event: object = None  # the CUDA backend's copy event, once enqueued
