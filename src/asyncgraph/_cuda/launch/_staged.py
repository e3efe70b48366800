"""Dispatches staged through one pinned block: launch, results, and releasing a job.

A small dispatch copies its inputs into a pinned block (or goes up straight from pinned
inputs), then enqueues on one lane: the upload, the outputs' memset (or their zeros in the
upload, where they are small: ``_bound_args.upload_bytes``), the kernel, the download, and an
event. Small ones (at most ``SCRATCH_BYTES`` of device memory) use their lane's scratch buffer
instead of a fresh allocation: every use of it is ordered on that one stream. That saves
the stream-ordered allocation and free (about 10 µs of host time per dispatch through
``cuda.core``, measured on an NVIDIA H100 80GB HBM3).

Each plan (``BoundCall.plan``: one signature of a kernel) and each graph replayed here has its
time from launch to completion learned (``_watches.learned``), and its watch says when its
work is expected to end, as the fast path's do: a lone awaited dispatch then spins where its
work ends soon, a longer one goes to its lane's waiter, which wakes the loop shortly before its
expected end (``_watches``, ``POKE_MARGIN``), so that the loop is awake when the work ends. A
replay's task spins until its own expected end (``OWN_END``), as on the fast path.

The pinned block goes back to its pool only once the event that follows the last copy
completed. Outputs of at least ``PINNED_RESULTS`` bytes are downloaded into pinned memory that
the result arrays then own (no copy out of staging), while less than the pinned budget is lent.
"""

from __future__ import annotations

import functools
import math
from concurrent.futures import Future
from time import perf_counter
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import numpy as np
from cuda.bindings import driver as drv

from asyncgraph._args._bound_args import as_bytes, upload_bytes
from asyncgraph._cuda.core._watches import OWN_END, learned
from asyncgraph._cuda.driver._driver import check
from asyncgraph._jobs._pending import set_spin
from asyncgraph.pool import PinnedBlock, PinnedMemory

from ..lanes._lanes import SCRATCH_BYTES, Lane
from ..lanes._staging_plan import BIG_COPY, CudaJob, copy_into
from ..lanes._stream_order import wait_deps

if TYPE_CHECKING:
    from asyncgraph._cuda.device._cuda_device import Device
    from asyncgraph._front._engine_protocols import Sink
    from asyncgraph._runtime._exceptions import CudaError

    from ._kernel_launch import Launches

__all__ = ("PINNED_RESULTS", "SmallPath")

PINNED_RESULTS = 1 << 20


