"""Callers collecting into batches, and when each batch launches: :class:`BatchQueue`.

Both batchers compose one: :class:`~asyncgraph._batching._batcher.Batcher` (rows of a kernel, one
dispatch per batch) and :class:`~asyncgraph._batching._batched_function.BatchedFunction` (any async
function of a list of inputs). The queue keeps the callers, the states of their batches, the launch
policy and the counts of ``statistics()``; what a batch does is its runner's (:class:`BatchRunner`).

The launch policies (``policy=``, ``docs/batching.md``):

- ``"adaptive"`` (the default) never waits for nothing. A batch whose first caller finds none
  of the queue's batches in flight (or due) launches at the end of that turn of the loop (a
  ``call_soon``), so that the callers of the same turn join it: *idle*. A batch started while
  one is in flight collects until that one completes, and launches at the end of the
  completion's turn, so that the callers the completion woke join it too: *completion*; or
  once full, or at ``max_delay`` after its first caller, whichever comes first. While callers
  come one at a time (the last batch held one item), a caller that finds the queue idle
  (:meth:`BatchQueue.alone`) may launch its batch of one itself, at once, and await it in its
  own task (``Batcher``'s lone path: one caller then costs what one dispatch does); it tells
  the queue with :meth:`BatchQueue.launch_alone` and :meth:`BatchQueue.ended_alone`.
- ``"fixed_delay"`` launches a batch once full (*full*), or at ``max_delay`` after its first
  caller (*deadline*), as Ray Serve's ``@serve.batch`` and Triton's dynamic batcher do.

``flush()`` and closing launch the batch collecting (*flush*). The deadline is kept by the
event loop (``_deadline.call_at_deadline``: a timer of the loop for most of the delay, then a
check at each turn for its last millisecond), and the launch runs from the loop's callbacks,
whatever the callers' tasks are doing: the callers only wait for their results, so the queue
runs on asyncio, uvloop and trio alike, with no thread and no task of its own.

A batch that is due (for any reason) passes its runner's *gate* first, where it has one: the
backend's ``call_in_turn``, so that a batch due while the backend's bounded queue is full
(``max_queued``) waits for room in line with ``submit()``, collecting more items meanwhile, up
to ``max_size``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any, Protocol, cast

from asyncgraph._runtime import _deadline, _loop
from asyncgraph._runtime._exceptions import BackendClosedError, UnsupportedError
from asyncgraph._runtime._telemetry import Histogram

from ._batch_options import BatcherStatistics, BatchLaunches

__all__ = ("ALONE", "BatchQueue", "BatchRunner", "Done", "Gate")

# What ``BatchQueue.join`` returns to a caller that goes alone, its batch counted launched.
ALONE = cast("Awaitable[Any]", object())

# Why a batch launched: indexes of BatchQueue's counts (BatchLaunches' fields, in order).
FULL, IDLE, COMPLETION, DEADLINE, FLUSH = range(5)

# How a runner reports a batch's end: ``done(answers, None)``, an iterable of each caller's
# answer in call order, or ``done(None, error)``, on the loop's thread.
Done = Callable[[Any, "BaseException | None"], None]
# ``gate(fn)`` calls ``fn(None)`` once a batch may launch (``fn(error)`` if it never may: the
# error its callers get), and returns a function that gives the place up (the backend's
# ``call_in_turn``, with the error a batch's callers get if the backend closes first).
Gate = Callable[[Callable[["BaseException | None"], None]], Callable[[], None]]


class BatchRunner(Protocol):
    """What a :class:`BatchQueue` launches its batches through."""

    def sizes(self, n: int) -> tuple[int, int]:
        """For a batch of *n* items: the rows it runs (more with padding), and the capacity
        its fill is counted against."""

    def run(self, loop: Any, items: list[Any], size: int, done: Done) -> Any:
        """Start the batch of *items* (run as *size* rows) on *loop*; call *done* once when it
        ends (never from within this call). Returns an id for the log (or ``None``).

        Raises:
            Exception: the batch could not start; each of its callers gets the error.
        """


class _Batch:
    """Callers collecting for one launch; due once its policy says so, then launched (or in
    line at the gate until it may launch).

    Caller *i* is three entries, kept in step (no object per caller): ``futures[i]`` brings its
    answer, ``items[i]`` is what it passed, ``t_calls[i]`` is when it called.
    """

    __slots__ = ("futures", "items", "launched", "leave_line", "reason", "t_calls", "timer")

    def __init__(self) -> None:
        self.timer: Any = None  # the deadline's handle, if one is armed (cancel() stops it)
        self.futures: list[Any] = []
        self.items: list[Any] = []
        self.t_calls: list[float] = []
        self.launched = False
        self.reason = DEADLINE  # why it became due (an index of the counts)
        # Set while the batch is due and waits at the gate: gives its place up.
        self.leave_line: Callable[[], None] | None = None


class BatchQueue:
    """The callers of one batcher, their batches, and when each batch launches.

    Args:
        runner: what runs a batch.
        name: the batcher, as messages name it (``"batcher 'affine_rows'"``).
        remake: what makes a new one, for the message of a closed queue
            (``"asyncgraph.batcher()"``).
        max_size: the most items in a batch.
        max_delay: the most seconds a batch collects after its first caller, when it does not
            launch earlier.
        policy: ``"adaptive"`` or ``"fixed_delay"`` (checked by ``check_launch_options``).
        gate: what a due batch passes before it launches (the backend's ``call_in_turn``).
        log: where one ``batch.launched`` debug event per batch goes (``None``: none).
        lone: whether its callers take the lone path (:meth:`alone`) where they may.
    """

    def __init__(
        self,
        runner: BatchRunner,
        *,
        name: str,
        remake: str,
        max_size: int,
        max_delay: float,
        policy: str,
        gate: Gate | None = None,
        log: Any = None,
        lone: bool = False,
    ) -> None:
        self._runner = runner
        self._name = name
        self._remake = remake
        self._max_size = max_size
        self._max_delay = max_delay
        self._adaptive = policy == "adaptive"
        self._gate = gate
        self._log = log
        self._lone = False  # whether the last batch launched held one item
        self._takes_lone = lone
        size, capacity = runner.sizes(1)
        self._lone_fill = 1 / capacity  # a batch of one's fill
        self._lone_padding = size - 1  # and its padding rows
        self._loop: Any = None  # the event loop of the first call
        self._open: _Batch | None = None  # the batch collecting now, if any
        self._line: list[_Batch] = []  # due batches waiting at the gate
        self._closed = False
        self._in_flight = 0
        self._idle: Any = None  # a future aclose() waits on while batches are due or in flight
        # Counters of statistics().
        self._batches = self._items = self._padded = self._cancelled = self._failed = 0
        self._fill = 0.0
        self._reasons = [0] * 5
        self._waiting = Histogram()
        self._waited_none = 0  # lone items ended since the histogram was last read

    # -- state -----------------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """Whether the queue refuses new calls (closed, or flushed by its backend's close)."""
        return self._closed

    def takes(self, loop: object) -> bool:
        """Whether a call on *loop* may join a batch without more checks: the queue is open
        and belongs to *loop* (an asyncio loop; never ``None``)."""
        return loop is self._loop and loop is not None and not self._closed

    def statistics(self) -> BatcherStatistics:
        """A frozen snapshot of the counts (see :class:`BatcherStatistics`)."""
        full, idle, completion, deadline, flush = self._reasons
        if self._waited_none:
            self._waiting.record_all([0.0] * self._waited_none)
            self._waited_none = 0
        return BatcherStatistics(
            batches=self._batches,
            items=self._items,
            padded_rows=self._padded,
            mean_fill=self._fill / self._batches if self._batches else 0.0,
            waiting=self._waiting.snapshot(),
            cancelled_before_launch=self._cancelled,
            failed_batches=self._failed,
            pending=self.pending(),
            in_flight=self._in_flight,
            waiting_for_room=len(self._line),
            launched=BatchLaunches(
                full=full, idle=idle, completion=completion, deadline=deadline, flush=flush
            ),
        )

    def pending(self) -> int:
        """Items not launched: in the batch collecting and in the batches at the gate."""
        pending = sum(len(batch.futures) for batch in self._line)
        batch = self._open
        if batch is not None and batch.leave_line is None:  # (one in line is counted above)
            pending += len(batch.futures)
        return pending

    def describe(self) -> str:
        """``open pending=P in_flight=F batches=B`` (or ``closed ...``), for a ``repr``."""
        state = "closed" if self._closed else "open"
        return (
            f"{state} pending={self.pending()} in_flight={self._in_flight} batches={self._batches}"
        )

    # -- calls -----------------------------------------------------------------------------------

    def loop_for_use(self) -> Any:
        """The loop a call runs on, once checked: the queue's own (set by the first call).

        Raises:
            BackendClosedError: the queue is closed.
            UnsupportedError: no loop runs, or another loop than the queue's.
        """
        if self._closed:
            raise BackendClosedError(f"{self._name} is closed; make a new one with {self._remake}")
        loop = _loop.running_loop()
        if loop is None:
            raise UnsupportedError(
                f"{self._name} is called from a thread with no running event loop; await it "
                "from async code on its event loop"
            )
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise UnsupportedError(
                f"{self._name} belongs to another event loop; make one per event loop"
            )
        return loop

    def join(self, loop: Any, item: object) -> Awaitable[Any] | None:
        """The steady path of a call whose *item* is checked: :meth:`add` it, if the call runs
        on the queue's *loop* (an asyncio loop) and the queue is open, and return the future
        of its answer; or, where the caller may go alone (:meth:`alone`), count its batch of
        one launched as :meth:`launch_alone` does and return :data:`ALONE`; else ``None``
        (the caller checks more)."""
        if loop is not self._loop or loop is None or self._closed:
            return None
        if self._lone and self.launch_alone(loop):  # no call while callers come together
            return ALONE
        return self.add(loop, item)

    def add(self, loop: Any, item: object) -> Awaitable[Any]:
        """Add *item* to the batch collecting (on the queue's *loop*, checked by
        :meth:`join`, :meth:`takes` or :meth:`loop_for_use`); return the future of its answer.
        If the caller stops waiting, call :meth:`leave` with it."""
        batch = self._open
        if batch is None:
            batch = self._open = _Batch()
            if self._adaptive and not self._in_flight and not self._line:
                loop.call_soon(self._launch_due, batch, IDLE)  # at the end of this turn
            else:
                batch.timer = _deadline.call_at_deadline(
                    loop, self._max_delay, self._launch_due, batch, DEADLINE
                )
        future: Awaitable[Any] = loop.create_future()
        futures = batch.futures
        futures.append(future)
        batch.items.append(item)
        batch.t_calls.append(perf_counter())
        if len(futures) >= self._max_size:
            self._open = None  # full: the next call starts the next batch
            self._due(batch, FULL)
        return future

    def alone(self, loop: object) -> bool:
        """Whether a call on *loop* (checked as by :meth:`takes`) may launch a batch of its
        one item itself, at once: under ``"adaptive"``, while callers come one at a time (the
        last batch held one item) and nothing of the queue collects, waits or runs."""
        return (
            self._lone
            and self._takes_lone
            and self._adaptive
            and self._open is None
            and not self._in_flight
            and not self._line
            and loop is self._loop
            and loop is not None
            and not self._closed
        )

    def launch_alone(self, loop: object) -> bool:
        """If a call on *loop* may launch a batch of its one item itself (:meth:`alone`),
        count that batch launched (``idle``, in flight until :meth:`ended_alone`; undone by
        :meth:`unlaunch_alone`) and return ``True``; else ``False``."""
        if not self.alone(loop):
            return False
        self._batches += 1
        self._items += 1
        self._padded += self._lone_padding
        self._fill += self._lone_fill
        self._reasons[IDLE] += 1
        self._in_flight += 1
        return True

    def unlaunch_alone(self) -> None:
        """The batch of :meth:`launch_alone` did not launch after all (no room in the
        backend's queue): its counts are taken back, and its item goes to :meth:`add`."""
        self._batches -= 1
        self._items -= 1
        self._padded -= self._lone_padding
        self._fill -= self._lone_fill
        self._reasons[IDLE] -= 1
        self._in_flight -= 1

    def ended_alone(self, exc: BaseException | None = None) -> None:
        """The batch of :meth:`launch_alone` ended (failed with *exc*). Its item waited for
        nobody: it counts as waiting 0 s (added into the histogram when it is read)."""
        self._waited_none += 1
        self._in_flight -= 1
        if exc is not None:
            self._failed += 1
        if self._open is not None:
            self._launch_next()
        if self._idle is not None:
            self._check_idle()

    def leave(self, waiter: Awaitable[Any]) -> None:
        """The caller of *waiter* (what :meth:`add` returned) stopped waiting (cancelled, or
        its batch failed): it leaves its batch if that did not launch yet."""
        batch = self._holding(waiter)
        if batch is None:
            return  # launched: the batch goes on without this caller; its answer is dropped
        future: Any = waiter
        if not future.done():
            future.cancel()
        i = batch.futures.index(future)
        del batch.futures[i], batch.items[i], batch.t_calls[i]
        self._cancelled += 1
        if not batch.futures:  # nobody left to launch it for
            if batch.timer is not None:
                batch.timer.cancel()
            if self._open is batch:
                self._open = None
            if batch.leave_line is not None:
                batch.leave_line()
                batch.leave_line = None
                self._line.remove(batch)
                self._check_idle()

    def _holding(self, waiter: object) -> _Batch | None:
        """The batch not launched yet whose caller *waiter* is (collecting, or at the gate)."""
        batch = self._open
        if batch is not None and waiter in batch.futures:
            return batch
        for batch in self._line:
            if waiter in batch.futures:
                return batch
        return None

    # -- launching -------------------------------------------------------------------------------

    def _launch_due(self, batch: _Batch, reason: int) -> None:
        """The loop's callback (its deadline, or the end of a turn): *batch* is due, unless it
        was launched or emptied already."""
        if not batch.launched and batch.futures:
            self._due(batch, reason)

    def _due(self, batch: _Batch, reason: int) -> None:
        """Launch *batch* now, or once its gate lets it (it collects meanwhile)."""
        if batch.timer is not None:
            batch.timer.cancel()
        if batch.launched or batch.leave_line is not None:
            return  # launched, or in line already
        batch.reason = reason
        gate = self._gate
        if gate is None:
            self._launch(batch)
            return
        leave = gate(lambda error: self._in_turn(batch, error))
        if not batch.launched:  # no room now: in line
            batch.leave_line = leave
            self._line.append(batch)

    def _in_turn(self, batch: _Batch, error: BaseException | None) -> None:
        """The gate lets *batch* launch (or never will: *error*, which its callers get)."""
        if batch.leave_line is not None:
            batch.leave_line = None
            self._line.remove(batch)
        self._launch(batch, error)
        self._check_idle()

    def _launch(self, batch: _Batch, refused: BaseException | None = None) -> None:
        """Launch *batch* through the runner, whose end answers its callers (or fail them with
        *refused*, the reason it cannot launch: then it counts as failed, never launched)."""
        batch.launched = True
        if batch.timer is not None:
            batch.timer.cancel()
        if self._open is batch:
            self._open = None
        futures = batch.futures
        if refused is not None:
            self._fail(futures, refused)
            return
        n = len(futures)
        size, capacity = self._runner.sizes(n)
        now = perf_counter()
        self._waiting.record_all([now - t for t in batch.t_calls])
        self._batches += 1
        self._items += n
        self._padded += size - n
        self._fill += n / capacity
        self._reasons[batch.reason] += 1
        self._lone = n == 1
        self._in_flight += 1
        try:
            launch_id = self._runner.run(
                self._loop, batch.items, size, lambda answers, exc: self._end(futures, answers, exc)
            )
        except BaseException as exc:
            self._in_flight -= 1
            self._fail(futures, exc)
            if isinstance(exc, Exception):
                return
            raise
        if self._log is not None:
            self._log.debug(
                "batch.launched",
                dispatch_id=launch_id,
                items=n,
                size=size,
                waited_max=now - batch.t_calls[0],
            )

    def _fail(self, futures: list[Any], exc: BaseException) -> None:
        """Fail the callers of a batch with *exc*; a cancellation (the batch's task, as its
        loop ends) cancels them."""
        self._failed += 1
        cancelled = not isinstance(exc, Exception)
        for future in futures:
            if not future.done():  # (a caller that stopped waiting gets nothing)
                if cancelled:
                    future.cancel()
                else:
                    future.set_exception(exc)

    def _end(self, futures: list[Any], answers: Any, exc: BaseException | None) -> None:
        """A batch ended (on the loop): hand each caller its answer, or the batch's error;
        under ``"adaptive"``, the batch collecting meanwhile launches at the end of this turn,
        once the callers woken here had their turn to join it."""
        self._in_flight -= 1
        if exc is not None:
            self._fail(futures, exc)
        else:
            for future, answer in zip(futures, answers, strict=False):
                if not future.done():  # (a caller that stopped waiting gets nothing)
                    future.set_result(answer)
        if self._open is not None:
            self._launch_next()
        self._check_idle()

    def _launch_next(self) -> None:
        """A batch ended: under ``"adaptive"``, the batch collecting launches at the end of
        this turn, if nothing of the queue is in flight or due now."""
        batch = self._open
        if (
            self._adaptive
            and batch is not None
            and batch.leave_line is None
            and not self._in_flight
            and not self._line
        ):
            self._loop.call_soon(self._launch_due, batch, COMPLETION)

    def _check_idle(self) -> None:
        """Let a waiting ``aclose()`` return once no batch is due or in flight."""
        idle = self._idle
        if not self._in_flight and not self._line and idle is not None and not idle.done():
            idle.set_result(None)

    # -- closing ---------------------------------------------------------------------------------

    def flush(self) -> None:
        """Launch the batch collecting now, if any, without waiting for its policy (where the
        gate holds it: once it lets it)."""
        batch = self._open
        if batch is not None:
            self._due(batch, FLUSH)

    def close(self) -> bool:
        """Refuse new calls and launch what is collecting; whether it was open."""
        if self._closed:
            return False
        self._closed = True
        self.flush()
        return True

    async def aclose(self) -> None:
        """:meth:`close`, then wait for the batches in flight and at the gate to end.

        A cancelled ``aclose()`` only stops waiting: the batches still answer their callers.
        """
        self.close()
        if (self._in_flight or self._line) and self._loop is not None:
            if self._idle is None or self._idle.done():
                self._idle = self._loop.create_future()
            await _loop.shield(self._idle)
        else:
            await _loop.sleep(0)
