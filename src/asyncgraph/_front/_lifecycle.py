"""A backend's life: the loop it belongs to, open → closing → closed, and what closing waits for.

:class:`Lifecycle` holds the front's state that closing changes (the loop, the state, the
queue's waiting room, transfers in progress) and runs the close: refuse new work, fail what is
queued after the timeout, wait for what is in flight, close the resident buffers, shut the
engine down. A close from a later loop, once the backend's own loop ended, adopts the backend
and settles what the ended loop left first.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import numbers
import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from asyncgraph._runtime import _inbox, _loop, _poison
from asyncgraph._runtime._exceptions import (
    ArgumentTypeError,
    BackendClosedError,
    DeviceFaultError,
    DispatchError,
    UnsupportedError,
)

if TYPE_CHECKING:
    from asyncgraph._buffers._resident import ResidentStore
    from asyncgraph._front._dispatcher import Dispatcher
    from asyncgraph._jobs._scheduler import Job, Scheduler
    from asyncgraph._runtime._telemetry import Telemetry

    from ._engine_protocols import Engine

__all__ = ("CLOSED", "CLOSING", "OPEN", "Lifecycle", "Room")

OPEN: Final = 0
CLOSING: Final = 1
CLOSED: Final = 2


class Room:
    """What each batch of the scheduler's effects may change for the front: room in the queue
    for a waiting ``submit()``, and the quiet a close waits for.

    Made first, and shared: the dispatcher calls :meth:`after_batch` after each batch (with the
    scheduler it made), the lifecycle closes with it. It holds no collaborator: the scheduler
    is passed in.

    Attributes:
        waiting: ``submit()`` calls (and turns) waiting for room in the queue.
        max_queued: ``BackendOptions.max_queued`` (``sys.maxsize`` for no bound).
        transfers: uploads and downloads in progress (closing waits for them).
        drained: while a close waits: the future set once nothing is in flight.
    """

    __slots__ = ("drained", "max_queued", "transfers", "waiting")

    def __init__(self, max_queued: int | None) -> None:
        self.waiting = _loop.WaitQueue()
        self.max_queued = max_queued or sys.maxsize
        self.transfers = 0
        self.drained: asyncio.Future[None] | None = None

    def after_batch(self, scheduler: Scheduler) -> None:
        """After the scheduler's effects ran: let a waiting ``submit()`` in, see if drained."""
        waiting = self.waiting
        if waiting.parked and scheduler.queued < self.max_queued:
            waiting.wake()  # room in the queue: one submit() may go (and wakes the next)
        if self.drained is not None:
            self.check_drained(scheduler)

    def check_drained(self, scheduler: Scheduler) -> None:
        """Let the close go on once nothing is queued, in flight or transferring."""
        drained = self.drained
        if drained is None or not scheduler.is_idle() or self.transfers:
            return
        if not drained.done():
            drained.set_result(None)

    def renew(self) -> _loop.WaitQueue:
        """Start over on a new loop: the waiters, transfers and close of the ended one never
        resume. Returns the new :attr:`waiting`."""
        self.waiting = _loop.WaitQueue()
        self.drained = None
        self.transfers = 0
        return self.waiting


