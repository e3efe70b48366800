"""Inbox's drains, bounded by time: a fake clock (the module's ``perf_counter``) stands in for
the real one, so no test depends on how fast this machine is.

Dispatches that complete through an inbox after their loop ended are covered end to end in
test_close_loops.py; here the inbox alone."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

from asyncgraph._runtime import _inbox
from asyncgraph._runtime._inbox import Inbox

WAIT = 30.0  # seconds: only a lost item takes this long


class FakeClock:
    """The module's perf_counter while a test runs: time passes only when a handler says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """A fake clock, with a budget of 10 (fake) seconds and at least 2 items a drain."""
    fake = FakeClock()
    monkeypatch.setattr(_inbox, "perf_counter", fake)
    monkeypatch.setattr(_inbox, "DRAIN_BUDGET", 10.0)
    monkeypatch.setattr(_inbox, "MIN_ITEMS", 2)
    return fake


class Recorder(Inbox[Any]):
    """An inbox that records what each drain (the loop callback) handled."""

    def __init__(self, loop: asyncio.AbstractEventLoop, handle: Callable[[Any], None]) -> None:
        self.batches: list[list[Any]] = []
        self.user_handle = handle
        super().__init__(loop, self._record)

    def _drain(self, *args: Any, **kwargs: Any) -> None:
        self.batches.append([])
        super()._drain(*args, **kwargs)

    def _record(self, item: Any) -> None:
        self.batches[-1].append(item)
        self.user_handle(item)


