"""The dispatcher: runs the scheduler's effects, and hands outcomes to awaiters.

It sits between the front and the engine. The front numbers a job and calls :meth:`add`; the
engine reports events through the :class:`~asyncgraph._front._engine_protocols.Sink` methods
(``compiled``, ``staged``, ``done``...). Each event goes to the
:class:`~asyncgraph._jobs._scheduler.Scheduler`, whose transition function returns the effects to
perform; the dispatcher performs them in order: the engine compiles, stages, launches or releases,
and a resolved job's buffers are untracked, its telemetry recorded and its :class:`PendingDispatch`
resolved. Effects that an effect itself causes (a launch that fails at once, a compile that fails
from the cache) are queued behind the batch in progress, so the order of events is the order of
their effects.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from asyncgraph._buffers._resident import untrack
from asyncgraph._runtime import _tracing
from asyncgraph._runtime._deadline import call_at_deadline
from asyncgraph._runtime._exceptions import QueueTimeoutError, WithdrawnError

from .._jobs._pending import set_outcome, set_withdraw
from .._jobs._scheduler import Effect, Job, JobState, Scheduler, Step

if TYPE_CHECKING:
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._buffers._resident import ResidentBuffer
    from asyncgraph._front._engine_protocols import Engine, Sink
    from asyncgraph._runtime._nvtx import NvtxRanges
    from asyncgraph._runtime._telemetry import Telemetry

__all__ = ("Dispatcher",)

# Enum members as module constants: the effect loop runs for every dispatch.
_LAUNCH = Step.LAUNCH
_RESOLVE = Step.RESOLVE
_COMPILE = Step.COMPILE
_STAGE = Step.STAGE
_QUEUED = JobState.QUEUED


class Dispatcher:
    """The scheduler of one backend, its effects, and the resolution of its jobs.

    The dispatcher and its engine need each other: the engine reports to the dispatcher (its
    :class:`~asyncgraph._front._engine_protocols.Sink`), the dispatcher runs jobs with the engine.
    So the dispatcher makes its engine, handing itself over as the sink; the engine keeps it, and
    reports nothing before a job runs. Everything else is complete when it is passed in.

    Args:
        engine: makes what runs the jobs, given the sink to report to (called once, here);
            the engine made is :attr:`engine`.
        max_in_flight: the scheduler's in-flight bound.
        telemetry: the backend's counters.
        log: the backend's bound logger.
        nvtx: NVTX ranges, when enabled.
        dispatch_events: whether to log each completion at debug level.
        after: called with the scheduler after each batch of effects (the front's
            ``Room.after_batch``: it wakes a waiting ``submit()``, sees if a close may go on).
        discard: closes a resident buffer a failed dispatch made for ``Out(resident=True)``
            (nobody else can have it: it is returned only by a dispatch that succeeds).

    Attributes:
        engine: the engine *engine* made.
        scheduler: the scheduler, over the engine's predicates.
    """

    def __init__(
        self,
        *,
        engine: Callable[[Sink], Engine[Any]],
        max_in_flight: int,
        telemetry: Telemetry,
        log: Any,
        nvtx: NvtxRanges | None,
        dispatch_events: bool,
        after: Callable[[Scheduler], None],
        discard: Callable[[ResidentBuffer], None],
    ) -> None:
        self._telemetry = telemetry
        self._log = log
        self._nvtx = nvtx
        self._dispatch_events = dispatch_events
        self._after = after
        self._discard = discard
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._backlog: deque[Effect] = deque()
        made = self.engine = self._engine = engine(self)
        self.scheduler = Scheduler(
            max_in_flight,
            needs_compile=made.needs_compile,
            needs_staging=made.needs_staging,
            is_ready=made.is_ready,
        )

    # -- the loop ------------------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """See :attr:`Sink.loop`; bound before any work starts."""
        return self._loop  # type: ignore[return-value]  # bound before any job exists

    def bind(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Belong to *loop* from now on."""
        self._loop = loop

    # -- events from the front -----------------------------------------------------------------

    def add(self, job: Job, queue_timeout: float | None = None) -> None:
        """A numbered job with its pending result: schedule it; if it is queued, withdraw it
        once it waited *queue_timeout* seconds for a slot (``None``: as long as it takes)."""
        effects = self.scheduler.add(job)
        if queue_timeout is not None and job.state is _QUEUED:
            job.timer = call_at_deadline(
                self._loop, queue_timeout, self._expire, job, queue_timeout
            )
        if len(effects) == 1 and not self._running and effects[0][0] is _LAUNCH:
            # The common case, without the general loop: launch it. What its launch caused
            # (a failure's effects, parked jobs now ready) then runs the general way.
            self._running = True
            try:
                self._launch(job)
            finally:
                self._running = False
                if self._backlog or self.scheduler.has_parked():
                    self._run(self.scheduler.poke())
                else:
                    self._after(self.scheduler)
            return
        self._run(effects)

    def withdraw(self, job: Job, abandoned: bool) -> bool:
        """Withdraw *job* if it has not launched and nothing depends on it (``cancel()``, or
        its last awaiter cancelled: *abandoned*); whether it was."""
        why = "every task awaiting it was cancelled" if abandoned else "cancel() was called"
        error = WithdrawnError(
            f"dispatch #{job.id} of {job.call.kernel.name!r} was withdrawn before it launched "
            f"({why}); its kernel did not run"
        )
        withdrawn, effects = self.scheduler.withdraw(job, error)
        if withdrawn:
            self._telemetry.count("dispatches_withdrawn")
            self._run(effects)
        return withdrawn

    def _expire(self, job: Job, queue_timeout: float) -> None:
        job.timer = None
        error = QueueTimeoutError(
            f"dispatch #{job.id} of {job.call.kernel.name!r} waited its queue_timeout of "
            f"{queue_timeout:g} s for an in-flight slot and was withdrawn; its kernel did not run "
            "— raise queue_timeout, lower the load, or give it a higher priority"
        )
        withdrawn, effects = self.scheduler.expired(job, error)
        if withdrawn:
            self._telemetry.count("dispatches_timed_out")
            self._run(effects)

    def drop_queued(self, error: Callable[[Job], BaseException]) -> None:
        """Perform :meth:`Scheduler.drop_queued` (closing)."""
        self._run(self.scheduler.drop_queued(error))

    def abandon_waiting(self, error: Callable[[Job], BaseException]) -> None:
        """Perform :meth:`Scheduler.abandon_waiting`."""
        self._run(self.scheduler.abandon_waiting(error))

    # -- events from the engine (the Sink protocol) ------------------------------------------

    def compiled(self, kernel: Kernel, error: Callable[[Job], BaseException] | None) -> None:
        """See :meth:`Sink.compiled`."""
        self._run(self.scheduler.compiled(kernel, error))

    def staged(self, job: Job, error: BaseException | None) -> None:
        """See :meth:`Sink.staged`."""
        self._run(self.scheduler.staged(job, error))

    def collecting(self, job: Job) -> None:
        """See :meth:`Sink.collecting`."""
        self.scheduler.collecting(job)

    def done(
        self, job: Job, outcome: tuple[Any, ...] | BaseException, device_time: float | None
    ) -> None:
        """See :meth:`Sink.done`."""
        effects = self.scheduler.done(job, outcome, device_time)
        if (
            len(effects) == 1
            and effects[0][0] is _RESOLVE
            and not self._running
            and not self._backlog
        ):
            # The common case, without the general loop: hand the outcome over.
            self._resolve(effects[0][1])
            self._after(self.scheduler)
            return
        self._run(effects)

    def poke(self) -> None:
        """See :meth:`Sink.poke`."""
        if self.scheduler.has_parked():
            self._run(self.scheduler.poke())

    # -- effects -------------------------------------------------------------------------------

    def _run(self, effects: list[Effect]) -> None:
        todo = self._backlog
        if not effects and not todo:
            return
        todo.extend(effects)
        if self._running:  # an effect caused an event: its effects follow the batch in progress
            return
        self._running = True
        launched = False
        try:
            while True:
                while todo:
                    step, job = todo.popleft()
                    if step is _LAUNCH:
                        launched = True
                        self._launch(job)
                    elif step is _RESOLVE:
                        self._resolve(job)
                    elif step is _COMPILE:
                        self._engine.start_compile(job)
                    elif step is _STAGE:
                        self._engine.stage(job)
                    else:
                        self._engine.release(job)
                if not (launched and self.scheduler.has_parked()):
                    break
                # Launches give later jobs events to be ordered after.
                launched = False
                todo.extend(self.scheduler.poke())
        finally:
            self._running = False
            if todo:  # a BaseException interrupted the batch: what is decided still happens
                rest = list(todo)
                todo.clear()
                self._run(rest)  # and calls after
            else:
                self._after(self.scheduler)

    def _launch(self, job: Job) -> None:
        t0 = perf_counter()
        telemetry = self._telemetry
        telemetry.class_queue_wait[job.priority].record(job.t_submit - job.t_dispatch)
        if job.timer is not None:
            job.timer.cancel()
            job.timer = None
        set_withdraw(job.pending, None)  # launched: no more to withdraw
        if job.span is not None:
            _tracing.launched(job.span)
        nvtx = self._nvtx
        name = job.call.kernel.name
        if nvtx is not None:
            job.nvtx_range = nvtx.start_dispatch(name)
            nvtx.push_submit(name)
        try:
            self._engine.launch(job)
        except BaseException as exc:
            self._backlog.extend(self.scheduler.launch_failed(job, exc))
            if not isinstance(exc, Exception):
                raise
        finally:
            if nvtx is not None:
                nvtx.pop_submit()
        telemetry.submit_time.record(perf_counter() - t0)

    def _resolve(self, job: Job) -> None:
        """Hand *job*'s outcome to its awaiters: untrack its buffers, count it."""
        for buffer in job.buffers:
            untrack(buffer, job)
        if job.nvtx_range is not None and self._nvtx is not None:
            self._nvtx.end_dispatch(job.nvtx_range)
        telemetry = self._telemetry
        latency = perf_counter() - job.t_dispatch
        outcome = job.outcome
        if not isinstance(job, Job):  # a fast path's job reported here, of its class
            telemetry.class_latency[job.priority].record(latency)  # type: ignore[unreachable]
        else:
            telemetry.class_latency[job.priority].record(latency)
            if job.timer is not None:
                job.timer.cancel()
                job.timer = None
            set_withdraw(job.pending, None)
            if job.span is not None:
                _tracing.finished(job.span, outcome)
                job.span = None
        device_time = job.device_time
        if isinstance(outcome, BaseException):
            telemetry.dispatches_failed += 1
            job.call.discard_buffers(self._discard)
            if self._dispatch_events:
                self._log.debug(
                    "dispatch.failed",
                    kernel=job.call.kernel.name,
                    dispatch_id=job.id,
                    error=repr(outcome),
                )
            set_outcome(job.pending, outcome, None)
        else:
            telemetry.dispatches_completed += 1
            if device_time is not None:
                telemetry.device_time.record(device_time)
            if self._dispatch_events:
                self._log.debug(
                    "dispatch.completed",
                    kernel=job.call.kernel.name,
                    dispatch_id=job.id,
                    latency=latency,
                    device_time=device_time,
                )
            set_outcome(job.pending, outcome or (), device_time)
