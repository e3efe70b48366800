"""The completion reactor: CUDA events to callbacks on the event loop, never blocking it.

For each stream (a *lane*) the reactor keeps the watched events in submission order; only the
oldest can complete first. While any is pending, the loop polls the oldest event of each lane
with ``cuEventQuery`` (about 2 µs) from a ``call_soon`` callback, so other tasks run between
polls. A poll completes what it finds completed, oldest first across all lanes, bounded by
time, never by a fixed count: its own work stops before a completion would take it past
``POLL_BUDGET`` (once ``MIN_COMPLETIONS`` are done; a completion's cost is measured as it
goes), and the tasks it wakes are limited to what fits in
``ITERATION_BUDGET`` by what woken tasks cost the loop lately (:class:`WakeBudget`), so a timer
or a request handler never waits behind hundreds of them. What is left completes in the next
poll, one loop iteration later, before anything that completed after it.
While other callbacks run between polls the loop is busy and keeps polling once an iteration.
Only when polls followed each other with nothing else to run and nothing completing for
``poll_window`` seconds (the loop would otherwise sleep) does each busy lane hand its oldest
event to that lane's waiter thread, which follows it (queries between short sleeps, the thread
asleep in between) and then wakes the loop (``_waiters``: native threads through an eventfd,
or Python threads through an inbox); the loop wakes once per batch and polls again, so a fault
surfaces as the query's error, not a hang.

The part that runs once per completion — finding what completed, finishing it, the spin of a
lone await — is the dispatch core's :class:`Watches` (compiled, or ``_watches`` in Python);
this module is the policy around it.

No Python runs inside a driver callback. An event handed to a waiter is not recycled until the
waiter returned it, even if a poll saw it complete first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as drv

from asyncgraph._cuda.core._choose import core
from asyncgraph._cuda.core._waiters import Joinable, Waiters, follow
from asyncgraph._cuda.core._watches import (
    FAILED,
    HOLD_LIMIT,
    MIN_COMPLETIONS,
    POKE_MARGIN,
    STOPPED,
    Callback,
    WatchLane,
)
from asyncgraph._cuda.driver._context import OwnContext
from asyncgraph._cuda.driver._driver import SUCCESS, check, error_for, is_sticky
from asyncgraph._runtime import _loop
from asyncgraph._runtime._inbox import off_loop_lock

from ._expected_ends import WITHIN_MARGIN, eased, ends_late, ends_soon, margin_after_poke
from ._poll_budget import ITERATION_BUDGET, WakeBudget

if TYPE_CHECKING:
    from asyncgraph._cuda.driver._events import EventPool
    from asyncgraph._runtime._exceptions import CudaError
    from asyncgraph._runtime._telemetry import Telemetry

__all__ = ("HOLD_LIMIT", "ITERATION_BUDGET", "MIN_COMPLETIONS", "Reactor", "WakeBudget")

_get_current = drv.cuCtxGetCurrent

# A poll's own work (completing dispatches) stops before it would pass this, once
# MIN_COMPLETIONS are done.
POLL_BUDGET = 150e-6
# Polls further apart than this ran other callbacks between them: the loop is not idle.
IDLE_GAP = 50e-6


class Reactor:
    """Completion of CUDA events, delivered as callbacks on the event loop's thread.

    Args:
        loop: the event loop callbacks run on.
        context: the CUDA context the waiter threads make current.
        lanes: how many streams (lanes) there are, or the :class:`Watches` of the device
            (which the fast path shares).
        events: the pool watched events come from and go back to.
        poll_window: seconds of polling without progress before the waiters take over.
        on_fault: called once with the first sticky error seen.
        telemetry: counts each hand-off to a waiter thread as a sync point.
        spin_window: seconds :meth:`spin` polls a lone event before it gives up.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        context: Any,
        lanes: int | Any,
        events: EventPool,
        poll_window: float,
        on_fault: Callable[[CudaError], None],
        telemetry: Telemetry | None = None,
        spin_window: float = 0.0,
    ) -> None:
        self._loop = loop
        self._context = context
        # Loop callbacks make driver calls in the backend's own context (``_context``): the
        # poll checks it itself (once a poll, the hot path), the waiters' wake-up through this.
        self._own = context if context is not None and int(context) else None
        self._woken = OwnContext(context).wrap(self._woken)  # type: ignore[method-assign]  # the same, in context
        watches = core.Watches(lanes, events.idle, spin_window) if isinstance(lanes, int) else lanes
        self._w = watches
        self._lanes: list[WatchLane] = watches.lanes
        self._events = events
        self._window = poll_window
        self._on_fault = on_fault
        self._telemetry = telemetry
        self._waiters = Waiters(
            loop,
            context,
            self._lanes,
            self._woken,
            self._woken_off_loop,
            self._closed_loop,
            self._poked,
            native_waiter=core.NativeWaiter,
        )
        self._poll_end = 0.0  # when the last poll returned
        self._woke = 0  # dispatches the last poll completed, if it scheduled the next poll
        self.budget = WakeBudget()  # how many a poll completes, by what woken tasks cost
        self.polls = 0
        self.handoffs = 0
        self.pokes = 0  # waiters that woke the loop before their work's expected end
        self._poked_lanes: set[int] = set()  # handed off, and their waiter poked the loop
        self._wake_at: dict[int, float] = {}  # when each lane's waiter was to poke the loop
        # How long before a watch's expected end its waiter pokes the loop: as late as the
        # loop was seen to wake after a poke, and a quarter more.
        self.poke_margin = POKE_MARGIN
        self._pause_waiters = False  # a "global" capture: no hand-offs either
        self._stopped = False  # close() stopped the waiter threads (until adopt())
        watches.listen(self._schedule, self._failed)
        # A lone awaited dispatch polls its event right here before its task yields.
        self.spin = watches.spin

    def __repr__(self) -> str:
        waiting = sum(1 for lane in self._lanes if lane.handed is not None)
        return f"<Reactor pending={self._w.pending} handed_off={waiting} polls={self.polls}>"

    @property
    def pending(self) -> int:
        """Events watched and not yet completed."""
        return int(self._w.pending)

    @property
    def task_cost(self) -> float:
        """Seconds of loop time a woken task takes, as measured lately (0.0: not since the loop
        was last idle)."""
        return self.budget.cost

    @property
    def spins(self) -> int:
        """Dispatches completed by :meth:`spin` before their task yielded."""
        return int(self._w.spins)

    def watch(self, lane: int, event: Any, callback: Callback, expect: float = 0.0) -> Any:
        """See ``Watches.watch`` (of the core that runs); the watch's ``seen`` says when a
        waiter thread saw the event complete."""
        return self._w.watch(lane, event, callback, expect)

    def _schedule(self) -> None:
        self._loop.call_soon(self._poll)

    # -- pausing for captures ---------------------------------------------------------------

    def pause(self, waiters: bool = False) -> None:
        """Stop querying events on the loop's thread (a capture in ``thread_local`` mode would
        be invalidated by them): waiter threads wait for every event meanwhile. With *waiters*
        (``global`` mode) hand them nothing either until :meth:`resume`."""
        self._w.pause(True)
        self._pause_waiters = waiters

    def resume(self) -> None:
        """Query events on the loop's thread again, and catch up."""
        w = self._w
        w.pause(False)
        self._pause_waiters = False
        if w.pending and not w.poll_scheduled:
            w.request_poll()

    async def waiters_idle(self) -> None:
        """Return once no waiter thread waits on an event (after :meth:`pause` with waiters)."""
        while any(lane.handed is not None for lane in self._lanes):  # rare; no event to wait on
            await _loop.sleep(0.0005)

    def _poll_paused(self) -> None:
        if self._pause_waiters:
            return
        self._hand_off_all()

    # -- loop thread -----------------------------------------------------------------------

    def _poll(self) -> None:
        own = self._own
        pushed = own is not None and _get_current()[1] != own  # ``_context``
        if pushed:
            check(drv.cuCtxPushCurrent(own), "cuCtxPushCurrent")
        try:
            w = self._w
            if w.paused:
                w.poll_scheduled = False
                self._idle()  # no tasks run meanwhile that the next poll could measure
                self._poll_paused()
                return
            w.held_since = 0.0  # the loop is running callbacks: nothing holds it
            self.polls += 1
            # The loop iteration since the last poll ran the tasks that poll woke: learn from
            # it what a woken task costs, and wake as many as fit in ITERATION_BUDGET.
            now = perf_counter()
            if self._woke:
                self.budget.learn(now - self._poll_end, self._woke)
                self._woke = 0
            elif now - self._poll_end > IDLE_GAP:
                # Other callbacks ran since the last poll: the loop is busy, so polling once an
                # iteration costs it little, and waiter threads would only add wake-ups. They
                # are armed only once polls follow each other with nothing else to run (below).
                w.window_start = now
            # Deliver completed watches oldest first across the lanes, bounded by the budget:
            # the tasks these woke run before the next poll, so the loop's other work never
            # waits behind all of them, and none waits behind newer ones of busier lanes.
            # The poll stays marked scheduled meanwhile: a completion that watches a new event
            # (a queued dispatch launching) must not schedule the next poll ahead of the tasks
            # this one wakes, which it would then measure only part of. It is scheduled below.
            try:
                done, how = w.drain(self.budget.limit(), now, now + POLL_BUDGET)
            finally:
                w.poll_scheduled = False
            if how == STOPPED:
                w.window_start = perf_counter()
                self._again(done)
                return
            if how == FAILED:
                if w.pending:  # the others go on: completing one is progress
                    w.window_start = perf_counter()
                    self._again(done)
                return
            busy = how != 0  # BUSY: some lane's oldest event is still running
            if not busy and not w.pending:
                self._idle()
                return
            now = perf_counter()
            if done:
                w.window_start = now
            if not busy or (
                now - w.window_start < self._window
                and not ends_late(self._lanes, now + self._window + 2 * self.poke_margin)
            ):
                self._again(done)
                return
            # Polls followed each other for a whole window with nothing completing and nothing
            # else to run, or the work is expected to end later than that (``ends_late``): let the
            # waiter threads sleep on the events, and the loop sleep too; unless some work is
            # expected to end sooner than a sleeping loop would wake (``_expected_ends``).
            soon = ends_soon(self._lanes, self._poked_lanes, now, self.poke_margin)
            if soon:
                if soon == WITHIN_MARGIN:
                    self.poke_margin = eased(self.poke_margin)
                self._again(done)
                return
            self._idle()
            for lane in self._lanes:
                if lane.pending and lane.handed is None:
                    self._hand_off(lane)
        finally:
            if pushed:
                drv.cuCtxPopCurrent()

    def _again(self, done: int) -> None:
        """Poll again in the next loop iteration, after the *done* dispatches' tasks ran."""
        self._woke = done
        self._poll_end = perf_counter()
        w = self._w
        if not w.poll_scheduled:  # a watch() of a callback may have scheduled it already
            w.poll_scheduled = True
            w.poll_asked = self._poll_end
            self._loop.call_soon(self._poll)

    def _idle(self) -> None:
        """The reactor stops polling: what the tasks it wakes next cost is measured afresh."""
        self._woke = 0
        self.budget.forget()

    def _hand_off_all(self) -> None:
        """Hand every lane with watches, and none handed yet, to its waiter thread."""
        for lane in self._lanes:
            if lane.pending and lane.handed is None:
                self._hand_off(lane)

    def _hand_off(self, lane: WatchLane) -> None:
        watch = lane.pending[0]
        watch.held = True
        lane.handed = watch
        self.handoffs += 1
        if self._telemetry is not None:
            self._telemetry.count("sync_points")
        # A poke at once would only repeat the polls that just found nothing: none then.
        wake_at = watch.expect - self.poke_margin
        if wake_at <= perf_counter():
            wake_at = 0.0
        self._wake_at[lane.index] = wake_at
        self._waiters.hand(lane, watch.event, wake_at)

    def _poked(self, lane: WatchLane) -> None:
        """*lane*'s waiter woke the loop shortly before its work's expected end: poll again, so
        that the loop is awake when it ends (the waiter goes on following it meanwhile)."""
        w = self._w
        wake_at = self._wake_at.get(lane.index, 0.0)
        if lane.handed is None or not w.pending or w.paused or not wake_at:
            return
        # How late the loop woke: the margin to poke with from now on (``_expected_ends``).
        self.poke_margin = margin_after_poke(self.poke_margin, perf_counter() - wake_at)
        self.pokes += 1
        self._poked_lanes.add(lane.index)
        if not w.poll_scheduled:
            w.request_poll()

    def _woken(self, lane: WatchLane) -> None:
        w = self._w
        watch = lane.handed
        lane.handed = None
        self._poked_lanes.discard(lane.index)
        if watch is not None:
            watch.held = False
            watch.seen = lane.done_at  # when the waiter saw it complete: what it took
            if watch.finished:
                self._events.give(watch.event)
            elif w.paused and lane.pending and lane.pending[0] is watch:
                # No queries meanwhile: the waiter's result settles the watch.
                lane.pending.popleft()
                lane.ready = 0
                w.pending -= 1
                if lane.last_code == SUCCESS:
                    w.finish(watch, None)
                else:
                    self._failed(watch, lane.last_code)
        if w.pending and not w.poll_scheduled:
            # Schedule rather than poll here: several lanes may wake in one batch, and each
            # poll resolves a bounded batch per loop iteration.
            try:
                w.request_poll()
            except RuntimeError:
                # The loop is closed (the inbox called this on the waiter's thread): the
                # backend's close settles the watches on its next loop (adopt()).
                w.poll_scheduled = False

    def _woken_off_loop(self, lane: WatchLane) -> None:
        """A waiter posted *lane* after the loop closed (on its thread, or the thread of
        :func:`~asyncgraph._runtime._inbox.kick` or ``settle``; under off_loop_lock).

        No poll will ever run again: settle every watch here, in lane order, following each
        event as a waiter does (``_waiters.follow``; this thread has the context current), so
        the dispatches complete and threads blocked in ``pending.result()`` return.
        """
        with contextlib.suppress(RuntimeError):  # a paused reactor's failure asked for a poll
            self._woken(lane)
        self._settle_off_loop()

    def _closed_loop(self) -> None:
        """The loop is closed and a thread waits on a dispatch (any thread, under
        off_loop_lock): hand every busy lane to its waiter thread, which settles them all
        (:meth:`_woken_off_loop`). Covers a loop that closed while it still polled."""
        if self._stopped or not self._loop.is_closed():
            return
        if self._waiters.native:
            # Native waiters run no Python: settle here, on the thread that asked.
            self._waiters.collect()
            self._settle_off_loop()
            return
        self._hand_off_all()

    def _settle_off_loop(self) -> None:
        # Marked scheduled meanwhile, so a watch() of a job launched by a completion here (a
        # queued or parked one) does not call the closed loop: the loop below settles it too.
        w = self._w
        if not w.pending:
            return
        # Usually a waiter thread, whose context is current; settle() or kick() may run this on
        # another thread: make the context current there, and leave that thread as it was.
        check(drv.cuCtxPushCurrent(self._context), "cuCtxPushCurrent")
        w.poll_scheduled = True
        try:
            while w.pending:
                for lane in self._lanes:
                    pending = lane.pending
                    while pending:
                        watch = pending[0]
                        code = follow(watch.event)
                        pending.popleft()
                        lane.ready = 0
                        w.pending -= 1
                        if code == SUCCESS:
                            w.finish(watch, None)  # a held event stays with its waiter
                            continue
                        error = error_for(code, "cuEventQuery")
                        if is_sticky(code):
                            self.fail_all(error, first=watch)
                            return
                        w.finish(watch, error)
        finally:
            w.poll_scheduled = False
            drv.cuCtxPopCurrent()

    def _failed(self, watch: Any, code: Any) -> None:
        """*watch*'s event failed with *code* (it was taken off its lane)."""
        error = error_for(code, "cuEventQuery")
        if not is_sticky(code):
            w = self._w
            w.finish(watch, error)
            if w.pending and not w.poll_scheduled:
                w.request_poll()
            return
        self.fail_all(error, first=watch)

    def fail_all(self, error: CudaError, first: Any = None) -> None:
        """Fail every watched event with *error* (the context is lost)."""
        w = self._w
        if w.fault is None:
            w.fault = error
            self._on_fault(error)
        watches = [first] if first is not None else []
        watches.extend(w.take_all())
        for watch in watches:
            # Their events are not reused: after a fault the context is lost.
            watch.finished = True
            w.call(watch, error)

    # -- the waiters' life -------------------------------------------------------------------

    def adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop this reactor served has ended: serve *loop*, and settle every watch now.

        The context was synchronized and the waiter threads joined first, so every watched
        event has completed; callbacks run here, on *loop*'s thread.
        """
        with off_loop_lock:  # serialised with a settle on a thread outside any loop
            self._adopt(loop)

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        self._waiters.collect()  # what native waiters returned meanwhile: their events
        self._loop = loop
        self._waiters.adopt(loop)
        w = self._w
        w.poll_scheduled = w.paused = self._pause_waiters = self._stopped = False
        self._poked_lanes.clear()
        self._idle()
        for lane in self._lanes:
            lane.handed = None
        for watch in w.take_all():
            watch.held = False
            code = core.query(watch.event)[0]
            error = None if code == SUCCESS else error_for(code, "cuEventQuery")
            if error is not None and is_sticky(code) and w.fault is None:
                w.fault = error
                self._on_fault(error)
            w.finish(watch, error)

    def close(self) -> list[Joinable]:
        """Stop the waiter threads; return what to join (nothing may be pending)."""
        with off_loop_lock:  # a kick (_closed_loop) must not start them again
            self._stopped = True
            return self._waiters.stop()

    def collect(self) -> None:
        """After the waiters were joined: give back the events they still held."""
        self._waiters.collect()
