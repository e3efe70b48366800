"""PendingDispatch: the awaitable handle ``dispatch()`` returns.

This module is the one implementation of a pending result's states. Where the compiled core is
built, it is compiled too (``_pending.pxd`` declares its class as an extension type and the
functions the compiled fast path calls: :func:`new_pending` and :func:`set_outcome`), and the
compiled core calls those through C; elsewhere the same source runs as plain Python.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator
from time import monotonic
from types import TracebackType
from typing import Any

from asyncgraph._runtime import _inbox, _loop
from asyncgraph._runtime._exceptions import UnsupportedError

__all__ = (
    "PendingDispatch",
    "new_pending",
    "set_outcome",
    "set_spin",
    "set_withdraw",
)

_PENDING = 0
_DONE = 1
_FAILED = 2

# Guards the lazy creation of a threading.Event for result()/exception() from other threads.
_event_lock = threading.Lock()
# How often a thread blocked in result() looks whether the dispatch's loop closed meanwhile.
_CLOSED_CHECK = 0.1


def _wait_for(event: threading.Event, timeout: float | None, loop: Any) -> bool:
    """``event.wait(timeout)``; once *loop* is closed, first kick what completes its work (a
    CUDA reactor whose loop closed while it polled would otherwise never settle it)."""
    deadline = None if timeout is None else monotonic() + timeout
    while True:
        if loop.is_closed():
            _inbox.kick(loop)
            return event.wait(None if deadline is None else max(0.0, deadline - monotonic()))
        step = _CLOSED_CHECK if deadline is None else min(_CLOSED_CHECK, deadline - monotonic())
        if event.wait(max(0.0, step)):
            return True
        if deadline is not None and monotonic() >= deadline:
            return False


class PendingDispatch:
    """A dispatch that was submitted and may not have completed yet.

    ``await pending`` returns a tuple with one result per ``Out``/``InOut`` argument, in
    argument order: a numpy array, or the resident buffer for ``Out(into=buffer)``.

    A dispatch that has not launched yet (queued behind others) can be withdrawn:
    :meth:`cancel` does it, and so does cancelling every task that awaits it, when no done
    callback or thread waits on it too; it then fails with :class:`WithdrawnError` and its
    kernel never runs. Once launched, cancelling a task that awaits it cancels only that wait:
    the dispatch runs to completion and releases its buffers only after its work finished.
    Any number of tasks may await one dispatch, and code on other threads may block on
    :meth:`result`.

    Created by ``Backend.dispatch``; there is no public constructor.
    """

    # The fields, as slots here and as the extension type's fields in _pending.pxd (the same
    # names: keep the two alike).
    __slots__ = (
        "__weakref__",
        "_callbacks",
        "_device_time",
        "_event",
        "_loop",
        "_outcome",
        "_spin",
        "_state",
        "_traceback",
        "_waiters",
        "_withdraw",
        "dispatch_id",
        "kernel_name",
    )

    _loop: asyncio.AbstractEventLoop
    _state: int  # _PENDING, _DONE or _FAILED
    _outcome: Any  # the results (a tuple) or the exception, once completed
    _waiters: list[asyncio.Future[None]] | None
    _callbacks: list[Callable[[PendingDispatch], object]] | None
    _event: threading.Event | None
    _device_time: float | None
    _spin: Callable[[], None] | None
    dispatch_id: int
    kernel_name: str
    # The failure's traceback as it was when the dispatch failed, set by set_outcome (not in
    # __init__: a dispatch that succeeds never pays for it). Each raise starts from it again.
    _traceback: TracebackType | None
    # How to withdraw the dispatch while it has not launched (set_withdraw; never set for one
    # that launched in the call, as the fast path's do): ``withdraw(abandoned)`` -> withdrawn.
    _withdraw: Callable[[bool], bool] | None

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        dispatch_id: int,
        kernel_name: str,
        spin: Callable[[], None] | None = None,
    ) -> None:
        _start(self, loop, dispatch_id, kernel_name, spin)

    # -- reading -------------------------------------------------------------------------------

    def done(self) -> bool:
        """Whether the dispatch has completed, successfully or not."""
        return self._state != _PENDING

    @property
    def device_time(self) -> float | None:
        """Seconds the kernel ran on the device, for a dispatch made with ``timing=True``.

        ``None`` until the dispatch completed, and always ``None`` without ``timing=True``.
        The host backend reports the wall time of the host function.
        """
        return self._device_time

    def result(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Block until the dispatch completes and return its results.

        For code on other threads. On the event loop's own thread, only a completed dispatch
        can be read this way: use ``await`` there.

        Args:
            timeout: seconds to wait at most; ``None`` waits as long as it takes.

        Returns:
            One result per ``Out``/``InOut`` argument, in argument order.

        Raises:
            TimeoutError: the dispatch did not complete within *timeout*.
            UnsupportedError: called on the event loop's thread before the dispatch completed.
            Exception: whatever the dispatch failed with.
        """
        self._wait(timeout)
        if self._state == _FAILED:
            raise self._outcome.with_traceback(self._traceback)
        return self._outcome  # type: ignore[no-any-return]  # a tuple, set by set_outcome

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Block until the dispatch completes; return its exception, or ``None`` if it succeeded.

        Args:
            timeout: seconds to wait at most; ``None`` waits as long as it takes.

        Raises:
            TimeoutError: the dispatch did not complete within *timeout*.
            UnsupportedError: called on the event loop's thread before the dispatch completed.
        """
        self._wait(timeout)
        if self._state == _FAILED:
            exc: BaseException = self._outcome
            return exc
        return None

    def cancel(self) -> bool:
        """Withdraw the dispatch if it has not launched yet, as ``concurrent.futures``'
        ``Future.cancel()`` does.

        Returns:
            ``True`` if it was withdrawn: its kernel never runs, what it held is released, and
            awaiting it raises :class:`WithdrawnError`. ``False`` if it launched already,
            completed, or later work depends on a buffer it writes (``docs/jobs.md``): it
            then runs to completion.
        """
        withdraw = getattr(self, "_withdraw", None)
        return self._state == _PENDING and withdraw is not None and withdraw(False)

    def add_done_callback(self, fn: Callable[[PendingDispatch], object]) -> None:
        """Call ``fn(pending)`` on the event loop's thread once the dispatch completes.

        If it already completed, *fn* is scheduled at once (never called inline).
        """
        if self._state != _PENDING:
            self._loop.call_soon(fn, self)
        elif self._callbacks is None:
            self._callbacks = [fn]
        else:
            self._callbacks.append(fn)

    def __await__(self) -> Generator[Any, None, tuple[Any, ...]]:
        if self._state == _PENDING and self._spin is not None:
            self._spin()
        if self._state == _PENDING:
            # One waiter future per awaiting task: cancelling that task cancels its waiter only.
            waiter: asyncio.Future[None] = self._loop.create_future()
            if self._waiters is None:
                self._waiters = [waiter]
            else:
                self._waiters.append(waiter)
            cancelled = False
            try:
                yield from waiter
            except (RuntimeError, TypeError):
                # asyncio (a future of another loop) and trio (a foreign yield) throw these in.
                if _loop.running_loop() is not self._loop:
                    raise UnsupportedError(
                        f"dispatch #{self.dispatch_id} of {self.kernel_name!r} belongs to "
                        "another event loop; await it on its backend's loop, or call "
                        "pending.result() from another thread"
                    ) from None
                raise
            except BaseException:
                cancelled = True  # the awaiting task was cancelled (asyncio or trio)
                raise
            finally:
                if self._state == _PENDING and self._waiters is not None:
                    self._waiters.remove(waiter)
                    if cancelled and not self._waiters:
                        _abandoned(self)
        if self._state == _FAILED:
            raise self._outcome.with_traceback(self._traceback)
        return self._outcome  # type: ignore[no-any-return]  # a tuple, set by set_outcome

    def __repr__(self) -> str:
        state = ("pending", "done", "failed")[self._state]
        return f"<PendingDispatch #{self.dispatch_id} {self.kernel_name} {state}>"

    # -- completion (event loop thread; any thread once the loop is closed) ---------------------

    def _wait(self, timeout: float | None) -> None:
        if self._state != _PENDING:
            return
        if _loop.running_loop() is self._loop:
            raise UnsupportedError(
                f"dispatch #{self.dispatch_id} of {self.kernel_name!r} has not completed and "
                "result() would block the event loop that completes it; use "
                "'await pending' on the loop's thread"
            )
        with _event_lock:
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        # Published before the state is read again: set_outcome() sets the state first and
        # reads the event after, so one of the two sees the other (no lock on that side).
        if self._state != _PENDING:
            return
        if not _wait_for(event, timeout, self._loop):
            raise TimeoutError(
                f"dispatch #{self.dispatch_id} of {self.kernel_name!r} did not complete "
                f"within {timeout} s"
            )


def _start(
    pending: PendingDispatch,
    loop: asyncio.AbstractEventLoop,
    dispatch_id: int,
    kernel_name: str,
    spin: Callable[[], None] | None,
) -> None:
    """A new *pending* result: not completed, nothing waiting on it."""
    pending._loop = loop
    pending._state = _PENDING
    pending._outcome = None
    pending._waiters = None
    pending._callbacks = None
    pending._event = None
    pending._device_time = None
    # Set by a backend that can poll the completion right away (CUDA: Watches.spin).
    pending._spin = spin
    pending.dispatch_id = dispatch_id
    pending.kernel_name = kernel_name


def new_pending(
    loop: asyncio.AbstractEventLoop,
    dispatch_id: int,
    kernel_name: str,
    spin: Callable[[], None] | None = None,
) -> PendingDispatch:
    """``PendingDispatch(loop, dispatch_id, kernel_name, spin)``, without the generic call of a
    class (the compiled fast path makes its pending results with it)."""
    pending = PendingDispatch.__new__(PendingDispatch)
    _start(pending, loop, dispatch_id, kernel_name, spin)
    return pending


def set_outcome(
    pending: PendingDispatch, outcome: tuple[Any, ...] | BaseException, device_time: float | None
) -> None:
    """Resolve *pending* with results (and the device time) or an error: wake its awaiters,
    a thread blocked in ``result()``, and schedule its done callbacks.

    Once per pending result, after its job is ``DONE``; on the loop's thread, or any thread once
    the loop is closed. The dispatcher calls it for every job but the fast path's, which
    resolves its own with it.
    """
    # The outcome before the state: a thread that sees the state changed reads the outcome.
    pending._outcome = outcome
    pending._spin = None
    if isinstance(outcome, BaseException):
        pending._traceback = outcome.__traceback__
        pending._state = _FAILED
    else:
        pending._device_time = device_time
        pending._state = _DONE
    event = pending._event  # read after the state: see _wait
    if event is not None:
        event.set()
    # After the loop closed (a completion handled on a worker thread, see Inbox) waking its
    # tasks or scheduling callbacks raises RuntimeError: none of them can run any more.
    waiters = pending._waiters
    if waiters is not None:
        pending._waiters = None
        try:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        except RuntimeError:
            pass
    callbacks = pending._callbacks
    if callbacks is not None:
        pending._callbacks = None
        loop = pending._loop
        try:
            for fn in callbacks:
                loop.call_soon(fn, pending)
        except RuntimeError:
            pass


def _abandoned(pending: PendingDispatch) -> None:
    """The last task awaiting *pending* was cancelled: withdraw it, unless a done callback or
    a thread still waits for it."""
    withdraw = getattr(pending, "_withdraw", None)
    if withdraw is not None and pending._callbacks is None and pending._event is None:
        withdraw(True)


def set_withdraw(pending: PendingDispatch, withdraw: Callable[[bool], bool] | None) -> None:
    """Let :meth:`PendingDispatch.cancel` withdraw *pending* with *withdraw* (``None``: no
    more; its job launched or finished)."""
    pending._withdraw = withdraw


def set_spin(pending: PendingDispatch, spin: Callable[[], None] | None) -> None:
    """Let a lone ``await`` of *pending* spin with *spin* before it sleeps (CUDA reactor)."""
    pending._spin = spin
