"""A batched hand-off from worker threads to the event loop.

Worker threads (host workers, the CUDA waiter thread) post completions; the first post after the
loop drained wakes it with one ``call_soon_threadsafe``, and the loop then handles every item
posted up to that moment in one batch. Posting never blocks and never runs user code.

Once the loop is closed nothing runs it any more, so a post handles its items on the posting
thread instead: a dispatch still completes, and a thread blocked in ``pending.result()``
returns. Those off-loop handlers hold :data:`off_loop_lock`, which serialises them with each
other and with a backend that settles, from another loop, what its ended loop left
(:func:`settle`).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import structlog

__all__ = ("Inbox", "kick", "off_loop_lock", "settle")

T = TypeVar("T")

_log = structlog.get_logger("asyncgraph")

# Held while items of a closed loop are handled off its thread (rare: only after a loop ended).
off_loop_lock = threading.RLock()
_inboxes: weakref.WeakSet[Inbox[Any]] = weakref.WeakSet()  # changed under off_loop_lock


class Inbox(Generic[T]):
    """Items posted from any thread, handled in batches on the event loop's thread.

    Args:
        loop: the loop whose thread runs *handle*.
        handle: called on the loop's thread with each item, in posting order; once the loop
            is closed, on the posting thread under :data:`off_loop_lock`.
        off_loop: called instead of *handle* once the loop is closed, if given.
        on_closed: called by :func:`kick` (under :data:`off_loop_lock`) once the loop is
            closed, for posters that would otherwise never post again.
    """

    __slots__ = (
        "__weakref__",
        "_handle",
        "_items",
        "_loop",
        "_off_loop",
        "_on_closed",
        "_scheduled",
        "wakeups",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        handle: Callable[[T], None],
        off_loop: Callable[[T], None] | None = None,
        on_closed: Callable[[], None] | None = None,
    ) -> None:
        self._loop = loop
        self._handle = handle
        self._off_loop = off_loop if off_loop is not None else handle
        self._on_closed = on_closed
        self._items: deque[T] = deque()
        self._scheduled = False
        self.wakeups = 0
        with off_loop_lock:
            _inboxes.add(self)

    def post(self, item: T) -> None:
        """Queue *item* (thread-safe; never blocks, except on the lock once the loop closed)."""
        self._items.append(item)
        if not self._scheduled:
            self._scheduled = True
            self.wakeups += 1
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:
                # The loop is closed: nobody else is left to hand the item to.
                self._drain_off_loop()

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

    def _drain_off_loop(self) -> None:
        with off_loop_lock:
            self._scheduled = False
            items = self._items
            while items:
                item = items.popleft()
                try:
                    self._off_loop(item)
                except Exception as exc:  # a worker thread must not die of it
                    _log.error("inbox.handler_failed", error=repr(exc), exc_info=exc)


def settle(loop: asyncio.AbstractEventLoop) -> None:
    """Handle, here, what inboxes of *loop* (closed) hold: posts it took but never ran.

    Later posts to them are handled on their posting threads.
    """
    with off_loop_lock:
        for inbox in _of(loop):
            inbox._drain_off_loop()


def _of(loop: asyncio.AbstractEventLoop) -> list[Inbox[Any]]:
    """The inboxes of *loop* (under :data:`off_loop_lock`)."""
    return [inbox for inbox in _inboxes if inbox._loop is loop]


def kick(loop: asyncio.AbstractEventLoop) -> None:
    """*loop* is closed and a thread waits for one of its dispatches: ask every inbox's
    poster to finish what it watches (a CUDA reactor hands each busy lane to its waiter)."""
    if not loop.is_closed():
        return
    with off_loop_lock:
        # Posts the loop took but never ran (it closed first): later posts would only queue
        # behind them.
        settle(loop)
        for inbox in _of(loop):
            if inbox._on_closed is None:
                continue
            try:
                inbox._on_closed()
            except Exception as exc:  # the waiting thread must not fail of it
                _log.error("inbox.kick_failed", error=repr(exc), exc_info=exc)
