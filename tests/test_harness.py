"""What every benchmark shares (``asyncgraph.bench._harness``): timing, percentiles, event loops and
file names, the same for the bench CLI and the scripts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from benchmarks import harness

from asyncgraph.bench import _bench_report, _harness
from asyncgraph.bench import _bench_run as _bench


def test_a_sync_harness_warms_up_then_times_each_call() -> None:
    calls: list[int] = []
    ticks = itertools.count(0.0, 0.5)  # each clock read half a second after the last
    samples = _harness.samples_sync(lambda: calls.append(1), 4, 3, clock=lambda: next(ticks))
    assert len(calls) == 7
    assert samples == [0.5] * 4


async def test_an_async_harness_warms_up_then_times_each_await() -> None:
    calls: list[int] = []

    async def call() -> None:
        calls.append(1)

    ticks = itertools.count(0.0, 0.25)
    samples = await _harness.samples_async(call, 2, 1, clock=lambda: next(ticks))
    assert len(calls) == 3
    assert samples == [0.25, 0.25]


def test_one_percentile_for_the_cli_and_the_scripts() -> None:
    assert _bench_report.percentile is _harness.percentile is harness.percentile
    assert _harness.percentile(np.array([1.0, 2.0, 3.0, 4.0]), 50) == 2.5
    with pytest.raises(ValueError, match=r"^percentile of no samples$"):
        _harness.percentile(np.array([]), 50)


def test_one_loop_list_and_one_file_name_rule_for_the_cli_and_the_scripts() -> None:
    assert harness.loop_factories is _harness.loop_factories
    assert _bench_report.slug is _harness.slug is harness.slug
    factories = _harness.loop_factories()
    assert factories["asyncio"] is None
    for name in factories:
        assert _bench.loop_factory(name) is factories[name]
    assert _harness.slug("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert harness.results_path("bench_x.py", "a/b c").name == "bench_x-a-b-c.json"
