"""The CUDA engine's graphs: ``record``, ``capture``, the graph cache, and their host.

:class:`Graphs` is the :class:`~asyncgraph.capture._graph_host.GraphHost` the graphs of
``asyncgraph.capture`` talk to; it owns the capture stream, the capture lock, the graph cache
and the open graphs (closed with the backend).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.bindings import driver as drv

from asyncgraph._args._bound_args import NOT_STAGED, BoundCall
from asyncgraph._cuda.core._choose import core
from asyncgraph._cuda.driver._driver import SUCCESS, error_for, translate
from asyncgraph._cuda.lanes._staging_plan import STREAM_MIN, CudaJob, plan
from asyncgraph._runtime import _loop
from asyncgraph._runtime._exceptions import (
    ArgumentTypeError,
    BackendClosedError,
    CaptureError,
    DispatchError,
)
from asyncgraph.capture._cache import GraphCache
from asyncgraph.capture._captured import (
    CapturedGraph,
    RecordedDispatch,
    captured_graph,
    recaptured,
    recorded_again,
    repeated,
    reuse_for,
)
from asyncgraph.capture._graphs import CachedGraph, kernel_config, record_graph
from asyncgraph.capture._guard import CaptureGuard, CaptureLock, CaptureMode

if TYPE_CHECKING:
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._buffers._resident import ResidentBuffer
    from asyncgraph._cuda.launch._kernel_launch import Launches
    from asyncgraph._cuda.launch._kernel_loading import Kernels
    from asyncgraph._cuda.memory._storage import Storage
    from asyncgraph._front._engine_protocols import Links
    from asyncgraph._runtime._telemetry import Telemetry
    from asyncgraph.capture._choice import Choice
    from asyncgraph.capture._graph_host import KernelNode
    from asyncgraph.pool import HostPool

    from .device._cuda_device import Device

__all__ = ("CAPTURE_HOLD", "Graphs")

# ``cap.dispatch`` records without yielding to the loop until the capturing task held it this
# long: a loop turn per recorded dispatch was most of what capturing 50 of them again cost.
CAPTURE_HOLD = 200e-6


class Graphs:
    """Recorded and captured graphs of one device (the capture package's host)."""

    def __init__(
        self,
        device: Device,
        launches: Launches,
        kernels: Kernels,
        storage: Storage,
        front: Links,
    ) -> None:
        from cuda.core import StreamOptions

        self._device = device
        self._fast: Any = None  # the engine's fast path (compiled core), while it has one
        # See GraphHost.replay_fast: the fast path's own replay while there is one (served()),
        # called directly, without a call of ours in between.
        self.replay_fast: Callable[..., Awaitable[Any] | None] = _no_fast_replay
        self._launches = launches
        self._kernels = kernels
        self._storage = storage
        self._front = front  # its bind_call and run_prepared: what graphs and captures run
        self.pinned: HostPool = device.pinned
        self.telemetry: Telemetry = device.telemetry
        # Graphs are captured on a stream of their own, which nothing else uses.
        self.capture_stream = device.device.create_stream(options=StreamOptions(nonblocking=True))
        self.capture_handle = drv.CUstream(int(self.capture_stream.handle))
        self.ctx = device.ctx
        self.lock = CaptureLock()
        self._open: set[Any] = set()  # open CachedGraph / CapturedGraph, closed at aclose
        options = device.options
        self.cache = GraphCache(
            self, options.graph_cache_bytes, options.graph_repeats, options.streams
        )
        # Dispatches moving more bytes stream, and are never recorded.
        self.stream_above = max(options.pinned_pool_bytes, STREAM_MIN)

    # -- recording -------------------------------------------------------------------------------

    async def record(
        self,
        kernel: Kernel,
        args: tuple[object, ...],
        grid: object,
        block: object,
        shared_mem: object,
    ) -> CachedGraph:
        """Record one dispatch as graphs (``backend.record``); see the CUDA backend."""
        call = self._front.bind_call(kernel, args, grid, block, shared_mem)
        for arg in call.args:
            if arg.foreign:
                raise DispatchError(
                    f"args[{arg.index}] of {kernel.name!r} is a device array of another library; a "
                    "recorded graph takes numpy arrays, scalars and resident buffers (wrap it "
                    "in a resident buffer with backend.upload, or capture with backend.capture)"
                )
        if not self._launches.is_loaded(kernel):
            await self._kernels.load(kernel)
        async with self.lock:
            return self._record_locked(call)

    def record_now(self, call: BoundCall) -> CachedGraph | None:
        """Record *call* now if the kernel is loaded and no other capture runs (graph cache)."""
        device = self._device
        if not self._launches.is_loaded(call.kernel) or device.failure is not None:
            return None
        if not self.recordable(call):
            return None
        if not self.lock.try_acquire():
            return None
        try:
            return self._record_locked(call)
        except Exception as exc:
            device.log.warning("graph.record_failed", kernel=call.kernel.name, error=repr(exc))
            return None
        finally:
            self.lock.release()

    def recordable(self, call: BoundCall) -> bool:
        """See :meth:`GraphHost.recordable`."""
        return call.bytes_in + call.bytes_out <= self.stream_above

    def eager_job(self, call: BoundCall) -> CudaJob:
        """See :meth:`GraphHost.eager_job`."""
        return plan(call, False, self.pinned, self.stream_above)

    def sample(self, job: Any, choice: Choice, started: float) -> None:
        """Report *job*'s cost from *started* to *choice* when it completes (``SmallPath``)."""
        job.measure(choice, started)

    def _record_locked(self, call: BoundCall) -> CachedGraph:
        self._device.check_healthy()
        graph = record_graph(self, call)
        self._open.add(graph)
        return graph

    # -- capturing ---------------------------------------------------------------------------------

    def capture(self, mode: object, into: object) -> AbstractAsyncContextManager[Capture]:
        """``async with backend.capture() as cap``; see the CUDA backend.

        Raises:
            CaptureError: *mode* is not a capture mode.
            ArgumentTypeError: *into* is not a ``CapturedGraph``.
            BackendClosedError: *into* is closed.
            DispatchError: *into* is another backend's.
        """
        parsed = CaptureMode.parse(mode)
        if into is not None:
            if not isinstance(into, CapturedGraph):
                raise ArgumentTypeError(
                    f"capture(into=...) takes a CapturedGraph (cap.graph of an earlier capture), "
                    f"got {type(into).__name__}"
                )
            if into.is_closed:
                raise BackendClosedError(
                    "capture(into=graph): the graph is closed; capture without into= for a new one"
                )
            if into not in self._open:
                raise DispatchError(
                    "capture(into=graph): the graph is another backend's; capture into a graph of "
                    "this backend, or without into= for a new one"
                )
        return self._capture(parsed, into)

    @contextlib.asynccontextmanager
    async def _capture(
        self, mode: CaptureMode, into: CapturedGraph | None
    ) -> AsyncIterator[Capture]:
        device = self._device
        device.check_healthy()
        async with self.lock:
            slot = await device.stream_pool.lease()
            device.lease_started()
            reactor = device.reactor
            try:
                if mode is not CaptureMode.RELAXED:
                    reactor.pause(waiters=mode is CaptureMode.GLOBAL)
                    if mode is CaptureMode.GLOBAL:
                        await reactor.waiters_idle()
                lane = device.lanes[slot.index]
                cap = Capture(self, lane.stream, lane.handle, mode, into)
                with cap.guard:
                    yield cap
                    cap.closed = True
                cap.finish()
            finally:
                if mode is not CaptureMode.RELAXED:
                    reactor.resume()
                device.stream_pool.give_back(slot)
                device.lease_ended()

    # -- the GraphHost protocol ------------------------------------------------------------------

    def alloc_bytes(self, nbytes: int) -> Any:
        """See :meth:`GraphHost.alloc_bytes`; through the engine's resident storage."""
        return self._storage.alloc((nbytes,), np.dtype(np.uint8))

    def free_storage(self, storage: Any) -> None:
        """See :meth:`GraphHost.free_storage`."""
        self._storage.free(storage)

    def run_capture(self, body: Callable[[CaptureGuard], int]) -> tuple[Any, dict[int, Any], int]:
        """See :meth:`GraphHost.run_capture`."""
        with CaptureGuard(
            self.capture_stream,
            self.capture_handle,
            CaptureMode.THREAD_LOCAL,
            tail=core.capture_tail,
        ) as guard:
            result = body(guard)
        return guard.graph, guard.nodes, result

    def capture_launch(self, call: BoundCall, base: int, guard: CaptureGuard) -> int:
        """See :meth:`GraphHost.capture_launch`."""
        job = CudaJob(call, False)
        self._launches.enqueue(job, base, guard.handle, guard.stream)
        return guard.last_node()

    def capture_values(self, call: BoundCall, values: list[Any], guard: CaptureGuard) -> Any:
        """Enqueue *call*'s kernel with launch *values* (scalars, pointers as ints) on the
        capturing stream; the handle of its kernel node, or ``None`` (nothing enqueued) when
        the kernel has no launcher of its own."""
        launcher = self._launches.launchers.get(call.kernel)
        if launcher is None:
            return None
        code = launcher.launch_values(values, call.grid, call.block, call.shared_mem, guard.handle)
        if code != SUCCESS:
            raise error_for(code, "cuLaunchKernel")
        return guard.last_node()

    def update_nodes(self, nodes: list[KernelNode], call: BoundCall, values: list[Any]) -> None:
        """Set the arguments of the kernel *nodes*: packed by the kernel's launcher, one
        ``cuGraphExecKernelNodeSetParams`` each (through ``cuda.core`` for a kernel without
        one)."""
        launcher = self._launches.launchers.get(call.kernel)
        for node in nodes:
            if launcher is not None:
                code = launcher.set_node(
                    node.graph_exec,
                    node.handle,
                    values,
                    call.grid,
                    call.block,
                    call.shared_mem,
                    self.ctx.address,
                )
                if code != SUCCESS:
                    raise error_for(code, "cuGraphExecKernelNodeSetParams")
            else:
                self._update_node(node, call, values)
            self.telemetry.count("graph_updates")

    def _update_node(self, node: KernelNode, call: BoundCall, values: list[Any]) -> None:
        """:meth:`update_nodes` through ``cuda.core`` (it packs any argument)."""
        args = [
            value if arg.by_value else np.uint64(value)
            for arg, value in zip(call.args, values, strict=True)
        ]
        kernel = self._launches.loaded[call.kernel]
        with self.ctx:
            try:
                node.node.update(config=kernel_config(call), kernel=kernel, args=args)
            except Exception as exc:
                raise translate(exc, "cuGraphExecKernelNodeSetParams") from exc

    def bind_like(self, kernel: Kernel, args: tuple[object, ...], like: BoundCall) -> BoundCall:
        """See :meth:`GraphHost.bind_like`."""
        return self._front.bind_call(kernel, args, like.grid, like.block, like.shared_mem)

    def bind(
        self, kernel: Kernel, args: tuple[object, ...], grid: object, block: object, smem: object
    ) -> BoundCall:
        """Validate a captured dispatch's arguments as ``dispatch()`` does."""
        return self._front.bind_call(kernel, args, grid, block, smem)

    def is_loaded(self, kernel: Kernel) -> bool:
        """Whether *kernel* is loaded (a capture cannot load code)."""
        return self._launches.is_loaded(kernel)

    def replay_job(self, call: BoundCall, graph: Any) -> CudaJob:
        """See :meth:`GraphHost.replay_job`."""
        job = CudaJob(call, False)
        job.replay = graph
        return job

    def run_replay(self, job: Any) -> Awaitable[Any]:
        """See :meth:`GraphHost.run_replay`."""
        return self._front.run_prepared(job)

    def forget(self, graph: Any) -> None:
        """See :meth:`GraphHost.forget`."""
        self._open.discard(graph)

    def keep(self, graph: Any) -> None:
        """Close *graph* with the backend."""
        self._open.add(graph)

    # -- closing -------------------------------------------------------------------------------

    def serve(self, fast: Any) -> None:
        """Replay, route and steer through *fast* (the engine's fast path, ``None`` once it
        closed): the engine calls this when it made its fast path and when it let it go."""
        self._fast = fast
        self.replay_fast = _no_fast_replay if fast is None else fast.replay

    def steer(self, call: BoundCall, choice: Choice) -> None:
        """See :meth:`GraphHost.steer`."""
        if self._fast is not None:
            self._fast.steer(call, choice)

    def route_replays(
        self, call: BoundCall, instances: list[Any], choice: Choice | None, hit: Callable[[], None]
    ) -> bool:
        """See :meth:`GraphHost.route_replays`."""
        fast = self._fast
        return fast is not None and bool(fast.route(call, instances, choice, hit))

    def close_all(self) -> None:
        """Close the cache and every open graph."""
        self.cache.clear()
        for graph in list(self._open):
            graph.close()


def _no_fast_replay(graph: Any, call: BoundCall, *rest: Any) -> None:
    # No fast path (the Python core, or turned off, or closed): replays run as jobs.
    return None


class _CaptureStream:
    """The capturing stream, for work of other libraries (``cap.stream``)."""

    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def __repr__(self) -> str:
        return f"<capture stream {self.handle:#x}>"


class Capture:
    """What ``async with backend.capture() as cap`` gives: record dispatches, then ``graph``."""

    def __init__(
        self,
        graphs: Graphs,
        stream: Any,
        handle: Any,
        mode: CaptureMode,
        into: CapturedGraph | None = None,
    ) -> None:
        self._graphs = graphs
        self._into = into

        def reuse(builder: Any) -> Any:
            return reuse_for(into, builder, self._dispatches) if into is not None else None

        self.guard = CaptureGuard(
            stream, handle, mode, reuse if into is not None else None, core.capture_tail
        )
        self.mode = mode
        self.stream = _CaptureStream(int(handle))
        self._dispatches: list[RecordedDispatch] = []
        self._buffers: list[ResidentBuffer] = []
        self.closed = False
        self._graph: CapturedGraph | None = None
        self._held_since = perf_counter()  # since when the capturing task holds the loop

    @property
    def status(self) -> Any:
        """The capture's :class:`CaptureStatus` now."""
        return self.guard.status

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
        during a capture is not allowed. It records at once; it lets other tasks run only once
        the capturing task held the loop for :data:`CAPTURE_HOLD` (200 µs) since it last did.

        Raises:
            DispatchError: an argument is not a resident buffer, ``Out(into=)`` or a scalar.
            CaptureError: the capture ended, or the kernel was not compiled before it.
        """
        if self.closed:
            raise CaptureError("the capture ended; start another with backend.capture()")
        recorded = None
        if self._into is not None:
            recorded = self._again(self._into, kernel, args, (grid, block, shared_mem))
        if recorded is None:
            graphs = self._graphs
            call = graphs.bind(kernel, args, grid, block, shared_mem)
            for arg in call.args:
                if arg.region != NOT_STAGED or arg.foreign:
                    raise DispatchError(
                        f"args[{arg.index}] of {kernel.name!r}: a capture records dispatches on "
                        "resident buffers, Out(into=buffer) and scalars only; upload arrays with "
                        "backend.upload() first"
                    )
            if not graphs.is_loaded(kernel):
                raise CaptureError(
                    f"{kernel.name!r} is not compiled; await backend.compile(kernel) before the "
                    "capture (code cannot be loaded while a stream captures)"
                )
            with graphs.ctx:
                node = graphs.capture_launch(call, 0, self.guard)
            launch = (grid, block, shared_mem)
            recorded = RecordedDispatch(len(self._dispatches), call, node, launch)
            self._add(recorded, call)
        if perf_counter() - self._held_since > CAPTURE_HOLD:
            await _loop.sleep(0)  # other tasks run between long runs of recorded dispatches
            self._held_since = perf_counter()
        return recorded

    def _again(
        self,
        into: CapturedGraph,
        kernel: Kernel,
        args: tuple[object, ...],
        launch: tuple[object, object, object],
    ) -> RecordedDispatch | None:
        """Capturing *into* a graph: record a dispatch that repeats the one it recorded at its
        place but for scalars again from that one, not bound anew; ``None`` if it does not."""
        index = len(self._dispatches)
        again = repeated(into, index, kernel, args, launch)
        if again is None:
            return None
        before, call, values = again
        graphs = self._graphs
        with graphs.ctx:
            node = graphs.capture_values(call, values, self.guard)
        if node is None:
            return None
        recorded = recorded_again(index, before, node, values)
        self._add(recorded, call)
        return recorded

    def _add(self, recorded: RecordedDispatch, call: BoundCall) -> None:
        """*recorded*, of *call*, is the capture's next dispatch."""
        self._dispatches.append(recorded)
        buffers = self._buffers
        for arg in call.args:
            buffer = arg.buffer
            if buffer is not None and all(buffer is not b for b in buffers):
                buffers.append(buffer)

    def finish(self) -> None:
        """The block ended: make the :class:`CapturedGraph`, or give ``into`` what it captured."""
        guard = self.guard
        if self._into is not None:
            graph = recaptured(
                self._into,
                guard.graph,
                guard.nodes,
                guard.reused,
                self._dispatches,
                self._buffers,
            )
        else:
            graph = captured_graph(
                self._graphs, guard.graph, guard.nodes, self._dispatches, self._buffers
            )
            self._graphs.keep(graph)
        # Only the graph refers to the captured objects from now on: they are destroyed when
        # it closes, not whenever this object goes (which may be during another capture, where
        # destroying a graph on the capturing thread would invalidate it).
        guard.graph = None
        guard.nodes = {}
        self._graph = graph
