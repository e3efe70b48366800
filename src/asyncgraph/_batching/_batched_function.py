"""Batching any async function: :func:`batch` makes a :class:`BatchedFunction`.

The function takes a list of inputs (or, with ``row=``, one array of them stacked) and returns
one output per input, in order, as Ray Serve's ``@serve.batch`` does: a PyTorch or CuPy model,
a call to another service. Each caller awaits ``batched(item)`` with one input; the queue
(``_batch_queue.BatchQueue``) collects callers into batches with the same launch policies,
statistics, cancellation and error rules as :func:`asyncgraph.batcher`, and each batch runs
the function once, in a task of its own (a trio system task under trio), whose end hands each
caller its output.
"""

from __future__ import annotations

import inspect
import weakref
from asyncio import _get_running_loop
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Generic, TypeVar, overload

import numpy as np

from asyncgraph._args._checks import describe_value
from asyncgraph._runtime import _loop
from asyncgraph._runtime._exceptions import ArgumentTypeError, BatchFunctionError
from asyncgraph._runtime._resource import AsyncResource

from ._batch_options import BatcherStatistics, ItemChecker, Row, check_launch_options
from ._batch_queue import BatchQueue, Done

__all__ = ("BatchedFunction", "batch")

T = TypeVar("T")
R = TypeVar("R")
Array = np.ndarray[Any, Any]
# The function a BatchedFunction batches: inputs in, one output per input out.
BatchFn = Callable[[list[T]], Awaitable[Iterable[R]]]


def _name(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn))


