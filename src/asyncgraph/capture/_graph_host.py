"""What the graphs of this package need from the backend that records and replays them.

The CUDA engine implements :class:`GraphHost`; the graphs use nothing else of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from asyncgraph._args._bound_args import BoundCall
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._buffers._resident import ResidentBuffer
    from asyncgraph._runtime._telemetry import Telemetry
    from asyncgraph.pool import HostPool

    from ._choice import Choice
    from ._guard import CaptureGuard

__all__ = ("GraphHost", "KernelNode")


class KernelNode(NamedTuple):
    """A kernel node of an executable graph, as updating its arguments needs it."""

    graph_exec: Any  # the executable graph's CUgraphExec
    handle: int  # the node's handle in the graph the executable graph was made from
    node: Any  # the same node as a ``cuda.core`` executable node


class GraphHost(Protocol):
    """A backend's side of recorded and captured graphs (on the loop's thread)."""

    telemetry: Telemetry  # graph counters, bytes moved
    pinned: HostPool  # pinned blocks a recorded graph copies through
    capture_stream: Any  # the stream graphs are captured and uploaded on (cuda.core)
    capture_handle: Any  # its CUstream
    ctx: Any  # the backend's context: ``with ctx:`` around a graph's own driver calls

    def alloc_bytes(self, nbytes: int) -> Any:
        """Device storage of *nbytes* bytes, usable from every stream."""
        ...

    def free_storage(self, storage: Any) -> None:
        """Free storage from :meth:`alloc_bytes`."""
        ...

    def run_capture(self, body: Callable[[CaptureGuard], int]) -> tuple[Any, dict[int, Any], int]:
        """Capture what *body* enqueues on the capture stream: (graph, nodes, body's result)."""
        ...

    def capture_launch(self, call: BoundCall, base: int, guard: CaptureGuard) -> int:
        """Enqueue *call*'s kernel on the capturing stream (its staged arguments at device
        address *base*); the handle of its kernel node."""
        ...

    def update_nodes(self, nodes: list[KernelNode], call: BoundCall, values: list[Any]) -> None:
        """Set the arguments of the kernel *nodes* to *values* (launch values: scalars, and
        pointers as ints) for *call*'s kernel and launch shape, in place."""
        ...

    def bind_like(self, kernel: Kernel, args: tuple[object, ...], like: BoundCall) -> BoundCall:
        """Validate *args* as ``dispatch()`` does, with the launch shape of *like*."""
        ...

    def replay_job(self, call: BoundCall, graph: Any) -> Any:
        """A job that replays *graph* for *call*."""
        ...

    def replay_fast(
        self,
        graph: Any,
        call: BoundCall,
        buffers: list[ResidentBuffer],
        writes: tuple[bool, ...],
        choice: Choice | None,
        started: float,
    ) -> Awaitable[Any] | None:
        """Launch a replay of *graph* (ready: its inputs and scalars set) for *call*, on the
        resident *buffers* (written where *writes* says), on the backend's fast path now, and
        return its pending result; ``None``, having changed nothing, when it cannot.
        *choice*: told the replay's cost from *started* (``perf_counter()``) once it ended."""
        ...

    def route_replays(
        self,
        call: BoundCall,
        instances: list[Any],
        choice: Choice | None,
        hit: Callable[[], None],
    ) -> bool:
        """Have the fast path replay *instances* (the cache's list of its graphs of *call*'s
        signature) for later dispatches of that signature (``"auto"`` ones while *choice*
        chose graphs), calling *hit* for each; whether it will."""
        ...

    def run_replay(self, job: Any) -> Awaitable[Any]:
        """Schedule a replay job like a dispatch; the awaitable gives its results."""
        ...

    def forget(self, graph: Any) -> None:
        """*graph* closed: the backend need not close it any more."""
        ...

    def record_now(self, call: BoundCall) -> Any:
        """A :class:`CachedGraph` of *call* recorded now, or ``None`` if it cannot be now."""
        ...

    def recordable(self, call: BoundCall) -> bool:
        """Whether *call* can be recorded at all (a dispatch big enough to stream cannot)."""
        ...

    def eager_job(self, call: BoundCall) -> Any:
        """The plain job of *call*, as ``dispatch(graph="never")`` makes it."""
        ...

    def sample(self, job: Any, choice: Choice, started: float) -> None:
        """When *job* completes, report to *choice* how long it took from *started*
        (``perf_counter()`` at its ``dispatch()`` call): ``choice.took(eager, seconds)``."""
        ...

    def steer(self, call: BoundCall, choice: Choice) -> None:
        """Let the fast path take ``graph="auto"`` dispatches with *call*'s signature eagerly
        while ``choice.eager`` holds (and report their costs while ``choice.sampling``)."""
        ...
