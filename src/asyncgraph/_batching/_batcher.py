"""Dynamic batching of a kernel: many small awaits, one launch.

:func:`batcher` makes a :class:`Batcher`. Each caller awaits ``batcher(*rows)`` with one row of
each input; the batcher's queue (``_batch_queue.BatchQueue``) collects callers into batches and
launches each when its policy says (``policy="adaptive"`` by default: as soon as none of the
batcher's batches is in flight, see ``docs/batching.md``); ``_batch_launch``'s
``BatchLauncher`` writes the batch's rows straight into staging arrays from
``backend.pinned_empty``, runs one dispatch over the batch and hands each caller its own row of
each output (reusing the staging).

``batcher.many(*inputs)`` adds several items of one caller in one call (each input's rows
stacked): they join the batch collecting together, never the lone path below.

While callers come one at a time, a caller that finds the batcher idle dispatches its batch of
one itself and awaits the dispatch in its own task (``BatchQueue.alone``): it then costs what
``await backend.dispatch(...)`` does, the lone await's spin on CUDA included, instead of a
trip around the loop for the launch and two for the answer.

A batch due while the backend's bounded queue is full (``max_queued``) waits for room in line
with ``submit()`` (``backend.call_in_turn``), collecting more items meanwhile, up to
``max_size``: under backpressure batches grow instead of failing.
"""

from __future__ import annotations

import weakref
from asyncio import _get_running_loop
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from asyncgraph._front._backend import Backend
from asyncgraph._runtime import _loop
from asyncgraph._runtime._exceptions import ArgumentTypeError, BackendClosedError, QueueFullError
from asyncgraph._runtime._priority import check_priority, check_queue_timeout
from asyncgraph._runtime._resource import AsyncResource
from asyncgraph._runtime._telemetry import logger

from ._batch_launch import BatchLauncher
from ._batch_options import BatcherStatistics, LaunchShape, Row, check_options, kernel_item_checker
from ._batch_queue import ALONE, BatchQueue

if TYPE_CHECKING:
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._jobs._pending import PendingDispatch

__all__ = ("Batcher", "batcher")

Array = np.ndarray[Any, Any]


