"""The one benchmark harness (``asyncgraph._bench._harness`` and
``asyncgraph._bench._bench_results``): timing, percentiles, event loops, tables and files, the same
for the bench CLI and the scripts under ``benchmarks/``, which add only their command line and
results folder."""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from benchmarks import harness

from asyncgraph import UnsupportedError
from asyncgraph._bench import _bench_report, _bench_results, _harness


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


def test_one_percentile_and_median_for_the_cli_and_the_scripts() -> None:
    assert _bench_report.percentile is _harness.percentile is harness.percentile
    assert harness.median is _harness.median
    assert harness.median_us is _harness.median_us
    assert _harness.percentile(np.array([1.0, 2.0, 3.0, 4.0]), 50) == 2.5
    assert _harness.median(v for v in (4.0, 1.0, 3.0, 2.0)) == 2.5  # any iterable
    assert _harness.median_us([3e-6, 1e-6, 2e-6]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"^percentile of no samples$"):
        _harness.percentile(np.array([]), 50)
    with pytest.raises(ValueError, match=r"^percentile of no samples$"):
        _harness.median([])


def test_the_scripts_time_print_and_judge_with_the_package_harness() -> None:
    """The scripts' module adds its command line; it has no timing, table or verdict of its
    own."""
    for name in ("time_sync", "time_async", "Heartbeat", "run", "run_on_loops", "smoke"):
        assert getattr(harness, name) is getattr(_harness, name), name
    for name in ("format_table", "print_table", "verdict", "verdicts", "print_targets"):
        assert getattr(harness, name) is getattr(_bench_results, name), name
    for name in ("environment", "device_name", "cpu", "python_version"):
        assert getattr(harness, name) is getattr(_bench_results, name), name


def test_one_loop_list_and_one_file_name_rule_for_the_cli_and_the_scripts() -> None:
    assert harness.loop_factories is _harness.loop_factories
    assert _bench_report.slug is _bench_results.slug
    factories = _harness.loop_factories()
    assert factories["asyncio"] is None
    for name in factories:
        assert _harness.loop_factory(name) is factories[name]
    with pytest.raises(UnsupportedError, match=r"^loop='trio'; choose 'asyncio' or 'uvloop'$"):
        _harness.loop_factory("trio")
    assert _bench_results.slug("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert harness.results_path("bench_x.py", "a/b c").name == "bench_x-a-b-c.json"


def test_without_uvloop_asking_for_it_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop fails
    with pytest.raises(UnsupportedError, match=r"^--loop uvloop needs uvloop, which is not"):
        _harness.loop_factory("uvloop")


def test_layout_lines_up_columns_and_lets_short_lines_span() -> None:
    lines = [
        ("section", "median", "n"),
        ("group",),  # a heading: counts toward the first column only
        ("  a row", "1.5", "300"),
        ("  skipped", "skipped: no GPU, a long reason"),  # spans the figures
    ]
    assert _bench_results.layout(lines, [True, False, False]) == [
        "section    median    n",
        "group",
        "  a row       1.5  300",
        "  skipped  skipped: no GPU, a long reason",
    ]
    # The first column as wide as another table's, to line the two up.
    assert _bench_results.layout([("x", "1")], [True, False], first_width=4) == ["x     1"]
    assert _bench_results.layout([], [True], first_width=4) == []


def test_write_results_writes_indented_json_and_can_refuse_nan(tmp_path: Path) -> None:
    path = tmp_path / "deeper" / "out.json"
    assert _bench_results.write_results({"a": 1.5, "b": math.nan}, path) == path
    text = path.read_text()
    assert text.endswith("}\n")
    assert text.startswith('{\n  "a": 1.5,\n')
    assert math.isnan(json.loads(text)["b"])
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        _bench_results.write_results({"b": math.nan}, tmp_path / "strict.json", allow_nan=False)
