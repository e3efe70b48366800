"""The event loop the runtime runs on: asyncio's (uvloop included), or trio's through an adapter.

The runtime is written against the small part of asyncio's loop interface it needs:
``call_soon``, ``call_soon_threadsafe`` (the reactor's and the host workers' cross-thread
wake-up), ``call_later`` (a batcher's deadline, through ``_deadline``; on trio
``TrioLoop.call_at_deadline``), ``create_future``, ``create_task`` and ``run_in_executor``.
Under asyncio that is the running loop itself, with nothing in between. Under trio,
:class:`TrioLoop` provides the same calls on trio's primitives (``_trio_loop``):
``TrioToken.run_sync_soon`` for callbacks (from any thread), :class:`TrioFuture` parks and
reschedules trio tasks, and tasks are trio system tasks.

Module functions stand in for asyncio's where the loop matters (:func:`sleep`, :func:`shield`,
:func:`wait_for`, :func:`wait_done`, :func:`wrap_future`, :func:`create_lasting_task`,
:func:`through_run_end`), so one code path serves both; :class:`WaitQueue` parks tasks in FIFO
order on either.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, cast

import structlog

from ._checkpoint import sleep as sleep
from ._trio_loop import TrioFuture, TrioLoop, copy_outcome, trio_loop

__all__ = (
    "TrioFuture",
    "TrioLoop",
    "WaitQueue",
    "create_lasting_task",
    "current_loop",
    "running_loop",
    "shield",
    "sleep",
    "through_run_end",
    "wait_done",
    "wait_for",
    "wrap_future",
)

T = TypeVar("T")

_log = structlog.get_logger("asyncgraph")
_RUN_END_RETRIES = 16


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The loop of the calling thread's running async code, or ``None`` outside of one.

    Under trio this is the run's :class:`TrioLoop` (typed as an asyncio loop: it has the part of
    the interface the runtime uses).
    """
    loop = asyncio._get_running_loop()
    if loop is not None:
        return loop
    trio = sys.modules.get("trio")
    if trio is None:
        return None
    try:
        token = trio.lowlevel.current_trio_token()
    except RuntimeError:
        return None
    return cast(asyncio.AbstractEventLoop, trio_loop(trio, token))


def current_loop() -> asyncio.AbstractEventLoop:
    """Like :func:`asyncio.get_running_loop`, for asyncio or trio.

    Raises:
        RuntimeError: no async code runs on this thread.
    """
    loop = running_loop()
    if loop is None:
        raise RuntimeError("no running event loop")
    return loop


def _is_trio(loop: object) -> bool:
    return type(loop) is TrioLoop


def _is_trio_future(future: object) -> bool:
    # TrioFuture poses as an asyncio.Future in annotations; tell them apart at run time.
    return isinstance(future, TrioFuture)


def shield(future: asyncio.Future[T]) -> Awaitable[T]:
    """Await *future* without cancelling it when the awaiting task is cancelled.

    Under trio awaiting a :class:`TrioFuture` never cancels it, so the future is its own shield.
    """
    if _is_trio_future(future):
        return future
    return asyncio.shield(future)


async def wait_for(future: asyncio.Future[T], timeout: float) -> T:  # noqa: ASYNC109  # asyncio.wait_for's shape
    """Await *future* for at most *timeout* seconds.

    Raises:
        TimeoutError: it did not complete in time (the future itself goes on).
    """
    if not _is_trio_future(future):
        return await asyncio.wait_for(asyncio.shield(future), timeout)
    import trio

    try:
        with trio.fail_after(timeout):
            return await future
    except trio.TooSlowError:
        raise TimeoutError from None


async def wait_done(future: asyncio.Future[Any]) -> None:
    """Wait until *future* (a task, say) is done, whatever its outcome, without raising it.

    Raises:
        CancelledError: the awaiting task itself was cancelled (the future goes on).
    """
    if future.done():
        return
    waiter: asyncio.Future[None] = current_loop().create_future()

    def wake(_done: object) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    await waiter


def create_lasting_task(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]
) -> asyncio.Task[T]:
    """A task that finishes even when the run ends while it runs (a backend's close).

    Under trio its cancel scope is shielded, so ``trio.run`` waits for it. ``asyncio.run``
    cancels the tasks left when its main coroutine returns and then waits for them: the
    coroutine must carry on after that one cancellation (``Backend._close`` does).
    """
    if _is_trio(loop):
        return cast(TrioLoop, loop).create_task(coro, shielded=True)
    return loop.create_task(coro)


async def through_run_end(step: Callable[[], Awaitable[object]]) -> None:
    """Await ``step()`` to its end, although the end of an asyncio run cancels the caller.

    ``asyncio.run`` cancels every task left when its coroutine returns, once, then waits for
    them: the interrupted step is started again (so it must be safe to repeat), a few times at
    most. Under trio, run the caller in a :func:`create_lasting_task` instead.
    """
    for _ in range(_RUN_END_RETRIES):
        try:
            await step()
        except asyncio.CancelledError:
            continue
        return
    await step()


class WaitQueue:
    """Tasks (or futures, :meth:`park`) waiting in FIFO order until woken, on asyncio or trio.

    Cancellation-safe in the manner of trio's ``CapacityLimiter``: a waiter cancelled while
    parked leaves the queue, and one cancelled after it was woken, before it ran, passes the
    wake-up on to the next.
    """

    __slots__ = ("parked",)

    def __init__(self) -> None:
        # The parked tasks' futures, oldest first (read it to test for waiters cheaply).
        self.parked: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return len(self.parked)

    async def wait(self, loop: asyncio.AbstractEventLoop, first: bool = False) -> None:
        """Park until :meth:`wake` (at the back, or at the front with *first*).

        Raises:
            BaseException: what :meth:`fail` was given, or the cancellation of the caller.
        """
        waiter = self.park(loop, first)
        try:
            await waiter
        except BaseException:
            self.leave(waiter)
            raise

    def park(self, loop: asyncio.AbstractEventLoop, first: bool = False) -> asyncio.Future[None]:
        """Park a future instead of a task (at the back, or at the front with *first*):
        :meth:`wake` completes it, :meth:`fail` fails it. Give it up with :meth:`leave`."""
        waiter: asyncio.Future[None] = loop.create_future()
        if first:
            self.parked.appendleft(waiter)
        else:
            self.parked.append(waiter)
        return waiter

    def leave(self, waiter: asyncio.Future[None]) -> None:
        """Take *waiter* out of the line; a wake-up it got and will not use goes to the next."""
        if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            self.wake()  # woken, then given up before it could use the turn
        else:
            if waiter in self.parked:
                self.parked.remove(waiter)
            waiter.cancel()

    def wake(self) -> None:
        """Wake the first waiter, if any."""
        waiters = self.parked
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def fail(self, error: Callable[[], BaseException]) -> None:
        """Wake every waiter with a new ``error()`` raised from its :meth:`wait`."""
        waiters = self.parked
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error())


def wrap_future(future: concurrent.futures.Future[T]) -> asyncio.Future[T]:
    """A loop future completed with the result of a :class:`concurrent.futures.Future`."""
    loop = current_loop()
    if not _is_trio(loop):
        return asyncio.wrap_future(future)
    wrapped: asyncio.Future[T] = loop.create_future()

    def copy(done: concurrent.futures.Future[T]) -> None:
        loop.call_soon_threadsafe(copy_outcome, done, wrapped)

    future.add_done_callback(copy)
    return wrapped
