"""A batched hand-off from worker threads to the event loop.

Worker threads (host workers, the CUDA waiter thread) post completions; the first post after
the loop drained wakes it with one ``call_soon_threadsafe``, and the loop then handles the
items in posting order, in drains bounded by time, as the CUDA reactor's polls are: a drain
stops once ``DRAIN_BUDGET`` has passed (after ``MIN_ITEMS`` items at least, so it never comes
down to one), and if items are left it drains again with a plain ``call_soon``, one loop
iteration later, so the loop's other callbacks (and the tasks the drain woke) run in between.
Until the deque is empty, that chain of drains counts as the one drain scheduled: posts
meanwhile only queue. Posting never blocks and never runs user code.

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
from time import perf_counter
from typing import Any, Generic, TypeVar

import structlog

__all__ = ("Inbox", "kick", "off_loop_lock", "settle")

T = TypeVar("T")

_log = structlog.get_logger("asyncgraph")

# A drain's own work (handling items) stops after this long, once MIN_ITEMS are handled.
DRAIN_BUDGET = 150e-6
# A drain handles at least this many items (of those posted), however slow each one is.
MIN_ITEMS = 8

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
        "_again",
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
        # A drain is scheduled or running, and has not yet found the deque empty (any thread).
        self._scheduled = False
        # A drain scheduled by a drain (call_soon) has not run yet (the loop's thread only).
        self._again = False
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
        """Handle everything posted so far, on the loop's thread (no time budget)."""
        items = self._items
        while items:
            self._handle(items.popleft())

    def _drain(self, again: bool = False) -> None:
        """The loop callback: handle items in posting order for up to ``DRAIN_BUDGET`` seconds
        (``MIN_ITEMS`` at least), then drain again in the next loop iteration if items are left.

        *again*: this drain was scheduled by a drain (``call_soon``), not by a post.
        """
        if again:
            self._again = False
        elif self._again:
            # A second drain woken by posts that raced each other (or the check below): the
            # drain already queued handles the items, so the loop's work stays bounded.
            return
        items = self._items
        handle = self._handle
        # _scheduled stays set while items are handled: a post meanwhile only queues.
        deadline = perf_counter() + DRAIN_BUDGET
        done = 0
        try:
            while True:
                while items:
                    if done >= MIN_ITEMS and perf_counter() > deadline:
                        # Enough for one loop iteration: the rest in the next one, after the
                        # loop's other callbacks (no cross-thread wake-up needed for it).
                        self._drain_soon()
                        return
                    handle(items.popleft())
                    done += 1
                # Reset the flag, then look again: a post that queued after the loop above found
                # the deque empty saw the flag still set and woke nobody, so its item is ours;
                # a post after the reset set the flag again and woke the loop itself.
                self._scheduled = False
                if not items or self._scheduled:
                    return
                self._scheduled = True
        except BaseException:
            # Raised out of this callback, for the loop to report like any callback's error;
            # what is left is handled in the next loop iteration.
            self._drain_soon()
            raise

    def _drain_soon(self) -> None:
        """Drain again in the next loop iteration (the loop's thread; _scheduled is set)."""
        if not self._again:
            self._loop.call_soon(self._drain, True)
            self._again = True

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
