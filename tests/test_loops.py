"""The contract under each event loop: asyncio, asyncio with uvloop, and trio (through anyio).

Each test runs three times, once per loop, on the backend ``auto`` picks (CUDA on a GPU machine,
the host backend elsewhere; ``--asyncgraph-device`` or ``ASYNCGRAPH_TEST_DEVICE`` forces one).
The tests use anyio's primitives only, so the same code is the user's code under any of the
three.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._runtime import _loop
from asyncgraph.testing import assert_matches_host

from .kernels import HOST_CLOCK_HZ, INC, SCALE, SPIN
from .loops import LOOPS, run

Array = np.ndarray[Any, Any]


@pytest.fixture(params=LOOPS)
def loop(request: pytest.FixtureRequest) -> Any:
    """The loop to run a test's body on: a name, or a name and anyio's backend options."""
    return request.param


Opener = Callable[[], ag.Backend]


@pytest.fixture
def open_gpu(asyncgraph_device: str) -> Opener:
    """Opens the backend under test (the plugin's device choice), on the loop of the caller."""
    return lambda: ag.open_backend(asyncgraph_device)


def _nap_args(seconds: float) -> tuple[object, ...]:
    return (np.int64(seconds * HOST_CLOCK_HZ), ag.Out(1, np.int32))


def test_dispatch_results_match_numpy(
    loop: Any, open_gpu: Opener, rng: np.random.Generator
) -> None:
    async def body() -> None:
        async with open_gpu() as gpu:
            # Under trio the backend runs on the trio adapter of the loop interface.
            assert (type(gpu._lifecycle.loop).__name__ == "TrioLoop") == (loop == "trio")
            results: dict[int, Array] = {}
            inputs = [rng.random(4096, dtype=np.float32) for _ in range(64)]

            async def one(i: int) -> None:
                (results[i],) = await gpu.dispatch(
                    SCALE, inputs[i], ag.Out(4096, np.float32), np.float32(i), np.int32(4096),
                    grid=16, block=256,
                )  # fmt: skip

            async with anyio.create_task_group() as tg:
                for i in range(64):
                    tg.start_soon(one, i)
            for i, x in enumerate(inputs):
                np.testing.assert_allclose(results[i], np.float32(i) * x, rtol=1e-6)
            # On the host backend the plugin's check runs the host function twice: numpy is
            # the independent reference of what it returned.
            (half,) = await assert_matches_host(
                gpu, SCALE, inputs[0], ag.Out(4096, np.float32), np.float32(0.5), np.int32(4096),
                grid=16, block=256, allow_host=True,
            )  # fmt: skip
            np.testing.assert_allclose(half, np.float32(0.5) * inputs[0], rtol=1e-6)

    run(loop, body)


def test_cancelled_waiter_does_not_cancel_the_work(loop: Any, open_gpu: Opener) -> None:
    async def body() -> None:
        async with open_gpu() as gpu:
            await gpu.compile(SPIN)
            pending = gpu.dispatch(SPIN, *_nap_args(0.2), grid=1, block=1)
            with anyio.move_on_after(0.02) as scope:
                await pending
            assert scope.cancelled_caught
            assert not pending.done()
            (done,) = await pending
            assert done[0] == 1

    run(loop, body)


def test_loop_keeps_running_while_the_device_works(loop: Any, open_gpu: Opener) -> None:
    async def body() -> None:
        async with open_gpu() as gpu:
            await gpu.compile(SPIN)
            pending = gpu.dispatch(SPIN, *_nap_args(0.3), grid=1, block=1)
            # The loop turns while the kernel runs: counted in turns, not in time. A dispatch
            # that blocked the loop would return with its kernel done, before any turn.
            turns = 0
            while not pending.done() and turns < 20:
                await anyio.lowlevel.checkpoint()
                turns += 1
            assert turns == 20, f"the kernel completed after {turns} turns of the loop"
            (done,) = await pending
            assert done[0] == 1

    run(loop, body)


def test_resident_buffers_round_trip(loop: Any, open_gpu: Opener, rng: np.random.Generator) -> None:
    async def body() -> None:
        async with open_gpu() as gpu:
            x = rng.random(10_000, dtype=np.float32)
            buffer = await gpu.upload(x)
            for _ in range(3):
                await gpu.dispatch(
                    INC, buffer, np.float32(1.5), np.int32(x.size), grid=40, block=256
                )
            result = ag.Out(x.shape, x.dtype, resident=True)
            (scaled,) = await gpu.dispatch(
                SCALE, buffer, result, np.float32(2), np.int32(x.size), grid=40, block=256
            )
            np.testing.assert_allclose(await gpu.download(buffer), x + 4.5, rtol=1e-6)
            np.testing.assert_allclose(await gpu.download(scaled), 2 * (x + 4.5), rtol=1e-6)
            await buffer.aclose()
            await scaled.aclose()
            with pytest.raises(ag.StaleBufferError):
                gpu.dispatch(INC, buffer, np.float32(1), np.int32(1), grid=1, block=1)

    run(loop, body)


def test_result_from_another_thread_and_done_callbacks(
    loop: Any, open_gpu: Opener, rng: np.random.Generator
) -> None:
    async def body() -> None:
        async with open_gpu() as gpu:
            x = rng.random(1024, dtype=np.float32)
            pending = gpu.dispatch(
                SCALE,
                x,
                ag.Out(x.shape, x.dtype),
                np.float32(3),
                np.int32(x.size),
                grid=4,
                block=256,
            )
            called: list[int] = []
            loop_thread = threading.get_ident()
            pending.add_done_callback(lambda p: called.append(threading.get_ident()))
            (out,) = await anyio.to_thread.run_sync(pending.result, 10.0)
            np.testing.assert_allclose(out, 3 * x, rtol=1e-6)
            await anyio.sleep(0.01)
            assert called == [loop_thread]
            if not pending.done():  # pragma: no cover  # result() returned, so it completed
                raise AssertionError("result() returned before the dispatch completed")
            with pytest.raises(ag.UnsupportedError, match="would block the event loop"):
                gpu.dispatch(SPIN, *_nap_args(0.05), grid=1, block=1).result()

    run(loop, body)


def test_bad_input_then_the_backend_goes_on(
    loop: Any, open_gpu: Opener, rng: np.random.Generator
) -> None:
    async def body() -> None:
        async with open_gpu() as gpu:
            x = rng.random(256, dtype=np.float32)
            with pytest.raises(ag.ArgumentTypeError, match="Python float"):
                gpu.dispatch(
                    SCALE, x, ag.Out(256, np.float32), 2.0, np.int32(256), grid=1, block=256
                )
            (out,) = await gpu.dispatch(
                SCALE, x, ag.Out(256, np.float32), np.float32(2), np.int32(256), grid=1, block=256
            )
            np.testing.assert_allclose(out, 2 * x, rtol=1e-6)

    run(loop, body)


def test_close_waits_for_work_and_refuses_new(loop: Any, open_gpu: Opener) -> None:
    async def body() -> None:
        backend = open_gpu()
        await backend.compile(SPIN)
        pending = backend.dispatch(SPIN, *_nap_args(0.1), grid=1, block=1)
        await backend.aclose()
        assert pending.done()
        assert (await pending)[0][0] == 1
        with pytest.raises(ag.BackendClosedError):
            backend.dispatch(SPIN, *_nap_args(0.01), grid=1, block=1)
        await backend.aclose()  # idempotent

    run(loop, body)


def test_cancelled_close_still_closes(loop: Any, open_gpu: Opener) -> None:
    async def body() -> None:
        backend = open_gpu()
        await backend.compile(SPIN)
        pending = backend.dispatch(SPIN, *_nap_args(0.2), grid=1, block=1)
        with anyio.move_on_after(0.02):
            await backend.aclose()
        assert backend.is_closed
        await backend.aclose()
        assert pending.done()

    run(loop, body)


def test_submit_waits_for_room_in_a_bounded_queue(loop: Any, asyncgraph_device: str) -> None:
    async def body() -> None:
        gpu = ag.open_backend(asyncgraph_device, max_in_flight=1, max_queued=1)
        async with gpu:
            await gpu.compile(SPIN)
            first = gpu.dispatch(SPIN, *_nap_args(0.1), grid=1, block=1)
            gpu.dispatch(SPIN, *_nap_args(0.01), grid=1, block=1)  # queued behind it
            with pytest.raises(ag.QueueFullError, match=r"^backend \S+ has 1 dispatches queued"):
                gpu.dispatch(SPIN, *_nap_args(0.01), grid=1, block=1)
            with anyio.move_on_after(0.02) as scope:  # a cancelled wait starts nothing
                await gpu.submit(SPIN, *_nap_args(0.01), grid=1, block=1)
            assert scope.cancelled_caught
            assert gpu.telemetry.snapshot().dispatches == 2
            pendings: list[ag.PendingDispatch] = []

            async def submit() -> None:
                pendings.append(await gpu.submit(SPIN, *_nap_args(0.01), grid=1, block=1))

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(submit)
            assert first.done()  # they went only once there was room
            assert sorted(p.dispatch_id for p in pendings) == [3, 4, 5]
            for pending in pendings:
                assert (await pending)[0][0] == 1

    run(loop, body)


def _own_threads() -> set[threading.Thread]:
    names = ("asyncgraph-host", "asyncgraph-waiter")
    return {t for t in threading.enumerate() if t.name.startswith(names)}


def _assert_closed(backend: ag.Backend, before: set[threading.Thread]) -> None:
    assert repr(backend).endswith(" closed in_flight=0 queued=0 buffers=0>"), repr(backend)
    assert _own_threads() - before == set()


def test_a_close_the_run_ends_during_still_finishes(loop: Any, open_gpu: Opener) -> None:
    before = _own_threads()
    kept: dict[str, Any] = {}

    async def body() -> None:
        backend = kept["backend"] = open_gpu()
        await backend.compile(SPIN)
        kept["buffer"] = await backend.upload(np.ones(4, np.float32))
        kept["pending"] = backend.dispatch(SPIN, *_nap_args(0.1), grid=1, block=1)
        with anyio.move_on_after(0.01):
            await backend.aclose()
        assert " closing in_flight=1 " in repr(backend)
        # The run ends here; it waits for the close (asyncio.run cancels it first).

    run(loop, body)
    assert kept["pending"].done()
    assert kept["pending"].result()[0][0] == 1
    assert kept["buffer"].is_closed
    _assert_closed(kept["backend"], before)


def test_a_later_run_closes_a_backend_whose_run_ended(loop: Any, open_gpu: Opener) -> None:
    before = _own_threads()
    kept: dict[str, Any] = {}

    async def body() -> None:
        backend = kept["backend"] = open_gpu()
        await backend.compile(SPIN)
        kept["buffer"] = await backend.upload(np.ones(4, np.float32))
        kept["pending"] = backend.dispatch(SPIN, *_nap_args(0.1), grid=1, block=1)
        # The run ends with the backend open and its dispatch in flight.

    run(loop, body)
    backend = kept["backend"]
    assert not backend.is_closed
    run(loop, backend.aclose)
    assert kept["pending"].result(5)[0][0] == 1
    assert kept["buffer"].is_closed
    _assert_closed(backend, before)


@pytest.mark.cuda
def test_cuda_leases_graphs_and_large_transfers(
    loop: Any, open_gpu: Opener, rng: np.random.Generator
) -> None:
    async def body() -> None:
        async with open_gpu() as gpu:
            if gpu.kind != "cuda":
                pytest.skip("the CUDA backend's own features")
            # A leased stream, awaited without blocking.
            async with gpu.stream() as lease:
                await lease.synchronize()
            # Cached graphs for a repeated signature ("auto" replays one once its first turn of
            # eager samples is over).
            x = rng.random(4096, dtype=np.float32)
            for i in range(12):
                (out,) = await gpu.dispatch(
                    SCALE, x, ag.Out(4096, np.float32), np.float32(i), np.int32(4096),
                    grid=16, block=256, graph="auto",
                )  # fmt: skip
                np.testing.assert_allclose(out, np.float32(i) * x, rtol=1e-6)
            assert gpu.telemetry.snapshot().graph_replays >= 1
            # A transfer large enough to go in chunks, through worker threads.
            big = rng.random(40 << 20 >> 2, dtype=np.float32)
            buffer = await gpu.upload(big)
            np.testing.assert_array_equal(await gpu.download(buffer), big)
            await buffer.aclose()

    run(loop, body)


def test_trio_watches_a_file_descriptor_like_asyncio() -> None:
    trio = pytest.importorskip("trio")

    seen: list[bytes] = []

    async def main() -> None:
        loop = _loop.current_loop()
        read, write = os.pipe()
        try:
            loop.add_reader(read, lambda: seen.append(os.read(read, 16)))
            os.write(write, b"one")
            with trio.fail_after(5):
                while not seen:
                    await trio.sleep(0.001)
            assert loop.remove_reader(read)
            assert not loop.remove_reader(read)
            os.write(write, b"two")
            await trio.sleep(0.05)
        finally:
            os.close(read)
            os.close(write)

    trio.run(main)
    assert seen == [b"one"]


def _trio_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("asyncgraph-trio")]


def test_the_threads_of_a_trio_run_end_with_it() -> None:
    # Each run's executor was never shut down: its idle threads stayed, 9 to 11 of them
    # after repeated runs.
    trio = pytest.importorskip("trio")
    before = set(_trio_threads())
    big = np.ones(1 << 19, np.float32)  # 2 MiB: uploaded and downloaded in the executor

    ran: set[threading.Thread] = set()

    async def main() -> None:
        async with ag.open_backend("host") as backend:
            buffer = await backend.upload(big)
            np.testing.assert_array_equal(await backend.download(buffer), big)
            ran.update(set(_trio_threads()) - before)  # seen while the run goes on
            await buffer.aclose()

    for _ in range(3):
        trio.run(main)
    assert ran  # the runs used threads of their own
    for thread in ran:
        thread.join(timeout=10)
    assert [t.name for t in ran if t.is_alive()] == []
