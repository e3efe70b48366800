"""The Room: what each batch of the dispatcher's effects tells the lifecycle (room in the queue
for a waiting submit(), a close's wait for quiet), against the scheduler it is handed."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from asyncgraph._front._lifecycle import Room
from asyncgraph._jobs._scheduler import Scheduler


class Counts:
    """The two things a room reads of the scheduler."""

    def __init__(self) -> None:
        self.queued = 0
        self.idle = False

    def is_idle(self) -> bool:
        return self.idle


def scheduler(counts: Counts) -> Scheduler:
    return cast(Scheduler, counts)


async def test_a_batch_lets_one_waiting_submit_in_once_the_queue_has_room() -> None:
    loop = asyncio.get_running_loop()
    room = Room(2)
    counts = Counts()
    first, second = room.waiting.park(loop), room.waiting.park(loop)
    counts.queued = 2
    room.after_batch(scheduler(counts))  # full: nobody goes
    assert not first.done()
    assert not second.done()
    counts.queued = 1
    room.after_batch(scheduler(counts))
    assert first.done()
    assert not second.done()


async def test_a_close_goes_on_once_the_scheduler_is_idle_and_no_transfer_runs() -> None:
    room = Room(None)
    assert room.max_queued > 1 << 40  # no bound
    counts = Counts()
    drained: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    room.drained = drained
    room.transfers = 1
    counts.idle = True
    room.after_batch(scheduler(counts))
    assert not drained.done()  # a transfer still runs
    room.transfers = 0
    room.check_drained(scheduler(counts))
    assert drained.done()


async def test_renewing_drops_the_ended_loops_waiters_transfers_and_close() -> None:
    room = Room(1)
    old = room.waiting
    old.park(asyncio.get_running_loop())
    room.transfers = 3
    room.drained = asyncio.get_running_loop().create_future()
    new = room.renew()
    assert new is room.waiting
    assert new is not old
    assert not new.parked
    assert room.transfers == 0
    assert room.drained is None
