"""Captured pipelines: dispatches on resident buffers, and foreign work, as one CUDA graph.

Made by ``async with backend.capture() as cap`` (``cap.graph`` after the block); a replay is a
dispatch to the backend's front, like a :class:`~asyncgraph.capture.CachedGraph` replay.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as drv

from asyncgraph._args._bound_args import BoundCall, ResidentArg
from asyncgraph._args._kernel import Kernel
from asyncgraph._args._plan_cache import same_dims
from asyncgraph._buffers._resident import ResidentBuffer, storage_of
from asyncgraph._cuda.driver._driver import check
from asyncgraph._runtime._exceptions import BackendClosedError, DispatchError

from ._graph_host import GraphHost, KernelNode
from ._graphs import keep_alive, launch_values, let_go_of
from ._replayed import replayed

__all__ = (
    "CapturedGraph",
    "RecordedDispatch",
    "captured_graph",
    "recaptured",
    "recorded_again",
    "repeated",
    "reuse_for",
)

# The name a replay of a capture holding foreign work only goes by (never compiled).
_FOREIGN_ONLY = Kernel('extern "C" __global__ void captured() { }', "captured")


class RecordedDispatch:
    """A dispatch recorded into a :class:`CapturedGraph` (``await cap.dispatch(...)``).

    Pass it to :meth:`CapturedGraph.update` to change its scalar arguments.

    Attributes:
        kernel: its kernel.
        index: its position among the capture's dispatches.
    """

    def __init__(
        self, index: int, call: BoundCall, node: int, launch: tuple[object, object, object]
    ) -> None:
        self.index = index
        self.kernel = call.kernel
        self._call = call
        self._launch = launch  # grid, block and shared_mem as they were passed
        self._node = node  # its kernel node's handle in the captured graph
        self._graph: CapturedGraph | None = None  # the graph it is in, once made
        # Its launch values, made at its first update (a capture is not slowed down by them).
        self._values: list[Any] | None = None

    def __repr__(self) -> str:
        return f"<RecordedDispatch #{self.index} {self.kernel.name!r}>"

    def _values_for(self, args: tuple[object, ...]) -> list[Any] | None:
        """The launch values of *args* if they differ from the recorded arguments in scalar
        values only (scalars of the same exact types, the very other objects); else ``None``."""
        recorded = self._call.args
        if len(args) != len(recorded):
            return None
        values = self._values
        if values is None:
            values = self._values = list(launch_values(self._call, 0))
        values = values.copy()
        for arg, value in zip(recorded, args, strict=True):
            if arg.by_value:
                if type(value) is not type(arg.value):
                    return None
                values[arg.index] = value
            elif value is not arg.value:
                return None
        return values

    def _nodes(self) -> int:
        """The nodes its capture made: the kernel's, and a memset per resident output."""
        return 1 + sum(arg.zeroed for arg in self._call.args)


