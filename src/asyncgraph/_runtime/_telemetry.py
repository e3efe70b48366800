"""Telemetry: counters, histograms and the structlog logger of the library.

Counters are plain attributes bumped on the event loop's thread (or counted elsewhere and added
in on each snapshot: the CUDA fast path's, ``Telemetry.add_source``); histograms keep counts in
logarithmic buckets (20 per decade, so a quantile read from them is within 12 % of the true
value), sorted into them a batch at a time so that recording a value is one append.
``snapshot()`` copies everything into frozen objects.

Log events go to ``structlog.get_logger("asyncgraph")``; the library never configures structlog.
Per-dispatch events are emitted only with ``BackendOptions(dispatch_events_enabled=True)``, so
the hot path costs nothing for logging otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import attrs
import numpy as np
import structlog

from asyncgraph._runtime._exceptions import DispatchError

from ._priority import NORMAL, PRIORITIES

__all__ = (
    "BUCKET_BOUNDS",
    "Counter",
    "Histogram",
    "HistogramSnapshot",
    "Telemetry",
    "TelemetrySnapshot",
    "logger",
)

logger = structlog.get_logger("asyncgraph")

_PER_DECADE = 20
_LOW = 1e-7  # 100 ns: the first bucket's upper bound
_DECADES = 10  # up to 1000 s
_N_BUCKETS = _PER_DECADE * _DECADES + 1  # the last bucket holds everything larger
_BOUNDS = (*(_LOW * 10 ** (i / _PER_DECADE) for i in range(_N_BUCKETS - 1)), math.inf)
_BOUNDS_ARRAY = np.array(_BOUNDS, np.float64)
BUCKET_BOUNDS = _BOUNDS  # each bucket's upper bound (the compiled fast path sorts by these)
FOLD_EVERY = 1024  # values a histogram keeps unsorted at most (see Histogram)


def _duration(seconds: float) -> str:
    """*seconds* in the unit that reads best: ``"12.3us"``, ``"4.56ms"``, ``"1.2s"``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g}us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g}ms"
    return f"{seconds:.3g}s"


@attrs.frozen(kw_only=True, repr=False)
class HistogramSnapshot:
    """A histogram of durations in seconds, frozen at snapshot time.

    Its ``repr`` shows the count and the percentiles a person reads (``p50``, ``p99``,
    ``max``); the buckets themselves are in :attr:`bounds` and :attr:`counts`.

    Attributes:
        count: values recorded.
        sum: their sum, in seconds.
        min: the smallest value (0.0 when empty).
        max: the largest value (0.0 when empty).
        bounds: the upper bound of each bucket, in seconds (the last is infinity).
        counts: values in each bucket (not cumulative).
    """

    count: int
    sum: float
    min: float
    max: float
    bounds: tuple[float, ...]
    counts: tuple[int, ...]

    def quantile(self, q: float) -> float:
        """The value below which a fraction *q* of the values lie, read from the buckets.

        Returns 0.0 for an empty histogram. The answer is the bucket's upper bound, clamped to
        the observed min and max, so it is within one bucket width (12 %) of the true value.

        Raises:
            DispatchError: *q* is not between 0 and 1.
        """
        if not 0.0 <= q <= 1.0:
            raise DispatchError(
                f"quantile q must be between 0 and 1, got {q}; pass 0.99 for the 99th percentile"
            )
        if self.count == 0:
            return 0.0
        rank = q * self.count
        seen = 0
        for bound, n in zip(self.bounds, self.counts, strict=True):
            seen += n
            if n and seen >= rank:
                return min(max(bound, self.min), self.max)
        return self.max

    @property
    def mean(self) -> float:
        """The mean value in seconds (0.0 when empty)."""
        return self.sum / self.count if self.count else 0.0

    def merged(self, *others: HistogramSnapshot) -> HistogramSnapshot:
        """One histogram of this one's values and *others*' (of the same buckets)."""
        parts = [h for h in (self, *others) if h.count]
        if not parts:
            return self
        counts = np.sum([h.counts for h in parts], axis=0)
        return HistogramSnapshot(
            count=sum(h.count for h in parts),
            sum=sum(h.sum for h in parts),
            min=min(h.min for h in parts),
            max=max(h.max for h in parts),
            bounds=self.bounds,
            counts=tuple(int(n) for n in counts),
        )

    def __repr__(self) -> str:
        if not self.count:
            return "HistogramSnapshot(count=0)"
        return (
            f"HistogramSnapshot(count={self.count}, mean={_duration(self.mean)}, "
            f"p50={_duration(self.quantile(0.5))}, p99={_duration(self.quantile(0.99))}, "
            f"max={_duration(self.max)})"
        )


