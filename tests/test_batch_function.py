"""Batching any async function (``ag.batch``) under asyncio, uvloop and trio.

The function here records each batch it gets and may hold it (an event of the test), so each
test waits on counts and events, never on a duration.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import asyncgraph as ag

from .batching import HOUR, until
from .loops import LOOPS, run

Array = np.ndarray[Any, Any]


@pytest.fixture(params=LOOPS)
def loop(request: pytest.FixtureRequest) -> Any:
    """The loop to run a test's body on: a name, or a name and anyio's backend options."""
    return request.param


class Model:
    """An async function of a batch: ``2 * x + 1`` for each input, each batch recorded; it
    waits for ``release`` (set from the start), fails on a poison input (-1)."""

    def __init__(self) -> None:
        self.batches: list[Any] = []
        self.release = anyio.Event()
        self.release.set()
        self.started = 0

    async def __call__(self, xs: Sequence[float]) -> list[float]:
        self.batches.append(list(xs))
        self.started += 1
        await self.release.wait()
        if -1 in xs:
            raise ValueError("poison input")
        return [2 * x + 1 for x in xs]


def test_concurrent_callers_get_their_own_outputs(loop: Any) -> None:
    async def body() -> None:
        model = Model()
        batched = ag.batch(model, max_size=8)
        got: dict[int, float] = {}

        async def one(i: int) -> None:
            got[i] = await batched(float(i))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(one, i)
        assert got == {i: 2.0 * i + 1 for i in range(20)}
        assert sorted(x for b in model.batches for x in b) == [float(i) for i in range(20)]
        assert [len(b) for b in model.batches] == [8, 8, 4]
        stats = batched.statistics()
        assert (stats.batches, stats.items, stats.failed_batches) == (3, 20, 0)
        assert stats.launched.full == 2
        assert (stats.pending, stats.in_flight, stats.padded_rows) == (0, 0, 0)
        assert repr(batched).endswith("open pending=0 in_flight=0 batches=3>")
        await batched.aclose()

    run(loop, body)


def test_a_lone_caller_is_not_kept_waiting_for_max_delay(loop: Any) -> None:
    async def body() -> None:
        model = Model()
        batched = ag.batch(model, max_delay=HOUR)
        with anyio.fail_after(10):
            assert await batched(3.0) == 7.0
            assert await batched(4.0) == 9.0
        assert model.batches == [[3.0], [4.0]]
        assert batched.statistics().launched.idle == 2

    run(loop, body)


def test_callers_during_a_batch_running_launch_when_it_ends(loop: Any) -> None:
    async def body() -> None:
        model = Model()
        model.release = anyio.Event()
        batched = ag.batch(model, max_delay=HOUR)
        got: dict[int, float] = {}

        async def one(i: int) -> None:
            got[i] = await batched(float(i))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 0)
                await until(lambda: model.started == 1)
                for i in (1, 2, 3):
                    tg.start_soon(one, i)
                await until(lambda: batched.statistics().pending == 3)
                assert batched.statistics().in_flight == 1
                model.release.set()
        assert [sorted(b) for b in model.batches] == [[0.0], [1.0, 2.0, 3.0]]
        assert got == {i: 2.0 * i + 1 for i in range(4)}
        launched = batched.statistics().launched
        assert (launched.idle, launched.completion) == (1, 1)

    run(loop, body)


def test_it_decorates_with_and_without_options(loop: Any) -> None:
    @ag.batch
    async def double(xs: list[int]) -> list[int]:
        return [2 * x for x in xs]

    @ag.batch(max_size=2, policy="fixed_delay", max_delay=HOUR)
    async def square(xs: list[int]) -> list[int]:
        return [x * x for x in xs]

    async def body() -> None:
        got: dict[int, int] = {}

        async def one(i: int) -> None:
            got[i] = await square(i) + await double(i)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(one, i)
        assert got == {i: i * i + 2 * i for i in range(4)}
        assert square.statistics().launched.full == 2

    run(loop, body)


def test_rows_are_stacked_and_a_bad_row_is_refused_to_its_caller_alone(loop: Any) -> None:
    seen: list[Array] = []

    async def affine(x: Array) -> Array:
        seen.append(x)
        return 2 * x + 1

    async def body() -> None:
        batched = ag.batch(affine, row=ag.Row((2, 3), np.float32))
        rows = [np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * i for i in range(3)]
        rows[1] = rows[1].T.copy().T  # equal values, another memory layout
        got: dict[int, Array] = {}
        errors: list[BaseException] = []

        async def one(i: int) -> None:
            got[i] = await batched(rows[i])

        async def bad(item: Any) -> None:
            try:
                await batched(item)
            except ag.DispatchError as exc:
                errors.append(exc)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 0)
                tg.start_soon(bad, np.zeros((3, 2), np.float32))
                tg.start_soon(bad, [[1.0, 2.0, 3.0]] * 2)
                tg.start_soon(one, 1)
                tg.start_soon(one, 2)
        assert [x.shape for x in seen] == [(3, 2, 3)]
        for i in range(3):
            assert got[i].shape == (2, 3)
            np.testing.assert_array_equal(got[i], 2 * rows[i] + 1)
        kinds = sorted(type(e).__name__ for e in errors)
        assert kinds == ["ArgumentTypeError", "ShapeMismatchError"]
        shape_error = next(e for e in errors if isinstance(e, ag.ShapeMismatchError))
        assert str(shape_error) == (
            "the item of batched function "
            "'test_rows_are_stacked_and_a_bad_row_is_refused_to_its_caller_alone.<locals>.affine' "
            "has shape (3, 2); the batcher takes float32 rows of shape (2, 3), one row per call — "
            "call it once per row (rows of one call are not split)"
        )

    run(loop, body)


def test_a_function_breaking_its_contract_fails_that_batch_and_the_next_goes_on(
    loop: Any,
) -> None:
    answers: list[Any] = [[1], 5, None]

    async def broken(xs: list[int]) -> Any:
        answer = answers.pop(0)
        return [x + 1 for x in xs] if answer is None else answer

    def not_async(xs: list[int]) -> list[int]:
        return xs

    async def body() -> None:
        batched = ag.batch(broken, max_size=2)
        bare: Any = ag.batch(not_async)  # type: ignore[arg-type]  # the point
        errors: list[BaseException] = []

        async def one(fn: Any, i: int) -> None:
            try:
                await fn(i)
            except ag.BatchFunctionError as exc:
                errors.append(exc)

        name = "test_a_function_breaking_its_contract_fails_that_batch_and_the_next_goes_on"
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:  # one batch of two: one output
                tg.start_soon(one, batched, 0)
                tg.start_soon(one, batched, 1)
            assert [str(e) for e in errors] == [
                f"batched function '{name}.<locals>.broken' returned 1 outputs for a batch of "
                "2 inputs; return one output per input, in order"
            ] * 2
            errors.clear()
            await one(batched, 0)
            assert [str(e) for e in errors] == [
                f"batched function '{name}.<locals>.broken' returned a builtins.int, which has "
                "no len(); return a list (or an array) of one output per input, in order"
            ]
            assert await batched(1) == 2
            errors.clear()
            await one(bare, 0)
            assert [str(e) for e in errors] == [
                f"batched function '{name}.<locals>.not_async' returned a builtins.list, not "
                "an awaitable; batch an async def function (or one that returns an "
                "awaitable)"
            ]
        assert batched.statistics().failed_batches == 2

    run(loop, body)


def test_an_error_of_the_function_reaches_every_caller_of_its_batch(loop: Any) -> None:
    async def body() -> None:
        model = Model()
        batched = ag.batch(model, max_size=3)
        errors: list[BaseException] = []

        async def one(x: float) -> None:
            try:
                await batched(x)
            except ValueError as exc:
                errors.append(exc)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for x in (1.0, -1.0, 2.0):
                    tg.start_soon(one, x)
            assert [str(e) for e in errors] == ["poison input"] * 3
            assert await batched(5.0) == 11.0
        assert batched.statistics().failed_batches == 1

    run(loop, body)


def test_cancelled_callers_leave_before_the_launch_and_are_dropped_after(loop: Any) -> None:
    async def body() -> None:
        model = Model()
        model.release = anyio.Event()
        batched = ag.batch(model, max_size=4, max_delay=HOUR, policy="fixed_delay")
        got: dict[int, float] = {}
        scopes: dict[int, anyio.CancelScope] = {}

        async def one(i: int) -> None:
            with anyio.CancelScope() as scopes[i]:
                got[i] = await batched(float(i))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(one, i)
                await until(lambda: batched.statistics().pending == 3)
                scopes[1].cancel()  # before the launch: it leaves the batch
                await until(lambda: batched.statistics().pending == 2)
                for i in (3, 4):
                    tg.start_soon(one, i)  # the batch fills: 0, 2, 3, 4
                await until(lambda: model.started == 1)
                scopes[3].cancel()  # after the launch: the batch runs unchanged
                await anyio.lowlevel.checkpoint()
                model.release.set()
        assert [sorted(b) for b in model.batches] == [[0.0, 2.0, 3.0, 4.0]]
        assert got == {0: 1.0, 2: 5.0, 4: 9.0}
        assert batched.statistics().cancelled_before_launch == 1

    run(loop, body)


def test_as_a_method_each_instance_batches_its_own_calls(loop: Any) -> None:
    class Scaler:
        def __init__(self, factor: int) -> None:
            self.factor = factor
            self.sizes: list[int] = []

        @ag.batch(max_size=8)
        async def scale(self, xs: list[int]) -> list[int]:
            self.sizes.append(len(xs))
            return [self.factor * x for x in xs]

    async def body() -> None:
        two, three = Scaler(2), Scaler(3)
        got: dict[tuple[int, int], int] = {}

        async def one(scaler: Scaler, i: int) -> None:
            got[scaler.factor, i] = await scaler.scale(i)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(one, two, i)
                    tg.start_soon(one, three, i)
        assert got == {(f, i): f * i for f in (2, 3) for i in range(3)}
        assert (two.sizes, three.sizes) == ([3], [3])
        assert two.scale is two.scale
        assert two.scale is not three.scale
        assert isinstance(Scaler.scale, ag.BatchedFunction)

    run(loop, body)


def test_closing_flushes_waits_and_refuses_new_calls(loop: Any) -> None:
    async def body() -> None:
        model = Model()
        batched = ag.batch(model, max_delay=HOUR, policy="fixed_delay")
        got: list[float] = []

        async def one(x: float) -> None:
            got.append(await batched(x))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 1.0)
                await until(lambda: batched.statistics().pending == 1)
                async with batched:
                    pass
                assert batched.is_closed
        assert got == [3.0]
        assert batched.statistics().launched.flush == 1
        await batched.aclose()
        with pytest.raises(
            ag.BackendClosedError,
            match=r"^batched function '.*Model object at 0x[0-9a-f]+>' is closed; make a new "
            r"one with asyncgraph\.batch\(\)$",
        ):
            await batched(2.0)

    run(loop, body)


def test_options_are_checked_when_it_is_made() -> None:
    async def fn(xs: list[int]) -> list[int]:
        return xs

    with pytest.raises(ag.DispatchError, match=r"^batch\(max_size=0\); pass an int >= 1$"):
        ag.batch(fn, max_size=0)
    with pytest.raises(ag.DispatchError, match=r"^batch\(max_delay=-1\); pass seconds"):
        ag.batch(fn, max_delay=-1)
    with pytest.raises(ag.DispatchError, match=r"^batch\(policy='later'\); pass 'adaptive' "):
        ag.batch(fn, policy="later")
    with pytest.raises(ag.ArgumentTypeError, match=r"^batch\(row=\(4,\)\); pass ag\.Row"):
        ag.batch(fn, row=(4,))  # type: ignore[call-overload]  # the point
    with pytest.raises(
        ag.ArgumentTypeError,
        match=r"^batch\(\) takes an async function of a list of inputs, got a builtins\.int$",
    ):
        ag.batch(3)  # type: ignore[call-overload]  # the point
