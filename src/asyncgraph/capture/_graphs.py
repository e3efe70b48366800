"""Executable CUDA graphs a backend replays: recorded dispatches and captured pipelines.

- :class:`CachedGraph` (``await backend.record(...)``, and the graph cache behind
  ``dispatch(graph=...)``): one whole dispatch — upload from its own pinned input block, zeroing
  of the outputs, the launch, download into its own pinned output block — plus a
  "resident-input" variant without the upload, replayed when the inputs are byte-identical to
  the previous replay's. Everything it uses is allocated before the capture and owned by it.
- :class:`CapturedGraph` (``async with backend.capture() as cap``): dispatches on resident
  buffers and foreign work on ``cap.stream``; scalar arguments can be changed in place.

A replay is a dispatch to the backend's front: it waits for the dispatches in flight that use
its resident buffers, counts against ``max_in_flight``, and completes through the reactor.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.bindings import driver as drv
from cuda.core import LaunchConfig

from asyncgraph._args._bound_args import IN_OUTS, INPUTS, NOT_STAGED, BoundCall, as_bytes
from asyncgraph._buffers._resident import ResidentBuffer, hold, let_go
from asyncgraph._cuda.driver._driver import check
from asyncgraph._runtime import _loop
from asyncgraph._runtime._exceptions import BackendClosedError, DispatchError, ShapeMismatchError

from ._graph_host import GraphHost, KernelNode
from ._replayed import on_fast_path, replayed

if TYPE_CHECKING:
    from asyncgraph._args._kernel import Kernel

    from ._choice import Choice

__all__ = (
    "CachedGraph",
    "keep_alive",
    "kernel_config",
    "launch_values",
    "let_go_of",
    "prepare_replay",
    "record_graph",
)


def launch_values(call: BoundCall, base: int) -> tuple[Any, ...]:
    """The kernel arguments ``cuda.core`` takes for a kernel node (the staged arguments at
    device address *base*): pointers and scalars."""
    return tuple(
        [arg.value if arg.by_value else np.uint64(arg.launch_value(base)) for arg in call.args]
    )


def keep_alive(buffers: list[ResidentBuffer]) -> None:
    """Keep the memory of *buffers* while a graph uses it, even if they are closed."""
    for buffer in buffers:
        hold(buffer)


def let_go_of(buffers: list[ResidentBuffer]) -> None:
    for buffer in buffers:
        let_go(buffer)


class CachedGraph:
    """One dispatch recorded as CUDA graphs, replayed with new inputs of the same shapes.

    Made by ``await backend.record(kernel, *args, grid=..., block=...)`` (no public
    constructor). ``await graph.replay(*args)`` takes arguments like the recorded ones: arrays of
    the same shapes and dtypes (their bytes may differ), ``Out`` of the same shape and dtype,
    scalars of the same dtypes (their values may differ: the kernel node is updated in place),
    and the same resident buffers. Replays of one graph run one at a time, in call order.

    Attributes:
        kernel: the recorded kernel.
        replays: replays so far.
        resident_replays: those that took the resident-input graph (nothing uploaded).
        nbytes: pinned and device bytes the graph holds.
    """

    def __init__(self, backend: GraphHost, call: BoundCall) -> None:
        self._backend = backend
        self._call = call
        self.kernel: Kernel = call.kernel
        # The call's staging layout (replays of the same shapes have the same one).
        self._in_end, self._up_end, self._total = call.in_end, call.up_end, call.total
        self._in_block: Any = None
        self._out_block: Any = None
        self._device: Any = None
        self._full: Any = None  # executable graphs (cuda.core Graph)
        self._resident: Any = None
        self._full_exec: Any = None  # their CUgraphExec handles
        self._resident_exec: Any = None
        self._nodes: list[KernelNode] = []  # the kernel node of each graph
        self._scalars = [arg.value for arg in call.args if arg.by_value]
        self._buffers = [arg.buffer for arg in call.args if arg.buffer is not None]
        self._writes = tuple(arg.writes for arg in call.args if arg.buffer is not None)
        self._chosen: Any = None
        self._busy = False
        self._waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self._close_when_idle = False
        self._primed = False  # the pinned inputs hold the bytes of the last upload
        self._layout = (0, 0, 0)  # what take_fast returns: set once recorded
        self.expected = 0.0  # a replay's time to completion, as the fast path learned it
        self.replays = 0
        self.resident_replays = 0
        self.nbytes = 0

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("busy" if self._busy else "idle")
        return (
            f"<CachedGraph {self.kernel.name!r} replays={self.replays} "
            f"nbytes={self.nbytes} {state}>"
        )

    # -- recording (the backend calls these, under its capture lock) -----------------------

    def _allocate(self) -> None:
        backend = self._backend
        pool = backend.pinned
        try:
            if self._up_end:
                self._in_block = pool.acquire(self._up_end)
            if self._total > self._in_end:
                self._out_block = pool.acquire(self._total - self._in_end)
            if self._total:
                self._device = backend.alloc_bytes(self._total)
        except BaseException:
            self._free()
            raise
        self.nbytes = (
            (self._in_block.size if self._in_block is not None else 0)
            + (self._out_block.size if self._out_block is not None else 0)
            + self._total
        )

    def _capture(self, upload: bool) -> tuple[Any, KernelNode]:
        """Capture one variant; returns (graph, its kernel node)."""
        backend = self._backend
        call = self._call
        base = int(self._device.handle) if self._device is not None else 0
        handle = backend.capture_handle

        def body(guard: Any) -> int:
            if upload and self._up_end:
                check(
                    drv.cuMemcpyHtoDAsync(base, self._in_block.ptr, self._up_end, handle),
                    "cuMemcpyHtoDAsync",
                )
            if self._total > self._up_end:
                check(
                    drv.cuMemsetD8Async(base + self._up_end, 0, self._total - self._up_end, handle),
                    "cuMemsetD8Async",
                )
            node: int = backend.capture_launch(call, base, guard)
            if self._total > self._in_end:
                check(
                    drv.cuMemcpyDtoHAsync(
                        self._out_block.ptr, base + self._in_end, self._total - self._in_end, handle
                    ),
                    "cuMemcpyDtoHAsync",
                )
            return node

        graph, nodes, node = backend.run_capture(body)
        return graph, KernelNode(drv.CUgraphExec(int(graph.handle)), node, graph[nodes[node]])

    def _record(self) -> None:
        """Allocate, then capture both variants (the first replay writes the inputs)."""
        self._allocate()
        try:
            self._full, full_node = self._capture(upload=True)
            self._nodes = [full_node]
            has_inputs = any(arg.region == INPUTS for arg in self._call.args)
            has_inout = any(arg.region == IN_OUTS for arg in self._call.args)
            if has_inputs and not has_inout:
                self._resident, resident_node = self._capture(upload=False)
                self._nodes.append(resident_node)
        except BaseException:
            self._free()
            raise
        self._full_exec = drv.CUgraphExec(int(self._full.handle))
        in_at = self._in_block.ptr if self._in_block is not None else 0
        out_at = self._out_block.ptr - self._in_end if self._out_block is not None else 0
        self._layout = (int(self._full.handle), int(in_at), int(out_at))
        if self._resident is not None:
            self._resident_exec = drv.CUgraphExec(int(self._resident.handle))
        keep_alive(self._buffers)
        telemetry = self._backend.telemetry
        telemetry.graph_captures += 1 + (self._resident is not None)

    # -- replaying ---------------------------------------------------------------------------

    def upload(self) -> None:
        """Upload the executable graphs to the device now, so the first replay does not."""
        self._check_open()
        stream = self._backend.capture_stream
        with self._backend.ctx:
            self._full.upload(stream)
            if self._resident is not None:
                self._resident.upload(stream)

    async def replay(self, *args: object) -> tuple[Any, ...]:
        """Run the recorded dispatch on *args*; returns what the dispatch would.

        Raises:
            ShapeMismatchError: an array or ``Out`` differs in shape or dtype from the recorded.
            DispatchError: an argument of another kind, or another resident buffer.
            BackendClosedError: the graph (or its backend) is closed.
        """
        self._check_open()
        backend = self._backend
        call = backend.bind_like(self.kernel, args, self._call)
        while self._busy:
            waiter: asyncio.Future[None] = _loop.current_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                else:
                    self._pass_turn()  # it was woken: the next waiter goes instead
                raise
            self._check_open()
        with backend.ctx:
            self._take(call)
        result: tuple[Any, ...] = await replayed(backend, self, call, self._buffers, self._writes)
        return result

    def _check_open(self) -> None:
        if self._closed or self._close_when_idle:
            raise BackendClosedError("this graph is closed; record it again")

    def _matches(self, call: BoundCall) -> str | None:
        """Why *call* cannot replay this graph, or ``None``; raises on shape mismatches."""
        for arg, was in zip(call.args, self._call.args, strict=True):
            where = f"args[{arg.index}] of {self.kernel.name!r}"
            if type(arg) is not type(was):
                return f"{where} is of another kind than at record time"
            if arg.region != NOT_STAGED:
                value, recorded = arg.value, was.value
                if value.shape != recorded.shape or value.dtype != recorded.dtype:
                    raise ShapeMismatchError(
                        f"{where} is {value.dtype} of shape {value.shape}; the graph was "
                        f"recorded with {recorded.dtype} of shape {recorded.shape} (record "
                        "another graph for other shapes)"
                    )
            elif arg.buffer is not was.buffer:
                return f"{where} is another resident buffer than at record time"
        return None

    def _take(self, call: BoundCall) -> None:
        """Take the graph for one replay of *call* (matched): inputs, scalars, variant."""
        reason = self._matches(call)
        if reason is not None:
            raise DispatchError(
                f"{reason}; a CachedGraph replays the kinds and buffers it recorded"
            )
        self._set_scalars(call)
        backend = self._backend
        telemetry = backend.telemetry
        view = self._in_block.array if self._in_block is not None else None
        same = self._primed and self._resident is not None
        if same:
            for arg in call.args:
                if arg.region == INPUTS:
                    off = arg.offset
                    data = as_bytes(arg.value)
                    if not np.array_equal(view[off : off + data.size], data):  # type: ignore[index]
                        same = False
                        break
        if same:
            self._chosen = self._resident_exec
            self.resident_replays += 1
        else:
            for arg in call.args:
                if arg.uploads:
                    off = arg.offset
                    data = as_bytes(arg.value)
                    view[off : off + data.size] = data  # type: ignore[index]
            self._primed = True
            self._chosen = self._full_exec
            if self._up_end:
                telemetry.bytes_up += self._up_end
                telemetry.copies_up += 1
        self._busy = True
        self._call = call

    def take_fast(
        self, args: tuple[object, ...], scalars: tuple[int, ...]
    ) -> tuple[int, int, int] | None:
        """Take the graph for a replay on the fast path, *args* being of the recorded kinds,
        shapes and dtypes (its guards checked them), nothing resident; ``None``, having changed
        nothing, when it is busy or closed, or when a scalar (at the *scalars* indices) changed
        (the general path updates its kernel node). The caller writes the staged inputs into
        the pinned input block and launches the full graph: returned are the addresses of that
        graph (``CUgraphExec``), of the input block, and of the output block less the inputs'
        bytes (where a result at staging offset ``o`` is read at ``o`` past it), 0 where none."""
        if self._busy or self._closed or self._close_when_idle:
            return None
        for value, index in zip(self._scalars, scalars, strict=True):
            if args[index] != value:
                return None
        self._primed = True
        self._chosen = self._full_exec
        self._busy = True
        return self._layout

    def take_staged(
        self,
        uploads: tuple[tuple[int, int, int, bool], ...],
        scalars: tuple[int, ...],
        args: tuple[object, ...],
    ) -> bool:
        """:meth:`take_fast`, with the staged inputs (*uploads*: ``(index, offset, nbytes, is
        an InOut)``) written into its pinned block here; ``False`` where that declines."""
        if self.take_fast(args, scalars) is None:
            return False
        view = self._in_block.array if self._in_block is not None else None
        for index, offset, nbytes, in_out in uploads:
            array: Any = args[index]
            if in_out:
                array = array.array
            view[offset : offset + nbytes] = array.reshape(-1).view(np.uint8)  # type: ignore[index]
        if self._up_end:
            telemetry = self._backend.telemetry
            telemetry.bytes_up += self._up_end
            telemetry.copies_up += 1
        return True

    def staged_results(self, returned: tuple[tuple[Any, ...], ...]) -> tuple[Any, ...]:
        """The results of a replay :meth:`take_staged` took: new arrays, per *returned*
        ``(kind, index, offset, nbytes, dtype, shape)`` of a staged result."""
        view: Any = self._out_block.array if self._out_block is not None else None
        in_end = self._in_end
        results = tuple(
            view[offset - in_end : offset - in_end + nbytes].view(dtype).reshape(shape).copy()
            for _kind, _index, offset, nbytes, dtype, shape in returned
        )
        if self._total > in_end:
            telemetry = self._backend.telemetry
            telemetry.bytes_down += self._total - in_end
            telemetry.copies_down += 1
        return results

    @property
    def is_busy(self) -> bool:
        """Whether a replay of this graph is in flight (replays of one graph take turns)."""
        return self._busy

    def _set_scalars(self, call: BoundCall) -> None:
        scalars = [arg.value for arg in call.args if arg.by_value]
        if all(a == b and a.dtype == b.dtype for a, b in zip(scalars, self._scalars, strict=True)):
            return
        base = int(self._device.handle) if self._device is not None else 0
        values = list(launch_values(call, base))
        self._backend.update_nodes(self._nodes, call, values)
        self._scalars = scalars

    # -- the backend's replay hooks -----------------------------------------------------------

    def launch_address(self) -> int:
        """The address of the executable graph chosen for this replay (``CUgraphExec``), for a
        fast path that launches it itself (and counts it in ``replays``)."""
        return int(self._chosen)

    def launch_on(self, handle: Any) -> None:
        """Launch the graph chosen for this replay on the stream *handle* (used by the backend)."""
        check(drv.cuGraphLaunch(self._chosen, handle), "cuGraphLaunch")
        self.replays += 1
        self._backend.telemetry.count("graph_replays")

    def results(self, call: BoundCall) -> tuple[Any, ...]:
        """The outputs of the replay that just completed: new arrays, and resident outputs
        (used by the backend)."""
        view = self._out_block.array if self._out_block is not None else None
        in_end = self._in_end

        def copied(arg: Any) -> Any:
            out = arg.empty()
            off = arg.offset - in_end
            as_bytes(out)[:] = view[off : off + arg.nbytes]  # type: ignore[index]  # staged kinds have a block
            return out

        results = call.results(copied)
        if self._total > in_end:
            telemetry = self._backend.telemetry
            telemetry.bytes_down += self._total - in_end
            telemetry.copies_down += 1
        return results

    def replay_done(self) -> None:
        """The replay in flight ended: the next may go (used by the backend)."""
        self._busy = False
        if self._close_when_idle:
            with self._backend.ctx:
                self._free()
            return
        if self._waiters:
            self._wake()

    def _pass_turn(self) -> None:
        if not self._busy:
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    # -- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Free the graphs and the memory they hold (after a replay in flight completed)."""
        if self._closed:
            return
        if self._busy:
            self._close_when_idle = True
            return
        with self._backend.ctx:
            self._free()

    def _free(self) -> None:
        if self._closed:
            return
        self._closed = True
        backend = self._backend
        for graph in (self._full, self._resident):
            if graph is not None:
                graph.close()
        self._full = self._resident = self._full_exec = self._resident_exec = None
        self._nodes = []
        for block in (self._in_block, self._out_block):
            if block is not None:
                backend.pinned.release(block)
        self._in_block = self._out_block = None
        if self._device is not None:
            backend.free_storage(self._device)
            self._device = None
        let_go_of(self._buffers)
        self._buffers = []
        backend.forget(self)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)  # they see the graph closed
        self._waiters = []


def kernel_config(call: BoundCall) -> LaunchConfig:
    """The ``cuda.core`` LaunchConfig of *call*'s launch shape."""
    return LaunchConfig(grid=call.grid, block=call.block, shmem_size=call.shared_mem)


def record_graph(backend: GraphHost, call: BoundCall) -> CachedGraph:
    """Allocate and capture a :class:`CachedGraph` of *call* (under the capture lock)."""
    graph = CachedGraph(backend, call)
    graph._record()
    return graph


def prepare_replay(
    graph: CachedGraph, call: BoundCall, inline: bool, choice: Choice | None, started: float
) -> Any:
    """Take *graph* for one replay of *call* (the graph cache): launched at once on the
    backend's fast path where *inline* allows it (its pending result), else the job that
    replays it. *choice*: told the replay's cost from *started* once it ended."""
    graph._take(call)
    backend = graph._backend
    if inline:
        buffers, writes = graph._buffers, graph._writes
        pending = on_fast_path(backend, graph, call, buffers, writes, choice, started)
        if pending is not None:
            return pending
    job = backend.replay_job(call, graph)
    if choice is not None:
        backend.sample(job, choice, started)
    return job
