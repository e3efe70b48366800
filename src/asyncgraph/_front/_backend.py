"""The front of every backend: what a user touches, and nothing of how it runs.

:class:`Backend` validates, numbers dispatches and hands them to its
:class:`~asyncgraph._front._dispatcher.Dispatcher` (the scheduler and its effects); it owns the
resident buffers, the bounded queue's waiting room, telemetry and closing. How work runs —
compiling, staging, launching, collecting, resident storage — belongs to an
:class:`~asyncgraph._front._engine_protocols.Engine` it is composed with (the CUDA engine in
``asyncgraph._cuda``, the host engine in ``_host._host_backend``). The part of its API only an
engine can do (graphs: ``record``, ``capture``; stream leases: ``stream``; other libraries'
work: ``wait``, ``order``) it validates too, then hands to the engine's streams and graphs (the
host engine refuses all of it with ``UnsupportedError``, saying what to do instead).
``open_backend`` lives in ``_open``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import warnings
from collections.abc import Awaitable, Callable, Generator
from contextlib import AbstractAsyncContextManager
from functools import partial
from time import perf_counter
from typing import TYPE_CHECKING, Any, Final, NoReturn, cast

import numpy as np

from asyncgraph._args._kernel import check_kernel
from asyncgraph._buffers._resident import ResidentBuffer, discard
from asyncgraph._jobs._pending import PendingDispatch, set_withdraw
from asyncgraph._jobs._scheduler import Job, track_buffers
from asyncgraph._runtime import _loop
from asyncgraph._runtime._exceptions import (
    ArgumentTypeError,
    DeviceFaultError,
    QueueFullError,
    UnsupportedError,
)
from asyncgraph._runtime._priority import NORMAL, RANKS
from asyncgraph._runtime._resource import AsyncResource
from asyncgraph._runtime._telemetry import logger

from ._lifecycle import CLOSED, OPEN, Lifecycle
from ._resident_api import ResidentBuffers
from ._steering import Steering
from ._wiring import assemble

if TYPE_CHECKING:
    from asyncgraph._args._arguments import LaunchLimits
    from asyncgraph._args._bound_args import BoundCall
    from asyncgraph._args._kernel import Kernel

    from ._engine_protocols import Engine, Links
    from ._lease import StreamLease
    from ._options import BackendOptions

__all__ = ("Backend",)

_NEVER: Final = "never"
_GRAPH_CHOICES: Final = (_NEVER, "auto", "always")


class Backend(ResidentBuffers, AsyncResource):
    """A place to run kernels: a CUDA device, or the host in worker threads.

    Open one with :func:`asyncgraph.open_backend`. A backend is an async resource: use
    ``async with`` or ``await backend.aclose()``. It belongs to the event loop it is first used
    on.

    Attributes:
        name: ``"cuda:0"``, ``"host"``...
        options: the :class:`BackendOptions` it was opened with.
        telemetry: its counters; ``backend.telemetry.snapshot()`` reads them.
        on_close: ``on_close(hook)`` calls ``hook()`` as the first ``aclose()`` begins, while
            the backend still takes work; it returns a function that unregisters the hook
            (anything but a callable is refused with :class:`ArgumentTypeError`).
        call_in_turn: ``call_in_turn(fn)`` calls ``fn(None)`` once a dispatch finds room in
            the queue, in line with ``submit()`` (``fn(error)`` if the backend closes first);
            it returns a function that gives the place up. A batcher's batches wait so.
    """

    def __init__(
        self, name: str, options: BackendOptions, make_engine: Callable[[Links], Engine[Any]]
    ) -> None:
        # In dependency order (``_wiring``); the engine may refuse before anything opens.
        self.name = name
        self.options = options
        self._life: Lifecycle | None = None  # until the engine exists: nothing to close
        log = self._log = logger.bind(device=name)
        self._ids = itertools.count(1)
        self._max_queued = options.max_queued or sys.maxsize
        steer = self._steer = Steering(options)  # checked before anything opens
        parts = assemble(
            name,
            options,
            make_engine,
            log=log,
            ids=self._ids,
            counts=self._counts,
            bind_call=self._bind_like,
            run_prepared=self._run_prepared,
            loop_of=lambda: self._lifecycle.loop,
        )
        self.telemetry = parts.telemetry
        self._dispatcher = parts.dispatcher
        engine = self._engine = parts.engine
        self._scheduler = parts.dispatcher.scheduler
        self.kind = engine.kind
        self._store = parts.store
        life = self._life = parts.life
        self.on_close = life.on_close  # hooks run as aclose() begins (a batcher's flush)
        self.call_in_turn = life.call_in_turn  # submit()'s wait with no task (a batch's)
        self._transfers = parts.transfers
        ResidentBuffers.__init__(
            self, parts.transfers, self._new_resident, engine.host_array, self._loop_for_use
        )
        # The steady state of dispatch() in one call (CUDA): for dispatches of the default
        # class alone, without deadline or span.
        self._fast = parts.fast if steer.plain else None
        self._plans = parts.plans

    # -- state ---------------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """Whether ``aclose()`` was called (the backend may still be finishing work)."""
        return self._lifecycle.state != OPEN

    @property
    def tracer(self) -> Any:
        """The OpenTelemetry tracer of this backend's dispatch spans, or ``None`` (no spans:
        ``BackendOptions.tracer_provider``, ``docs/jobs.md``)."""
        return self._steer.tracer

    @property
    def failure(self) -> DeviceFaultError | None:
        """The device fault that failed this backend, or ``None`` while it is healthy."""
        return self._engine.failure

    @property
    def limits(self) -> LaunchLimits:
        """The launch limits ``dispatch()`` checks grid, block and ``shared_mem`` against."""
        return self._engine.limits

    @property
    def outstanding(self) -> int:
        """Dispatches in flight or queued (a device group places new ones by it)."""
        return self._scheduler.in_flight + self._scheduler.queued

    def holds(self, buffer: ResidentBuffer) -> bool:
        """Whether *buffer* was made by this backend (it may be closed since); anything but a
        resident buffer raises ArgumentTypeError."""
        return self._store.holds(buffer)

    def __repr__(self) -> str:
        state = ("open", "closing", "closed")[self._lifecycle.state]
        if self._engine.failure is not None:
            state = "failed"
        return (
            f"<{type(self).__name__} {self.name} {state} "
            f"in_flight={self._scheduler.in_flight} queued={self._scheduler.queued} "
            f"buffers={len(self._store)}>"
        )

    @property
    def _lifecycle(self) -> Lifecycle:
        return cast(Lifecycle, self._life)  # made in __init__ once the engine exists

    def _counts(self) -> tuple[int, int]:
        return self._scheduler.in_flight, self._scheduler.queued

    def _loop_for_use(self) -> asyncio.AbstractEventLoop:
        # self._life directly (not the property): this runs on every call of the API.
        return self._life.loop_for_use(self._engine.failure)  # type: ignore[union-attr]  # set in __init__

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
        after: object = None,
        priority: str | None = None,
        queue_timeout: float | None = None,
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
            graph: ``"never"`` (launch it), ``"auto"`` (once the signature repeated, measure
                eager dispatches against replays of a recorded CUDA graph, then keep to the
                cheaper) or ``"always"`` (record on first sight); see ``docs/graphs.md``.
                The host backend has no graphs; ``timing=True`` dispatches run without one.
            after: a CUDA stream or event of another library (see :meth:`wait`), or a list of
                them: the dispatch runs after the work enqueued on them before this call,
                ordered on the GPU, with no host round trip (CUDA backend).
            priority: its class, ``"high"``, ``"normal"`` or ``"low"``: queued dispatches start
                in class order, and on CUDA each class has streams of its CUDA priority;
                ``None``: ``BackendOptions.default_priority`` (``docs/jobs.md``).
            queue_timeout: seconds it may wait for an in-flight slot; then it is withdrawn and
                fails with :class:`QueueTimeoutError`. ``None``: ``BackendOptions.queue_timeout``;
                ``math.inf``: no bound.

        Returns:
            A :class:`PendingDispatch`; ``await`` it for one result per ``Out``/``InOut``.

        Raises:
            DispatchError: an argument or the launch shape is invalid; nothing was started.
            StaleBufferError: a resident buffer is closed or from another backend.
            QueueFullError: ``BackendOptions.max_queued`` dispatches are queued already; nothing
                was started (:meth:`submit` waits for room instead).
            UnsupportedError: the backend cannot run this (e.g. no ``host=`` on the host
                backend, or ``after=`` there), or the call is not on the backend's event loop.
            BackendClosedError: the backend is closed.
            DeviceFaultError: the backend failed earlier with a device fault.
        """
        fast = self._fast
        if fast is not None and after is None and queue_timeout is None:
            if priority is None:  # the backend's default class, the default one (steer.plain)
                pending = fast(kernel, args, grid, block, shared_mem, timing, graph)
            elif type(priority) is str and priority in RANKS:
                rank = RANKS[priority]
                pending = fast(kernel, args, grid, block, shared_mem, timing, graph, rank)
            else:
                pending = None  # the general path says what is wrong with it
            if pending is not None:
                return pending
        started = 0.0 if graph is _NEVER else perf_counter()  # where "auto" measures from
        loop = self._loop_for_use()
        if self._scheduler.queued >= self._max_queued:
            raise QueueFullError(
                f"backend {self.name} has {self._scheduler.queued} dispatches queued already "
                f"(BackendOptions.max_queued={self._max_queued}); nothing was started — use "
                "'await backend.submit(...)' to wait for room instead"
            )
        if not isinstance(timing, bool):
            raise ArgumentTypeError(f"timing={timing!r}; pass True or False")
        if graph not in _GRAPH_CHOICES:
            raise ArgumentTypeError(f"graph={graph!r}; pass 'never', 'auto' or 'always'")
        rank, timeout = self._steer.resolve(priority, queue_timeout, "dispatch()")
        call = self._plans.bind(kernel, args, grid, block, shared_mem, True)
        if call.fresh is not None:  # Out(..., resident=True): make the buffers now
            call.make_buffers(self._new_resident, discard)
        try:
            job: Job | None = None
            if graph != "never" and not timing:
                plain = self._steer.plain and rank == NORMAL and timeout is None
                inline = after is None and plain
                chosen = self._engine.graph_job(call, graph == "always", started, inline)
                if isinstance(chosen, PendingDispatch):
                    return chosen  # a replay the engine launched already
                job = chosen
            if job is None:
                job = self._engine.prepare(call, timing)
        except BaseException:
            call.discard_buffers(discard)  # nothing started: give them back
            raise
        if after is not None:
            try:
                self._engine.fence(job, after)
            except BaseException:
                self._engine.release(job)
                call.discard_buffers(discard)
                raise
        job.priority = rank
        return self._enqueue_job(job, loop, timeout)

    def _enqueue_job(
        self, job: Job, loop: asyncio.AbstractEventLoop, timeout: float | None = None
    ) -> PendingDispatch:
        """Number *job*, order it after the uses of its buffers, and schedule it (withdrawn
        if it waits *timeout* seconds for a slot)."""
        job.id = dispatch_id = next(self._ids)
        pending = job.pending = PendingDispatch(loop, dispatch_id, job.call.kernel.name)
        job.t_dispatch = perf_counter()
        if job.call.resident:
            track_buffers(job)
        self.telemetry.count("dispatches")
        self._steer.start_span(job, self.name)
        set_withdraw(pending, partial(self._dispatcher.withdraw, job))
        self._dispatcher.add(job, timeout)
        return pending

    async def submit(
        self,
        kernel: Kernel,
        *args: object,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        shared_mem: int = 0,
        timing: bool = False,
        graph: str = "never",
        after: object = None,
        priority: str | None = None,
        queue_timeout: float | None = None,
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
        room = self._lifecycle.room
        if room or self._scheduler.queued >= self._max_queued:
            await room.wait(loop)
            while self._scheduler.queued >= self._max_queued:  # a dispatch() took it first
                await room.wait(loop, first=True)
        try:
            return self.dispatch(
                kernel,
                *args,
                grid=grid,
                block=block,
                shared_mem=shared_mem,
                timing=timing,
                graph=graph,
                after=after,
                priority=priority,
                queue_timeout=queue_timeout,
            )
        finally:
            if room and self._scheduler.queued < self._max_queued:
                room.wake()  # room for the next one too (or this one was refused)

    async def compile(self, kernel: Kernel) -> None:
        """Prepare *kernel* now, so its first dispatch does not wait (CUDA: NVRTC and loading).

        Raises:
            ArgumentTypeError: *kernel* is not an :class:`asyncgraph.Kernel`.
            CompileError: the kernel does not compile (CUDA backend).
            UnsupportedError: the host backend got a kernel without ``host=``.
        """
        self._loop_for_use()
        check_kernel(kernel, "compile()")
        self._engine.check_kernel(kernel)
        await self._engine.compile(kernel)

    # -- resident buffers ----------------------------------------------------------------------

    def _new_resident(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> ResidentBuffer:
        return self._store.add(self._engine.alloc_storage(shape, dtype), shape, dtype)

    async def copy(self, buffer: ResidentBuffer, to: Backend | None = None) -> ResidentBuffer:
        """A new resident buffer holding a copy of *buffer* (which lives on this backend), on
        *to* (another backend on this event loop), or on this one.

        The copy reads what the dispatches in flight that write *buffer* wrote, and dispatches
        that write *buffer* later wait for it. Between CUDA backends (or within one) the bytes
        never leave the devices: a device-to-device copy, peer to peer between two GPUs where
        they allow it (``cuMemcpyPeerAsync``); any other pair copies through host memory.

        Raises:
            StaleBufferError: the buffer is closed or lives on another backend.
            ArgumentTypeError: *to* is not a backend.
            BackendClosedError: this backend or *to* is closed (or was, during the copy).
            DeviceFaultError: either device failed.
        """
        self._loop_for_use()
        target = self if to is None else to
        if not isinstance(target, Backend):
            raise ArgumentTypeError(f"copy(..., to={to!r}): pass a backend, or nothing")
        target._loop_for_use()
        return await self._transfers.copy(buffer, target._transfers)

    def copy_route(self, to: Backend) -> str:
        """How :meth:`copy` moves a buffer of this backend to *to*: ``"device"`` (one context),
        ``"peer"`` (two GPUs, directly over their link), ``"staged"`` (two GPUs that cannot
        reach each other's memory: through host memory) or ``"host"`` (a host backend on
        either side). Between GPUs the first call (or copy) gives *to*'s device the access the
        devices allow to this one's memory, once per pair (``docs/scale-out.md``).

        Raises:
            ArgumentTypeError: *to* is not a backend.
            BackendClosedError, DeviceFaultError: either backend is closed, or failed.
        """
        self._loop_for_use()
        if not isinstance(to, Backend):
            raise ArgumentTypeError(f"copy_route({to!r}): pass a backend")
        to._loop_for_use()
        return self._transfers.route(to._transfers)

    def _bind_like(
        self,
        kernel: Kernel,
        args: tuple[object, ...],
        grid: object,
        block: object,
        shared_mem: object,
    ) -> BoundCall:
        """Validate *args* for the engine's graphs and captures (the backend must be open)."""
        self._loop_for_use()
        return self._plans.bind(kernel, args, grid, block, shared_mem, False)

    async def _run_prepared(self, job: Job) -> Any:
        """Run a job prepared outside ``dispatch()`` (a graph replay) and return its result."""
        try:
            pending = self._enqueue_job(job, self._loop_for_use())
        except BaseException:
            self._engine.release(job)
            raise
        return await pending

    # -- graphs ---------------------------------------------------------------------------------

    async def record(
        self,
        kernel: Kernel,
        *args: object,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        shared_mem: int = 0,
    ) -> Any:
        """Record one dispatch as a CUDA graph to replay (CUDA backend); see ``docs/graphs.md``.

        Returns:
            A :class:`~asyncgraph.capture.CachedGraph`.

        Raises:
            UnsupportedError: the backend has no CUDA graphs (the host backend).
        """
        self._loop_for_use()
        return await self._engine.record(kernel, args, grid, block, shared_mem)

    def capture(
        self, mode: object = "thread_local", *, into: object = None
    ) -> AbstractAsyncContextManager[Any]:
        """Capture dispatches on resident buffers into a CUDA graph (CUDA backend).

        See ``docs/graphs.md`` and the CUDA backend's ``capture``.

        Args:
            mode: the capture mode: ``"thread_local"``, ``"global"`` or ``"relaxed"``.
            into: a :class:`~asyncgraph.capture.CapturedGraph` of this backend to capture into
                again: it runs what this capture records from then on (``cap.graph`` is it),
                its executable graph updated in place where the capture has the same nodes
                (``cuGraphExecUpdate``), else replaced by a new one.

        Raises:
            UnsupportedError: the backend has no CUDA graphs (the host backend).
            ArgumentTypeError: *into* is not a ``CapturedGraph``.
            BackendClosedError: *into* is closed.
            DispatchError: *into* belongs to another backend.
        """
        self._loop_for_use()
        return self._engine.capture(mode, into)

    # -- streams --------------------------------------------------------------------------------

    def stream(self) -> AbstractAsyncContextManager[StreamLease]:
        """Lease one of the backend's CUDA streams for work other libraries enqueue.

        ``async with backend.stream() as lease:`` waits (FIFO, cancellation-safe) for a stream
        no one else leases; no dispatch is placed on it meanwhile, and it is given back at the
        end. ``lease.handle`` is the ``CUstream`` as an int, ``lease`` has
        ``__cuda_stream__``, and ``await lease.synchronize()`` waits for the work enqueued so
        far without blocking the loop. ``aclose()`` waits for leases to end before it destroys
        the streams. See :class:`StreamLease`; to await work on a stream you already have,
        :meth:`wait` needs no lease.

        Raises:
            UnsupportedError: the backend has no CUDA streams (the host backend).
            BackendClosedError: the backend is closed.
        """
        self._loop_for_use()
        return self._engine.stream()

    def wait(self, work: object) -> Awaitable[None]:
        """Await the work enqueued so far on a CUDA stream you own, or up to a CUDA event.

        ``await backend.wait(torch.cuda.current_stream())`` returns once the GPU finished what
        PyTorch enqueued on that stream before the call, and the event loop serves other tasks
        meanwhile. The wait is taken when ``wait()`` is called (one of the backend's pooled
        events is recorded on the stream then), not when it is awaited. Any number can be
        awaited at once; no stream is leased.

        Args:
            work: a stream: anything with ``__cuda_stream__`` (a ``cuda.core`` ``Stream``, a
                stream lease, CuPy's streams), a ``torch.cuda.Stream``, a
                ``cupy.cuda.Stream``, a ``CUstream`` or a stream handle as an ``int`` (``0``:
                the legacy default stream); or an event: ``torch.cuda.Event``,
                ``cupy.cuda.Event``, a ``cuda.core`` ``Event`` or a ``CUevent``, recorded.

        Returns:
            An awaitable (a future of the backend's loop) that gives ``None``. Cancelling the
            task that awaits it stops nothing on the GPU; the backend's event goes back to its
            pool once the work completed, and ``aclose()`` waits for it.

        Raises:
            ArgumentTypeError: *work* is not a stream or event (or an event never recorded).
            DispatchError: the stream belongs to another CUDA context or device.
            UnsupportedError: the host backend has no CUDA streams.
            BackendClosedError: the backend is closed.
            DeviceFaultError: the device failed earlier, or (from the await) the work faulted.
        """
        self._loop_for_use()
        return self._engine.wait_foreign(work)

    async def order(self, stream: object, *, after: PendingDispatch) -> None:
        """Make *stream* (yours: PyTorch's, CuPy's...) wait on the GPU for the dispatch
        *after*, without a host round trip: work you enqueue on *stream* once this returned
        runs after the dispatch's kernel and copies.

        If the dispatch has not been launched yet (it is queued, or its kernel compiles), this
        waits, without blocking the loop, until it completed instead. The other way round,
        ``dispatch(..., after=stream)`` orders a dispatch after a stream's work.

        Args:
            stream: a stream of this backend's device and context (see :meth:`wait`).
            after: a :class:`PendingDispatch` of this backend.

        Raises:
            ArgumentTypeError: *after* is not a pending dispatch, or *stream* not a stream.
            DispatchError: the stream belongs to another CUDA context or device.
            UnsupportedError: the host backend has no CUDA streams.
            BackendClosedError: the backend is closed.
        """
        loop = self._loop_for_use()
        if not isinstance(after, PendingDispatch):
            raise ArgumentTypeError(
                f"order(stream, after=...) takes a PendingDispatch, got {type(after).__name__}"
            )
        job = self._scheduler.admitted(after.dispatch_id)
        if job is not None and job.pending is not after:
            job = None  # a dispatch of another backend with the same number
        # Checks the stream first; orders it after a launched dispatch (True), or finds that
        # the dispatch has no event yet (False: it has not been launched).
        if self._engine.order_foreign(stream, job) and (job is not None or after.done()):
            return
        finished: asyncio.Future[None] = loop.create_future()

        def done(_pending: PendingDispatch) -> None:
            if not finished.done():
                finished.set_result(None)

        after.add_done_callback(done)
        await finished

    # -- closing -------------------------------------------------------------------------------

    async def aclose(self, timeout: float | None = None) -> None:  # noqa: ASYNC109  # the timeout fails queued work; cancelling a shielded close cannot
        """Finish the work in flight, then free everything the backend holds.

        New work is refused from the first call on. Idempotent, and shielded from cancellation:
        a cancelled ``aclose()`` still completes in the background, also when the event loop
        ends meanwhile (``asyncio.run`` and ``trio.run`` wait for it).

        Close a backend on its own event loop. Once that loop has ended (closed), any loop may
        close it: the work the old loop left in flight is waited for first.

        Args:
            timeout: seconds to wait for dispatches still queued (not yet submitted). After
                it, they fail with :class:`BackendClosedError`, and a ``backend.close_waits``
                warning names the dispatches still running. Work already submitted always runs
                to completion first, since its memory cannot be freed before.

        Raises:
            ArgumentTypeError: *timeout* is not a number of seconds (a ``TypeError``).
            DispatchError: *timeout* is negative or NaN (a ``ValueError``).
            UnsupportedError: the backend's event loop is another one, and still open.
        """
        await self._lifecycle.aclose(timeout)

    def __await__(self) -> Generator[Any, None, NoReturn]:
        """``await open_backend()`` is a mistake: it raises, and closes a backend not yet used.

        Raises:
            UnsupportedError: always.
        """
        life = self._lifecycle
        if life.state == OPEN and not self.telemetry.snapshot().dispatches and not len(self._store):
            life.close_unused()  # the caller cannot reach it: leave nothing open
        raise UnsupportedError(
            "open_backend() is not awaitable; use 'async with asyncgraph.open_backend(...) as "
            "backend:'"
        )

    def __del__(self) -> None:
        life = getattr(self, "_life", None)
        if life is not None and life.state != CLOSED:
            warnings.warn(
                f"backend {self.name} was not closed; use 'async with' or 'await aclose()'",
                ResourceWarning,
                stacklevel=1,
                source=self,
            )
            with contextlib.suppress(Exception):
                life.release_unclosed()
