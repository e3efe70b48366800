"""The reactor's waiter threads: they sleep in ``cuEventSynchronize`` and wake the event loop.

The reactor hands a lane's oldest event to the lane's waiter once polling found nothing to do
for a while (``Reactor._hand_off``); when the event completed, the reactor hears of the lane on
the loop's thread (its ``woken``), with the driver's code in ``lane.last_code``. Two kinds of
waiter do this, and the reactor cannot tell them apart:

- **native** (the compiled core's ``NativeWaiter``): POSIX threads outside Python, one per lane,
  which write to an eventfd the loop watches with ``add_reader``. The loop wakes in its
  selector; a completion never waits for the GIL, and no Python runs off the loop.
- **Python threads** (the pure-Python path, and loops without ``add_reader``): each posts its
  lane to an :class:`~asyncgraph._inbox.Inbox`, which wakes the loop with
  ``call_soon_threadsafe``.

After the loop closed, a Python waiter settles the reactor on its own thread (the inbox's
``off_loop`` handler); native threads cannot run Python, so then the thread that asks for a
result settles it instead (``Reactor._closed_loop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, Protocol

from cuda.bindings import driver as drv

from .._inbox import Inbox
from .._telemetry import logger as _log
from ._cores import core
from ._watches import WatchLane

__all__ = ("Joinable", "Waiters")


class Joinable(Protocol):
    """What closing leaves to join, off the loop: a thread, or the native threads."""

    def join(self, timeout: float | None = None) -> object: ...

    def is_alive(self) -> bool: ...


class Waiters:
    """The waiter threads of one reactor's lanes, native where the core and loop allow.

    Args:
        loop: the event loop to wake.
        context: the CUDA context the threads make current.
        lanes: the reactor's lanes.
        woken: called on the loop's thread with each lane whose waiter returned.
        woken_off_loop: called on a Python waiter's thread instead, once the loop is closed.
        closed_loop: what :func:`~asyncgraph._inbox.kick` calls once the loop is closed.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        context: Any,
        lanes: list[WatchLane],
        woken: Callable[[WatchLane], None],
        woken_off_loop: Callable[[WatchLane], None],
        closed_loop: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._context = context
        self._lanes = lanes
        self._woken = woken
        self._woken_off_loop = woken_off_loop
        self._closed_loop = closed_loop
        self.inbox: Inbox[WatchLane] = Inbox(loop, woken, woken_off_loop, closed_loop)
        # Native threads when the compiled core has them; decided for good at the first
        # hand-off, when the loop says whether it can watch the eventfd.
        self.native = core.NativeWaiter is not None
        self._waiter: Any = None  # the NativeWaiter, once made
        self._watched: asyncio.AbstractEventLoop | None = None  # the loop watching its fd

    def hand(self, lane: WatchLane, event: Any) -> None:
        """Have *lane*'s waiter wait on *event* (the lane's oldest) and report the lane."""
        if self.native:
            waiter = self._waiter if self._watched is not None else self._start_native()
            if waiter is not None:
                waiter.hand(lane.index, event)
                return
        if lane.thread is None:
            lane.thread = threading.Thread(
                target=self._wait_loop,
                args=(lane,),
                name=f"asyncgraph-waiter-{lane.index}",
                daemon=True,
            )
            lane.thread.start()
        lane.queue.put(event)

    def _start_native(self) -> Any:
        """The native waiter, watched by the loop from now on; ``None`` (and Python threads
        for good) when the loop cannot watch a file descriptor."""
        try:
            if self._waiter is None:
                self._waiter = core.NativeWaiter(self._context, len(self._lanes))
            self._loop.add_reader(self._waiter.fd, self._ready)
        except (AttributeError, NotImplementedError, OSError) as exc:
            # No eventfd, or a loop that cannot watch one (asyncio's proactor loop on Windows):
            # Python threads wait instead, from now on.
            _log.debug("waiters.python_threads", reason=repr(exc))
            self.native = False
            return None
        self._watched = self._loop
        return self._waiter

    def _ready(self) -> None:
        """The eventfd is readable: report each lane whose native thread returned."""
        lanes = self._lanes
        for index, code in self._waiter.take():
            lane = lanes[index]
            lane.last_code = code
            self._woken(lane)

    def _wait_loop(self, lane: WatchLane) -> None:
        drv.cuCtxSetCurrent(self._context)
        while True:
            event = lane.queue.get()
            if event is None:
                return
            # Blocks with the GIL released; the loop re-queries, so the result is not needed.
            lane.last_code = drv.cuEventSynchronize(event)[0]
            self.inbox.post(lane)

    def collect(self) -> None:
        """Report what native threads returned and nobody read (their loop ended or stopped
        watching): the reactor gives their events back. On the loop's thread, or with no
        loop running."""
        if self._waiter is not None:
            self._ready()

    def adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake *loop* from now on (the one woken so far ended; its threads were joined)."""
        self._unwatch()
        self._loop = loop
        self.inbox = Inbox(loop, self._woken, self._woken_off_loop, self._closed_loop)

    def _unwatch(self) -> None:
        if self._watched is not None and self._waiter is not None:
            with contextlib.suppress(Exception):  # a closed loop has forgotten its readers
                self._watched.remove_reader(self._waiter.fd)
        self._watched = None

    def stop(self) -> list[Joinable]:
        """Stop every thread; what to join, off the loop (nothing may be pending)."""
        joinables: list[Joinable] = []
        for lane in self._lanes:
            if lane.thread is not None:
                lane.queue.put(None)
                joinables.append(lane.thread)
                lane.thread = None
        if self._waiter is not None:
            self._unwatch()
            if self._waiter.stop():
                joinables.append(self._waiter)
        return joinables
