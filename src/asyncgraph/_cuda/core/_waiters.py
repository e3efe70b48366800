"""The reactor's waiter threads: they follow an event until it completed and wake the event loop.

The reactor hands a lane's oldest event to the lane's waiter once polling found nothing to do
for a while (``Reactor._hand_off``); when the event completed, the reactor hears of the lane on
the loop's thread (its ``woken``), with the driver's code in ``lane.last_code``. A waiter
*follows* its event: it queries it after sleeps that grow with the time waited so far
(``_watches.follow_step``, with a timer slack of 1 us on Linux so that short sleeps end on
time), so it wakes within a few percent of the wait (at most ``FOLLOW_MAX``) after the GPU
finished, whatever the kernel's length (past ``FOLLOW_LONG_AFTER``, within 0.4 % of it, in
sleeps of at most ``FOLLOW_LONG_MAX``). A thread asleep in ``cuEventSynchronize`` on a
blocking-sync event would wake 0.1 to 0.2 ms late, which is most of a short kernel, and such an
event's completion reaches every query about 2 us later: the events are plain ones, and no
thread sleeps in ``cuEventSynchronize``. A hand-off may come with a wake time (the
work's expected end less ``POKE_MARGIN``): the waiter then follows the event until then, in
coarser steps (:func:`follow` with *until*), and if it still runs *pokes* the loop (the reactor's
``poked``), which polls again, so that it is awake when the work ends; a loop that slept long
wakes 50 to 150 us late. Work that ends before the wake time is reported at once, as without
one. Two kinds of waiter do this, and the reactor cannot
tell them apart:

- **native** (the compiled core's ``NativeWaiter``): POSIX threads outside Python, one per lane,
  which write to an eventfd the loop watches with ``add_reader``. The loop wakes in its
  selector; a completion never waits for the GIL, and no Python runs off the loop.
- **Python threads** (the pure-Python path, and loops without ``add_reader``): each posts its
  lane to an :class:`~asyncgraph._runtime._inbox.Inbox`, which wakes the loop with
  ``call_soon_threadsafe``.

After the loop closed, a Python waiter settles the reactor on its own thread (the inbox's
``off_loop`` handler); native threads cannot run Python, so then the thread that asks for a
result settles it instead (``Reactor._closed_loop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from cuda.bindings import driver as drv

from asyncgraph._cuda.driver._driver import NOT_READY
from asyncgraph._runtime._inbox import Inbox
from asyncgraph._runtime._telemetry import logger as _log

from ._watches import WatchLane, early_step, follow_step

__all__ = ("Joinable", "Poke", "Waiters", "follow")

_PR_SET_TIMERSLACK = 29


def _fine_timer_slack() -> None:
    """Let this thread's short sleeps end on time (Linux: a timer slack of 1 us, not 50)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):  # no libc to call: sleeps are merely coarser
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)


def follow(event: Any, until: float = 0.0) -> Any:
    """Wait for *event* as a waiter thread does; the driver's code (``CUresult``).

    With *until* (a ``perf_counter()`` time, its wake time): follow it only until then, in the
    coarser steps of ``_watches.early_step`` and querying on the clock for the last
    ``SPIN_BEFORE_POKE`` (letting go of the GIL each turn), and return ``NOT_READY`` then if it
    still runs."""
    start = time.perf_counter()
    query = drv.cuEventQuery
    sleep = time.sleep
    while True:
        code = query(event)[0]
        if code != NOT_READY:
            return code
        now = time.perf_counter()
        if until and now >= until:
            return code
        waited = now - start
        sleep(early_step(waited, until - now) if until else follow_step(waited))


class Joinable(Protocol):
    """What closing leaves to join, off the loop: a thread, or the native threads."""

    def join(self, timeout: float | None = None) -> object: ...

    def is_alive(self) -> bool: ...


class Poke:
    """A Python waiter's poke of the loop for *lane* (its event still runs)."""

    __slots__ = ("lane",)

    def __init__(self, lane: WatchLane) -> None:
        self.lane = lane


