"""benchmarks/bench_load.py's parts that need no GPU and no timing bound: the callback timer,
the loads on the host backend, and the targets."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import numpy as np
import pytest
from benchmarks import bench_load, callback_timer

import asyncgraph as ag
from asyncgraph._cuda.completion._reactor import Reactor
from asyncgraph._runtime._inbox import Inbox


class Ticker:
    def __init__(self) -> None:
        self.ticks = 0

    def tick(self, by: int = 1) -> int:
        self.ticks += by
        return self.ticks


def readings(*values: float) -> Iterator[float]:
    return iter(values)


def test_callback_timer_times_each_call_and_restores_the_method() -> None:
    original = Ticker.__dict__["tick"]
    ticker = Ticker()
    clock = readings(0.0, 2.0, 10.0, 15.0)
    with callback_timer.CallbackTimer([(Ticker, "tick")], clock=lambda: next(clock)) as timer:
        assert Ticker.__dict__["tick"] is not original
        assert ticker.tick() == 1
        assert ticker.tick(by=2) == 3  # arguments and the result pass through
    assert timer.samples == {"Ticker.tick": [2.0, 5.0]}
    assert Ticker.__dict__["tick"] is original
    ticker.tick()  # no longer timed
    assert timer.samples == {"Ticker.tick": [2.0, 5.0]}
    timer.reset()
    assert timer.samples == {"Ticker.tick": []}


def test_callback_timer_times_a_call_that_raises_and_restores_after_an_error() -> None:
    original = Ticker.__dict__["tick"]
    clock = readings(0.0, 1.0)
    with (
        pytest.raises(TypeError),
        callback_timer.CallbackTimer([(Ticker, "tick")], clock=lambda: next(clock)) as timer,
    ):
        Ticker().tick("x")  # type: ignore[arg-type]  # fails inside the timed method
    assert timer.samples == {"Ticker.tick": [1.0]}
    assert Ticker.__dict__["tick"] is original


def test_callback_timer_refuses_a_method_the_class_does_not_define() -> None:
    original = Ticker.__dict__["tick"]
    timer = callback_timer.CallbackTimer([(Ticker, "tick"), (Ticker, "tock")])
    with pytest.raises(AttributeError, match=r"^Ticker defines no method 'tock' any more; "), timer:
        pass
    assert Ticker.__dict__["tick"] is original  # the one installed first was put back


def test_own_callbacks_are_what_asyncgraph_schedules_on_the_loop() -> None:
    # If these fail, asyncgraph schedules other callbacks now: update OWN_CALLBACKS.
    timed = bench_load.OWN_CALLBACKS
    assert timed == ((Reactor, "_poll"), (Inbox, "_drain"))
    assert "call_soon(self._poll)" in inspect.getsource(Reactor)
    assert "call_soon_threadsafe(self._drain)" in inspect.getsource(Inbox)


async def test_own_callbacks_on_the_host_backend(host: ag.Backend) -> None:
    drain = Inbox.__dict__["_drain"]
    rows = await bench_load.own_callback_rows(host, tasks=4, rounds=3)
    assert set(rows) == {"4 tasks empty", "4 tasks 4 KiB"}
    for row in rows.values():
        # The host backend's completions come back through its inbox; it has no reactor.
        assert set(row) == {"dispatches_per_s", "all", "Inbox._drain"}
        assert 1 <= row["Inbox._drain"]["calls"] <= 12
        assert row["all"] == row["Inbox._drain"]
        assert row["all"]["max_us"] >= row["all"]["p99_us"] > 0
        assert row["dispatches_per_s"] > 0
    assert Inbox.__dict__["_drain"] is drain


async def test_mixed_load_on_the_host_backend(host: ag.Backend) -> None:
    rows = await bench_load.mixed_rows(host, clients=4, rounds=3, burn_s=1e-5, pairs=2)
    assert set(rows) == {"floor", "asyncgraph", "ratio"}
    for name in ("floor", "asyncgraph"):
        summary = rows[name]
        assert summary["max_us"] >= summary["p99_us"] >= summary["p50_us"] > 0
        assert summary["requests_per_s"] > 0
    ratio = rows["ratio"]
    assert len(ratio["pairs"]) == 2
    assert ratio["low"] <= ratio["median"] <= ratio["high"]
    assert ratio["low"] == min(ratio["pairs"]) > 0
    # check, the warm-up, then two loads of 4 clients x 3 rounds
    assert host.telemetry.snapshot().dispatches == 1 + 4 * 1 + 2 * 4 * 3


async def test_mixed_load_counts_every_round() -> None:
    waits = 0

    async def wait() -> None:
        nonlocal waits
        waits += 1

    result = await bench_load.mixed_load(wait, clients=3, rounds=5, burn_s=0.0)
    assert (waits, len(result.latencies)) == (15, 15)


def test_host_kernels_compute_what_the_cuda_source_does() -> None:
    x = np.arange(8, dtype=np.float32)
    out = np.zeros(8, np.float32)
    bench_load._scale(x, out, np.float32(2), np.int32(6))
    assert out.tolist() == [0, 2, 4, 6, 8, 10, 0, 0]


def test_targets_per_loop_and_whether_they_are_met() -> None:
    mixed = {
        "floor": {"p50_us": 100.0, "p99_us": 200.0, "requests_per_s": 1000.0},
        "asyncgraph": {"p50_us": 110.0, "p99_us": 400.0, "requests_per_s": 850.0},
        "ratio": {"median": 0.85, "low": 0.8, "high": 0.95, "pairs": [0.8, 0.85, 0.95]},
    }
    callbacks = {"64 tasks empty": {"all": {"p99_us": 150.0, "max_us": float("nan")}}}
    rows = {"asyncio": {"mixed": mixed, "callbacks": callbacks}}
    servers = {"asyncio": {"dispatch_latency_ms": {"p50": 0.15, "p99": 9.0}}}
    targets = bench_load.targets_of(rows, servers)
    assert [(t.label, t.measured, t.met) for t in targets] == [
        ("mixed p99 / floor p99 (asyncio) <= 1.3", 2.0, False),
        ("mixed p50 / floor p50 (asyncio) <= 1.2", 1.1, True),
        ("mixed requests/s / floor's, median of pairs (asyncio) >= 0.9", 0.85, False),
        ("own callback p99 us, 64 tasks empty (asyncio) <= 200", 150.0, True),
        (
            "own callback max us, 64 tasks empty (asyncio) <= 1000",
            pytest.approx(float("nan"), nan_ok=True),
            False,
        ),
        ("service dispatch p50 ms (asyncio) <= 0.2", 0.15, True),
        ("service dispatch p99 ms (asyncio) <= 2", 9.0, False),
    ]
