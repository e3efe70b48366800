"""The part of the backend's front that deals in CUDA streams, events and graphs.

:class:`StreamsAndGraphs` is the half of :class:`~asyncgraph.Backend`'s public API whose work
the engine alone can do: graphs (``record``, ``capture``), stream leases (``stream``), and other
libraries' work (``wait``, ``order``). Like the rest of the front it validates what it can, then
hands over to the engine (``asyncgraph.cuda``; the host engine refuses all of it with
``UnsupportedError``, saying what to do instead).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from asyncgraph._exceptions import ArgumentTypeError
from asyncgraph.jobs._pending import PendingDispatch

if TYPE_CHECKING:
    from asyncgraph.args._kernel import Kernel
    from asyncgraph.jobs._scheduler import Job

    from ._engine_protocols import Streams
    from ._lease import StreamLease

__all__ = ("StreamsAndGraphs",)


class StreamsAndGraphs:
    """Graphs, stream leases and other libraries' CUDA work: the half of ``Backend``'s API
    that the engine alone can do. ``Backend`` is made on it, first thing in its constructor;
    what it holds is its own.

    Args:
        streams: the engine's side of this work (:class:`~._engine_protocols.Streams`), which
            the host engine refuses.
        admitted: the backend's dispatch of an id (``Scheduler.admitted``), for :meth:`order`.
        for_use: the backend's check on every call of the API: the loop it belongs to, or the
            error of a closed or failed backend.
    """

    def __init__(
        self,
        streams: Streams,
        admitted: Callable[[int], Job | None],
        for_use: Callable[[], asyncio.AbstractEventLoop],
    ) -> None:
        self._streams = streams
        self._admitted = admitted
        self._for_use = for_use

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
        self._for_use()
        return await self._streams.record(kernel, args, grid, block, shared_mem)

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
        self._for_use()
        return self._streams.capture(mode, into)

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
        self._for_use()
        return self._streams.stream()

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
        self._for_use()
        return self._streams.wait_foreign(work)

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
        loop = self._for_use()
        if not isinstance(after, PendingDispatch):
            raise ArgumentTypeError(
                f"order(stream, after=...) takes a PendingDispatch, got {type(after).__name__}"
            )
        job = self._admitted(after.dispatch_id)
        if job is not None and job.pending is not after:
            job = None  # a dispatch of another backend with the same number
        # Checks the stream first; orders it after a launched dispatch (True), or finds that
        # the dispatch has no event yet (False: it has not been launched).
        if self._streams.order_foreign(stream, job) and (job is not None or after.done()):
            return
        finished: asyncio.Future[None] = loop.create_future()

        def done(_pending: PendingDispatch) -> None:
            if not finished.done():
                finished.set_result(None)

        after.add_done_callback(done)
        await finished
