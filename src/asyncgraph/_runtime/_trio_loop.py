"""The asyncio loop calls the runtime makes, on trio: :class:`TrioLoop` and its futures.

``TrioToken.run_sync_soon`` runs callbacks (from any thread), :class:`TrioFuture` parks and
reschedules trio tasks, and tasks are trio system tasks; a system task per watched file
descriptor stands in for ``add_reader``, and one per deadline for ``_deadline``'s timer and
checks (:meth:`TrioLoop.call_at_deadline`). ``run_in_executor`` runs in a thread pool of the
run's, shut down as the run's main task returns. ``_loop`` chooses between this and asyncio.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar, cast

import structlog

__all__ = ("TrioFuture", "TrioLoop", "TrioTask", "TrioTimer", "copy_outcome", "trio_loop")

T = TypeVar("T")

_log = structlog.get_logger("asyncgraph")


def copy_outcome(source: concurrent.futures.Future[T], target: asyncio.Future[T]) -> None:
    """Complete *target* as *source* completed (on *target*'s loop)."""
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


# -- futures and tasks --------------------------------------------------------------------------

_PENDING, _DONE, _CANCELLED = 0, 1, 2


class TrioFuture:
    """An asyncio-style future for trio: any number of trio tasks await it.

    Completed on the trio thread (``set_result``/``set_exception``/``cancel``); callbacks run
    soon after, through the run's token. A task cancelled while it waits stops waiting; the
    future is not affected.
    """

    __slots__ = ("_callbacks", "_loop", "_outcome", "_retrieved", "_state", "_waiters")

    def __init__(self, loop: TrioLoop) -> None:
        self._loop = loop
        self._state = _PENDING
        self._outcome: Any = None
        self._retrieved = False
        self._waiters: list[Any] = []
        self._callbacks: list[Callable[[Any], object]] = []

    def done(self) -> bool:
        return self._state != _PENDING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def result(self) -> Any:
        self._retrieved = True
        if self._state == _PENDING:
            raise asyncio.InvalidStateError("result is not set")
        if self._state == _CANCELLED:
            raise asyncio.CancelledError
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome

    def exception(self) -> BaseException | None:
        self._retrieved = True
        if self._state == _PENDING:
            raise asyncio.InvalidStateError("exception is not set")
        if self._state == _CANCELLED:
            raise asyncio.CancelledError
        return self._outcome if isinstance(self._outcome, BaseException) else None

    def set_result(self, value: Any) -> None:
        self._finish(_DONE, value)

    def set_exception(self, exc: BaseException) -> None:
        self._finish(_DONE, exc)

    def cancel(self, msg: object = None) -> bool:
        if self._state != _PENDING:
            return False
        self._finish(_CANCELLED, None)
        return True

    def add_done_callback(self, fn: Callable[[Any], object], *, context: object = None) -> None:
        if self._state != _PENDING:
            self._loop.call_soon(fn, self)
        else:
            self._callbacks.append(fn)

    def _finish(self, state: int, outcome: Any) -> None:
        if self._state != _PENDING:
            raise asyncio.InvalidStateError(f"{self!r} is already done")
        self._state = state
        self._outcome = outcome
        import trio

        for task in self._waiters:
            trio.lowlevel.reschedule(task)
        self._waiters = []
        for fn in self._callbacks:
            self._loop.call_soon(fn, self)
        self._callbacks = []

    def __await__(self) -> Generator[Any, None, Any]:
        import trio

        if self._state == _PENDING:
            task = trio.lowlevel.current_task()
            self._waiters.append(task)

            def abort(_raise_cancel: object) -> Any:
                self._waiters.remove(task)
                return trio.lowlevel.Abort.SUCCEEDED

            yield from trio.lowlevel.wait_task_rescheduled(abort).__await__()  # noqa: ASYNC105  # a generator-based __await__
        else:
            yield from trio.lowlevel.checkpoint().__await__()  # noqa: ASYNC105  # likewise
        return self.result()

    __iter__ = __await__

    def __repr__(self) -> str:
        state = ("pending", "done", "cancelled")[self._state]
        return f"<TrioFuture {state}>"


class TrioTask(TrioFuture):
    """A coroutine run as a trio system task, completing like a future; ``cancel()`` works."""

    __slots__ = ("_cancel_asked", "_scope", "_shielded")

    def __init__(self, loop: TrioLoop, shielded: bool = False) -> None:
        super().__init__(loop)
        self._scope: Any = None
        self._cancel_asked = False
        self._shielded = shielded  # the end of the run does not cancel it

    def cancel(self, msg: object = None) -> bool:
        if self._state != _PENDING:
            return False
        self._cancel_asked = True
        if self._scope is not None:
            self._scope.cancel()
        return True

    async def _run(self, coro: Coroutine[Any, Any, Any]) -> None:
        import trio

        try:
            with trio.CancelScope(shield=self._shielded) as scope:
                self._scope = scope
                if self._cancel_asked:
                    scope.cancel()
                result = await coro
        except BaseException as exc:
            if isinstance(exc, trio.Cancelled):
                # The run is ending (its system tasks are cancelled): nobody is left to wait.
                super().cancel()
                raise
            self.set_exception(exc)
            return
        finally:
            self._scope = None
        if scope.cancelled_caught:
            super().cancel()
        else:
            self.set_result(result)


class TrioTimer:
    """The handle :meth:`TrioLoop.call_at_deadline` returns, like asyncio's ``TimerHandle``."""

    __slots__ = ("_scope",)

    def __init__(self, scope: Any) -> None:
        self._scope = scope

    def cancel(self) -> None:
        """Do not make the call, if it has not run yet (on the trio thread)."""
        self._scope.cancel()


class TrioLoop:
    """The asyncio loop calls the runtime makes, on one trio run (one instance per run)."""

    def __init__(self, token: Any) -> None:
        self._token = token
        self._closed = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._ending = False  # the run's main task returned: its executor was shut down
        self._readers: dict[int, Any] = {}  # fd -> the cancel scope of the task watching it

    def __repr__(self) -> str:
        return f"<TrioLoop closed={self._closed}>"

    def is_closed(self) -> bool:
        """Whether the trio run has finished (asked of the run, which is then woken once)."""
        if not self._closed:
            try:
                self._token.run_sync_soon(_nothing)
            except RuntimeError:  # trio.RunFinishedError
                self._closed = True
        return self._closed

    def call_soon(self, fn: Callable[..., object], *args: Any, context: object = None) -> None:
        try:
            self._token.run_sync_soon(_call_logged, fn, args)
        except RuntimeError:  # trio.RunFinishedError
            self._closed = True
            raise

    call_soon_threadsafe = call_soon

    def call_at_deadline(
        self,
        delay: float,
        fn: Callable[..., object],
        *args: Any,
        clock: Callable[[], float],
        slack: float,
    ) -> TrioTimer:
        """Call ``fn(*args)`` at the first turn at or after *delay* seconds by *clock*: a
        system task sleeps until *slack* before, then checks at each checkpoint (trio's sleep
        wakes whole milliseconds late). ``cancel()`` on the handle stops it."""
        import trio

        scope = trio.CancelScope()
        at = clock() + delay

        async def fire() -> None:
            with scope:
                left = at - clock()
                if left > slack:
                    await trio.sleep(left - slack)
                while clock() < at:
                    await trio.lowlevel.checkpoint()
                _call_logged(fn, args)

        trio.lowlevel.spawn_system_task(fire, name="asyncgraph-deadline")
        return TrioTimer(scope)

    def add_reader(self, fd: int, callback: Callable[..., object], *args: Any) -> None:
        """Call ``callback(*args)`` whenever *fd* is readable: a system task waits for it with
        ``trio.lowlevel.wait_readable`` (on the trio thread)."""
        import trio

        self.remove_reader(fd)
        scope = trio.CancelScope()

        async def watch() -> None:
            with scope:
                while True:
                    try:
                        await trio.lowlevel.wait_readable(fd)
                    except trio.ClosedResourceError:  # remove_reader() told trio of the close
                        return
                    _call_logged(callback, args)

        self._readers[fd] = scope
        trio.lowlevel.spawn_system_task(watch, name=f"asyncgraph-reader-{fd}")

    def remove_reader(self, fd: int) -> bool:
        """Stop watching *fd* (on the trio thread); whether it was watched."""
        import trio

        scope = self._readers.pop(fd, None)
        if scope is None:
            return False
        scope.cancel()
        trio.lowlevel.notify_closing(fd)  # the fd may be closed once this returns
        return True

    def create_future(self) -> asyncio.Future[Any]:
        return cast("asyncio.Future[Any]", TrioFuture(self))

    def create_task(
        self, coro: Coroutine[Any, Any, T], *, shielded: bool = False, **_: object
    ) -> asyncio.Task[T]:
        import trio

        task = TrioTask(self, shielded)
        trio.lowlevel.spawn_system_task(task._run, coro, name=getattr(coro, "__qualname__", None))
        return cast("asyncio.Task[T]", task)

    def run_in_executor(
        self, executor: concurrent.futures.Executor | None, fn: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        own = executor is None
        if executor is None:
            executor = self._executor
            if executor is None:
                executor = self._executor = concurrent.futures.ThreadPoolExecutor(
                    thread_name_prefix="asyncgraph-trio"
                )
                if not self._ending:
                    import trio

                    trio.lowlevel.spawn_system_task(
                        self._shut_at_end, name="asyncgraph-executor-end"
                    )
        future = executor.submit(fn, *args)
        if own and self._ending:  # work of a close that outlasts the main task
            self._end_executor()  # its thread ends once the work is done
        wrapped: asyncio.Future[T] = self.create_future()
        future.add_done_callback(
            lambda done: self.call_soon_threadsafe(copy_outcome, done, wrapped)
        )
        return wrapped

    async def _shut_at_end(self) -> None:
        """A system task: trio cancels it as the run's main task returns, which shuts the
        run's executor down, so its idle threads do not outlive ``trio.run()``."""
        import trio

        try:
            await trio.sleep_forever()
        finally:
            self._ending = True
            self._end_executor()

    def _end_executor(self) -> None:
        """Shut the executor down without waiting: each thread ends once its work is done."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)


def _nothing() -> None:
    pass


def _call_logged(fn: Callable[..., object], args: tuple[Any, ...]) -> None:
    # An exception escaping a run_sync_soon callback would crash the trio run; asyncio logs
    # exceptions of callbacks, and so do we.
    try:
        fn(*args)
    except Exception:
        _log.exception("loop.callback_failed", callback=repr(fn))


_run_loop: Any = None  # a trio.lowlevel.RunVar: the TrioLoop of each trio run, made on first use


def trio_loop(trio: Any, token: Any) -> TrioLoop:
    """The :class:`TrioLoop` of the current trio run (made on first use)."""
    global _run_loop
    if _run_loop is None:
        _run_loop = trio.lowlevel.RunVar("asyncgraph_loop", default=None)
    loop: TrioLoop | None = _run_loop.get()
    if loop is None:
        loop = TrioLoop(token)
        _run_loop.set(loop)
    return loop