class Batcher(AsyncResource):
    """Collects concurrent callers' rows into batches and runs one dispatch per batch.

    Made by :func:`asyncgraph.batcher`. ``await batcher(*rows)`` returns a tuple with the
    caller's row of each output; ``await batcher.many(*inputs)`` adds several items at once.
    It belongs to the event loop it is first called on, like its backend. ``async with`` or
    ``await batcher.aclose()`` flushes it and refuses new calls; closing the backend flushes it
    too.
    """

    def __init__(
        self,
        backend: Backend,
        kernel: Kernel,
        inputs: tuple[Row, ...],
        launcher: BatchLauncher,
        max_size: int,
        max_delay: float,
        policy: str,
    ) -> None:
        self._backend = backend
        self._kernel = kernel
        self._check = kernel_item_checker(kernel, inputs)
        # What a call's rows must be to skip the checker: exactly an ndarray of each row.
        self._fits = tuple((row.dtype, row.shape) for row in inputs)
        self._one = self._fits[0] if len(inputs) == 1 else None  # (the common case, inlined)
        self._launcher = launcher
        self._one_size = launcher.sizes(1)[0]  # the rows of a batch of one (its bucket)
        # One event per batch, only where the backend logs one per dispatch: unconfigured,
        # structlog prints every debug event to stdout, from the loop's thread.
        log = logger.bind(device=backend.name, kernel=kernel.name)
        self._log = log if backend.options.dispatch_events_enabled else None
        self._queue = BatchQueue(
            launcher,
            name=f"batcher {kernel.name!r}",
            remake="asyncgraph.batcher()",
            max_size=max_size,
            max_delay=max_delay,
            policy=policy,
            gate=self._gate,
            log=self._log,
            lone=True,
        )
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
        return self._queue.is_closed

    def statistics(self) -> BatcherStatistics:
        """A frozen snapshot of what the batcher did so far (see :class:`BatcherStatistics`)."""
        return self._queue.statistics()

    def __repr__(self) -> str:
        return f"<Batcher {self._kernel.name!r} {self._queue.describe()}>"

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
        # The steady state in line: on the batcher's asyncio loop, open (closing the backend
        # closes the batcher first, through on_close), each row exactly an ndarray of its
        # dtype and shape (for one input: of the very dtype object, which numpy shares between
        # arrays of a builtin dtype). Anything else takes the checks.
        loop: Any = _get_running_loop()
        one = self._one
        if one is not None and len(rows) == 1:
            value = rows[0]
            fits = type(value) is np.ndarray and value.dtype is one[0] and value.shape == one[1]
        else:
            fits = self._fit(rows)
        queue = self._queue
        traced = self._launcher.tracer is not None
        if traced:  # its batch's span links the caller's
            self._launcher.remember(rows)
        waiter = queue.join(loop, rows) if fits else None
        if waiter is None:  # not checked, or not on the queue's loop: the checks
            if not (fits and queue.takes(loop)):
                try:
                    self._check(rows)
                    self._check_backend()
                    loop = queue.loop_for_use()
                except Exception:
                    if traced:
                        self._launcher.forget(rows)
                    await _loop.sleep(0)  # a checkpoint, also for a refusal
                    raise
            waiter = ALONE if queue.launch_alone(loop) else queue.add(loop, rows)
        if waiter is ALONE:  # its batch of one (counted), dispatched and awaited here
            launcher = self._launcher
            if traced:  # dispatched in the caller's context: its span is the dispatch's parent
                launcher.forget(rows)
            try:
                pending, staging = launcher.launch_alone(rows)
            except QueueFullError:  # no room in the backend's queue: in line, as any batch
                queue.unlaunch_alone()
                waiter = queue.add(loop, rows)
            except Exception as exc:
                queue.ended_alone(exc)
                await _loop.sleep(0)  # a checkpoint, also for a refusal
                raise
            else:
                if self._log is not None:
                    self._log.debug(
                        "batch.launched",
                        dispatch_id=pending.dispatch_id,
                        items=1,
                        size=self._one_size,
                        waited_max=0.0,
                    )
                try:
                    results = await pending
                except BaseException:
                    if pending.done():
                        self._end_alone(pending, staging)
                    else:  # the caller stopped waiting: the batch ends when its dispatch does
                        pending.add_done_callback(lambda done: self._end_alone(done, staging))
                    raise
                if staging is not None:
                    launcher.give_back(staging)
                queue.ended_alone()
                return launcher.first(results)
        try:
            return await waiter  # type: ignore[no-any-return]  # a tuple, set by the queue
        except BaseException:
            queue.leave(waiter)
            raise
        finally:
            if traced:
                self._launcher.forget(rows)

    async def many(self, *inputs: object) -> tuple[Array, ...]:
        """Add several items at once (a request of several rows); return their output rows.

        ``await batcher.many(x)`` with *x* of shape ``(k, *row.shape)`` adds its *k* rows as *k*
        items in the call, together: they go in one batch (with other callers' items), or in
        as few as ``max_size`` allows, never one alone ahead of the others. It costs one call,
        where *k* calls of ``batcher(row)`` would need a task each to be in the same batch.

        Args:
            inputs: one numpy array per input: the items' rows of that input, stacked.

        Returns:
            One array per output, of shape ``(k, *row.shape)``: the items' output rows, in
            order (copies).

        Raises:
            DispatchError: the arrays do not hold the batcher's rows (``ArgumentTypeError``
                for a wrong type or dtype, ``ShapeMismatchError`` for a wrong shape or
                differing counts); refused to this caller alone, nothing added.
            BackendClosedError: the batcher or its backend is closed.
            UnsupportedError: the call is not on the batcher's event loop.
            Exception: whatever a batch's dispatch failed with. If the caller stops waiting,
                its items that did not launch yet leave their batch.
        """
        loop: Any = _get_running_loop()
        queue = self._queue
        try:
            count = self._check.stacked(inputs)
            if not queue.takes(loop):
                self._check_backend()
                loop = queue.loop_for_use()
        except Exception:
            await _loop.sleep(0)  # a checkpoint, also for a refusal
            raise
        arrays = cast("tuple[Array, ...]", inputs)  # checked: numpy arrays of k rows each
        waiters: list[Any] = []
        try:
            for i in range(count):
                waiters.append(queue.add(loop, tuple(array[i] for array in arrays)))
            answers = [await waiter for waiter in waiters]
        except BaseException:
            for waiter in waiters:
                queue.leave(waiter)  # (nothing for those launched already)
            raise
        return tuple(np.stack(rows) for rows in zip(*answers, strict=True))

    def _fit(self, rows: tuple[object, ...]) -> bool:
        """Whether *rows* are exactly an ndarray of each input row's dtype and shape."""
        if len(rows) != len(self._fits):
            return False
        for value, (dtype, shape) in zip(rows, self._fits):  # noqa: B905  # lengths checked
            if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
                return False
        return True

    def _end_alone(self, pending: PendingDispatch, staging: list[Array] | None) -> None:
        """The dispatch of a lone caller's batch completed: its staging is free again."""
        self._launcher.give_back(staging)
        self._queue.ended_alone(pending.exception())

    def _check_backend(self) -> None:
        if self._backend.is_closed:
            raise BackendClosedError(
                f"backend {self._backend.name} of batcher {self._kernel.name!r} is closed; open "
                "a new backend and make a new batcher on it"
            )

    def _gate(self, fn: Callable[[BaseException | None], None]) -> Callable[[], None]:
        """A due batch's wait for room in the backend's queue (``call_in_turn``); if the
        backend closes first, its callers get a ``BackendClosedError`` that says so."""

        def in_turn(error: BaseException | None) -> None:
            if error is not None:
                refused = BackendClosedError(
                    f"backend {self._backend.name} was closed while a batch of "
                    f"{self._kernel.name!r} waited for room in its queue (max_queued)"
                )
                refused.__cause__ = error
                error = refused
            fn(error)

        return self._backend.call_in_turn(in_turn)

    # -- closing ---------------------------------------------------------------------------------

    def flush(self) -> None:
        """Launch the batch collecting now, if any, without waiting for its policy (where
        the backend's queue is full: once it has room)."""
        self._queue.flush()

    def _close_now(self) -> None:
        """Refuse new calls and launch what is collecting (``aclose()``, the backend's close)."""
        if self._queue.close():
            self._unregister()
            self._launcher.clear()

    async def aclose(self) -> None:
        """Launch the items collecting now, refuse new calls, wait for the batches in flight
        (and for those waiting for room in the backend's queue, to launch and complete).

        Idempotent. The flush and the refusal happen at once, so a cancelled ``aclose()``
        only stops waiting: the batches in flight still answer their callers.
        """
        self._close_now()
        await self._queue.aclose()


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
    policy: str = "adaptive",
    buckets: Sequence[int] | None = None,
    graph: str = "never",
    shared_mem: int = 0,
    priority: str | None = None,
    queue_timeout: float | None = None,
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
        policy: when a batch launches. ``"adaptive"`` (the default): at the end of the turn
            of the loop in which its first caller found none of the batcher's batches in
            flight; else when the batch in flight completes, when it is full, or at
            *max_delay*, whichever comes first. ``"fixed_delay"``: when it is full or at
            *max_delay*.
        buckets: batch sizes to pad up to (with zero rows), so that ``graph="auto"`` replays
            one CUDA graph per bucket; the largest must be at least *max_size*.
        graph: passed to each dispatch: ``"never"``, ``"auto"`` or ``"always"``.
        shared_mem: bytes of dynamic shared memory per block, passed to each dispatch (an int
            from 0 to the backend's bound, ``backend.limits.max_shared_mem``, checked here).
        priority: the priority class of each batch's dispatch (``None``: the backend's).
        queue_timeout: each batch's dispatch's queue deadline (``None``: the backend's); a
            batch that waits it out fails its callers with :class:`QueueTimeoutError`.

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
        kernel,
        inputs,
        outputs,
        shared,
        launch,
        max_size,
        max_delay,
        policy,
        buckets,
        graph,
        shared_mem,
        backend.limits.max_shared_mem,
    )
    size = int(max_size)
    steer = {"priority": priority, "queue_timeout": queue_timeout}
    if priority is not None:
        check_priority(priority, "batcher()")
    check_queue_timeout(queue_timeout, "batcher()")
    launcher = BatchLauncher(
        backend,
        kernel,
        ins,
        outs,
        args,
        launch,
        size,
        sizes,
        graph,
        int(shared_mem),
        steer=steer,
        tracer=backend.tracer,
    )
    return Batcher(backend, kernel, ins, launcher, size, float(max_delay), policy)
