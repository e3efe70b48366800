"""What the completion reactor watches, and its hot half: polling and completing, in Python.

A *lane* is one stream's watched events in submission order; work on one stream completes in
order, so the completed ones are always a prefix (``WatchLane.ready`` of them are known).
:class:`Watches` holds every lane and does what runs once per completion: it takes a watch
(:meth:`Watches.watch`, or a job of the fast path that is its own watch), finds the oldest
completed one across the lanes, querying as little as it can (:meth:`Watches.drain`), spins on
a lone one (:meth:`Watches.spin`), and finishes it: the event back to its pool, then the
watch's callback, or the fast path's completion for one of its jobs. The reactor
(``_reactor``) keeps the policy around it: when to poll, the time budgets, hand-offs to the
waiter threads, pausing for captures, faults, closing.

This is the Python core's :class:`Watches`; the compiled core (``_core_compiled``) has its twin,
with the same attributes and methods, chosen by ``_choose``.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from time import perf_counter
from typing import Any

from cuda.bindings import driver as drv

from asyncgraph._cuda.driver._driver import NOT_READY, SUCCESS, check
from asyncgraph._runtime._exceptions import CudaError
from asyncgraph._runtime._telemetry import logger

__all__ = (
    "BUSY",
    "CATCH_UP_AFTER",
    "EARLY_FRACTION",
    "EARLY_MAX",
    "EARLY_MIN",
    "FAILED",
    "FOLLOW_FRACTION",
    "FOLLOW_LONG_AFTER",
    "FOLLOW_LONG_FRACTION",
    "FOLLOW_LONG_MAX",
    "FOLLOW_MAX",
    "FOLLOW_MIN",
    "HOLD_LIMIT",
    "IDLE",
    "MIN_COMPLETIONS",
    "OWN_END",
    "POKE_MARGIN",
    "POKE_MARGIN_LIMITS",
    "POKE_TAIL",
    "SPIN_BEFORE_POKE",
    "SPIN_SKIP",
    "STOPPED",
    "Callback",
    "Watch",
    "WatchLane",
    "Watches",
    "early_step",
    "follow_step",
    "learned",
)

Callback = Callable[[CudaError | None], None]

# How a drain ended (the second value Watches.drain returns).
IDLE = 0  # nothing else completed, and no lane has work still running
BUSY = 1  # nothing else completed, and some lane's oldest event is still running
STOPPED = 2  # the limit or the time budget stopped it: more may have completed
FAILED = 3  # an event failed; ``failed`` was called with it

# A drain completes at least this many (of those completed) before its budget can stop it.
MIN_COMPLETIONS = 4
# Inline completions (Watches.spin) may keep a task from yielding for this long at most.
HOLD_LIMIT = 500e-6
# A poll asked for longer ago than this waits behind other callbacks (request handlers): a
# task that awaits a dispatch meanwhile first finishes what completed (Watches.spin).
CATCH_UP_AFTER = 100e-6
# A spin for work expected to end soon (a copy's, ``Watches.spin(until)``) goes on until this
# long after its expected end, and never longer than SPIN_CAP.
SPIN_SLACK = 20e-6
SPIN_CAP = 200e-6
# ``Watches.spin(OWN_END)``: until the lone watch's own expected end (``Watch.expect``) where
# that is at most SPIN_CAP away (a graph replay's, whose learned time says when it ends).
OWN_END = -1.0
# A lone dispatch expected to end later than this many spin windows away is queried once, not
# spun for: work already complete still resolves inline (the learned time of a short kernel may
# include the host's delays), and a long kernel leaves the loop's thread to its waiter.
SPIN_SKIP = 2.0
# What such a catch-up may take of the awaiting task's time (once MIN_COMPLETIONS are done).
CATCH_UP_BUDGET = 100e-6
# A waiter thread follows its event (``_waiters``): it queries it after each sleep, and a sleep
# is FOLLOW_FRACTION of the time waited so far, within [FOLLOW_MIN, FOLLOW_MAX]. It so wakes
# within a few percent of the wait (at most FOLLOW_MAX) after the GPU finished, where a thread
# asleep in cuEventSynchronize on a blocking-sync event wakes 0.1 to 0.2 ms late. Past
# FOLLOW_LONG_AFTER a sleep is FOLLOW_LONG_FRACTION of the time waited, within [FOLLOW_MAX,
# FOLLOW_LONG_MAX]: a few hundred wake-ups a second at most, and a lateness of at most 0.4 % of
# the wait. (The events are not blocking-sync, so nobody sleeps in cuEventSynchronize: such an
# event's completion reaches a query about 2 us later, on an H100, than a plain event's.)
FOLLOW_MIN = 2e-6
FOLLOW_MAX = 50e-6
FOLLOW_FRACTION = 1 / 16
FOLLOW_LONG_AFTER = 0.1
FOLLOW_LONG_FRACTION = 1 / 256
FOLLOW_LONG_MAX = 1e-3
# A watch may say when its work is expected to end (``expect``, a perf_counter() time; 0.0:
# not known): the fast path learns each plan's time from dispatch to completion (learned()),
# copies their pace. A waiter handed such a watch follows it until POKE_MARGIN before that time
# (early_step(): coarser steps than after it), then, if it still runs, wakes the loop (a
# *poke*), which polls again until the work completed: a loop that slept long wakes 50 to 150
# us late, so it must be awake when the work ends, and the thread that follows the event is
# only the fallback. Work that ends before its wake time is reported as it ends, and teaches a
# shorter time at once: an expectation too long (a first dispatch that included loading its
# module, work queued behind other work) costs one late completion, never a sleep through the
# end of every later one. The loop keeps polling rather than handing off when the expected end
# is nearer than POKE_MARGIN.
POKE_MARGIN = 150e-6  # to begin with: the reactor learns how late its loop wakes (_poked)
POKE_MARGIN_LIMITS = (100e-6, 1e-3)
# After a poke the loop polls until the work completed, or until this long after its expected
# end (the waiter, still following it, reports it then).
POKE_TAIL = 300e-6
# A sleep of a thread ends 50 to 100 us late on some machines, timer slack or not: a waiter
# sleeps until this long before its poke, then spins on the clock (querying its event).
SPIN_BEFORE_POKE = 200e-6
# Before its wake time a waiter sleeps EARLY_FRACTION of the time waited so far between
# queries, within [EARLY_MIN, EARLY_MAX]: a few wake-ups for a kernel of milliseconds, and work
# that ends sooner than expected is seen at most EARLY_MAX late.
EARLY_MIN = 50e-6
EARLY_MAX = 500e-6
EARLY_FRACTION = 1 / 4
# How an expected time follows a longer sample: by this share of the difference, so that work
# that grew longer (a kernel given more to do) is followed within a few dispatches, while one
# long outlier moves it only halfway. A shorter sample is taken at once: a poke too late
# costs a late completion, one too early only some polls.
EXPECT_RISE = 1 / 2
# cuEventQuery(event): (code,), NOT_READY while it runs (the Python core's query).
query = drv.cuEventQuery
current_context = drv.cuCtxGetCurrent


def follow_step(waited: float) -> float:
    """Seconds a waiter sleeps before it queries its event again, *waited* seconds in."""
    if waited > FOLLOW_LONG_AFTER:
        return min(max(waited * FOLLOW_LONG_FRACTION, FOLLOW_MAX), FOLLOW_LONG_MAX)
    return min(max(waited * FOLLOW_FRACTION, FOLLOW_MIN), FOLLOW_MAX)


def early_step(waited: float, left: float) -> float:
    """Seconds a waiter sleeps before it queries its event again, *waited* seconds in and
    *left* seconds before its wake time (``0.0``: spin, querying, until the wake time)."""
    step = min(max(waited * EARLY_FRACTION, EARLY_MIN), EARLY_MAX)
    return max(min(step, left - SPIN_BEFORE_POKE), 0.0)


def learned(expected: float, sample: float) -> float:
    """The expected time of some work after it took *sample* seconds once more (*expected*:
    what was expected so far, 0.0 for nothing yet)."""
    return expected + EXPECT_RISE * (sample - expected) if 0 < expected <= sample else sample


class Watch:
    """One watched event and what to call when it completed."""

    __slots__ = ("callback", "event", "expect", "finished", "held", "seen", "seq")

    def __init__(self, seq: int, event: Any, callback: Callback, expect: float = 0.0) -> None:
        self.seq = seq  # the order it was watched in: completions are delivered in this order
        self.event = event
        self.callback: Callback | None = callback
        self.expect = expect  # when its work is expected to end (perf_counter()); 0.0: unknown
        self.seen = 0.0  # when a waiter thread saw it complete (perf_counter()); 0.0: none
        self.held = False  # handed to the lane's waiter thread
        self.finished = False


class WatchLane:
    """The watched events of one stream, and its waiter thread."""

    __slots__ = (
        "done_at",
        "handed",
        "index",
        "last_code",
        "pending",
        "queue",
        "ready",
        "thread",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        # Watches, and jobs of the fast path (which are their own watches), oldest first.
        self.pending: deque[Any] = deque()
        self.ready = 0  # leading pending watches known complete (a newer event completed)
        self.handed: Any = None  # the watch handed to the lane's waiter thread
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.last_code: Any = SUCCESS  # what the waiter's last wait on an event returned
        self.done_at = 0.0  # when the waiter saw that event complete (perf_counter())


class Watches:
    """The watched events of every lane, their completion, and the spin of a lone await.

    Args:
        lanes: how many lanes (streams) there are.
        idle_events: the event pool's idle list; a finished watch's event goes back there.
        spin_window: seconds :meth:`spin` polls a lone event before it gives up.
        context: the address of the backend's ``CUcontext``, made current around :meth:`spin`
            (0: none).

    Whom they report to, each set by the reporter itself:
        schedule, failed: the reactor of the loop that serves the backend now (:meth:`listen`):
            a poll asked for (:meth:`request_poll`, once per poll), a watch whose event failed.
        complete: the fast path's completion of its own jobs, whose ``callback`` is ``None``
            (:meth:`serve_fast`).
    """

    __slots__ = (
        "_own",
        "complete",
        "failed",
        "fault",
        "held_since",
        "idle_events",
        "lanes",
        "paused",
        "pending",
        "poll_asked",
        "poll_scheduled",
        "schedule",
        "seq",
        "spin_window",
        "spins",
        "window_start",
    )

    def __init__(
        self, lanes: int, idle_events: list[Any], spin_window: float, context: int = 0
    ) -> None:
        self.lanes = [WatchLane(i) for i in range(lanes)]
        self.idle_events = idle_events
        self.spin_window = spin_window
        self.pending = 0  # watched and not yet completed
        self.seq = 0  # watches so far
        self.poll_scheduled = False
        self.poll_asked = 0.0  # when the scheduled poll was asked for
        self.window_start = 0.0  # since when polls found nothing complete
        self.held_since = 0.0  # first inline completion since the loop last polled
        self.spins = 0  # completions spin() delivered before their task yielded
        self.paused = False  # a capture runs: no queries on the loop's thread
        self._own: Any = drv.CUcontext(context) if context else None  # current around spin()
        self.fault: CudaError | None = None  # the sticky error every later watch fails with
        self.schedule: Callable[[], None] | None = None
        self.failed: Callable[[Any, Any], None] = _no_failure_handler
        self.complete: Callable[[Any, CudaError | None], None] | None = None

    def listen(self, schedule: Callable[[], None], failed: Callable[[Any, Any], None]) -> None:
        """Report to a reactor from now on: *schedule* asks its loop for a poll, *failed* takes
        a watch whose event failed and the driver's code. A reactor made for a new loop calls
        this again; no poll is taken to be scheduled on the new loop."""
        self.schedule = schedule
        self.failed = failed
        self.poll_scheduled = False

    def fail_with(self, error: CudaError) -> None:
        """Fail every watch from now on with *error* (the device's sticky fault), unless one
        was set already: the first fault stays."""
        if self.fault is None:
            self.fault = error

    def pause(self, paused: bool) -> None:
        """Query no events on the loop's thread while *paused* (a capture runs): waiter
        threads wait for them meanwhile."""
        self.paused = paused

    def serve_fast(self, fast: Any) -> None:
        """Complete *fast*'s jobs (the watches whose ``callback`` is ``None``) with its
        ``complete``; the fast path calls this as it is made."""
        self.complete = fast.complete

    # -- adding ----------------------------------------------------------------------------

    def watch(self, lane: int, event: Any, callback: Callback, expect: float = 0.0) -> Watch:
        """Call ``callback(None)`` once *event* (recorded on lane *lane*) completed, or
        ``callback(error)`` if the device failed. The event returns to the pool afterwards.
        *expect*: when the work is expected to end (``perf_counter()``), if known. Returns the
        watch."""
        self.seq = seq = self.seq + 1
        watch = Watch(seq, event, callback, expect)
        if self.fault is not None:
            self.finish(watch, self.fault)
            return watch
        self.lanes[lane].pending.append(watch)
        self.pending += 1
        if not self.poll_scheduled:
            self.request_poll()
        return watch

    def request_poll(self) -> None:
        """Have the loop poll soon (once: a scheduled poll is not asked for again)."""
        schedule = self.schedule
        if schedule is None:
            return  # no reactor yet
        self.poll_scheduled = True
        self.poll_asked = self.window_start = perf_counter()
        schedule()

    # -- completing --------------------------------------------------------------------------

    def finish(self, watch: Any, error: CudaError | None) -> None:
        """*watch*'s event completed (or failed with *error*): give the event back unless a
        waiter thread holds it, and call what waits for it."""
        watch.finished = True
        if not watch.held:
            self.idle_events.append(watch.event)
        self.call(watch, error)

    def call(self, watch: Any, error: CudaError | None) -> None:
        """Call what waits for *watch* (its callback, or the fast path's completion of the job
        it is); a failing callback never stops the reactor. The watch lets go of its callback
        first: a callback that holds its watch would otherwise keep both, and what the callback
        holds (a job, its result), until the cycle collector ran."""
        callback = watch.callback
        try:
            if callback is None:
                self.complete(watch, error)  # type: ignore[misc]  # set with the fast path
            else:
                watch.callback = None
                callback(error)
        except Exception as exc:
            _callback_failed(exc)

    def drain(self, limit: int, now: float, deadline: float) -> tuple[int, int]:
        """Finish the watches whose events completed, oldest first across the lanes.

        Heads are queried oldest first, only when needed: a lane with ``ready`` watches needs
        no query, and a lane whose newest event completed (queried once per drain) has all of
        them complete. A lane whose head is still running is left alone for the rest of the
        drain. At most *limit* are finished, and once :data:`MIN_COMPLETIONS` are, the drain
        stops before one more (at the average cost of those so far, measured from *now*) would
        end past *deadline*.

        Returns:
            ``(finished, how)``: how many, and how it ended (:data:`IDLE`, :data:`BUSY`,
            :data:`STOPPED` or :data:`FAILED`).
        """
        lanes = self.lanes
        running = [False] * len(lanes)  # the lane's head is still running
        checked = [False] * len(lanes)  # the lane's newest event was queried in this drain
        done = 0
        while True:
            if done >= limit or (
                done >= MIN_COMPLETIONS and (t := perf_counter()) + (t - now) / done > deadline
            ):
                return done, STOPPED
            best = None
            seq = 0
            for lane in lanes:
                pending = lane.pending
                if pending and not running[lane.index] and (best is None or pending[0].seq < seq):
                    best = lane
                    seq = pending[0].seq
            if best is None:
                return done, BUSY if True in running else IDLE
            pending = best.pending
            if best.ready:
                code = SUCCESS
            else:
                index = best.index
                code = NOT_READY
                if not checked[index] and len(pending) > 1:
                    checked[index] = True
                    # Work on one stream completes in order: if its newest event completed, so
                    # did every older one, and this one query settles them all.
                    if query(pending[-1].event)[0] == SUCCESS:
                        best.ready = len(pending)
                        code = SUCCESS
                if code != SUCCESS:
                    code = query(pending[0].event)[0]
                    if code == NOT_READY:
                        running[index] = True
                        continue
                    if code == SUCCESS:
                        best.ready = 1
            watch = pending.popleft()
            self.pending -= 1
            done += 1
            if code != SUCCESS:
                best.ready = 0
                self.failed(watch, code)
                return done, FAILED
            best.ready -= 1
            watch.finished = True  # finish(), inline
            if not watch.held:
                self.idle_events.append(watch.event)
            self.call(watch, None)

    @property
    def context(self) -> int:
        """The address of the backend's context, made current around :meth:`spin`; 0: none."""
        return int(self._own) if self._own is not None else 0

    def spin(self, until: float = 0.0) -> None:
        """Poll the only watched event right here for up to ``spin_window`` seconds, or until
        ``SPIN_SLACK`` after *until* (its work's expected end, ``perf_counter()``; ``OWN_END``:
        the watch's own ``expect``, if within ``SPIN_CAP``) if that is later, and at most
        ``SPIN_CAP``.

        For a lone awaited dispatch: its task asks before it yields, and if the event completes
        within the window the dispatch resolves without a trip around the event loop. With more
        than one event watched the loop's regular polling serves them all, so this returns at
        once, unless that poll was asked for more than ``CATCH_UP_AFTER`` ago and still waits
        behind other callbacks (request handlers of a busy service): then what completed is
        finished here (:meth:`drain`, bounded like a poll), and the task yields as it would
        have. A task whose dispatches keep completing inline is made to yield once
        ``HOLD_LIMIT`` passed since the loop last ran the reactor, so a tight loop of awaits
        cannot starve other tasks.
        """
        if self.paused or not self.pending:
            return
        now = perf_counter()
        catch_up = (
            self.pending > 1 and self.poll_scheduled and now - self.poll_asked > CATCH_UP_AFTER
        )
        if not catch_up and (self.pending != 1 or self.spin_window <= 0.0):
            return
        # A task whose dispatches kept completing inline must yield (HOLD_LIMIT); catching up
        # with others' completions holds it no longer than a poll would.
        held = self.held_since
        lone = not (held and now - held > HOLD_LIMIT)
        if not (catch_up or lone):
            return
        own = self._own
        pushed = own is not None and current_context()[1] != own  # the backend's, current
        if pushed:
            check(drv.cuCtxPushCurrent(own), "cuCtxPushCurrent")
        try:
            if catch_up:
                # Others' completions only, the newest (the task's own) left to the poll: the
                # task yields as it would have, and does not run on ahead of those it woke.
                limit = min(MIN_COMPLETIONS, self.pending - 1)
                self.drain(limit, now, now + CATCH_UP_BUDGET)
                return
            if not lone:
                return
            for lane in self.lanes:
                if lane.pending:
                    break
            watch = lane.pending[0]
            if watch.held:
                return
            event = watch.event
            if until < 0.0:  # OWN_END
                until = watch.expect if 0.0 < watch.expect - now <= SPIN_CAP else 0.0
            deadline = now + self.spin_window
            if not until and watch.expect - now > SPIN_SKIP * self.spin_window:
                deadline = now  # expected to end well past the window: one query
            if until:
                deadline = max(deadline, min(until + SPIN_SLACK, now + SPIN_CAP))
            while True:
                code = query(event)[0]
                if code != NOT_READY:
                    break
                if perf_counter() > deadline:
                    return
            lane.pending.popleft()
            lane.ready = 0
            self.pending -= 1
            self.spins += 1
            if not held:
                self.held_since = now
            if code != SUCCESS:
                self.failed(watch, code)
                return
            watch.finished = True  # finish(), inline
            self.idle_events.append(watch.event)  # not held: checked above
            if watch.callback is not None:
                self.call(watch, None)
                return
            try:  # call() of the fast path's job, inline: the lone await's own path
                self.complete(watch, None)  # type: ignore[misc]  # set with the fast path
            except Exception as exc:
                _callback_failed(exc)
        finally:
            if pushed:
                drv.cuCtxPopCurrent()

    def take_all(self) -> list[Any]:
        """Every watch of every lane, in lane order; the lanes are left empty."""
        watches: list[Any] = []
        for lane in self.lanes:
            watches.extend(lane.pending)
            lane.pending.clear()
            lane.ready = 0
        self.pending = 0
        return watches


def _callback_failed(exc: Exception) -> None:
    logger.error("reactor.callback_failed", error=repr(exc), exc_info=exc)


def _no_failure_handler(watch: Any, code: Any) -> None:
    raise RuntimeError("a watched event failed before the reactor set Watches.failed")