class Histogram:
    """A histogram of durations in seconds (mutable; loop thread only).

    :meth:`record` runs several times per dispatch, so it only appends the value; the values
    are sorted into buckets :data:`FOLD_EVERY` at a time, in one numpy pass, and before every
    snapshot. A snapshot is the same as if each value had been bucketed when recorded.
    """

    __slots__ = ("_count", "_counts", "_max", "_min", "_pending", "_sum")

    def __init__(self) -> None:
        self._counts = np.zeros(_N_BUCKETS, np.int64)
        self._count = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = 0.0
        self._pending: list[float] = []

    @property
    def count(self) -> int:
        """Values recorded."""
        return self._count + len(self._pending)

    def record(self, value: float) -> None:
        """Add one value, in seconds."""
        pending = self._pending
        pending.append(value)
        if len(pending) >= FOLD_EVERY:
            self._fold()

    def add_counts(
        self, counts: Sequence[int], count: int, total: float, low: float, high: float
    ) -> None:
        """Merge values already sorted into this histogram's buckets elsewhere (the compiled
        fast path's): *counts* per bucket, their number, sum, smallest and largest."""
        if not count:
            return
        self._counts += np.asarray(counts, np.int64)
        self._count += count
        self._sum += total
        self._min = min(self._min, low)
        self._max = max(self._max, high)

    def record_all(self, values: list[float]) -> None:
        """Add each of *values*, in seconds, folded as :meth:`record` (a batch's waits; the
        Python fast path's, recorded with a bare append)."""
        pending = self._pending
        pending.extend(values)
        if len(pending) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        """Sort the values recorded since the last fold into the buckets."""
        if not self._pending:
            return
        values = np.array(self._pending, np.float64)
        self._pending.clear()
        # The first bucket whose upper bound is at least each value (bisect_left).
        buckets = np.searchsorted(_BOUNDS_ARRAY, values, side="left")
        np.minimum(buckets, _N_BUCKETS - 1, out=buckets)  # NaN sorts past infinity
        self._counts += np.bincount(buckets, minlength=_N_BUCKETS)
        self._count += len(values)
        self._sum += float(values.sum())
        self._min = min(self._min, float(values.min()))
        self._max = max(self._max, float(values.max()))

    def snapshot(self) -> HistogramSnapshot:
        """A frozen copy."""
        self._fold()
        return HistogramSnapshot(
            count=self._count,
            sum=self._sum,
            min=self._min if self._count else 0.0,
            max=self._max,
            bounds=_BOUNDS,
            counts=tuple(int(n) for n in self._counts),
        )


@attrs.frozen(kw_only=True)
class PoolCounters:
    """Counts a backend's pools report into the telemetry snapshot."""

    hits: int = 0
    misses: int = 0
    bytes_cached: int = 0
    bytes_in_use: int = 0


