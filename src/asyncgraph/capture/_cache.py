"""The graph cache behind ``dispatch(..., graph="auto" | "always")``."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import attrs

from .._bound import BoundCall
from ._graphs import CachedGraph, prepare_replay
from ._host import GraphHost

__all__ = ("GraphCache", "GraphCacheStatistics")

# Signatures seen but not yet recorded are forgotten past this many (a bound on memory).
_SEEN_LIMIT = 4096


@attrs.frozen(kw_only=True)
class GraphCacheStatistics:
    """Counts of a :class:`GraphCache`, frozen at the moment of ``statistics()``.

    Attributes:
        hits: dispatches replayed from a recorded graph.
        misses: dispatches that ran without one (signature not repeated yet, every instance
            busy at the bound, or the capture lock held elsewhere).
        captures: graphs recorded (one per instance; each holds two variants at most).
        updates: replays whose scalars changed, updated in place instead of recorded again.
        evictions: instances freed to stay within the byte bound.
        bytes: pinned and device bytes the cached graphs hold.
        signatures: signatures with recorded graphs.
        instances: recorded graphs over all signatures.
    """

    hits: int
    misses: int
    captures: int
    updates: int
    evictions: int
    bytes: int
    signatures: int
    instances: int


class _Entry:
    __slots__ = ("instances",)

    def __init__(self) -> None:
        self.instances: list[CachedGraph] = []


class GraphCache:
    """Recorded dispatch graphs of one backend, keyed by signature, bounded by bytes (LRU).

    A signature is the kernel, each argument's kind with its shape and dtype (a scalar's dtype,
    a resident buffer's identity) and the launch shape. Once a signature has been dispatched
    ``repeats`` times (``graph="auto"``; at once with ``"always"``) the next dispatch records a
    :class:`CachedGraph` and the following ones replay it. Each signature keeps up to
    ``instances`` graphs, one per concurrent dispatch, so equal-shape requests do not queue
    behind one executable. Changed scalars update the graph's kernel node in place.

    Args:
        backend: the CUDA backend.
        max_bytes: bound on the bytes the graphs hold; least recently used ones go first.
        repeats: dispatches of a signature before ``"auto"`` records it.
        instances: graphs per signature at most.
    """

    def __init__(self, backend: GraphHost, max_bytes: int, repeats: int, instances: int) -> None:
        self._backend = backend
        self.max_bytes = max_bytes
        self.repeats = repeats
        self.max_instances = instances
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._seen: dict[tuple[Any, ...], int] = {}
        self._hits = self._misses = self._captures = self._updates = self._evictions = 0
        self._bytes = 0

    def __repr__(self) -> str:
        return (
            f"<GraphCache signatures={len(self._entries)} bytes={self._bytes} "
            f"hits={self._hits} misses={self._misses}>"
        )

    def statistics(self) -> GraphCacheStatistics:
        """Frozen counts."""
        return GraphCacheStatistics(
            hits=self._hits,
            misses=self._misses,
            captures=self._captures,
            updates=self._updates,
            evictions=self._evictions,
            bytes=self._bytes,
            signatures=len(self._entries),
            instances=sum(len(e.instances) for e in self._entries.values()),
        )

    @staticmethod
    def _key(call: BoundCall) -> tuple[Any, ...] | None:
        parts: list[Any] = [call.kernel, call.grid, call.block, call.shared_mem]
        for arg in call.args:
            signature = arg.signature()
            if signature is None:  # a foreign device array: not recorded
                return None
            parts.append(signature)
        return tuple(parts)

    def job_for(self, call: BoundCall, always: bool) -> Any:
        """A replay job for *call*, or ``None`` to run it without a graph."""
        if call.foreign:
            return None
        key = self._key(call)
        if key is None:
            return None
        backend = self._backend
        entry = self._entries.get(key)
        if entry is None:
            seen = self._seen.get(key, 0) + 1
            if not always and seen < self.repeats:
                if len(self._seen) >= _SEEN_LIMIT:
                    self._seen.clear()
                self._seen[key] = seen
                return self._miss()
            self._seen.pop(key, None)
            entry = self._entries[key] = _Entry()
        self._entries.move_to_end(key)
        graph = next((g for g in entry.instances if not g.is_busy), None)
        if graph is not None:
            self._hits += 1
            backend.telemetry.graph_cache_hits += 1
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
        job = prepare_replay(graph, call)
        self._updates += backend.telemetry.graph_updates > updates
        return job

    def _miss(self) -> None:
        self._misses += 1
        self._backend.telemetry.graph_cache_misses += 1

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
                self._backend.telemetry.graph_evictions += 1
            if not entry.instances:
                del self._entries[key]

    def clear(self) -> None:
        """Free every cached graph."""
        for entry in self._entries.values():
            for graph in entry.instances:
                graph.close()
        self._entries.clear()
        self._seen.clear()
        self._bytes = 0
