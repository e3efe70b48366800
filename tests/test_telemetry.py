"""Telemetry counts the work done; structlog events are emitted and readable."""

from __future__ import annotations

import math

import numpy as np
import pytest
import structlog

import asyncgraph as ag
from asyncgraph._runtime._telemetry import Histogram

from .kernels import SCALE


async def test_counters_equal_the_work_done() -> None:
    async with ag.open_backend("host") as backend:
        x = np.ones(100, np.float32)
        for _ in range(7):
            await backend.dispatch(
                SCALE, x, ag.Out(100, np.float32), np.float32(2), np.int32(100), grid=1, block=128
            )
        with pytest.raises(ag.DispatchError):
            backend.dispatch(SCALE, x, grid=1, block=1)
        snap = backend.telemetry.snapshot()
    assert snap.dispatches == 7
    assert snap.dispatches_completed == 7
    assert snap.dispatches_failed == 0
    assert (snap.in_flight, snap.queued) == (0, 0)
    assert snap.queue_wait.count == snap.submit_time.count == snap.completion_latency.count == 7
    assert snap.device_time.count == 0
    assert snap.completion_latency.min > 0
    assert snap.completion_latency.quantile(0.5) <= snap.completion_latency.max


def test_a_histogram_sorts_values_in_batches_into_the_buckets_one_at_a_time_would(
    rng: np.random.Generator,
) -> None:
    from bisect import bisect_left

    from asyncgraph._runtime._telemetry import _BOUNDS, FOLD_EVERY

    # Across batches, with values left unsorted, on bucket bounds and past the last bound.
    values = [*rng.lognormal(-9, 3, 2 * FOLD_EVERY + 37), *_BOUNDS[:5], 5e3, 0.0]
    rng.shuffle(values)
    h = Histogram()
    counts = [0] * len(_BOUNDS)
    for i, v in enumerate(values):
        h.record(float(v))
        counts[bisect_left(_BOUNDS, v)] += 1
        assert h.count == i + 1
    snap = h.snapshot()
    assert snap.counts == tuple(counts)
    assert (snap.count, snap.min, snap.max) == (len(values), min(values), max(values))
    assert snap.sum == pytest.approx(math.fsum(values), rel=1e-12)
    h.record(1e-3)  # recording goes on after a snapshot
    assert h.snapshot().count == len(values) + 1


def test_histogram_quantiles_are_within_a_bucket(rng: np.random.Generator) -> None:
    h = Histogram()
    values = rng.uniform(1e-5, 1e-2, 5000)
    for v in values:
        h.record(float(v))
    snap = h.snapshot()
    assert snap.count == 5000
    assert math.isclose(snap.sum, values.sum(), rel_tol=1e-9)
    for q in (0.5, 0.9, 0.99):
        # The histogram answers from the bucket of the ceil(q * n)-th value: compare with that
        # value, not an interpolation between two (which a bucket bound may fall just under).
        true = float(np.quantile(values, q, method="inverted_cdf"))
        assert true <= snap.quantile(q) <= true * 1.13
    assert snap.quantile(1.0) == snap.max == values.max()
    assert sum(snap.counts) == 5000
    with pytest.raises(
        ag.DispatchError,
        match=r"^quantile q must be between 0 and 1, got 2; pass 0\.99 for the 99th percentile$",
    ):
        snap.quantile(2)


def test_empty_histogram() -> None:
    snap = Histogram().snapshot()
    assert (snap.count, snap.min, snap.max, snap.mean, snap.quantile(0.99)) == (0, 0, 0, 0, 0)


async def test_lifecycle_events_are_logged() -> None:
    with structlog.testing.capture_logs() as logs:
        backend = ag.open_backend("host", host_workers=2)
        await backend.aclose()
    # Opening is routine: a debug event. Closing reports what the backend did.
    assert {
        "event": "backend.opened",
        "device": "host",
        "kind": "host",
        "workers": 2,
        "log_level": "debug",
    } in logs
    closed = [e for e in logs if e["event"] == "backend.closed"]
    assert closed == [
        {
            "event": "backend.closed",
            "device": "host",
            "dispatches": 0,
            "completed": 0,
            "failed": 0,
            "log_level": "info",
        }
    ]


async def test_per_dispatch_events_only_when_enabled() -> None:
    x = np.ones(4, np.float32)
    with structlog.testing.capture_logs() as logs:
        async with ag.open_backend("host") as quiet:
            await quiet.dispatch(
                SCALE, x, ag.Out(4, np.float32), np.float32(1), np.int32(4), grid=1, block=4
            )
        async with ag.open_backend("host", dispatch_events_enabled=True) as loud:
            await loud.dispatch(
                SCALE, x, ag.Out(4, np.float32), np.float32(1), np.int32(4), grid=1, block=4
            )
    completed = [e for e in logs if e["event"] == "dispatch.completed"]
    assert len(completed) == 1
    event = completed[0]
    assert (event["kernel"], event["dispatch_id"], event["device"]) == ("scale", 1, "host")
    assert event["latency"] > 0
    assert event["log_level"] == "debug"


async def test_a_printed_snapshot_shows_counts_and_percentiles_not_buckets() -> None:
    async with ag.open_backend("host") as backend:
        x = np.ones(100, np.float32)
        for _ in range(3):
            await backend.dispatch(
                SCALE, x, ag.Out(100, np.float32), np.float32(2), np.int32(100), grid=1, block=128
            )
        snap = backend.telemetry.snapshot()
    text = repr(snap)
    # Every histogram's 201 bucket bounds made this about 20 KB.
    assert len(text) < 2000, text
    assert "bounds" not in text
    assert "counts=" not in text
    assert "completion_latency=HistogramSnapshot(count=3, mean=" in text
    assert repr(snap.device_time) == "HistogramSnapshot(count=0)"
    # The buckets are still there for whoever reads them.
    assert sum(snap.completion_latency.counts) == 3


def test_histogram_repr_picks_a_readable_unit() -> None:
    h = Histogram()
    for value in (20e-6, 30e-6, 5e-3):
        h.record(value)
    text = repr(h.snapshot())
    assert text.startswith("HistogramSnapshot(count=3, mean=1.68ms, p50=")
    assert text.endswith(", max=5ms)")
