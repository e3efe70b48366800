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
from typing import Any

import numpy as np
from cuda.bindings import driver as drv
from cuda.core import LaunchConfig

from .. import _loop
from .._args import IN, INOUT, OUT, RESIDENT, RESIDENT_OUT, SCALAR, BoundCall
from .._exceptions import BackendClosedError, DispatchError, ShapeMismatchError
from .._kernel import Kernel
from .._resident import ResidentBuffer, hold, let_go, storage_of
from ..cuda._driver import check
from ._host import GraphHost

__all__ = (
    "CachedGraph",
    "CapturedGraph",
    "RecordedDispatch",
    "collect_replay",
    "enqueue_replay",
    "prepare_replay",
    "replay_finished",
)


def _as_bytes(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return array.reshape(-1).view(np.uint8)


# The name a replay of a capture holding foreign work only goes by (never compiled).
_FOREIGN_ONLY = Kernel('extern "C" __global__ void captured() { }', "captured")


def _launch_values(call: BoundCall, offsets: list[int], base: int) -> tuple[Any, ...]:
    """The kernel arguments ``cuda.core`` takes for a kernel node: pointers and scalars."""
    values: list[Any] = []
    for i, (kind, value, _param) in enumerate(call.args):
        if kind == SCALAR:
            values.append(value)
        elif kind in (RESIDENT, RESIDENT_OUT):
            values.append(np.uint64(int(storage_of(value).handle)))
        else:
            values.append(np.uint64(base + offsets[i]))
    return tuple(values)


def _hold(buffers: list[ResidentBuffer]) -> None:
    """Keep the memory of *buffers* while a graph uses it, even if they are closed."""
    for buffer in buffers:
        hold(buffer)


def _let_go(buffers: list[ResidentBuffer]) -> None:
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

    def __init__(
        self,
        backend: GraphHost,
        call: BoundCall,
        offsets: list[int],
        layout: tuple[int, int, int],
    ) -> None:
        self._backend = backend
        self._call = call
        self.kernel: Kernel = call.kernel
        self._offsets = offsets
        self._in_end, self._up_end, self._total = layout
        self._in_block: Any = None
        self._out_block: Any = None
        self._device: Any = None
        self._full: Any = None  # executable graphs (cuda.core Graph)
        self._resident: Any = None
        self._full_exec: Any = None  # their CUgraphExec handles
        self._resident_exec: Any = None
        self._nodes: list[Any] = []  # the kernel node of each graph, as executable nodes
        self._scalars = [value for kind, value, _p in call.args if kind == SCALAR]
        self._buffers = [value for kind, value, _p in call.args if kind in (RESIDENT, RESIDENT_OUT)]
        self._chosen: Any = None
        self._busy = False
        self._waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self._close_when_idle = False
        self._primed = False  # the pinned inputs hold the bytes of the last upload
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

    def _capture(self, upload: bool) -> tuple[Any, Any]:
        """Capture one variant; returns (graph, its kernel node as an executable node)."""
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
            node: int = backend.capture_launch(call, self._offsets, base, guard)
            if self._total > self._in_end:
                check(
                    drv.cuMemcpyDtoHAsync(
                        self._out_block.ptr, base + self._in_end, self._total - self._in_end, handle
                    ),
                    "cuMemcpyDtoHAsync",
                )
            return node

        graph, nodes, node = backend.run_capture(body)
        return graph, graph[nodes[node]]

    def _record(self) -> None:
        """Allocate, then capture both variants (the first replay writes the inputs)."""
        self._allocate()
        try:
            self._full, full_node = self._capture(upload=True)
            self._nodes = [full_node]
            has_inputs = any(kind == IN for kind, _v, _p in self._call.args)
            has_inout = any(kind == INOUT for kind, _v, _p in self._call.args)
            if has_inputs and not has_inout:
                self._resident, resident_node = self._capture(upload=False)
                self._nodes.append(resident_node)
        except BaseException:
            self._free()
            raise
        self._full_exec = drv.CUgraphExec(int(self._full.handle))
        if self._resident is not None:
            self._resident_exec = drv.CUgraphExec(int(self._resident.handle))
        _hold(self._buffers)
        telemetry = self._backend.telemetry
        telemetry.graph_captures += 1 + (self._resident is not None)

    # -- replaying ---------------------------------------------------------------------------

    def upload(self) -> None:
        """Upload the executable graphs to the device now, so the first replay does not."""
        self._check_open()
        stream = self._backend.capture_stream
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
        job = self._prepare(call)
        result: tuple[Any, ...] = await backend.run_replay(job)
        return result

    def _check_open(self) -> None:
        if self._closed or self._close_when_idle:
            raise BackendClosedError("this graph is closed; record it again")

    def _matches(self, call: BoundCall) -> str | None:
        """Why *call* cannot replay this graph, or ``None``; raises on shape mismatches."""
        recorded = self._call.args
        for i, ((kind, value, _p), (rkind, rvalue, _rp)) in enumerate(
            zip(call.args, recorded, strict=True)
        ):
            where = f"args[{i}] of {self.kernel.name!r}"
            if kind != rkind:
                return f"{where} is of another kind than at record time"
            if kind in (IN, INOUT, OUT):
                if value.shape != rvalue.shape or value.dtype != rvalue.dtype:
                    raise ShapeMismatchError(
                        f"{where} is {value.dtype} of shape {value.shape}; the graph was "
                        f"recorded with {rvalue.dtype} of shape {rvalue.shape} (record another "
                        "graph for other shapes)"
                    )
            elif kind in (RESIDENT, RESIDENT_OUT) and value is not rvalue:
                return f"{where} is another resident buffer than at record time"
        return None

    def _prepare(self, call: BoundCall) -> Any:
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
        offsets = self._offsets
        same = self._primed and self._resident is not None
        if same:
            for i, (kind, value, _p) in enumerate(call.args):
                if kind == IN:
                    off = offsets[i]
                    if not np.array_equal(view[off : off + value.nbytes], _as_bytes(value)):  # type: ignore[index]
                        same = False
                        break
        if same:
            self._chosen = self._resident_exec
            self.resident_replays += 1
        else:
            for i, (kind, value, _p) in enumerate(call.args):
                if kind in (IN, INOUT):
                    off = offsets[i]
                    view[off : off + value.nbytes] = _as_bytes(value)  # type: ignore[index]
            self._primed = True
            self._chosen = self._full_exec
            if self._up_end:
                telemetry.bytes_up += self._up_end
                telemetry.copies_up += 1
        self._busy = True
        self._call = call
        return backend.replay_job(call, self)

    @property
    def is_busy(self) -> bool:
        """Whether a replay of this graph is in flight (replays of one graph take turns)."""
        return self._busy

    def _set_scalars(self, call: BoundCall) -> None:
        scalars = [value for kind, value, _p in call.args if kind == SCALAR]
        if all(a == b and a.dtype == b.dtype for a, b in zip(scalars, self._scalars, strict=True)):
            return
        base = int(self._device.handle) if self._device is not None else 0
        values = _launch_values(call, self._offsets, base)
        self._backend.update_nodes(self._nodes, call, values)
        self._scalars = scalars

    # -- the backend's replay hooks -----------------------------------------------------------

    def _enqueue(self, handle: Any) -> None:
        check(drv.cuGraphLaunch(self._chosen, handle), "cuGraphLaunch")
        self.replays += 1
        self._backend.telemetry.graph_replays += 1

    def _collect(self, call: BoundCall) -> tuple[Any, ...]:
        """The outputs of the replay that just completed (new arrays, and resident outputs)."""
        results: list[Any] = []
        view = self._out_block.array if self._out_block is not None else None
        telemetry = self._backend.telemetry
        for i, (kind, value, _p) in enumerate(call.args):
            if kind in (OUT, INOUT):
                out = np.empty(value.shape, value.dtype)
                off = self._offsets[i] - self._in_end
                _as_bytes(out)[:] = view[off : off + out.nbytes]  # type: ignore[index]
                results.append(out)
            elif kind == RESIDENT_OUT:
                results.append(value)
        if self._total > self._in_end:
            telemetry.bytes_down += self._total - self._in_end
            telemetry.copies_down += 1
        return tuple(results)

    def _finished(self) -> None:
        self._busy = False
        if self._close_when_idle:
            self._free()
            return
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
        _let_go(self._buffers)
        self._buffers = []
        backend.forget(self)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)  # they see the graph closed
        self._waiters = []


