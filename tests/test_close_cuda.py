"""Closing a CUDA backend when its event loop ends first (needs a GPU)."""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag

from .kernels import HOST_CLOCK_HZ, SCALE, SPIN

pytestmark = pytest.mark.cuda


def _waiters() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("asyncgraph-waiter")}


def _assert_closed(gpu: ag.Backend, before: set[threading.Thread]) -> None:
    assert repr(gpu).endswith(" closed in_flight=0 queued=0 buffers=0>"), repr(gpu)
    assert _waiters() - before == set()


def test_a_later_loop_closes_a_cuda_backend_whose_loop_ended_with_work_in_flight(
    rng: np.random.Generator,
) -> None:
    before = _waiters()
    n = 4 << 20  # 16 MiB of results
    x = rng.random(n, dtype=np.float32)

    async def start() -> tuple[Any, ...]:
        gpu = ag.open_backend("cuda")
        await gpu.compile(SPIN)
        await gpu.compile(SCALE)
        buffer = await gpu.upload(np.ones(4, np.float32))
        big = gpu.dispatch(
            SCALE, x, ag.Out(n, np.float32), np.float32(2), np.int32(n), grid=n // 256, block=256
        )
        await asyncio.sleep(0.05)  # its inputs staged in a thread, and launched
        spin = gpu.dispatch(
            SPIN, np.int64(0.2 * HOST_CLOCK_HZ), ag.Out(1, np.int32), grid=1, block=1
        )
        return gpu, buffer, spin, big

    gpu, buffer, spin, big = asyncio.run(start())  # ends with the spin in flight
    asyncio.run(gpu.aclose())
    assert spin.result(0)[0][0] == 1
    np.testing.assert_array_equal(big.result(0)[0], 2 * x)
    assert buffer.is_closed
    _assert_closed(gpu, before)


def test_a_close_the_loop_ends_during_finishes_with_a_compile_in_flight() -> None:
    before = _waiters()
    # A source no cache has seen, so the dispatch waits for NVRTC when the loop ends.
    source = f"// {uuid.uuid4()}\n" + SCALE.source
    kernel = ag.Kernel(source, "scale", host=SCALE.host)
    kept: dict[str, Any] = {}

    async def main() -> None:
        gpu = kept["gpu"] = ag.open_backend("cuda")
        x = np.ones(256, np.float32)
        kept["pending"] = gpu.dispatch(
            kernel, x, ag.Out(256, np.float32), np.float32(2), np.int32(256), grid=1, block=256
        )
        kept["closing"] = asyncio.create_task(gpu.aclose())
        await asyncio.sleep(0)

    asyncio.run(main())  # cancels the compilation and the close, and waits for the close
    pending = kept["pending"]
    assert pending.done()
    error = pending.exception()
    if error is not None:  # the compilation was cancelled before it finished
        assert isinstance(error, ag.BackendClosedError)
        assert re.match(
            r"^the event loop ended while 'scale' compiled for dispatch #1; close the backend "
            r"before the loop ends$",
            str(error),
        )
    _assert_closed(kept["gpu"], before)


def _run_in_thread(main: Any) -> threading.Thread:
    thread = threading.Thread(target=asyncio.run, args=(main,), name="owner-loop")
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("seconds", "wait_first"),
    [
        (0.2, True),  # result() blocks while the loop ends; a waiter thread most likely holds it
        (0.2, False),
        (0.0, False),  # the loop most likely closes while it still polls: no hand-off at all
        (0.0, True),
    ],
    ids=["long-waiting", "long-after", "short-after", "short-waiting"],
)
def test_a_cuda_dispatch_in_flight_when_its_loop_ends_still_resolves(
    seconds: float, wait_first: bool
) -> None:
    before = _waiters()
    kept: dict[str, Any] = {}
    launched = threading.Event()

    async def main() -> None:
        gpu = kept["gpu"] = ag.open_backend("cuda")
        await gpu.compile(SPIN)
        kept["pending"] = gpu.dispatch(
            SPIN, np.int64(seconds * HOST_CLOCK_HZ), ag.Out(1, np.int32), grid=1, block=1
        )
        launched.set()  # returns without awaiting it: the loop ends with the dispatch in flight

    owner = _run_in_thread(main())
    assert launched.wait(30)
    if not wait_first:
        owner.join(30)
        assert not owner.is_alive()
    (out,) = kept["pending"].result(timeout=10)  # before the backend is closed
    assert out[0] == 1
    owner.join(30)
    gpu = kept["gpu"]
    assert gpu.telemetry.snapshot().dispatches_completed == 1
    asyncio.run(gpu.aclose())
    _assert_closed(gpu, before)


def test_cuda_dispatches_on_several_lanes_resolve_after_their_loop_ends(
    rng: np.random.Generator,
) -> None:
    before = _waiters()
    n = 4 << 20  # 16 MiB of results: copied out off the loop's thread
    x = rng.random(n, dtype=np.float32)
    kept: dict[str, Any] = {}

    async def main() -> None:
        gpu = kept["gpu"] = ag.open_backend("cuda")
        await gpu.compile(SPIN)
        await gpu.compile(SCALE)
        kept["big"] = gpu.dispatch(
            SCALE, x, ag.Out(n, np.float32), np.float32(2), np.int32(n), grid=n // 256, block=256
        )
        await asyncio.sleep(0.05)  # its inputs staged in a thread, and launched
        kept["spins"] = [
            gpu.dispatch(SPIN, np.int64(cycles), ag.Out(1, np.int32), grid=1, block=1)
            for cycles in (0.1 * HOST_CLOCK_HZ, 0.2 * HOST_CLOCK_HZ, 0.05 * HOST_CLOCK_HZ, 0)
        ]

    owner = _run_in_thread(main())
    owner.join(30)
    assert not owner.is_alive()
    for spin in kept["spins"]:
        assert spin.result(timeout=10)[0][0] == 1
    np.testing.assert_array_equal(kept["big"].result(timeout=10)[0], 2 * x)
    gpu = kept["gpu"]
    assert gpu.telemetry.snapshot().dispatches_completed == 5
    asyncio.run(gpu.aclose())
    _assert_closed(gpu, before)
