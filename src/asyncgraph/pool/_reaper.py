"""Frees that must not run on the caller's thread, run in order by one background thread.

Freeing pinned memory waits until the whole device is idle, so it never runs on the thread that
asks for it, which is usually an event loop's. A free may also be asked for from a garbage
collector's finalizer (``PinnedMemory.__del__``, the last numpy array over lent memory going
away), on any thread and in the middle of any code: inside ``concurrent.futures``' own
``submit``, for one, which holds a module-wide lock that a nested ``submit`` would wait on
forever (a copy thread's ``submit`` made a ``Future``, the collector ran, and the thread hung
with the event loop waiting on it). So handing work over takes no lock here: it is one
``queue.SimpleQueue.put``, which Python documents as safe to call from ``__del__`` methods and
weakref callbacks. The thread is started on ordinary paths (a pool made, a flush asked for),
never from a finalizer, and again in a forked child, which has none.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

from asyncgraph._runtime._telemetry import logger as _log

__all__ = ("Reaper",)


class Reaper:
    """One daemon thread that runs what it is given, in order.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], object] | Future[None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def start(self) -> None:
        """Start the thread unless it runs (never call this from a finalizer)."""
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                thread.start()
                self._thread = thread

    def submit(self, fn: Callable[[], object]) -> None:
        """Run *fn* on the thread, after what was submitted before; safe from a finalizer on
        any thread (it takes no lock). An exception it raises is logged and dropped."""
        self._queue.put(fn)

    def flushed(self) -> Future[None]:
        """A future that completes once everything submitted so far has run."""
        self.start()
        marker: Future[None] = Future()
        self._queue.put(marker)
        return marker

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, Future):
                if item.set_running_or_notify_cancel():
                    item.set_result(None)
                continue
            try:
                item()
            except Exception as exc:  # a free that failed: nothing waits on it
                _log.warning("pool.free_failed", error=repr(exc))

    def _forget(self) -> None:
        # A forked child has no thread, and what the parent queued is the parent's to free.
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread = None
