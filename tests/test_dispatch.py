"""The dispatch contract on the host backend: argument kinds, PendingDispatch, concurrency."""

from __future__ import annotations

import asyncio
import threading
import traceback
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._demo._demo import (
    BLOCK,
    BLOCK_SUM,
    LAPLACE2D,
    SAXPY,
    block_sum_reference,
    laplace2d_reference,
    saxpy_reference,
)

from .kernels import INC, SCALE, Recorder, probe_kernel
from .polling import until

Array = np.ndarray[Any, Any]


async def test_demo_kernels_match_numpy(host: ag.Backend, rng: np.random.Generator) -> None:
    n = 1000
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    (out,) = await host.dispatch(
        SAXPY, x, y, ag.Out(n, np.float32), np.float32(1.5), np.int32(n), grid=4, block=256
    )
    np.testing.assert_allclose(out, saxpy_reference(x, y, 1.5), rtol=1e-6, atol=1e-6)

    blocks = (n + BLOCK - 1) // BLOCK
    (sums,) = await host.dispatch(
        BLOCK_SUM, x, ag.Out(blocks, np.float32), np.int32(n), grid=blocks, block=BLOCK
    )
    np.testing.assert_allclose(sums, block_sum_reference(x, blocks), rtol=1e-5, atol=1e-4)

    u = rng.standard_normal((37, 53), dtype=np.float32)
    (lap,) = await host.dispatch(
        LAPLACE2D,
        u,
        ag.Out(u.shape, np.float32),
        np.int32(37),
        np.int32(53),
        grid=(4, 3),
        block=(16, 16),
    )
    np.testing.assert_allclose(lap, laplace2d_reference(u), rtol=1e-5, atol=1e-5)


async def test_outputs_are_zero_filled_before_the_host_function_runs(host: ag.Backend) -> None:
    x = np.ones(8, np.float32)
    # n=3: the function writes 3 elements; the rest must be zeros, not garbage.
    (out,) = await host.dispatch(
        SCALE, x, ag.Out(8, np.float32), np.float32(5), np.int32(3), grid=1, block=8
    )
    np.testing.assert_array_equal(out, [5, 5, 5, 0, 0, 0, 0, 0])


async def test_inputs_reach_the_host_function_read_only(host: ag.Backend) -> None:
    def writes_input(x: Array, out: Array, n: np.int32) -> None:
        x[0] = 1.0

    k = ag.Kernel(
        'extern "C" __global__ void w(const float* x, float* out, int n) {}', "w", host=writes_input
    )
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="read-only"):
        await host.dispatch(k, x, ag.Out(4, np.float32), np.int32(4), grid=1, block=4)
    assert x[0] == 0.0
    assert host.telemetry.snapshot().dispatches_failed == 1


async def test_inout_returns_a_new_array_and_leaves_the_caller_alone(host: ag.Backend) -> None:
    buf = np.arange(6, dtype=np.float32)
    before = buf.copy()
    (res,) = await host.dispatch(INC, ag.InOut(buf), np.float32(10), np.int32(6), grid=1, block=6)
    np.testing.assert_array_equal(res, before + 10)
    np.testing.assert_array_equal(buf, before)
    assert res is not buf


async def test_results_come_in_argument_order(host: ag.Backend) -> None:
    def two(a: Array, b: Array, c: Array) -> None:
        a[:] = 1
        b[:] += 2
        c[:] = 3

    k = ag.Kernel('extern "C" __global__ void two(int* a, int* b, int* c) {}', "two", host=two)
    r = await host.dispatch(
        k,
        ag.Out(2, np.int32),
        ag.InOut(np.zeros(3, np.int32)),
        ag.Out(4, np.int32),
        grid=1,
        block=1,
    )
    assert [a.tolist() for a in r] == [[1, 1], [2, 2, 2], [3, 3, 3, 3]]


