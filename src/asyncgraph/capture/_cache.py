"""The graph cache behind ``dispatch(..., graph="auto" | "always")``."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import attrs

from ._choice import Choice, ChoiceState, GraphChoiceStatistics, describe
from ._graphs import CachedGraph, prepare_replay

if TYPE_CHECKING:
    from asyncgraph._args._bound_args import BoundCall
    from asyncgraph._runtime._telemetry import Telemetry

    from ._graph_host import GraphHost

__all__ = ("GraphCache", "GraphCacheStatistics")

# Signatures seen but not yet measured are forgotten past this many (a bound on memory), and so
# are the choices made, past this many.
_SEEN_LIMIT = 4096


@attrs.frozen(kw_only=True)
class GraphCacheStatistics:
    """Counts of a :class:`GraphCache`, frozen at the moment of ``statistics()``.

    Attributes:
        hits: dispatches replayed from a recorded graph.
        misses: dispatches the cache saw run without one (signature not repeated yet, every
            instance busy at the bound, the capture lock held elsewhere, or ``"auto"`` chose
            eager for it and the dispatch could not take the fast path; those on the fast path
            are not counted here, only in the telemetry's ``fast_path_dispatches``).
        captures: graphs recorded (one per instance; each holds two variants at most).
        updates: replays whose scalars changed, updated in place instead of recorded again.
        evictions: instances freed to stay within the byte bound.
        bytes: pinned and device bytes the cached graphs hold.
        signatures: signatures with recorded graphs.
        instances: recorded graphs over all signatures.
        measuring: signatures ``"auto"`` is measuring both ways.
        chose_eager: signatures ``"auto"`` settled on eager dispatches.
        chose_graph: signatures ``"auto"`` settled on graph replays.
        choices: what ``"auto"`` chose for each signature and why, with the costs it measured
            (:class:`~asyncgraph.capture.GraphChoiceStatistics`), oldest first.
    """

    hits: int
    misses: int
    captures: int
    updates: int
    evictions: int
    bytes: int
    signatures: int
    instances: int
    measuring: int
    chose_eager: int
    chose_graph: int
    choices: tuple[GraphChoiceStatistics, ...]


class _Entry:
    __slots__ = ("choice", "instances", "routed")

    def __init__(self, choice: Choice | None) -> None:
        self.instances: list[CachedGraph] = []
        self.choice = choice  # the "auto" choice it was recorded for (None: only "always")
        self.routed = False  # the fast path was asked to replay them (GraphHost.route_replays)


class GraphCache:
    """Recorded dispatch graphs of one backend, keyed by signature, bounded by bytes (LRU).

    A signature is the kernel, each argument's kind with its shape and dtype (a scalar's dtype,
    a resident buffer's identity) and the launch shape. ``"always"`` records a
    :class:`CachedGraph` on first sight and replays it from then on. ``"auto"`` measures: once
    a signature has been dispatched ``repeats`` times, its next dispatches take turns between
    eager dispatches and replays of a recorded graph, each timed from the ``dispatch()`` call to
    its completion, and then keep to the cheaper, a choice of graphs being measured again now
    and then (``asyncgraph.capture._choice``; the choice is made for the shapes, so it holds
    for other resident buffers of the same dtypes too). Each
    signature keeps up to ``instances`` graphs, one per concurrent dispatch, so equal-shape
    requests do not queue behind one executable. Changed scalars update the graph's kernel node
    in place.

    Args:
        backend: the CUDA backend.
        max_bytes: bound on the bytes the graphs hold; least recently used ones go first.
        repeats: dispatches of a signature before ``"auto"`` measures it.
        instances: graphs per signature at most.
    """

    def __init__(self, backend: GraphHost, max_bytes: int, repeats: int, instances: int) -> None:
        self._backend = backend
        self.max_bytes = max_bytes
        self.repeats = repeats
        self.max_instances = instances
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._seen: dict[tuple[Any, ...], int] = {}
        self._choices: dict[tuple[Any, ...], Choice] = {}
        # Per argument plan (``_args._plan_cache.Plan``), the choice that keeps its calls eager:
        # while it does, job_for() answers them at once, without their signature.
        self._kept: dict[Any, Choice] = {}
        self._hits = self._misses = self._captures = self._updates = self._evictions = 0
        self._hits_told = 0  # of them, those the telemetry counted already (_tell)
        self._bytes = 0
        backend.telemetry.add_source(self._tell)

    def __repr__(self) -> str:
        return (
            f"<GraphCache signatures={len(self._entries)} bytes={self._bytes} "
            f"hits={self._hits} misses={self._misses} choices={len(self._choices)}>"
        )

    def statistics(self) -> GraphCacheStatistics:
        """Frozen counts, and what ``"auto"`` chose for each signature."""
        choices = tuple(choice.statistics() for choice in self._choices.values())
        states = [choice.state for choice in self._choices.values()]
        return GraphCacheStatistics(
            hits=self._hits,
            misses=self._misses,
            captures=self._captures,
            updates=self._updates,
            evictions=self._evictions,
            bytes=self._bytes,
            signatures=len(self._entries),
            instances=sum(len(e.instances) for e in self._entries.values()),
            measuring=states.count(ChoiceState.MEASURING),
            chose_eager=states.count(ChoiceState.EAGER),
            chose_graph=states.count(ChoiceState.GRAPH),
            choices=choices,
        )

    @staticmethod
    def _keys(call: BoundCall) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
        """*call*'s signature, and the signature "auto" chooses for: the same with each
        resident buffer's dtype for its identity (``None``: it cannot be recorded)."""
        parts: list[Any] = [call.kernel, call.grid, call.block, call.shared_mem]
        shapes = list(parts) if call.resident else parts
        for arg in call.args:
            signature = arg.signature()
            if signature is None:  # a foreign device array: not recorded
                return None
            parts.append(signature)
            if call.resident:
                buffer = arg.buffer
                shapes.append(signature if buffer is None else (type(arg), buffer.dtype.str))
        key = tuple(parts)
        return key, (tuple(shapes) if call.resident else key)

    def job_for(self, call: BoundCall, always: bool, started: float, inline: bool) -> Any:
        """The job for *call* with ``graph="always"`` or ``"auto"``: a replay, an eager job,
        or ``None`` to run it as a plain dispatch; or, where *inline* allows, a replay already
        launched on the fast path (its ``PendingDispatch``). *started* is when ``dispatch()``
        was called (``perf_counter()``), from which a measured dispatch's cost is counted."""
        if not always:
            kept = self._kept.get(call.plan)
            if kept is not None and kept.eager:
                return None  # chose eager dispatches: the plain one runs
        if call.foreign or (call.fresh is not None and not always):
            return None  # new resident outputs each time: never the same signature twice
        keys = self._keys(call)
        if keys is None:
            return None
        key, shapes = keys
        if always:
            return self._replay(key, call, None, started, inline)
        choice = self._choices.get(shapes)
        if choice is None:
            choice = self._choose(shapes, call)
            if choice is None:
                return self._miss()
        if choice.eager:
            if choice.sampling:
                job = self._backend.eager_job(call)
                self._backend.sample(job, choice, started)
                return job
            self._backend.steer(call, choice)  # it missed the fast path: maybe no plan had it
            plan = call.plan
            if plan is not None and not call.resident:  # (its choice's signature is its plan's)
                if len(self._kept) >= _SEEN_LIMIT:
                    self._kept.clear()
                self._kept[plan] = choice  # its calls kept eager without asking again
            return self._miss()
        return self._replay(key, call, choice, started, inline)

    def _choose(self, shapes: tuple[Any, ...], call: BoundCall) -> Choice | None:
        """Count a sighting of *call*'s signature; once it repeated, a new choice for it."""
        seen = self._seen.get(shapes, 0) + 1
        if seen < self.repeats:
            if len(self._seen) >= _SEEN_LIMIT:
                self._seen.clear()
            self._seen[shapes] = seen
            return None
        self._seen.pop(shapes, None)
        if len(self._choices) >= _SEEN_LIMIT:
            self._forget_choices()
        choice = self._choices[shapes] = Choice(describe(call), self._settled)
        if not self._backend.recordable(call):
            choice.unrecordable("it moves too many bytes to be recorded (it streams)")
        self._backend.steer(call, choice)
        return choice

    def _replay(
        self,
        key: tuple[Any, ...],
        call: BoundCall,
        choice: Choice | None,
        started: float,
        inline: bool,
    ) -> Any:
        """A replay of a graph of *key* (recorded now if none is free): its job, or its pending
        result where it was launched inline; or ``None``. The first asks the fast path to
        replay the entry's graphs from then on (once: a signature it cannot take, one with
        resident buffers say, is not asked again)."""
        backend = self._backend
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(choice)
        elif entry.choice is None and choice is not None:  # recorded for "always" first
            entry.choice = choice
            entry.routed = False  # the fast path learns the choice too
        self._entries.move_to_end(key)
        graph = next((g for g in entry.instances if not g.is_busy), None)
        if graph is not None:
            self.hit()
            if choice is not None:
                choice.replayed()  # (the fast path counts its own replays: ReplayRoute)
        elif len(entry.instances) >= self.max_instances:
            return self._miss()
        else:
            graph = backend.record_now(call)
            if graph is None:  # the kernel is not loaded yet, or another capture runs
                if not entry.instances:
                    del self._entries[key]
                return self._miss()
            entry.instances.append(graph)
            self._captures += 1
            self._bytes += graph.nbytes
            self._evict(keep=graph)
        updates = backend.telemetry.graph_updates
        sampled = choice if choice is not None and choice.sampling else None
        job = prepare_replay(graph, call, inline, sampled, started)
        self._updates += backend.telemetry.graph_updates > updates
        if not entry.routed:
            backend.route_replays(call, entry.instances, entry.choice, self.hit)
            entry.routed = True
        return job

    def hit(self) -> None:
        """Count a replay of a cached graph (the fast path's too: it calls this from C, so it
        stays one call; the telemetry hears of the hits when it syncs, :meth:`_tell`)."""
        self._hits += 1

    def _tell(self, telemetry: Telemetry) -> None:
        """Add the hits since the last sync to *telemetry* (a source of it)."""
        telemetry.count("graph_cache_hits", self._hits - self._hits_told)
        self._hits_told = self._hits

    def _settled(self, choice: Choice) -> None:
        """*choice* settled: on eager, its graphs are freed (they will not be replayed)."""
        if choice.state is not ChoiceState.EAGER:
            return
        for key in [k for k, entry in self._entries.items() if entry.choice is choice]:
            for graph in self._entries.pop(key).instances:
                self._bytes -= graph.nbytes
                graph.close()  # a busy one is freed once its replay completed

    def _forget_choices(self) -> None:
        for choice in self._choices.values():
            choice.forget()
        self._choices.clear()
        self._kept.clear()

    def _miss(self) -> None:
        self._misses += 1
        self._backend.telemetry.count("graph_cache_misses")

    def _evict(self, keep: CachedGraph) -> None:
        """Free least recently used instances until the bytes fit (never *keep*)."""
        if self._bytes <= self.max_bytes:
            return
        for key in list(self._entries):
            entry = self._entries[key]
            for graph in list(entry.instances):
                if self._bytes <= self.max_bytes:
                    return
                if graph is keep:
                    continue
                entry.instances.remove(graph)
                self._bytes -= graph.nbytes
                graph.close()  # a busy one is freed once its replay completed
                self._evictions += 1
                self._backend.telemetry.count("graph_evictions")
            if not entry.instances:
                del self._entries[key]

    def clear(self) -> None:
        """Free every cached graph, and forget what ``"auto"`` chose: signatures are measured
        again once they repeat."""
        for entry in self._entries.values():
            for graph in entry.instances:
                graph.close()
        self._entries.clear()
        self._seen.clear()
        self._forget_choices()
        self._bytes = 0
