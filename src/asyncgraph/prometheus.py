"""Prometheus metrics of asyncgraph backends (the ``prometheus`` extra: prometheus-client).

    from prometheus_client import REGISTRY
    from asyncgraph.prometheus import BackendCollector

    REGISTRY.register(BackendCollector(backend))

Each scrape reads ``backend.telemetry.snapshot()`` and exposes it with the conventional names
and units: counters end in ``_total``, bytes in ``_bytes``, durations are histograms in
seconds, and every series carries a ``backend`` label (``"cuda:0"``, ``"host"``). One collector
serves any number of backends; register one collector per registry. See
``docs/observability.md`` for the list.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from asyncgraph._front._backend import Backend

from ._runtime._exceptions import ArgumentTypeError

if TYPE_CHECKING:
    from asyncgraph._runtime._telemetry import HistogramSnapshot, TelemetrySnapshot

__all__ = ("BackendCollector",)

# Our histograms have 20 buckets per decade from 100 ns; Prometheus gets every fifth bound
# (four per decade: 1, 1.78, 3.16, 5.62) from 1 us to 100 s, 33 buckets, each exactly one of ours.
_STEP = 5
_FIRST = 20  # index of the 1 us bound
_LAST = 180  # index of the 100 s bound

_COUNTERS: tuple[tuple[str, str, str, dict[str, str]], ...] = (
    ("dispatches", "dispatches", "Dispatches accepted by dispatch().", {}),
    (
        "fast_path_dispatches",
        "fast_path_dispatches",
        "Dispatches the CUDA fast path launched.",
        {},
    ),
    ("dispatches_completed", "dispatches_completed", "Dispatches that completed.", {}),
    ("dispatches_failed", "dispatches_failed", "Dispatches that completed with an error.", {}),
    (
        "dispatches_withdrawn",
        "dispatches_withdrawn",
        "Dispatches withdrawn before they launched, by why.",
        {"reason": "cancelled"},
    ),
    ("dispatches_withdrawn", "dispatches_timed_out", "", {"reason": "queue_timeout"}),
    ("transferred_bytes", "bytes_up", "Bytes copied to or from the backend.", {"direction": "up"}),
    ("transferred_bytes", "bytes_down", "", {"direction": "down"}),
    ("copies", "copies_up", "Copies to or from the backend.", {"direction": "up"}),
    ("copies", "copies_down", "", {"direction": "down"}),
    ("buffer_copies", "buffer_copies", "Resident buffers copied in by copy().", {}),
    ("buffer_copy_bytes", "buffer_copy_bytes", "Bytes of resident buffers copied in.", {}),
    ("sync_points", "sync_points", "Times the host waited for the device.", {}),
    (
        "compile_cache_requests",
        "compile_cache_hits",
        "Kernel lookups in the compile cache.",
        {"result": "hit"},
    ),
    ("compile_cache_requests", "compile_cache_misses", "", {"result": "miss"}),
    (
        "graph_cache_requests",
        "graph_cache_hits",
        "Dispatches that looked for a cached CUDA graph.",
        {"result": "hit"},
    ),
    ("graph_cache_requests", "graph_cache_misses", "", {"result": "miss"}),
    ("graph_captures", "graph_captures", "CUDA graphs captured.", {}),
    ("graph_replays", "graph_replays", "CUDA graph replays.", {}),
    ("graph_updates", "graph_updates", "In-place updates of executable graphs.", {}),
    ("graph_evictions", "graph_evictions", "Graphs evicted from the graph cache.", {}),
    (
        "pinned_pool_requests",
        "pool_hits",
        "Pinned-pool requests, served from cache or allocated.",
        {"result": "hit"},
    ),
    ("pinned_pool_requests", "pool_misses", "", {"result": "miss"}),
)

_GAUGES: tuple[tuple[str, str, str, dict[str, str]], ...] = (
    ("dispatches_in_flight", "in_flight", "Dispatches submitted and not yet completed.", {}),
    ("dispatches_queued", "queued", "Dispatches waiting for an in-flight slot.", {}),
    (
        "pinned_pool_bytes",
        "pool_bytes_cached",
        "Bytes of pinned host memory the pool holds.",
        {"state": "cached"},
    ),
    ("pinned_pool_bytes", "pool_bytes_in_use", "", {"state": "in_use"}),
)

_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    ("queue_wait_seconds", "queue_wait", "Seconds from dispatch() to submission."),
    ("submit_seconds", "submit_time", "Seconds the host spent submitting a dispatch."),
    ("completion_latency_seconds", "completion_latency", "Seconds from dispatch() to completion."),
    ("device_time_seconds", "device_time", "Kernel time of dispatches made with timing=True."),
)


# Per priority class (a ``priority`` label): the snapshot's mapping of class to histogram.
_CLASS_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    (
        "class_queue_wait_seconds",
        "queue_wait_by_class",
        "Seconds from dispatch() to submission, by priority class.",
    ),
    (
        "class_completion_latency_seconds",
        "completion_latency_by_class",
        "Seconds from dispatch() to completion, by priority class.",
    ),
)


def _buckets(histogram: HistogramSnapshot) -> list[tuple[str, float]]:
    """Cumulative counts at the exported bounds, ending with +Inf."""
    counts = histogram.counts
    buckets: list[tuple[str, float]] = []
    seen = sum(counts[:_FIRST])
    for index in range(_FIRST, _LAST + 1):
        seen += counts[index]
        if (index - _FIRST) % _STEP == 0:
            buckets.append((f"{histogram.bounds[index]:.6g}", float(seen)))
    buckets.append(("+Inf", float(histogram.count)))
    return buckets


class BackendCollector(Collector):
    """A Prometheus collector reading the telemetry of one or more backends at each scrape.

    Args:
        *backends: the backends to expose; each becomes a ``backend`` label value.

    Raises:
        ArgumentTypeError: something other than an asyncgraph backend was given, or none.

    Scrapes may run on another thread (``prometheus_client.start_http_server``): the snapshot
    reads each counter atomically, so a scrape racing with dispatches sees each value as it was
    at some moment of the scrape.
    """

    def __init__(self, *backends: Backend) -> None:
        if not backends:
            raise ArgumentTypeError("BackendCollector() needs at least one backend")
        for backend in backends:
            if not isinstance(backend, Backend):
                raise ArgumentTypeError(
                    f"BackendCollector() takes asyncgraph backends, got {type(backend).__name__}"
                )
        self._backends = backends

    def describe(self) -> Iterator[Metric]:
        """The metric families, without values (lets a registry check names at register)."""
        yield from self._families(())

    def collect(self) -> Iterator[Metric]:
        """One scrape: a snapshot of each backend."""
        yield from self._families(
            tuple((backend.name, backend.telemetry.snapshot()) for backend in self._backends)
        )

    def _families(self, snapshots: tuple[tuple[str, TelemetrySnapshot], ...]) -> Iterator[Metric]:
        yield from self._scalars(_COUNTERS, CounterMetricFamily, snapshots)
        yield from self._scalars(_GAUGES, GaugeMetricFamily, snapshots)
        for name, field, documentation in _HISTOGRAMS:
            histogram = HistogramMetricFamily(
                f"asyncgraph_{name}", documentation, labels=["backend"]
            )
            for backend, snapshot in snapshots:
                values: HistogramSnapshot = getattr(snapshot, field)
                histogram.add_metric([backend], _buckets(values), sum_value=values.sum)
            yield histogram
        for name, field, documentation in _CLASS_HISTOGRAMS:
            histogram = HistogramMetricFamily(
                f"asyncgraph_{name}", documentation, labels=["backend", "priority"]
            )
            for backend, snapshot in snapshots:
                by_class: dict[str, HistogramSnapshot] = getattr(snapshot, field)
                for priority, values in by_class.items():
                    histogram.add_metric(
                        [backend, priority], _buckets(values), sum_value=values.sum
                    )
            yield histogram

    @staticmethod
    def _scalars(
        table: tuple[tuple[str, str, str, dict[str, str]], ...],
        family_type: type[CounterMetricFamily] | type[GaugeMetricFamily],
        snapshots: tuple[tuple[str, TelemetrySnapshot], ...],
    ) -> Iterator[Metric]:
        # Rows of one name share a family (the first row documents it) and differ in labels.
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for name, field, documentation, labels in table:
            family = families.get(name)
            if family is None:
                family = families[name] = family_type(
                    f"asyncgraph_{name}", documentation, labels=["backend", *labels]
                )
            for backend, snapshot in snapshots:
                family.add_metric([backend, *labels.values()], float(getattr(snapshot, field)))
        yield from families.values()
