"""Dynamic batching: many small awaits, one launch.

:func:`batcher` makes a :class:`Batcher`. Each caller awaits ``batcher(*rows)`` with one row of
each input; the batcher collects callers for at most ``max_delay`` seconds or until
``max_size`` are there, writes their rows straight into staging arrays from
``backend.pinned_empty``, runs one dispatch over the batch and hands each caller its own row of
each output. The batcher keeps the callers and the batches' states; ``_batch_launch``'s
``BatchLauncher`` stages, dispatches and splits the results (reusing the staging).

The deadline is kept by the event loop (``_deadline.call_at_deadline``: a timer of the loop
for most of the delay, then a check at each turn for the last millisecond, which the loop's
timers cannot resolve), armed by the first caller of a batch and cancelled when the batch
fills first: the loop launches the batch from the deadline's callback, in the first turn at
or after the deadline, whatever the callers' tasks are doing. The callers only wait for their
results. So the batcher runs on asyncio, uvloop and trio alike (``TrioLoop`` has the timer),
with no thread and no background task.

A batch due while the backend's bounded queue is full (``max_queued``) waits for room in line
with ``submit()`` (``backend.call_in_turn``), collecting more items meanwhile, up to
``max_size``: under backpressure batches grow instead of failing.
"""

from __future__ import annotations

import bisect
import weakref
from asyncio import _get_running_loop
from collections.abc import Callable, Sequence
from time import perf_counter
from types import TracebackType
from typing import Any

import numpy as np

from . import _deadline, _loop
from ._backend import Backend
from ._batch_launch import BatchLauncher
from ._batch_spec import BatcherStatistics, ItemChecker, LaunchShape, Row, check_options
from ._exceptions import ArgumentTypeError, BackendClosedError, UnsupportedError
from ._kernel import Kernel
from ._pending import PendingDispatch
from ._telemetry import Histogram, logger

__all__ = ("Batcher", "batcher")

Array = np.ndarray[Any, Any]


class _Batch:
    """Callers collecting for one dispatch; due once full, at the deadline, or flushed, and
    launched then, or once the backend's queue has room.

    Caller *i* is three entries, kept in step (no object per caller): ``futures[i]`` brings
    its results, ``items[i]`` holds its rows, ``t_calls[i]`` is when it called.
    """

    __slots__ = ("futures", "items", "launched", "leave_line", "t_calls", "timer")

    def __init__(self) -> None:
        self.timer: Any = None  # the handle of the deadline's call (cancel() stops it)
        self.futures: list[Any] = []
        self.items: list[tuple[object, ...]] = []
        self.t_calls: list[float] = []
        self.launched = False
        # Set while the batch is due and waits for room in the queue: gives its place up.
        self.leave_line: Callable[[], None] | None = None


