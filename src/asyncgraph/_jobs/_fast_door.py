"""The scheduler's door for an engine's fast path: the two transitions it takes itself.

This module is their one implementation. Where the compiled core is built, it is compiled too
(``_fast_door.pxd`` declares :class:`FastDoor` as an extension type), and the compiled fast path
calls its methods through C; elsewhere the same source runs as plain Python.
"""

from __future__ import annotations

from typing import Any

from ._job_state import JobState

__all__ = ("FastDoor",)

_LAUNCHED = JobState.LAUNCHED
_DONE = JobState.DONE


class FastDoor:
    """The scheduler's door for an engine's fast path: its two transitions, and what they read.

    The fast path (the dispatch core's ``FastPath``) takes the two common transitions of
    ``Scheduler.add`` and ``Scheduler.done`` without the general pass: a job admitted at once
    and launched, and that job's completion while nothing waits. These two and
    :meth:`withdraw` (an admission taken back) are the only changes anything outside the
    ``Scheduler`` makes to its jobs' states and containers; the compiled fast path calls them
    through C (``_fast_door.pxd``).

    Attributes (the scheduler's own containers, never rebound; read only outside the
    scheduler and these methods):
        in_flight: the admitted jobs by number, oldest first.
        queue: the jobs waiting for an in-flight slot, of every class, by number.
        parked: the jobs waiting for a use they depend on.
        limit: the in-flight bound.
    """

    # The fields, as slots here and as the extension type's fields in _fast_door.pxd (the same
    # names: keep the two alike).
    __slots__ = ("in_flight", "limit", "parked", "queue")

    # The containers, and the methods' jobs, are the scheduler's (``_scheduler.Job``, which this
    # module below the scheduler does not name) and the fast path's own records (the core's
    # ``FastJob``), each with a job's ``id``, ``state`` and ``outcome``: hence ``Any``.
    def __init__(
        self, in_flight: dict[int, Any], queue: dict[int, Any], parked: list[Any], limit: int
    ) -> None:
        self.in_flight = in_flight
        self.queue = queue
        self.parked = parked
        self.limit = limit

    def admit_launched(self, job: Any) -> None:
        """Admit *job* (numbered) straight to ``LAUNCHED``: the caller launches it itself.

        Only while the queue is empty and a slot is free (``not queue and len(in_flight) <
        limit``), which the caller checked before it changed anything, as ``Scheduler.add``
        checks before it admits. Nothing to compile, stage or wait for: the job is counted in
        flight with no effect to perform. Its end is reported through :meth:`complete_launched`
        or, as any job's, ``Scheduler.done``.
        """
        self.in_flight[job.id] = job
        job.state = _LAUNCHED

    def withdraw(self, job: Any) -> None:
        """Take back :meth:`admit_launched` of *job*, which was not launched after all (a later
        step of the caller's commit raised): out of flight again, and never reported."""
        self.in_flight.pop(job.id, None)

    def complete_launched(self, job: Any, outcome: tuple[Any, ...] | BaseException) -> bool:
        """*job*, admitted by :meth:`admit_launched`, finished with *outcome*: ``DONE``, out
        of flight, if nothing waits for its slot; whether it was.

        When a job is queued or parked it changes nothing and returns ``False``: the caller
        reports the job through ``Scheduler.done`` (the dispatcher's ``done``), which admits
        the next in order. Returning ``True``, it leaves the resolving to the caller, as
        ``Scheduler.done`` leaves it to the dispatcher (the job's buffers untracked, then its
        pending result set).
        """
        if self.queue or self.parked:
            return False
        self.in_flight.pop(job.id, None)
        job.state = _DONE
        job.outcome = outcome
        return True
