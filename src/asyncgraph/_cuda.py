"""CudaBackend: kernels on an NVIDIA GPU behind the shared front.

Setup, kernel loading and resident storage live here; the dispatch path (staging, launch,
completion) lives in ``_cuda_dispatch.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

import numpy as np
from cuda.bindings import driver as drv

from . import _loop
from ._args import DEVICE, IN, INOUT, OUT, RESIDENT, RESIDENT_OUT, BoundCall, LaunchLimits
from ._backend import Job
from ._checks import check_kernel
from ._compile import KernelCompiler, load_kernel
from ._cuda_dispatch import CudaDispatch, CudaJob, Launcher, _copy_into, dep_event, layout
from ._cudadrv import SUCCESS, check, error_for, translate
from ._dlpack import KDL_CUDA
from ._events import EventPool
from ._exceptions import (
    AllocationError,
    BackendClosedError,
    CaptureError,
    CompileError,
    CudaError,
    DeviceFaultError,
    DispatchError,
)
from ._kernel import Kernel
from ._lease import StreamLease
from ._options import BackendOptions
from ._reactor import Reactor
from ._resident import ResidentBuffer, Use
from ._telemetry import PoolCounters
from ._transfer import CHUNKED_ABOVE, TRANSFER_CHUNK, ChunkedTransfer
from .capture import (
    CachedGraph,
    CapturedGraph,
    CaptureGuard,
    CaptureLock,
    CaptureMode,
    GraphCache,
    RecordedDispatch,
)
from .capture._graphs import _kernel_config
from .pool import HostPool, PinnedPool, StreamOrderedDeviceMemory, StreamPool

__all__ = ("CudaBackend",)

_POOL_RESERVE = 64 << 20


@functools.cache
def _compiler() -> KernelCompiler:
    """One compiler (and memory cache) per process, shared by every CUDA backend."""
    return KernelCompiler()


class CudaBackend(CudaDispatch):
    """Runs kernels on one CUDA device.

    Made by ``open_backend("cuda" | "cuda:N" | N)`` (or ``"auto"`` with a GPU); no public
    constructor.

    Attributes:
        arch: the device's architecture, e.g. ``"sm_90"``.
        device_name: the device's name, e.g. ``"NVIDIA H100 80GB HBM3"``.
    """

    kind = "cuda"
    _device_arrays = True

    def __init__(self, ordinal: int, options: BackendOptions) -> None:
        from cuda.core import Device, StreamOptions

        device = Device(ordinal)
        device.set_current()
        self._device = device
        super().__init__(f"cuda:{ordinal}", options)
        props = device.properties
        self._limits = LaunchLimits(
            max_threads_per_block=props.max_threads_per_block,
            max_block=(props.max_block_dim_x, props.max_block_dim_y, props.max_block_dim_z),
            max_grid=(props.max_grid_dim_x, props.max_grid_dim_y, props.max_grid_dim_z),
            max_shared_mem=props.max_shared_memory_per_block_optin,
        )
        major, minor = device.compute_capability
        self.arch = f"sm_{major}{minor}"
        self.device_name = device.name
        self._context = drv.CUcontext(int(device.context.handle))
        stream_options = StreamOptions(nonblocking=True)
        streams = [device.create_stream(options=stream_options) for _ in range(options.streams)]
        self._stream_pool: StreamPool[Any] = StreamPool(streams)
        self._handles = [drv.CUstream(int(s.handle)) for s in streams]
        self._alloc_stream = device.create_stream(options=stream_options)
        # Graphs are captured on a stream of their own, which nothing else uses.
        self._capture_stream = device.create_stream(options=stream_options)
        self._capture_handle = drv.CUstream(int(self._capture_stream.handle))
        self._capture_lock = CaptureLock()
        self._graphs: set[Any] = set()  # open CachedGraph / CapturedGraph, closed at aclose
        self._owns_memory = options.device_memory is None
        self._memory_resource = (
            self._own_memory_pool(device)
            if options.device_memory is None
            else options.device_memory
        )
        self._device_memory = StreamOrderedDeviceMemory(self._memory_resource, trim=self._trim)
        self._pinned: HostPool = (
            options.host_pool
            if options.host_pool is not None
            else PinnedPool(options.pinned_pool_bytes)
        )
        flags = drv.CUevent_flags
        self._events = EventPool(flags.CU_EVENT_BLOCKING_SYNC | flags.CU_EVENT_DISABLE_TIMING)
        self._timing_events = EventPool(flags.CU_EVENT_DEFAULT)
        self._reactor_: Reactor | None = None
        self._loaded: dict[Kernel, Any] = {}
        self._compiling: dict[Kernel, list[CudaJob]] = {}
        self._compile_failed: dict[Kernel, CompileError] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._leases = 0  # stream leases not yet ended
        self._streams_closed = False
        self._no_leases: asyncio.Future[None] | None = None  # closing waits for the last lease
        self._init_dispatch()
        self._graph_cache = GraphCache(
            self, options.graph_cache_bytes, options.graph_repeats, options.streams
        )
        self._log.debug(
            "backend.opened",
            kind=self.kind,
            name=self.device_name,
            arch=self.arch,
            streams=options.streams,
        )

    # -- pools ---------------------------------------------------------------------------------

    @property
    def pinned_pool(self) -> HostPool:
        """The pinned host pool staging this backend's transfers."""
        return self._pinned

    @property
    def device_memory(self) -> StreamOrderedDeviceMemory:
        """The stream-ordered device memory of this backend's dispatches."""
        return self._device_memory

    @property
    def stream_pool(self) -> StreamPool[Any]:
        """The streams dispatches are placed on."""
        return self._stream_pool

    def _pool_counters(self) -> PoolCounters:
        stats = self._pinned.statistics()
        return PoolCounters(
            hits=stats.hits,
            misses=stats.misses,
            bytes_cached=stats.bytes_idle,
            bytes_in_use=stats.bytes_in_use,
        )

    @staticmethod
    def _own_memory_pool(device: Any) -> Any:
        """A stream-ordered memory pool owned by this backend, set up for many streams.

        - Cross-stream reuse with hidden dependencies is off: with it, an allocation on one
          stream may reuse memory freed on another and silently wait for that stream's work
          (seen on an H100: short dispatches waited 200 ms behind a long kernel elsewhere).
        - The release threshold is unlimited: by default a pool hands its free memory back at
          every synchronisation (the reactor's waiter threads synchronise), and re-mapping it
          stalls the loop for milliseconds. On out of memory the backend trims it (``_trim``).
        """
        from cuda.core import DeviceMemoryResource, DeviceMemoryResourceOptions, StreamOptions

        resource = DeviceMemoryResource(device, DeviceMemoryResourceOptions())
        pool = drv.CUmemoryPool(int(resource.handle))
        attr = drv.CUmemPool_attribute
        check(
            drv.cuMemPoolSetAttribute(
                pool, attr.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0
            ),
            "cuMemPoolSetAttribute",
        )
        check(
            drv.cuMemPoolSetAttribute(
                pool, attr.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, drv.cuuint64_t(2**64 - 1)
            ),
            "cuMemPoolSetAttribute",
        )
        # Reserve some memory now: growing a fresh pool maps memory (15 ms for the first
        # allocation, measured), which would otherwise happen inside early dispatches.
        stream = device.create_stream(options=StreamOptions(nonblocking=True))
        resource.allocate(_POOL_RESERVE, stream=stream).close(stream)
        stream.sync()
        stream.close()
        return resource

    def _trim(self) -> None:
        """Free what caches hold before an allocation is retried (device out of memory)."""
        self._pinned.trim(0)
        pool = getattr(self._memory_resource, "handle", None)
        if pool is not None:
            drv.cuMemPoolTrimTo(drv.CUmemoryPool(int(pool)), 0)

    @property
    def _reactor(self) -> Reactor:
        reactor = self._reactor_
        if reactor is None:
            reactor = self._reactor_ = Reactor(
                self._event_loop,
                self._context,
                len(self._handles),
                self._events,
                self.options.poll_window,
                self._on_fault,
                self.telemetry,
                self.options.spin_window,
            )
        return reactor

    def _on_fault(self, error: CudaError) -> None:
        fault = error if isinstance(error, DeviceFaultError) else None
        if fault is not None and self._failure is None:
            self._failure = fault
            self._log.error("backend.failed", error=str(fault), code=fault.name)

    # -- kernels -------------------------------------------------------------------------------

    async def compile(self, kernel: Kernel) -> None:
        """Compile and load *kernel* now, so its first dispatch does not wait for NVRTC.

        Raises:
            ArgumentTypeError: *kernel* is not an :class:`asyncgraph.Kernel`.
            CompileError: NVRTC failed; the error carries its log.
        """
        self._loop_for_use()
        check_kernel(kernel, "compile()")
        if kernel in self._loaded:
            await _loop.sleep(0)
            return
        failed = self._compile_failed.get(kernel)
        if failed is not None:
            raise CompileError(failed.kernel, failed.log)
        await self._load(kernel)

    async def _load(self, kernel: Kernel) -> None:
        compiler = _compiler()
        hits = compiler.hits
        cubin = await self._event_loop.run_in_executor(None, compiler.cubin, kernel, self.arch)
        if kernel not in self._loaded:
            self._device.set_current()
            loaded = self._loaded[kernel] = load_kernel(kernel, cubin)
            self._launchers[kernel] = Launcher.for_kernel(kernel, loaded)
            if compiler.hits > hits:
                self.telemetry.compile_cache_hits += 1
            else:
                self.telemetry.compile_cache_misses += 1

    def _needs_compile(self, job: CudaJob) -> bool:
        """Queue *job* behind its kernel's compilation; ``False`` if the kernel is loaded."""
        kernel = job.call.kernel
        if kernel in self._loaded:
            return False
        failed = self._compile_failed.get(kernel)
        if failed is not None:
            raise CompileError(failed.kernel, failed.log)
        waiting = self._compiling.get(kernel)
        if waiting is not None:
            waiting.append(job)
            return True
        self._compiling[kernel] = [job]
        loop = self._event_loop
        task = loop.create_task(self._compile_for_jobs(kernel))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _compile_for_jobs(self, kernel: Kernel) -> None:
        error: BaseException | None = None
        try:
            await self._load(kernel)
        except CompileError as exc:
            self._compile_failed[kernel] = exc
            error = exc
        except Exception as exc:
            error = exc
        except BaseException:  # the loop is ending: fail the jobs, so a close does not wait
            for job in self._compiling.pop(kernel, []):
                self._complete(
                    job,
                    BackendClosedError(
                        f"the event loop ended while {kernel.name!r} compiled for dispatch "
                        f"#{job.id}; close the backend before the loop ends"
                    ),
                )
            raise
        jobs = self._compiling.pop(kernel, [])
        for job in jobs:
            if error is not None:
                failure = (
                    CompileError(error.kernel, error.log)
                    if isinstance(error, CompileError)
                    else error
                )
                self._complete(job, failure)
            else:
                self._start_loaded(job)

    # -- resident storage ----------------------------------------------------------------------

    def _wait_event(self, lane: int, event: Any, on_done: Any) -> asyncio.Future[Any]:
        """A future for *event*; ``on_done(error)`` runs first, on the loop, even if the
        awaiting task was cancelled (so resources are released after the copy, never before)."""
        loop = self._event_loop
        future: asyncio.Future[Any] = loop.create_future()

        def done(error: CudaError | None) -> None:
            outcome: BaseException | None = error
            value = None
            try:
                value = on_done(error, future.cancelled())
            except BaseException as exc:
                outcome = exc
            # After the loop closed (Reactor.adopt settles this) no task is left to wake.
            with contextlib.suppress(RuntimeError):
                if future.done():
                    return
                if outcome is not None:
                    future.set_exception(outcome)
                else:
                    future.set_result(value)

        self._reactor.watch(lane, event, done)
        return future

    def _chunked(self, lane: Any) -> ChunkedTransfer:
        return ChunkedTransfer(
            self._pinned,
            self._events.take,
            lambda event, on_done: self._wait_event(lane.index, event, on_done),
            self._handles[lane.index],
            _copy_into,
            TRANSFER_CHUNK,
        )

    async def _upload_storage(self, array: np.ndarray[Any, Any]) -> Any:
        if self._failure is not None:
            raise self._failure
        lane = self._stream_pool.pick()
        handle = self._handles[lane.index]
        nbytes = array.nbytes
        storage = self._allocate_resident(nbytes, lane.stream)
        if nbytes > CHUNKED_ABOVE:
            try:
                await self._chunked(lane).upload(
                    array.reshape(-1).view(np.uint8), int(storage.handle)
                )
            except BaseException:
                with contextlib.suppress(Exception):  # after a device fault the free fails too
                    storage.close(lane.stream)  # ordered after the copies in flight
                raise
            return storage
        block = self._pinned.acquire(nbytes)
        block.array[:nbytes] = array.reshape(-1).view(np.uint8)
        check(
            drv.cuMemcpyHtoDAsync(int(storage.handle), block.ptr, nbytes, handle),
            "cuMemcpyHtoDAsync",
        )
        event = self._events.take()
        check(drv.cuEventRecord(event, handle), "cuEventRecord")

        def on_done(error: CudaError | None, cancelled: bool) -> Any:
            self._pinned.release(block)
            if error is not None or cancelled:
                storage.close(self._alloc_stream)
            return storage

        return await self._wait_event(lane.index, event, on_done)

    def _allocate_resident(self, nbytes: int, stream: Any) -> Any:
        try:
            return self._memory_resource.allocate(nbytes, stream=stream)
        except Exception as exc:
            self._trim()
            try:
                return self._memory_resource.allocate(nbytes, stream=stream)
            except Exception as retry_exc:
                error = translate(retry_exc, "allocate")
                if isinstance(error, AllocationError):
                    raise AllocationError(
                        f"device out of memory allocating {nbytes} bytes for a resident "
                        "buffer; caches were trimmed first — free other resident buffers or "
                        "allocate less"
                    ) from retry_exc
                raise error from exc

    def _alloc_storage(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        storage = self._allocate_resident(nbytes, self._alloc_stream)
        # The allocation stream holds only allocations: this returns at once, and makes the
        # memory usable from every stream.
        self._alloc_stream.sync()
        self.telemetry.sync_points += 1
        return storage

    async def _download_storage(
        self,
        buffer: ResidentBuffer,
        use: Use,
        deps: list[Use],
        out: np.ndarray[Any, Any] | None,
    ) -> np.ndarray[Any, Any]:
        try:
            return await self._download_ordered(buffer, use, deps, out)
        finally:
            # However the download ended (cancelled while it waited for writers, say), jobs
            # parked behind it may go now.
            use.finished.set()  # type: ignore[attr-defined]  # a Download has the slot
            if self._parked:
                self._unpark()

    async def _download_ordered(
        self,
        buffer: ResidentBuffer,
        use: Use,
        deps: list[Use],
        out: np.ndarray[Any, Any] | None,
    ) -> np.ndarray[Any, Any]:
        if self._failure is not None:
            raise self._failure
        if any(dep_event(dep) is False for dep in deps):
            # A writer is not launched yet (queued or compiling): wait for it to finish.
            await self._wait_jobs(deps)
        lane = self._stream_pool.pick()
        handle = self._handles[lane.index]
        self._wait_deps(deps, handle)
        nbytes = buffer.nbytes
        if nbytes > CHUNKED_ABOVE:
            # Later writers stay parked until the whole download finished (use.event unset).
            target = np.empty(buffer.shape, buffer.dtype) if out is None else out
            await self._chunked(lane).download(
                int(buffer._storage.handle), target.reshape(-1).view(np.uint8)
            )
            return target
        block = self._pinned.acquire(nbytes)
        check(
            drv.cuMemcpyDtoHAsync(block.ptr, int(buffer._storage.handle), nbytes, handle),
            "cuMemcpyDtoHAsync",
        )
        event = self._events.take()
        check(drv.cuEventRecord(event, handle), "cuEventRecord")
        use.event = event  # type: ignore[attr-defined]  # a Download has the slot
        self._unpark()
        shape, dtype = buffer.shape, buffer.dtype

        def on_done(error: CudaError | None, cancelled: bool) -> Any:
            # The reactor recycled the event: later writers must not wait on it.
            use.event = None  # type: ignore[attr-defined]  # a Download has the slot
            use.finished.set()  # type: ignore[attr-defined]  # likewise
            try:
                if error is not None or cancelled:
                    return None
                target = np.empty(shape, dtype) if out is None else out
                target.reshape(-1).view(np.uint8)[:] = block.array[:nbytes]
                return target
            finally:
                self._pinned.release(block)

        array: np.ndarray[Any, Any] = await self._wait_event(lane.index, event, on_done)
        return array

    # -- graphs --------------------------------------------------------------------------------

    @property
    def capture_lock(self) -> CaptureLock:
        """The lock that lets one capture at a time run on this backend."""
        return self._capture_lock

    @property
    def graph_cache(self) -> GraphCache:
        """The cache of recorded graphs behind ``dispatch(..., graph="auto")``."""
        return self._graph_cache  # type: ignore[no-any-return]

    async def record(
        self,
        kernel: Kernel,
        *args: object,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        shared_mem: int = 0,
    ) -> CachedGraph:
        """Record one dispatch as CUDA graphs to replay with new inputs of the same shapes.

        Takes the arguments ``dispatch`` takes, except device arrays of other libraries and
        ``Out(..., resident=True)``. Allocates everything the graphs use first (a pinned input
        block, a pinned output block, device memory), then captures under the capture lock a
        full graph (upload, zeroing, launch, download) and, when there are inputs and none is
        also an output, a resident-input graph without the upload. Nothing runs yet.

        Raises:
            DispatchError: an argument is invalid or cannot be recorded.
            CompileError: the kernel does not compile.
            CaptureError: the capture failed (the stream stays usable).
        """
        self._loop_for_use()
        call = self._bind(kernel, args, grid, block, shared_mem)
        for i, (kind, _value, _param) in enumerate(call.args):
            if kind == DEVICE:
                raise DispatchError(
                    f"args[{i}] of {kernel.name!r} is a device array of another library; a "
                    "recorded graph takes numpy arrays, scalars and resident buffers (wrap it "
                    "in a resident buffer with backend.upload, or capture with backend.capture)"
                )
        await self.compile(kernel)
        async with self._capture_lock:
            return self._record_locked(call)

    def _record_now(self, call: BoundCall) -> CachedGraph | None:
        """Record *call* now if the kernel is loaded and no other capture runs (graph cache)."""
        if call.kernel not in self._loaded or self._failure is not None:
            return None
        if call.bytes_in + call.bytes_out > self._stream_above:
            return None  # streamed dispatches are not recorded
        if not self._capture_lock.try_acquire():
            return None
        try:
            return self._record_locked(call)
        except Exception as exc:
            self._log.warning("graph.record_failed", kernel=call.kernel.name, error=repr(exc))
            return None
        finally:
            self._capture_lock.release()

    def _record_locked(self, call: BoundCall) -> CachedGraph:
        if self._failure is not None:
            raise self._failure
        offsets, bounds = layout(call.args)
        graph = CachedGraph(self, call, offsets, bounds)
        graph._record()
        self._graphs.add(graph)
        return graph

    def capture(self, mode: object = "thread_local") -> AbstractAsyncContextManager[Any]:
        """Capture dispatches on resident buffers, and foreign work, into one CUDA graph.

        ``async with backend.capture() as cap:`` takes the capture lock and a stream of the
        pool (no dispatch goes there meanwhile). Inside, ``await cap.dispatch(kernel, *args,
        grid=..., block=...)`` records a dispatch on resident buffers and scalars (its kernel
        compiled first) and returns a :class:`RecordedDispatch`; work other libraries enqueue on
        ``cap.stream`` is recorded too. After the block, ``cap.graph`` is the
        :class:`CapturedGraph`. On any error inside, the capture is ended and discarded, the
        stream is usable and the lock released.

        Args:
            mode: a :class:`CaptureMode` or ``"global"``, ``"thread_local"``, ``"relaxed"``.
                Outside ``"relaxed"`` the backend stops querying events on the loop's thread
                while capturing (its waiter threads wait instead); with ``"global"`` it also
                waits until those threads are idle before the capture and hands them nothing
                until it ends.

        Raises:
            CaptureError: a bad mode, or the capture was invalidated.
        """
        self._loop_for_use()
        return self._capture(CaptureMode.parse(mode))

    @contextlib.asynccontextmanager
    async def _capture(self, mode: CaptureMode) -> AsyncIterator[_Capture]:
        if self._failure is not None:
            raise self._failure
        async with self._capture_lock:
            lane = await self._stream_pool.lease()
            self._leases += 1
            reactor = self._reactor
            try:
                if mode is not CaptureMode.RELAXED:
                    reactor.pause(waiters=mode is CaptureMode.GLOBAL)
                    if mode is CaptureMode.GLOBAL:
                        await reactor.waiters_idle()
                handle = self._handles[lane.index]
                cap = _Capture(self, lane.stream, handle, mode)
                with cap._guard:
                    yield cap
                    cap._closed = True
                cap._finish()
            finally:
                if mode is not CaptureMode.RELAXED:
                    reactor.resume()
                self._stream_pool.give_back(lane)
                self._lease_ended()

    # graph internals (used by asyncgraph.capture)

    def _alloc_bytes(self, nbytes: int) -> Any:
        return self._alloc_storage((nbytes,), np.dtype(np.uint8))

    def _run_capture(self, body: Any) -> tuple[Any, dict[int, Any], Any]:
        with CaptureGuard(
            self._capture_stream, self._capture_handle, CaptureMode.THREAD_LOCAL
        ) as guard:
            result = body(guard)
        return guard.graph, guard.nodes, result

    def _capture_launch(self, call: BoundCall, offsets: list[int], base: int, guard: Any) -> int:
        """Enqueue *call*'s kernel on the capturing stream; the handle of its kernel node."""
        job = CudaJob(call, False)
        job.offsets = offsets
        stream, handle = guard._stream, guard._handle
        self._enqueue_kernel(job, base, handle, stream)
        return guard.last_node()  # type: ignore[no-any-return]

    def _update_nodes(self, nodes: list[Any], call: BoundCall, values: tuple[Any, ...]) -> None:
        config = _kernel_config(call)
        kernel = self._loaded[call.kernel]
        for node in nodes:
            try:
                node.update(config=config, kernel=kernel, args=values)
            except Exception as exc:
                raise translate(exc, "cuGraphExecKernelNodeSetParams") from exc
            self.telemetry.graph_updates += 1

    def _replay_job(self, call: BoundCall, graph: Any) -> CudaJob:
        job = CudaJob(call, False)
        job.replay = graph
        return job

    def _close_graphs(self) -> None:
        self._graph_cache.clear()
        for graph in list(self._graphs):
            graph.close()

    # -- foreign work and interop ------------------------------------------------------------

    def stream(self) -> AbstractAsyncContextManager[StreamLease]:
        """Lease one of the backend's CUDA streams for work other libraries enqueue.

        ``async with backend.stream() as lease:`` waits (FIFO, cancellation-safe) for a stream
        no one else leases; no dispatch is placed on it meanwhile. ``lease.handle`` is the
        ``CUstream`` as an int, ``lease`` has ``__cuda_stream__``, and ``await
        lease.synchronize()`` waits for the work enqueued so far without blocking the loop.
        ``aclose()`` waits for leases to end before it destroys the streams.

        Raises:
            BackendClosedError: the backend is closed.
        """
        self._loop_for_use()
        return self._lease()

    @contextlib.asynccontextmanager
    async def _lease(self) -> AsyncIterator[StreamLease]:
        lane = await self._stream_pool.lease()
        lease = StreamLease(self, lane)
        self._leases += 1
        try:
            yield lease
        finally:
            lease._active = False
            self._stream_pool.give_back(lane)
            self._lease_ended()

    def _lease_ended(self) -> None:
        self._leases -= 1
        if not self._leases and self._no_leases is not None and not self._no_leases.done():
            self._no_leases.set_result(None)

    async def _synchronize_lane(self, lane: Any) -> None:
        if self._failure is not None:
            raise self._failure
        event = self._events.take()
        code = drv.cuEventRecord(event, self._handles[lane.index])[0]
        if code != SUCCESS:
            self._events.give(event)
            raise error_for(code, "cuEventRecord")
        await self._wait_event(lane.index, event, lambda _error, _cancelled: None)

    def export_device(self) -> tuple[int, int]:
        """DLPack device of resident buffers: (``kDLCUDA``, ordinal). Used by the buffers."""
        return (KDL_CUDA, self._device.device_id)

    def export_pointer(self, storage: Any) -> int:
        """The device address of a resident buffer. Used by the buffers."""
        return int(storage.handle)

    @staticmethod
    def _events_of(uses: list[Any]) -> list[Any]:
        events = []
        for use in uses:
            event = dep_event(use)
            if event is False:
                raise BufferError(
                    "a dispatch that uses this buffer is queued and has not started, so there "
                    "is nothing to order after yet; await it first"
                )
            if event is not None:
                events.append(event)
        return events

    def export_wait(self, buffer: ResidentBuffer, stream: int | None) -> None:
        """DLPack: make the consumer's *stream* (``None``: the legacy default stream; ``-1``:
        none) wait for every dispatch in flight that uses the buffer. Used by the buffers."""
        uses = [buffer._writer, *buffer._readers] if buffer._writer else list(buffer._readers)
        events = self._events_of(uses)
        if stream == -1 or not events:
            return
        target = drv.CUstream(1 if stream is None else int(stream))
        for event in events:
            check(drv.cuStreamWaitEvent(target, event, 0), "cuStreamWaitEvent")

    def export_stream(self, buffer: ResidentBuffer) -> int | None:
        """``__cuda_array_interface__``: the stream of the dispatch in flight that writes the
        buffer, or ``None``. Used by the buffers."""
        writer = buffer._writer
        if writer is None or not self._events_of([writer]):
            return None
        return int(writer.lane.stream.handle)  # type: ignore[attr-defined]  # a launched CudaJob

    def _free_storage(self, storage: Any) -> None:
        # After close (a DLPack consumer let go of a buffer late) the streams are gone; the
        # memory resource then frees without one.
        storage.close(None if self._streams_closed else self._alloc_stream)

    # -- closing -------------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        # The loop's end may interrupt it at an await and start it again: each step repeats.
        self._close_graphs()
        if self._leases:
            # Work of other libraries may still be enqueued on leased streams.
            self._no_leases = self._event_loop.create_future()
            await self._no_leases
        for task in list(self._tasks):
            await _loop.wait_done(task)
        threads = self._reactor_.close() if self._reactor_ is not None else []
        if threads:
            await self._event_loop.run_in_executor(None, _join, threads)
        self._release_all()
        if isinstance(self._pinned, PinnedPool):
            # Return with the pinned memory released: a free still running in the background
            # would wait for kernels of other backends and hold up their driver calls.
            await _loop.wrap_future(self._pinned.wait_freed())

    def _shutdown_now(self) -> None:
        self._close_graphs()
        _join(self._reactor_.close() if self._reactor_ is not None else [])
        self._release_all()
        if isinstance(self._pinned, PinnedPool):
            self._pinned.wait_freed().result()

    def _release_all(self) -> None:
        if self._streams_closed:
            return
        self._pinned.close()
        self._events.close()
        self._timing_events.close()
        self._free_scratch()
        self._streams_closed = True
        for stream in [*self._stream_pool.streams, self._alloc_stream, self._capture_stream]:
            stream.close()
        self._loaded.clear()
        self._launchers.clear()
        if self._owns_memory:
            self._memory_resource.close()

    async def _settle_after(self, ended: asyncio.AbstractEventLoop) -> None:
        # Tasks, leases and compilations of the ended loop never go on, and neither does what
        # its callbacks carried (staging, result copies, streamed transfers): fail those jobs
        # once the device finished and the reactor settled the watched events on this loop.
        self._tasks.clear()
        self._leases = 0
        self._compiling.clear()
        jobs = cast("list[CudaJob]", list(self._in_flight.values()))
        carried = [job for job in jobs if job.event is None or job.streamed]
        reactor = self._reactor_
        if reactor is not None:
            threads = reactor.close()
            await self._event_loop.run_in_executor(None, self._synchronize, threads)
            reactor.adopt(self._event_loop)
        for job in carried:
            if job.id not in self._in_flight or (job.event is not None and not job.streamed):
                continue  # completed, or launched just now (it waited for a settled one)
            if job in self._parked:
                self._parked.remove(job)
            if job.device_buffer is not None:
                with contextlib.suppress(Exception):
                    self._device_memory.free(job.device_buffer, self._alloc_stream)
                job.device_buffer = None
            self._release_job(job)
            self._complete(
                job,
                BackendClosedError(
                    f"backend {self.name} was left open when its event loop ended, before "
                    f"dispatch #{job.id} of {job.call.kernel.name!r} completed"
                ),
            )

    def _synchronize(self, threads: list[threading.Thread]) -> None:
        drv.cuCtxSetCurrent(self._context)
        drv.cuCtxSynchronize()  # a fault's error surfaces in the events' queries
        _join(threads)

    def _release_unclosed(self) -> None:
        if self._reactor_ is not None:
            self._reactor_.close()
        self._pinned.close()

    def _prepare(self, call: Any, timing: bool) -> Job:
        return self._plan(call, timing)

    def _start(self, job: Job) -> None:
        self._start_job(job)  # type: ignore[arg-type]  # every job here is a CudaJob


def _join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join()


class _CaptureStream:
    """The capturing stream, for work of other libraries (``cap.stream``)."""

    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def __repr__(self) -> str:
        return f"<capture stream {self.handle:#x}>"


class _Capture:
    """What ``async with backend.capture() as cap`` gives: record dispatches, then ``graph``."""

    def __init__(self, backend: CudaBackend, stream: Any, handle: Any, mode: CaptureMode) -> None:
        self._backend = backend
        self._guard = CaptureGuard(stream, handle, mode)
        self.mode = mode
        self.stream = _CaptureStream(int(handle))
        self._dispatches: list[RecordedDispatch] = []
        self._buffers: list[ResidentBuffer] = []
        self._closed = False
        self._graph: CapturedGraph | None = None

    @property
    def status(self) -> Any:
        """The capture's :class:`CaptureStatus` now."""
        return self._guard.status

    @property
    def graph(self) -> CapturedGraph:
        """The captured graph, once the ``async with`` block ended.

        Raises:
            CaptureError: the block has not ended yet.
        """
        if self._graph is None:
            raise CaptureError("cap.graph is there once the 'async with backend.capture()' ended")
        return self._graph

    async def dispatch(
        self,
        kernel: Kernel,
        *args: object,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        shared_mem: int = 0,
    ) -> RecordedDispatch:
        """Record a dispatch of *kernel* on resident buffers and numpy scalars.

        ``Out(into=buffer)`` outputs are zero-filled first, as in ``dispatch``. The kernel must
        be compiled before the capture began (``await backend.compile(kernel)``): loading code
        during a capture is not allowed.

        Raises:
            DispatchError: an argument is not a resident buffer, ``Out(into=)`` or a scalar.
            CaptureError: the capture ended, or the kernel was not compiled before it.
        """
        backend = self._backend
        if self._closed:
            raise CaptureError("the capture ended; start another with backend.capture()")
        call = backend._bind(kernel, args, grid, block, shared_mem)
        for i, (kind, _value, _param) in enumerate(call.args):
            if kind in (IN, INOUT, OUT, DEVICE):
                raise DispatchError(
                    f"args[{i}] of {kernel.name!r}: a capture records dispatches on resident "
                    "buffers, Out(into=buffer) and scalars only; upload arrays with "
                    "backend.upload() first"
                )
        if kernel not in backend._loaded:
            raise CaptureError(
                f"{kernel.name!r} is not compiled; await backend.compile(kernel) before the "
                "capture (code cannot be loaded while a stream captures)"
            )
        node = backend._capture_launch(call, [], 0, self._guard)
        recorded = RecordedDispatch(len(self._dispatches), call, node)
        self._dispatches.append(recorded)
        for kind, value, _param in call.args:
            if kind in (RESIDENT, RESIDENT_OUT) and all(value is not b for b in self._buffers):
                self._buffers.append(value)
        await _loop.sleep(0)
        return recorded

    def _finish(self) -> None:
        guard = self._guard
        nodes = guard.nodes
        for recorded in self._dispatches:
            recorded._exec_node = guard.graph[nodes[recorded._node]]
        graph = CapturedGraph(self._backend, guard.graph, self._dispatches, self._buffers)
        # Only the graph refers to the captured objects from now on: they are destroyed when
        # it closes, not whenever this object goes (which may be during another capture, where
        # destroying a graph on the capturing thread would invalidate it).
        guard.graph = None
        guard.nodes = {}
        self._backend._graphs.add(graph)
        self._graph = graph
