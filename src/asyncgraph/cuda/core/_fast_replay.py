"""Graph replays on the fast path: launched within the caller's call, completed by the reactor.

A replay of a recorded or captured graph (``CachedGraph.replay``, ``CapturedGraph.replay``) whose
graph is ready (its inputs written into its pinned block, its scalars set: the graph's own part)
is launched by :meth:`FastReplays.replay` in the backend's steady state, as an eager dispatch is
by the fast path: open, on its loop, nothing queued, an in-flight slot free, no capture pausing
the reactor, no fault, and every unfinished use of the graph's resident buffers on one lane (or
none). It admits the replay through the scheduler's door, launches the graph on that lane (else
the least busy one not leased), records an event and has the reactor watch it, expecting the
graph's learned time, so the reactor wakes the loop for its end as for an eager dispatch's. Its
completion (:meth:`FastReplays.complete`) takes the results, lets the graph's next replay go,
and resolves the replay, or hands it the general way to the dispatcher when anything waits.
Anything else returns ``None`` having changed nothing: the general path runs the replay.

It enters the front through the doors the fast path uses (``front._fast_front``), and serves both
dispatch cores: a replay's own Python is one call into the graph and one here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

from cuda.bindings import driver as drv

from asyncgraph.cuda.driver._driver import SUCCESS
from asyncgraph.jobs._pending import PendingDispatch
from asyncgraph.jobs._scheduler import JobState

from ._fast_steps import admit, lane_after, least_busy, record_event, resolved_here, steady_loop
from ._watches import learned

if TYPE_CHECKING:
    from asyncgraph.args._bound_args import BoundCall
    from asyncgraph.buffers._resident import ResidentBuffer
    from asyncgraph.front._fast_front import FastFront
    from asyncgraph.pool import StreamPool
    from asyncgraph.runtime._telemetry import Telemetry

    from ._fast_job import FastLane

__all__ = ("FastReplays", "ReplayJob", "ReplayedGraph")

_QUEUED = JobState.QUEUED
_current, _push, _pop = drv.cuCtxGetCurrent, drv.cuCtxPushCurrent, drv.cuCtxPopCurrent


class ReplayedGraph(Protocol):
    """What the fast path uses of a graph it replays (``CachedGraph``, ``CapturedGraph``)."""

    expected: float  # seconds from launch to completion, as learned here (0.0: not yet)

    def launch_on(self, handle: Any) -> None:
        """Launch the graph ready for this replay on the stream *handle*; raises if it fails."""
        ...

    def results(self, call: BoundCall) -> tuple[Any, ...]:
        """The replay's results, once it completed."""
        ...

    def replay_done(self) -> None:
        """The replay ended (completed, failed, or never launched): the next may go."""
        ...


class ReplayJob:
    """A replay the fast path launched: its job in the scheduler (``callback`` of its watch:
    :meth:`ended`). It has what the rest of the backend reads of a job, so a later dispatch on
    the general path orders itself after it like after any other."""

    __slots__ = (
        "buffers",
        "call",
        "choice",
        "device_time",
        "event",
        "gpu_done",
        "graph",
        "id",
        "lane",
        "outcome",
        "owner",
        "pending",
        "started",
        "state",
        "t_dispatch",
        "watch",
    )

    # What every job has, the same for each of these.
    deps: tuple[Any, ...] = ()
    nvtx_range = None
    timing = False
    streamed = False
    replay = None  # the general path's release never sees it: its graph is let go of here
    device_buffer = None
    t_submit = 0.0

    def __init__(
        self, owner: FastReplays, graph: ReplayedGraph, call: BoundCall, lane: FastLane, t: float
    ) -> None:
        self.owner = owner
        self.graph = graph
        self.call = call
        self.lane = lane
        self.t_dispatch = t
        self.state = _QUEUED  # until the scheduler's door admits it (FastDoor.admit_launched)
        self.buffers: list[ResidentBuffer] = []
        self.event: Any = None
        self.watch: Any = None
        self.gpu_done = False
        self.outcome: Any = None
        self.device_time: float | None = None
        self.id = 0
        self.pending: PendingDispatch = None  # type: ignore[assignment]  # set at once
        self.choice: Any = None  # graph="auto"'s choice, told the replay's cost
        self.started = 0.0  # where that cost counts from

    def __repr__(self) -> str:
        return f"<ReplayJob #{self.id} {self.call.kernel.name!r} {self.state.value}>"

    def ended(self, error: Any) -> None:
        """Its event completed (or the device failed with *error*): the reactor's callback."""
        self.owner.complete(self, error)


