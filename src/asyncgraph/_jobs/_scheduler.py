"""The job scheduler: one state machine for every dispatch, and one place that changes it.

A dispatch is a :class:`Job` that moves through explicit states::

    QUEUED ──▶ COMPILING ──▶ STAGING ──▶ PARKED ──▶ LAUNCHED ──▶ COLLECTING ──▶ DONE
       │           │            │          │            │              │
       └───────────┴────────────┴──────────┴────────────┴──────────────┴──▶ DONE (failed)

(each of COMPILING, STAGING and PARKED is skipped when it is not needed); a job not launched
may be withdrawn (``cancel()``, its awaiters cancelled, its queue deadline) unless later work
depends on it. The scheduler owns the queue (by class, with aging: ``_classes``), the
in-flight bound, the parked jobs and the jobs waiting for their kernel to compile.
Its event methods (:meth:`Scheduler.add`, :meth:`~Scheduler.compiled`, :meth:`~Scheduler.done`
and the others) only record what happened; each then runs :meth:`Scheduler._advance`, the one
transition function, which decides every move and returns the effects to perform, in order
(the way httpcore's connection pool assigns requests in one place). The caller performs them:
the engine compiles, stages, launches and releases; the front resolves. Engines never complete
or unpark jobs themselves; they report events back. The one exception is an engine's fast path,
which takes the two common transitions itself through :class:`~._fast_door.FastDoor`, and
nothing else.

Whether a job needs compiling or staging, and whether its dependencies are far enough along to
be ordered after on the device, are questions for the engine (its predicates, handed over as
bound methods: ``needs_compile``, ``needs_staging``, ``is_ready``); the scheduler only asks.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from asyncgraph._buffers._resident import track
from asyncgraph._runtime._priority import NORMAL

from ._classes import ClassQueue
from ._fast_door import FastDoor
from ._job_state import JobState
from ._withdrawal import kept_by_order

if TYPE_CHECKING:
    from asyncgraph._args._bound_args import BoundCall
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._buffers._resident import ResidentBuffer, Use

    from ._pending import PendingDispatch

__all__ = (
    "Effect",
    "Job",
    "JobState",
    "Scheduler",
    "Step",
    "track_buffers",
    "wait_finished",
)


class Step(enum.Enum):
    """What to do for a job (an effect of a transition)."""

    COMPILE = "compile"  # compile the job's kernel; report compiled()
    STAGE = "stage"  # stage the job's inputs; report staged()
    LAUNCH = "launch"  # launch the job; report done() (or raise: launch_failed())
    RELEASE = "release"  # the job failed before it ran: give back what it holds
    RESOLVE = "resolve"  # hand the job's outcome to its awaiters


Effect = tuple[Step, "Job"]


class Job:
    """One dispatch from ``dispatch()`` to its outcome. Engines subclass it for their data."""

    __slots__ = (
        "buffers",
        "call",
        "deps",
        "device_time",
        "id",
        "nvtx_range",
        "outcome",
        "pending",
        "priority",
        "span",
        "stamp",
        "state",
        "t_dispatch",
        "t_submit",
        "timer",
        "timing",
    )

    def __init__(self, call: BoundCall, timing: bool) -> None:
        self.call = call
        self.timing = timing
        self.id = 0
        self.state = JobState.QUEUED
        self.pending: PendingDispatch = None  # type: ignore[assignment]  # set when numbered
        self.t_dispatch = 0.0
        self.t_submit = 0.0
        self.deps: list[Use] = []  # uses of its resident buffers it is ordered after
        self.buffers: list[ResidentBuffer] = []  # buffers it uses (untracked when done)
        self.nvtx_range: Any = None  # the NVTX range of its life, with nvtx_enabled
        self.outcome: tuple[Any, ...] | BaseException | None = None
        self.device_time: float | None = None
        self.priority = NORMAL  # its class's rank (_priority), set by the front
        self.stamp = 0  # the queue's aging clock when it was queued (_classes)
        self.timer: Any = None  # its queue deadline's timer, while one is set
        self.span: Any = None  # its trace span, while tracing (_runtime/_tracing)

    def __repr__(self) -> str:
        return f"<Job #{self.id} {self.call.kernel.name!r} {self.state.value}>"


# Enum members as module constants: the transitions run for every dispatch.
_QUEUED = JobState.QUEUED
_COMPILING = JobState.COMPILING
_STAGING = JobState.STAGING
_PARKED = JobState.PARKED
_LAUNCHED = JobState.LAUNCHED
_COLLECTING = JobState.COLLECTING
_DONE = JobState.DONE
_COMPILE_STEP = Step.COMPILE
_STAGE_STEP = Step.STAGE
_LAUNCH_STEP = Step.LAUNCH
_RELEASE_STEP = Step.RELEASE
_RESOLVE_STEP = Step.RESOLVE


class Scheduler:
    """The queue, the in-flight bound, parked and compiling jobs of one backend.

    Args:
        max_in_flight: jobs admitted (compiling to collecting) at most; more wait queued.
        needs_compile: the engine's predicate: whether a job's kernel must be compiled before
            it can launch.
        needs_staging: whether a job's inputs must be staged off the loop before it can launch.
        is_ready: whether every use a job depends on is far enough along to be ordered after.
        (The engine's predicates change nothing.)
    """

    __slots__ = (
        "_compiling",
        "_in_flight",
        "_is_ready",
        "_max",
        "_needs_compile",
        "_needs_staging",
        "_out",
        "_parked",
        "_queue",
        "fast_door",
    )

    def __init__(
        self,
        max_in_flight: int,
        *,
        needs_compile: Callable[[Job], bool],
        needs_staging: Callable[[Job], bool],
        is_ready: Callable[[Job], bool],
    ) -> None:
        self._needs_compile = needs_compile
        self._needs_staging = needs_staging
        self._is_ready = is_ready
        self._max = max_in_flight
        self._queue: ClassQueue[Job] = ClassQueue()
        self._in_flight: dict[int, Job] = {}
        self._parked: list[Job] = []
        self._compiling: dict[Kernel, list[Job]] = {}
        self._out: list[Effect] = []  # effects decided since the last _advance() returned
        # The one way an engine's fast path changes what this scheduler holds (FastDoor).
        self.fast_door = FastDoor(self._in_flight, self._queue.jobs, self._parked, max_in_flight)

    def __repr__(self) -> str:
        return (
            f"<Scheduler in_flight={len(self._in_flight)} queued={len(self._queue)} "
            f"parked={len(self._parked)} compiling={sum(map(len, self._compiling.values()))}>"
        )

    # -- predicates ----------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Jobs admitted and not done."""
        return len(self._in_flight)

    @property
    def queued(self) -> int:
        """Jobs waiting for an in-flight slot."""
        return len(self._queue)

    def queued_by_class(self) -> tuple[int, ...]:
        """Jobs waiting for an in-flight slot, per class (``PRIORITIES`` order)."""
        return self._queue.counts()

    def is_idle(self) -> bool:
        """Whether no job is queued or in flight."""
        return not self._in_flight and not self._queue.jobs

    def has_parked(self) -> bool:
        """Whether some job waits for a use it depends on."""
        return bool(self._parked)

    def jobs_in_flight(self) -> list[Job]:
        """The admitted jobs, oldest first (a copy)."""
        return list(self._in_flight.values())

    def admitted(self, dispatch_id: int) -> Job | None:
        """The admitted job numbered *dispatch_id*, or ``None`` (queued, or finished)."""
        return self._in_flight.get(dispatch_id)

    # -- events --------------------------------------------------------------------------------

    def add(self, job: Job) -> list[Effect]:
        """A new dispatch (numbered, with its pending result)."""
        job.state = _QUEUED
        if not self._queue.jobs and len(self._in_flight) < self._max:
            # The common case, without the general pass: admit and route it.
            job.t_submit = perf_counter()
            self._in_flight[job.id] = job
            self._route(job)
            out, self._out = self._out, []
            return out
        self._queue.push(job)
        return self._advance()

    def compiled(
        self, kernel: Kernel, error: Callable[[Job], BaseException] | None
    ) -> list[Effect]:
        """*kernel* compiled (``error is None``), or failed: *error* makes each job's error."""
        for job in self._compiling.pop(kernel, ()):
            if error is not None:
                self._finish(job, error(job), release=True)
            else:
                self._route(job)
        return self._advance()

    def staged(self, job: Job, error: BaseException | None) -> list[Effect]:
        """*job*'s inputs are staged, or staging failed (the engine released what it took)."""
        if job.state is _STAGING:
            if error is not None:
                self._finish(job, error, release=False)
            else:
                self._route(job, staged=True)
        return self._advance()

    def launch_failed(self, job: Job, error: BaseException) -> list[Effect]:
        """Launching *job* raised (the engine released what it took)."""
        self._finish(job, error, release=False)
        return self._advance()

    def collecting(self, job: Job) -> None:
        """The device finished *job*; its results are being copied out."""
        if job.state is _LAUNCHED:
            job.state = _COLLECTING

    def done(
        self, job: Job, outcome: tuple[Any, ...] | BaseException, device_time: float | None
    ) -> list[Effect]:
        """The engine finished *job* (results or error) and released what it held."""
        state = job.state
        if state is _LAUNCHED or state is _COLLECTING:
            # The common case (a launched job completed), without the general finish.
            self._in_flight.pop(job.id, None)
            job.state = _DONE
            job.outcome = outcome
            job.device_time = device_time
            if not self._queue.jobs and not self._parked and not self._out:
                return [(_RESOLVE_STEP, job)]
            self._out.append((_RESOLVE_STEP, job))
            return self._advance()
        if state is not _DONE:
            job.device_time = device_time
        self._finish(job, outcome, release=False)
        return self._advance()

    def poke(self) -> list[Effect]:
        """A use some parked job may depend on reached the device (or finished)."""
        return self._advance() if self._parked else []

    def drop_queued(self, error: Callable[[Job], BaseException]) -> list[Effect]:
        """Fail every job still queued (closing): none of them started."""
        for job in list(self._queue.jobs.values()):
            self._finish(job, error(job), release=True)
        return self._advance()

    def withdraw(self, job: Job, error: BaseException) -> tuple[bool, list[Effect]]:
        """Withdraw *job* if it has not launched and no later work depends on it: it fails
        with *error*, releasing what it holds. Whether it was withdrawn, and the effects."""
        if job.state not in _WITHDRAWABLE or kept_by_order(job, _DONE):
            return False, []
        self._finish(job, error, release=True)
        return True, self._advance()

    def expired(self, job: Job, error: BaseException) -> tuple[bool, list[Effect]]:
        """*job*'s queue deadline passed: :meth:`withdraw` it if it still waits for a slot."""
        if job.state is not _QUEUED:
            return False, []
        return self.withdraw(job, error)

    def abandon_waiting(self, error: Callable[[Job], BaseException]) -> list[Effect]:
        """Fail every admitted job that has not launched (its loop ended: nothing resumes it)."""
        for job in list(self._in_flight.values()):
            if job.state in _WAITING:
                self._finish(job, error(job), release=True)
        return self._advance()

    # -- the transition function ---------------------------------------------------------------

    def _advance(self) -> list[Effect]:
        """Decide every move the last event allows; return the effects, in order."""
        queue = self._queue
        while queue.jobs and len(self._in_flight) < self._max:
            job = self._queued_dep(queue.next())
            queue.remove(job)
            queue.admitted(job)
            self._admit(job)
        if self._parked:
            ready = self._is_ready
            for job in [job for job in self._parked if ready(job)]:
                self._parked.remove(job)
                job.state = _LAUNCHED
                self._out.append((_LAUNCH_STEP, job))
        out, self._out = self._out, []
        return out

    def _queued_dep(self, job: Job) -> Job:
        """The first queued job *job* depends on (recursively), else *job*: first admitted."""
        for dep in job.deps:
            if isinstance(dep, Job) and dep.state is _QUEUED:
                return self._queued_dep(dep)
        return job

    def _admit(self, job: Job) -> None:
        job.t_submit = perf_counter()
        self._in_flight[job.id] = job
        self._route(job)

    def _route(self, job: Job, staged: bool = False) -> None:
        """Move an admitted job on as far as it can go now."""
        if self._needs_compile(job):
            job.state = _COMPILING
            waiting = self._compiling.get(job.call.kernel)
            if waiting is None:
                self._compiling[job.call.kernel] = [job]
                self._out.append((_COMPILE_STEP, job))
            else:
                waiting.append(job)
        elif not staged and self._needs_staging(job):
            job.state = _STAGING
            self._out.append((_STAGE_STEP, job))
        elif self._is_ready(job):
            job.state = _LAUNCHED
            self._out.append((_LAUNCH_STEP, job))
        else:
            job.state = _PARKED
            self._parked.append(job)

    def _finish(self, job: Job, outcome: tuple[Any, ...] | BaseException, *, release: bool) -> None:
        state = job.state
        if state is _DONE:
            return  # already finished (a failure raced with a normal completion)
        self._in_flight.pop(job.id, None)
        if state is _QUEUED:
            self._queue.remove(job)
        elif state is _PARKED:
            self._parked.remove(job)
        elif state is _COMPILING:
            waiting = self._compiling.get(job.call.kernel)
            if waiting is not None and job in waiting:
                waiting.remove(job)
                if not waiting:
                    del self._compiling[job.call.kernel]
        job.state = _DONE
        job.outcome = outcome
        if release:
            self._out.append((_RELEASE_STEP, job))
        self._out.append((_RESOLVE_STEP, job))


_WAITING = frozenset((_COMPILING, _STAGING, _PARKED))
_WITHDRAWABLE = frozenset((_QUEUED, _COMPILING, _PARKED))  # not staging: threads copy for it


def track_buffers(job: Job) -> None:
    """Record *job*'s uses of its resident buffers, and the earlier uses it is ordered after."""
    writes: dict[ResidentBuffer, bool] = {}
    for arg in job.call.args:
        buffer = arg.buffer
        if buffer is not None:
            writes[buffer] = writes.get(buffer, False) or arg.writes
    for buffer, write in writes.items():
        job.deps.extend(dep for dep in track(buffer, job, write) if dep is not job)
        job.buffers.append(buffer)


async def wait_finished(deps: list[Use]) -> None:
    """Wait until each job in *deps* finished, whatever its outcome (other uses are skipped)."""
    for dep in deps:
        pending = getattr(dep, "pending", None)  # a job of either path (a Download has none)
        if pending is not None and not pending.done():
            with contextlib.suppress(Exception):
                await pending