@attrs.frozen(kw_only=True)
class TelemetrySnapshot:
    """Everything a backend counted, frozen at the moment of ``snapshot()``.

    Attributes:
        dispatches: dispatches accepted by ``dispatch()``.
        fast_path_dispatches: those of them the CUDA backend's fast path launched (the steady
            state in one call of the dispatch core; see ``docs/core.md``), graph replays
            included.
        dispatches_completed: dispatches that completed successfully.
        dispatches_failed: dispatches that completed with an error (withdrawn ones too).
        dispatches_withdrawn: dispatches withdrawn before they launched: ``cancel()``, or every
            task awaiting them cancelled (``docs/jobs.md``).
        dispatches_timed_out: dispatches withdrawn when their ``queue_timeout`` ran out.
        in_flight: dispatches submitted and not yet completed.
        queued: dispatches waiting for an in-flight slot.
        bytes_up: bytes copied into the backend's memory (uploads and dispatch inputs).
        bytes_down: bytes copied out of it (downloads and dispatch results).
        copies_up: copies into the backend's memory.
        copies_down: copies out of it.
        buffer_copies: resident buffers copied into it by ``copy()`` (from it, or another).
        buffer_copy_bytes: their bytes.
        sync_points: times the host waited for the device (blocking waits, not polls).
        compile_cache_hits: kernels found compiled in memory or on disk.
        compile_cache_misses: kernels compiled.
        graph_cache_hits: dispatches served by a cached CUDA graph.
        graph_cache_misses: dispatches that found no cached graph.
        graph_captures: CUDA graphs captured.
        graph_replays: CUDA graph replays.
        graph_updates: in-place updates of executable graphs.
        graph_evictions: graphs evicted from the graph cache.
        pool_hits: pinned-pool requests served from cached blocks.
        pool_misses: pinned-pool requests that allocated.
        pool_bytes_cached: bytes of idle blocks the pinned pool holds.
        pool_bytes_in_use: bytes of pinned blocks handed out.
        queue_wait: seconds from ``dispatch()`` to submission.
        submit_time: seconds the host spent submitting a dispatch.
        completion_latency: seconds from ``dispatch()`` to completion.
        queue_wait_by_class: ``queue_wait`` per priority class (``"high"``, ``"normal"``,
            ``"low"``), of the dispatches that were submitted.
        completion_latency_by_class: ``completion_latency`` per priority class.
        device_time: kernel time of dispatches made with ``timing=True``.
    """

    dispatches: int
    fast_path_dispatches: int
    dispatches_completed: int
    dispatches_failed: int
    dispatches_withdrawn: int
    dispatches_timed_out: int
    in_flight: int
    queued: int
    bytes_up: int
    bytes_down: int
    copies_up: int
    copies_down: int
    buffer_copies: int
    buffer_copy_bytes: int
    sync_points: int
    compile_cache_hits: int
    compile_cache_misses: int
    graph_cache_hits: int
    graph_cache_misses: int
    graph_captures: int
    graph_replays: int
    graph_updates: int
    graph_evictions: int
    pool_hits: int
    pool_misses: int
    pool_bytes_cached: int
    pool_bytes_in_use: int
    queue_wait: HistogramSnapshot
    submit_time: HistogramSnapshot
    completion_latency: HistogramSnapshot
    device_time: HistogramSnapshot
    queue_wait_by_class: dict[str, HistogramSnapshot]
    completion_latency_by_class: dict[str, HistogramSnapshot]


# The names of the counters of a Telemetry that Telemetry.count adds to.
Counter = Literal[
    "buffer_copies",
    "buffer_copy_bytes",
    "bytes_down",
    "bytes_up",
    "compile_cache_hits",
    "compile_cache_misses",
    "copies_down",
    "copies_up",
    "dispatches",
    "dispatches_completed",
    "dispatches_failed",
    "dispatches_timed_out",
    "dispatches_withdrawn",
    "graph_cache_hits",
    "graph_cache_misses",
    "graph_captures",
    "graph_evictions",
    "graph_replays",
    "graph_updates",
    "sync_points",
]