class Batcher:
    """Collects concurrent callers' rows into batches and runs one dispatch per batch.

    Made by :func:`asyncgraph.batcher`. ``await batcher(*rows)`` returns a tuple with the
    caller's row of each output. It belongs to the event loop it is first called on, like its
    backend. ``async with`` or ``await batcher.aclose()`` flushes it and refuses new calls;
    closing the backend flushes it too.
    """

    def __init__(
        self,
        backend: Backend,
        kernel: Kernel,
        inputs: tuple[Row, ...],
        launcher: BatchLauncher,
        max_size: int,
        max_delay: float,
        buckets: tuple[int, ...],
    ) -> None:
        self._backend = backend
        self._kernel = kernel
        self._max_size = max_size
        self._max_delay = max_delay
        self._buckets = buckets
        self._check = ItemChecker(kernel, inputs)
        # What a call's rows must be to skip the checker: exactly an ndarray of each row.
        self._fits = tuple((row.dtype, row.shape) for row in inputs)
        self._one = self._fits[0] if len(inputs) == 1 else None  # (the common case, inlined)
        self._launcher = launcher
        self._loop: Any = None  # the event loop of the first call
        self._open: _Batch | None = None  # the batch collecting now, if any
        self._line: list[_Batch] = []  # due batches waiting for room in the backend's queue
        self._closed = False
        self._in_flight = 0
        self._idle: Any = None  # a future aclose() waits on while batches are due or in flight
        self._log = logger.bind(device=backend.name, kernel=kernel.name)
        # One event per batch, only where the backend logs one per dispatch: unconfigured,
        # structlog prints every debug event to stdout, from the loop's thread.
        self._events = backend.options.dispatch_events_enabled
        # Counters of statistics().
        self._batches = self._items = self._padded = self._cancelled = self._failed = 0
        self._fill = 0.0
        self._waiting = Histogram()
        ref = weakref.ref(self)

        def flush_on_close() -> None:
            batcher = ref()
            if batcher is not None:
                batcher._close_now()

        unregister = backend.on_close(flush_on_close)
        self._unregister = unregister
        weakref.finalize(self, unregister)

    # -- state -----------------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """Whether the batcher was closed (by ``aclose()`` or by its backend's close)."""
        return self._closed

    def statistics(self) -> BatcherStatistics:
        """A frozen snapshot of what the batcher did so far (see :class:`BatcherStatistics`)."""
        return BatcherStatistics(
            batches=self._batches,
            items=self._items,
            padded_rows=self._padded,
            mean_fill=self._fill / self._batches if self._batches else 0.0,
            waiting=self._waiting.snapshot(),
            cancelled_before_launch=self._cancelled,
            failed_batches=self._failed,
            pending=self._pending(),
            in_flight=self._in_flight,
            waiting_for_room=len(self._line),
        )

    def _pending(self) -> int:
        """Items not launched: in the batch collecting and in the batches waiting for room."""
        pending = sum(len(batch.futures) for batch in self._line)
        batch = self._open
        if batch is not None and batch.leave_line is None:  # (one in line is counted above)
            pending += len(batch.futures)
        return pending

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        pending = self._pending()
        return (
            f"<Batcher {self._kernel.name!r} {state} pending={pending} "
            f"in_flight={self._in_flight} batches={self._batches}>"
        )

    # -- calls -----------------------------------------------------------------------------------

    async def __call__(self, *rows: object) -> tuple[Array, ...]:
        """Add one item (a row of each input) to a batch; return the caller's output rows.

        Returns:
            One array per output, of the output's row shape: the caller's row of the batch's
            result (a view of it).

        Raises:
            DispatchError: the item does not fit the batcher's rows (``ArgumentTypeError`` for a
                wrong type or dtype, ``ShapeMismatchError`` for a wrong shape); refused to this
                caller alone, before batching.
            BackendClosedError: the batcher or its backend is closed.
            UnsupportedError: the call is not on the batcher's event loop.
            Exception: whatever the batch's dispatch failed with (every caller of it gets it).
        """
        # The steady state in line, with no call per item: on the batcher's asyncio loop, open
        # (closing the backend closes the batcher first, through on_close), each row exactly
        # an ndarray of its dtype and shape (for one input: of the very dtype object, which
        # numpy shares between arrays of a builtin dtype). Anything else takes the checks.
        loop: Any = _get_running_loop()
        fits = loop is self._loop and loop is not None and not self._closed
        if fits:
            one = self._one
            if one is not None and len(rows) == 1:
                value = rows[0]
                fits = type(value) is np.ndarray and value.dtype is one[0] and value.shape == one[1]
            else:
                fits = self._fit(rows)
        if not fits:
            try:
                self._check(rows)
                loop = self._loop_for_use()
            except Exception:
                await _loop.sleep(0)  # a checkpoint, also for a refusal
                raise
        batch = self._open
        if batch is None:
            batch = self._open = _Batch()
            batch.timer = _deadline.call_at_deadline(loop, self._max_delay, self._deadline, batch)
        future = loop.create_future()
        futures = batch.futures
        futures.append(future)
        batch.items.append(rows)
        batch.t_calls.append(perf_counter())
        if len(futures) >= self._max_size:
            self._open = None  # full: the next call starts the next batch
            self._due(batch)
        try:
            return await future  # type: ignore[no-any-return]  # a tuple, set by _complete
        except BaseException:
            self._leave(batch, future)
            raise

    def _fit(self, rows: tuple[object, ...]) -> bool:
        """Whether *rows* are exactly an ndarray of each input row's dtype and shape."""
        if len(rows) != len(self._fits):
            return False
        for value, (dtype, shape) in zip(rows, self._fits):  # noqa: B905  # lengths checked
            if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
                return False
        return True

    def _loop_for_use(self) -> Any:
        if self._backend.is_closed:
            raise BackendClosedError(
                f"backend {self._backend.name} of batcher {self._kernel.name!r} is closed; open "
                "a new backend and make a new batcher on it"
            )
        if self._closed:
            raise BackendClosedError(
                f"batcher {self._kernel.name!r} is closed; make a new one with asyncgraph.batcher()"
            )
        loop = _loop.running_loop()
        if loop is None:
            raise UnsupportedError(
                f"batcher {self._kernel.name!r} is called from a thread with no running event "
                "loop; await it from async code on its backend's loop"
            )
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise UnsupportedError(
                f"batcher {self._kernel.name!r} belongs to another event loop; make one "
                "batcher per event loop"
            )
        return loop

    def _deadline(self, batch: _Batch) -> None:
        """The deadline's callback: *batch* is due, unless it was launched (or emptied) already."""
        if not batch.launched and batch.futures:
            self._due(batch)

    def _due(self, batch: _Batch) -> None:
        """Launch *batch* now, or once the backend's queue has room (it collects meanwhile)."""
        batch.timer.cancel()
        if batch.launched or batch.leave_line is not None:
            return  # launched, or in line already
        leave = self._backend.call_in_turn(lambda error: self._in_turn(batch, error))
        if not batch.launched:  # no room now: in line with the backend's submit() calls
            batch.leave_line = leave
            self._line.append(batch)

    def _in_turn(self, batch: _Batch, error: BaseException | None) -> None:
        """The backend's queue has room for *batch* (or the backend closed before it had)."""
        if batch.leave_line is not None:
            batch.leave_line = None
            self._line.remove(batch)
        refused = None
        if error is not None:
            refused = BackendClosedError(
                f"backend {self._backend.name} was closed while a batch of "
                f"{self._kernel.name!r} waited for room in its queue (max_queued)"
            )
            refused.__cause__ = error
        self._launch(batch, refused)
        self._check_idle()

    def _leave(self, batch: _Batch, future: Any) -> None:
        """The caller of *future* in *batch* stopped waiting (cancelled, or its batch failed):
        undo what is undone."""
        if not future.done():
            future.cancel()
        if batch.launched:
            return  # the batch goes on without this caller; its row is dropped
        i = batch.futures.index(future)
        del batch.futures[i], batch.items[i], batch.t_calls[i]
        self._cancelled += 1
        if not batch.futures:  # nobody left to launch it for
            batch.timer.cancel()
            if self._open is batch:
                self._open = None
            if batch.leave_line is not None:
                batch.leave_line()
                batch.leave_line = None
                self._line.remove(batch)
                self._check_idle()

    # -- launching -------------------------------------------------------------------------------

    def _launch(self, batch: _Batch, refused: BaseException | None = None) -> None:
        """Stack the batch's rows, dispatch it, and have its completion answer its callers
        (or fail them with *refused*, the reason it cannot be dispatched)."""
        batch.launched = True
        batch.timer.cancel()
        if self._open is batch:
            self._open = None
        futures = batch.futures
        n = len(futures)
        size = self._buckets[bisect.bisect_left(self._buckets, n)] if self._buckets else n
        now = perf_counter()
        self._waiting.record_all([now - t for t in batch.t_calls])
        self._batches += 1
        self._items += n
        self._padded += size - n
        self._fill += n / (size if self._buckets else self._max_size)
        if refused is not None:
            self._fail(futures, refused)
            return
        try:
            pending, staging = self._launcher.launch(batch.items, size)
        except BaseException as exc:
            self._fail(futures, exc)
            if isinstance(exc, Exception):
                return
            raise
        self._in_flight += 1
        pending.add_done_callback(lambda done: self._complete(done, futures, staging))
        if self._events:
            self._log.debug(
                "batch.launched", dispatch_id=pending.dispatch_id, items=n, size=size,
                waited_max=now - batch.t_calls[0],
            )  # fmt: skip

    def _fail(self, futures: list[Any], exc: BaseException) -> None:
        self._failed += 1
        for future in futures:
            if not future.done():  # (a caller that stopped waiting gets nothing)
                future.set_exception(exc)

    def _complete(self, pending: PendingDispatch, futures: list[Any], staging: list[Array]) -> None:
        """Hand each caller its row of each result, or the batch's error (on the loop)."""
        self._in_flight -= 1
        if not self._closed:
            self._launcher.give_back(staging)  # the dispatch is done with it
        exc = pending.exception()
        if exc is not None:
            self._fail(futures, exc)
        else:
            answers = self._launcher.answers(pending.result(), len(futures))
            for future, answer in zip(futures, answers, strict=False):
                if not future.done():  # (a caller that stopped waiting gets nothing)
                    future.set_result(answer)
        self._check_idle()

    def _check_idle(self) -> None:
        """Let a waiting ``aclose()`` return once no batch is due or in flight."""
        idle = self._idle
        if not self._in_flight and not self._line and idle is not None and not idle.done():
            idle.set_result(None)

    # -- closing ---------------------------------------------------------------------------------

    def flush(self) -> None:
        """Launch the batch collecting now, if any, without waiting for its deadline (where
        the backend's queue is full: once it has room)."""
        batch = self._open
        if batch is not None:
            self._due(batch)

    def _close_now(self) -> None:
        """Refuse new calls and launch what is collecting (``aclose()``, the backend's close)."""
        if not self._closed:
            self._closed = True
            self._unregister()
            self.flush()
            self._launcher.clear()

    async def aclose(self) -> None:
        """Launch the items collecting now, refuse new calls, wait for the batches in flight
        (and for those waiting for room in the backend's queue, to launch and complete).

        Idempotent. The flush and the refusal happen at once, so a cancelled ``aclose()``
        only stops waiting: the batches in flight still answer their callers.
        """
        self._close_now()
        if (self._in_flight or self._line) and self._loop is not None:
            if self._idle is None or self._idle.done():
                self._idle = self._loop.create_future()
            await _loop.shield(self._idle)
        else:
            await _loop.sleep(0)

    async def __aenter__(self) -> Batcher:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def batcher(
    backend: Backend,
    kernel: Kernel,
    *,
    inputs: Sequence[Row],
    outputs: Sequence[Row],
    shared: Sequence[object] = (),
    launch: LaunchShape,
    max_size: int = 64,
    max_delay: float = 0.0005,
    buckets: Sequence[int] | None = None,
    graph: str = "never",
    shared_mem: int = 0,
) -> Batcher:
    """Make a :class:`Batcher`: concurrent calls with one row each, one dispatch per batch.

    The kernel gets, in this order: one array of shape ``(n, *row.shape)`` per input (the
    callers' rows, in call order), one ``Out((n, *row.shape), row.dtype)`` per output, the
    *shared* arguments, then ``np.int32(n)``, the batch size (the bucket size with *buckets*).
    See ``docs/batching.md``.

    Args:
        backend: the backend that runs the batches.
        kernel: the kernel, written over a batch of ``n`` rows.
        inputs: the row of each input each caller passes (``Row(shape, dtype)``).
        outputs: the row of each output each caller gets back.
        shared: arguments every batch passes after the outputs: resident buffers (weights),
            numpy scalars, arrays.
        launch: ``launch(n) -> (grid, block)``, the launch shape of a batch of *n* rows (a
            batch for which it returns anything but a pair fails with ``ArgumentTypeError``).
        max_size: the most items in a batch; a batch that reaches it launches at once. At most
            ``2**31 - 1`` (the kernel's ``int n``), and a full batch's input and output rows
            must fit in the machine's memory: both are checked here, not at the first batch.
        max_delay: the most seconds the first item of a batch waits for others.
        buckets: batch sizes to pad up to (with zero rows), so that ``graph="auto"`` replays
            one CUDA graph per bucket; the largest must be at least *max_size*.
        graph: passed to each dispatch: ``"never"``, ``"auto"`` or ``"always"``.
        shared_mem: bytes of dynamic shared memory per block, passed to each dispatch.

    Returns:
        The batcher: ``await batcher(*rows)`` returns the caller's row of each output.

    Raises:
        ArgumentTypeError: an argument is of the wrong type, or a row's dtype does not match
            the kernel's parameter.
        DispatchError: an option's value is wrong, or the layout does not fit the kernel's
            parameter list (where it can be read).
        BackendClosedError: the backend is closed.
    """
    if not isinstance(backend, Backend):
        raise ArgumentTypeError(
            f"batcher() takes a backend first, got {type(backend).__name__}; open one with "
            "asyncgraph.open_backend()"
        )
    if backend.is_closed:
        raise BackendClosedError(
            f"backend {backend.name} is closed; open a new one with asyncgraph.open_backend()"
        )
    ins, outs, args, sizes = check_options(
        kernel, inputs, outputs, shared, launch, max_size, max_delay, buckets, graph
    )
    size = int(max_size)
    launcher = BatchLauncher(
        backend, kernel, ins, outs, args, launch, sizes[-1] if sizes else size, graph, shared_mem
    )
    return Batcher(backend, kernel, ins, launcher, size, float(max_delay), sizes)
