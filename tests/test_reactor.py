"""The completion reactor's polling, with a stand-in for ``cuEventQuery`` (no GPU needed)."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Callable
from typing import Any

import pytest

from asyncgraph.cuda import _reactor, _watches
from asyncgraph.cuda._driver import NOT_READY, SUCCESS
from asyncgraph.cuda._events import EventPool


class FakeEvent:
    def __init__(self, done: bool) -> None:
        self.done = done


def _query(event: FakeEvent) -> tuple[Any]:
    return (SUCCESS if event.done else NOT_READY,)


async def test_a_busy_stream_cannot_starve_another(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_driver(monkeypatch)
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 2, EventPool(0), 1.0, lambda _e: None)
    finished: list[int] = []
    lane1_poll: list[int] = []

    def on_lane0(_error: object) -> None:
        finished.append(0)
        # Stream 0 never runs dry: every completion brings another completed event.
        if len(finished) < 400:
            reactor.watch(0, FakeEvent(done=True), on_lane0)

    def on_lane1(_error: object) -> None:
        finished.append(1)
        lane1_poll.append(reactor.polls)

    for _ in range(2 * _reactor.MIN_COMPLETIONS):
        reactor.watch(0, FakeEvent(done=True), on_lane0)
    reactor.watch(1, FakeEvent(done=True), on_lane1)
    for _ in range(10):
        await asyncio.sleep(0)
    # Stream 1's completed event is seen by the second poll, not after stream 0 is idle.
    assert lane1_poll
    assert lane1_poll[0] <= 2
    for _ in range(200):
        await asyncio.sleep(0)
    assert reactor.pending == 0


def _fake_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    # The Python core's Watches (the compiled one queries real events), with a fake query.
    monkeypatch.setattr(
        _reactor, "core", types.SimpleNamespace(query=_query, Watches=_watches.Watches)
    )
    monkeypatch.setattr(_watches, "query", _query)


def _fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    clock = [1.0]  # a stand-in for perf_counter that the callbacks advance
    monkeypatch.setattr(_reactor, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(_watches, "perf_counter", lambda: clock[0])
    _fake_driver(monkeypatch)
    return clock


async def test_a_poll_wakes_what_fits_the_iteration_by_the_tasks_measured_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 1, EventPool(0), 1.0, lambda _e: None)
    polls: list[int] = []

    def task_runs(_error: object) -> None:
        polls.append(reactor.polls)
        # The task this completion wakes runs in the next loop iteration, for 500 us.
        loop.call_soon(lambda: clock.__setitem__(0, clock[0] + 500e-6))

    for _ in range(100):
        reactor.watch(0, FakeEvent(done=True), task_runs)
    for _ in range(40):
        await asyncio.sleep(0)
    per_poll = [polls.count(p) for p in sorted(set(polls))]
    assert sum(per_poll) == 100
    assert reactor.pending == 0
    # The first poll knows no cost yet (its estimate, 50 us, lets it wake 40); then each poll
    # wakes fewer as the measured cost nears 500 us (2 ms / 500 us = 4), never fewer than
    # MIN_COMPLETIONS.
    first = int(_reactor.ITERATION_BUDGET / 50e-6)
    assert per_poll[:7] == [first, 12, 8, 6, 5, 5, 4]
    assert _reactor.MIN_COMPLETIONS <= 4
    assert all(n == 4 for n in per_poll[6:-1])
    assert 400e-6 < reactor.task_cost <= 500e-6  # the moving average, closing in


async def test_a_poll_stops_its_own_work_after_its_time_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 1, EventPool(0), 1.0, lambda _e: None)
    polls: list[int] = []

    cost = [40e-6]

    def slow_completion(_error: object) -> None:
        polls.append(reactor.polls)
        clock[0] += cost[0]  # completing this dispatch takes this long of the poll itself

    for _ in range(30):
        reactor.watch(0, FakeEvent(done=True), slow_completion)
    for _ in range(20):
        await asyncio.sleep(0)
    per_poll = [polls.count(p) for p in sorted(set(polls))]
    # 40 us each: once MIN_COMPLETIONS (4, 160 us) are done, any more would pass POLL_BUDGET.
    assert _reactor.MIN_COMPLETIONS == 4
    assert per_poll == [4] * 7 + [2]
    assert reactor.pending == 0

    # 20 us each: it stops at 7 (140 us), since an 8th would end past the 150 us budget.
    cost[0] = 20e-6
    polls.clear()
    for _ in range(30):
        reactor.watch(0, FakeEvent(done=True), slow_completion)
    for _ in range(20):
        await asyncio.sleep(0)
    per_poll = [polls.count(p) for p in sorted(set(polls))]
    assert per_poll == [7, 7, 7, 7, 2]
    assert reactor.pending == 0


async def test_completions_are_delivered_oldest_first_across_lanes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 3, EventPool(0), 1.0, lambda _e: None)
    reactor.task_cost = 500e-6  # as measured already: each poll wakes MIN_COMPLETIONS
    order: list[int] = []
    polls: list[int] = []

    def done(seq: int) -> Callable[[object], None]:
        def callback(_error: object) -> None:
            order.append(seq)
            polls.append(reactor.polls)
            # Its task takes 500 us of the next iteration: a poll then wakes only a few.
            loop.call_soon(lambda: clock.__setitem__(0, clock[0] + 500e-6))

        return callback

    # Lane 0 is the busiest; lanes 1 and 2 each hold one watch among lane 0's.
    lanes = [0] * 10 + [1] + [0] * 10 + [2] + [0] * 10
    for seq, lane in enumerate(lanes):
        reactor.watch(lane, FakeEvent(done=True), done(seq))
    for _ in range(40):
        await asyncio.sleep(0)
    assert reactor.pending == 0
    # Several polls, each waking a bounded batch, and together in watch order: the watches of
    # the quiet lanes never wait behind newer ones of the busy lane.
    assert len(set(polls)) > 2
    assert order == list(range(len(lanes)))


async def test_waiters_are_armed_only_when_the_loop_would_sleep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    window = 200e-6
    reactor = _reactor.Reactor(loop, None, 1, EventPool(0), window, lambda _e: None)
    handed: list[int] = []
    monkeypatch.setattr(reactor, "_hand_off", lambda lane: handed.append(lane.index))
    event = FakeEvent(done=False)
    reactor.watch(0, event, lambda _error: None)

    # A busy loop: 100 us of other callbacks between polls, for far longer than the window.
    for _ in range(50):
        clock[0] += 100e-6
        await asyncio.sleep(0)
    assert handed == []
    assert reactor.polls >= 40  # it kept polling, once an iteration

    # An idle loop: polls follow each other with nothing between them; after the window the
    # lane goes to its waiter thread and polling stops.
    for _ in range(50):
        clock[0] += 10e-6
        await asyncio.sleep(0)
        if handed:
            break
    assert handed == [0]
    polls = reactor.polls
    for _ in range(5):
        await asyncio.sleep(0)
    assert reactor.polls == polls
    event.done = True


async def test_inline_completions_count_as_progress_so_a_held_task_is_not_handed_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(
        loop, None, 1, EventPool(0), 200e-6, lambda _e: None, spin_window=50e-6
    )
    handed: list[object] = []
    monkeypatch.setattr(reactor, "_hand_off", handed.append)
    completed: list[object] = []
    reactor.watch(0, FakeEvent(done=True), completed.append)
    await asyncio.sleep(0)  # a poll completes it, and schedules the next poll
    assert (len(completed), reactor.spins) == (1, 0)
    # The woken task awaits one dispatch after another; each completes inline, 100 us apart,
    # so the loop does not run the reactor's poll for 600 us.
    for _ in range(6):
        clock[0] += 100e-6
        reactor.watch(0, FakeEvent(done=True), completed.append)
        reactor.spin()
    assert (len(completed), reactor.spins) == (7, 6)
    clock[0] += 100e-6
    reactor.watch(0, FakeEvent(done=False), completed.append)
    reactor.spin()  # held past HOLD_LIMIT: the task must yield to the loop
    assert reactor.pending == 1
    await asyncio.sleep(0)  # the loop polls: the kernel is still running
    # Completions happened all along: the window without progress starts now, so the loop
    # keeps polling rather than waking a waiter thread (a wake-up costs far more).
    assert handed == []
    assert reactor.pending == 1
