"""What ``dispatch(..., graph="auto")`` chooses for one signature: eager dispatches or replays.

A replay is not always cheaper than the dispatch it recorded: the eager fast path launches a
small dispatch in one call, while a replay goes through the general path. So "auto" does not
assume; once a signature repeated, it measures both ways, alternating, and settles on the
cheaper:

- ``MEASURING``: each dispatch of the signature runs one way or the other (``eager`` says which)
  and reports its cost with :meth:`Choice.took`: seconds from the ``dispatch()`` call (from
  where the fast path declined it, on the general path) to its completion as the reactor sees
  it. Eager and graph samples alternate, eager first, until
  there are :data:`SAMPLES` of each.
- ``EAGER``: the medians showed the graph no cheaper, or no graph can be recorded. The
  dispatches run eagerly, and on the fast path (which reads :attr:`Choice.eager` and nothing
  else) without any bookkeeping of the cache.
- ``GRAPH``: the graph's median was at most :data:`GRAPH_GAIN` times the eager one. The
  dispatches replay graphs.

A decision is final for the life of the choice: ``GraphCache.clear()`` forgets it, and the
signature is measured again once it repeats.

:meth:`Choice._advance` is the one place the state changes; everything else asks its
attributes.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from asyncgraph.args._bound_args import InOutArg, OutArg, ResidentArg, ResidentOutArg

if TYPE_CHECKING:
    from asyncgraph.args._bound_args import BoundCall

__all__ = ("GRAPH_GAIN", "SAMPLES", "Choice", "ChoiceState", "GraphChoiceStatistics", "describe")

# Samples of each way before "auto" decides (their medians are compared).
SAMPLES = 7
# A graph is chosen only where its median cost is at most this fraction of the eager one: an
# eager dispatch holds no graph memory, and a near tie is noise.
GRAPH_GAIN = 0.9


class ChoiceState(enum.Enum):
    """Where a :class:`Choice` stands."""

    MEASURING = "measuring"
    EAGER = "eager"
    GRAPH = "graph"
    FORGOTTEN = "forgotten"  # the cache let go of it (``clear``): nothing reads it any more


@attrs.frozen(kw_only=True)
class GraphChoiceStatistics:
    """What ``graph="auto"`` chose for one signature, and what it measured.

    Attributes:
        signature: the kernel, its arguments' kinds, dtypes and shapes, and the launch shape.
        choice: ``"measuring"``, ``"eager"`` or ``"graph"``.
        reason: why, in words, with the figures.
        eager_seconds: the median of the eager samples (seconds from ``dispatch()`` to
            completion), or ``None`` before the first.
        graph_seconds: the median of the replays' samples, or ``None`` before the first.
        eager_samples: eager dispatches measured.
        graph_samples: replays measured.
    """

    signature: str
    choice: str
    reason: str
    eager_seconds: float | None
    graph_seconds: float | None
    eager_samples: int
    graph_samples: int


class Choice:
    """``graph="auto"``'s choice for one signature (see the module).

    The dispatch paths read two plain attributes and call one method:

    Attributes:
        eager: dispatches of the signature run eagerly now (an eager sample, or settled
            eager); otherwise they replay a graph.
        sampling: a dispatch that runs now reports its cost with :meth:`took`.
        state: the :class:`ChoiceState`.
        signature: the signature in words (:func:`describe`).

    Args:
        signature: the signature in words.
        settled: called with the choice once it settled (the cache frees the graphs of a
            signature settled on eager).
        samples: samples of each way before deciding.
    """

    __slots__ = (
        "_eager",
        "_graph",
        "_samples",
        "_settled",
        "eager",
        "reason",
        "sampling",
        "signature",
        "state",
    )

    def __init__(
        self, signature: str, settled: Callable[[Choice], None], samples: int = SAMPLES
    ) -> None:
        self.signature = signature
        self._settled = settled
        self._samples = samples
        self._eager: list[float] = []
        self._graph: list[float] = []
        self.state = ChoiceState.MEASURING
        self.eager = True  # eager samples first: no capture needed for them
        self.sampling = True
        self.reason = self._measuring()

    def __repr__(self) -> str:
        return f"<Choice {self.signature} {self.state.value}>"

    # -- what the dispatch paths report ------------------------------------------------------

    def took(self, eager: bool, seconds: float) -> None:
        """A sampled dispatch completed *seconds* after its ``dispatch()`` call: eagerly, or
        as a replay. Samples beyond those needed, or once the choice settled, are ignored."""
        samples = self._eager if eager else self._graph
        if self.state is not ChoiceState.MEASURING or len(samples) >= self._samples:
            return
        samples.append(seconds)
        self._advance(None)

    def unrecordable(self, why: str) -> None:
        """No graph of the signature can ever be recorded (*why*): settle on eager."""
        if self.state is ChoiceState.MEASURING:
            self._advance(why)

    def forget(self) -> None:
        """The cache let go of this choice: dispatches of the signature ask it again."""
        self.state = ChoiceState.FORGOTTEN
        self.eager = self.sampling = False

    # -- the one place the state changes -----------------------------------------------------

    def _advance(self, unrecordable: str | None) -> None:
        n = self._samples
        eager, graph = len(self._eager), len(self._graph)
        if unrecordable is not None:
            self._settle(ChoiceState.EAGER, f"eager: {unrecordable}")
        elif eager >= n and graph >= n:
            eager_s, graph_s = statistics.median(self._eager), statistics.median(self._graph)
            figures = (
                f"a replay took {graph_s * 1e6:.1f} µs, an eager dispatch "
                f"{eager_s * 1e6:.1f} µs (medians of {graph} and {eager})"
            )
            if graph_s <= GRAPH_GAIN * eager_s:
                self._settle(ChoiceState.GRAPH, f"graph: {figures}")
            else:
                self._settle(
                    ChoiceState.EAGER,
                    f"eager: {figures}; a graph must save {1 - GRAPH_GAIN:.0%} to be kept",
                )
        else:
            # Alternate, eager first: the next dispatch goes the way with fewer samples.
            self.eager = eager < n and (graph >= n or eager <= graph)
            self.reason = self._measuring()

    def _settle(self, state: ChoiceState, reason: str) -> None:
        self.state = state
        self.eager = state is ChoiceState.EAGER
        self.sampling = False
        self.reason = reason
        self._settled(self)

    def _measuring(self) -> str:
        n = self._samples
        return (
            f"measuring: {len(self._eager)} of {n} eager samples, {len(self._graph)} of {n} replays"
        )

    # -- reading -------------------------------------------------------------------------------

    def medians(self) -> tuple[float | None, float | None]:
        """The medians of the eager and the graph samples (``None`` where there are none)."""
        return (
            statistics.median(self._eager) if self._eager else None,
            statistics.median(self._graph) if self._graph else None,
        )

    def statistics(self) -> GraphChoiceStatistics:
        """A frozen account of the choice."""
        eager_s, graph_s = self.medians()
        return GraphChoiceStatistics(
            signature=self.signature,
            choice=self.state.value,
            reason=self.reason,
            eager_seconds=eager_s,
            graph_seconds=graph_s,
            eager_samples=len(self._eager),
            graph_samples=len(self._graph),
        )


def describe(call: BoundCall) -> str:
    """*call*'s signature in words: ``scale(float32[1024], Out float32[1024], float32, int32)
    grid (4, 1, 1) block (256, 1, 1)``."""
    parts: list[str] = []
    for arg in call.args:
        prefix = _PREFIX.get(type(arg), "")
        value: Any = arg.buffer if arg.buffer is not None else arg.value
        parts.append(
            str(value.dtype) if arg.by_value else f"{prefix}{value.dtype}{list(value.shape)}"
        )
    launch = f"grid {call.grid} block {call.block}"
    if call.shared_mem:
        launch += f" shared_mem {call.shared_mem}"
    return f"{call.kernel.name}({', '.join(parts)}) {launch}"


_PREFIX: dict[type, str] = {
    OutArg: "Out ",
    InOutArg: "InOut ",
    ResidentArg: "buffer ",
    ResidentOutArg: "Out(into=buffer) ",
}
