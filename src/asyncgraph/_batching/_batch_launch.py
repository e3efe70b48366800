"""Launching a batch: its rows written into reused pinned staging, one dispatch, the answers.

:class:`BatchLauncher` is the runner a :class:`~asyncgraph._batching._batcher.Batcher`'s queue
(``_batch_queue.BatchQueue``) launches its batches through. It knows the kernel, the rows, the
shared arguments and the buckets; the queue keeps the callers and the batches' states.

A batch's rows go into one array per input from ``backend.pinned_empty`` (pinned memory on the
CUDA backend, which a dispatch uploads without a copy of its own into staging; ordinary memory
on the host backend). Making such an array is costly (it lends a block of the pinned pool to
numpy), so a set of them is taken when a batch launches, given back when its dispatch
completes (its upload is done by then) and used again by a later batch. A batch whose launch
fails drops its set instead: a copy may still read it.

A caller alone (``Batcher``'s lone path) dispatches its batch of one with
:meth:`launch_alone` (its own rows, each as a view of one row, where they are C-contiguous
arrays: the dispatch stages them as it would one request's), awaits the dispatch itself, as
one ``await backend.dispatch(...)`` would (on CUDA a lone dispatch's await polls its event for
a short while before it sleeps, so its result arrives without a trip around the loop), and
takes its rows with :meth:`first`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncgraph._args._arguments import Out
from asyncgraph._runtime import _tracing

from ._batch_options import check_launch_shape

if TYPE_CHECKING:
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._front._backend import Backend
    from asyncgraph._jobs._pending import PendingDispatch

    from ._batch_options import LaunchShape, Row
    from ._batch_queue import Done

__all__ = ("BatchLauncher",)

Array = np.ndarray[Any, Any]


class BatchLauncher:
    """Dispatches batches of rows of *kernel* on *backend* and splits their results.

    Args:
        backend: the backend that runs the batches.
        kernel: the kernel, written over a batch of ``n`` rows.
        inputs, outputs: the row of each input and output.
        shared: the arguments every batch passes after the outputs.
        launch: ``launch(n) -> (grid, block)``.
        max_size: the most items in a batch.
        buckets: the batch sizes to pad up to, in ascending order (empty: none).
        graph, shared_mem: passed to each dispatch.
        keep: the most staging sets kept between batches (more are made while more batches
            are in flight, and dropped when they come back).
    """

    __slots__ = (
        "_alone",
        "_backend",
        "_buckets",
        "_by_row",
        "_callers",
        "_capacity",
        "_graph",
        "_inputs",
        "_keep",
        "_kernel",
        "_launch",
        "_max_size",
        "_outputs",
        "_shared",
        "_shared_mem",
        "_spare",
        "_steer",
        "_tails",
        "tracer",
    )

    def __init__(
        self,
        backend: Backend,
        kernel: Kernel,
        inputs: tuple[Row, ...],
        outputs: tuple[Row, ...],
        shared: tuple[object, ...],
        launch: LaunchShape,
        max_size: int,
        buckets: tuple[int, ...],
        graph: str,
        shared_mem: int,
        keep: int = 4,
        steer: dict[str, Any] | None = None,
        tracer: Any = None,
    ) -> None:
        self._backend = backend
        self._kernel = kernel
        self._inputs = inputs
        self._outputs = outputs
        self._shared = shared
        self._launch = launch
        self._max_size = max_size
        self._buckets = buckets
        self._capacity = buckets[-1] if buckets else max_size  # the rows of a staging set
        self._graph = graph
        self._shared_mem = shared_mem
        self._keep = keep
        self._steer = steer or {}  # each batch's priority class and queue deadline
        self.tracer = tracer  # while tracing: each batch is a span linking its callers'
        self._callers: dict[int, Any] = {}  # their span contexts, by id of their item
        self._spare: list[list[Array]] = []
        # The dispatch's arguments after the inputs, by batch size: the outputs, the shared
        # arguments and the size (made once per size).
        self._tails: dict[int, tuple[object, ...]] = {}
        # launch_alone's dispatch of one row and its arguments after the inputs (made once).
        self._alone: tuple[Callable[..., PendingDispatch], tuple[object, ...]] | None = None
        # Whether iterating the outputs together yields each caller's rows (each a view).
        self._by_row = bool(outputs) and all(row.shape for row in outputs)

    @property
    def kept(self) -> int:
        """How many staging sets wait for a later batch."""
        return len(self._spare)

    def sizes(self, n: int) -> tuple[int, int]:
        """For a batch of *n* items: the rows it dispatches (the smallest bucket that holds
        them, or *n*), and the capacity its fill counts against (that bucket, or
        ``max_size``)."""
        buckets = self._buckets
        if not buckets:
            return n, self._max_size
        size = buckets[bisect.bisect_left(buckets, n)]
        return size, size

    def run(self, loop: Any, items: list[tuple[object, ...]], size: int, done: Done) -> object:
        """Dispatch the batch of *items* as *size* rows; its completion gives the staging
        back and calls ``done(answers, None)`` (or ``done(None, error)``).

        Returns:
            The dispatch's id.

        Raises:
            Exception: whatever the staging or the dispatch raised.
        """
        n = len(items)
        if self.tracer is None:
            pending, staging = self.launch(items, size)
        else:  # a span linking the callers', current while the batch's dispatch is made
            callers = [self._callers.pop(id(item), None) for item in items]
            span = _tracing.batch_span(self.tracer, callers, n)
            try:
                with _tracing.current(span):
                    pending, staging = self.launch(items, size)
            except BaseException:
                span.end()
                raise
            pending.add_done_callback(lambda _done: span.end())
        pending.add_done_callback(lambda finished: self._end(finished, staging, n, done))
        return pending.dispatch_id

    def remember(self, item: tuple[object, ...]) -> None:
        """While tracing: the caller's span context, for the span of *item*'s batch to link."""
        self._callers[id(item)] = _tracing.caller()

    def forget(self, item: tuple[object, ...]) -> None:
        """*item* left its batch, or its batch launched: forget its caller's context."""
        self._callers.pop(id(item), None)

    def launch_alone(self, rows: tuple[object, ...]) -> tuple[PendingDispatch, list[Array] | None]:
        """Dispatch one caller's *rows* as a batch of one: the rows themselves, each as a view
        of one row, where each is a C-contiguous array and no bucket pads a batch of one; else
        through staging (:meth:`launch`).

        Returns:
            The dispatch, and the staging it reads (``None``: none): :meth:`give_back` it once
            the dispatch is done.

        Raises:
            Exception: whatever the staging or the dispatch raised.
        """
        views: list[object] = []
        if not self._buckets or self._buckets[0] == 1:
            for value in rows:
                if type(value) is not np.ndarray or not value.flags.c_contiguous:
                    break
                views.append(value[None])
            else:
                alone = self._alone
                if alone is None:  # the dispatch of one row, its launch shape bound, made once
                    grid, block = check_launch_shape(self._kernel, 1, self._launch(1))
                    alone = self._alone = (self._dispatcher(grid, block), self._tail(1))
                dispatch, tail = alone
                views.extend(tail)
                return dispatch(*views), None
        size = self._buckets[0] if self._buckets else 1
        return self.launch([rows], size)

    def first(self, results: tuple[Array, ...]) -> tuple[Array, ...]:
        """The first caller's rows of a batch's *results* (views)."""
        if self._by_row:
            if len(results) == 1:
                return (results[0][0],)
            return tuple([result[0] for result in results])
        return tuple([result[0, ...] for result in results])

    def _end(self, pending: PendingDispatch, staging: list[Array], n: int, done: Done) -> None:
        self.give_back(staging)  # the dispatch is done with it
        exc = pending.exception()
        if exc is not None:
            done(None, exc)
        else:
            done(self.answers(pending.result(), n), None)

    def launch(
        self, items: list[tuple[object, ...]], size: int
    ) -> tuple[PendingDispatch, list[Array]]:
        """Write the rows of *items* into staging (zero rows up to *size*) and dispatch them.

        Returns:
            The dispatch, and the staging it reads: :meth:`give_back` it once the dispatch is
            done.

        Raises:
            Exception: whatever the staging or the dispatch raised; the staging is dropped.
        """
        # The launch shape first: a launch function that fails costs no staging.
        grid, block = check_launch_shape(self._kernel, size, self._launch(size))
        staging = self._take()
        args = self._stack(staging, items, size)
        args.extend(self._tail(size))
        return self._dispatcher(grid, block)(*args), staging

    def _dispatcher(self, grid: object, block: object) -> Callable[..., PendingDispatch]:
        """The kernel's dispatch with the launch shape (as ``launch`` returned it) bound: called
        with the arguments."""
        return partial(
            self._backend.dispatch,
            self._kernel,
            grid=grid,  # type: ignore[arg-type]  # checked by dispatch
            block=block,  # type: ignore[arg-type]
            shared_mem=self._shared_mem,
            graph=self._graph,
            **self._steer,
        )

    def answers(self, results: tuple[Array, ...], n: int) -> Any:
        """An iterator of each of the *n* callers' tuple of result rows (views), in order."""
        # Iterating the outputs together gives each caller its tuple of rows, the padding rows
        # left over; outputs of one value per item index to 0-d views.
        if self._by_row:
            return zip(*results, strict=False)
        return (tuple(result[i, ...] for result in results) for i in range(n))

    def give_back(self, staging: list[Array] | None) -> None:
        """The dispatch that read *staging* is done: keep it for a later batch."""
        if staging is not None and len(self._spare) < self._keep:
            self._spare.append(staging)

    def clear(self) -> None:
        """Drop the kept staging and keep none from now on (its batcher closed: the pinned
        memory goes back to the pool when collected)."""
        self._keep = 0
        self._spare.clear()

    def _take(self) -> list[Array]:
        """A staging set, one array per input of ``(capacity, *row.shape)``: kept, or new."""
        spare = self._spare
        if spare:
            return spare.pop()
        backend = self._backend
        capacity = self._capacity
        return [backend.pinned_empty((capacity, *row.shape), row.dtype) for row in self._inputs]

    @staticmethod
    def _stack(staging: list[Array], items: list[tuple[object, ...]], size: int) -> list[object]:
        """Write the rows of *items* in order into *staging*, zero the rows up to *size*, and
        return the first *size* rows of each array (views: what the dispatch takes)."""
        n = len(items)
        batch: list[object] = []
        for k, array in enumerate(staging):
            # One copy of all the rows (into a C-contiguous view). A row of shape () may be a
            # numpy scalar, which flattens to one value as well.
            column: Any = [item[k] for item in items]  # checked arrays (or numpy scalars)
            np.concatenate(column, axis=None, out=array[:n].reshape(-1))
            if size > n:
                array[n:size] = 0  # padding up to the bucket: zeros, never returned
            batch.append(array[:size])
        return batch

    def _tail(self, size: int) -> tuple[object, ...]:
        """The arguments after the inputs for a batch of *size* rows: the outputs, the shared
        arguments, the size."""
        tail = self._tails.get(size)
        if tail is None:
            outs = tuple(Out((size, *row.shape), row.dtype) for row in self._outputs)
            tail = self._tails[size] = (*outs, *self._shared, np.int32(size))
        return tail
