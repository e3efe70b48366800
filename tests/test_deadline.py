"""Deadlines finer than the loop's millisecond timers (``_deadline``), and the batcher's use.

The clock the deadlines are kept to is replaced by a fake one, which the tests move by hand
and which counts its reads (one per check): no test waits on, or measures, a duration.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._runtime import _deadline, _loop

from .batching import Affine, make, row, want
from .loops import LOOPS, run

Array = np.ndarray[Any, Any]
HOUR = 3600.0


class FakeClock:
    """A clock that stands still until moved, counting how often it is read."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(_deadline, "clock", fake)
    return fake


@pytest.fixture(params=LOOPS)
def loop(request: pytest.FixtureRequest) -> Any:
    return request.param


async def turns(n: int) -> None:
    for _ in range(n):
        await anyio.lowlevel.checkpoint()


async def turns_until(condition: Any, most: int = 50) -> int:
    """Let the loop turn until *condition()* holds; how many turns that took."""
    for n in range(most):
        if condition():
            return n
        await anyio.lowlevel.checkpoint()
    raise AssertionError(f"not so after {most} turns of the loop")


def test_a_deadline_under_a_millisecond_is_checked_each_turn(loop: Any, clock: FakeClock) -> None:
    async def body() -> None:
        called: list[int] = []
        _deadline.call_at_deadline(_loop.current_loop(), 0.0005, called.append, 7)
        reads = clock.reads
        await turns(10)
        assert called == []  # the clock stands still: not due, whatever the loop's timers do
        assert clock.reads >= reads + 5  # checked turn by turn, not left to a timer
        clock.now = 0.0005
        await turns_until(lambda: called)
        assert called == [7]
        reads = clock.reads
        await turns(10)
        assert clock.reads == reads  # once called, no more checks

    run(loop, body)


def test_a_far_deadline_is_left_to_the_loop_timer(loop: Any, clock: FakeClock) -> None:
    async def body() -> None:
        called: list[int] = []
        handle = _deadline.call_at_deadline(_loop.current_loop(), HOUR, called.append, 1)
        await turns(2)  # (trio's timer task reads the clock once, as it starts)
        reads = clock.reads
        await turns(20)
        assert clock.reads == reads  # nothing per turn while the deadline is far
        handle.cancel()
        await turns(5)
        assert called == []

    run(loop, body)


def test_a_cancelled_deadline_stops_checking(loop: Any, clock: FakeClock) -> None:
    async def body() -> None:
        called: list[int] = []
        handle = _deadline.call_at_deadline(_loop.current_loop(), 0.0005, called.append, 1)
        await turns(3)
        handle.cancel()
        await turns(2)
        reads = clock.reads
        clock.now = 1.0
        await turns(10)
        assert (called, clock.reads) == ([], reads)

    run(loop, body)


class RecordingLoop:
    """The two calls a :class:`Deadline` makes of an asyncio loop, recorded, not run."""

    class Handle:
        def __init__(self) -> None:
            self.cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.handles: list[RecordingLoop.Handle] = []

    def _handle(self) -> RecordingLoop.Handle:
        self.handles.append(self.Handle())
        return self.handles[-1]

    def call_later(self, delay: float, fn: Any) -> RecordingLoop.Handle:
        self.calls.append(("later", delay))
        return self._handle()

    def call_soon(self, fn: Any) -> RecordingLoop.Handle:
        self.calls.append(("soon", 0.0))
        return self._handle()


def test_a_timer_that_fires_early_waits_again_instead_of_calling(clock: FakeClock) -> None:
    # uvloop rounds a timer's delay to whole milliseconds, so it may fire early.
    fake = RecordingLoop()
    called: list[str] = []
    deadline = _deadline.Deadline(fake, 0.010, called.append, ("due",))
    assert fake.calls == [("later", 0.010 - _deadline.SLACK)]
    clock.now = 0.005  # the timer fired 3.9 ms early: another timer for what is left
    deadline._check()
    assert fake.calls[-1] == ("later", 0.005 - _deadline.SLACK)
    clock.now = 0.0095  # within the slack: checked at each turn
    deadline._check()
    assert fake.calls[-1] == ("soon", 0.0)
    assert called == []
    clock.now = 0.010
    deadline._check()
    assert called == ["due"]
    deadline.cancel()  # harmless once called
    assert fake.handles[-1].cancelled


def test_a_batch_launches_at_its_deadline_turn_by_turn(loop: Any, clock: FakeClock) -> None:
    # max_delay=0.0005 is below the 1 ms of asyncio's and uvloop's timers: the batch launches
    # at the first turn the clock has passed its deadline, not when a 1 ms timer fires.
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=8, max_delay=0.0005)
            got: list[Array] = []

            async def one() -> None:
                (y,) = await batch(row(2))
                got.append(y)

            async with anyio.create_task_group() as tg:
                tg.start_soon(one)
                await turns(10)
                assert batch.statistics().batches == 0  # the clock stands still
                clock.now = 0.0005
                await turns_until(lambda: batch.statistics().batches == 1)
            np.testing.assert_allclose(got[0], want(2))
            assert [n for n, _ in host.batches] == [1]

    run(loop, body)


def test_a_full_batch_stops_its_deadline_checks(loop: Any, clock: FakeClock) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=4, max_delay=0.0005)
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for i in range(4):
                        tg.start_soon(batch, row(i))
            reads = clock.reads
            await turns(10)
            assert clock.reads == reads
            assert [n for n, _ in host.batches] == [4]

    run(loop, body)
