"""What ``dispatch(..., graph="auto")`` chooses for one signature: eager dispatches or replays.

A replay is not always cheaper than the dispatch it recorded: the eager fast path launches a
small dispatch in one call, while a replay runs a graph. So "auto" does not assume; once a
signature repeated, it measures both ways and settles on the cheaper:

- ``MEASURING``: each dispatch of the signature runs one way or the other (``eager`` says which)
  and reports its cost with :meth:`Choice.took`: seconds from the ``dispatch()`` call (from
  where the fast path declined it, on the general path) to its completion as the reactor sees
  it. The ways take turns in blocks of :data:`BLOCK` samples, eager first, until there are
  :data:`SAMPLES` of each. The first dispatch of each block is not counted: a dispatch just
  after the other way's costs more than either way in its steady state (on NVIDIA H100 80GB
  HBM3s, the first eager 4 KiB round trip after replays took 1.2 to 3.8 µs more than the rest
  of its turn on the compiled core, 7.8 to 14 µs on the Python core), and strictly
  alternating samples once chose graphs that then lost 20 %.
- ``EAGER``: the medians showed the graph no cheaper, or no graph can be recorded. The
  dispatches run eagerly, and on the fast path (which reads :attr:`Choice.eager` and nothing
  else) without any bookkeeping of the cache. The decision is final.
- ``GRAPH``: the graph's median was at most :data:`GRAPH_GAIN` times the eager one. The
  dispatches replay graphs, and their replays are counted (:meth:`Choice.replayed`): the first
  time after :data:`REMEASURE_FIRST` of them, then after :data:`REMEASURE_AFTER`, the signature
  is measured again from scratch, so a choice made on a few noisy samples (the first ones come
  while the signature is new: its pools cold, the GPU's clocks rising), or on a machine whose
  pace changed, does not hold for good. Each time graphs win again after that, the next
  re-measurement waits twice as many replays, up to :data:`REMEASURE_MAX`.

``GraphCache.clear()`` forgets a choice, and the signature is measured again once it repeats.

:meth:`Choice._advance` is the one place the state changes; everything else asks its
attributes.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from asyncgraph._args._bound_args import InOutArg, OutArg, ResidentArg, ResidentOutArg

if TYPE_CHECKING:
    from asyncgraph._args._bound_args import BoundCall

__all__ = (
    "BLOCK",
    "GRAPH_GAIN",
    "REMEASURE_AFTER",
    "REMEASURE_FIRST",
    "REMEASURE_MAX",
    "REPLAYS_TOLD_EVERY",
    "SAMPLES",
    "Choice",
    "ChoiceState",
    "GraphChoiceStatistics",
    "describe",
)

# Samples of each way before "auto" decides (their medians are compared), taken in turns of
# BLOCK samples, each turn after one dispatch that is not counted.
SAMPLES = 8
BLOCK = 4
# A graph is chosen only where its median cost is at most this fraction of the eager one: an
# eager dispatch holds no graph memory, and a near tie is noise.
GRAPH_GAIN = 0.9
# Replays of a signature settled on graphs before it is measured again: first REMEASURE_FIRST
# (a choice made while the signature was new is checked soon), then REMEASURE_AFTER, doubled
# each time graphs win again, up to REMEASURE_MAX.
REMEASURE_FIRST = 64
REMEASURE_AFTER = 512
REMEASURE_MAX = 1 << 16
# The fast path counts a choice's replays itself and tells it (Choice.replayed) every this many,
# so that a replay costs no call for the count.
REPLAYS_TOLD_EVERY = 64


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
        remeasured: times the choice, settled on graphs, was measured again.
    """

    signature: str
    choice: str
    reason: str
    eager_seconds: float | None
    graph_seconds: float | None
    eager_samples: int
    graph_samples: int
    remeasured: int


