"""Reliability on a GPU: device out of memory, the pinned pool's byte cap, and shutdown."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag

from .kernels import FILL, SCALE, SPIN

pytestmark = pytest.mark.cuda


@pytest.fixture
async def gpu() -> AsyncIterator[Any]:
    async with ag.open_backend("cuda") as backend:
        yield backend


def _free_device_bytes() -> int:
    """Device 0's free memory, asked in its primary context (a backend leaves the thread's
    context as it found it, so none may be current here)."""
    from cuda.bindings import driver as drv
    from cuda.core import Device

    Device(0).set_current()
    code, free, _total = drv.cuMemGetInfo()
    assert code == drv.CUresult.CUDA_SUCCESS
    return int(free)


async def _small_work_is_correct(rng: np.random.Generator, gpu: Any) -> None:
    x = rng.standard_normal(1000, dtype=np.float32)
    (out,) = await gpu.dispatch(
        SCALE, x, ag.Out(1000, np.float32), np.float32(3), np.int32(1000), grid=4, block=256
    )
    assert np.array_equal(out, x * np.float32(3))


def _empty_or_none(gpu: Any, nbytes: int) -> Any:
    try:
        return gpu.empty(nbytes, np.uint8)
    except ag.AllocationError as exc:
        if not str(exc).startswith(f"device out of memory allocating {nbytes} bytes"):
            raise
        return None


async def test_device_out_of_memory_raises_allocation_error_and_the_backend_serves_on(
    gpu: Any,
    rng: np.random.Generator,
) -> None:
    await _small_work_is_correct(rng, gpu)
    # A resident buffer larger than the whole device.
    with pytest.raises(ag.AllocationError, match=r"device out of memory allocating \d+ bytes"):
        gpu.empty(_free_device_bytes() + (1 << 30), np.uint8)
    # Fill the device with resident buffers until even 32 MiB no longer fits (each size stops
    # with its own AllocationError), then give 64 MiB back: small work fits, 256 MiB does not.
    spare = gpu.empty(64 << 20, np.uint8)
    held = []
    for chunk in (8 << 30, 1 << 30, 128 << 20, 32 << 20):
        while (buffer := _empty_or_none(gpu, chunk)) is not None:
            held.append(buffer)
    await spare.aclose()
    trims: list[int] = []
    memory = gpu.device_memory
    original_trim = memory._trim

    def counting_trim() -> None:
        trims.append(1)
        original_trim()

    memory._trim = counting_trim
    n = 64 << 20  # a 256 MiB output: more than the device has left
    with pytest.raises(ag.AllocationError, match=r"^device out of memory allocating \d+ bytes"):
        await gpu.dispatch(
            FILL, ag.Out(n, np.float32), np.float32(1), np.int64(n), grid=n // 256, block=256
        )
    assert trims == [1]  # the caches were trimmed before the one retry
    assert memory.statistics().out_of_memory == 1
    # Nothing leaked, the backend did not fail, and smaller work runs.
    assert memory.statistics().bytes_in_use == 0
    assert gpu.pinned_pool.statistics().bytes_in_use == 0
    await _small_work_is_correct(rng, gpu)
    for buffer in held:
        await buffer.aclose()
    # With the memory back, the same dispatch succeeds.
    (out,) = await gpu.dispatch(
        FILL, ag.Out(n, np.float32), np.float32(2), np.int64(n), grid=n // 256, block=256
    )
    assert out.shape == (n,)
    assert bool((out == 2).all())


async def test_pinned_cap_reached_allocates_beyond_it_and_frees_down_to_it(
    rng: np.random.Generator,
) -> None:
    cap = 1 << 20
    async with ag.open_backend("cuda", pinned_pool_bytes=cap) as backend:
        gpu: Any = backend

        async def one() -> None:
            n = 1 << 19  # 2 MiB in and 2 MiB out: 4 MiB of staging, over the cap
            x = rng.standard_normal(n, dtype=np.float32)
            a = np.float32(rng.uniform(-3, 3))
            (out,) = await gpu.dispatch(
                SCALE, x, ag.Out(n, np.float32), a, np.int32(n), grid=n // 256, block=256
            )
            assert np.array_equal(out, x * a)

        # 32 at once need 128 MiB of pinned staging: neither waiting nor failing, the pool
        # allocates what it must and frees what comes back over the cap.
        await asyncio.gather(*(one() for _ in range(32)))
        stats = gpu.pinned_pool.statistics()
        assert stats.bytes_in_use == 0
        assert stats.bytes_idle <= cap
        assert stats.allocated_bytes_total > cap  # it allocated beyond the cap
        assert gpu._cuda.small.lent == 0  # results over the cap were copied out, not lent
        snap = gpu.telemetry.snapshot()
        assert snap.dispatches_completed == 32
        assert snap.dispatches_failed == 0


def _spin(gpu: Any, ms: float) -> Any:
    cycles = np.int64(gpu._cuda.device.device.properties.clock_rate * ms)
    return gpu.dispatch(SPIN, cycles, ag.Out(1, np.int32), grid=1, block=1)


def _scale(gpu: Any, x: np.ndarray[Any, Any]) -> Any:
    n = x.size
    grid = (n + 255) // 256
    return gpu.dispatch(
        SCALE, x, ag.Out(n, np.float32), np.float32(2), np.int32(n), grid=grid, block=256
    )


async def test_close_completes_work_in_flight_and_a_second_close_is_harmless(
    rng: np.random.Generator,
) -> None:
    backend: Any = ag.open_backend("cuda")
    await backend.compile(SPIN)
    await backend.compile(SCALE)
    x = rng.standard_normal(4096, dtype=np.float32)
    long = _spin(backend, 100)
    short = [_scale(backend, x) for _ in range(20)]

    async def awaiter() -> tuple[Any, ...]:
        result: tuple[Any, ...] = await short[-1]  # awaited while another task closes
        return result

    waiting = asyncio.create_task(awaiter())
    closing = asyncio.create_task(backend.aclose())
    await asyncio.sleep(0.01)
    assert backend.is_closed
    assert not closing.done()  # the 100 ms kernel still runs
    with pytest.raises(ag.BackendClosedError, match=r"^backend cuda:0 is closed; open a new one"):
        _scale(backend, x)
    await closing
    (flag,) = await long
    assert flag[0] == 1
    for pending in short:
        (out,) = await pending
        np.testing.assert_array_equal(out, 2 * x)
    (out,) = await waiting
    np.testing.assert_array_equal(out, 2 * x)
    await backend.aclose()  # harmless
    assert backend.device_memory.statistics().bytes_in_use == 0
    assert backend.device_memory.statistics().bytes_reserved == 0
    assert backend.pinned_pool.statistics().bytes_in_use == 0


async def test_close_with_a_timeout_fails_only_what_had_not_started() -> None:
    backend: Any = ag.open_backend("cuda", max_in_flight=1)
    await backend.compile(SPIN)
    long = _spin(backend, 200)
    queued = [_spin(backend, 1) for _ in range(3)]
    closing = asyncio.create_task(backend.aclose(timeout=0.05))
    await asyncio.sleep(0.1)  # past the timeout: the queued dispatches were failed
    for pending in queued:
        with pytest.raises(
            ag.BackendClosedError,
            match=r"^backend cuda:0 was closed before dispatch #\d of 'spin' started "
            r"\(aclose timeout\)$",
        ):
            await pending
    assert not closing.done()  # the running one still runs
    await closing
    (flag,) = await long
    assert flag[0] == 1


def _open_use_and_drop() -> int:
    backend: Any = ag.open_backend("cuda")
    reserved = backend.device_memory.statistics().bytes_reserved
    del backend
    gc.collect()
    return int(reserved)


async def test_a_dropped_backend_warns_and_releases_its_device_memory() -> None:
    before = _free_device_bytes()
    with pytest.warns(ResourceWarning, match=r"^backend cuda:0 was not closed; use 'async with'"):
        reserved = _open_use_and_drop()
    assert reserved > 0
    gc.collect()
    # Its memory pool (with the 64 MiB reserve and the streams' scratch) went with it.
    assert _free_device_bytes() >= before - (8 << 20)
