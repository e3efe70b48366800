"""A backend's own CUDA context, current around every driver call it makes.

A thread has one current context, and other code on the same thread changes it: PyTorch and
CuPy make their own device's primary context current, a second backend in a device group makes
its own. So a backend never assumes its context is current. Each of its entry points (the
front's calls into the engine, the reactor's loop callbacks, the tasks and callbacks of its
paths) checks which context is current, one ``cuCtxGetCurrent``, and pushes its own only if
another is, popping it again before returning: the thread is left as the backend found it.

- :meth:`OwnContext.enter` / :meth:`OwnContext.leave` bracket a run of driver calls (``with
  ctx:`` on the loop's thread); :func:`in_context` does it for a method of an object with a
  ``device``.
- :meth:`OwnContext.steps` runs a coroutine with the context current during each of its steps
  (between its awaits), never while it is suspended: the loop's other tasks find their own.
- Threads the backend owns (its waiter threads) set the context once, when they start.

The compiled fast path makes the same check in C (``_fast.pxi``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Generator
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, cast

from cuda.bindings import driver as drv

from ._driver import check

__all__ = ("OwnContext", "in_context")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

_get_current = drv.cuCtxGetCurrent


class OwnContext:
    """The context a backend's driver calls run in.

    Args:
        handle: the ``CUcontext`` (the device's primary context).
    """

    __slots__ = ("_pushed", "address", "handle")

    def __init__(self, handle: Any) -> None:
        self.address = int(handle) if handle is not None else 0
        # ``None``: no context to own (a NULL one: the reactor's tests, without a device).
        self.handle = handle if self.address else None
        self._pushed: list[bool] = []  # ``with``: what each enter did, innermost last

    def __enter__(self) -> None:
        self._pushed.append(self.enter())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pushed.pop():
            drv.cuCtxPopCurrent()

    def enter(self) -> bool:
        """Make it current unless it is; whether it was pushed (pass that to :meth:`leave`).

        Raises:
            CudaError: the driver refused to push it.
        """
        handle = self.handle
        if handle is None or _get_current()[1] == handle:  # CUcontext compares by address
            return False
        check(drv.cuCtxPushCurrent(handle), "cuCtxPushCurrent")
        return True

    @staticmethod
    def leave(pushed: bool) -> None:
        """Undo :meth:`enter`: pop the context if it pushed it."""
        if pushed:
            drv.cuCtxPopCurrent()

    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` with the context current."""
        pushed = self.enter()
        try:
            return fn(*args, **kwargs)
        finally:
            if pushed:
                drv.cuCtxPopCurrent()

    def wrap(self, fn: Callable[P, R]) -> Callable[P, R]:
        """*fn*, made to run with the context current (a loop callback, a done callback)."""

        @functools.wraps(fn)
        def in_own(*args: P.args, **kwargs: P.kwargs) -> R:
            return self.call(fn, *args, **kwargs)

        return in_own

    def steps(self, coro: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        """*coro*, run with the context current during each step, never while suspended."""
        return _in_steps(_Steps(coro, self))

    def manager(self, manager: AbstractAsyncContextManager[T]) -> AbstractAsyncContextManager[T]:
        """*manager*, entered and exited with the context current (not its body)."""
        return _Manager(manager, self)

    def __repr__(self) -> str:
        return f"<OwnContext {self.address:#x}>"


class _Steps:
    """Awaiting it drives a coroutine one step at a time, each inside the context."""

    __slots__ = ("_context", "_coro")

    def __init__(self, coro: Coroutine[Any, Any, Any], context: OwnContext) -> None:
        self._coro = coro
        self._context = context

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, context = self._coro, self._context
        value: Any = None
        error: BaseException | None = None
        try:
            while True:
                pushed = context.enter()
                try:
                    if error is None:
                        yielded = coro.send(value)
                    else:
                        pending, error = error, None
                        yielded = coro.throw(pending)
                except StopIteration as stop:
                    return stop.value
                finally:
                    if pushed:
                        drv.cuCtxPopCurrent()
                try:
                    value = yield yielded
                except GeneratorExit:
                    raise
                except BaseException as exc:  # thrown in by the loop (a cancellation): pass it on
                    value, error = None, exc
        finally:
            # Closed early (the task was dropped): run the coroutine's own cleanup in context.
            if getattr(coro, "cr_frame", None) is not None:
                pushed = context.enter()
                try:
                    coro.close()
                finally:
                    if pushed:
                        drv.cuCtxPopCurrent()


async def _in_steps(steps: Awaitable[T]) -> T:
    return await steps


class _Manager(AbstractAsyncContextManager[Any]):
    __slots__ = ("_context", "_manager")

    def __init__(self, manager: AbstractAsyncContextManager[Any], context: OwnContext) -> None:
        self._manager = manager
        self._context = context

    async def __aenter__(self) -> Any:
        return await self._context.steps(_aenter(self._manager))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._context.steps(_aexit(self._manager, exc_type, exc, tb))


async def _aenter(manager: AbstractAsyncContextManager[Any]) -> Any:
    return await manager.__aenter__()


async def _aexit(
    manager: AbstractAsyncContextManager[Any],
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> bool | None:
    return await manager.__aexit__(exc_type, exc, tb)


F = TypeVar("F", bound=Callable[..., Any])


def in_context(method: F) -> F:
    """A method of an object with a ``device`` (holding ``ctx``), run with that context
    current; a coroutine method is run step by step in it (:meth:`OwnContext.steps`)."""
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        def stepped(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self.device.ctx.steps(method(self, *args, **kwargs))

        return cast(F, stepped)

    @functools.wraps(method)
    def called(self: Any, *args: Any, **kwargs: Any) -> Any:
        # OwnContext.enter, inlined: the general path of every dispatch comes through here.
        handle = self.device.ctx.handle
        if handle is None or _get_current()[1] == handle:
            return method(self, *args, **kwargs)
        check(drv.cuCtxPushCurrent(handle), "cuCtxPushCurrent")
        try:
            return method(self, *args, **kwargs)
        finally:
            drv.cuCtxPopCurrent()

    return cast(F, called)