class CapturedGraph:
    """Dispatches on resident buffers, and foreign work, captured as one CUDA graph.

    Made by ``async with backend.capture() as cap:`` (``cap.graph`` after the block). Replays may
    overlap; CUDA runs them one after another.

    ``async with backend.capture(into=graph)`` captures into it again: what it runs is
    replaced, in place where the new capture has the same nodes (``cuGraphExecUpdate``).

    Attributes:
        dispatches: the recorded dispatches of its last capture, in capture order.
        replays: replays so far.
        updates: in-place updates so far.
        recaptures: captures into it after the first (``capture(into=graph)``).
        updated_in_place: those of them that updated its executable graph in place, with
            nothing instantiated.
    """

    def __init__(self, backend: GraphHost) -> None:
        self._backend = backend
        self._graph: Any = None  # the executable graph (cuda.core Graph), and its CUgraphExec
        self._exec: Any = None
        self.dispatches: list[RecordedDispatch] = []
        self._buffers: list[ResidentBuffer] = []
        self._writes: tuple[bool, ...] = ()
        self._replay_call: BoundCall = None  # type: ignore[assignment]  # set by _attach
        # The kernel node of each dispatch as instantiated, and the nodes of that capture, all
        # of them its dispatches' or not: a capture into it is updated in place when so.
        self._first: list[RecordedDispatch] = []  # the dispatches it was instantiated for
        self._definition: dict[int, Any] = {}  # that capture's nodes, by handle
        self._origin: list[KernelNode] | None = None  # their kernel nodes, made when needed
        self._node_count = 0
        self._only_dispatches: bool | None = None
        self.expected = 0.0  # a replay's time to completion, as the fast path learned it
        self.replays = 0
        self.updates = 0
        self.recaptures = 0
        self.updated_in_place = 0
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<CapturedGraph dispatches={len(self.dispatches)} replays={self.replays} {state}>"

    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called (or its backend closed)."""
        return self._closed

    # -- what a capture gives it (``captured_graph``, ``reuse_for``, ``recaptured``) -----------

    def _take(
        self,
        graph: Any,
        nodes: dict[int, Any],
        dispatches: list[RecordedDispatch],
        buffers: list[ResidentBuffer],
    ) -> None:
        """Run *graph*, instantiated from a capture whose nodes *nodes* maps from their
        handles, for *dispatches* on *buffers* (an earlier executable graph is freed)."""
        old = self._graph
        self._graph, self._exec = graph, drv.CUgraphExec(int(graph.handle))
        self._first, self._definition, self._origin = dispatches, nodes, None
        self._node_count = len(nodes)
        self._only_dispatches = None  # found out by the first capture into it
        self._attach(dispatches, buffers)
        if old is not None:
            with self._backend.ctx:
                old.close()  # a launch in flight completes first (the driver frees it then)

    def _attach(self, dispatches: list[RecordedDispatch], buffers: list[ResidentBuffer]) -> None:
        """Hold *dispatches* (at the executable graph's kernel nodes, in order) and *buffers*
        instead of the last capture's."""
        for recorded in self.dispatches:
            recorded._graph = None
        for recorded in dispatches:
            recorded._graph = self
        self.dispatches = dispatches
        keep_alive(buffers)  # before letting go: a buffer of both stays held
        let_go_of(self._buffers)
        self._buffers = buffers
        self._writes = (True,) * len(buffers)  # a replay may write each (no parameter says)
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
        self._backend.telemetry.count("graph_captures")

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
        await replayed(backend, self, self._replay_call, self._buffers, self._writes)

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
        self._backend.update_nodes([self._kernel_node(dispatch.index)], dispatch._call, values)
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

    def _kernel_node(self, index: int) -> KernelNode:
        """The executable graph's kernel node of the *index*-th dispatch: that of the dispatch
        it was instantiated for at that place (a capture in place keeps them)."""
        origin = self._origin
        if origin is None:
            graph, nodes = self._graph, self._definition
            origin = self._origin = [
                KernelNode(self._exec, d._node, graph[nodes[d._node]]) for d in self._first
            ]
        return origin[index]

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosedError("this graph is closed; capture it again")

    # -- the backend's replay hooks -----------------------------------------------------------

    def launch_address(self) -> int:
        """The address of the executable graph (``CUgraphExec``), for a fast path that launches
        it itself (and counts it in ``replays``)."""
        return int(self._exec)

    def launch_on(self, handle: Any) -> None:
        """Launch the executable graph on the stream *handle* (used by the backend)."""
        check(drv.cuGraphLaunch(self._exec, handle), "cuGraphLaunch")
        self.replays += 1
        self._backend.telemetry.count("graph_replays")

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
            recorded._graph = None
        self._graph = None
        self._first, self._definition, self._origin = [], {}, None
        let_go_of(self._buffers)
        self._buffers = []
        self._backend.forget(self)


def repeated(
    into: CapturedGraph,
    index: int,
    kernel: Kernel,
    args: tuple[object, ...],
    launch: tuple[object, object, object],
) -> tuple[RecordedDispatch, BoundCall, list[Any]] | None:
    """The *index*-th dispatch *into* last recorded, its call, and the launch values of *args*,
    where a
    dispatch of *kernel* with *args* and *launch* (grid, block, shared_mem) repeats it but for
    its scalars: the same kernel and launch shape, the same buffers (open), scalars of the same
    types, and no output to zero. Then a capture into it records the dispatch again without
    binding it anew (the recorded one is its plan); ``None`` otherwise."""
    if into._closed or index >= len(into.dispatches):
        return None
    recorded = into.dispatches[index]
    grid, block, shared_mem = launch
    planned_grid, planned_block, planned_mem = recorded._launch
    if (
        recorded.kernel is not kernel
        or type(shared_mem) is not int
        or shared_mem != planned_mem
        or ((grid != planned_grid or type(grid) is not int) and not same_dims(grid, planned_grid))
        or (
            (block != planned_block or type(block) is not int)
            and not same_dims(block, planned_block)
        )
    ):
        return None
    values = recorded._values_for(args)
    if values is None:
        return None
    for arg in recorded._call.args:
        if arg.zeroed or (arg.buffer is not None and arg.buffer.is_closed):
            return None  # to zero first, or stale: the general way (which says why)
    return recorded, recorded._call, values


def recorded_again(
    index: int, recorded: RecordedDispatch, node: int, values: list[Any]
) -> RecordedDispatch:
    """The *index*-th dispatch of a capture, which repeated *recorded* with launch *values*
    (``repeated``); its kernel node's handle is *node*."""
    again = RecordedDispatch(index, recorded._call, node, recorded._launch)
    again._values = values
    return again


def captured_graph(
    backend: GraphHost,
    graph: Any,
    nodes: dict[int, Any],
    dispatches: list[RecordedDispatch],
    buffers: list[ResidentBuffer],
) -> CapturedGraph:
    """The :class:`CapturedGraph` of a finished capture: *graph* (instantiated), whose nodes
    *nodes* maps from their capture-time handles, holding *dispatches* on *buffers*."""
    captured = CapturedGraph(backend)
    captured._take(graph, nodes, dispatches, buffers)
    return captured


def reuse_for(target: CapturedGraph, builder: Any, dispatches: list[RecordedDispatch]) -> Any:
    """*target*'s executable graph, updated in place (``cuGraphExecUpdate``) with what *builder*
    (a capture that ended) captured for *dispatches*, or ``None`` (then a new one is
    instantiated): in place only where both captures are nothing but dispatches, as many, each
    with as many nodes, so that the k-th dispatch's kernel node is the k-th one's still. (Work
    of other code in the new capture makes more nodes than the dispatches', and the driver
    refuses a graph of another node count.)"""
    if target._only_dispatches is None:  # captures in place keep the nodes as they were
        count = sum(d._nodes() for d in target.dispatches)
        target._only_dispatches = count == target._node_count
    if (
        target._closed
        or not target._only_dispatches
        or len(dispatches) != len(target._first)
        or sum(d._nodes() for d in dispatches) != target._node_count
    ):
        return None
    try:
        target._graph.update(builder)
    except Exception:  # the driver found them different: instantiate anew
        return None
    return target._graph


def recaptured(
    target: CapturedGraph,
    graph: Any,
    nodes: dict[int, Any],
    reused: bool,
    dispatches: list[RecordedDispatch],
    buffers: list[ResidentBuffer],
) -> CapturedGraph:
    """*target* made to run what a capture into it recorded: its own executable graph updated
    in place (*reused*), else *graph*, instantiated from the capture (whose nodes *nodes* maps
    from their handles); *dispatches* on *buffers* from now on."""
    if reused:
        target._attach(dispatches, buffers)
        target.updated_in_place += 1
    else:
        target._take(graph, nodes, dispatches, buffers)
    target.recaptures += 1
    return target
