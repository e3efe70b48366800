"""The CUDA engine: the collaborators of one device, composed behind the front's contract.

It answers the scheduler's questions and routes each job to the path that runs it: small
(``_staged``), streamed (``_streamed``) or a graph replay. It completes nothing itself: the paths
report to the front's :class:`~asyncgraph._front._engine_protocols.Sink`. It is an
``Engine[CudaJob]``: every job it makes, and so every job the front hands back to it, is a
:class:`~asyncgraph._cuda.lanes._staging_plan.CudaJob`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from cuda.bindings import driver as drv

from asyncgraph._cuda.core._choose import core
from asyncgraph._cuda.core._fast_plan import RING_BYTES
from asyncgraph._cuda.driver._context import in_context
from asyncgraph._cuda.driver._driver import check
from asyncgraph._cuda.lanes._staging_plan import BIG_COPY, CudaJob, dep_event, plan
from asyncgraph._cuda.launch._kernel_launch import Launches
from asyncgraph._cuda.launch._kernel_loading import Kernels
from asyncgraph._cuda.launch._staged import SmallPath
from asyncgraph._cuda.launch._streamed import StreamedPath
from asyncgraph._cuda.memory._peer_copies import route
from asyncgraph._cuda.memory._storage import Storage
from asyncgraph._front._lease import StreamLease, end_lease
from asyncgraph._jobs._scheduler import Job, JobState
from asyncgraph._runtime import _loop
from asyncgraph._runtime._exceptions import BackendClosedError, DeviceFaultError
from asyncgraph.pool import PinnedPool
from asyncgraph.pool._pinned import abandon_block, allocate_staging, free_staging

from ._cuda_graphs import Graphs
from .device._cuda_device import Device, join

if TYPE_CHECKING:
    from asyncgraph._args._bound_args import BoundCall
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._buffers._resident import ResidentBuffer, Use
    from asyncgraph._front._engine_protocols import Engine, FastDispatch, FastFront, Links
    from asyncgraph._front._options import BackendOptions
    from asyncgraph._jobs._pending import PendingDispatch
    from asyncgraph._runtime._telemetry import PoolCounters

__all__ = ("LEFT_BEHIND", "CudaEngine")

# The fast path: the compiled core's; the Python core runs the general path alone.
_FAST_PATH: Any = cast(Any, core).FastPath if core.COMPILED else None

# Seconds a close of a failed backend waits for its waiter threads: one may wait in the driver
# for a kernel that never finishes, and must not hold the close, or the process's exit.
LEFT_BEHIND = 1.0


class CudaEngine:
    """Runs dispatches on one CUDA device (``open_backend("cuda:N")``).

    It implements :class:`~asyncgraph._front._engine_protocols.Engine` for its jobs,
    ``Engine[CudaJob]``: a method that says "see" the contract's does what the contract says,
    with resident storage in device memory. It is made with its
    :class:`~asyncgraph._front._engine_protocols.Links` (what its device, paths and graphs report
    to, count into and log with).
    """

    kind = "cuda"
    takes_device_arrays = True

    def __init__(self, ordinal: int, options: BackendOptions, links: Links) -> None:
        # Set up in the device's primary context (``Device`` makes it current); the thread gets
        # back the context it had (``_context``).
        code, before = drv.cuCtxGetCurrent()
        check((code,), "cuCtxGetCurrent")
        try:
            self._set_up(ordinal, options, links)
        finally:
            drv.cuCtxSetCurrent(before)

    def _set_up(self, ordinal: int, options: BackendOptions, links: Links) -> None:
        # The device holds what its collaborators report to and count into (*links*).
        self.name = f"cuda:{ordinal}"
        self._sink = links.sink
        device = self.device = Device(ordinal, options, links)
        self.limits = device.limits
        self.launches = Launches(device)
        self._loaded = self.launches.loaded  # the scheduler's hot question reads it directly
        self.kernels = Kernels(device, self.launches)
        self.small = SmallPath(device, self.launches)
        self.streamed = StreamedPath(device, self.launches, self.small)
        self.storage = Storage(device)
        self.fast: Any = None  # the dispatch core's FastPath, once the front asked for it
        self.graphs = Graphs(device, self.launches, self.kernels, self.storage, links)
        links.log.debug(
            "backend.opened",
            kind=self.kind,
            name=device.name,
            arch=device.arch,
            streams=options.streams,
        )

    @property
    def failure(self) -> DeviceFaultError | None:
        """See :attr:`Engine.failure`."""
        return self.device.failure

    @in_context
    def fast_path(self, front: FastFront) -> FastDispatch | None:
        """The dispatch core's fast path over this device (``None`` on the Python core, when
        turned off, with NVTX ranges or per-dispatch log events, which it does not make, or
        without pinned memory for the lanes' staging rings)."""
        device = self.device
        options = device.options
        if _FAST_PATH is None or not options.fast_path_enabled:
            return None
        if options.nvtx_enabled or options.dispatch_events_enabled:
            return None
        # Each lane's staging ring is its own pinned allocation, held while the backend is open
        # (like the lanes' device scratch), not a block of the pinned pool's.
        rings: list[Any] = []
        try:
            for _ in device.lanes:
                rings.append(allocate_staging(RING_BYTES))
        except Exception as exc:  # out of pinned memory, or a driver that refuses
            for block in rings:
                free_staging(block)
            device.log.warning("backend.no_fast_path", error=str(exc))
            return None
        fast = self.fast = _FAST_PATH(
            device.lanes,
            rings,
            device.watches,
            device.events,
            device.stream_pool,
            front,
            self.launches.launchers,
            core.Launcher,
        )
        device.telemetry.add_source(fast.flush)
        device.stream_pool.count_placements(lambda: fast.placements)  # it places its own
        self.graphs.serve(fast)  # replays, routes and steering through it
        dispatch: FastDispatch = fast  # the compiled core's FastPath (untyped, to mypy)
        return dispatch

    # -- the scheduler's predicates ----------------------------------------------------------------

    def needs_compile(self, job: CudaJob) -> bool:
        """Whether *job*'s kernel is not loaded yet (graph replays never compile)."""
        return job.replay is None and job.call.kernel not in self._loaded

    def needs_staging(self, job: CudaJob) -> bool:
        """See :meth:`Engine.needs_staging`: inputs of ``BIG_COPY`` bytes or more."""
        # Inputs of BIG_COPY bytes or more are copied in threads (SmallPath.stage).
        return (
            job.up_end >= BIG_COPY
            and not job.staged
            and job.direct is None
            and not job.streamed
            and job.replay is None
        )

    def is_ready(self, job: CudaJob) -> bool:
        """Whether each use *job* depends on has an event to wait on, or finished (a streamed
        job waits for its dependencies in its own task)."""
        if not job.deps or job.streamed:
            return True
        return all(dep_event(dep) is not False for dep in job.deps)

    # -- jobs --------------------------------------------------------------------------------------

    def check_kernel(self, kernel: Kernel) -> None:
        """Any kernel with source can run here."""

    @in_context
    def prepare(self, call: BoundCall, timing: bool) -> CudaJob:
        """Plan *call*: layout, streaming, direct inputs, foreign arrays."""
        return plan(call, timing, self.device.pinned, self.graphs.stream_above)

    @in_context
    def graph_job(
        self, call: BoundCall, always: bool, started: float, inline: bool
    ) -> CudaJob | PendingDispatch | None:
        """A replay from the graph cache (launched already where *inline*: its pending result),
        an eager job ``graph="auto"`` measures, or ``None``."""
        job: CudaJob | PendingDispatch | None = self.graphs.cache.job_for(
            call, always, started, inline
        )
        return job

    @in_context
    async def compile(self, kernel: Kernel) -> None:
        """Compile and load *kernel* now.

        Raises:
            CompileError: NVRTC failed; the error carries its log.
        """
        if self.launches.is_loaded(kernel):
            await _loop.sleep(0)
            return
        await self.kernels.load(kernel)

    @in_context
    def start_compile(self, job: CudaJob) -> None:
        """Compile *job*'s kernel in a task; the sink hears when it is loaded."""
        self.kernels.start(job.call.kernel, self._sink)

    @in_context
    def stage(self, job: CudaJob) -> None:
        """Stage *job*'s big inputs in threads."""
        self.small.stage(job)

    @in_context
    def launch(self, job: CudaJob) -> None:
        """Launch *job* on the lane of the uses it depends on when they all run on one, else on
        the least busy lane (a streamed job: in a task of its own).

        Raises:
            DeviceFaultError: the device failed earlier. CudaError: a driver call failed.
        """
        device = self.device
        if device.failure is not None:
            self.small.release(job)
            raise device.failure
        if job.streamed:
            self.streamed.launch(job)
            return
        lane = device.lane_for(job)  # after uses on one lane of its class: that lane
        if job.replay is not None:
            self.small.launch_replay(job, lane)
        else:
            self.small.launch(job, lane)

    @in_context
    def release(self, job: CudaJob) -> None:
        """See :meth:`Engine.release`."""
        self.small.release(job)

    # -- resident storage --------------------------------------------------------------------------

    @in_context
    async def upload_storage(self, array: np.ndarray[Any, Any]) -> Any:
        """See :meth:`Engine.upload_storage`."""
        return await self.storage.upload(array)

    @in_context
    def alloc_storage(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """See :meth:`Engine.alloc_storage`."""
        return self.storage.alloc(shape, dtype)

    @in_context
    async def download_storage(
        self,
        buffer: ResidentBuffer,
        use: Use,
        deps: list[Use],
        out: np.ndarray[Any, Any] | None,
    ) -> np.ndarray[Any, Any]:
        """See :meth:`Engine.download_storage`."""
        return await self.storage.download(buffer, use, deps, out)

    def copies_from(self, other: Any) -> bool:
        """Device storage of any CUDA engine: copied on the devices."""
        return isinstance(other, CudaEngine)

    @in_context
    def copy_route(self, source: Any) -> str:
        """``"device"`` within one context, else ``"peer"`` or ``"staged"`` (``_peer_copies``)."""
        return route(self.device, source.device)

    @in_context
    def copy_in(
        self, buffer: ResidentBuffer, use: Use, deps: list[Use], source: Any
    ) -> Awaitable[Any]:
        """New device storage holding a copy of *buffer* (of *source*, a CUDA engine), copied
        on this device after the writers in *deps*: enqueued here, with the context current,
        when the writers are (the awaitable is its future)."""
        return self.storage.copy_in(buffer, use, deps, source.device)

    @in_context
    def free_storage(self, storage: Any) -> None:
        """See :meth:`Engine.free_storage`."""
        self.storage.free(storage)

    def storage_pointer(self, storage: Any) -> int:
        """See :meth:`Engine.storage_pointer`."""
        return int(storage.handle)

    @in_context
    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """A numpy array in pinned memory."""
        return self.small.host_array(shape, dtype)

    # -- interop, streams, graphs ------------------------------------------------------------------

    def export_device(self) -> tuple[int, int]:
        """See :meth:`Engine.export_device`."""
        return self.storage.export_device()

    @in_context
    def export_wait(self, buffer: ResidentBuffer, stream: int | None) -> None:
        """See :meth:`Engine.export_wait`."""
        self.storage.export_wait(buffer, stream)

    def export_stream(self, buffer: ResidentBuffer) -> int | None:
        """See :meth:`Engine.export_stream`."""
        return self.storage.export_stream(buffer)

    def stream(self) -> AbstractAsyncContextManager[StreamLease]:
        """See :meth:`Engine.stream`."""
        return self.device.ctx.manager(self._lease())

    @contextlib.asynccontextmanager
    async def _lease(self) -> AsyncIterator[StreamLease]:
        device = self.device
        slot = await device.stream_pool.lease()
        lease = StreamLease(self.name, slot, self.synchronize_lane)
        device.lease_started()
        try:
            yield lease
        finally:
            end_lease(lease)
            device.stream_pool.give_back(slot)
            device.lease_ended()

    @in_context
    async def synchronize_lane(self, slot: Any) -> None:
        """Wait for the work enqueued on a leased stream so far (``lease.synchronize()``).

        Raises:
            DeviceFaultError: the work faulted, or the device failed earlier.
        """
        device = self.device
        device.check_healthy()
        lane = device.lanes[slot.index]
        event = lane.record()
        await lane.future(event, lambda _error, _cancelled: None)

    def wait_foreign(self, work: object) -> asyncio.Future[None]:
        """``backend.wait()``: a future for another library's stream or event."""
        return self.device.foreign.wait(work)

    def fence(self, job: CudaJob, after: object) -> None:
        """``dispatch(after=)``: events *job*'s stream waits for before it runs."""
        job.fences = self.device.foreign.fences(after)

    def order_foreign(self, stream: object, job: Job | None) -> bool:
        """``backend.order()``: *stream* waits for *job* on the device."""
        return self.device.foreign.order(stream, job)

    @in_context
    async def record(
        self,
        kernel: Kernel,
        args: tuple[object, ...],
        grid: object,
        block: object,
        shared_mem: object,
    ) -> Any:
        """See :meth:`Engine.record`."""
        return await self.graphs.record(kernel, args, grid, block, shared_mem)

    def capture(self, mode: object, into: object) -> AbstractAsyncContextManager[Any]:
        """Capture dispatches into a graph (a new one, or *into*)."""
        return self.device.ctx.manager(self.graphs.capture(mode, into))

    def pool_counters(self) -> PoolCounters:
        """See :meth:`Engine.pool_counters`."""
        return self.device.pool_counters()

    # -- closing -----------------------------------------------------------------------------------

    @in_context
    async def settle_after(self, ended: asyncio.AbstractEventLoop, jobs: list[Job]) -> None:
        """The loop ended with *jobs* in flight: wait for the device, settle the watched events
        on this loop, and fail the jobs the ended loop's callbacks carried (streamed transfers,
        result copies); the front fails those that had not launched. Of *jobs*, the fast
        path's own records (no ``CudaJob``) carry nothing: they settle with the watched events."""
        device = self.device
        # Tasks, leases and compilations of the ended loop never go on.
        self.streamed.tasks.clear()
        self.kernels.tasks.clear()
        device.leases = 0
        carried = [
            job
            for job in jobs
            if isinstance(job, CudaJob) and (job.streamed or job.state is JobState.COLLECTING)
        ]
        threads = device.close_reactor()
        await device.loop.run_in_executor(None, device.synchronize, threads)
        if device.reactor_ is not None:
            device.reactor_.adopt(device.loop)
        for job in carried:
            if job.state is JobState.DONE:
                continue  # completed meanwhile
            if job.device_buffer is not None:
                with contextlib.suppress(Exception):
                    device.memory.free(job.device_buffer, device.alloc_stream)
                job.device_buffer = None
            self.small.release(job)
            self._sink.done(
                job,
                BackendClosedError(
                    f"backend {self.name} was left open when its event loop ended, before "
                    f"dispatch #{job.id} of {job.call.kernel.name!r} completed"
                ),
                None,
            )

    @in_context
    async def shutdown(self) -> None:
        """See :meth:`Engine.shutdown`."""
        device = self.device
        self.graphs.close_all()
        await device.wait_leases()  # foreign work may still be enqueued on leased streams
        for task in [*self.streamed.tasks, *self.kernels.tasks]:
            await _loop.wait_done(task)
        threads = device.close_reactor()
        if threads:
            # After a failure a waiter may wait in the driver for work that never finishes:
            # it is not waited for past LEFT_BEHIND seconds.
            bound = None if device.failure is None else LEFT_BEHIND
            left = await device.loop.run_in_executor(None, join, threads, bound)
            if left:
                device.log.warning("backend.waiters_left", threads=left, waited=bound)
        self._release_all()
        # Return with the pinned memory (the pool's and the staging rings) released: a free still
        # running in the background would wait for other backends' kernels and hold up their calls.
        await _loop.wrap_future(PinnedPool.wait_freed())

    @in_context
    def shutdown_now(self) -> None:
        """See :meth:`Engine.shutdown_now`."""
        device = self.device
        self.graphs.close_all()
        join(device.close_reactor())
        self._release_all()
        PinnedPool.wait_freed().result()

    def _release_all(self) -> None:
        device = self.device
        fast, self.fast = self.fast, None
        self.graphs.serve(None)
        if fast is not None:
            for block in fast.close():  # the staging rings, idle now
                if device.failure is None:
                    free_staging(block)
                else:  # their frees would fail: let go of them (``pool._abandon``)
                    device.abandoned[1] += abandon_block(block)
        device.release_all([self.graphs.capture_stream])
        self.launches.clear()

    @in_context
    def release_unclosed(self) -> None:
        """See :meth:`Engine.release_unclosed`."""
        self.device.close_reactor()
        self.device.pinned.close()


if TYPE_CHECKING:
    # The contract, held by mypy for the engine's own jobs (the front holds an Engine[Any]).
    _CONTRACT: type[Engine[CudaJob]] = CudaEngine
