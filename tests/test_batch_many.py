"""``Batcher.many``: several items of one caller added at once, on asyncio, uvloop and trio.

The host backend runs the batches; tests wait on counts, never on a duration.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

import asyncgraph as ag

from .batching import HOUR, Affine, F, make, make_two, row, until, want
from .loops import LOOPS, run


@pytest.fixture(params=LOOPS)
def loop(request: pytest.FixtureRequest) -> Any:
    """The loop to run a test's body on: a name, or a name and anyio's backend options."""
    return request.param


def rows(*indexes: int) -> np.ndarray[Any, Any]:
    return np.stack([row(i) for i in indexes])


def wants(*indexes: int) -> np.ndarray[Any, Any]:
    return np.stack([want(i) for i in indexes])


def test_a_callers_items_go_in_one_batch_even_after_a_batch_of_one(loop: Any) -> None:
    # Under the adaptive policy a caller that finds the batcher idle after a batch of one
    # dispatches its row alone; rows of one request sent as separate calls then split into a
    # batch of one and a batch of the rest. many() adds them together: one batch each time.
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=8, max_delay=0.0005, policy="adaptive")
            with anyio.fail_after(10):
                (y,) = await batch(row(0))
                np.testing.assert_allclose(y, want(0))
                (ys,) = await batch.many(rows(1, 2, 3))
                assert (type(ys), ys.shape, ys.dtype) == (np.ndarray, (3, F), np.float32)
                np.testing.assert_allclose(ys, wants(1, 2, 3))
                (ys,) = await batch.many(rows(4))
                np.testing.assert_allclose(ys, wants(4))
            assert [n for n, _ in host.batches] == [1, 3, 1]
            np.testing.assert_array_equal(host.batches[1][1], rows(1, 2, 3))
            stats = batch.statistics()
            assert (stats.batches, stats.items, stats.waiting.count) == (3, 5, 5)
            assert stats.launched == ag.BatchLaunches(
                full=0, idle=3, completion=0, deadline=0, flush=0
            )

    run(loop, body)


def test_items_beyond_max_size_fill_the_next_batch(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=4)  # full batches only (or flushed)
            got: list[Any] = []

            async def six() -> None:
                got.extend(await batch.many(rows(*range(6))))

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(six)
                    await until(lambda: batch.statistics().pending == 2)
                    batch.flush()
            assert [n for n, _ in host.batches] == [4, 2]
            np.testing.assert_allclose(got[0], wants(*range(6)))
            assert batch.statistics().launched.full == 1

    run(loop, body)


def test_items_of_several_inputs_and_outputs_come_back_stacked(loop: Any) -> None:
    async def body() -> None:
        async with ag.open_backend("host") as backend:
            batch = make_two(backend, max_delay=0.0005)
            values = np.random.default_rng(1).standard_normal(3).astype(np.float32)
            blocks = np.random.default_rng(2).standard_normal((3, 2, 3)).astype(np.float32)
            with anyio.fail_after(10):
                c, d = await batch.many(values, blocks)
            assert (c.shape, d.shape) == ((3,), (3, 2, 3))
            np.testing.assert_array_equal(c, 2 * values)
            np.testing.assert_array_equal(d, blocks + values[:, None, None])
            assert batch.statistics().batches == 1

    run(loop, body)


@pytest.mark.parametrize(
    ("inputs", "error", "message"),
    [
        ((), ag.DispatchError, r"many\(\) takes 1 arrays \(float32\[4\] rows, stacked\), got 0"),
        (([[0.0] * F],), ag.ArgumentTypeError, r"many\(\) takes float32 rows .* one numpy"),
        ((np.zeros((2, F), np.float64),), ag.ArgumentTypeError, r"x\.astype\(np\.float32\)"),
        ((np.zeros((2, F + 1), np.float32),), ag.ShapeMismatchError, r"shape \(k, 4\)"),
        ((np.zeros((0, F), np.float32),), ag.ShapeMismatchError, r"k >= 1 items"),
        ((np.zeros(F, np.float32),), ag.ShapeMismatchError, r"has shape \(4,\)"),
    ],
    ids=["no array", "a list", "float64", "wide rows", "no item", "one row unstacked"],
)
def test_wrong_arrays_are_refused_to_their_caller_with_nothing_added(
    loop: Any, inputs: tuple[object, ...], error: type[Exception], message: str
) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=2, max_delay=0.0005, policy="adaptive")
            with pytest.raises(error, match=message):
                await batch.many(*inputs)
            stats = batch.statistics()
            assert (stats.batches, stats.items, stats.pending) == (0, 0, 0)
            with anyio.fail_after(10):
                (ys,) = await batch.many(rows(5, 6))
            np.testing.assert_allclose(ys, wants(5, 6))

    run(loop, body)


def test_differing_item_counts_are_refused(loop: Any) -> None:
    async def body() -> None:
        async with ag.open_backend("host") as backend:
            batch = make_two(backend, max_delay=HOUR)
            with pytest.raises(ag.ShapeMismatchError, match=r"holds 2 items and .* 3; pass as"):
                await batch.many(np.zeros(3, np.float32), np.zeros((2, 2, 3), np.float32))
            assert batch.statistics().pending == 0

    run(loop, body)


def test_a_caller_cancelled_before_launch_takes_its_items_out(loop: Any) -> None:
    async def body() -> None:
        host = Affine()
        async with ag.open_backend("host") as backend:
            batch = make(backend, host, max_size=8)  # full batches only (or flushed)
            got: dict[int, Any] = {}
            scopes: dict[str, anyio.CancelScope] = {}

            async def one(i: int) -> None:
                (got[i],) = await batch(row(i))

            async def three() -> None:
                with anyio.CancelScope() as scopes["many"]:
                    got[1] = await batch.many(rows(1, 2, 3))

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(one, 0)
                    await until(lambda: batch.statistics().pending == 1)
                    tg.start_soon(three)
                    await until(lambda: batch.statistics().pending == 4)
                    scopes["many"].cancel()
                    await until(lambda: batch.statistics().pending == 1)
                    tg.start_soon(one, 7)
                    await until(lambda: batch.statistics().pending == 2)
                    batch.flush()
            stats = batch.statistics()
            assert (stats.cancelled_before_launch, stats.items) == (3, 2)
            assert [n for n, _ in host.batches] == [2]
            assert sorted(got) == [0, 7]
            np.testing.assert_allclose(got[0], want(0))
            np.testing.assert_allclose(got[7], want(7))

    run(loop, body)


def test_a_closed_batcher_refuses_many(loop: Any) -> None:
    async def body() -> None:
        async with ag.open_backend("host") as backend:
            async with make(backend, Affine()) as batch:
                pass
            with pytest.raises(ag.BackendClosedError, match=r"^batcher 'affine_rows' is closed"):
                await batch.many(rows(0, 1))

    run(loop, body)
