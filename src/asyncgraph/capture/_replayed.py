"""A replay of a graph, on the backend's fast path where it takes it, else as a job."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncgraph._args._bound_args import BoundCall
    from asyncgraph._buffers._resident import ResidentBuffer

    from ._choice import Choice
    from ._graph_host import GraphHost

__all__ = ("on_fast_path", "replayed")


def replayed(
    backend: GraphHost,
    graph: Any,
    call: BoundCall,
    buffers: list[ResidentBuffer],
    writes: tuple[bool, ...],
) -> Awaitable[Any]:
    """Run a replay of *graph* (ready for *call*) on *buffers*: on the backend's fast path, else
    as a job of the general path; the awaitable gives its results."""
    pending = on_fast_path(backend, graph, call, buffers, writes, None, 0.0)
    if pending is not None:
        return pending
    return backend.run_replay(backend.replay_job(call, graph))


def on_fast_path(
    backend: GraphHost,
    graph: Any,
    call: BoundCall,
    buffers: list[ResidentBuffer],
    writes: tuple[bool, ...],
    choice: Choice | None,
    started: float,
) -> Awaitable[Any] | None:
    """:meth:`GraphHost.replay_fast`; the graph is let go of (``replay_done``) if it raises."""
    try:
        return backend.replay_fast(graph, call, buffers, writes, choice, started)
    except BaseException:
        graph.replay_done()
        raise
