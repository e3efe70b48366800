"""The benchmark harness's logic, which needs no GPU: loops, timing, tables, results, arguments."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from benchmarks import harness

from asyncgraph import UnsupportedError


def fake_clock(*readings: float) -> Iterator[float]:
    return iter(readings)


def test_time_sync_warms_up_then_returns_the_median_in_us() -> None:
    calls: list[int] = []
    # Three timed calls, 2 s, 10 s and 4 s long: the median is 4 s.
    readings = fake_clock(0.0, 2.0, 10.0, 20.0, 30.0, 34.0)
    us = harness.time_sync(lambda: calls.append(1), 3, 5, clock=lambda: next(readings))
    assert us == 4e6
    assert len(calls) == 8


async def test_time_async_warms_up_then_returns_the_median_in_us() -> None:
    calls: list[int] = []

    async def fn() -> None:
        calls.append(1)

    # Four timed awaits, 1, 3, 5 and 100 s long: the median is 4 s.
    readings = fake_clock(0, 1, 10, 13, 20, 25, 30, 130)
    us = await harness.time_async(fn, 4, 2, clock=lambda: next(readings))
    assert us == 4e6
    assert len(calls) == 6


async def test_time_async_in_turns_alternates_the_ways_and_returns_each_median() -> None:
    order: list[str] = []

    def way(name: str) -> Any:
        async def fn() -> None:
            order.append(name)

        return fn

    ticks = iter(range(1000))
    us = await harness.time_async_in_turns(
        {"a": way("a"), "b": way("b")}, 4, 1, turns=2, clock=lambda: float(next(ticks))
    )
    # Warm-ups first, then turns of two awaits each, the order reversed in the second turn.
    assert order == ["a", "b", "a", "a", "b", "b", "b", "b", "a", "a"]
    assert us == {"a": 1e6, "b": 1e6}  # each await read one tick apart


async def test_time_async_in_turns_times_blocking_peers_in_the_same_turns() -> None:
    order: list[str] = []

    async def ours() -> None:
        order.append("ours")

    def peer() -> None:
        order.append("peer")

    ticks = iter(range(1000))
    us = await harness.time_async_in_turns(
        {"ours": ours}, 4, 1, sync={"peer": peer}, turns=2, clock=lambda: float(next(ticks))
    )
    # Warm-ups, then the blocking peer in the same turns, the order reversed in the second.
    assert order == ["ours", "peer", "ours", "ours", "peer", "peer", "peer", "peer", "ours", "ours"]
    assert us == {"ours": 1e6, "peer": 1e6}
    with pytest.raises(ValueError, match="named in fns and in sync"):
        await harness.time_async_in_turns({"x": ours}, 1, sync={"x": peer})


def test_median_and_percentiles() -> None:
    assert harness.median_us([3e-6, 1e-6, 2e-6]) == pytest.approx(2.0)
    samples = [float(v) for v in range(101)]  # 0..100
    assert harness.percentile(samples, 99) == pytest.approx(99.0)
    assert harness.percentile([0.0, 10.0], 25) == pytest.approx(2.5)  # interpolated
    assert harness.percentile([5.0, 1.0, 3.0], 100) == 5.0


async def test_heartbeat_records_how_long_the_loop_stalled() -> None:
    async with harness.Heartbeat(0.001) as beat:
        await asyncio.sleep(0.01)
        # Blocks the loop on purpose: the beat under way wakes about 50 ms late.
        time.sleep(0.05)  # noqa: ASYNC251
        await asyncio.sleep(0.01)
    assert len(beat.stalls) == len(beat.started) >= 2
    assert beat.worst >= 0.04
    assert beat.worst == max(beat.stalls)


def test_a_heartbeat_that_never_beat_reports_no_stall() -> None:
    assert harness.Heartbeat().worst == 0.0


def test_format_table_aligns_names_left_and_numbers_right() -> None:
    table = harness.format_table(
        ("measurement", "value", "change", ""),
        [("short", 1.25, 1234567, "met"), ("a much longer name", 100.0, 0, "missed")],
        (".1f", ",", ""),
    )
    assert table.splitlines() == [
        "measurement         value     change",
        "short                 1.2  1,234,567  met",
        "a much longer name  100.0          0  missed",
    ]


def test_format_table_writes_str_cells_as_they_are() -> None:
    table = harness.format_table(("k", "slope"), [("rss", 12.345), ("events", "0.00")], (".1f",))
    assert table.splitlines() == ["k       slope", "rss      12.3", "events   0.00"]


def test_format_table_refuses_rows_that_do_not_match_the_header() -> None:
    with pytest.raises(ValueError, match=r"^row \('x', 1.0, 2.0\) has 3 cells; the header has 2$"):
        harness.format_table(("name", "value"), [("x", 1.0, 2.0)], (".1f",))
    with pytest.raises(ValueError, match=r"^2 columns take 1 formats, not 2$"):
        harness.format_table(("name", "value"), [], (".1f", ".1f"))


@pytest.mark.parametrize(
    ("device", "stem"),
    [
        ("NVIDIA H100 80GB HBM3", "bench_dispatch-NVIDIA-H100-80GB-HBM3"),
        ("Tesla V100-SXM2-16GB", "bench_dispatch-Tesla-V100-SXM2-16GB"),
        ("NVIDIA A100 (PCIe/40GB)", "bench_dispatch-NVIDIA-A100-PCIe-40GB"),
        ("", "bench_dispatch-unknown"),
    ],
)
def test_results_are_named_after_the_script_and_the_device(device: str, stem: str) -> None:
    path = harness.results_path("benchmarks/bench_dispatch.py", device)
    assert path == Path(harness.__file__).resolve().parent / "results" / f"{stem}.json"


def test_the_committed_results_keep_their_names() -> None:
    results = Path(harness.__file__).resolve().parent / "results"
    committed = sorted(results.glob("*-NVIDIA-H100-80GB-HBM3.json"))
    assert committed
    for path in committed:
        script = path.name.split("-", 1)[0]
        assert harness.results_path(script, "NVIDIA H100 80GB HBM3") == path


def test_write_json_writes_nothing_without_json(tmp_path: Path) -> None:
    assert harness.write_json({"a": 1}, None, script="soak.py", device="GPU") is None


def test_write_json_to_a_path_given(tmp_path: Path) -> None:
    path = tmp_path / "deeper" / "out.json"
    data = {"device": "GPU", "rows": {"x": 1.5}}
    assert harness.write_json(data, str(path), script="soak.py", device="GPU") == path
    written = json.loads(path.read_text())
    written.pop("recorded")
    assert written == data


def test_write_json_records_the_commit_and_the_date(tmp_path: Path) -> None:
    """A result says what code it measured and when, not only a version ("0+unknown" in a tree
    never installed)."""
    path = tmp_path / "out.json"
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    harness.write_json({"a": 1}, str(path), script="soak.py", device="GPU")
    recorded = json.loads(path.read_text())["recorded"]
    assert set(recorded) == {"commit", "dirty", "date", "asyncgraph"}
    head = subprocess.run(
        ["git", "-C", str(harness.ROOT), "rev-parse", "HEAD"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if head.returncode == 0:  # a checkout (an unpacked sdist has no commit to record)
        assert recorded["commit"] == head.stdout.strip()
        assert isinstance(recorded["dirty"], bool)
    date = datetime.datetime.fromisoformat(recorded["date"])
    assert date.tzinfo is not None
    assert before <= date <= datetime.datetime.now(datetime.UTC)


def test_outside_a_checkout_the_commit_is_none(tmp_path: Path) -> None:
    from asyncgraph._runtime._version import provenance

    recorded = provenance(tmp_path)
    assert (recorded["commit"], recorded["dirty"]) == (None, None)


@pytest.mark.parametrize(
    ("target", "measured", "verdict"),
    [
        ("4 KiB round trip / CuPy sync (asyncio) <= 1.0", 1.0, "met"),
        ("4 KiB round trip / CuPy sync (asyncio) <= 1.0", 1.01, "missed"),
        ("64 MiB pinned input: share of pinned copy bandwidth (uvloop) >= 0.9", 0.80, "missed"),
        ("64 tasks dispatches/s (asyncio) >= 80000", 91_000.0, "met"),
        ("asyncgraph download / pageable at 256 MiB >= 1.5", 1.06, "missed"),
        ("replay / CuPy graph replay (asyncio) < 1", 1.0, "missed"),
        ("a peer that did not run <= 1.2", float("nan"), "missed"),
        ("(info) 64 MiB numpy input: share of pinned bandwidth (asyncio)", 0.4, ""),
    ],
)
def test_a_target_is_judged_by_the_bound_its_label_ends_with(
    target: str, measured: float, verdict: str
) -> None:
    assert harness.verdict(target, measured) == verdict


def test_targets_print_with_their_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    targets = {"a / b (asyncio) <= 1.2": 1.1, "c / d >= 1.5": 1.06, "(info) e": 3.0}
    harness.print_targets(targets, ".2f")
    assert capsys.readouterr().out.splitlines() == [
        "target                  measured",
        "a / b (asyncio) <= 1.2      1.10  met",
        "c / d >= 1.5                1.06  missed",
        "(info) e                    3.00",
    ]
    assert harness.verdicts(targets) == {"a / b (asyncio) <= 1.2": "met", "c / d >= 1.5": "missed"}


def test_write_json_with_no_path_writes_to_the_results_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    path = harness.write_json({"a": 1}, "", script="benchmarks/soak.py", device="Some GPU")
    assert path == tmp_path / "soak-Some-GPU.json"
    assert json.loads(path.read_text())["a"] == 1


def test_environment_names_the_device_and_python() -> None:
    assert harness.environment("GPU") == {"device": "GPU", "python": sys.version.split()[0]}


def test_arguments_json_and_reps() -> None:
    parser = harness.arguments("Title line.\n\nMore.", reps=30)
    assert parser.description == "Title line."
    assert vars(parser.parse_args([])) == {"json": None, "reps": 30, "smoke": False}
    assert vars(parser.parse_args(["--json"])) == {"json": "", "reps": 30, "smoke": False}
    assert vars(parser.parse_args(["--json", "x.json", "--reps", "5"])) == {
        "json": "x.json",
        "reps": 5,
        "smoke": False,
    }
    assert vars(harness.arguments(None, results=False).parse_args([])) == {"smoke": False}


def test_smoke_runs_a_few_repetitions_here_and_in_child_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(harness.SMOKE_ENV, "0")  # restored afterwards, whatever parse_args set
    assert not harness.smoke()
    parsed = harness.arguments("T.", reps=3000).parse_args(["--smoke"])
    assert parsed.reps == harness.SMOKE_REPS
    assert os.environ[harness.SMOKE_ENV] == "1"  # what child processes inherit
    assert harness.smoke()
    calls: list[int] = []
    harness.time_sync(lambda: calls.append(1), 1000, 100)
    assert len(calls) == harness.SMOKE_REPS + 1  # one warm-up


async def _loop_kind(label: str) -> dict[str, str]:
    return {label: type(asyncio.get_running_loop()).__module__.split(".")[0]}


def test_run_runs_a_coroutine_on_asyncio() -> None:
    assert harness.run(_loop_kind("x")) == {"x": "asyncio"}


def test_run_refuses_a_loop_it_does_not_know() -> None:
    # The coroutine is closed: no "never awaited" warning (warnings are errors here).
    with pytest.raises(UnsupportedError, match=r"^loop='trio'; choose 'asyncio' or 'uvloop'$"):
        harness.run(_loop_kind("x"), "trio")


def test_run_on_loops_runs_on_uvloop_too() -> None:
    pytest.importorskip("uvloop")
    rows, loops = harness.run_on_loops(_loop_kind)
    assert loops == ("asyncio", "uvloop")
    assert rows == {"asyncio": "asyncio", "uvloop": "uvloop"}


def test_run_on_loops_without_uvloop_leaves_its_rows_out_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    rows, loops = harness.run_on_loops(_loop_kind)
    assert loops == ("asyncio",)
    assert rows == {"asyncio": "asyncio"}
    assert capsys.readouterr().out == "uvloop is not installed: its rows are left out\n"
