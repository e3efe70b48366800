"""The Prometheus collector: conventional names and units, values as in the snapshot."""

from __future__ import annotations

import math

import numpy as np
import pytest

import asyncgraph as ag

from .kernels import SCALE

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from asyncgraph.prometheus import BackendCollector  # noqa: E402


def _scrape(*backends: ag.Backend) -> dict[str, object]:
    registry = prometheus_client.CollectorRegistry()
    registry.register(BackendCollector(*backends))
    text = prometheus_client.generate_latest(registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def _value(families: dict[str, object], family: str, sample: str, **labels: str) -> float:
    for s in families[family].samples:  # type: ignore[attr-defined]  # a parsed Metric
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {sample}{labels} in {family}")


async def _dispatch(backend: ag.Backend, times: int) -> None:
    x = np.ones(512, np.float32)  # counted, not checked: any values do
    for _ in range(times):
        await backend.dispatch(
            SCALE, x, ag.Out(x.shape, x.dtype), np.float32(2), np.int32(x.size), grid=2, block=256
        )


async def test_counters_gauges_and_histograms_follow_the_snapshot(host: ag.Backend) -> None:
    await _dispatch(host, 7)
    snapshot = host.telemetry.snapshot()
    families = _scrape(host)
    label = {"backend": "host"}
    assert _value(families, "asyncgraph_dispatches", "asyncgraph_dispatches_total", **label) == 7
    up = _value(
        families,
        "asyncgraph_transferred_bytes",
        "asyncgraph_transferred_bytes_total",
        direction="up",
        **label,
    )
    assert up == snapshot.bytes_up  # the host backend copies nothing; CUDA counts each byte
    completed = "asyncgraph_dispatches_completed_total"
    assert _value(families, "asyncgraph_dispatches_completed", completed, **label) == 7
    assert (
        _value(families, "asyncgraph_dispatches_in_flight", "asyncgraph_dispatches_in_flight") == 0
    )
    name = "asyncgraph_completion_latency_seconds"
    buckets = [s for s in families[name].samples if s.name == f"{name}_bucket"]  # type: ignore[attr-defined]
    assert len(buckets) == 34  # 1 us to 100 s, four per decade, and +Inf
    bounds = [float(s.labels["le"]) for s in buckets]
    assert bounds[0] == pytest.approx(1e-6)
    assert bounds[-2] == pytest.approx(100.0)
    assert math.isinf(bounds[-1])
    counts = [s.value for s in buckets]
    assert counts == sorted(counts)  # cumulative
    assert counts[-1] == _value(families, name, f"{name}_count") == 7
    total = _value(families, name, f"{name}_sum")
    assert total == pytest.approx(snapshot.completion_latency.sum)
    # Each bucket counts the values at or below its bound (read from the snapshot's buckets).
    fine = snapshot.completion_latency
    for bound, count in zip(bounds[:-1], counts[:-1], strict=True):
        below = sum(n for b, n in zip(fine.bounds, fine.counts, strict=True) if b <= bound * 1.001)
        assert count == below


async def test_one_collector_for_several_backends() -> None:
    async with ag.open_backend("host") as first, ag.open_backend("host", streams=2) as second:
        await _dispatch(first, 3)
        await _dispatch(second, 5)
        families = _scrape(first, second)
    samples = [
        s
        for s in families["asyncgraph_dispatches"].samples  # type: ignore[attr-defined]
        if s.name == "asyncgraph_dispatches_total"
    ]
    assert sorted(s.value for s in samples) == [3, 5]


def test_bad_arguments() -> None:
    with pytest.raises(ag.ArgumentTypeError, match=r"^BackendCollector\(\) needs at least one"):
        BackendCollector()
    with pytest.raises(ag.ArgumentTypeError, match=r"takes asyncgraph backends, got str$"):
        BackendCollector("cuda:0")  # type: ignore[arg-type]  # the mistake under test


async def test_registering_twice_in_one_registry_is_refused(host: ag.Backend) -> None:
    registry = prometheus_client.CollectorRegistry()
    registry.register(BackendCollector(host))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(BackendCollector(host))


async def test_queue_wait_latency_and_withdrawals_are_labelled_by_class() -> None:
    from prometheus_client import CollectorRegistry

    from tests.jobs_scenarios import N, _inc
    from tests.test_jobs import HostHold

    async with ag.open_backend("host", max_in_flight=1) as backend:
        hold = HostHold()
        held = hold.take(backend)
        low = _inc(backend, ag.InOut(np.zeros(N, np.float32)), priority="low")
        late = _inc(backend, ag.InOut(np.zeros(N, np.float32)), queue_timeout=0)
        gone = _inc(backend, ag.InOut(np.zeros(N, np.float32)))
        assert gone.cancel()
        with pytest.raises(ag.QueueTimeoutError):
            await late
        hold.release()
        await held
        await low
        registry = CollectorRegistry()
        registry.register(BackendCollector(backend))

        def value(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(f"asyncgraph_{name}", {"backend": "host", **labels})

        assert value("class_queue_wait_seconds_count", priority="low") == 1
        assert value("class_queue_wait_seconds_count", priority="normal") == 1  # the held one
        assert value("class_completion_latency_seconds_count", priority="normal") == 3
        assert value("class_completion_latency_seconds_count", priority="high") == 0
        assert value("dispatches_withdrawn_total", reason="cancelled") == 1
        assert value("dispatches_withdrawn_total", reason="queue_timeout") == 1
