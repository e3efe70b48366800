"""What the completion reactor watches: events per lane, and which of them completed.

A *lane* is one stream's watched events in submission order; work on one stream completes in
order, so the completed ones are always a prefix (``WatchLane.ready`` of them are known).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver as drv

from .._exceptions import CudaError
from ._driver import NOT_READY, SUCCESS

__all__ = ("Callback", "Watch", "WatchLane", "count_completed", "oldest_ready")

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


def count_completed(lanes: list[WatchLane]) -> tuple[bool, WatchLane | None, Any]:
    """Find how many leading watches of each lane completed (``lane.ready``).

    Returns whether any watch is still running, and the lane whose next unsettled event failed
    with its error code (``None, SUCCESS`` when none did; the lanes after it are not looked at).
    """
    busy = False
    query = drv.cuEventQuery
    for lane in lanes:
        pending = lane.pending
        n = len(pending)
        ready = lane.ready
        if ready == n:
            continue
        # If a lane's newest event completed, so did every older one: one query settles all.
        if n - ready > 1 and query(pending[-1].event)[0] == SUCCESS:
            lane.ready = n
            continue
        while ready < n:
            code = query(pending[ready].event)[0]
            if code == SUCCESS:
                ready += 1
            elif code == NOT_READY:
                busy = True
                break
            else:
                lane.ready = ready
                return busy, lane, code
        lane.ready = ready
    return busy, None, SUCCESS


def oldest_ready(lanes: list[WatchLane]) -> WatchLane | None:
    """The lane whose first watch is the oldest known to have completed, or ``None``."""
    best = None
    seq = 0
    for lane in lanes:
        if lane.ready and (best is None or lane.pending[0].seq < seq):
            best = lane
            seq = lane.pending[0].seq
    return best
