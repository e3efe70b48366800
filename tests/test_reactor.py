"""The completion reactor's polling, with a stand-in for ``cuEventQuery`` (no GPU needed)."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Callable
from typing import Any

import pytest
from cuda.bindings import driver as drv

from asyncgraph._cuda.completion import _expected_ends as _expect
from asyncgraph._cuda.completion import _reactor
from asyncgraph._cuda.core import _watches
from asyncgraph._cuda.core._choose import core
from asyncgraph._cuda.driver._driver import NOT_READY, SUCCESS
from asyncgraph._cuda.driver._events import EventPool
from asyncgraph._runtime._exceptions import CudaError
from tests.fake_driver import run_scenario
from tests.needs import CORES


class FakeEvent:
    def __init__(self, done: bool, code: Any = SUCCESS) -> None:
        self.done = done
        self.code = code  # what it completes with


def _query(event: FakeEvent) -> tuple[Any]:
    return (event.code if event.done else NOT_READY,)


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
    # The Python core's Watches (the compiled one queries real events), with a fake query; the
    # waiters of the core that runs, as the reactor hands them over.
    fake = types.SimpleNamespace(
        query=_query, Watches=_watches.Watches, NativeWaiter=core.NativeWaiter
    )
    monkeypatch.setattr(_reactor, "core", fake)
    monkeypatch.setattr(_watches, "query", _query)


def _fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    clock = [1.0]  # a stand-in for perf_counter that the callbacks advance
    monkeypatch.setattr(_reactor, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(_watches, "perf_counter", lambda: clock[0])
    _fake_driver(monkeypatch)
    return clock


def test_the_wake_budget_rises_to_a_costlier_task_at_once_and_falls_slowly() -> None:
    budget = _reactor.WakeBudget()
    assert _reactor.ITERATION_BUDGET == 2e-3
    assert _reactor.MIN_COMPLETIONS == 4
    assert (budget.cost, budget.limit()) == (0.0, 4)  # nothing measured: MIN_COMPLETIONS
    budget.learn(400e-6, 4)  # 4 woken tasks took 400 us of the loop: the first measure is taken
    assert (budget.cost, budget.limit()) == (100e-6, 20)
    budget.learn(1e-3, 1)  # a costlier task: taken at once, the next poll wakes 2 ms of them
    assert (budget.cost, budget.limit()) == (1e-3, 4)  # 2, but never fewer than 4
    budget.learn(250e-6, 5)  # 50 us each: a quarter of the way down
    assert budget.cost == pytest.approx(762.5e-6)
    assert budget.limit() == 4
    for _ in range(40):
        budget.learn(500e-6, 10)
    assert budget.cost == pytest.approx(50e-6, rel=1e-3)
    assert budget.limit() == 39  # 2 ms / 50.01 us, rounded down
    budget.learn(1.0, 2)  # a stall (another thread, the collector): counted as one budget a task
    assert budget.cost == _reactor.ITERATION_BUDGET
    budget.forget()  # the loop went idle
    assert (budget.cost, budget.limit()) == (0.0, 4)
    budget.learn(0.0, 4)  # 1 us is the smallest cost it assumes
    assert (budget.cost, budget.limit()) == (1e-6, 2000)


async def test_a_poll_wakes_what_fits_the_iteration_by_the_tasks_measured_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 1, EventPool(0), 1.0, lambda _e: None)
    per_poll = await _burst(reactor, clock, 100, 100e-6)
    # The first poll knows no cost yet: it wakes MIN_COMPLETIONS; their tasks took 100 us each,
    # so every later poll wakes the 20 that fit in 2 ms.
    assert per_poll == [4, 20, 20, 20, 20, 16]
    assert reactor.task_cost == 0.0  # the loop went idle: forgotten

    per_poll = await _burst(reactor, clock, 30, 500e-6)
    assert per_poll == [4] * 7 + [2]  # 2 ms / 500 us = 4


async def test_a_burst_after_the_loop_was_idle_does_not_wake_by_the_last_bursts_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 1, EventPool(0), 1.0, lambda _e: None)
    # A burst whose tasks only return (the end of a batch of requests, say): 5 us each, so
    # each poll after the first wakes about 400 of them.
    per_poll = await _burst(reactor, clock, 1000, 5e-6)
    assert per_poll[0] == 4
    assert all(n >= 399 for n in per_poll[1:-1])
    # The next burst's tasks take 500 us each; its first poll must not wake 400 of them (200 ms).
    per_poll = await _burst(reactor, clock, 40, 500e-6)
    assert per_poll == [4] * 10


async def test_a_costlier_task_lowers_the_next_polls_count_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 1, EventPool(0), 1.0, lambda _e: None)
    cost = [20e-6]
    polls: list[int] = []

    def task_runs(_error: object) -> None:
        polls.append(reactor.polls)
        if len(polls) == 200:
            cost[0] = 500e-6  # the load changes while the loop is busy
        loop.call_soon(_advance, clock, cost[0])  # its task, in the next loop iteration

    for _ in range(300):
        reactor.watch(0, FakeEvent(done=True), task_runs)
    for _ in range(40):
        await asyncio.sleep(0)
    per_poll = [polls.count(p) for p in sorted(set(polls))]
    assert sum(per_poll) == 300
    # 4 first, then 100 a poll (20 us each). The last 5 tasks the third poll wakes take 500 us:
    # 44 us a task in that iteration, so the fourth poll wakes 45, not knowing that each takes
    # 500 us. Their iteration (22.5 ms) raises the estimate at once: 4 a poll from then on,
    # where a moving average would still wake 12, 8, 6, 5 first.
    assert per_poll[:4] == [4, 100, 100, 45]
    assert all(n == 4 for n in per_poll[4:-1])


def _advance(clock: list[float], seconds: float) -> None:
    clock[0] += seconds


async def _burst(
    reactor: _reactor.Reactor, clock: list[float], count: int, task_cost: float
) -> list[int]:
    """*count* completed watches whose tasks each take *task_cost* of the loop iteration after
    the poll that woke them; how many each poll woke, until the reactor is idle again."""
    loop = asyncio.get_running_loop()
    polls: list[int] = []

    def task_runs(_error: object) -> None:
        polls.append(reactor.polls)
        loop.call_soon(_advance, clock, task_cost)  # its task, in the next loop iteration

    for _ in range(count):
        reactor.watch(0, FakeEvent(done=True), task_runs)
    for _ in range(count + 5):
        await asyncio.sleep(0)
        if not reactor.pending:
            break
    await asyncio.sleep(0)  # the last tasks run
    assert len(polls) == count
    assert reactor.pending == 0
    return [polls.count(p) for p in sorted(set(polls))]


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

    # 20 us each: it stops at 7 (140 us), since an 8th would end past the 150 us budget. (The
    # loop went idle: the first poll knows no cost of the woken tasks yet, so it wakes 4.)
    cost[0] = 20e-6
    polls.clear()
    for _ in range(30):
        reactor.watch(0, FakeEvent(done=True), slow_completion)
    for _ in range(20):
        await asyncio.sleep(0)
    per_poll = [polls.count(p) for p in sorted(set(polls))]
    assert per_poll == [4, 7, 7, 7, 5]
    assert reactor.pending == 0


async def test_completions_are_delivered_oldest_first_across_lanes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 3, EventPool(0), 1.0, lambda _e: None)
    order: list[int] = []
    polls: list[int] = []

    def done(seq: int) -> Callable[[object], None]:
        def callback(_error: object) -> None:
            order.append(seq)
            polls.append(reactor.polls)
            # Its task takes 500 us of the next iteration: each poll wakes MIN_COMPLETIONS.
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


async def test_a_completion_that_watches_anew_leaves_the_next_poll_after_the_woken_tasks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 1, EventPool(0), 1.0, lambda _e: None)
    ran: list[tuple[int, int]] = []  # per task: the poll that woke it, the polls when it ran
    launches = [40]

    def done(_error: object) -> None:
        woken_by = reactor.polls
        if launches[0]:
            # A queued dispatch launches in the slot this one freed: its event is watched now,
            # from inside the poll.
            launches[0] -= 1
            reactor.watch(0, FakeEvent(done=True), done)

        def task_runs() -> None:
            clock[0] += 500e-6
            ran.append((woken_by, reactor.polls))

        loop.call_soon(task_runs)

    for _ in range(8):
        reactor.watch(0, FakeEvent(done=True), done)
    for _ in range(60):
        await asyncio.sleep(0)
    assert reactor.pending == 0
    assert len(ran) == 48
    # Every task ran before the next poll, which so measured all of them: 500 us a task, so
    # each poll woke MIN_COMPLETIONS (4).
    assert all(woken_by == polls for woken_by, polls in ran)
    woken = [woken_by for woken_by, _ in ran]
    per_poll = [woken.count(p) for p in sorted(set(woken))]
    assert per_poll == [4] * 12


async def test_a_failed_event_fails_its_watch_and_the_others_complete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    faults: list[object] = []
    reactor = _reactor.Reactor(loop, None, 2, EventPool(0), 1.0, faults.append)
    outcomes: dict[int, object] = {}

    def done(seq: int) -> Callable[[object], None]:
        return lambda error: outcomes.__setitem__(seq, error)

    # Not a sticky error (the context is fine): only its own watch fails, and the poll that
    # met it leaves the others to the next poll.
    failing = drv.CUresult.CUDA_ERROR_INVALID_HANDLE
    reactor.watch(1, FakeEvent(done=True, code=failing), done(0))
    for seq in range(1, 10):
        reactor.watch(0, FakeEvent(done=True), done(seq))
    for _ in range(10):
        await asyncio.sleep(0)
    assert reactor.pending == 0
    assert sorted(outcomes) == list(range(10))
    assert isinstance(outcomes[0], CudaError)
    assert all(outcomes[seq] is None for seq in range(1, 10))
    assert faults == []


@pytest.mark.stand_in
@pytest.mark.nvrtc
@pytest.mark.parametrize("core", CORES)
def test_an_awaited_dispatch_catches_up_with_a_poll_that_waits_behind_a_busy_loop(
    core: str,
) -> None:
    # A service's request handlers held the loop for a millisecond after two dispatches
    # completed: the task awaiting the next dispatch finishes those two before it yields, and
    # leaves its own to the loop's poll (completing it inline would let it run on ahead of
    # the tasks it just woke).
    seen = run_scenario("tests.fake_driver.core_scenario", core, "catch_up", streams="deferred")
    assert seen["compiled"] == (core == "compiled")
    assert seen["done"] == [True, True, False]
    assert (seen["polls"], seen["spins"]) == (0, 0)
    assert seen["right"] == [True, True, True]


async def test_a_catch_up_waits_until_the_poll_was_asked_for_long_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    # No spin of a lone event (spin_window 0): what a catch-up finishes is all there is.
    reactor = _reactor.Reactor(loop, None, 2, EventPool(0), 1.0, lambda _e: None)
    completed: list[str] = []
    first, second = FakeEvent(done=False), FakeEvent(done=False)
    reactor.watch(0, first, lambda _e: completed.append("first"))
    reactor.watch(1, second, lambda _e: completed.append("second"))
    first.done = True
    clock[0] += 0.5 * _watches.CATCH_UP_AFTER
    reactor.spin()  # the poll was asked for only just now: it serves them
    assert completed == []
    clock[0] += _watches.CATCH_UP_AFTER
    reactor.spin()
    assert completed == ["first"]
    assert (reactor.polls, reactor.pending) == (0, 1)
    reactor.pause()
    clock[0] += 10 * _watches.CATCH_UP_AFTER
    reactor.spin()  # a capture runs: no queries on the loop's thread
    assert reactor.pending == 1
    # Nothing left behind for the loop to hand to a real waiter thread after the test.
    reactor.resume()
    second.done = True
    await asyncio.sleep(0)
    assert completed == ["first", "second"]


async def _idle_until_handed(clock: list[float], handed: list[Any], step: float = 10e-6) -> None:
    """Let an idle loop poll (*step* apart) until a lane was handed to its waiter."""
    for _ in range(200):
        clock[0] += step
        await asyncio.sleep(0)
        if handed:
            return


async def test_a_hand_off_asks_its_waiter_to_poke_the_loop_before_the_expected_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 1, EventPool(0), 200e-6, lambda _e: None)
    handed: list[Any] = []
    monkeypatch.setattr(reactor._waiters, "hand", lambda *args: handed.append(args))
    event = FakeEvent(done=False)
    expect = clock[0] + 5e-3
    reactor.watch(0, event, lambda _error: None, expect)
    await _idle_until_handed(clock, handed)
    [(lane, handed_event, wake_at)] = handed
    assert (lane.index, handed_event) == (0, event)
    assert wake_at == pytest.approx(expect - _watches.POKE_MARGIN)

    # Its poke (the waiter still follows the event): the loop polls again, and finds it done.
    polls = reactor.polls
    for _ in range(3):
        await asyncio.sleep(0)
    assert reactor.polls == polls  # asleep until poked
    reactor._poked(lane)
    event.done = True
    await asyncio.sleep(0)
    assert (reactor.pokes, reactor.pending) == (1, 0)
    assert reactor.polls == polls + 1


async def test_work_expected_to_end_within_the_margin_is_polled_for_not_handed_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    window = 200e-6
    reactor = _reactor.Reactor(loop, None, 1, EventPool(0), window, lambda _e: None)
    handed: list[Any] = []
    monkeypatch.setattr(reactor._waiters, "hand", lambda *args: handed.append(args))
    event = FakeEvent(done=False)
    # Expected to end just after the polling window: a sleeping loop would wake too late.
    expect = clock[0] + window + 0.5 * _watches.POKE_MARGIN
    reactor.watch(0, event, lambda _error: None, expect)
    await _idle_until_handed(clock, handed)
    # Handed only once the expected end passed (the kernel runs longer), and with no poke: the
    # loop has just polled all along.
    assert clock[0] >= expect
    [(_lane, _event, wake_at)] = handed
    assert wake_at == 0.0
    event.done = True


async def test_a_poke_for_a_lane_no_longer_handed_off_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    reactor = _reactor.Reactor(loop, None, 1, EventPool(0), 200e-6, lambda _e: None)
    reactor._poked(reactor._lanes[0])  # the waiter's report came first: nothing to wake for
    assert reactor.pokes == 0
    await asyncio.sleep(0)
    assert reactor.polls == 0


def test_an_expected_time_falls_at_once_and_rises_slowly() -> None:
    assert _watches.learned(0.0, 1e-3) == 1e-3
    assert _watches.learned(1e-3, 0.5e-3) == 0.5e-3
    assert _watches.learned(1e-3, 2e-3) == pytest.approx(1e-3 + _watches.EXPECT_RISE * 1e-3)
    steps = [_watches.follow_step(t) for t in (0.0, 1e-4, 1e-3, 1e-2)]
    assert steps == sorted(steps)
    assert steps[0] == _watches.FOLLOW_MIN
    assert steps[-1] == _watches.FOLLOW_MAX
    # Past FOLLOW_LONG_AFTER: longer sleeps, a share of the wait, up to FOLLOW_LONG_MAX.
    long_steps = [_watches.follow_step(t) for t in (0.11, 0.2, 1.0, 100.0)]
    assert long_steps == sorted(long_steps)
    assert long_steps[0] >= _watches.FOLLOW_MAX
    assert long_steps[1] == pytest.approx(0.2 * _watches.FOLLOW_LONG_FRACTION)
    assert long_steps[-1] == _watches.FOLLOW_LONG_MAX


@pytest.mark.stand_in
@pytest.mark.parametrize("core", CORES)
def test_a_long_wait_is_followed_not_synchronized(core: str) -> None:
    # A thread asleep in cuEventSynchronize needs blocking-sync events, whose completion
    # reaches every query later: the waiter follows the event however long it runs.
    seen = run_scenario("tests.fake_driver.core_scenario", core, "long_wait", streams="deferred")
    assert seen["compiled"] == (core == "compiled")
    assert seen["handoffs"] == 2
    assert seen["flag"] == 1
    assert seen["synchronized"] == 0


@pytest.mark.stand_in
@pytest.mark.parametrize("core", CORES)
def test_a_lone_dispatch_expected_to_end_well_past_the_spin_window_is_queried_once(
    core: str,
) -> None:
    seen = run_scenario("tests.fake_driver.core_scenario", core, "spin_skip")
    assert seen["compiled"] == (core == "compiled")
    assert seen["far_done"] == {"spun": 1, "done_inline": 1, "done": 1}  # one query found it
    assert seen["far"] == {"spun": 0, "done_inline": 0, "done": 1}  # left to the loop's poll
    assert seen["unknown"] == {"spun": 1, "done_inline": 1, "done": 1}  # spun until it ended


@pytest.mark.stand_in
@pytest.mark.nvrtc
async def test_work_expected_to_end_well_past_the_window_is_handed_off_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _fake_clock(monkeypatch)
    loop = asyncio.get_running_loop()
    window = 200e-6
    reactor = _reactor.Reactor(loop, None, 2, EventPool(0), window, lambda _e: None)
    handed: list[Any] = []
    monkeypatch.setattr(reactor._waiters, "hand", lambda *args: handed.append(args))
    far, near = FakeEvent(done=False), FakeEvent(done=False)
    # Expected to end sooner than a window and two margins: polled for the window first.
    reactor.watch(1, near, lambda _error: None, clock[0] + window + reactor.poke_margin)
    await asyncio.sleep(0)
    assert handed == []
    near.done = True
    await asyncio.sleep(0)
    assert reactor.pending == 0
    # Five milliseconds away: the first poll hands it to its waiter, no window of polls.
    polls = reactor.polls
    reactor.watch(0, far, lambda _error: None, clock[0] + 5e-3)
    await asyncio.sleep(0)
    assert reactor.polls == polls + 1
    [(lane, event, wake_at)] = handed
    assert (lane.index, event) == (0, far)
    assert wake_at == pytest.approx(clock[0] + 5e-3 - reactor.poke_margin)
    # Nothing left behind for a real waiter thread after the test.
    far.done = True
    reactor._woken(lane)
    await asyncio.sleep(0)
    assert reactor.pending == 0


def test_the_poke_margin_rises_to_a_late_wake_falls_slowly_and_eases_back() -> None:
    low, high = _watches.POKE_MARGIN_LIMITS
    start = _watches.POKE_MARGIN
    assert _expect.margin_after_poke(start, 400e-6) == pytest.approx(500e-6)  # at once
    assert _expect.margin_after_poke(500e-6, 100e-6) == pytest.approx(500e-6 - 375e-6 / 8)
    assert _expect.margin_after_poke(start, 1.0) == high
    assert _expect.margin_after_poke(start, 0.0) == pytest.approx(start - (start - 0) / 8)
    assert _expect.margin_after_poke(low, 0.0) == low
    # Polls within the margin ease it back to where it starts, never below.
    margin = high
    for _ in range(1000):
        margin = _expect.eased(margin)
    assert start < margin < start + 1e-6
    assert _expect.eased(start) == start
    assert _expect.eased(low) == low


@pytest.mark.parametrize("core", CORES)
def test_work_that_ends_long_before_its_expected_end_is_reported_as_it_ends(core: str) -> None:
    # A plan that once took 200 ms, then 5 ms: its waiter follows the event while it waits for
    # the stale wake time, so the end is reported, and no poke comes 200 ms in. (A waiter that
    # slept until the wake time made each later await take as long as the longest before it,
    # less a margin: a hang, to its callers.)
    seen = run_scenario(
        "tests.fake_driver.core_scenario", core, "stale_expectation", streams="deferred"
    )
    assert seen["compiled"] == (core == "compiled")
    assert seen["handoffs"] == 1
    assert seen["pokes"] == 0
    assert seen["flag"] == 1


@pytest.mark.parametrize("core", CORES)
def test_the_general_path_learns_each_plans_time_and_forgets_it_with_the_plan(core: str) -> None:
    # The first dispatch of a plan is watched with no expected end, the second with one; the
    # times of the plans the plan cache let go of are not kept.
    seen = run_scenario("tests.fake_driver.core_scenario", core, "learned_times")
    assert seen["compiled"] == (core == "compiled")
    assert seen["first_expect"] == 0.0
    assert seen["second_expect"] is True
    assert 1 <= seen["held"] <= seen["max_plans"]


@pytest.mark.parametrize("core", CORES)
def test_a_waiter_pokes_the_loop_before_a_kernel_of_known_length_ends(core: str) -> None:
    # Six awaits of a 20 ms kernel, one at a time: each goes to a native waiter thread; once the
    # plan's time is learned (the fast plan's on the compiled core, the general path's on the
    # Python core) the waiter wakes the loop before the end. (Not every poke need land first
    # on a loaded machine.)
    seen = run_scenario("tests.fake_driver.core_scenario", core, "expected_end", streams="deferred")
    assert seen["compiled"] == (core == "compiled")
    assert seen["handoffs"] == 6
    assert 1 <= seen["pokes"] <= 5  # the first await has no expected end yet
    assert seen["flag"] == 1
