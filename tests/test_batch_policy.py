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
from structlog.testing import capture_logs

import asyncgraph as ag

from .batching import AFFINE_SRC, BIAS, HOUR, A, Affine, Array, Callers, F, make, row, until, want
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


# -- a caller alone: its batch of one launches in its call ----------------------------------------


def test_after_a_batch_of_one_a_caller_finding_it_idle_launches_in_its_call(loop: Any) -> None:
    # While callers come one at a time, a caller that finds the batcher idle dispatches its
    # batch of one itself; a caller of the same turn then collects behind it, and launches
    # when it completes (under the end-of-turn launch, both would share one batch).
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host, max_size=8)
            (y,) = await batch(row(0))  # a batch of one: callers come one at a time
            np.testing.assert_allclose(y, want(0))
            host.release.clear()
            callers = Callers(batch)
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(callers.call, 1)
                    tg.start_soon(callers.call, 2)
                    await until(lambda: batch.statistics().pending == 1)
                    stats = batch.statistics()
                    assert (stats.batches, stats.in_flight) == (2, 1)
                    host.release.set()
            assert [n for n, _ in host.batches] == [1, 1, 1]
            for i in (1, 2):
                np.testing.assert_allclose(callers.got[i], want(i))
            stats = batch.statistics()
            assert stats.launched == ag.BatchLaunches(
                full=0, idle=2, completion=1, deadline=0, flush=0
            )
            assert (stats.items, stats.in_flight, stats.waiting.count) == (3, 0, 3)

    run(loop, body)


def test_a_lone_caller_gets_its_rows_strided_or_not_and_its_error(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host)
            strided = np.stack([row(5), row(6)], axis=1)[:, 0]  # every other float: staged
            assert not strided.flags.c_contiguous
            with anyio.fail_after(10):
                for x, i in ((row(0), 0), (row(1), 1), (strided, 5), (row(2), 2)):
                    (y,) = await batch(x)
                    np.testing.assert_allclose(y, want(i))
                with pytest.raises(ValueError, match=r"^poison row$"):
                    await batch(np.full(4, -1, np.float32))
                (y,) = await batch(row(3))
            np.testing.assert_allclose(y, want(3))
            stats = batch.statistics()
            assert (stats.batches, stats.failed_batches, stats.in_flight) == (6, 1, 0)
            assert stats.launched.idle == 6
            assert [n for n, _ in host.batches] == [1] * 6

    run(loop, body)


def test_a_lone_caller_cancelled_while_its_batch_runs_leaves_it_running(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host)
            await batch(row(0))
            host.release.clear()
            host.started.clear()
            got: list[Array] = []
            ended: list[bool] = []
            scope = anyio.CancelScope()

            async def one() -> None:
                try:
                    with scope:
                        got.extend(await batch(row(1)))
                finally:
                    ended.append(True)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(one)
                    await until(host.started.is_set)  # launched in its call, running
                    scope.cancel()
                    await until(lambda: bool(ended))  # it stopped waiting; the batch runs
                    assert batch.statistics().in_flight == 1
                    host.release.set()
                await until(lambda: batch.statistics().in_flight == 0)
                (y,) = await batch(row(2))
            assert got == []
            np.testing.assert_allclose(y, want(2))
            assert [n for n, _ in host.batches] == [1, 1, 1]
            stats = batch.statistics()
            assert (stats.cancelled_before_launch, stats.failed_batches) == (0, 0)

    run(loop, body)


def test_a_lone_caller_waits_in_line_when_the_backend_queue_is_full(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host", max_in_flight=1, max_queued=1) as backend:
            batch = adaptive(backend, host)
            await batch(row(0))  # callers come one at a time
            host.release.clear()
            host.started.clear()
            kernel = ag.Kernel(AFFINE_SRC, "affine_rows", host=host)
            running, queued = plain(backend, kernel, 10), plain(backend, kernel, 11)
            await until(host.started.is_set)
            callers = Callers(batch)
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(callers.call, 1)  # no room: in line, as any batch
                    await until(lambda: batch.statistics().waiting_for_room == 1)
                    host.release.set()
            np.testing.assert_allclose(callers.got[1], want(1))
            np.testing.assert_allclose((await running)[0][0], want(10))
            np.testing.assert_allclose((await queued)[0][0], want(11))
            assert [n for n, _ in host.batches] == [1, 1, 1, 1]
            assert batch.statistics().launched.idle == 2

    run(loop, body)


def plain(backend: ag.Backend, kernel: ag.Kernel, i: int) -> ag.PendingDispatch:
    """A dispatch of the batch kernel on one row, not through the batcher."""
    return backend.dispatch(
        kernel, row(i)[None], ag.Out((1, F), np.float32), BIAS, A, np.int32(F), np.int32(1),
        grid=1, block=256,
    )  # fmt: skip


def test_a_lone_callers_batch_is_padded_to_the_smallest_bucket(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = adaptive(backend, host, max_size=4, buckets=[2, 4], graph="auto")
            with anyio.fail_after(10):
                for i in range(3):  # the first at the end of its turn, then alone
                    (y,) = await batch(row(i))
                    np.testing.assert_allclose(y, want(i))
            assert [n for n, _ in host.batches] == [2, 2, 2]
            for _, x in host.batches:
                np.testing.assert_array_equal(x[1], np.zeros(F, np.float32))
            stats = batch.statistics()
            assert (stats.batches, stats.items, stats.padded_rows) == (3, 3, 3)
            assert stats.mean_fill == 1 / 2
            assert stats.launched.idle == 3

    run(loop, body)


def test_a_lone_callers_batch_logs_its_launch_as_any_batch(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host", dispatch_events_enabled=True) as backend:
            batch = adaptive(backend, host)
            with capture_logs() as logs:
                for i in range(3):  # the first at the end of its turn, then alone
                    await batch(row(i))
            launched = [e for e in logs if e["event"] == "batch.launched"]
            assert [(e["items"], e["size"], e["kernel"]) for e in launched] == [
                (1, 1, "affine_rows")
            ] * 3
            assert all(isinstance(e["dispatch_id"], int) for e in launched)
            assert launched[1]["waited_max"] == 0.0  # alone: it waited for nobody
            assert batch.statistics().waiting.count == 3

    run(loop, body)