class FastReplays:
    """Graph replays in the steady state, each launched in one call (see the module).

    Args:
        lanes: the device's lanes (stream, stream-pool slot).
        watches: the reactor's hot half: the replays' events are watched there.
        events: the pool of completion events (``idle`` and ``take``).
        stream_pool: the stream pool, whose ``placements`` count these too.
        front: the front's doors and collaborators (``FastFront``).
    """

    def __init__(
        self,
        lanes: Sequence[FastLane],
        watches: Any,
        events: Any,
        stream_pool: StreamPool[Any],
        front: FastFront,
    ) -> None:
        self._lanes = lanes
        self._cursor = 0  # where placement starts looking (round robin among ties)
        self._watches = watches
        context = watches.context
        self._context = drv.CUcontext(context) if context else None  # current around launches
        self._idle_events: list[Any] = events.idle
        self._take_event: Callable[[], Any] = events.take
        self._pool = stream_pool
        self._door = front.door
        self._life = front.lifecycle
        self._dispatcher = front.dispatcher
        self._store = front.store
        self._ids = front.ids
        self.replays = self.completed = self.failed = 0
        self._submit_time: list[float] = []
        self._latency: list[float] = []

    def replay(
        self,
        graph: ReplayedGraph,
        call: BoundCall,
        buffers: Sequence[ResidentBuffer],
        writes: tuple[bool, ...],
        choice: Any = None,
        started: float = 0.0,
    ) -> PendingDispatch | None:
        """Launch *graph*, ready to replay *call* on *buffers* (written where *writes* says),
        and return the pending result; ``None``, having changed nothing, when this is not the
        steady state. *choice*: a ``graph="auto"`` choice told the replay's cost from
        *started* once it completed."""
        t0 = perf_counter()
        watches, door = self._watches, self._door
        loop = steady_loop(self._life, watches, door)
        if loop is None:
            return None
        lane = lane_after(self._store, buffers, writes)
        if lane is False:
            return None
        placed = lane is None
        if placed:
            lane = least_busy(self._lanes, self._cursor)
            if lane is None:
                return None  # every lane leased
        job = ReplayJob(self, graph, call, lane, t0)
        job.choice, job.started = choice, started
        job.id = dispatch_id = next(self._ids)
        job.pending = pending = PendingDispatch(loop, dispatch_id, call.kernel.name, watches.spin)
        job.buffers.extend(buffers)
        admit(door, self._pool, job, placed, writes)
        if placed:
            self._cursor = (self._cursor + 1) % len(self._lanes)
        self.replays += 1
        own = self._context  # the backend's, current for the driver calls
        pushed = own is not None and _current()[1] != own and _push(own)[0] == SUCCESS
        try:
            graph.launch_on(lane.handle)
            event = record_event(self._idle_events, self._take_event, lane.handle)
        except BaseException as exc:
            self._not_watched(job, exc)
            if not isinstance(exc, Exception):
                raise
            return pending
        finally:
            if pushed:
                _pop()
        job.event = event
        expected = graph.expected
        job.watch = watches.watch(lane.index, event, job.ended, t0 + expected if expected else 0.0)
        self._submit_time.append(perf_counter() - t0)
        return pending

    def _not_watched(self, job: ReplayJob, error: BaseException) -> None:
        """The graph could not be launched, or its event not recorded: wait for the lane
        (``Lane.settle``), then finish the replay with *error* the general way."""
        job.lane.settle()
        job.lane.slot.outstanding -= 1
        job.gpu_done = True
        job.graph.replay_done()
        self._dispatcher.done(job, error, None)  # type: ignore[arg-type]  # a job of this path

    def complete(self, job: ReplayJob, error: BaseException | None) -> None:
        """*job*'s event completed (or the device failed with *error*): its results, the graph
        free for its next replay, and the replay resolved."""
        job.gpu_done = True
        now = perf_counter()
        graph = job.graph
        outcome: Any = error
        if error is None:
            try:
                outcome = graph.results(job.call)
            except Exception as exc:
                outcome = exc  # whatever went wrong fails this replay, visibly
            seen = job.watch.seen if job.watch is not None else 0.0
            graph.expected = learned(graph.expected, (seen or now) - job.t_dispatch)
            if job.choice is not None and type(outcome) is tuple:
                job.choice.took(False, now - job.started)  # "auto" measures it
        graph.replay_done()
        job.lane.slot.outstanding -= 1
        if not resolved_here(self._life, self._door, self._dispatcher, job, outcome):
            return  # something waits for its slot, or for the backend to drain: the general way
        self._latency.append(now - job.t_dispatch)
        if isinstance(outcome, BaseException):
            self.failed += 1
        else:
            self.completed += 1

    def flush(self, telemetry: Telemetry) -> None:
        """Add what was counted since the last flush into *telemetry*."""
        telemetry.dispatches += self.replays
        telemetry.fast_path_dispatches += self.replays
        telemetry.dispatches_completed += self.completed
        telemetry.dispatches_failed += self.failed
        self.replays = self.completed = self.failed = 0
        for values, histogram in (
            ([0.0] * len(self._submit_time), telemetry.queue_wait),  # none waited in a queue
            (self._submit_time, telemetry.submit_time),
            (self._latency, telemetry.completion_latency),
        ):
            if values:
                histogram.record_all(values)
                values.clear()