class RecordedDispatch:
    """A dispatch recorded into a :class:`CapturedGraph` (``await cap.dispatch(...)``).

    Pass it to :meth:`CapturedGraph.update` to change its scalar arguments.

    Attributes:
        kernel: its kernel.
        index: its position among the capture's dispatches.
    """

    def __init__(self, index: int, call: BoundCall, node: int) -> None:
        self.index = index
        self.kernel = call.kernel
        self._call = call
        self._node = node  # its kernel node's handle in the captured graph
        self._exec_node: Any = None

    def __repr__(self) -> str:
        return f"<RecordedDispatch #{self.index} {self.kernel.name!r}>"


class CapturedGraph:
    """Dispatches on resident buffers, and foreign work, captured as one CUDA graph.

    Made by ``async with backend.capture() as cap:`` (``cap.graph`` after the block). Replays may
    overlap; CUDA runs them one after another.

    Attributes:
        dispatches: the recorded dispatches, in capture order.
        replays: replays so far.
        updates: in-place updates so far.
    """

    def __init__(
        self,
        backend: GraphHost,
        graph: Any,
        dispatches: list[RecordedDispatch],
        buffers: list[ResidentBuffer],
    ) -> None:
        self._backend = backend
        self._graph = graph
        self._exec = drv.CUgraphExec(int(graph.handle))
        self.dispatches = dispatches
        self._buffers = buffers
        _hold(buffers)
        kernel = dispatches[0].kernel if dispatches else _FOREIGN_ONLY
        grid = dispatches[0]._call.grid if dispatches else (1, 1, 1)
        self._replay_call = BoundCall(
            kernel=kernel,
            args=[(RESIDENT, buffer, None) for buffer in buffers],
            grid=grid,
            block=(1, 1, 1),
            shared_mem=0,
            n_results=0,
            bytes_in=0,
            bytes_out=0,
            resident=bool(buffers),
        )
        self.replays = 0
        self.updates = 0
        self._closed = False
        backend.telemetry.graph_captures += 1

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<CapturedGraph dispatches={len(self.dispatches)} replays={self.replays} {state}>"

    def upload(self) -> None:
        """Upload the executable graph to the device now, so the first replay does not."""
        self._check_open()
        self._graph.upload(self._backend.capture_stream)

    async def replay(self) -> None:
        """Run the captured work once more; returns when it completed on the device.

        Raises:
            BackendClosedError: the graph (or its backend) is closed.
        """
        self._check_open()
        backend = self._backend
        for buffer in self._buffers:
            if storage_of(buffer) is None:  # pragma: no cover - held memory is never freed
                raise BackendClosedError("a buffer of this graph was freed")
        job = backend.replay_job(self._replay_call, self)
        await backend.run_replay(job)

    def update(self, dispatch: RecordedDispatch, *args: object) -> None:
        """Change the scalar arguments of a recorded *dispatch* for the following replays.

        *args* are all its arguments again: the same resident buffers, and numpy scalars of the
        same dtypes with new values. The executable graph is updated in place (no new capture
        or instantiation).

        Raises:
            DispatchError: *dispatch* is not of this graph, or an argument is not a scalar and
                differs from the recorded one.
        """
        self._check_open()
        if not isinstance(dispatch, RecordedDispatch) or dispatch not in self.dispatches:
            raise DispatchError(
                "update() takes a RecordedDispatch of this graph (from cap.dispatch)"
            )
        backend = self._backend
        recorded = dispatch._call
        call = backend.bind_like(dispatch.kernel, args, recorded)
        for i, ((kind, value, _p), (rkind, rvalue, _rp)) in enumerate(
            zip(call.args, recorded.args, strict=True)
        ):
            if kind != rkind or (kind != SCALAR and value is not rvalue):
                raise DispatchError(
                    f"args[{i}] of {dispatch.kernel.name!r} differs from the recorded argument; "
                    "update() changes scalar arguments only (capture again for other buffers)"
                )
        values = _launch_values(call, [], 0)
        backend.update_nodes([dispatch._exec_node], call, values)
        dispatch._call = call
        self.updates += 1

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosedError("this graph is closed; capture it again")

    # -- the backend's replay hooks -----------------------------------------------------------

    def _enqueue(self, handle: Any) -> None:
        check(drv.cuGraphLaunch(self._exec, handle), "cuGraphLaunch")
        self.replays += 1
        self._backend.telemetry.graph_replays += 1

    def _collect(self, call: BoundCall) -> tuple[Any, ...]:
        return ()

    def _finished(self) -> None:
        pass

    def close(self) -> None:
        """Free the executable graph and let go of the buffers it kept."""
        if self._closed:
            return
        self._closed = True
        self._graph.close()
        for recorded in self.dispatches:
            recorded._exec_node = None
        self._graph = None
        _let_go(self._buffers)
        self._buffers = []
        self._backend.forget(self)


