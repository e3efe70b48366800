"""Captured pipelines: dispatches on resident buffers, and foreign work, as one CUDA graph.

Made by ``async with backend.capture() as cap`` (``cap.graph`` after the block); a replay is a
dispatch to the backend's front, like a :class:`~asyncgraph.capture.CachedGraph` replay.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as drv

from .._bound import BoundCall, ResidentArg
from .._exceptions import BackendClosedError, DispatchError
from .._kernel import Kernel
from .._resident import ResidentBuffer, storage_of
from ..cuda._driver import check
from ._graphs import keep_alive, launch_values, let_go_of
from ._host import GraphHost, KernelNode

__all__ = ("CapturedGraph", "RecordedDispatch", "captured_graph")

# The name a replay of a capture holding foreign work only goes by (never compiled).
_FOREIGN_ONLY = Kernel('extern "C" __global__ void captured() { }', "captured")


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
        self._kernel_node: Any = None  # its KernelNode in the executable graph, once made
        self._graph: CapturedGraph | None = None  # the graph it is in, once made
        # What an update may change, checked without binding: the scalars (by exact type);
        # the other arguments must be the very objects recorded.
        self._values = list(launch_values(call, 0))
        self._scalars = tuple((arg.index, type(arg.value)) for arg in call.args if arg.by_value)
        self._others = tuple((arg.index, arg.value) for arg in call.args if not arg.by_value)

    def __repr__(self) -> str:
        return f"<RecordedDispatch #{self.index} {self.kernel.name!r}>"

    def _values_for(self, args: tuple[object, ...]) -> list[Any] | None:
        """The launch values of *args* if they differ from the recorded arguments in scalar
        values only (the same scalar types, the same other objects); else ``None``."""
        if len(args) != len(self._values):
            return None
        for index, value in self._others:
            if args[index] is not value:
                return None
        values = self._values.copy()
        for index, kind in self._scalars:
            value = args[index]
            if type(value) is not kind:
                return None
            values[index] = value
        return values


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
        keep_alive(buffers)
        kernel = dispatches[0].kernel if dispatches else _FOREIGN_ONLY
        grid = dispatches[0]._call.grid if dispatches else (1, 1, 1)
        self._replay_call = BoundCall(
            kernel=kernel,
            args=[ResidentArg(i, buffer, None) for i, buffer in enumerate(buffers)],
            grid=grid,
            block=(1, 1, 1),
            shared_mem=0,
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
        with self._backend.ctx:
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

        *args* are all its arguments again: the same resident buffers (the graph keeps their
        memory, closed or not), and numpy scalars of the same dtypes with new values. The
        executable graph's kernel node is updated in place: one parameter set, no new
        capture or instantiation.

        Raises:
            DispatchError: *dispatch* is not of this graph, or an argument is not a scalar and
                differs from the recorded one.
        """
        self._check_open()
        if type(dispatch) is not RecordedDispatch or dispatch._graph is not self:
            raise DispatchError(
                "update() takes a RecordedDispatch of this graph (from cap.dispatch)"
            )
        values = dispatch._values_for(args)
        if values is None:  # not simply new scalars: checked as dispatch() checks them
            values = self._bound_values(dispatch, args)
        self._backend.update_nodes([dispatch._kernel_node], dispatch._call, values)
        dispatch._values = values
        self.updates += 1

    def _bound_values(self, dispatch: RecordedDispatch, args: tuple[object, ...]) -> list[Any]:
        """The launch values of *args* for *dispatch*, bound and checked as ``dispatch()``
        binds them.

        Raises:
            DispatchError: an argument is not a scalar and differs from the recorded one.
        """
        recorded = dispatch._call
        call = self._backend.bind_like(dispatch.kernel, args, recorded)
        for arg, was in zip(call.args, recorded.args, strict=True):
            if type(arg) is not type(was) or (not arg.by_value and arg.buffer is not was.buffer):
                raise DispatchError(
                    f"args[{arg.index}] of {dispatch.kernel.name!r} differs from the recorded "
                    "argument; update() changes scalar arguments only (capture again for other "
                    "buffers)"
                )
        dispatch._call = call
        return list(launch_values(call, 0))

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosedError("this graph is closed; capture it again")

    # -- the backend's replay hooks -----------------------------------------------------------

    def launch_on(self, handle: Any) -> None:
        """Launch the graph chosen for this replay on the stream *handle* (used by the backend)."""
        check(drv.cuGraphLaunch(self._exec, handle), "cuGraphLaunch")
        self.replays += 1
        self._backend.telemetry.graph_replays += 1

    def results(self, call: BoundCall) -> tuple[Any, ...]:
        """Nothing: its results stay in its resident buffers (used by the backend)."""
        return ()

    def replay_done(self) -> None:
        """Nothing to do: replays of a captured graph may overlap (used by the backend)."""

    def close(self) -> None:
        """Free the executable graph and let go of the buffers it kept."""
        if self._closed:
            return
        self._closed = True
        with self._backend.ctx:
            self._graph.close()
        for recorded in self.dispatches:
            recorded._kernel_node = None
        self._graph = None
        let_go_of(self._buffers)
        self._buffers = []
        self._backend.forget(self)


def captured_graph(
    backend: GraphHost,
    graph: Any,
    nodes: dict[int, Any],
    dispatches: list[RecordedDispatch],
    buffers: list[ResidentBuffer],
) -> CapturedGraph:
    """The :class:`CapturedGraph` of a finished capture: *graph* (instantiated), whose kernel
    nodes *nodes* maps from their capture-time handles, holding *dispatches* on *buffers*."""
    graph_exec = drv.CUgraphExec(int(graph.handle))
    for recorded in dispatches:
        recorded._kernel_node = KernelNode(graph_exec, recorded._node, graph[nodes[recorded._node]])
    captured = CapturedGraph(backend, graph, dispatches, buffers)
    for recorded in dispatches:
        recorded._graph = captured
    return captured