class _FunctionRuns:
    """The runner of a :class:`BatchedFunction`'s queue: each batch is one call of the
    function, awaited in a task of its own."""

    __slots__ = ("_fn", "_max_size", "_name", "_row", "_tasks")

    def __init__(
        self, fn: Callable[[Any], Awaitable[Any]], name: str, max_size: int, row: Row | None
    ) -> None:
        self._fn = fn
        self._name = name
        self._max_size = max_size
        self._row = row
        self._tasks: set[Any] = set()  # the batches running (asyncio keeps weak references)

    def sizes(self, n: int) -> tuple[int, int]:
        return n, self._max_size

    def run(self, loop: Any, items: list[Any], size: int, done: Done) -> object:
        """Call the function on *items* (stacked with ``row``) and await it in a task, whose
        end calls *done*.

        Raises:
            BatchFunctionError: the function returned no awaitable.
            Exception: whatever the function raised when called.
        """
        row = self._row
        if row is None:
            coro = self._fn(items)
        else:
            stacked: Array = np.empty((len(items), *row.shape), row.dtype)
            np.concatenate(items, axis=None, out=stacked.reshape(-1))
            coro = self._fn(stacked)
        if not inspect.isawaitable(coro):
            raise BatchFunctionError(
                f"{self._name} returned {describe_value(coro)}, not an awaitable; batch an "
                "async def function (or one that returns an awaitable)"
            )
        task = loop.create_task(self._drive(coro, len(items), done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return None

    async def _drive(self, coro: Awaitable[Any], n: int, done: Done) -> None:
        try:
            outputs = await coro
        except Exception as exc:
            done(None, exc)
            return
        except BaseException as exc:  # the task was cancelled (its loop ends): so are the callers
            done(None, exc)
            raise
        try:
            count = len(outputs)
        except TypeError:
            done(
                None,
                BatchFunctionError(
                    f"{self._name} returned {describe_value(outputs)}, which has no len(); return "
                    "a list (or an array) of one output per input, in order"
                ),
            )
            return
        if count != n:
            done(
                None,
                BatchFunctionError(
                    f"{self._name} returned {count} outputs for a batch of {n} inputs; return one "
                    "output per input, in order"
                ),
            )
            return
        done(outputs, None)


class BatchedFunction(AsyncResource, Generic[T, R]):
    """Concurrent awaits of an async function of a batch, batched: ``await batched(item)``
    returns the function's output for *item*.

    Made by :func:`asyncgraph.batch`. It belongs to the event loop it is first called on.
    ``async with`` or ``await batched.aclose()`` launches the items collecting, refuses new
    calls and waits for the batches running. As a method decorator, each instance gets a
    batched function of its own.
    """

    def __init__(
        self,
        fn: Callable[[Any], Awaitable[Any]],
        *,
        max_size: int,
        max_delay: float,
        policy: str,
        row: Row | None,
    ) -> None:
        self._fn = fn
        self._name = name = f"batched function {_name(fn)!r}"
        self._options: dict[str, Any] = {
            "max_size": max_size,
            "max_delay": max_delay,
            "policy": policy,
            "row": row,
        }
        self._row = (row.dtype, row.shape) if row is not None else None
        self._check = ItemChecker(name, (f"the item of {name}",), (row,)) if row else None
        self._queue = BatchQueue(
            _FunctionRuns(fn, name, max_size, row),
            name=name,
            remake="asyncgraph.batch()",
            max_size=max_size,
            max_delay=max_delay,
            policy=policy,
        )
        self._bound: weakref.WeakKeyDictionary[Any, BatchedFunction[T, R]] | None = None

    @property
    def is_closed(self) -> bool:
        """Whether it was closed (by ``aclose()``)."""
        return self._queue.is_closed

    def statistics(self) -> BatcherStatistics:
        """A frozen snapshot of what it did so far (see :class:`BatcherStatistics`; without
        ``buckets`` and a backend's queue, ``padded_rows`` and ``waiting_for_room`` stay 0)."""
        return self._queue.statistics()

    def __repr__(self) -> str:
        return f"<BatchedFunction {_name(self._fn)!r} {self._queue.describe()}>"

    async def __call__(self, item: T) -> R:
        """Add *item* to a batch; return the function's output for it.

        Raises:
            DispatchError: with ``row``, the item is not a numpy array of the row's dtype and
                shape (``ArgumentTypeError``, ``ShapeMismatchError``); refused to this caller
                alone, before batching.
            BatchFunctionError: the function returned no awaitable, or not one output per
                input (every caller of the batch gets it).
            BackendClosedError: it is closed.
            UnsupportedError: the call is not on its event loop.
            Exception: whatever the function raised (every caller of the batch gets it).
        """
        loop: Any = _get_running_loop()
        row = self._row
        if row is None:
            fits = True
        else:
            value: Any = item
            fits = type(value) is np.ndarray and value.dtype is row[0] and value.shape == row[1]
        queue = self._queue
        waiter = queue.join(loop, item) if fits else None
        if waiter is None:
            try:
                if self._check is not None:
                    self._check((item,))
                loop = queue.loop_for_use()
            except Exception:
                await _loop.sleep(0)  # a checkpoint, also for a refusal
                raise
            waiter = queue.add(loop, item)
        try:
            return await waiter  # type: ignore[no-any-return]  # the function's output
        except BaseException:
            queue.leave(waiter)
            raise

    def __get__(self, instance: object, owner: type | None = None) -> BatchedFunction[T, R]:
        """As a method: the batched function of *instance*'s bound method (one per instance,
        made at its first use)."""
        if instance is None:
            return self
        bound = self._bound
        if bound is None:
            bound = self._bound = weakref.WeakKeyDictionary()
        try:
            batched = bound.get(instance)
            if batched is None:
                method = self._fn.__get__(instance, owner)
                batched = bound[instance] = BatchedFunction(method, **self._options)
        except TypeError:  # not weakly referenced (__slots__ without __weakref__), or unhashable
            raise ArgumentTypeError(
                f"{self._name} is a method of {type(instance).__name__}, whose instances it "
                "cannot tell apart (they are unhashable or take no weak reference); batch the "
                "bound method in __init__ instead: self.f = asyncgraph.batch(self._f)"
            ) from None
        return batched

    def flush(self) -> None:
        """Launch the batch collecting now, if any, without waiting for its policy."""
        self._queue.flush()

    async def aclose(self) -> None:
        """Launch the items collecting now, refuse new calls, wait for the batches running.

        Idempotent; a cancelled ``aclose()`` only stops waiting.
        """
        await self._queue.aclose()


@overload
def batch(
    fn: BatchFn[T, R],
    /,
    *,
    max_size: int = ...,
    max_delay: float = ...,
    policy: str = ...,
    row: None = ...,
) -> BatchedFunction[T, R]: ...
@overload
def batch(
    fn: Callable[[Array], Awaitable[Iterable[R]]],
    /,
    *,
    max_size: int = ...,
    max_delay: float = ...,
    policy: str = ...,
    row: Row,
) -> BatchedFunction[Array, R]: ...
@overload
def batch(
    fn: None = ...,
    /,
    *,
    max_size: int = ...,
    max_delay: float = ...,
    policy: str = ...,
    row: Row | None = ...,
) -> Callable[[Callable[..., Awaitable[Iterable[Any]]]], BatchedFunction[Any, Any]]: ...
def batch(
    fn: Callable[..., Awaitable[Iterable[Any]]] | None = None,
    /,
    *,
    max_size: int = 64,
    max_delay: float = 0.0005,
    policy: str = "adaptive",
    row: Row | None = None,
) -> Any:
    """Batch concurrent awaits of *fn*, an async function of a batch of inputs.

    ``fn(inputs)`` takes a list of inputs (with *row*: one numpy array of them stacked, of
    shape ``(n, *row.shape)``) and returns one output per input, in order (a list, an array, a
    tensor: anything with ``len()`` whose iteration gives the outputs). ``await
    batched(item)`` returns the output for *item*. Use it as a wrapper,
    ``batch(fn, max_size=...)``, or as a decorator, ``@batch`` or ``@batch(max_size=...)``
    (on a method too: each instance batches its own calls). See ``docs/batching.md``.

    Args:
        fn: the async function.
        max_size: the most inputs in a batch; a batch that reaches it launches at once.
        max_delay: the most seconds a batch collects after its first caller.
        policy: when a batch launches: ``"adaptive"`` (the default) or ``"fixed_delay"``,
            as for :func:`asyncgraph.batcher`.
        row: the shape and dtype of each input, a numpy array: each caller's input is checked
            against it (a wrong one is refused to its caller alone) and *fn* gets them
            stacked, in a new array per batch.

    Returns:
        The :class:`BatchedFunction` (or, without *fn*, a decorator that makes one).

    Raises:
        ArgumentTypeError: *fn* is not callable, or *row* is not an ``asyncgraph.Row``.
        DispatchError: an option's value is wrong.
    """
    size, delay, chosen = check_launch_options("batch", max_size, max_delay, policy)
    if row is not None and not isinstance(row, Row):
        raise ArgumentTypeError(
            f"batch(row={row!r}); pass ag.Row(shape, dtype), e.g. ag.Row((1024,), np.float32), "
            "or leave it out to get a list of the inputs"
        )

    def wrap(function: Callable[..., Awaitable[Iterable[Any]]]) -> BatchedFunction[Any, Any]:
        if not callable(function):
            raise ArgumentTypeError(
                f"batch() takes an async function of a list of inputs, got "
                f"{describe_value(function)}"
            )
        return BatchedFunction(function, max_size=size, max_delay=delay, policy=chosen, row=row)

    return wrap if fn is None else wrap(fn)
