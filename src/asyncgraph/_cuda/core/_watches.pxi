# The completion reactor's hot half, compiled (included by _core_compiled.pyx): the twin of _watches.py.
#
# The same classes, attributes and methods as there (read that module's docstrings for what
# each does); here a watch's event handle is kept as a raw CUevent beside the Python object, the
# queries are direct driver calls, and a job of the fast path is completed in C.

from collections import deque as _deque
import queue as _queue

from asyncgraph._runtime._telemetry import logger as _logger
from ._watches import (
    BUSY, CATCH_UP_AFTER, CATCH_UP_BUDGET, EXPECT_RISE, FAILED, HOLD_LIMIT, IDLE,
    MIN_COMPLETIONS, SPIN_CAP, SPIN_SKIP, SPIN_SLACK, STOPPED
)

cdef int _NOT_READY = <int>cydriver.CUDA_ERROR_NOT_READY
cdef double _EXPECT_RISE = EXPECT_RISE
cdef double _SPIN_SLACK = SPIN_SLACK
cdef double _SPIN_CAP = SPIN_CAP
cdef double _SPIN_SKIP = SPIN_SKIP


cdef inline double _learned(double expected, double sample) noexcept:
    """``_watches.learned``: the expected time after one more *sample*."""
    if expected == 0.0 or sample < expected:
        return sample
    return expected + _EXPECT_RISE * (sample - expected)


