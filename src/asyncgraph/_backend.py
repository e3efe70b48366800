"""The shared front of every backend: dispatch, resident buffers, closing, telemetry.

A concrete backend (CUDA, host) implements a handful of hooks: how a dispatch starts
(``_start``), how resident storage is made, read and freed, and how it shuts down. Everything a
user touches — validation, ``PendingDispatch``, the in-flight bound and its FIFO queue, ordering
between dispatches that share resident buffers, telemetry, closing — lives here once.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
import numbers
import sys
import warnings
from collections import deque
from collections.abc import Callable, Generator
from contextlib import AbstractAsyncContextManager
from time import perf_counter
from types import TracebackType
from typing import Any, ClassVar, Final, NoReturn, cast

import numpy as np

from . import _inbox, _loop
from ._args import (
    RESIDENT,
    RESIDENT_OUT,
    BoundCall,
    LaunchLimits,
    bind,
)
from ._checks import check_array, check_kernel, numeric_dtype, shape_tuple
from ._dlpack import KDL_CPU
from ._exceptions import (
    ArgumentTypeError,
    BackendClosedError,
    DeviceFaultError,
    DeviceUnavailableError,
    QueueFullError,
    UnsupportedError,
)
from ._kernel import Kernel
from ._lease import StreamLease
from ._nvtx import NvtxRanges
from ._options import BackendOptions
from ._pending import PendingDispatch
from ._resident import Download, ResidentBuffer, ResidentStore, Use, check_out
from ._telemetry import PoolCounters, Telemetry, logger

__all__ = ("Backend", "Job", "open_backend")

_OPEN: Final = 0
_GRAPH_CHOICES: Final = ("never", "auto", "always")
_CLOSING: Final = 1
_CLOSED: Final = 2


class Job:
    """One dispatch from ``dispatch()`` to completion (internal; backends subclass it)."""

    __slots__ = (
        "buffers",
        "call",
        "deps",
        "id",
        "nvtx_range",
        "pending",
        "t_dispatch",
        "t_submit",
        "timing",
    )

    def __init__(self, call: BoundCall, timing: bool) -> None:
        self.call = call
        self.timing = timing
        self.id = 0
        self.pending: PendingDispatch = None  # type: ignore[assignment]  # set by dispatch()
        self.t_dispatch = 0.0
        self.t_submit = 0.0
        self.deps: list[Use] = []
        self.buffers: list[ResidentBuffer] = []
        self.nvtx_range: Any = None  # the NVTX range of its life, with nvtx_enabled


class Backend(abc.ABC):
    """A place to run kernels: a CUDA device, or the host in worker threads.

    Open one with :func:`asyncgraph.open_backend`. A backend is an async resource: use
    ``async with`` or ``await backend.aclose()``. It belongs to the event loop it is first used
    on.

    Attributes:
        name: ``"cuda:0"``, ``"host"``...
        options: the :class:`BackendOptions` it was opened with.
        telemetry: its counters; ``backend.telemetry.snapshot()`` reads them.
    """

    kind: ClassVar[str]
    _limits: LaunchLimits
    _device_arrays: ClassVar[bool] = False

    def __init__(self, name: str, options: BackendOptions) -> None:
        # First: it may refuse (no nvtx package) before anything needs closing.
        self._nvtx = NvtxRanges() if options.nvtx_enabled else None
        self.name = name
        self.options = options
        self._store = ResidentStore(name, self._free_storage, self)
        self.telemetry = Telemetry(self._counts, self._pool_counters)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = _OPEN
        self._failure: DeviceFaultError | None = None
        self._ids = itertools.count(1)
        self._in_flight: dict[int, Job] = {}
        self._queue: deque[Job] = deque()
        self._max_in_flight = options.max_in_flight
        self._max_queued = options.max_queued or sys.maxsize
        self._room = _loop.WaitQueue()  # submit() calls waiting for room in the queue
        self._transfers = 0  # uploads and downloads in progress (closing waits for them)
        self._drained: asyncio.Future[None] | None = None  # set once nothing is in flight
        self._close_task: asyncio.Task[None] | None = None
        self._log = logger.bind(device=name)
        self._dispatch_events = options.dispatch_events_enabled
        self._graph_cache: Any = None  # CUDA: the GraphCache behind dispatch(graph=...)
        self._loop = _loop.running_loop()

    # -- state ---------------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """Whether ``aclose()`` was called (the backend may still be finishing work)."""
        return self._state != _OPEN

    @property
    def failure(self) -> DeviceFaultError | None:
        """The device fault that failed this backend, or ``None`` while it is healthy."""
        return self._failure

    def __repr__(self) -> str:
        state = ("open", "closing", "closed")[self._state]
        if self._failure is not None:
            state = "failed"
        return (
            f"<{type(self).__name__} {self.name} {state} in_flight={len(self._in_flight)} "
            f"queued={len(self._queue)} buffers={len(self._store)}>"
        )

    @property
    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop this backend belongs to; bound by ``_loop_for_use()`` before any work."""
        return cast(asyncio.AbstractEventLoop, self._loop)

    def _counts(self) -> tuple[int, int]:
        return len(self._in_flight), len(self._queue)

    def _pool_counters(self) -> PoolCounters:
        return PoolCounters()

    def _loop_for_use(self) -> asyncio.AbstractEventLoop:
        if self._state != _OPEN:
            raise BackendClosedError(
                f"backend {self.name} is closed; open a new one with asyncgraph.open_backend()"
            )
        if self._failure is not None:
            raise DeviceFaultError(
                self._failure.code,
                self._failure.name,
                self._failure.call,
                f"backend {self.name} failed earlier and takes no new work; close it and open "
                "a new backend (see docs/errors.md)",
            )
        loop = _loop.running_loop()
        if loop is None:
            raise UnsupportedError(
                f"backend {self.name} is used from a thread with no running event loop; "
                "call it from async code on the loop it belongs to"
            ) from None
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise UnsupportedError(
                f"backend {self.name} belongs to another event loop; open one backend per "
                "event loop"
            )
        return loop

    # -- dispatch ------------------------------------------------------------------------------

    def dispatch(
        self,
        kernel: Kernel,
        *args: object,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        shared_mem: int = 0,
        timing: bool = False,
        graph: str = "never",
    ) -> PendingDispatch:
        """Launch *kernel* on *args* and return at once; ``await`` the result for the outputs.

        Args:
            kernel: the kernel to run.
            *args: its arguments in kernel order: numpy arrays (inputs, read while the dispatch
                runs: do not modify them until it completed), ``Out(shape, dtype)`` (with
                ``resident=True`` the result stays on the backend), ``InOut(array)``, numpy
                scalars, resident buffers, ``Out(into=buffer)``, and on CUDA device arrays of
                CuPy or PyTorch.
            grid: blocks in the grid, an int or a tuple of up to three.
            block: threads per block, an int or a tuple of up to three.
            shared_mem: bytes of dynamic shared memory per block.
            timing: measure the kernel's device time into ``pending.device_time``.
            graph: ``"never"`` (launch it), ``"auto"`` (replay a CUDA graph recorded once the
                same signature was dispatched ``BackendOptions.graph_repeats`` times) or
                ``"always"`` (record on first sight); see ``docs/graphs.md``. The host backend
                has no graphs and runs every dispatch; ``timing=True`` runs without one too.

        Returns:
            A :class:`PendingDispatch`; ``await`` it for one result per ``Out``/``InOut``.

        Raises:
            DispatchError: an argument or the launch shape is invalid; nothing was started.
            StaleBufferError: a resident buffer is closed or from another backend.
            QueueFullError: ``BackendOptions.max_queued`` dispatches are queued already; nothing
                was started (:meth:`submit` waits for room instead).
            UnsupportedError: the backend cannot run this (e.g. no ``host=`` on the host
                backend), or the call is not on the backend's event loop.
            BackendClosedError: the backend is closed.
            DeviceFaultError: the backend failed earlier with a device fault.
        """
        loop = self._loop_for_use()
        if len(self._queue) >= self._max_queued:
            raise QueueFullError(
                f"backend {self.name} has {len(self._queue)} dispatches queued already "
                f"(BackendOptions.max_queued={self._max_queued}); nothing was started — use "
                "'await backend.submit(...)' to wait for room instead"
            )
        if not isinstance(timing, bool):
            raise ArgumentTypeError(f"timing={timing!r}; pass True or False")
        if graph not in _GRAPH_CHOICES:
            raise ArgumentTypeError(f"graph={graph!r}; pass 'never', 'auto' or 'always'")
        call = self._bind(kernel, args, grid, block, shared_mem, self._new_resident)
        job: Job | None = None
        cache = self._graph_cache
        if cache is not None and graph != "never" and not timing:
            job = cache.job_for(call, graph == "always")
        if job is None:
            job = self._prepare(call, timing)
        return self._enqueue_job(job, loop)

    def _enqueue_job(self, job: Job, loop: asyncio.AbstractEventLoop) -> PendingDispatch:
        """Number *job*, order it after the uses of its buffers, and submit or queue it."""
        job.id = dispatch_id = next(self._ids)
        pending = job.pending = PendingDispatch(loop, dispatch_id, job.call.kernel.name)
        job.t_dispatch = perf_counter()
        call = job.call
        if call.resident:
            self._track_buffers(job)
        self.telemetry.dispatches += 1
        if not self._queue and len(self._in_flight) < self._max_in_flight:
            self._submit(job)
        else:
            self._queue.append(job)
        return pending

    def _track_buffers(self, job: Job) -> None:
        writes: dict[ResidentBuffer, bool] = {}
        for kind, value, param in job.call.args:
            if kind == RESIDENT:
                # Without a const qualifier the kernel may write through the pointer.
                write = param is None or not param.const
                writes[value] = writes.get(value, False) or write
            elif kind == RESIDENT_OUT:
                writes[value] = True
        for buffer, write in writes.items():
            job.deps.extend(dep for dep in buffer._track(job, write) if dep is not job)
            job.buffers.append(buffer)

    def _submit(self, job: Job) -> None:
        job.t_submit = t0 = perf_counter()
        self.telemetry.queue_wait.record(t0 - job.t_dispatch)
        self._in_flight[job.id] = job
        nvtx = self._nvtx
        if nvtx is not None:
            job.nvtx_range = nvtx.start_dispatch(job.call.kernel.name)
            nvtx.push_submit(job.call.kernel.name)
        try:
            self._start(job)
        except BaseException as exc:
            self._complete(job, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            if nvtx is not None:
                nvtx.pop_submit()
        self.telemetry.submit_time.record(perf_counter() - t0)

    def _complete(
        self, job: Job, outcome: tuple[Any, ...] | BaseException, device_time: float | None = None
    ) -> None:
        """Finish *job* on the loop's thread: release its uses, count it, resolve it."""
        if self._in_flight.pop(job.id, None) is None:
            return  # already completed (a failure raced with a normal completion)
        for buffer in job.buffers:
            buffer._untrack(job)
        if job.nvtx_range is not None:
            self._nvtx.end_dispatch(job.nvtx_range)  # type: ignore[union-attr]  # set with it
        telemetry = self.telemetry
        latency = perf_counter() - job.t_dispatch
        telemetry.completion_latency.record(latency)
        if isinstance(outcome, BaseException):
            telemetry.dispatches_failed += 1
            if self._dispatch_events:
                self._log.debug(
                    "dispatch.failed",
                    kernel=job.call.kernel.name,
                    dispatch_id=job.id,
                    error=repr(outcome),
                )
            job.pending._set_exception(outcome)
        else:
            telemetry.dispatches_completed += 1
            if device_time is not None:
                telemetry.device_time.record(device_time)
            if self._dispatch_events:
                self._log.debug(
                    "dispatch.completed",
                    kernel=job.call.kernel.name,
                    dispatch_id=job.id,
                    latency=latency,
                    device_time=device_time,
                )
            job.pending._set_result(outcome, device_time)
        queue = self._queue
        while queue and len(self._in_flight) < self._max_in_flight:
            self._submit(queue.popleft())
            if self._room:
                self._room.wake()  # one place left the queue: one submit() may go
        if self._drained is not None:
            self._check_drained()

    async def submit(
        self,
        kernel: Kernel,
        *args: object,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        shared_mem: int = 0,
        timing: bool = False,
        graph: str = "never",
    ) -> PendingDispatch:
        """Like :meth:`dispatch`, but first wait while ``max_queued`` dispatches are queued.

        The backpressure of a server: callers wait their turn (first come, first served)
        instead of piling up work. Cancelling the wait leaves the line and starts nothing.
        With ``BackendOptions.max_queued=None`` (the default) it never waits.

        Returns:
            The :class:`PendingDispatch`; ``await`` it for the results.

        Raises:
            BackendClosedError: the backend was closed (also while waiting).
            Exception: whatever :meth:`dispatch` raises for these arguments.
        """
        loop = self._loop_for_use()
        await _loop.sleep(0)  # a checkpoint before anything starts
        if self._room or len(self._queue) >= self._max_queued:
            await self._room.wait(loop)
            while len(self._queue) >= self._max_queued:  # a dispatch() took the place first
                await self._room.wait(loop, first=True)
        try:
            return self.dispatch(
                kernel, *args, grid=grid, block=block, shared_mem=shared_mem, timing=timing,
                graph=graph,
            )  # fmt: skip
        finally:
            if self._room and len(self._queue) < self._max_queued:
                self._room.wake()  # room for the next one too (or this one was refused)

    async def compile(self, kernel: Kernel) -> None:
        """Prepare *kernel* now, so its first dispatch does not wait (CUDA: NVRTC and loading).

        Raises:
            ArgumentTypeError: *kernel* is not an :class:`asyncgraph.Kernel`.
            CompileError: the kernel does not compile (CUDA backend).
            UnsupportedError: the host backend got a kernel without ``host=``.
        """
        self._loop_for_use()
        check_kernel(kernel, "compile()")
        self._prepare_kernel(kernel)
        await _loop.sleep(0)

    def _prepare_kernel(self, kernel: Kernel) -> None:  # noqa: B027  # optional hook
        """Check that this backend can run *kernel* (the host backend needs ``host=``)."""

    # -- resident buffers ----------------------------------------------------------------------

    async def upload(self, array: np.ndarray[Any, Any]) -> ResidentBuffer:
        """Copy *array* into a new resident buffer on this backend.

        Raises:
            DispatchError: *array* is not a non-empty, C-contiguous numeric numpy array.
            BackendClosedError: the backend is closed, or was closed while the array was copied
                (the copy is freed).
        """
        self._loop_for_use()
        if not isinstance(array, np.ndarray):
            raise ArgumentTypeError(
                f"upload() takes a numpy array, got {type(array).__name__}; pass np.asarray(x)"
            )
        check_array(array, "upload()")
        self._transfers += 1
        try:
            storage = await self._upload_storage(array)
        finally:
            self._transfer_ended()
        if self._state != _OPEN:
            # aclose() waited for this copy; the store is about to close, so keep nothing.
            self._free_storage(storage)
            raise BackendClosedError(
                f"backend {self.name} was closed while upload() copied the array; the copy "
                "was freed"
            )
        self.telemetry.bytes_up += array.nbytes
        self.telemetry.copies_up += 1
        return self._store.add(storage, array.shape, array.dtype)

    def empty(self, shape: int | tuple[int, ...], dtype: object) -> ResidentBuffer:
        """Allocate a resident buffer; its contents are undefined until written.

        Raises:
            ShapeMismatchError: the shape is not a tuple of positive ints.
            ArgumentTypeError: the dtype is not numeric.
            AllocationError: the device is out of memory even after the caches were trimmed.
            BackendClosedError: the backend is closed.
        """
        self._loop_for_use()
        shape_t = shape_tuple(shape, "empty()")
        dt = numeric_dtype(dtype, "empty()")
        return self._new_resident(shape_t, dt)

    def _new_resident(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> ResidentBuffer:
        return self._store.add(self._alloc_storage(shape, dtype), shape, dtype)

    def pinned_empty(self, shape: int | tuple[int, ...], dtype: object) -> np.ndarray[Any, Any]:
        """A numpy array in page-locked host memory, for inputs that go up without a copy.

        Dispatching a pinned array (or a view of one) uploads it straight from its memory,
        skipping the copy into staging; results of 1 MiB or more come back in pinned memory
        too, so a pipeline of dispatches copies nothing on the host. The memory comes from the
        backend's pinned pool and returns there when the array is garbage-collected. Its
        contents are undefined until written. The host backend returns an ordinary array.

        Raises:
            ShapeMismatchError: the shape is not a tuple of positive ints.
            ArgumentTypeError: the dtype is not numeric.
            AllocationError: pinned memory is exhausted.
            BackendClosedError: the backend is closed.
        """
        self._loop_for_use()
        shape_t = shape_tuple(shape, "pinned_empty()")
        dt = numeric_dtype(dtype, "pinned_empty()")
        return self._host_array(shape_t, dt)

    def _host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        return np.empty(shape, dtype)

    async def download(
        self, buffer: ResidentBuffer, out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        """Copy a resident buffer back into a new numpy array, or into *out*.

        Waits for dispatches in flight that write the buffer, so it reads what they wrote.
        Reusing an *out* array whose pages were touched before saves the page faults of a new
        array, which bound large downloads.

        Raises:
            StaleBufferError: the buffer is closed or from another backend.
            ArgumentTypeError: *out* is not a writable, C-contiguous numpy array.
            ShapeMismatchError: *out* has another shape or dtype than the buffer.
            BackendClosedError: the backend is closed.
        """
        self._loop_for_use()
        if not isinstance(buffer, ResidentBuffer):
            raise ArgumentTypeError(
                f"download() takes a resident buffer, got {type(buffer).__name__}"
            )
        self._store.check(buffer, "download()")
        if out is not None:
            check_out(out, buffer)
        use = Download()
        deps = buffer._track(use, write=False)
        self._transfers += 1
        try:
            array = await self._download_storage(buffer, use, deps, out)
        finally:
            use.finished.set()
            buffer._untrack(use)
            self._transfer_ended()
        self.telemetry.bytes_down += array.nbytes
        self.telemetry.copies_down += 1
        return array

    # -- graphs --------------------------------------------------------------------------------

    async def record(
        self,
        kernel: Kernel,
        *args: object,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        shared_mem: int = 0,
    ) -> Any:
        """Record one dispatch as a CUDA graph to replay (CUDA backend); see ``docs/graphs.md``.

        Raises:
            UnsupportedError: the backend has no CUDA graphs (the host backend).
        """
        self._loop_for_use()
        raise UnsupportedError(f"record(): the {self.kind} backend has no CUDA graphs")

    def capture(self, mode: object = "thread_local") -> AbstractAsyncContextManager[Any]:
        """Capture dispatches on resident buffers into a CUDA graph (CUDA backend).

        Raises:
            UnsupportedError: the backend has no CUDA graphs (the host backend).
        """
        self._loop_for_use()
        raise UnsupportedError(f"capture(): the {self.kind} backend has no CUDA graphs")

    def _bind(
        self,
        kernel: Kernel,
        args: tuple[object, ...],
        grid: object,
        block: object,
        shared_mem: object,
        new_resident: Callable[[tuple[int, ...], np.dtype[Any]], ResidentBuffer] | None = None,
    ) -> BoundCall:
        """Validate a dispatch's arguments against *kernel* and this backend (``bind``)."""
        return bind(
            kernel,
            args,
            grid=grid,
            block=block,
            shared_mem=shared_mem,
            limits=self._limits,
            store=self._store,
            device_arrays=self._device_arrays,
            new_resident=new_resident,
        )

    def _bind_call(self, kernel: Kernel, args: tuple[object, ...], like: BoundCall) -> BoundCall:
        """Validate *args* for *kernel* with the launch shape of *like* (a recorded call)."""
        self._loop_for_use()
        return self._bind(kernel, args, like.grid, like.block, like.shared_mem)

    async def _submit_prepared(self, job: Job) -> Any:
        """Run a job prepared outside ``dispatch()`` (a graph replay) and return its result."""
        try:
            pending = self._enqueue_job(job, self._loop_for_use())
        except BaseException:
            self._abandon(job)
            raise
        return await pending

    def _abandon(self, job: Job) -> None:  # noqa: B027  # optional hook
        """*job* was prepared but never submitted: give back what preparing it took."""

    # -- foreign work ----------------------------------------------------------------------------

    def stream(self) -> AbstractAsyncContextManager[StreamLease]:
        """Lease one of the backend's CUDA streams for work other libraries enqueue.

        ``async with backend.stream() as lease:`` waits (FIFO, cancellation-safe) for a stream
        no one else leases, and gives it back at the end; see :class:`StreamLease`.

        Raises:
            UnsupportedError: the backend has no CUDA streams (the host backend).
            BackendClosedError: the backend is closed.
        """
        self._loop_for_use()
        raise UnsupportedError(
            f"backend {self.name} has no CUDA streams; stream() needs the CUDA backend"
        )

    async def _synchronize_lane(self, lane: Any) -> None:
        raise UnsupportedError(f"backend {self.name} has no CUDA streams")

    # -- interop (the resident store's Exporter; the host backend's memory is host memory) ----

    def export_device(self) -> tuple[int, int]:
        """DLPack device of resident buffers: (device type, ordinal). Used by the buffers."""
        return (KDL_CPU, 0)

    def export_pointer(self, storage: Any) -> int:
        """The address of a resident buffer's memory. Used by the buffers."""
        return int(storage.ctypes.data)

    def export_wait(self, buffer: ResidentBuffer, stream: int | None) -> None:
        """DLPack: order the consumer after the uses in flight. Used by the buffers.

        Raises:
            BufferError: a dispatch uses the buffer (host memory has no stream to wait on).
        """
        if stream not in (None, -1):
            raise BufferError(f"__dlpack__(stream={stream}): host memory has no streams")
        if buffer._in_use:
            raise BufferError(
                f"{buffer!r} is used by a dispatch in flight; await it before sharing the memory"
            )

    def export_stream(self, buffer: ResidentBuffer) -> int | None:
        """``__cuda_array_interface__`` stream (none for host memory). Used by the buffers."""
        return None

    def call_threadsafe(self, fn: Callable[[], None]) -> None:
        """Run *fn* on the loop's thread soon; at once if the loop is gone."""
        loop = self._loop
        if loop is None or loop.is_closed():
            fn()
            return
        try:
            loop.call_soon_threadsafe(fn)
        except RuntimeError:  # closed meanwhile: nothing else uses the store any more
            fn()

    @staticmethod
    async def _wait_jobs(deps: list[Use]) -> None:
        """Wait until each dispatch in *deps* completed, whatever its outcome."""
        for dep in deps:
            if isinstance(dep, Job) and not dep.pending.done():
                with contextlib.suppress(Exception):
                    await dep.pending

    # -- closing -------------------------------------------------------------------------------

    async def aclose(self, timeout: float | None = None) -> None:  # noqa: ASYNC109  # the timeout fails queued work; cancelling a shielded close cannot
        """Finish the work in flight, then free everything the backend holds.

        New work is refused from the first call on. Idempotent, and shielded from cancellation:
        a cancelled ``aclose()`` still completes in the background, also when the event loop
        ends meanwhile (``asyncio.run`` and ``trio.run`` wait for it).

        Close a backend on its own event loop. Once that loop has ended (closed), any loop may
        close it: the work the old loop left in flight is waited for first.

        Args:
            timeout: seconds to wait for dispatches still queued (not yet submitted). After it,
                they fail with :class:`BackendClosedError`. Work already submitted always runs
                to completion first, since its memory cannot be freed before.

        Raises:
            TypeError: *timeout* is not a number of seconds.
            ValueError: *timeout* is negative.
            UnsupportedError: the backend's event loop is another one, and still open.
        """
        if timeout is not None:
            _check_timeout(timeout)
        loop = _loop.current_loop()
        ended = None
        if self._loop is not None and self._loop is not loop:
            if self._state == _CLOSED:
                await _loop.sleep(0)
                return
            if not self._loop.is_closed():
                raise UnsupportedError(
                    f"backend {self.name} belongs to another event loop, which is still open; "
                    "close it on that loop (from another thread: "
                    "asyncio.run_coroutine_threadsafe(backend.aclose(), loop))"
                )
            ended = self._adopt(loop)
        if self._close_task is None:
            self._loop = loop
            self._begin_closing()
            self._close_task = _loop.create_lasting_task(loop, self._close(ended))
        if timeout is None:
            await _loop.shield(self._close_task)
            return
        try:
            await _loop.wait_for(self._close_task, timeout)
        except TimeoutError:
            self._drop_queued(lambda job: f"was closed before {job} started (aclose timeout)")
            await _loop.shield(self._close_task)

    def _begin_closing(self) -> None:
        self._state = _CLOSING
        self._room.fail(
            lambda: BackendClosedError(
                f"backend {self.name} was closed while submit() waited for room in its queue"
            )
        )

    def _drop_queued(self, why: Callable[[str], str]) -> None:
        """Fail every dispatch still queued with BackendClosedError (closing)."""
        queue = self._queue
        while queue:
            job = queue.popleft()
            for buffer in job.buffers:
                buffer._untrack(job)
            self.telemetry.dispatches_failed += 1
            dispatch = f"dispatch #{job.id} of {job.call.kernel.name!r}"
            job.pending._set_exception(BackendClosedError(f"backend {self.name} {why(dispatch)}"))
        if self._drained is not None:
            self._check_drained()

    def _transfer_ended(self) -> None:
        self._transfers -= 1
        if self._drained is not None:
            self._check_drained()

    def _check_drained(self) -> None:
        drained = self._drained
        if drained is None or self._in_flight or self._queue or self._transfers:
            return
        if not drained.done():
            drained.set_result(None)

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        """The backend's loop has ended: belong to *loop*; the close settles what it left."""
        ended = self._event_loop
        with _inbox.off_loop_lock:  # completions may be handled on worker threads meanwhile
            self._room = _loop.WaitQueue()  # its waiters were on the ended loop
            self._begin_closing()
            self._close_task = None  # a close begun there never goes on
            self._drained = None
            self._transfers = 0  # uploads and downloads of that loop never resume
            self._drop_queued(
                lambda job: f"was left open when its event loop ended, before {job} started"
            )
        self._loop = loop
        return ended

    async def _settle_after(self, ended: asyncio.AbstractEventLoop) -> None:
        """Wait for the dispatches the ended loop left in flight (hook; runs on the new loop).

        Host workers post their completions to inboxes, which handle them on the workers'
        threads once the loop is closed: wait for those in a thread of the new loop.
        """
        _inbox.settle(ended)
        with _inbox.off_loop_lock:
            left = [job.pending for job in self._in_flight.values()]
        if left:
            await self._event_loop.run_in_executor(None, _wait_all, left)

    async def _close(self, ended: asyncio.AbstractEventLoop | None) -> None:
        # Every step may be interrupted by the end of the loop, and is then started again.
        try:
            if ended is not None:
                await _loop.through_run_end(lambda: self._settle_after(ended))
            if self._in_flight or self._queue or self._transfers:
                drained = self._drained = self._event_loop.create_future()
                await _loop.through_run_end(lambda: _loop.shield(drained))
            self._store.close_all()
            await _loop.through_run_end(self._shutdown)
        except GeneratorExit:
            raise  # collected with the ended loop it ran on; a close on another loop goes on
        except BaseException:
            self._closed()
            raise
        self._closed()

    def _closed(self) -> None:
        self._state = _CLOSED
        snap = self.telemetry
        self._log.info(
            "backend.closed",
            dispatches=snap.dispatches,
            completed=snap.dispatches_completed,
            failed=snap.dispatches_failed,
        )

    def __await__(self) -> Generator[Any, None, NoReturn]:
        """``await open_backend()`` is a mistake: it raises, and closes a backend not yet used.

        Raises:
            UnsupportedError: always.
        """
        if self._state == _OPEN and not self.telemetry.dispatches and not len(self._store):
            self._state = _CLOSING  # the caller cannot reach it: leave nothing open
            self._store.close_all()
            self._shutdown_now()
            self._closed()
        raise UnsupportedError(
            "open_backend() is not awaitable; use 'async with asyncgraph.open_backend(...) as "
            "backend:'"
        )

    async def __aenter__(self) -> Backend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __del__(self) -> None:
        if getattr(self, "_state", _CLOSED) != _CLOSED:
            warnings.warn(
                f"backend {self.name} was not closed; use 'async with' or 'await aclose()'",
                ResourceWarning,
                stacklevel=1,
                source=self,
            )
            with contextlib.suppress(Exception):
                self._release_unclosed()

    # -- hooks for concrete backends -----------------------------------------------------------

    def _prepare(self, call: BoundCall, timing: bool) -> Job:
        """Check backend-specific rules and make the job (sync, before submission)."""
        return Job(call, timing)

    @abc.abstractmethod
    def _start(self, job: Job) -> None:
        """Submit *job*; call ``self._complete(job, ...)`` on the loop's thread when done."""

    @abc.abstractmethod
    async def _upload_storage(self, array: np.ndarray[Any, Any]) -> Any:
        """Make resident storage holding a copy of *array*."""

    @abc.abstractmethod
    def _alloc_storage(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """Make uninitialised resident storage."""

    @abc.abstractmethod
    async def _download_storage(
        self,
        buffer: ResidentBuffer,
        use: Use,
        deps: list[Use],
        out: np.ndarray[Any, Any] | None,
    ) -> np.ndarray[Any, Any]:
        """Copy *buffer* out (as *use*, into *out* if given) after the uses in *deps*."""

    @abc.abstractmethod
    def _free_storage(self, storage: Any) -> None:
        """Free resident storage (called once all uses completed)."""

    @abc.abstractmethod
    async def _shutdown(self) -> None:
        """Release every backend resource; no work is in flight.

        The end of the loop may interrupt it at an ``await``; it is then called again, so
        every step must be safe to repeat.
        """

    def _shutdown_now(self) -> None:
        """Release every backend resource without a loop; nothing was ever used (hook)."""
        self._release_unclosed()

    def _release_unclosed(self) -> None:  # noqa: B027  # optional hook, empty by default
        """Best-effort release of a backend dropped without closing (from ``__del__``)."""


def _check_timeout(timeout: object) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"aclose(timeout={timeout!r}): pass a number of seconds, or None")
    if not float(timeout) >= 0:  # NaN too
        raise ValueError(f"aclose(timeout={timeout!r}): pass a number of seconds >= 0, or None")


def _wait_all(pendings: list[PendingDispatch]) -> None:
    """Block until every dispatch in *pendings* completed (in a worker thread)."""
    for pending in pendings:
        pending.exception()


def _parse_device(device: object) -> tuple[str, int]:
    """``"auto"``, ``"host"``, ``"cuda"``, ``"cuda:N"`` or ``N`` -> (kind, ordinal)."""
    if isinstance(device, int) and not isinstance(device, bool):
        return ("cuda", device)
    if isinstance(device, str):
        text = device.strip().lower()
        if text in ("auto", "host", "cuda"):
            return (text, 0)
        if text.startswith("cuda:") and text[5:].isdigit():
            return ("cuda", int(text[5:]))
    raise DeviceUnavailableError(
        f"device={device!r} is not a device asyncgraph knows; pass 'auto', 'host', 'cuda', "
        "'cuda:N' or an int N"
    )


def open_backend(
    device: str | int = "auto", *, options: BackendOptions | None = None, **option_kwargs: Any
) -> Backend:
    """Open a backend: a CUDA device, or the host.

    Args:
        device: ``"auto"`` (the first CUDA device if a driver and a device are present, else
            the host backend, saying why in a ``backend.selected`` debug event), ``"cuda"``,
            ``"cuda:N"`` or ``N`` (that CUDA device), or ``"host"``.
        options: a :class:`BackendOptions`.
        **option_kwargs: or its fields as keywords (``streams=8``); not both.

    Returns:
        The backend. Use it with ``async with`` or close it with ``await backend.aclose()``.

    Raises:
        DeviceUnavailableError: CUDA was asked for and no driver or device (or not that one)
            was found, or *device* is not a known form.
        TypeError: both *options* and keywords were given, or an unknown keyword.
    """
    from ._detect import probe_cuda

    if options is not None and option_kwargs:
        raise TypeError("pass either options=BackendOptions(...) or its fields as keywords")
    opts = options if options is not None else BackendOptions(**option_kwargs)
    kind, ordinal = _parse_device(device)
    if kind in ("auto", "cuda"):
        probe = probe_cuda()
        if not probe.available:
            if kind == "cuda":
                raise DeviceUnavailableError(
                    f"device={device!r} needs CUDA, but {probe.reason}; "
                    "use device='auto' or 'host' to run on the host backend"
                )
            logger.debug("backend.selected", device="host", reason=probe.reason)
            kind = "host"
        elif ordinal >= len(probe.devices):
            raise DeviceUnavailableError(
                f"device={device!r}: there is no CUDA device {ordinal}; {len(probe.devices)} found"
            )
        else:
            from ._cuda import CudaBackend

            return CudaBackend(ordinal, opts)
    from ._host import HostBackend

    return HostBackend(opts)
