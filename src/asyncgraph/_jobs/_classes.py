"""The scheduler's queue: jobs waiting for an in-flight slot, by priority class, with aging.

Jobs of a higher class go first, first come first served within a class, until one has waited
long: a job that has seen :data:`~asyncgraph._jobs._priority.AGING` jobs admitted since it was
queued goes before every job queued after it, whatever their class. So at most ``AGING`` jobs
queued after a job start before it: no class starves.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Protocol, TypeVar

from asyncgraph._runtime._priority import AGING, PRIORITIES

__all__ = ("ClassQueue", "Queued")


class Queued(Protocol):
    """A job as the queue reads it (the scheduler's ``Job``)."""

    id: int
    priority: int  # its class's rank
    stamp: int  # the aging clock when it was queued (set by push)


Job = TypeVar("Job", bound=Queued)


class ClassQueue(Generic[Job]):
    """Queued jobs by class, and the order they leave in (:meth:`next`).

    Attributes:
        jobs: every queued job by number, in the order they were queued (the fast path's
            door reads it: ``len(jobs)`` is the count queued, of every class).
    """

    __slots__ = ("_admitted", "_classes", "jobs")

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        # One FIFO per class; a job that left out of turn stays behind until it is at the head.
        self._classes: tuple[deque[Job], ...] = tuple(deque() for _ in PRIORITIES)
        self._admitted = 0  # jobs that left the queue so far (the aging clock)

    def __len__(self) -> int:
        return len(self.jobs)

    def counts(self) -> tuple[int, ...]:
        """Jobs queued per class, in ``PRIORITIES`` order."""
        counts = [0] * len(PRIORITIES)
        for job in self.jobs.values():
            counts[job.priority] += 1
        return tuple(counts)

    def push(self, job: Job) -> None:
        """Queue *job* (numbered), last of its class."""
        job.stamp = self._admitted
        self.jobs[job.id] = job
        self._classes[job.priority].append(job)

    def remove(self, job: Job) -> bool:
        """Take *job* out of the queue (it leaves, or is withdrawn); whether it was queued."""
        if self.jobs.pop(job.id, None) is None:
            return False
        queue = self._classes[job.priority]
        if queue and queue[0] is job:
            queue.popleft()
        return True

    def next(self) -> Job:
        """The job to admit next (the queue must not be empty): the oldest, once it aged,
        else the first of the highest class queued."""
        jobs = self.jobs
        oldest = next(iter(jobs.values()))
        if self._admitted - oldest.stamp >= AGING:
            return oldest
        for queue in self._classes:
            while queue and jobs.get(queue[0].id) is not queue[0]:
                queue.popleft()  # left out of turn earlier
            if queue:
                return queue[0]
        return oldest  # not reached: every queued job is in its class's FIFO

    def admitted(self, job: Job) -> None:
        """*job* left the queue for an in-flight slot (:meth:`remove` it first)."""
        self._admitted += 1