def kernel_config(call: BoundCall) -> LaunchConfig:
    """The ``cuda.core`` LaunchConfig of *call*'s launch shape."""
    return LaunchConfig(grid=call.grid, block=call.block, shmem_size=call.shared_mem)


def captured_graph(
    backend: GraphHost,
    graph: Any,
    nodes: dict[int, Any],
    dispatches: list[RecordedDispatch],
    buffers: list[ResidentBuffer],
) -> CapturedGraph:
    """The :class:`CapturedGraph` of a finished capture: *graph* (instantiated), whose kernel
    nodes *nodes* maps from their capture-time handles, holding *dispatches* on *buffers*."""
    for recorded in dispatches:
        recorded._exec_node = graph[nodes[recorded._node]]
    return CapturedGraph(backend, graph, dispatches, buffers)


# -- what the backend does with a graph a job replays -------------------------------------------


def prepare_replay(graph: CachedGraph, call: BoundCall) -> Any:
    """Take *graph* for one replay of *call* (the graph cache): the job that replays it."""
    return graph._prepare(call)


def enqueue_replay(graph: CachedGraph | CapturedGraph, handle: Any) -> None:
    """Launch *graph* on the stream *handle*."""
    graph._enqueue(handle)


def collect_replay(graph: CachedGraph | CapturedGraph, call: BoundCall) -> tuple[Any, ...]:
    """The outputs of the replay of *graph* for *call* that just completed."""
    return graph._collect(call)


def replay_finished(graph: CachedGraph | CapturedGraph) -> None:
    """The replay of *graph* ended (completed or failed): the next may go."""
    graph._finished()
