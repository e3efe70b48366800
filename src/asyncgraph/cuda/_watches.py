"""What the completion reactor watches: events per lane, and which of them completed.

A *lane* is one stream's watched events in submission order; work on one stream completes in
order, so the completed ones are always a prefix (``WatchLane.ready`` of them are known).
:func:`next_completed` finds the oldest completed watch of all lanes, querying as little as it
can.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .._exceptions import CudaError
from ._cores import core
from ._driver import NOT_READY, SUCCESS

__all__ = ("Callback", "Watch", "WatchLane", "next_completed")

Callback = Callable[[CudaError | None], None]


class Watch:
    """One watched event and what to call when it completed."""

    __slots__ = ("callback", "event", "finished", "held", "seq")

    def __init__(self, seq: int, event: Any, callback: Callback) -> None:
        self.seq = seq  # the order it was watched in: completions are delivered in this order
        self.event = event
        self.callback = callback
        self.held = False  # handed to the lane's waiter thread
        self.finished = False


class WatchLane:
    """The watched events of one stream, and its waiter thread."""

    __slots__ = ("handed", "index", "last_code", "pending", "queue", "ready", "thread")

    def __init__(self, index: int) -> None:
        self.index = index
        self.pending: deque[Watch] = deque()
        self.ready = 0  # leading pending watches known complete (a newer event completed)
        self.handed: Watch | None = None
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.last_code: Any = SUCCESS  # what the waiter's last cuEventSynchronize returned


def next_completed(
    lanes: list[WatchLane], running: list[bool], checked: list[bool]
) -> tuple[WatchLane | None, Any]:
    """The lane whose head is the oldest watch that completed, and its event's code
    (``SUCCESS``, or the error it failed with); ``(None, NOT_READY)`` when none did.

    Heads are queried oldest first, only when needed: a lane with ``ready`` watches needs no
    query, and a lane whose newest event completed (queried once per poll, *checked*) has all
    of them complete. A lane whose head is still running is marked in *running* and skipped.
    """
    query = core.query
    while True:
        best = None
        seq = 0
        for lane in lanes:
            pending = lane.pending
            if pending and not running[lane.index] and (best is None or pending[0].seq < seq):
                best = lane
                seq = pending[0].seq
        if best is None:
            return None, NOT_READY
        if best.ready:
            return best, SUCCESS
        pending = best.pending
        index = best.index
        if not checked[index] and len(pending) > 1:
            checked[index] = True
            # Work on one stream completes in order: if its newest event completed, so did
            # every older one, and this one query settles them all.
            if query(pending[-1].event)[0] == SUCCESS:
                best.ready = len(pending)
                return best, SUCCESS
        code = query(pending[0].event)[0]
        if code == NOT_READY:
            running[index] = True
            continue
        if code == SUCCESS:
            best.ready = 1
        return best, code