class Lifecycle:
    """The loop, state and closing of one backend (the front's collaborator).

    Args:
        name: the backend's name.
        engine: the engine, which it closes (its closing methods).
        dispatcher: the scheduler and its effects (closing fails or abandons what waits).
        store: the resident buffers (closed before the engine shuts down).
        room: the queue's room and the close's wait for quiet (shared with the dispatcher).
        telemetry, log: the backend's counters and bound logger.
        loop: the loop the backend belongs to, if it was opened on one.

    Attributes:
        state: ``OPEN``, ``CLOSING`` or ``CLOSED``.
        loop: the event loop the backend belongs to (``None`` until first used).
        room: ``submit()`` calls waiting for room in the queue (the :class:`Room`'s).
    """

    def __init__(
        self,
        *,
        name: str,
        engine: Engine[Any],
        dispatcher: Dispatcher,
        store: ResidentStore,
        room: Room,
        telemetry: Telemetry,
        log: Any,
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        self._name = name
        self._engine = engine
        self._dispatcher = dispatcher
        self._scheduler = dispatcher.scheduler
        self._store = store
        self._room = room
        self._telemetry = telemetry
        self._log = log
        self.state = OPEN
        self.loop = loop
        self.room = room.waiting
        self._close_task: asyncio.Task[None] | None = None
        self._on_close: dict[int, Callable[[], None]] = {}
        self._hook_ids = itertools.count()
        dispatcher.bind(loop)
        _alive.add(self)  # reported at the process's exit if work is left in flight

    def on_close(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call *hook* (on the loop, synchronously) at the start of the first ``aclose()``.

        The backend still takes work then: a batcher flushes its pending items from it. A hook
        that raises is logged and the close goes on. Hooks run once, in registration order.

        Returns:
            A function that unregisters *hook* (harmless once it ran).

        Raises:
            ArgumentTypeError: *hook* is not callable.
        """
        if not callable(hook):
            raise ArgumentTypeError(
                f"on_close({hook!r}): pass a function of no arguments, called as "
                "the backend's first aclose() begins"
            )
        key = next(self._hook_ids)
        self._on_close[key] = hook

        def unregister() -> None:
            self._on_close.pop(key, None)

        return unregister

    def _run_close_hooks(self) -> None:
        hooks, self._on_close = list(self._on_close.values()), {}
        for hook in hooks:
            try:
                hook()
            except Exception:
                self._log.exception("backend.on_close_failed", hook=repr(hook))

    def call_in_turn(self, fn: Callable[[BaseException | None], object]) -> Callable[[], None]:
        """Call ``fn(None)`` once a dispatch finds room in the queue, in line with the
        ``submit()`` calls that wait for it: ``submit()``'s wait, for a caller with no task to
        wait in (a batcher's batch). At once, if nobody waits and there is room.

        *fn* gets the ``BackendClosedError`` of ``submit()``'s waiters instead if the backend
        closes first. It runs on the loop and is to dispatch at once, without awaiting.

        Returns:
            A function that gives the place in line up (harmless once *fn* was called); a turn
            it was given and did not use goes to the next in line.
        """
        if not self.room and self.has_room():
            fn(None)
            return _nothing
        return _Turn(self, fn).leave

    def has_room(self) -> bool:
        """Whether a dispatch finds room in the queue now (``max_queued``)."""
        return self._scheduler.queued < self._room.max_queued

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Belong to *loop* (the first loop that uses the backend)."""
        self.loop = loop
        self._dispatcher.bind(loop)

    def loop_for_use(self, failure: DeviceFaultError | None) -> asyncio.AbstractEventLoop:
        """The loop to use the backend on now: the running one, checked.

        Raises:
            BackendClosedError: the backend is closed.
            DeviceFaultError: it failed earlier with *failure*.
            UnsupportedError: no loop runs, or another loop owns the backend.
        """
        life = self
        if life.state != OPEN:
            raise BackendClosedError(
                f"backend {self._name} is closed; open a new one with asyncgraph.open_backend()"
            )
        if failure is not None:
            _poison.check(
                f"backend {self._name} failed earlier and takes no new work", failure.call
            )
            raise DeviceFaultError(  # not the process's poison: a context destroyed under it
                failure.code,
                failure.name,
                failure.call,
                f"backend {self._name} failed earlier and takes no new work; close it and open "
                "a new backend (see docs/errors.md)",
            )
        loop = _loop.running_loop()
        if loop is None:
            raise UnsupportedError(
                f"backend {self._name} is used from a thread with no running event loop; "
                "call it from async code on the loop it belongs to"
            ) from None
        if life.loop is None:
            self.bind(loop)
        elif loop is not life.loop:
            raise UnsupportedError(
                f"backend {self._name} belongs to another event loop; open one backend per "
                "event loop"
            )
        return loop

    # -- what closing waits for ------------------------------------------------------------------

    def transfer_started(self) -> None:
        """An upload or a download began."""
        self._room.transfers += 1

    def transfer_ended(self) -> None:
        """An upload or a download ended."""
        room = self._room
        room.transfers -= 1
        if room.drained is not None:
            room.check_drained(self._scheduler)

    # -- closing -------------------------------------------------------------------------------

    async def aclose(self, timeout: float | None = None) -> None:  # noqa: ASYNC109  # the timeout fails queued work; cancelling a shielded close cannot
        """``Backend.aclose``: see there."""
        if timeout is not None:
            _check_timeout(timeout)
        loop = _loop.current_loop()
        ended = None
        if self.loop is not None and self.loop is not loop:
            if self.state == CLOSED:
                await _loop.sleep(0)
                return
            if not self.loop.is_closed():
                raise UnsupportedError(
                    f"backend {self._name} belongs to another event loop, which is still open; "
                    "close it on that loop (from another thread: "
                    "asyncio.run_coroutine_threadsafe(backend.aclose(), loop))"
                )
            ended = self._adopt(loop)
        if self._close_task is None:
            if ended is None and self.state == OPEN:
                self._run_close_hooks()  # before anything is refused (a batcher's flush)
            if self.loop is not loop:
                self.bind(loop)  # opened outside a loop and closed before any use
            self._begin_closing()
            self._close_task = _loop.create_lasting_task(loop, self._close(ended))
        if timeout is None:
            await _loop.shield(self._close_task)
            return
        try:
            await _loop.wait_for(self._close_task, timeout)
        except TimeoutError:
            self.drop_queued(lambda job: f"was closed before {job} started (aclose timeout)")
            self.report_in_flight("backend.close_waits", timeout=timeout)
            await _loop.shield(self._close_task)

    def _begin_closing(self) -> None:
        self.state = CLOSING
        self.room.fail(
            lambda: BackendClosedError(
                f"backend {self._name} was closed while submit() waited for room in its queue"
            )
        )

    def drop_queued(self, why: Callable[[str], str]) -> None:
        """Fail every dispatch still queued with BackendClosedError (closing)."""

        def error(job: Job) -> BaseException:
            dispatch = f"dispatch #{job.id} of {job.call.kernel.name!r}"
            return BackendClosedError(f"backend {self._name} {why(dispatch)}")

        self._dispatcher.drop_queued(error)
        if self._room.drained is not None:
            self._room.check_drained(self._scheduler)

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        """The backend's loop has ended: belong to *loop*; the close settles what it left."""
        ended: asyncio.AbstractEventLoop = self.loop  # type: ignore[assignment]  # bound
        with _inbox.off_loop_lock:  # completions may be handled on worker threads meanwhile
            # Its waiters were on the ended loop; its uploads and downloads never resume.
            self.room = self._room.renew()
            self._begin_closing()
            self._close_task = None  # a close begun there never goes on
            self.drop_queued(
                lambda job: f"was left open when its event loop ended, before {job} started"
            )
        self.loop = loop
        self._dispatcher.bind(loop)
        return ended

    async def _settle_after(self, ended: asyncio.AbstractEventLoop) -> None:
        """Settle what the ended loop left in flight (runs on the new loop).

        The engine settles what it runs (completions handled off the ended loop, work carried
        by its callbacks); jobs that were still waiting to launch fail, since nothing resumes
        them.
        """
        with _inbox.off_loop_lock:
            jobs = self._scheduler.jobs_in_flight()
        await self._engine.settle_after(ended, jobs)
        self._dispatcher.abandon_waiting(
            lambda job: BackendClosedError(
                f"backend {self._name} was left open when its event loop ended, before "
                f"dispatch #{job.id} of {job.call.kernel.name!r} completed"
            )
        )

    async def _close(self, ended: asyncio.AbstractEventLoop | None) -> None:
        # Every step may be interrupted by the end of the loop, and is then started again.
        try:
            if ended is not None:
                await _loop.through_run_end(lambda: self._settle_after(ended))
            if not self._scheduler.is_idle() or self._room.transfers:
                drained = self._room.drained = self.loop.create_future()  # type: ignore[union-attr]  # bound
                await _loop.through_run_end(lambda: _loop.shield(drained))
            self._store.close_all()
            await _loop.through_run_end(self._engine.shutdown)
        except GeneratorExit:
            raise  # collected with the ended loop it ran on; a close on another loop goes on
        except BaseException:
            self.closed()
            raise
        self.closed()

    def closed(self) -> None:
        self.state = CLOSED
        snap = self._telemetry
        snap.sync()
        self._log.info(
            "backend.closed",
            dispatches=snap.dispatches,
            completed=snap.dispatches_completed,
            failed=snap.dispatches_failed,
        )

    def release_unclosed(self) -> None:
        """The backend was dropped without closing: report the dispatches still in flight,
        which nothing waits for any more (a kernel that never finishes keeps a waiter thread
        of the backend, not the process), and release what can be (the engine's)."""
        self.report_in_flight("backend.dropped_in_flight")
        self._engine.release_unclosed()

    def report_in_flight(self, event: str, **facts: Any) -> None:
        """Log *event* (a warning, with *facts*) naming the dispatches in flight, if any: what
        a close waits for once its timeout ran out, or what a dropped backend left."""
        jobs = self._scheduler.jobs_in_flight()
        if jobs:
            self._log.warning(
                event,
                dispatches=[job.id for job in jobs],
                kernels=sorted({job.call.kernel.name for job in jobs}),
                **facts,
            )

    def close_unused(self) -> None:
        """Close a backend nothing used, without a loop (``await open_backend()``)."""
        self.state = CLOSING
        self._store.close_all()
        self._engine.shutdown_now()
        self.closed()


_alive: weakref.WeakSet[Lifecycle] = weakref.WeakSet()


@atexit.register
def _at_exit() -> None:
    """The process exits with backends never closed: report the work they left in flight,
    which the exit does not wait for (a kernel that never finishes, say)."""
    for life in list(_alive):
        if life.state != CLOSED:
            life.report_in_flight("backend.exit_in_flight")


class _Turn:
    """A callback in line for room in the queue (:meth:`Lifecycle.call_in_turn`)."""

    __slots__ = ("_fn", "_gone", "_life", "_room", "_waiter")

    def __init__(self, life: Lifecycle, fn: Callable[[BaseException | None], object]) -> None:
        self._life = life
        self._fn = fn
        self._room = life.room
        self._gone = False  # called, or gave its place up
        self._park(first=False)

    def _park(self, first: bool) -> None:
        self._waiter = self._room.park(self._life.loop, first)  # type: ignore[arg-type]  # bound: the queue is full
        self._waiter.add_done_callback(self._woken)

    def _woken(self, waiter: asyncio.Future[None]) -> None:
        if waiter.cancelled():
            return
        error = waiter.exception()  # read even when gone: asyncio warns of one never read
        if self._gone:
            return
        if error is not None:
            self._gone = True
            self._fn(error)
            return
        life, room = self._life, self._room
        if not life.has_room():  # a dispatch() took the room first: wait again, at the front
            self._park(first=True)
            return
        self._gone = True
        try:
            self._fn(None)
        finally:
            if room and life.has_room():
                room.wake()  # room for the next one too (or this one dispatched nothing)

    def leave(self) -> None:
        if not self._gone:
            self._gone = True
            self._room.leave(self._waiter)


def _nothing() -> None:
    pass


def _check_timeout(timeout: object) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise ArgumentTypeError(f"aclose(timeout={timeout!r}): pass a number of seconds, or None")
    if not float(timeout) >= 0:  # NaN too
        raise DispatchError(f"aclose(timeout={timeout!r}): pass a number of seconds >= 0, or None")