class Seen:
    """What a handler saw, and a future that is done once it saw *count* items."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self.items: list[Any] = []
        self.count = count
        self.all_in = loop.create_future()

    def add(self, item: Any) -> None:
        self.items.append(item)
        if len(self.items) == self.count:
            self.all_in.set_result(None)

    async def wait(self) -> None:
        await asyncio.wait_for(asyncio.shield(self.all_in), WAIT)

    def expect(self, count: int) -> None:
        """Wait for *count* items in all from now on."""
        self.count = count
        self.all_in = asyncio.get_running_loop().create_future()


async def test_a_drain_stops_after_its_budget_and_the_rest_follows_in_later_iterations(
    clock: FakeClock,
) -> None:
    loop = asyncio.get_running_loop()
    seen = Seen(loop, 10)

    def handle(item: int) -> None:
        clock.now += 3.0  # the budget (10) is spent by the 4th item
        seen.add(item)
        if item == 0:  # a callback the loop has to run before the next drain
            loop.call_soon(seen.items.append, "other")

    inbox = Recorder(loop, handle)
    for i in range(10):
        inbox.post(i)
    await seen.wait()
    assert inbox.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert seen.items == [0, 1, 2, 3, "other", 4, 5, 6, 7, 8, 9]
    assert inbox.wakeups == 1  # the later drains needed no wake-up from another thread
    # The chain ended: the next post wakes the loop again.
    seen.expect(12)
    inbox.post(10)
    await seen.wait()
    assert (inbox.batches[-1], inbox.wakeups) == ([10], 2)


async def test_a_drain_handles_the_minimum_however_slow_each_item_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The module's own budget and minimum; every item takes ten budgets.
    clock = FakeClock()
    monkeypatch.setattr(_inbox, "perf_counter", clock)
    least = _inbox.MIN_ITEMS
    assert least > 1
    loop = asyncio.get_running_loop()
    seen = Seen(loop, 2 * least + 1)

    def handle(item: int) -> None:
        clock.now += 10 * _inbox.DRAIN_BUDGET
        seen.add(item)

    inbox = Recorder(loop, handle)
    for i in range(2 * least + 1):
        inbox.post(i)
    await seen.wait()
    everything = list(range(2 * least + 1))
    assert inbox.batches == [everything[:least], everything[least:-1], everything[-1:]]
    assert seen.items == everything


async def test_posts_from_threads_while_drains_are_rescheduled_are_each_handled_once_in_order(
    clock: FakeClock,
) -> None:
    loop = asyncio.get_running_loop()
    threads, per_thread = 4, 3000
    seen = Seen(loop, threads * per_thread)
    first = threading.Event()

    def handle(item: tuple[int, int]) -> None:
        clock.now += 3.0  # 4 items a drain
        if not seen.items:
            first.set()
            time.sleep(0.01)  # the posters queue plenty meanwhile
        seen.add(item)

    inbox = Recorder(loop, handle)

    def poster(t: int) -> None:
        for i in range(per_thread):
            inbox.post((t, i))
            if i == 0 and t == 0:
                first.wait(WAIT)
            elif i % 20 == 0:
                time.sleep(0.0002)  # posts keep arriving while the loop drains

    workers = [threading.Thread(target=poster, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    try:
        await seen.wait()
    finally:
        for worker in workers:
            worker.join(WAIT)
    await asyncio.sleep(0)  # a drain woken by a late race, if any, finds nothing left
    assert len(seen.items) == len(set(seen.items)) == threads * per_thread  # once each
    for t in range(threads):  # in posting order
        assert [i for u, i in seen.items if u == t] == list(range(per_thread))
    assert [item for batch in inbox.batches for item in batch] == seen.items
    assert max(len(batch) for batch in inbox.batches) == 4  # each within the budget
    # Drains the drains scheduled themselves, without a wake-up from a poster.
    assert len(inbox.batches) > inbox.wakeups


async def test_a_handler_error_goes_to_the_loop_and_the_inbox_goes_on() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        seen = Seen(loop, 4)
        failure = ValueError("boom")

        def handle(item: int) -> None:
            if item == 2:
                raise failure
            seen.add(item)

        inbox = Inbox(loop, handle)
        for i in range(5):
            inbox.post(i)
        # The items behind the failed one follow in the next loop iteration, no post needed.
        await seen.wait()
        # As before: the error is raised out of the loop callback, for the loop's exception
        # handler, once; the failed item is not handed again; later posts are handled.
        assert [context.get("exception") for context in errors] == [failure]
        assert seen.items == [0, 1, 3, 4]
        seen.expect(5)
        inbox.post(5)
        await seen.wait()
        assert seen.items == [0, 1, 3, 4, 5]
        assert len(errors) == 1
    finally:
        loop.set_exception_handler(previous)


def test_what_a_bounded_drain_left_when_its_loop_closed_is_handled_off_the_loop(
    clock: FakeClock,
) -> None:
    loop = asyncio.new_event_loop()
    on_loop: list[int] = []
    off_loop: list[tuple[int, str]] = []

    def handle(item: int) -> None:
        clock.now += 3.0  # 4 items a drain
        on_loop.append(item)

    def handle_off(item: int) -> None:
        off_loop.append((item, threading.current_thread().name))

    inbox = Inbox(loop, handle, off_loop=handle_off)
    for i in range(10):
        inbox.post(i)
    loop.call_soon(loop.stop)
    loop.run_forever()  # one loop iteration: one drain, which left the rest for the next
    loop.close()
    assert on_loop == [0, 1, 2, 3]
    here = threading.current_thread().name
    _inbox.settle(loop)  # what a backend's next loop does with what its ended loop left
    assert off_loop == [(i, here) for i in range(4, 10)]
    worker = threading.Thread(target=inbox.post, args=(10,), name="late-poster")
    worker.start()
    worker.join(WAIT)
    assert off_loop[6:] == [(10, "late-poster")]  # on the posting thread
    _inbox.settle(loop)
    assert on_loop == [0, 1, 2, 3]
    assert len(off_loop) == 7  # none twice


class RacyDeque(deque[Any]):
    """A deque that, the first time a drain finds it empty, takes a post right after (as if a
    worker thread's post ran just then): the drain has seen it empty, the post sees the drain
    still scheduled."""

    def __init__(self, late: Callable[[], None]) -> None:
        super().__init__()
        self.late: Callable[[], None] | None = late

    def __len__(self) -> int:
        length = super().__len__()
        if length == 0 and self.late is not None:
            late, self.late = self.late, None
            late()
        return length


async def test_a_post_as_a_drain_finds_the_deque_empty_is_not_lost() -> None:
    loop = asyncio.get_running_loop()
    seen = Seen(loop, 3)
    inbox = Recorder(loop, seen.add)
    inbox._items = RacyDeque(lambda: inbox.post(2))
    inbox.post(0)
    inbox.post(1)
    await seen.wait()
    assert seen.items == [0, 1, 2]
    assert inbox.wakeups == 1  # the late post woke nobody: the drain took it
    assert inbox.batches == [[0, 1, 2]]
