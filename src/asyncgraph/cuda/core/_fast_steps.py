"""The steps the Python fast path's launches share: an eager dispatch's (``_fast``) and a graph
replay's (``_fast_replay``). The compiled core has the eager dispatch's in C (``_fast.pxi``).

Each is a question asked before anything changed (:func:`steady_loop`, :func:`lane_after`,
:func:`least_busy`), the admission (:func:`admit`), the event recorded after the work
(:func:`record_event`), or the end of a completion (:func:`resolved_here`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as drv

from asyncgraph.buffers._resident import track_uses, untrack, uses_of, writer_of
from asyncgraph.cuda.driver._driver import SUCCESS, error_for
from asyncgraph.front._lifecycle import OPEN
from asyncgraph.jobs._pending import set_outcome
from asyncgraph.jobs._scheduler import JobState
from asyncgraph.runtime._finished import Download

if TYPE_CHECKING:
    from asyncgraph.buffers._resident import ResidentBuffer, ResidentStore
    from asyncgraph.front._engine_protocols import Sink
    from asyncgraph.front._lifecycle import Lifecycle
    from asyncgraph.jobs._scheduler import FastDoor

    from ._fast_job import FastLane

__all__ = ("admit", "lane_after", "least_busy", "record_event", "resolved_here", "steady_loop")

_DONE = JobState.DONE
_record = drv.cuEventRecord
_running_loop = asyncio._get_running_loop


def steady_loop(life: Lifecycle, watches: Any, door: FastDoor) -> asyncio.AbstractEventLoop | None:
    """The backend's loop if a launch may go on the fast path now: the backend open and called
    on its loop, a reactor listening, no fault, no capture pausing it, nothing queued and an
    in-flight slot free (``FastDoor.admit_launched``); else ``None``."""
    loop = life.loop
    if (
        life.state != OPEN
        or loop is None
        or _running_loop() is not loop
        or watches.schedule is None
        or watches.fault is not None
        or watches.paused
        or door.queue
        or len(door.in_flight) >= door.limit
    ):
        return None
    return loop


def lane_after(
    store: ResidentStore, buffers: Sequence[ResidentBuffer], writes: Sequence[bool]
) -> Any:
    """The lane that every unfinished use *buffers* must follow runs on (written where *writes*
    says): ``None`` for no such use, ``False`` when the general path must order them: a buffer
    closed or passed twice, a use not launched yet, a download, uses on two lanes, or that lane
    leased."""
    lane: Any = None
    for i, buffer in enumerate(buffers):
        if not store.is_live(buffer) or buffer in buffers[:i]:
            return False  # stale, or twice in one call: the general path says why
        deps: Any = uses_of(buffer) if writes[i] else (writer_of(buffer),)
        for dep in deps:
            if dep is None:
                continue
            if type(dep) is Download:
                return False
            if dep.state is _DONE or dep.gpu_done:
                continue
            if dep.event is None:
                return False  # not launched yet
            if lane is None:
                lane = dep.lane
            elif dep.lane is not lane:
                return False  # uses on two streams: wait by events, the general way
    if lane is not None and lane.slot.leased:
        return False
    return lane


def least_busy(lanes: Sequence[FastLane], start: int) -> FastLane | None:
    """The least busy lane not leased, ties in turn from *start* (as ``StreamPool.pick``);
    ``None`` when every lane is leased."""
    count = len(lanes)
    best: Any = None
    for k in range(count):
        candidate = lanes[(start + k) % count]
        slot = candidate.slot
        if slot.leased:
            continue
        if not slot.outstanding:
            return candidate
        if best is None or slot.outstanding < best.slot.outstanding:
            best = candidate
    return best  # type: ignore[no-any-return]


def admit(door: FastDoor, pool: Any, job: Any, placed: bool, writes: tuple[bool, ...]) -> None:
    """Admit *job*, launched next on its lane, through the scheduler's door: counted on the
    lane's slot (and in *pool*'s placements when *placed* there), its buffers' uses tracked
    (``job.buffers``, written where *writes* says); all of it, or nothing if a step raises."""
    slot = job.lane.slot
    taken = 0  # the steps below taken so far, undone if a later one raises
    try:
        door.admit_launched(job)
        slot.outstanding += 1
        taken = 1
        if placed:
            pool.placements += 1
            taken = 2
        if job.buffers:
            track_uses(job.buffers, writes, job)  # ordered by the lane (lane_after)
    except BaseException:
        door.withdraw(job)
        slot.outstanding -= taken > 0
        pool.placements -= taken > 1
        raise


def record_event(idle: list[Any], take: Callable[[], Any], handle: Any) -> Any:
    """An event of the pool (*idle*, else *take*) recorded on the stream *handle*.

    Raises:
        CudaError: ``cuEventRecord`` failed (the event went back to the pool).
    """
    event = idle.pop() if idle else take()
    code = _record(event, handle)[0]
    if code != SUCCESS:
        idle.append(event)
        raise error_for(code, "cuEventRecord")
    return event


def resolved_here(
    life: Lifecycle, door: FastDoor, dispatcher: Sink, job: Any, outcome: Any
) -> bool:
    """End the completion of *job*, launched on the fast path, with *outcome*: when nothing
    waits for its slot or for the backend to drain, done through the scheduler's door, its
    buffers untracked and its pending result set (``True``); else handed to the dispatcher,
    which admits the next in order (``False``)."""
    if life.state != OPEN or life.room.parked or not door.complete_launched(job, outcome):
        dispatcher.done(job, outcome, None)
        return False
    for buffer in job.buffers:
        untrack(buffer, job)
    set_outcome(job.pending, outcome, None)
    return True
