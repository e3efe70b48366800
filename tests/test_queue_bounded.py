"""BackendOptions(max_queued=N): dispatch() refuses a full queue, submit() waits for room."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._runtime._loop import WaitQueue

from .kernels import SCALE, Recorder, probe_kernel

X = np.arange(4, dtype=np.float32)


@pytest.fixture
def rec() -> Recorder:
    recorder = Recorder()
    recorder.release.clear()
    return recorder


@pytest.fixture
async def full(rec: Recorder) -> AsyncIterator[ag.Backend]:
    """A host backend with one dispatch in flight and one queued, of one at most each."""
    async with ag.open_backend("host", max_in_flight=1, max_queued=1) as backend:
        backend.dispatch(probe_kernel(rec), X, ag.Out(4, np.float32), np.int32(4), grid=1, block=4)
        backend.dispatch(probe_kernel(rec), X, ag.Out(4, np.float32), np.int32(4), grid=1, block=4)
        assert " in_flight=1 queued=1 " in repr(backend)
        yield backend
        rec.release.set()


def _probe(backend: ag.Backend, rec: Recorder) -> ag.PendingDispatch:
    return backend.dispatch(
        probe_kernel(rec), X, ag.Out(4, np.float32), np.int32(4), grid=1, block=4
    )


async def test_dispatch_refuses_a_full_queue_and_starts_nothing(
    full: ag.Backend, rec: Recorder
) -> None:
    full_queue = (
        r"^backend host has 1 dispatches queued already \(BackendOptions.max_queued=1\); "
        r"nothing was started — use 'await backend.submit\(...\)' to wait for room instead$"
    )
    with pytest.raises(ag.QueueFullError, match=full_queue):
        _probe(full, rec)
    # Not even a resident result was made for it.
    with pytest.raises(ag.QueueFullError, match=full_queue):
        full.dispatch(
            SCALE, X, ag.Out(4, np.float32, resident=True), np.float32(2), np.int32(4),
            grid=1, block=4,
        )  # fmt: skip
    assert repr(full) == "<HostBackend host open in_flight=1 queued=1 buffers=0>"
    assert full.telemetry.snapshot().dispatches == 2
    rec.release.set()
    pending = await full.submit(
        probe_kernel(rec), X, ag.Out(4, np.float32), np.int32(4), grid=1, block=4
    )
    assert pending.dispatch_id == 3  # the refusals used up no number
    np.testing.assert_array_equal((await pending)[0], X * 2)
    assert full.telemetry.snapshot().dispatches == 3


async def test_submit_waits_for_room_and_goes_in_call_order(
    full: ag.Backend, rec: Recorder
) -> None:
    kernel = probe_kernel(rec)

    async def submit() -> ag.PendingDispatch:
        return await full.submit(kernel, X, ag.Out(4, np.float32), np.int32(4), grid=1, block=4)

    tasks = [asyncio.create_task(submit()) for _ in range(3)]
    await asyncio.sleep(0.02)
    assert not any(task.done() for task in tasks)  # all three wait: the queue is full
    assert full.telemetry.snapshot().dispatches == 2
    rec.release.set()
    pendings = [await task for task in tasks]
    assert [p.dispatch_id for p in pendings] == [3, 4, 5]  # first come, first served
    for pending in pendings:
        np.testing.assert_array_equal((await pending)[0], X * 2)
    assert repr(full) == "<HostBackend host open in_flight=0 queued=0 buffers=0>"


async def test_a_cancelled_submit_leaves_the_line_and_starts_nothing(
    full: ag.Backend, rec: Recorder
) -> None:
    kernel = probe_kernel(rec)

    async def submit() -> ag.PendingDispatch:
        return await full.submit(kernel, X, ag.Out(4, np.float32), np.int32(4), grid=1, block=4)

    first = asyncio.create_task(submit())
    second = asyncio.create_task(submit())
    await asyncio.sleep(0.01)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    with pytest.raises(TimeoutError):  # a timeout cancels the wait the same way
        await asyncio.wait_for(submit(), 0.01)
    rec.release.set()
    pending = await second
    assert pending.dispatch_id == 3
    await pending
    assert full.telemetry.snapshot().dispatches == 3  # the cancelled ones started nothing


async def test_close_fails_the_submits_that_wait(full: ag.Backend, rec: Recorder) -> None:
    kernel = probe_kernel(rec)
    waiting = asyncio.create_task(
        full.submit(kernel, X, ag.Out(4, np.float32), np.int32(4), grid=1, block=4)
    )
    await asyncio.sleep(0.01)
    closing = asyncio.create_task(full.aclose())
    with pytest.raises(
        ag.BackendClosedError,
        match=r"^backend host was closed while submit\(\) waited for room in its queue$",
    ):
        await waiting
    rec.release.set()
    await closing
    assert full.telemetry.snapshot().dispatches_completed == 2


async def test_without_max_queued_the_queue_is_unbounded_and_submit_never_waits(
    rec: Recorder,
) -> None:
    async with ag.open_backend("host", max_in_flight=1) as backend:
        pendings = [_probe(backend, rec) for _ in range(100)]
        submitted = await backend.submit(
            probe_kernel(rec), X, ag.Out(4, np.float32), np.int32(4), grid=1, block=4
        )
        assert " in_flight=1 queued=100 " in repr(backend)
        rec.release.set()
        for pending in [*pendings, submitted]:
            await pending


async def test_call_in_turn_waits_in_line_with_submit(full: ag.Backend, rec: Recorder) -> None:
    # submit()'s wait for code with no task (a batcher's due batch): a callback in the line.
    kernel = probe_kernel(rec)
    order: list[str] = []
    made: list[ag.PendingDispatch] = []

    def turn(error: BaseException | None) -> None:
        assert error is None
        order.append("turn")
        made.append(_probe(full, rec))  # the turn is for one dispatch, made at once

    full.call_in_turn(turn)
    behind = asyncio.create_task(
        full.submit(kernel, X, ag.Out(4, np.float32), np.int32(4), grid=1, block=4)
    )
    behind.add_done_callback(lambda _: order.append("submit"))
    for _ in range(3):
        await asyncio.sleep(0)
    room = full._lifecycle.room
    assert (order, len(room)) == ([], 2)
    room.wake()  # a turn while the queue is still full (a dispatch() took the room first) ...
    for _ in range(3):
        await asyncio.sleep(0)
    assert (order, len(room)) == ([], 2)  # ... waits again, still first in line
    rec.release.set()
    await behind
    assert order == ["turn", "submit"]
    assert full.telemetry.snapshot().dispatches == 4
    # With room and nobody in line it is called at once; giving the place up then is harmless.
    await (await behind)
    await made[0]
    assert full.outstanding == 0
    full.call_in_turn(turn)()
    assert order == ["turn", "submit", "turn"]
    await made[1]


async def test_a_woken_waiter_that_is_cancelled_passes_its_turn_on() -> None:
    queue = WaitQueue()
    loop = asyncio.get_running_loop()
    first = asyncio.create_task(queue.wait(loop))
    second = asyncio.create_task(queue.wait(loop))
    third = asyncio.create_task(queue.wait(loop))
    await asyncio.sleep(0)
    queue.wake()
    first.cancel()  # woken, but cancelled before it ran
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)  # the turn went to the next in line
    assert not third.done()
    assert len(queue) == 1
    third.cancel()
    with pytest.raises(asyncio.CancelledError):
        await third
    assert len(queue) == 0
