"""The completion reactor's polling, with a stand-in for ``cuEventQuery`` (no GPU needed)."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from asyncgraph import _reactor
from asyncgraph._cudadrv import NOT_READY, SUCCESS


class FakeEvent:
    def __init__(self, done: bool) -> None:
        self.done = done


def _query(event: FakeEvent) -> tuple[Any]:
    return (SUCCESS if event.done else NOT_READY,)


async def test_a_busy_stream_cannot_starve_another(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_reactor, "drv", types.SimpleNamespace(cuEventQuery=_query))
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 2, _reactor.EventPool(0), 1.0, lambda _e: None)
    finished: list[int] = []

    def on_lane0(_error: object) -> None:
        finished.append(0)
        # Stream 0 never runs dry: every completion brings another completed event.
        if len(finished) < 400:
            reactor.watch(0, FakeEvent(done=True), on_lane0)

    for _ in range(2 * reactor.batch):
        reactor.watch(0, FakeEvent(done=True), on_lane0)
    reactor.watch(1, FakeEvent(done=True), lambda _error: finished.append(1))
    for _ in range(10):
        await asyncio.sleep(0)
    # Stream 1's completed event is seen within a couple of polls, not after stream 0 is idle.
    assert 1 in finished
    assert finished.index(1) <= 2 * reactor.batch
    for _ in range(200):
        await asyncio.sleep(0)
    assert reactor.pending == 0


async def test_after_a_long_loop_iteration_a_poll_wakes_one_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_reactor, "drv", types.SimpleNamespace(cuEventQuery=_query))
    clock = [1.0]  # a stand-in for perf_counter that the callbacks advance
    monkeypatch.setattr(_reactor, "perf_counter", lambda: clock[0])
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 1, _reactor.EventPool(0), 1.0, lambda _e: None)
    polls: list[int] = []

    def callback(cost: float) -> Any:
        def done(_error: object) -> None:
            polls.append(reactor.polls)
            clock[0] += cost

        return done

    reactor.watch(0, FakeEvent(done=True), callback(2e-3))  # a task that runs 2 ms
    for _ in range(8):
        reactor.watch(0, FakeEvent(done=True), callback(1e-6))
    for _ in range(10):
        await asyncio.sleep(0)
    per_poll = [polls.count(p) for p in sorted(set(polls))]
    # The first poll follows a long idle stretch and the second a 2 ms iteration: one each.
    # Then iterations are short again, and polls resolve full batches.
    assert per_poll == [1, 1, reactor.batch, 8 - 1 - reactor.batch]
    assert reactor.pending == 0
