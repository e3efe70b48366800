"""A batched hand-off from worker threads to the event loop.

Worker threads (host workers, the CUDA waiter thread) post completions; the first post after the
loop drained wakes it with one ``call_soon_threadsafe``, and the loop then handles every item
posted up to that moment in one batch. Posting never blocks and never runs user code.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ("Inbox",)

T = TypeVar("T")


class Inbox(Generic[T]):
    """Items posted from any thread, handled in batches on the event loop's thread.

    Args:
        loop: the loop whose thread runs *handle*.
        handle: called on the loop's thread with each item, in posting order.
    """

    __slots__ = ("_handle", "_items", "_loop", "_scheduled", "wakeups")

    def __init__(self, loop: asyncio.AbstractEventLoop, handle: Callable[[T], None]) -> None:
        self._loop = loop
        self._handle = handle
        self._items: deque[T] = deque()
        self._scheduled = False
        self.wakeups = 0

    def post(self, item: T) -> None:
        """Queue *item* (thread-safe; never blocks)."""
        self._items.append(item)
        if not self._scheduled:
            self._scheduled = True
            self.wakeups += 1
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:
                # The loop is closed: nobody is left to hand the item to.
                self._scheduled = False

    def drain(self) -> None:
        """Handle everything posted so far, on the loop's thread."""
        self._drain()

    def _drain(self) -> None:
        # Reset the flag first: a post racing with this drain either lands in the loop below
        # or schedules another drain, never neither.
        self._scheduled = False
        items = self._items
        while items:
            self._handle(items.popleft())