class Choice:
    """``graph="auto"``'s choice for one signature (see the module).

    The dispatch paths read two plain attributes and call two methods:

    Attributes:
        eager: dispatches of the signature run eagerly now (an eager sample, or settled
            eager); otherwise they replay a graph.
        sampling: a dispatch that runs now reports its cost with :meth:`took`.
        state: the :class:`ChoiceState`.
        signature: the signature in words (:func:`describe`).
        remeasured: times the choice, settled on graphs, was measured again.

    Args:
        signature: the signature in words.
        settled: called with the choice once it settled (the cache frees the graphs of a
            signature settled on eager).
        samples: samples of each way before deciding.
        block: samples of one way in a row (after one not counted) before the other's turn.
        remeasure_after: replays, once settled on graphs, before measuring again (doubled
            each time graphs win again).
        remeasure_first: replays before the first measurement again, where fewer than
            *remeasure_after*.
    """

    __slots__ = (
        "_block",
        "_eager",
        "_graph",
        "_remeasure_after",
        "_replays",
        "_samples",
        "_settled",
        "_wait",
        "_warming",
        "eager",
        "reason",
        "remeasured",
        "sampling",
        "signature",
        "state",
    )

    def __init__(
        self,
        signature: str,
        settled: Callable[[Choice], None],
        samples: int = SAMPLES,
        block: int = BLOCK,
        remeasure_after: int = REMEASURE_AFTER,
        remeasure_first: int = REMEASURE_FIRST,
    ) -> None:
        self.signature = signature
        self._settled = settled
        self._samples = samples
        self._block = block
        self._remeasure_after = remeasure_after
        self._wait = min(remeasure_first, remeasure_after)  # replays before measuring again
        self._replays = 0  # replays since settling on graphs
        self._eager: list[float] = []
        self._graph: list[float] = []
        self.remeasured = 0
        self.state = ChoiceState.MEASURING
        self.eager = True  # eager samples first: no capture needed for them
        self.sampling = True
        self._warming = True  # the next sample opens a block: not counted
        self.reason = self._measuring()

    def __repr__(self) -> str:
        return f"<Choice {self.signature} {self.state.value}>"

    # -- what the dispatch paths report ------------------------------------------------------

    def took(self, eager: bool, seconds: float) -> None:
        """A sampled dispatch completed *seconds* after its ``dispatch()`` call: eagerly, or
        as a replay. The first of each block, those of the way whose turn ended, those beyond
        the ones needed and those after the choice settled are not counted."""
        if self.state is not ChoiceState.MEASURING or eager is not self.eager:
            return
        self._advance(seconds=seconds)

    def replayed(self, count: int = 1) -> None:
        """*count* dispatches of the signature replayed a graph: counted towards measuring
        again, once settled on graphs (the fast path tells them every
        :data:`REPLAYS_TOLD_EVERY`)."""
        if self.state is ChoiceState.GRAPH:
            self._replays += count
            if self._replays >= self._wait:
                self._advance(remeasure=True)

    def unrecordable(self, why: str) -> None:
        """No graph of the signature can ever be recorded (*why*): settle on eager."""
        if self.state is ChoiceState.MEASURING:
            self._advance(unrecordable=why)

    def forget(self) -> None:
        """The cache let go of this choice: dispatches of the signature ask it again."""
        self.state = ChoiceState.FORGOTTEN
        self.eager = self.sampling = False

    # -- the one place the state changes -----------------------------------------------------

    def _advance(
        self, seconds: float | None = None, unrecordable: str | None = None, remeasure: bool = False
    ) -> None:
        if unrecordable is not None:
            self._settle(ChoiceState.EAGER, f"eager: {unrecordable}")
            return
        if remeasure:
            self.remeasured += 1
            if self._wait >= self._remeasure_after:  # (not the first, earlier check)
                self._remeasure_after = min(2 * self._remeasure_after, REMEASURE_MAX)
            self._wait = self._remeasure_after
            self._replays = 0
            self._eager.clear()
            self._graph.clear()
            self.state = ChoiceState.MEASURING
            self.eager = self.sampling = self._warming = True
            self.reason = self._measuring()
            return
        n, block = self._samples, self._block
        mine = self._eager if self.eager else self._graph
        if self._warming:  # the first of the block: the other way's wake, not this one's cost
            self._warming = False
            return
        if seconds is not None and len(mine) < n:
            mine.append(seconds)
        eager, graph = len(self._eager), len(self._graph)
        if eager >= n and graph >= n:
            eager_s, graph_s = statistics.median(self._eager), statistics.median(self._graph)
            figures = (
                f"a replay took {graph_s * 1e6:.1f} µs, an eager dispatch "
                f"{eager_s * 1e6:.1f} µs (medians of {graph} and {eager}"
                + (f"; measured again {self.remeasured}x" if self.remeasured else "")
                + ")"
            )
            if graph_s <= GRAPH_GAIN * eager_s:
                self._settle(ChoiceState.GRAPH, f"graph: {figures}")
            else:
                self._settle(
                    ChoiceState.EAGER,
                    f"eager: {figures}; a graph must save {1 - GRAPH_GAIN:.0%} to be kept",
                )
            return
        other = graph if self.eager else eager
        if len(mine) >= n or (len(mine) % block == 0 and other < n):
            # Blocks in turns, eager first: the other way's turn, after one not counted.
            self.eager = not self.eager
            self._warming = True
        self.reason = self._measuring()

    def _settle(self, state: ChoiceState, reason: str) -> None:
        self.state = state
        self.eager = state is ChoiceState.EAGER
        self.sampling = False
        self.reason = reason
        self._settled(self)

    def _measuring(self) -> str:
        n = self._samples
        again = f"measuring again ({self.remeasured}x)" if self.remeasured else "measuring"
        eager, graph = len(self._eager), len(self._graph)
        return f"{again}: {eager} of {n} eager samples, {graph} of {n} replays"

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
            remeasured=self.remeasured,
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
