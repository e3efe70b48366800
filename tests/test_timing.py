"""The timing primitives every benchmark shares (``asyncgraph._timing``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from benchmarks import harness

from asyncgraph import _bench_report, _timing


def test_a_sync_timing_warms_up_then_times_each_call() -> None:
    calls: list[int] = []
    ticks = itertools.count(0.0, 0.5)  # each clock read half a second after the last
    samples = _timing.samples_sync(lambda: calls.append(1), 4, 3, clock=lambda: next(ticks))
    assert len(calls) == 7
    assert samples == [0.5] * 4


async def test_an_async_timing_warms_up_then_times_each_await() -> None:
    calls: list[int] = []

    async def call() -> None:
        calls.append(1)

    ticks = itertools.count(0.0, 0.25)
    samples = await _timing.samples_async(call, 2, 1, clock=lambda: next(ticks))
    assert len(calls) == 3
    assert samples == [0.25, 0.25]


def test_one_percentile_for_the_cli_and_the_scripts() -> None:
    assert _bench_report.percentile is _timing.percentile is harness.percentile
    assert _timing.percentile(np.array([1.0, 2.0, 3.0, 4.0]), 50) == 2.5
    with pytest.raises(ValueError, match=r"^percentile of no samples$"):
        _timing.percentile(np.array([]), 50)