async def test_host_code_never_runs_on_the_loop_thread(host: ag.Backend) -> None:
    rec = Recorder()
    k = probe_kernel(rec)
    x = np.ones(4, np.float32)
    await asyncio.gather(
        *(
            host.dispatch(k, x, ag.Out(4, np.float32), np.int32(4), grid=1, block=4)
            for _ in range(20)
        )
    )
    assert rec.threads
    assert threading.get_ident() not in rec.threads


async def test_max_in_flight_bounds_concurrency_and_queues_in_order() -> None:
    rec = Recorder()
    rec.release.clear()
    k = probe_kernel(rec)
    async with ag.open_backend("host", host_workers=8, max_in_flight=3) as backend:
        x = np.ones(4, np.float32)
        pending = [
            backend.dispatch(k, x * i, ag.Out(4, np.float32), np.int32(4), grid=1, block=4)
            for i in range(10)
        ]
        await until(lambda: rec.running == 3, "three host functions to run")
        snap = backend.telemetry.snapshot()
        assert (snap.in_flight, snap.queued) == (3, 7)
        assert "in_flight=3 queued=7" in repr(backend)
        rec.release.set()
        results = [await p for p in pending]
    assert rec.peak == 3
    for i, (out,) in enumerate(results):
        np.testing.assert_array_equal(out, np.full(4, 2.0 * i))


async def test_200_concurrent_tasks(host: ag.Backend, rng: np.random.Generator) -> None:
    async def one(i: int) -> float:
        n = int(rng.integers(1, 5000))
        x = rng.standard_normal(n, dtype=np.float32)
        a = np.float32(i)
        (out,) = await host.dispatch(
            SCALE, x, ag.Out(n, np.float32), a, np.int32(n), grid=(n + 255) // 256, block=256
        )
        return float(np.abs(out - a * x).max())

    errors = await asyncio.gather(*(one(i) for i in range(200)))
    assert max(errors) == 0.0
    snap = host.telemetry.snapshot()
    assert snap.dispatches == snap.dispatches_completed == 200


async def test_result_blocks_another_thread_until_done(host: ag.Backend) -> None:
    rec = Recorder()
    rec.release.clear()
    x = np.arange(4, dtype=np.float32)
    pending = host.dispatch(
        probe_kernel(rec), x, ag.Out(4, np.float32), np.int32(4), grid=1, block=4
    )
    with pytest.raises(TimeoutError, match=r"^dispatch #1 of 'probe' did not complete within "):
        await asyncio.to_thread(pending.result, 0.01)
    with pytest.raises(
        ag.UnsupportedError,
        match=r"^dispatch #1 of 'probe' has not completed and result\(\) would block the event "
        r"loop that completes it; use 'await pending' on the loop's thread$",
    ):
        pending.result()
    waiter = asyncio.create_task(asyncio.to_thread(pending.result, 5))
    await asyncio.sleep(0.01)
    rec.release.set()
    (out,) = await waiter
    np.testing.assert_array_equal(out, x * 2)
    assert pending.done()
    assert pending.exception() is None
    assert pending.result()[0] is out


async def test_exception_and_done_callbacks(host: ag.Backend) -> None:
    def boom(x: Array, out: Array, n: np.int32) -> None:
        raise ZeroDivisionError("host kernel failed")

    k = ag.Kernel(
        'extern "C" __global__ void boom(const float* x, float* out, int n) {}', "boom", host=boom
    )
    pending = host.dispatch(
        k, np.ones(2, np.float32), ag.Out(2, np.float32), np.int32(2), grid=1, block=2
    )
    seen: list[ag.PendingDispatch] = []
    pending.add_done_callback(seen.append)
    with pytest.raises(ZeroDivisionError, match=r"^host kernel failed$"):
        await pending
    await asyncio.sleep(0)
    assert seen == [pending]
    exc = await asyncio.to_thread(pending.exception)
    assert isinstance(exc, ZeroDivisionError)
    late: list[ag.PendingDispatch] = []
    pending.add_done_callback(late.append)
    assert late == []  # scheduled, never called inline
    await asyncio.sleep(0)
    assert late == [pending]
    assert repr(pending) == "<PendingDispatch #1 boom failed>"