cdef inline double _now() noexcept nogil:
    """``time.perf_counter()`` (the same clock: CLOCK_MONOTONIC), without Python."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef inline int _query(WatchItem watch) noexcept:
    return <int>cydriver.cuEventQuery(watch.ev)


cdef class WatchItem:
    """What the reactor keeps per watched event: a :class:`Watch`, or a :class:`FastJob`."""

    @property
    def event(self):
        """The watched ``CUevent``."""
        return self._event

    @event.setter
    def event(self, value):
        self._event = value
        self.ev = <cydriver.CUevent>_address(value) if value is not None else NULL


cdef class Watch(WatchItem):
    """One watched event and what to call when it completed."""

    def __init__(self, long long seq, event, callback, double expect=0.0):
        self.seq = seq
        self.event = event
        self.callback = callback
        self.expect = expect
        self.held = False
        self.finished = False


cdef class WatchLane:
    """The watched events of one stream, and its waiter thread."""

    def __init__(self, int index):
        self.index = index
        self.pending = _deque()
        self.ready = 0
        self.handed = None
        self.queue = _queue.SimpleQueue()
        self.thread = None
        self.last_code = 0
        self.done_at = 0.0


cdef class Watches:
    """The watched events of every lane, their completion, and the spin of a lone await."""

    def __cinit__(self, int lanes, list idle_events, double spin_window, size_t context=0):
        self._n = lanes
        self._running = <char*>calloc(lanes if lanes > 0 else 1, 1)
        self._checked = <char*>calloc(lanes if lanes > 0 else 1, 1)
        if self._running == NULL or self._checked == NULL:
            raise MemoryError("no memory for the reactor's lanes")

    def __init__(self, int lanes, list idle_events, double spin_window, size_t context=0):
        self.lanes = [WatchLane(i) for i in range(lanes)]
        self.idle_events = idle_events
        self.spin_window = spin_window
        self.pending = 0
        self.seq = 0
        self.poll_scheduled = False
        self.poll_asked = 0.0
        self.window_start = 0.0
        self.held_since = 0.0
        self.spins = 0
        self.paused = False
        self.fault = None
        self.schedule = None
        self.failed = None
        self.complete = None
        self.context = context

    def listen(self, schedule, failed):
        """Report to a reactor from now on; see ``_watches.Watches.listen``."""
        self.schedule = schedule
        self.failed = failed
        self.poll_scheduled = False

    def fail_with(self, error):
        """Fail every later watch with *error*; see ``_watches.Watches.fail_with``."""
        if self.fault is None:
            self.fault = error

    def pause(self, paused):
        """Query no events on the loop's thread while *paused*; see ``_watches.Watches.pause``."""
        self.paused = paused

    def serve_fast(self, FastPath fast):
        """Complete *fast*'s jobs with it; see ``_watches.Watches.serve_fast``."""
        self.fast = fast
        self.complete = fast.complete

    def __dealloc__(self):
        free(self._running)
        free(self._checked)

    # -- adding ----------------------------------------------------------------------------

    def watch(self, int lane, event, callback, double expect=0.0):
        """Call ``callback(None)`` once *event* (on lane *lane*) completed, or
        ``callback(error)`` if the device failed. The event returns to the pool afterwards.
        *expect*: when the work is expected to end (``perf_counter()``), if known. Returns the
        watch."""
        self.seq += 1
        cdef Watch watch = Watch(self.seq, event, callback, expect)
        if self.fault is not None:
            self._finish(watch, self.fault)
            return watch
        (<WatchLane>self.lanes[lane]).pending.append(watch)
        self.pending += 1
        if not self.poll_scheduled:
            self._request_poll()
        return watch

    def request_poll(self):
        """Have the loop poll soon (once: a scheduled poll is not asked for again)."""
        self._request_poll()

    cdef int _request_poll(self) except -1:
        if self.schedule is None:
            return 0
        self.poll_scheduled = True
        self.poll_asked = self.window_start = _now()
        self.schedule()
        return 0

    # -- completing --------------------------------------------------------------------------

    def finish(self, WatchItem watch, error):
        """*watch*'s event completed (or failed with *error*): its event back to the pool
        unless a waiter holds it, then what waits for it."""
        self._finish(watch, error)

    def call(self, WatchItem watch, error):
        """Call what waits for *watch*; a failing callback never stops the reactor. The watch
        lets go of its callback first; see ``_watches.Watches.call``."""
        self._call(watch, error)

    cdef int _finish(self, WatchItem watch, object error) except -1:
        watch.finished = True
        if not watch.held:
            self.idle_events.append(watch._event)
        return self._call(watch, error)

    cdef int _call(self, WatchItem watch, object error) except -1:
        cdef object callback
        try:
            if type(watch) is FastJob and self.fast is not None:
                self.fast._complete(<FastJob>watch, error)
            elif watch.callback is None:
                self.complete(watch, error)
            else:
                callback, watch.callback = watch.callback, None
                callback(error)
        except Exception as exc:
            _logger.error("reactor.callback_failed", error=repr(exc), exc_info=exc)
        return 0

    def drain(self, Py_ssize_t limit, double now, double deadline):
        """Finish the watches whose events completed, oldest first across the lanes; see
        ``_watches.Watches.drain``. Returns ``(finished, how)``."""
        cdef list lanes = self.lanes
        cdef Py_ssize_t n = self._n, i, done = 0
        cdef WatchLane lane
        cdef WatchLane best
        cdef WatchItem head
        cdef WatchItem watch
        cdef object pending
        cdef long long seq = 0
        cdef int code
        cdef double t
        cdef bint busy
        memset(self._running, 0, n)
        memset(self._checked, 0, n)
        while True:
            if done >= limit:
                return done, STOPPED
            if done >= MIN_COMPLETIONS:
                t = _now()
                if t + (t - now) / done > deadline:
                    return done, STOPPED
            best = None
            for i in range(n):
                if self._running[i]:
                    continue
                lane = <WatchLane>lanes[i]
                pending = lane.pending
                if not pending:
                    continue
                head = <WatchItem>pending[0]
                if best is None or head.seq < seq:
                    best = lane
                    seq = head.seq
            if best is None:
                busy = False
                for i in range(n):
                    if self._running[i]:
                        busy = True
                return done, (BUSY if busy else IDLE)
            pending = best.pending
            i = best.index
            if best.ready:
                code = 0
            else:
                code = _NOT_READY
                if not self._checked[i] and len(pending) > 1:
                    self._checked[i] = 1
                    # Work on one stream completes in order: if its newest event completed,
                    # so did every older one, and this one query settles them all.
                    if _query(<WatchItem>pending[len(pending) - 1]) == 0:
                        best.ready = len(pending)
                        code = 0
                if code != 0:
                    code = _query(<WatchItem>pending[0])
                    if code == _NOT_READY:
                        self._running[i] = 1
                        continue
                    if code == 0:
                        best.ready = 1
            watch = <WatchItem>pending.popleft()
            self.pending -= 1
            done += 1
            if code != 0:
                best.ready = 0
                self.failed(watch, code)
                return done, FAILED
            best.ready -= 1
            self._finish(watch, None)

    def spin(self, double until=0.0):
        """Poll the only watched event here for up to ``spin_window`` seconds, after catching
        up with a poll that waits behind other callbacks; see ``_watches.Watches.spin``."""
        cdef double now, held
        cdef bint catch_up, lone
        if self.paused or not self.pending:
            return
        now = _now()
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
        cdef cydriver.CUcontext current = NULL
        cdef bint pushed = False
        if self.context:  # the backend's own context, whatever the thread had current
            cydriver.cuCtxGetCurrent(&current)
            if current != <cydriver.CUcontext>self.context:
                pushed = cydriver.cuCtxPushCurrent(<cydriver.CUcontext>self.context) == 0
        try:
            if catch_up:  # others' completions only, the newest left: the task yields
                self.drain(min(MIN_COMPLETIONS, self.pending - 1), now, now + CATCH_UP_BUDGET)
                return
            if lone:
                self._spin_lone(now, held, until)
        finally:
            if pushed:
                cydriver.cuCtxPopCurrent(&current)

    cdef int _spin_lone(self, double now, double held, double until) except -1:
        cdef WatchLane lane = None
        cdef WatchItem watch
        cdef int code
        cdef Py_ssize_t i
        cdef double deadline
        for i in range(self._n):
            lane = <WatchLane>self.lanes[i]
            if lane.pending:
                break
        watch = <WatchItem>lane.pending[0]
        if watch.held:
            return 0
        if until < 0.0:  # OWN_END: the watch's own expected end, if near
            until = watch.expect if 0.0 < watch.expect - now <= _SPIN_CAP else 0.0
        deadline = now + self.spin_window
        if until <= 0.0 and watch.expect - now > _SPIN_SKIP * self.spin_window:
            deadline = now  # expected to end well past the window: one query
        if until > 0.0:
            deadline = max(deadline, min(until + _SPIN_SLACK, now + _SPIN_CAP))
        while True:
            code = _query(watch)
            if code != _NOT_READY:
                break
            if _now() > deadline:
                return 0
        lane.pending.popleft()
        lane.ready = 0
        self.pending -= 1
        self.spins += 1
        if not held:
            self.held_since = now
        if code == 0:
            self._finish(watch, None)
        else:
            self.failed(watch, code)
        return 0

    def take_all(self):
        """Every watch of every lane, in lane order; the lanes are left empty."""
        cdef list watches = []
        cdef WatchLane lane
        for lane in self.lanes:
            watches.extend(lane.pending)
            lane.pending.clear()
            lane.ready = 0
        self.pending = 0
        return watches
