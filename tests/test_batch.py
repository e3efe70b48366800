"""The batcher (``ag.batcher``) on the host backend, under asyncio, uvloop and trio.

Every test waits on counts and events, never on a duration: where a test needs a batch to
collect, its ``max_delay`` is an hour, its policy ``"fixed_delay"`` (which launches a batch
only when full or at its deadline), and something else (a full batch, a flush, a close)
launches it. The adaptive policy, the default, is tested in ``test_batch_policy.py``.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from structlog.testing import capture_logs

import asyncgraph as ag

from .batching import (
    AFFINE_SRC,
    BIAS,
    HOUR,
    A,
    Affine,
    Array,
    Callers,
    F,
    make,
    make_two,
    row,
    until,
    want,
)
from .loops import LOOPS, run


@pytest.fixture(params=LOOPS)
def loop(request: pytest.FixtureRequest) -> Any:
    """The loop to run a test's body on: a name, or a name and anyio's backend options."""
    return request.param


def test_concurrent_callers_get_their_rows_in_full_batches(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=8)
            callers = Callers(batch)
            got, one = callers.got, callers.call

            async with anyio.create_task_group() as tg:
                for i in range(64):
                    tg.start_soon(one, i)
            for i in range(64):
                assert got[i].shape == (F,)
                np.testing.assert_allclose(got[i], want(i))
            assert sorted(n for n, _ in host.batches) == [8] * 8
            stats = batch.statistics()
            assert (stats.batches, stats.items, stats.padded_rows) == (8, 64, 0)
            assert stats.mean_fill == 1.0
            assert stats.launched == ag.BatchLaunches(
                full=8, idle=0, completion=0, deadline=0, flush=0
            )
            assert stats.waiting.count == 64
            assert (stats.pending, stats.in_flight, stats.failed_batches) == (0, 0, 0)
            assert repr(batch) == "<Batcher 'affine_rows' open pending=0 in_flight=0 batches=8>"

    run(loop, body)


def test_a_lone_caller_is_dispatched_as_a_batch_of_one_after_the_delay(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=8, max_delay=0.001)
            with anyio.fail_after(10):
                (y,) = await batch(row(3))
            np.testing.assert_allclose(y, want(3))
            assert [n for n, _ in host.batches] == [1]
            stats = batch.statistics()
            assert (stats.batches, stats.items, stats.mean_fill) == (1, 1, 1 / 8)
            assert (stats.launched.deadline, stats.launched.idle) == (1, 0)
            assert stats.waiting.count == 1

    run(loop, body)


def test_a_full_batch_launches_without_waiting_for_the_delay(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=4, max_delay=HOUR)
            callers = Callers(batch)
            got, one = callers.got, callers.call

            with anyio.fail_after(10):  # an hour's delay: only the full batch can launch it
                async with anyio.create_task_group() as tg:
                    for i in range(4):
                        tg.start_soon(one, i)
            assert [n for n, _ in host.batches] == [4]
            for i in range(4):
                np.testing.assert_allclose(got[i], want(i))

    run(loop, body)


def test_buckets_pad_with_zero_rows_that_never_show(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=8, buckets=[8, 2, 4], graph="auto")
            got: dict[int, tuple[Array, ...]] = {}

            async def one(i: int) -> None:
                got[i] = await batch(row(i))

            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(one, i)
                await until(lambda: batch.statistics().pending == 3)
                await batch.aclose()  # flushes the batch of 3, padded to 4
            ((n, x),) = host.batches
            assert n == 4
            np.testing.assert_array_equal(x[3], np.zeros(F, np.float32))
            for i in range(3):
                (y,) = got[i]
                assert y.shape == (F,)
                np.testing.assert_allclose(y, want(i))
            stats = batch.statistics()
            assert (stats.batches, stats.items, stats.padded_rows) == (1, 3, 1)
            assert stats.mean_fill == 3 / 4
            assert stats.launched.flush == 1

    run(loop, body)


def test_an_invalid_item_is_refused_to_its_caller_alone(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=2)
            got: dict[int, Array] = {}
            errors: dict[int, BaseException] = {}

            async def one(i: int) -> None:
                (got[i],) = await batch(row(i))

            async def bad(k: int, item: tuple[object, ...]) -> None:
                try:
                    await batch(*item)
                except ag.DispatchError as exc:
                    errors[k] = exc

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 0)
                tg.start_soon(bad, 0, (row(1).astype(np.float64),))
                tg.start_soon(bad, 1, (np.zeros((2, F), np.float32),))
                tg.start_soon(bad, 2, (row(1), row(2)))
                tg.start_soon(bad, 3, ([1.0, 2.0, 3.0, 4.0],))
                tg.start_soon(one, 1)
            assert [n for n, _ in host.batches] == [2]
            np.testing.assert_allclose(got[0], want(0))
            np.testing.assert_allclose(got[1], want(1))
            assert [type(errors[k]) for k in range(4)] == [
                ag.ArgumentTypeError, ag.ShapeMismatchError, ag.DispatchError, ag.ArgumentTypeError
            ]  # fmt: skip
            assert str(errors[0]) == (
                "items[0] of batcher 'affine_rows' (const float* x) is a float64 array of shape "
                "(4,); the batcher takes float32 rows of shape (4,) — pass x.astype(np.float32)"
            )
            assert str(errors[1]) == (
                "items[0] of batcher 'affine_rows' (const float* x) has shape (2, 4); the "
                "batcher takes float32 rows of shape (4,), one row per call — call it once per "
                "row (rows of one call are not split)"
            )
            assert str(errors[2]) == (
                "batcher 'affine_rows' takes 1 arrays per item (float32[4]), got 2 — pass one "
                "row of each input per call"
            )
            assert batch.statistics().items == 2

    run(loop, body)


def test_rows_of_an_equal_dtype_object_or_strided_are_accepted(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=3)
            tagged = np.dtype(np.float32, metadata={"unit": "m"})  # == float32, not numpy's own
            assert tagged == np.float32
            assert tagged is not np.dtype(np.float32)
            strided = np.stack([row(2), row(3)], axis=1)[:, 0]  # a column: every other float
            assert not strided.flags.c_contiguous
            items = [row(0), row(1).astype(tagged), strided]
            got: dict[int, Array] = {}

            async def one(i: int) -> None:
                (got[i],) = await batch(items[i])

            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(one, i)
            for i in range(3):
                np.testing.assert_allclose(got[i], want(i))
            assert [n for n, _ in host.batches] == [3]

    run(loop, body)


def test_a_caller_cancelled_before_launch_leaves_its_batch(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=4)
            callers = Callers(batch)
            got, scopes, one = callers.got, callers.scopes, callers.call

            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(one, i)
                await until(lambda: batch.statistics().pending == 3)
                scopes[1].cancel()
                await until(lambda: batch.statistics().pending == 2)
                for i in (3, 4):  # fill the batch again: 0, 2, 3, 4
                    tg.start_soon(one, i)
            assert [n for n, _ in host.batches] == [4]
            x = host.batches[0][1]
            assert sorted(x[:, 0].tolist()) == [0, 2, 3, 4]  # trio starts tasks in any order
            assert sorted(got) == [0, 2, 3, 4]
            for i in got:
                np.testing.assert_allclose(got[i], want(i))
            stats = batch.statistics()
            assert (stats.cancelled_before_launch, stats.items, stats.waiting.count) == (1, 4, 4)

    run(loop, body)


def test_the_deadline_belongs_to_the_batch_not_to_its_first_caller(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=8, max_delay=0.05)
            callers = Callers(batch)
            got, scopes, one = callers.got, callers.scopes, callers.call

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for i in range(3):
                        tg.start_soon(one, i)
                    await until(lambda: batch.statistics().pending == 3)
                    scopes[0].cancel()  # the caller that armed the deadline
            assert sorted(got) == [1, 2]
            assert [n for n, _ in host.batches] == [2]
            assert batch.statistics().cancelled_before_launch == 1

    run(loop, body)


def test_a_caller_cancelled_after_launch_gets_nothing_and_the_batch_goes_on(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        host.release.clear()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=4)
            callers = Callers(batch)
            got, scopes, one = callers.got, callers.scopes, callers.call

            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(one, i)
                await until(host.started.is_set)  # launched and running
                scopes[2].cancel()
                await anyio.lowlevel.checkpoint()
                host.release.set()
            assert sorted(got) == [0, 1, 3]
            for i in got:
                np.testing.assert_allclose(got[i], want(i))
            stats = batch.statistics()
            assert (stats.cancelled_before_launch, stats.failed_batches) == (0, 0)
            assert (stats.batches, stats.in_flight) == (1, 0)

    run(loop, body)


def test_a_failing_batch_fails_each_of_its_callers_and_the_batcher_goes_on(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=3)
            errors: list[BaseException] = []
            got: dict[int, Array] = {}

            async def one(i: int, x: Array) -> None:
                try:
                    (got[i],) = await batch(x)
                except ValueError as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 0, row(0))
                tg.start_soon(one, 1, np.full(F, -1, np.float32))
                tg.start_soon(one, 2, row(2))
            assert len(errors) == 3
            assert {str(e) for e in errors} == {"poison row"}
            assert got == {}
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(one, i, row(i))
            for i in range(3):
                np.testing.assert_allclose(got[i], want(i))
            stats = batch.statistics()
            assert (stats.batches, stats.failed_batches, stats.in_flight) == (2, 1, 0)

    run(loop, body)


def test_staging_is_used_again_only_once_its_batch_is_done(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        host.release.clear()
        async with ag.open_backend("host") as backend:
            made: list[tuple[int, ...]] = []
            pinned_empty = backend.pinned_empty

            def counting(shape: Any, dtype: Any) -> Array:
                made.append(shape)
                return pinned_empty(shape, dtype)

            backend.pinned_empty = counting  # type: ignore[method-assign]  # counts the sets made
            sizes = iter([2, 2, 2, 0, 2, 2])  # the fourth batch's launch fails (grid 0)
            kernel = ag.Kernel(AFFINE_SRC, "affine_rows", host=host)
            batch = ag.batcher(
                backend, kernel,
                inputs=[ag.Row((F,), np.float32)], outputs=[ag.Row((F,), np.float32)],
                shared=(BIAS, A, np.int32(F)), launch=lambda n: (next(sizes), 256),
                max_size=2, max_delay=HOUR,
            )  # fmt: skip
            callers = Callers(batch)
            got, one = callers.got, callers.call

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 0)
                tg.start_soon(one, 1)
                await until(host.started.is_set)  # the first batch holds its staging...
                tg.start_soon(one, 2)
                tg.start_soon(one, 3)
                await until(lambda: batch.statistics().batches == 2)  # ...the second has its own
                host.release.set()
            assert made == [(2, F), (2, F)]
            for i in range(4):  # neither batch's rows were written over by the other's
                np.testing.assert_allclose(got[i], want(i))

            async with anyio.create_task_group() as tg:  # one set again: no new one
                tg.start_soon(one, 4)
                tg.start_soon(one, 5)
            assert len(made) == 2
            errors: list[ag.DispatchError] = []

            async def refused(i: int) -> None:
                try:
                    await batch(row(i))
                except ag.DispatchError as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:  # refused: its set is dropped
                tg.start_soon(refused, 6)
                tg.start_soon(refused, 7)
            assert len(errors) == 2
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 8)
                tg.start_soon(one, 9)
            assert len(made) == 2  # the other kept one
            for i in (4, 5, 8, 9):
                np.testing.assert_allclose(got[i], want(i))
            assert sorted(got) == [0, 1, 2, 3, 4, 5, 8, 9]
            assert batch.statistics().failed_batches == 1

    run(loop, body)


def test_closing_the_backend_flushes_pending_items(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        backend = ag.open_backend("host")
        batch = make(backend, host, max_size=8)
        callers = Callers(batch)
        got, one = callers.got, callers.call

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(one, i)
            await until(lambda: batch.statistics().pending == 3)
            await backend.aclose()
        assert [n for n, _ in host.batches] == [3]
        for i in range(3):
            np.testing.assert_allclose(got[i], want(i))
        assert batch.is_closed
        with pytest.raises(
            ag.BackendClosedError,
            match=r"^backend host of batcher 'affine_rows' is closed; open a new backend ",
        ):
            await batch(row(0))

    run(loop, body)


def test_a_closed_batcher_refuses_calls_and_closing_twice_is_harmless(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            async with make(backend, host) as batch:
                pass
            await batch.aclose()
            with pytest.raises(
                ag.BackendClosedError,
                match=r"^batcher 'affine_rows' is closed; make a new one with asyncgraph\.batcher",
            ):
                await batch(row(0))
            assert repr(batch).startswith("<Batcher 'affine_rows' closed pending=0")

    run(loop, body)


def plain(backend: ag.Backend, kernel: ag.Kernel, i: int) -> ag.PendingDispatch:
    """A dispatch of the batch kernel on one row, not through the batcher."""
    return backend.dispatch(
        kernel, row(i)[None], ag.Out((1, F), np.float32), BIAS, A, np.int32(F), np.int32(1),
        grid=1, block=256,
    )  # fmt: skip


def test_a_due_batch_waits_for_room_in_a_full_queue_and_collects_meanwhile(loop: Any) -> None:
    # dispatch() raises QueueFullError on a full queue; a batch waits, as submit() does.
    async def body() -> None:
        host = Affine()
        host.release.clear()
        async with ag.open_backend("host", max_in_flight=1, max_queued=1) as backend:
            batch = make(backend, host, max_size=4, max_delay=0)
            kernel = ag.Kernel(AFFINE_SRC, "affine_rows", host=host)
            running, queued = plain(backend, kernel, 10), plain(backend, kernel, 11)
            await until(host.started.is_set)
            callers = Callers(batch)
            got, one = callers.got, callers.call

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 0)
                await until(lambda: batch.statistics().waiting_for_room == 1)  # its deadline
                for i in range(1, 6):  # 1-3 fill the batch in line; 4, 5 start the next one
                    tg.start_soon(one, i)
                await until(lambda: batch.statistics().waiting_for_room == 2)
                stats = batch.statistics()
                assert (stats.pending, stats.batches, stats.in_flight) == (6, 0, 0)
                assert repr(batch) == (
                    "<Batcher 'affine_rows' open pending=6 in_flight=0 batches=0>"
                )
                host.release.set()
            assert [n for n, _ in host.batches] == [1, 1, 4, 2]  # in call order
            np.testing.assert_allclose((await running)[0][0], want(10))
            np.testing.assert_allclose((await queued)[0][0], want(11))
            for i in range(6):
                np.testing.assert_allclose(got[i], want(i))
            stats = batch.statistics()
            assert (stats.batches, stats.items, stats.failed_batches) == (2, 6, 0)
            assert (stats.pending, stats.waiting_for_room, stats.in_flight) == (0, 0, 0)

    run(loop, body)


def test_a_batch_whose_callers_all_left_gives_its_place_in_line_up(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        host.release.clear()
        async with ag.open_backend("host", max_in_flight=1, max_queued=1) as backend:
            batch = make(backend, host, max_size=4)
            kernel = ag.Kernel(AFFINE_SRC, "affine_rows", host=host)
            plain(backend, kernel, 10)
            plain(backend, kernel, 11)
            await until(host.started.is_set)
            submitted: list[ag.PendingDispatch] = []
            scopes: dict[int, anyio.CancelScope] = {}

            async def one(i: int) -> None:
                with anyio.CancelScope() as scopes[i]:
                    await batch(row(i))

            async def submit() -> None:
                pending = await backend.submit(
                    kernel, row(12)[None], ag.Out((1, F), np.float32), BIAS, A, np.int32(F),
                    np.int32(1), grid=1, block=256,
                )  # fmt: skip
                submitted.append(pending)

            async with anyio.create_task_group() as tg:
                for i in range(2):
                    tg.start_soon(one, i)
                await until(lambda: batch.statistics().pending == 2)
                batch.flush()  # due: in line for room
                assert batch.statistics().waiting_for_room == 1
                tg.start_soon(submit)  # in line behind the batch
                await anyio.lowlevel.checkpoint()
                for i in range(2):
                    scopes[i].cancel()
                await until(lambda: batch.statistics().pending == 0)
                stats = batch.statistics()
                assert (stats.waiting_for_room, stats.cancelled_before_launch) == (0, 2)
                host.release.set()
            np.testing.assert_allclose((await submitted[0])[0][0], want(12))
            assert [n for n, _ in host.batches] == [1, 1, 1]  # the batch never ran
            assert batch.statistics().batches == 0

    run(loop, body)


def test_closing_the_backend_fails_a_batch_waiting_for_room_as_it_fails_submit(
    loop: Any,
) -> None:
    async def body() -> None:
        host = Affine()
        host.release.clear()
        backend = ag.open_backend("host", max_in_flight=1, max_queued=1)
        batch = make(backend, host, max_size=2)
        kernel = ag.Kernel(AFFINE_SRC, "affine_rows", host=host)
        plain(backend, kernel, 10)
        plain(backend, kernel, 11)
        await until(host.started.is_set)
        errors: list[BaseException] = []

        async def one(i: int) -> None:
            try:
                await batch(row(i))
            except ag.BackendClosedError as exc:
                errors.append(exc)

        async def close() -> None:
            await backend.aclose()

        async with anyio.create_task_group() as tg:
            for i in range(2):
                tg.start_soon(one, i)
            await until(lambda: batch.statistics().waiting_for_room == 1)
            tg.start_soon(close)
            await until(lambda: len(errors) == 2)
            host.release.set()
        assert [str(e) for e in errors] == [
            "backend host was closed while a batch of 'affine_rows' waited for room in its "
            "queue (max_queued)"
        ] * 2
        # Failed, never launched: it was counted in batches, items and launched.deadline.
        stats = batch.statistics()
        assert (stats.batches, stats.items, stats.failed_batches) == (0, 0, 1)
        assert (stats.waiting_for_room, stats.pending, stats.in_flight) == (0, 0, 0)
        assert stats.launched == ag.BatchLaunches(full=0, idle=0, completion=0, deadline=0, flush=0)
        assert (stats.waiting.count, stats.mean_fill) == (0, 0.0)
        assert [n for n, _ in host.batches] == [1, 1]

    run(loop, body)


@pytest.mark.parametrize("events", [True, False], ids=["dispatch_events", "default"])
def test_one_debug_event_per_batch_where_the_backend_logs_its_dispatches(
    loop: Any, events: bool
) -> None:
    # Unconfigured, structlog prints debug events to stdout: a service whose stdout is a pipe
    # nobody reads stopped (its loop blocked in write()) once a few hundred batches had
    # filled the pipe. So batches log only where dispatches do.
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host", dispatch_events_enabled=events) as backend:
            batch = make(backend, host, max_size=2)
            with capture_logs() as logs:
                async with anyio.create_task_group() as tg:
                    for i in range(4):
                        tg.start_soon(batch, row(i))
            launched = [e for e in logs if e["event"] == "batch.launched"]
            assert [(e["items"], e["size"], e["kernel"]) for e in launched] == [
                (2, 2, "affine_rows"), (2, 2, "affine_rows")
            ] * events  # fmt: skip
            assert batch.statistics().batches == 2

    run(loop, body)


async def test_options_are_checked_when_the_batcher_is_made(host: ag.Backend) -> None:
    kernel = ag.Kernel(AFFINE_SRC, "affine_rows", host=Affine())
    ins, outs = [ag.Row((F,), np.float32)], [ag.Row((F,), np.float32)]
    shared = (BIAS, A, np.int32(F))

    def shape(n: int) -> tuple[int, int]:
        return (n, 32)

    with pytest.raises(ag.DispatchError, match=r"^batcher of 'affine_rows' would pass 5 "):
        ag.batcher(host, kernel, inputs=ins, outputs=outs, shared=(BIAS, A), launch=shape)
    with pytest.raises(
        ag.ArgumentTypeError, match=r"^parameter 0 of 'affine_rows' \(const float\* x\) takes "
    ):
        ag.batcher(
            host, kernel, inputs=[ag.Row(F, np.float64)], outputs=outs, shared=shared,
            launch=shape,
        )  # fmt: skip
    with pytest.raises(ag.DispatchError, match=r"^batcher\(buckets=\[2, 4\], max_size=8\); "):
        ag.batcher(
            host, kernel, inputs=ins, outputs=outs, shared=shared, launch=shape, max_size=8,
            buckets=[2, 4],
        )  # fmt: skip
    with pytest.raises(ag.DispatchError, match=r"^batcher\(max_delay=-1\); pass seconds"):
        ag.batcher(
            host, kernel, inputs=ins, outputs=outs, shared=shared, launch=shape, max_delay=-1
        )
    with pytest.raises(ag.ArgumentTypeError, match=r"^batcher\(launch=None\); pass a function"):
        ag.batcher(host, kernel, inputs=ins, outputs=outs, shared=shared, launch=None)  # type: ignore[arg-type]  # the point
    with pytest.raises(ag.ShapeMismatchError):
        ag.Row((0,), np.float32)
    assert ag.Row((), np.int32).shape == ()


@pytest.mark.parametrize("shared_mem", ["x", -1, None, 1.5, True, 10**9])
async def test_a_bad_shared_mem_is_refused_when_the_batcher_is_made(
    host: ag.Backend, shared_mem: object
) -> None:
    # It was accepted, and every call then failed with the dispatch's DispatchError.
    kernel = ag.Kernel(AFFINE_SRC, "affine_rows", host=Affine())
    ins, outs = [ag.Row((F,), np.float32)], [ag.Row((F,), np.float32)]
    bound = host.limits.max_shared_mem
    with pytest.raises(
        ag.DispatchError,
        match=rf"^batcher\(shared_mem={re.escape(repr(shared_mem))}\); pass the bytes of "
        rf"dynamic shared memory per block as an int between 0 and {bound} \(this backend's "
        r"bound\)$",
    ):
        ag.batcher(
            host, kernel, inputs=ins, outputs=outs, shared=(BIAS, A, np.int32(F)),
            launch=lambda n: (n, 32), shared_mem=shared_mem,  # type: ignore[arg-type]  # the point
        )  # fmt: skip


async def test_a_batcher_passes_its_shared_mem_to_each_dispatch(host: ag.Backend) -> None:
    kernel = ag.Kernel(AFFINE_SRC, "affine_rows", host=Affine())
    batch = ag.batcher(
        host, kernel, inputs=[ag.Row((F,), np.float32)], outputs=[ag.Row((F,), np.float32)],
        shared=(BIAS, A, np.int32(F)), launch=lambda n: (n, 32), shared_mem=1024,
    )  # fmt: skip
    (out,) = await batch(row(1))
    await batch.aclose()
    np.testing.assert_allclose(out, want(1))


async def test_a_max_size_that_could_never_be_allocated_is_refused_when_made(
    host: ag.Backend,
) -> None:
    kernel = ag.Kernel(AFFINE_SRC, "affine_rows", host=Affine())
    ins, outs = [ag.Row((F,), np.float32)], [ag.Row((F,), np.float32)]
    shared = (BIAS, A, np.int32(F))
    with pytest.raises(
        ag.DispatchError,
        match=r"^batcher\(max_size=1000000000000\); the kernel gets the batch size as int n "
        r"\(np\.int32\), which holds at most 2147483647 — pass max_size up to that$",
    ):
        ag.batcher(
            host, kernel, inputs=ins, outputs=outs, shared=shared,
            launch=lambda n: (n, 32), max_size=10**12,
        )  # fmt: skip
    with pytest.raises(
        ag.DispatchError,
        match=r"^batcher\(buckets=\[8, 4294967296\]\); the kernel gets the batch size as int n "
        r"\(np\.int32\), which holds at most 2147483647 — pass the largest bucket up to that$",
    ):
        ag.batcher(
            host, kernel, inputs=ins, outputs=outs, shared=shared,
            launch=lambda n: (n, 32), max_size=8, buckets=[8, 2**32],
        )  # fmt: skip
    wide = [ag.Row((F, 256), np.float32)]  # 4 KiB a row, in and out: 8 TiB a full batch
    with pytest.raises(
        ag.DispatchError,
        match=r"^batcher\(max_size=1073741824\); a full batch allocates 8,796,093,022,208 bytes "
        r"\(8,192 per item: its input and output rows\), more than the [\d,]+ bytes of memory "
        r"this machine has — pass max_size of at most [\d,]+$",
    ):
        ag.batcher(
            host, ag.Kernel(AFFINE_SRC, "affine_rows", host=Affine()), inputs=wide,
            outputs=wide, shared=shared, launch=lambda n: (n, 32), max_size=2**30,
        )  # fmt: skip


@pytest.mark.parametrize("shape", [256, (1, 256, 0), None, "ab"])
def test_a_launch_that_returns_no_grid_and_block_fails_its_batch_saying_so(
    loop: Any, shape: Any
) -> None:
    async def body() -> None:
        async with ag.open_backend("host") as backend:
            batch = ag.batcher(
                backend, ag.Kernel(AFFINE_SRC, "affine_rows", host=Affine()),
                inputs=[ag.Row((F,), np.float32)], outputs=[ag.Row((F,), np.float32)],
                shared=(BIAS, A, np.int32(F)), launch=lambda n: shape, max_size=1,
            )  # fmt: skip
            with pytest.raises(
                ag.ArgumentTypeError,
                match=r"^batcher 'affine_rows': launch\(1\) returned .+; it must return a "
                r"tuple \(grid, block\), e\.g\. lambda n: \(\(n \+ 255\) // 256, 256\)$",
            ):
                await batch(row(0))
            assert batch.statistics().failed_batches == 1

    run(loop, body)


async def test_on_close_hooks_run_once_while_the_backend_still_takes_work() -> None:
    backend = ag.open_backend("host")
    seen: list[bool] = []
    backend.on_close(lambda: seen.append(backend.is_closed))
    gone = backend.on_close(lambda: seen.append(True))
    gone()
    await backend.aclose()
    await backend.aclose()
    assert seen == [False]


@pytest.mark.parametrize("hook", [None, 42, "flush"])
async def test_on_close_refuses_what_it_cannot_call_at_the_call(hook: object) -> None:
    # It was accepted, and failed only as the close ran it (a logged backend.on_close_failed).
    async with ag.open_backend("host") as backend:
        with pytest.raises(
            ag.ArgumentTypeError,
            match=rf"^on_close\({re.escape(repr(hook))}\): pass a function of no arguments, "
            r"called as the backend's first aclose\(\) begins$",
        ):
            backend.on_close(hook)  # type: ignore[arg-type]  # the point
        with capture_logs() as logs:
            await backend.aclose()
    assert [e for e in logs if e["event"] == "backend.on_close_failed"] == []


def test_rows_of_one_value_and_of_two_dimensions(loop: Any) -> None:
    # A value per item (a numpy scalar or a 0-d array) comes back as a 0-d view; a row of two
    # dimensions, contiguous or not, is stacked in order and comes back as its own view.
    async def body() -> None:
        async with ag.open_backend("host") as backend:
            batch = make_two(backend, max_delay=HOUR)
            values: list[Any] = [
                np.float32(1),
                np.array(2, np.float32),
                np.float32(3),
                np.float32(4),
            ]
            blocks = [np.arange(6, dtype=np.float32).reshape(3, 2).T + 10 * i for i in range(4)]
            got: dict[int, tuple[Array, ...]] = {}

            async def one(i: int) -> None:
                got[i] = await batch(values[i], blocks[i])

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for i in range(4):
                        tg.start_soon(one, i)
            for i in range(4):
                c, d = got[i]
                assert (type(c), c.shape, type(d), d.shape) == (np.ndarray, (), np.ndarray, (2, 3))
                assert float(c) == 2 * float(values[i])
                np.testing.assert_array_equal(d, blocks[i] + values[i])

    run(loop, body)
