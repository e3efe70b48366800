"""The fast path of a CUDA dispatch, in Python: the steady state in one call, and its completion
in another. The compiled core's twin (``_fast.pxi``) has the same methods, in this order.

A dispatch whose argument plan is cached (``args._plan_cache``), whose kernel is loaded, with a
free in-flight slot, nothing queued, and no graph, timing or NVTX range, skips the general path:
:meth:`FastPath.dispatch` checks the plan's guards and does the whole launch itself (staging in
the lane's pinned ring, upload, the outputs' memset, kernel, download and event, the job in flight
and handed to the reactor) and returns the pending result; or ``None``, having changed nothing.
:meth:`FastPath.complete` (called by the reactor's :class:`Watches`) builds the results out of
the ring, releases the job's hold, resolves it. It changes the front through named doors only
(``front._fast_front``): the scheduler's ``FastDoor``, the resident store's ``track_uses`` and
``untrack``, the pending result's constructor and ``set_outcome``; the compiled core copies them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.bindings import driver as drv

from asyncgraph._exceptions import AllocationError
from asyncgraph.buffers._resident import storage_of
from asyncgraph.cuda.driver._driver import SUCCESS, error_for
from asyncgraph.jobs._pending import PendingDispatch

from ._fast_job import RING_BYTES, FastJob, FastLane, Ring
from ._fast_plan import K_OUT, K_RESIDENT, K_SCALAR, FastPlan, KnownKernel, eligible, fitting
from ._fast_steps import admit, lane_after, least_busy, record_event, resolved_here, steady_loop
from ._watches import EXPECT_RISE

if TYPE_CHECKING:
    from asyncgraph.args._bound_args import BoundCall
    from asyncgraph.args._kernel import Kernel
    from asyncgraph.args._plan_cache import Plan
    from asyncgraph.buffers._resident import ResidentBuffer
    from asyncgraph.front._fast_front import FastFront
    from asyncgraph.pool import PinnedBlock, StreamPool
    from asyncgraph.runtime._telemetry import Telemetry

    from ._watches import Watches

__all__ = ("RING_BYTES", "FastJob", "FastPath")

_NEVER = "never"
_AUTO = "auto"
_OOM = drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY

_memset, _up, _down = drv.cuMemsetD8Async, drv.cuMemcpyHtoDAsync, drv.cuMemcpyDtoHAsync
_launch = drv.cuLaunchKernel
_current, _push, _pop = drv.cuCtxGetCurrent, drv.cuCtxPushCurrent, drv.cuCtxPopCurrent


class FastPath:
    """The steady state of a CUDA backend's dispatches, in one call (see the module).

    Args:
        lanes: the device's lanes (stream, scratch buffer, stream-pool slot).
        rings: one pinned block of :data:`RING_BYTES` per lane, the lane's staging ring.
        watches: the reactor's hot half; the fast path adds its jobs to the lanes there.
        events: the pool of completion events (``idle`` and ``take``).
        stream_pool: the stream pool, whose ``placements`` count the fast path's too.
        front: the front's doors and collaborators (``FastFront``).
        launchers: the launchers of the kernels loaded (``Launches.launchers``), by kernel.
        launcher_type: the launchers this path packs (the core's own).
    """

    # Graph replays are ``FastReplays``' here: the graph cache's routed ones (one more call) and
    # those of captured and recorded graphs; the compiled path makes them within its own call
    # (``route``, ``replay``, ``_fast_replay.pxi``).
    routes_replays = False

    def __init__(
        self,
        lanes: Sequence[FastLane],
        rings: list[PinnedBlock],
        watches: Watches,
        events: Any,
        stream_pool: StreamPool[Any],
        front: FastFront,
        launchers: dict[Kernel, Any],
        launcher_type: type,
    ) -> None:
        self._lanes = lanes
        self._n_lanes = len(lanes)
        self._cursor = 0  # where placement starts looking (round robin among ties)
        self._rings = [Ring(block) for block in rings]
        self._watches = watches
        self._context = drv.CUcontext(watches.context) if watches.context else None  # current
        self._idle_events: list[Any] = events.idle
        self._take_event: Callable[[], Any] = events.take
        self._pool = stream_pool
        self._door = front.door
        self._life = front.lifecycle
        self._dispatcher = front.dispatcher
        self._store = front.store
        self._ids = front.ids
        self._launchers = launchers
        self._launcher_type = launcher_type
        self._kernels: dict[Kernel, KnownKernel] = {}  # then counts flush() adds to telemetry
        self.dispatches = self.completed = self.failed = 0
        self.bytes_up = self.bytes_down = self.copies_up = self.copies_down = 0
        self._submitted = 0  # dispatches launched since the last flush: none waited in a queue
        self._submit_time: list[float] = []
        self._latency: list[float] = []
        watches.serve_fast(self)

    # -- what it knows ---------------------------------------------------------------------

    def learn(self, plan: Plan, call: BoundCall) -> None:
        """A plan was made from *call*: launch later calls that fit it here, if it can."""
        if eligible(plan, call):
            KnownKernel.of(self._kernels, call.kernel).learn(FastPlan(plan, call))

    def steer(self, call: BoundCall, choice: Any) -> None:
        """Let ``graph="auto"`` calls that fit *call*'s plans follow *choice* (``Choice``): taken
        here while ``choice.eager``, costs told (``took``) while ``choice.sampling``."""
        known = self._kernels.get(call.kernel)
        if known is not None:
            known.steer(call, choice)

    def route(self, call: BoundCall, instances: list[Any], choice: Any, hit: Any) -> bool:
        """Whether this path replays *instances* (the graph cache's graphs of *call*'s
        signature) itself: not here (``routes_replays``); ``FastReplays.route`` takes them."""
        return False

    def replay(
        self,
        graph: Any,
        call: BoundCall,
        buffers: Sequence[Any],
        writes: Sequence[bool],
        choice: Any = None,
        started: float = 0.0,
    ) -> PendingDispatch | None:
        """A graph's replay launched by this path: never here (``routes_replays``), where
        ``FastReplays.replay`` launches them; ``None``."""
        return None

    def close(self) -> list[PinnedBlock]:
        """Forget every kernel; the ring blocks to give back to the pinned pool."""
        self._kernels.clear()
        blocks = [ring.block for ring in self._rings]
        self._rings.clear()
        return blocks

    # -- the dispatch --------------------------------------------------------------------------

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
        """Launch the call if it is the steady state; ``None`` (having changed nothing) if not."""
        t0 = perf_counter()
        known = self._kernels.get(kernel)
        if known is None or timing is not False:
            return None
        if known.launcher is None:  # loaded since it was learned, perhaps
            launcher = self._launchers.get(kernel)
            if type(launcher) is not self._launcher_type:
                return None
            known.launcher = launcher
        auto = graph is not _NEVER and graph != _NEVER
        if auto and (graph != _AUTO or not known.steered):
            return None  # graphs are asked for: the general path has them
        watches, door = self._watches, self._door
        loop = steady_loop(self._life, watches, door)
        if loop is None:
            return None
        plan = fitting(known.plans, args, grid, block, shared_mem)  # C: _fits
        if plan is None:
            return None
        choice: Any = None
        if auto:
            choice = plan.auto
            if choice is None or not choice.eager:
                return None  # "auto" replays graphs here, or has not chosen yet
        # Resident buffers: live, and every unfinished use of them on one lane (or none).
        lane: Any = None
        buffers: list[ResidentBuffer] = []
        if plan.residents:
            for index, _write, into in plan.residents:
                held: Any = args[index]
                buffers.append(held.into if into else held)  # an Out's, or the buffer
            lane = lane_after(self._store, buffers, plan.writes)
            if lane is False:
                return None
        placed = lane is None
        if placed:
            lane = least_busy(self._lanes, self._cursor)
            if lane is None:
                return None  # every lane leased
        # Room in the lane's staging ring.
        staged = plan.staged
        ring = self._rings[lane.index]
        start_at = ring.head
        at = 0
        if staged:
            at = start_at % RING_BYTES
            if at + staged > RING_BYTES:
                start_at += RING_BYTES - at
                at = 0
            if start_at + staged - ring.tail > RING_BYTES:
                return None  # the ring is full: the general path stages in the pinned pool
        # -- from here on, the dispatch happens: all of it, or nothing if a step raises ------
        job = FastJob(plan, args, lane, t0)
        if choice is not None and choice.sampling:
            job.choice = choice  # "auto" measures it
        job.id = dispatch_id = next(self._ids)
        job.pending = pending = PendingDispatch(loop, dispatch_id, plan.name, watches.spin)
        job.buffers = buffers
        admit(door, self._pool, job, placed, plan.writes)
        if placed:
            self._cursor = (self._cursor + 1) % self._n_lanes
        if staged:
            ring.head = job.ring_end = start_at + staged
            job.ring_start = start_at
        self.dispatches += 1
        own = self._context  # the backend's, current for the driver calls (``_context``)
        pushed = own is not None and _current()[1] != own and _push(own)[0] == SUCCESS
        try:
            self._enqueue(job, plan, known.launcher, args, lane, ring, at)
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
        watches.seq = job.seq = watches.seq + 1
        if plan.expected:
            job.expect = t0 + plan.expected
        watches.lanes[lane.index].pending.append(job)
        watches.pending += 1
        if not watches.poll_scheduled:
            watches.request_poll()
        self._submitted += 1  # the whole call was its submission: it waited in no queue
        self._submit_time.append(perf_counter() - t0)
        return pending

    def _enqueue(
        self,
        job: FastJob,
        plan: FastPlan,
        launcher: Any,
        args: tuple[object, ...],
        lane: FastLane,
        ring: Ring,
        at: int,
    ) -> None:
        """Stage *args* at offset *at* of *ring* and enqueue the copies, the zeroing of the
        outputs, the kernel and the download on *lane*. A driver call that fails is kept as the
        job's failure: its completion reports it."""
        view, host, handle, base = ring.view, ring.ptr + at, lane.handle, lane.scratch_ptr
        code: Any = SUCCESS
        call = "cuMemcpyHtoDAsync"
        for index, offset, nbytes, in_out in plan.uploads:
            value: Any = args[index]
            array = value.array if in_out else value
            view[at + offset : at + offset + nbytes] = array.reshape(-1).view(np.uint8)
        up_copy = plan.up_copy
        if up_copy:
            if up_copy > plan.up_end:  # small outputs go up zeroed with the inputs
                view[at + plan.up_end : at + up_copy] = 0
            code = _up(base, host, up_copy, handle)[0]
            if code == SUCCESS:
                self.bytes_up += up_copy
                self.copies_up += 1
        total = plan.total
        if code == SUCCESS and total > up_copy:
            call = "cuMemsetD8Async"
            code = _memset(base + up_copy, 0, total - up_copy, handle)[0]
        values: list[Any] = [None] * plan.n_args
        if code == SUCCESS:
            kinds = plan.args
            for i, value in enumerate(args):
                kind_code = kinds[i][0]
                if kind_code == K_SCALAR:
                    values[i] = value
                elif kind_code <= K_OUT:
                    values[i] = base + kinds[i][5]
                elif kind_code == K_RESIDENT:
                    values[i] = int(storage_of(value).handle)
                else:  # K_INTO: zeroed first
                    out: Any = value
                    pointer = int(storage_of(out.into).handle)
                    if code == SUCCESS:
                        code = _memset(pointer, 0, out.nbytes, handle)[0]
                    values[i] = pointer
        if code == SUCCESS:  # Launcher.launch_values, inline (one call fewer), as in C
            call = "cuLaunchKernel"
            for view, value in zip(launcher.slot_views, values, strict=True):
                view[0] = value
            f, p, g, b = launcher.function, launcher.kernel_params, plan.grid_dims, plan.block_dims
            code = _launch(f, g[0], g[1], g[2], b[0], b[1], b[2], plan.shared_mem, handle, p, 0)[0]
        in_end = plan.in_end
        if code == SUCCESS and total > in_end:
            call = "cuMemcpyDtoHAsync"
            down = total - in_end
            code = _down(host + in_end, base + in_end, down, handle)[0]
            if code == SUCCESS:
                self.bytes_down += down
                self.copies_down += 1
        if code != SUCCESS:
            job.failure = (
                AllocationError(f"{call} failed: device out of memory")
                if code == _OOM
                else error_for(code, call)
            )

    def _not_watched(self, job: FastJob, error: BaseException) -> None:
        """The job's event could not be recorded, and what it enqueued may still run: wait for
        its lane (``Lane.settle``), then free its ring region (the newest) unless the device
        failed, and finish the job with *error* the general way."""
        if job.lane.settle() and job.ring_end:
            self._rings[job.lane.index].head = job.ring_start
        job.lane.slot.outstanding -= 1
        job.gpu_done = True
        self._dispatcher.done(job, error, None)  # type: ignore[arg-type]  # a job of this path

    def complete(self, job: FastJob, error: BaseException | None) -> None:
        """*job*'s event completed (or the device failed with *error*): its results, and every
        release; the reactor calls it (``Watches.call``)."""
        # Later uses no longer wait on its event (dep_event reads gpu_done first), which the
        # reactor recycled; the job keeps it as its watch's, for a waiter that still holds it.
        job.gpu_done = True
        plan = job.plan
        failure = job.failure
        if job.choice is not None and error is None and failure is None:
            job.choice.took(True, perf_counter() - job.t_dispatch)  # "auto" measures it
        if failure is not None:
            error = failure
        outcome: Any
        if error is not None:
            outcome = error
        elif plan.returned:
            try:
                outcome = self._results(job)
            except Exception as exc:
                outcome = exc  # whatever went wrong fails this dispatch, visibly
        else:
            outcome = ()
        if job.ring_end:
            ring = self._rings[job.lane.index]
            if job.ring_end > ring.tail:
                ring.tail = job.ring_end
        job.lane.slot.outstanding -= 1
        if not resolved_here(self._life, self._door, self._dispatcher, job, outcome):
            return  # something waits for its slot, or for the backend to drain: the general way
        self._latency.append((now := perf_counter()) - job.t_dispatch)
        if error is None:
            self.completed += 1
            # The plan's time: learned(), inline; from when a waiter saw it end, if one did.
            took, known = (job.seen or now) - job.t_dispatch, plan.expected
            plan.expected = known + EXPECT_RISE * (took - known) if 0 < known <= took else took
        else:
            self.failed += 1

    def _results(self, job: FastJob) -> tuple[Any, ...]:
        """*job*'s results: arrays copied out of its ring region, its ``Out(into=)`` buffers."""
        view, at = self._rings[job.lane.index].view, job.ring_start % RING_BYTES
        results = []
        for kind_code, index, offset, nbytes, dtype, shape in job.plan.returned:
            if kind_code <= K_OUT:  # staged: an InOut's array, or an Out's
                start = at + offset
                results.append(view[start : start + nbytes].view(dtype).reshape(shape).copy())
            else:  # K_INTO
                results.append(job.args[index].into)  # an Out
        return tuple(results)

    def flush(self, telemetry: Telemetry) -> None:
        """Add what this path counted since the last flush into *telemetry*."""
        telemetry.dispatches += self.dispatches
        telemetry.fast_path_dispatches += self.dispatches
        telemetry.dispatches_completed += self.completed
        telemetry.dispatches_failed += self.failed
        telemetry.bytes_up += self.bytes_up
        telemetry.bytes_down += self.bytes_down
        telemetry.copies_up += self.copies_up
        telemetry.copies_down += self.copies_down
        self.dispatches = self.completed = self.failed = 0
        self.bytes_up = self.bytes_down = self.copies_up = self.copies_down = 0
        for values, histogram in (
            ([0.0] * self._submitted, telemetry.queue_wait),  # none waited in a queue
            (self._submit_time, telemetry.submit_time),
            (self._latency, telemetry.completion_latency),
        ):
            if values:
                histogram.record_all(values)
                values.clear()
        self._submitted = 0
