"""Graph replays on the fast path: launched within the caller's call, completed by the reactor.

A replay of a recorded or captured graph (``CachedGraph.replay``, ``CapturedGraph.replay``) whose
graph is ready (its inputs written into its pinned block, its scalars set: the graph's own part)
is launched by :meth:`FastReplays.replay` in the backend's steady state, as an eager dispatch is
by the fast path: open, on its loop, nothing queued, an in-flight slot free, no capture pausing
the reactor, no fault, and every unfinished use of the graph's resident buffers on one lane (or
none). It launches the graph on that lane (else the least busy one not leased) and records an
event first, so the GPU starts as early as it can; then admits the replay through the
scheduler's door, records its buffers' uses and has the reactor watch the event, expecting the
graph's learned time, so the reactor wakes the loop for its end as for an eager dispatch's. Its
completion (:meth:`FastReplays.complete`) takes the results, lets the graph's next replay go,
and resolves the replay, or hands it the general way to the dispatcher when anything waits.
Anything else returns ``None`` having changed nothing: the general path runs the replay.

It enters the front through the doors the fast path uses (``front._fast_front``), and serves both
dispatch cores: a replay's own Python is one call into the graph and one here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

from cuda.bindings import driver as drv

from asyncgraph.capture._choice import REPLAYS_TOLD_EVERY, ChoiceState
from asyncgraph.cuda.driver._driver import SUCCESS
from asyncgraph.jobs._pending import PendingDispatch
from asyncgraph.jobs._scheduler import JobState

from ._fast_plan import K_SCALAR, FastPlan, KnownKernel, describes, eligible, fitting
from ._fast_steps import admit, lane_after, least_busy, record_event, resolved_here, steady_loop
from ._watches import OWN_END, learned

if TYPE_CHECKING:
    from asyncgraph.args._bound_args import BoundCall
    from asyncgraph.args._kernel import Kernel
    from asyncgraph.args._plan_cache import Plan
    from asyncgraph.buffers._resident import ResidentBuffer
    from asyncgraph.front._fast_front import FastFront
    from asyncgraph.pool import StreamPool
    from asyncgraph.runtime._telemetry import Telemetry

    from ._fast_job import FastLane

__all__ = ("FastReplays", "ReplayJob", "ReplayedGraph")

_QUEUED = JobState.QUEUED
_ALWAYS = "always"
_AUTO = "auto"
_CHOSE_GRAPH = ChoiceState.GRAPH
_current, _push, _pop = drv.cuCtxGetCurrent, drv.cuCtxPushCurrent, drv.cuCtxPopCurrent


class ReplayedGraph(Protocol):
    """What the fast path uses of a graph it replays (``CachedGraph``, ``CapturedGraph``)."""

    expected: float  # seconds from launch to completion, as learned here (0.0: not yet)

    replays: int  # replays launched so far

    def launch_on(self, handle: Any) -> None:
        """Launch the graph ready for this replay on the stream *handle*; raises if it fails."""
        ...

    def launch_address(self) -> int:
        """The address of the executable graph ready for this replay (``CUgraphExec``)."""
        ...

    def results(self, call: BoundCall) -> tuple[Any, ...]:
        """The replay's results, once it completed."""
        ...

    def staged_results(self, returned: tuple[tuple[Any, ...], ...]) -> tuple[Any, ...]:
        """The results of a replay of a cached graph taken by its plan (``take_staged``)."""
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
        "returned",
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
        self.returned: Any = None  # a cached graph's results by its plan (staged_results)

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
        # A lone await spins until the graph's learned time is up, where that is near.
        self._spin_own = partial(watches.spin, OWN_END)
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
        self._kernels: dict[Kernel, KnownKernel] = {}  # plans of calls with nothing resident

    # -- cached graphs -------------------------------------------------------------------------

    def learn(self, plan: Plan, call: BoundCall) -> None:
        """A plan was made from *call*: replay the cached graphs of calls that fit it here, once
        the graph cache routes them (:meth:`route`), if nothing of it is resident."""
        if not call.resident and eligible(plan, call):
            KnownKernel.of(self._kernels, call.kernel).learn(FastPlan(plan, call))

    def route(
        self, call: BoundCall, instances: list[Any], choice: Any, hit: Callable[[], None]
    ) -> bool:
        """Replay *instances* (the graph cache's list of its graphs of *call*'s signature) for
        the calls that fit *call*'s plan, calling *hit* for each (the cache counts them);
        *choice*: ``"auto"``'s for the signature, or ``None``. Whether a plan had it (none is
        learned of calls with resident buffers)."""
        known = self._kernels.get(call.kernel)
        for plan in known.plans if known is not None else ():
            if describes(plan, call):
                route = plan.route
                if route is None or route.instances is not instances:
                    scalars = tuple(i for i, guard in enumerate(plan.args) if guard[0] == K_SCALAR)
                    route = plan.route = ReplayRoute(instances, None, scalars, hit)
                route.choice = choice or route.choice
                return True
        return False

    def dispatch(
        self,
        kernel: Kernel,
        args: tuple[object, ...],
        grid: object,
        block: object,
        shared_mem: object,
        timing: object,
        graph: object,
    ) -> PendingDispatch | None:
        """A ``graph="always"`` dispatch, or a ``graph="auto"`` one whose signature chose
        graphs (or measures a replay now), replaying a free cached graph of its signature:
        launched, its pending result returned; ``None``, having changed nothing, when it
        cannot be (then the general path runs, and raises whatever is wrong with the call)."""
        t0 = perf_counter()
        known = self._kernels.get(kernel)
        if known is None or timing is not False or (graph != _ALWAYS and graph != _AUTO):
            return None
        plan = fitting(known.plans, args, grid, block, shared_mem)
        if plan is None or plan.route is None:
            return None
        route = plan.route
        sampled: Any = None  # "auto"'s choice, told this replay's cost
        counted: Any = None  # "auto"'s choice of graphs, told its replays in bulk
        if graph != _ALWAYS:
            choice = route.choice
            if choice is None:
                return None
            if choice.state is not _CHOSE_GRAPH:
                if choice.eager or not choice.sampling:
                    return None  # "auto" runs eagerly now, or was forgotten
                sampled = choice  # a replay "auto" measures, as its replays would run
            else:
                counted = choice
        for cached in route.instances:
            if cached.take_staged(plan.uploads, route.scalars, args):
                break
        else:
            return None  # every graph busy, or a scalar changed: the general path
        try:
            pending = self.replay(cached, plan.template, (), (), sampled, t0, plan.returned)
        except BaseException:
            cached.replay_done()
            raise
        if pending is None:
            cached.replay_done()  # not the steady state: the general path takes it again
            return None
        route.hit()
        if counted is not None:
            route.uncounted += 1
            if route.uncounted >= REPLAYS_TOLD_EVERY:
                route.uncounted = 0
                counted.replayed(REPLAYS_TOLD_EVERY)
        return pending

    def replay(
        self,
        graph: ReplayedGraph,
        call: BoundCall,
        buffers: Sequence[ResidentBuffer],
        writes: tuple[bool, ...],
        choice: Any = None,
        started: float = 0.0,
        returned: Any = None,
    ) -> PendingDispatch | None:
        """Launch *graph*, ready to replay *call* on *buffers* (written where *writes* says),
        and return the pending result; ``None``, having changed nothing, when this is not the
        steady state. *choice*: a ``graph="auto"`` choice told the replay's cost from
        *started* once it completed. *returned*: the results as the plan of a cached graph's
        replay lays them out (``None``: the graph's ``results(call)``)."""
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
        expected = graph.expected
        expect = t0 + expected if expected else 0.0
        # Launched first, the bookkeeping done while it runs: nothing else runs in between.
        own = self._context  # the backend's, current for the driver calls
        pushed = own is not None and _current()[1] != own and _push(own)[0] == SUCCESS
        event: Any = None
        failure: BaseException | None = None
        try:
            graph.launch_on(lane.handle)
            event = record_event(self._idle_events, self._take_event, lane.handle)
        except BaseException as exc:
            failure = exc
        finally:
            if pushed:
                _pop()
        try:
            job = ReplayJob(self, graph, call, lane, t0)
            job.choice, job.started, job.returned = choice, started, returned
            job.id = dispatch_id = next(self._ids)
            job.pending = pending = PendingDispatch(
                loop, dispatch_id, call.kernel.name, self._spin_own
            )
            job.buffers.extend(buffers)
            admit(door, self._pool, job, placed, writes)
        except BaseException:
            lane.settle()  # what it launched ended: nothing refers to it
            if event is not None:
                self._idle_events.append(event)
            raise
        if placed:
            self._cursor = (self._cursor + 1) % len(self._lanes)
        self.replays += 1
        if failure is not None:
            self._not_watched(job, failure)
            if not isinstance(failure, Exception):
                raise failure
            return pending
        job.event = event
        job.watch = watches.watch(lane.index, event, job.ended, expect)
        self._submit_time.append(perf_counter() - t0)
        return pending

    def _not_watched(self, job: ReplayJob, error: BaseException) -> None:
        """The graph could not be launched, or its event not recorded: wait for the lane
        (``Lane.settle``: what was launched ended), then finish the replay with *error* the
        general way."""
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
                returned = job.returned
                if returned is None:
                    outcome = graph.results(job.call)
                else:
                    outcome = graph.staged_results(returned)
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


class ReplayRoute:
    """The cached graphs ``graph="always"`` and ``"auto"`` dispatches of one signature replay on
    the fast path (a ``FastPlan``'s ``route``): the graph cache's instances of it (its own
    list), and ``"auto"``'s choice for it, if any."""

    __slots__ = ("choice", "hit", "instances", "scalars", "uncounted")

    def __init__(
        self, instances: list[Any], choice: Any, scalars: tuple[int, ...], hit: Callable[[], None]
    ) -> None:
        self.instances = instances
        self.choice = choice
        self.scalars = scalars  # the indices of the scalar arguments
        self.hit = hit  # counts a replay in the graph cache's statistics
        self.uncounted = 0  # replays of the choice of graphs not told it yet (REPLAYS_TOLD_EVERY)