async def test_timing_fills_device_time(host: ag.Backend) -> None:
    x = np.ones(4, np.float32)
    timed = host.dispatch(
        SCALE, x, ag.Out(4, np.float32), np.float32(1), np.int32(4), grid=1, block=4, timing=True
    )
    untimed = host.dispatch(
        SCALE, x, ag.Out(4, np.float32), np.float32(1), np.int32(4), grid=1, block=4
    )
    assert not timed.done()
    await timed
    await untimed
    assert timed.device_time is not None
    assert timed.device_time > 0
    assert untimed.device_time is None
    assert host.telemetry.snapshot().device_time.count == 1


async def test_many_tasks_may_await_one_dispatch(host: ag.Backend) -> None:
    x = np.ones(4, np.float32)
    pending = host.dispatch(
        SCALE, x, ag.Out(4, np.float32), np.float32(3), np.int32(4), grid=1, block=4
    )

    async def wait() -> tuple[Any, ...]:
        return await pending

    results = await asyncio.gather(*(wait() for _ in range(5)))
    assert all(r[0] is results[0][0] for r in results)


async def test_pinned_empty_on_the_host_backend_is_an_ordinary_array(host: ag.Backend) -> None:
    x = host.pinned_empty((3, 4), np.float32)
    assert x.shape == (3, 4)
    assert x.dtype == np.float32
    assert x.flags.writeable
    with pytest.raises(ag.ShapeMismatchError, match=r"^pinned_empty\(\)"):
        host.pinned_empty((3, 0), np.float32)
    with pytest.raises(ag.ArgumentTypeError, match=r"^pinned_empty\(\)"):
        host.pinned_empty(4, object)


def _frames(exc: BaseException) -> int:
    return len(traceback.extract_tb(exc.__traceback__))


async def test_every_awaiter_of_a_failed_dispatch_sees_the_same_traceback(
    host: ag.Backend,
) -> None:
    def boom(x: Array, out: Array, n: np.int32) -> None:
        raise ZeroDivisionError("host kernel failed")

    k = ag.Kernel(
        'extern "C" __global__ void boom(const float* x, float* out, int n) {}', "boom", host=boom
    )
    pending = host.dispatch(
        k, np.ones(2, np.float32), ag.Out(2, np.float32), np.int32(2), grid=1, block=2
    )
    awaited: list[int] = []
    for _ in range(200):
        with pytest.raises(ZeroDivisionError, match=r"^host kernel failed$") as info:
            await pending
        awaited.append(_frames(info.value))
    assert len(set(awaited)) == 1, (awaited[0], awaited[-1])
    # The frames where the host function raised are still there, under the awaiter's own.
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "boom"
    read: list[int] = []
    for _ in range(50):
        with pytest.raises(ZeroDivisionError, match=r"^host kernel failed$") as info:
            pending.result()
        read.append(_frames(info.value))
    assert len(set(read)) == 1, (read[0], read[-1])


def test_awaiting_a_dispatch_on_another_loop_says_which_loop() -> None:
    rec = Recorder()
    rec.release.clear()

    async def start() -> tuple[ag.Backend, ag.PendingDispatch]:
        backend = ag.open_backend("host")
        pending = backend.dispatch(
            probe_kernel(rec), np.ones(2, np.float32), ag.Out(2, np.float32), np.int32(2),
            grid=1, block=2,
        )  # fmt: skip
        return backend, pending

    async def await_it(pending: ag.PendingDispatch) -> tuple[Any, ...]:
        return await pending

    loop = asyncio.new_event_loop()
    try:
        backend, pending = loop.run_until_complete(start())
        with pytest.raises(
            ag.UnsupportedError,
            match=r"^dispatch #1 of 'probe' belongs to another event loop; await it on its "
            r"backend's loop, or call pending.result\(\) from another thread$",
        ):
            asyncio.run(await_it(pending))
        rec.release.set()
        (out,) = loop.run_until_complete(await_it(pending))  # its own loop still can
        np.testing.assert_array_equal(out, np.full(2, 2.0))
    finally:
        rec.release.set()
        loop.run_until_complete(backend.aclose())
        loop.close()