class Waiters:
    """The waiter threads of one reactor's lanes, native where the core and loop allow.

    Args:
        loop: the event loop to wake.
        context: the CUDA context the threads make current.
        lanes: the reactor's lanes.
        woken: called on the loop's thread with each lane whose waiter returned.
        woken_off_loop: called on a Python waiter's thread instead, once the loop is closed.
        closed_loop: what :func:`~asyncgraph._runtime._inbox.kick` calls once the loop is closed.
        poked: called on the loop's thread with each lane whose waiter woke the loop before
            its work's expected end.
        native_waiter: the core's ``NativeWaiter`` class (``None`` on the Python core: Python
            threads wait).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        context: Any,
        lanes: list[WatchLane],
        woken: Callable[[WatchLane], None],
        woken_off_loop: Callable[[WatchLane], None],
        closed_loop: Callable[[], None],
        poked: Callable[[WatchLane], None],
        *,
        native_waiter: Any,
    ) -> None:
        self._loop = loop
        self._context = context
        self._lanes = lanes
        self._woken = woken
        self._woken_off_loop = woken_off_loop
        self._closed_loop = closed_loop
        self._poked = poked
        self.inbox: Inbox[WatchLane | Poke] = self._inbox(loop)
        # Native threads when the compiled core has them; decided for good at the first
        # hand-off, when the loop says whether it can watch the eventfd.
        self._native_waiter = native_waiter
        self.native = native_waiter is not None
        self._waiter: Any = None  # the NativeWaiter, once made
        self._watched: asyncio.AbstractEventLoop | None = None  # the loop watching its fd

    def _inbox(self, loop: asyncio.AbstractEventLoop) -> Inbox[WatchLane | Poke]:
        return Inbox(loop, self._deliver, self._deliver_off_loop, self._closed_loop)

    def _deliver(self, item: WatchLane | Poke) -> None:
        if isinstance(item, Poke):
            self._poked(item.lane)
        else:
            self._woken(item)

    def _deliver_off_loop(self, item: WatchLane | Poke) -> None:
        if not isinstance(item, Poke):  # no loop to poke any more
            self._woken_off_loop(item)

    def hand(self, lane: WatchLane, event: Any, wake_at: float = 0.0) -> None:
        """Have *lane*'s waiter wait on *event* (the lane's oldest) and report the lane; with
        *wake_at* (a ``perf_counter()`` time), poke the loop then if the event is still
        running."""
        if self.native:
            waiter = self._waiter if self._watched is not None else self._start_native()
            if waiter is not None:
                waiter.hand(lane.index, event, wake_at)
                return
        if lane.thread is None:
            lane.thread = threading.Thread(
                target=self._wait_loop,
                args=(lane,),
                name=f"asyncgraph-waiter-{lane.index}",
                daemon=True,
            )
            lane.thread.start()
        lane.queue.put((event, wake_at))

    def _start_native(self) -> Any:
        """The native waiter, watched by the loop from now on; ``None`` (and Python threads
        for good) when the loop cannot watch a file descriptor."""
        try:
            if self._waiter is None:
                self._waiter = self._native_waiter(self._context, len(self._lanes))
            self._loop.add_reader(self._waiter.fd, self._ready)
        except (AttributeError, NotImplementedError, OSError) as exc:
            # No eventfd, or a loop that cannot watch one (asyncio's proactor loop on Windows):
            # Python threads wait instead, from now on.
            _log.debug("waiters.python_threads", reason=repr(exc))
            self.native = False
            return None
        self._watched = self._loop
        return self._waiter

    def _ready(self, pokes: bool = True) -> None:
        """The eventfd is readable: report each lane whose native thread returned, and (with
        *pokes*) each whose thread poked the loop."""
        lanes = self._lanes
        for index, code, seen in self._waiter.take():
            lane = lanes[index]
            if code is None:
                if pokes:
                    self._poked(lane)
                continue
            lane.last_code = code
            lane.done_at = seen
            self._woken(lane)

    def _wait_loop(self, lane: WatchLane) -> None:
        drv.cuCtxSetCurrent(self._context)
        _fine_timer_slack()
        while True:
            item = lane.queue.get()
            if item is None:
                return
            event, wake_at = item
            code = follow(event, wake_at) if wake_at else NOT_READY
            if code == NOT_READY:
                if wake_at:  # still running at its wake time: wake the loop for its end
                    self.inbox.post(Poke(lane))
                code = follow(event)
            lane.last_code = code
            lane.done_at = time.perf_counter()
            self.inbox.post(lane)

    def collect(self) -> None:
        """Report what native threads returned and nobody read (their loop ended or stopped
        watching): the reactor gives their events back. On the loop's thread, or with no
        loop running."""
        if self._waiter is not None:
            self._ready(pokes=False)

    def adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake *loop* from now on (the one woken so far ended; its threads were joined)."""
        self._unwatch()
        self._loop = loop
        self.inbox = self._inbox(loop)

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
