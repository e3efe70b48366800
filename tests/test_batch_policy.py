"""The adaptive launch policy (``policy="adaptive"``, the default) on the host backend.

A batch never waits for callers that may not come: it launches at the end of the turn of the
loop in which its first caller found nothing of the batcher in flight, and otherwise when the
batch in flight completes, when it is full, or at ``max_delay``. Each test would hang or fail
under the fixed-delay policy with an hour's ``max_delay``: no test waits on a duration.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import asyncgraph as ag

from .batching import HOUR, Affine, Array, Callers, make, row, until, want
from .loops import LOOPS, run

ASYNCIO_LOOPS = [loop for loop in LOOPS if loop != "trio"]


@pytest.fixture(params=LOOPS)
def loop(request: pytest.FixtureRequest) -> Any:
    """The loop to run a test's body on: a name, or a name and anyio's backend options."""
    return request.param


def adaptive(backend: ag.Backend, host: Affine, **kw: Any) -> ag.Batcher:
    """A batcher of the adaptive policy (the default) whose deadline never comes."""
    return make(backend, host, max_delay=HOUR, policy="adaptive", **kw)


def test_a_lone_caller_launches_at_once_not_after_max_delay(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host)
            with anyio.fail_after(10):  # an hour's max_delay: only the policy launches it
                for i in range(3):
                    (y,) = await batch(row(i))
                    np.testing.assert_allclose(y, want(i))
            assert [n for n, _ in host.batches] == [1, 1, 1]
            stats = batch.statistics()
            assert stats.launched == ag.BatchLaunches(
                full=0, idle=3, completion=0, deadline=0, flush=0
            )
            assert (stats.batches, stats.items, stats.pending, stats.in_flight) == (3, 3, 0, 0)

    run(loop, body)


def test_callers_of_the_same_turn_join_the_idle_batch(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host, max_size=8)
            callers = Callers(batch)
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for i in range(5):  # the five tasks start in one turn of the loop
                        tg.start_soon(callers.call, i)
            assert [n for n, _ in host.batches] == [5]
            assert sorted(host.batches[0][1][:, 0].tolist()) == [0, 1, 2, 3, 4]
            for i in range(5):
                np.testing.assert_allclose(callers.got[i], want(i))
            assert batch.statistics().launched.idle == 1

    run(loop, body)


def test_callers_during_a_batch_in_flight_launch_when_it_completes(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        host.release.clear()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host, max_size=8)
            callers = Callers(batch)
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(callers.call, 0)
                    await until(host.started.is_set)  # in flight, held
                    for i in (1, 2, 3):
                        tg.start_soon(callers.call, i)
                    await until(lambda: batch.statistics().pending == 3)
                    stats = batch.statistics()
                    assert (stats.batches, stats.in_flight) == (1, 1)
                    assert repr(batch) == (
                        "<Batcher 'affine_rows' open pending=3 in_flight=1 batches=1>"
                    )
                    host.release.set()
            assert [n for n, _ in host.batches] == [1, 3]
            assert sorted(host.batches[1][1][:, 0].tolist()) == [1, 2, 3]
            for i in range(4):
                np.testing.assert_allclose(callers.got[i], want(i))
            stats = batch.statistics()
            assert stats.launched == ag.BatchLaunches(
                full=0, idle=1, completion=1, deadline=0, flush=0
            )
            assert stats.waiting.count == 4

    run(loop, body)


@pytest.mark.parametrize("loop", ASYNCIO_LOOPS)
def test_callers_woken_by_a_completion_join_the_batch_it_launches(loop: Any) -> None:
    # The batch collecting while another is in flight launches at the end of the turn in
    # which that one completes: after the callers it woke ran. (On trio the callback that
    # launches it and the woken tasks run in one batch of trio's, in either order.)
    async def body() -> None:
        host = Affine()
        host.release.clear()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host, max_size=8)
            got: dict[int, Array] = {}

            async def twice() -> None:  # a client: one request, then another at once
                (got[0],) = await batch(row(0))
                (got[10],) = await batch(row(10))

            async def once() -> None:
                (got[1],) = await batch(row(1))

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(twice)
                    await until(host.started.is_set)
                    tg.start_soon(once)
                    await until(lambda: batch.statistics().pending == 1)
                    host.release.set()
            assert [n for n, _ in host.batches] == [1, 2]
            assert sorted(host.batches[1][1][:, 0].tolist()) == [1, 10]
            for i in (0, 1, 10):
                np.testing.assert_allclose(got[i], want(i))
            launched = batch.statistics().launched
            assert (launched.idle, launched.completion) == (1, 1)

    run(loop, body)


def test_a_batch_that_fills_while_one_is_in_flight_launches_full(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        host.release.clear()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host, max_size=2)
            callers = Callers(batch)
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(callers.call, 0)
                    await until(host.started.is_set)
                    tg.start_soon(callers.call, 1)
                    tg.start_soon(callers.call, 2)
                    await until(lambda: batch.statistics().batches == 2)
                    assert batch.statistics().in_flight == 2  # two batches in flight
                    host.release.set()
            assert [n for n, _ in host.batches] == [1, 2]
            for i in range(3):
                np.testing.assert_allclose(callers.got[i], want(i))
            launched = batch.statistics().launched
            assert (launched.idle, launched.full, launched.completion) == (1, 1, 0)

    run(loop, body)


def test_a_batch_behind_one_in_flight_launches_at_max_delay(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        host.release.clear()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=8, max_delay=0.001, policy="adaptive")
            callers = Callers(batch)
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(callers.call, 0)
                    await until(host.started.is_set)
                    tg.start_soon(callers.call, 1)
                    # The first batch is held: only the deadline launches the second.
                    await until(lambda: batch.statistics().batches == 2)
                    host.release.set()
            assert [n for n, _ in host.batches] == [1, 1]
            for i in range(2):
                np.testing.assert_allclose(callers.got[i], want(i))
            launched = batch.statistics().launched
            assert (launched.idle, launched.deadline, launched.completion) == (1, 1, 0)

    run(loop, body)


def test_a_caller_cancelled_behind_a_batch_in_flight_leaves_the_next_one(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        host.release.clear()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host, max_size=8)
            callers = Callers(batch)
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(callers.call, 0)
                    await until(host.started.is_set)
                    for i in (1, 2, 3):
                        tg.start_soon(callers.call, i)
                    await until(lambda: batch.statistics().pending == 3)
                    callers.scopes[2].cancel()
                    await until(lambda: batch.statistics().pending == 2)
                    host.release.set()
            assert [n for n, _ in host.batches] == [1, 2]
            assert sorted(host.batches[1][1][:, 0].tolist()) == [1, 3]
            assert sorted(callers.got) == [0, 1, 3]
            stats = batch.statistics()
            assert (stats.cancelled_before_launch, stats.items) == (1, 3)

    run(loop, body)


def test_a_bad_item_fails_its_caller_alone_and_others_still_launch_at_once(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host, max_size=8)
            errors: list[BaseException] = []
            callers = Callers(batch)

            async def bad() -> None:
                try:
                    await batch(np.zeros(3, np.float32))
                except ag.ShapeMismatchError as exc:
                    errors.append(exc)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(callers.call, 0)
                    tg.start_soon(bad)
                    tg.start_soon(callers.call, 1)
            assert len(errors) == 1
            assert [n for n, _ in host.batches] == [2]
            for i in range(2):
                np.testing.assert_allclose(callers.got[i], want(i))

    run(loop, body)


def test_a_failing_batch_fails_its_callers_and_the_next_launches_on_its_end(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        host.release.clear()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host, max_size=8)
            errors: list[BaseException] = []
            callers = Callers(batch)

            async def poison() -> None:
                try:
                    await batch(np.full(4, -1, np.float32))
                except ValueError as exc:
                    errors.append(exc)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(poison)
                    await until(host.started.is_set)
                    tg.start_soon(callers.call, 1)
                    await until(lambda: batch.statistics().pending == 1)
                    host.release.set()
            assert [str(e) for e in errors] == ["poison row"]
            np.testing.assert_allclose(callers.got[1], want(1))
            stats = batch.statistics()
            assert (stats.failed_batches, stats.launched.completion) == (1, 1)

    run(loop, body)


def test_closing_flushes_the_batch_collecting_behind_one_in_flight(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        host.release.clear()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host, max_size=8)
            callers = Callers(batch)

            async def close() -> None:
                await batch.aclose()

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(callers.call, 0)
                    await until(host.started.is_set)
                    tg.start_soon(callers.call, 1)
                    await until(lambda: batch.statistics().pending == 1)
                    tg.start_soon(close)
                    await until(lambda: batch.statistics().batches == 2)
                    assert batch.is_closed
                    host.release.set()
            for i in range(2):
                np.testing.assert_allclose(callers.got[i], want(i))
            launched = batch.statistics().launched
            assert (launched.idle, launched.flush, launched.completion) == (1, 1, 0)

    run(loop, body)


async def test_the_policy_is_checked_when_the_batcher_is_made(host: ag.Backend) -> None:
    with pytest.raises(
        ag.DispatchError,
        match=r"^batcher\(policy='eager'\); pass 'adaptive' \(launch as soon as nothing of the "
        r"batcher is in flight, the default\) or 'fixed_delay' \(wait for max_size or "
        r"max_delay\)$",
    ):
        make(host, Affine(), policy="eager")
    assert make(host, Affine(), policy="fixed_delay").statistics().batches == 0