class Telemetry:
    """The counters and histograms of one backend.

    Counters are bumped by the backend on the event loop's thread; read them through
    :meth:`snapshot`. ``queue_wait`` and ``completion_latency`` hold the default class's
    values (``"normal"``, the fast path's too); ``class_queue_wait[rank]`` and
    ``class_latency[rank]`` are each class's, the default class's being those two.
    """

    __slots__ = (
        "_in_flight",
        "_pools",
        "_sources",
        "buffer_copies",
        "buffer_copy_bytes",
        "bytes_down",
        "bytes_up",
        "class_latency",
        "class_queue_wait",
        "compile_cache_hits",
        "compile_cache_misses",
        "completion_latency",
        "copies_down",
        "copies_up",
        "device_time",
        "dispatches",
        "dispatches_completed",
        "dispatches_failed",
        "dispatches_timed_out",
        "dispatches_withdrawn",
        "fast_path_dispatches",
        "graph_cache_hits",
        "graph_cache_misses",
        "graph_captures",
        "graph_evictions",
        "graph_replays",
        "graph_updates",
        "queue_wait",
        "submit_time",
        "sync_points",
    )

    def __init__(
        self,
        in_flight: Callable[[], tuple[int, int]],
        pools: Callable[[], PoolCounters] | None = None,
    ) -> None:
        self._in_flight = in_flight
        self._pools = pools
        # What counts outside these attributes (the CUDA fast path) and adds it in on sync().
        self._sources: list[Callable[[Telemetry], None]] = []
        self.dispatches = 0
        self.fast_path_dispatches = 0
        self.dispatches_completed = 0
        self.dispatches_failed = 0
        self.dispatches_withdrawn = 0
        self.dispatches_timed_out = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.copies_up = 0
        self.copies_down = 0
        self.buffer_copies = 0
        self.buffer_copy_bytes = 0
        self.sync_points = 0
        self.compile_cache_hits = 0
        self.compile_cache_misses = 0
        self.graph_cache_hits = 0
        self.graph_cache_misses = 0
        self.graph_captures = 0
        self.graph_replays = 0
        self.graph_updates = 0
        self.graph_evictions = 0
        self.queue_wait = Histogram()
        self.submit_time = Histogram()
        self.completion_latency = Histogram()
        self.device_time = Histogram()
        self.class_queue_wait = tuple(
            self.queue_wait if rank == NORMAL else Histogram() for rank in range(len(PRIORITIES))
        )
        self.class_latency = tuple(
            self.completion_latency if rank == NORMAL else Histogram()
            for rank in range(len(PRIORITIES))
        )

    def count(self, counter: Counter, by: int = 1) -> None:
        """Add *by* to the counter named *counter* (the way other objects count here)."""
        setattr(self, counter, getattr(self, counter) + by)

    def add_source(self, flush: Callable[[Telemetry], None]) -> None:
        """Count what *flush* counted elsewhere: :meth:`sync` calls it, and it adds what it
        counted since its last call into this object's counters and histograms."""
        self._sources.append(flush)

    def sync(self) -> None:
        """Bring in what the sources counted since the last sync (every snapshot does)."""
        for flush in self._sources:
            flush(self)

    def snapshot(self) -> TelemetrySnapshot:
        """Copy every counter and histogram into a frozen :class:`TelemetrySnapshot`."""
        self.sync()
        in_flight, queued = self._in_flight()
        pools = self._pools() if self._pools is not None else PoolCounters()
        waits = {
            name: h.snapshot() for name, h in zip(PRIORITIES, self.class_queue_wait, strict=True)
        }
        latencies = {
            name: h.snapshot() for name, h in zip(PRIORITIES, self.class_latency, strict=True)
        }
        return TelemetrySnapshot(
            dispatches=self.dispatches,
            fast_path_dispatches=self.fast_path_dispatches,
            dispatches_completed=self.dispatches_completed,
            dispatches_failed=self.dispatches_failed,
            dispatches_withdrawn=self.dispatches_withdrawn,
            dispatches_timed_out=self.dispatches_timed_out,
            in_flight=in_flight,
            queued=queued,
            bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
            copies_up=self.copies_up,
            copies_down=self.copies_down,
            buffer_copies=self.buffer_copies,
            buffer_copy_bytes=self.buffer_copy_bytes,
            sync_points=self.sync_points,
            compile_cache_hits=self.compile_cache_hits,
            compile_cache_misses=self.compile_cache_misses,
            graph_cache_hits=self.graph_cache_hits,
            graph_cache_misses=self.graph_cache_misses,
            graph_captures=self.graph_captures,
            graph_replays=self.graph_replays,
            graph_updates=self.graph_updates,
            graph_evictions=self.graph_evictions,
            pool_hits=pools.hits,
            pool_misses=pools.misses,
            pool_bytes_cached=pools.bytes_cached,
            pool_bytes_in_use=pools.bytes_in_use,
            queue_wait=HistogramSnapshot.merged(*waits.values()),
            submit_time=self.submit_time.snapshot(),
            completion_latency=HistogramSnapshot.merged(*latencies.values()),
            device_time=self.device_time.snapshot(),
            queue_wait_by_class=waits,
            completion_latency_by_class=latencies,
        )