class SmallPath:
    """Launch and collect dispatches staged in one pinned block, and graph replays."""

    def __init__(self, device: Device, launches: Launches) -> None:
        self._device = device
        self._launches = launches
        self._sink: Sink = device.sink
        self.lent = 0  # bytes of pinned blocks lent to numpy arrays
        self._lend_limit = device.options.pinned_pool_bytes
        # Seconds from launch to completion of each plan and graph run here, learned (a cell
        # each, updated in place); weak: a plan the plan cache let go of, or a closed graph,
        # leaves it.
        self._took: WeakKeyDictionary[Any, list[float]] = WeakKeyDictionary()

    # -- before the launch -----------------------------------------------------------------------

    def _claim_result_memory(self, job: CudaJob) -> None:
        """Give big outputs pinned memory of their own, which the result arrays will own."""
        if not job.total or job.staged or job.out_block is not None:
            return
        out_bytes = job.total - job.in_end
        if out_bytes < PINNED_RESULTS or self.lent + out_bytes > self._lend_limit:
            return
        job.out_block = self._device.pinned.acquire(out_bytes)
        self.lent += job.out_block.size
        # Staging then holds the inputs only, or nothing when they go up straight from pinned.
        job.stage_hi = job.stage_lo if job.direct is not None else job.up_end

    def stage(self, job: CudaJob) -> None:
        """Copy large inputs into pinned memory in threads; report ``staged``."""
        sink = self._sink
        try:
            self._claim_result_memory(job)
            block = job.block = self._device.pinned.acquire(job.stage_hi)
        except Exception as exc:
            self.release(job)
            sink.staged(job, exc)
            return

        def stage() -> None:
            view = block.array
            for arg in job.call.args:
                if arg.uploads:
                    off = arg.offset
                    copy_into(view[off : off + arg.nbytes], as_bytes(arg.value))

        def staged(future: Any) -> None:
            error = future.exception()
            if error is not None:
                self.release(job)
            else:
                job.staged = True
            sink.staged(job, error)

        sink.loop.run_in_executor(None, stage).add_done_callback(self._device.ctx.wrap(staged))

    # -- the launch --------------------------------------------------------------------------------

    def launch(self, job: CudaJob, lane: Lane) -> None:
        """Enqueue *job* on *lane* and watch its event.

        Raises:
            CudaError: a driver call failed; what the job took is released (after the copies
                already enqueued, if any).
        """
        device = self._device
        call = job.call
        lane.take()
        job.lane = lane
        stream = lane.stream
        handle = lane.handle
        telemetry = device.telemetry
        enqueued = False
        block = None
        try:
            self._claim_result_memory(job)
            if job.deps:
                wait_deps(job.deps, lane)
            if job.fences:
                device.foreign.wait_fences(job.fences, lane)
            base = 0
            if job.total:
                if job.stage_hi > job.stage_lo:
                    if job.block is None:
                        job.block = device.pinned.acquire(job.stage_hi - job.stage_lo)
                    block = job.block
                if not job.staged and job.direct is None and block is not None:
                    view = block.array
                    for arg in call.args:
                        if arg.uploads:
                            value = arg.value
                            off = arg.offset
                            view[off : off + value.nbytes] = as_bytes(value)
                if job.total <= SCRATCH_BYTES:
                    base = lane.scratch_ptr
                else:
                    job.device_buffer = device.memory.allocate(job.total, stream)
                    base = int(job.device_buffer.handle)
                enqueued = True
                up = job.up_end
                if job.direct is None and block is not None and job.out_block is None:
                    # The block mirrors [0, total): small outputs go up zeroed with the inputs.
                    up = upload_bytes(up, job.total)
                    if up > job.up_end:
                        block.array[job.up_end : up] = 0
                if up:
                    self._upload(job, block, base, handle, up)
                if job.total > up:
                    check(
                        drv.cuMemsetD8Async(base + up, 0, job.total - up, handle),
                        "cuMemsetD8Async",
                    )
            self._launches.enqueue(job, base, handle, stream)
            enqueued = True
            if job.total > job.in_end:
                down = job.total - job.in_end
                if job.out_block is not None:
                    target = job.out_block.ptr
                else:
                    target = block.ptr + job.in_end - job.stage_lo  # type: ignore[union-attr]  # outputs are staged
                check(
                    drv.cuMemcpyDtoHAsync(target, base + job.in_end, down, handle),
                    "cuMemcpyDtoHAsync",
                )
                telemetry.bytes_down += down
                telemetry.copies_down += 1
        except Exception as exc:
            failure: Exception | None = exc
        else:
            failure = None
        finally:
            if job.device_buffer is not None:
                device.memory.free(job.device_buffer, stream)
                job.device_buffer = None
        if failure is not None:
            if enqueued:
                # Copies may be in flight: release the staging only once they are done.
                try:
                    lane.record_and_watch(lambda _error: self.release(job))
                except Exception:
                    self._release_settled(job, lane)
            else:
                self.release(job)
            raise failure
        self._watch(job, lane)

    def _upload(
        self, job: CudaJob, block: PinnedBlock | None, base: int, handle: Any, up: int
    ) -> None:
        """Enqueue the upload of the first *up* bytes of the layout (the inputs, and with them
        the zeroed outputs where ``upload_bytes`` says so)."""
        telemetry = self._device.telemetry
        if job.direct is not None:
            for ptr, off, nbytes in job.direct:
                check(
                    drv.cuMemcpyHtoDAsync(base + off, ptr, nbytes, handle),
                    "cuMemcpyHtoDAsync",
                )
            telemetry.copies_up += len(job.direct)
        else:
            check(
                drv.cuMemcpyHtoDAsync(base, block.ptr, up, handle),  # type: ignore[union-attr]  # inputs are staged
                "cuMemcpyHtoDAsync",
            )
            telemetry.copies_up += 1
        telemetry.bytes_up += up

    def launch_replay(self, job: CudaJob, lane: Lane) -> None:
        """Launch the graph *job* replays (its inputs are in place) and watch its event."""
        lane.take()
        job.lane = lane
        try:
            if job.deps:
                wait_deps(job.deps, lane)
            if job.fences:
                self._device.foreign.wait_fences(job.fences, lane)
            job.replay.launch_on(lane.handle)
        except Exception:
            self.release(job)
            raise
        self._watch(job, lane)

    def _watch(self, job: CudaJob, lane: Lane) -> None:
        try:
            job.event = lane.record()
        except Exception:
            self._release_settled(job, lane)
            raise
        device = self._device
        reactor = device.reactor_ or device.reactor
        key = job.replay if job.replay is not None else job.call.plan
        took = None  # the plan's or graph's time, learned: a cell, updated in place
        if key is not None:
            took = self._took.get(key)
            if took is None:
                took = self._took[key] = [0.0]
        launched = perf_counter()
        watch: Any = None  # the reactor's, once it watches (a failed device finishes at once)

        def done(error: CudaError | None) -> None:
            if error is None and took is not None:  # its time, from when a waiter saw it end
                seen = watch.seen if watch is not None else 0.0
                took[0] = learned(took[0], (seen or perf_counter()) - launched)
            self._done(job, error)

        expect = launched + took[0] if took is not None and took[0] else 0.0
        watch = reactor.watch(lane.index, job.event, done, expect)
        if job.replay is None:
            set_spin(job.pending, reactor.spin)
        else:  # until the replay's own expected end, as the fast path's replays
            set_spin(job.pending, functools.partial(reactor.spin, OWN_END))

    def _release_settled(self, job: CudaJob, lane: Lane) -> None:
        """No event could be recorded after *job*'s enqueued work: it is in flight until the
        stream is known done. Wait for it (``Lane.settle``), then release what the job holds;
        if the stream cannot be waited for (the device failed), keep its staging, which the
        work may still write, and give back the rest."""
        if not lane.settle():
            if job.out_block is not None:
                self.lent -= job.out_block.size
            job.block = job.out_block = None  # let go of: never reused
        self.release(job)

    # -- completion --------------------------------------------------------------------------------

    def _done(self, job: CudaJob, error: CudaError | None) -> None:
        # The reactor recycled the event: nothing may wait on it any more.
        job.gpu_done = True
        job.event = None
        choice = job.choice
        if choice is not None:  # graph="auto" measures it: from its dispatch() to now
            took, eager = perf_counter() - job.started, job.replay is None
        try:
            self._finish(job, error)
        except Exception as exc:
            # Whatever went wrong while collecting results fails this dispatch, visibly.
            self.release(job)
            self._sink.done(job, exc, None)
        if choice is not None and error is None:
            choice.took(eager, took)

    def _finish(self, job: CudaJob, error: CudaError | None) -> None:
        outcome: Any
        device_time = None
        if error is not None:
            outcome = error
        elif job.replay is not None:
            outcome = job.replay.results(job.call)
        elif not job.call.n_results:
            outcome = ()
        elif job.total - job.in_end >= BIG_COPY and job.out_block is None:
            self._results_off_loop(job)
            return
        else:
            outcome = self._results(job)
        if error is None and job.timing:
            ms = check(drv.cuEventElapsedTime(job.start_event, job.end_event), "cuEventElapsedTime")
            device_time = ms / 1e3
        self.release(job)
        self._sink.done(job, outcome, device_time)

    def _results(self, job: CudaJob) -> tuple[Any, ...]:
        """The job's outputs: views of the pinned memory they were downloaded into, or new
        arrays copied out of the staging block (in a worker thread for big copies)."""
        in_end = job.in_end
        if job.out_block is not None:
            lent = self._lend(job.out_block, job.total - in_end).as_array()
            job.out_block = None

            def array_of(arg: Any) -> Any:
                off = arg.offset - in_end
                return arg.view_of(lent[off : off + arg.nbytes])

            return job.call.results(array_of)
        # Out(into=buffer) has a result but nothing staged, and then no block either.
        view = job.block.array if job.block is not None else None
        stage_lo = job.stage_lo

        def copied(arg: Any) -> Any:
            out = arg.empty()
            off = arg.offset - stage_lo
            copy_into(as_bytes(out), view[off : off + arg.nbytes])  # type: ignore[index]  # staged kinds have a block
            return out

        return job.call.results(copied)

    def _results_off_loop(self, job: CudaJob) -> None:
        """Copy large outputs out of pinned memory in threads, then report the job done."""
        sink = self._sink
        sink.collecting(job)

        def finished(future: Any) -> None:
            error = future.exception()
            device_time = None
            if error is None and job.timing:
                ms = drv.cuEventElapsedTime(job.start_event, job.end_event)[1]
                device_time = ms / 1e3
            self.release(job)
            sink.done(job, error if error is not None else future.result(), device_time)

        future: Any
        try:
            future = sink.loop.run_in_executor(None, self._results, job)
        except RuntimeError:  # the loop is closed (Reactor._settle_off_loop): copy right here
            future = Future()
            try:
                future.set_result(self._results(job))
            except Exception as exc:
                future.set_exception(exc)
        future.add_done_callback(self._device.ctx.wrap(finished))

    # -- pinned memory lent to result arrays ---------------------------------------------------

    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """A numpy array in pinned memory lent from the pool (``pinned_empty``)."""
        nbytes = math.prod(shape) * dtype.itemsize
        block = self._device.pinned.acquire(nbytes)
        self.lent += block.size
        memory = self._lend(block, nbytes)
        return memory.as_array().view(dtype).reshape(shape)

    def _lend(self, block: PinnedBlock, nbytes: int) -> PinnedMemory:
        """Wrap *block* for numpy arrays; it comes back to the pool, on the loop's thread,
        once the last of them is garbage-collected. (``lent`` already counts it.)"""
        loop = self._sink.loop
        pool = self._device.pinned

        def give_back(block: PinnedBlock) -> None:
            self.lent -= block.size
            pool.release(block)

        def release(block: PinnedBlock) -> None:
            try:
                loop.call_soon_threadsafe(give_back, block)
            except RuntimeError:  # the loop is closed: nothing else uses the pool any more
                pool.release(block)

        return PinnedMemory(block, nbytes, release, owner=pool)

    # -- releasing -----------------------------------------------------------------------------

    def release(self, job: CudaJob) -> None:
        """Give back what *job* holds: pinned blocks, timing events, fences, its lane, its
        graph."""
        device = self._device
        if job.fences:
            device.foreign.drop(job.fences)
        if job.block is not None:
            device.pinned.release(job.block)
            job.block = None
        if job.out_block is not None:
            self.lent -= job.out_block.size
            device.pinned.release(job.out_block)
            job.out_block = None
        if job.start_event is not None:
            device.timing_events.give(job.start_event)
            job.start_event = None
        if job.end_event is not None:
            device.timing_events.give(job.end_event)
            job.end_event = None
        if job.lane is not None:
            job.lane.give()
            job.lane = None
        replay, job.replay = job.replay, None
        if replay is not None:
            replay.replay_done()
