"""Large uploads and downloads in pinned chunks, on a GPU."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._cuda import _cuda_graphs as _graphs
from asyncgraph._cuda.memory import _chunked_transfer
from asyncgraph._cuda.memory._chunked_transfer import CHUNKED_ABOVE

from .kernels import INC, SCALE

pytestmark = pytest.mark.cuda


@pytest.fixture
async def gpu(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setattr(_chunked_transfer, "TRANSFER_CHUNK", 1 << 20)  # many chunks from a few MiB
    async with ag.open_backend("cuda") as backend:
        yield backend


@pytest.mark.parametrize(
    "nbytes",
    [CHUNKED_ABOVE + 1, 2 << 20, (5 << 19) + 12, 7 << 20],
    ids=["just-over", "two-chunks", "two-and-a-half", "seven"],
)
async def test_chunked_round_trip_matches(gpu: Any, nbytes: int, rng: np.random.Generator) -> None:
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    before = gpu.pinned_pool.statistics()
    buf = await gpu.upload(data)
    back = await gpu.download(buf)
    np.testing.assert_array_equal(back, data)
    after = gpu.pinned_pool.statistics()
    assert after.bytes_in_use == 0
    # Two blocks of one chunk each way, whatever the size.
    assert after.hits + after.misses - before.hits - before.misses == 4
    assert max(after.bytes_idle, before.bytes_idle) <= 2 * (1 << 20) * 2


async def test_chunked_transfers_of_other_dtypes_and_shapes(
    gpu: Any, rng: np.random.Generator
) -> None:
    data = rng.standard_normal((700, 900)).astype(np.float64)  # 4.8 MiB
    buf = await gpu.upload(data)
    back = await gpu.download(buf)
    assert back.shape == (700, 900)
    assert back.dtype == np.float64
    np.testing.assert_array_equal(back, data)


async def test_a_cancelled_upload_leaks_nothing(gpu: Any) -> None:
    data = np.ones(256 << 20, np.uint8)  # 256 chunks of 1 MiB
    task = asyncio.create_task(gpu.upload(data))
    await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):  # blocks come back once their copies completed
        if gpu.pinned_pool.statistics().bytes_in_use == 0:
            break
        await asyncio.sleep(0.005)
    assert gpu.pinned_pool.statistics().bytes_in_use == 0
    assert gpu._store.bytes_live == 0
    # The backend serves on.
    buf = await gpu.upload(np.arange(3 << 20, dtype=np.uint8))
    np.testing.assert_array_equal(await gpu.download(buf), np.arange(3 << 20, dtype=np.uint8))


@pytest.mark.parametrize("nbytes", [4096, 3 << 20], ids=["one-block", "chunked"])
async def test_download_into_an_array_of_yours(
    gpu: Any, nbytes: int, rng: np.random.Generator
) -> None:
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    buf = await gpu.upload(data)
    out = np.zeros(nbytes, np.uint8)
    assert await gpu.download(buf, out=out) is out
    np.testing.assert_array_equal(out, data)


# -- dispatches over the pinned cap stream their arrays ----------------------------------------

_N = (3 << 20) // 4 + 5  # float32 elements: a little over 3 MiB per array


@pytest.fixture
async def streaming(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    """A backend that streams dispatches moving more than 2 MiB, in 1 MiB chunks, and records
    the size of every pinned block it takes."""
    monkeypatch.setattr(_chunked_transfer, "TRANSFER_CHUNK", 1 << 20)
    monkeypatch.setattr(_graphs, "STREAM_MIN", 2 << 20)
    options = ag.BackendOptions(pinned_pool_bytes=1 << 20)
    async with ag.open_backend("cuda", options=options) as opened:
        backend: Any = opened
        pool = backend.pinned_pool
        acquire = pool.acquire
        sizes: list[int] = []

        def spy(nbytes: int) -> Any:
            sizes.append(nbytes)
            return acquire(nbytes)

        monkeypatch.setattr(pool, "acquire", spy)
        backend.acquired_sizes = sizes
        yield backend


def _launch(n: int) -> dict[str, int]:
    return {"grid": -(-n // 256), "block": 256}


async def test_a_dispatch_over_the_pinned_cap_streams_in_chunks(
    streaming: Any, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(_N).astype(np.float32)
    memory = streaming.device_memory.statistics()
    before = streaming.telemetry.snapshot()
    (y,) = await streaming.dispatch(
        SCALE, x, ag.Out(_N, np.float32), np.float32(2.5), np.int32(_N), **_launch(_N)
    )
    np.testing.assert_array_equal(y, x * np.float32(2.5))
    # Through 1 MiB pinned blocks only, all back in the pool.
    assert streaming.acquired_sizes
    assert max(streaming.acquired_sizes) == 1 << 20
    assert streaming.pinned_pool.statistics().bytes_in_use == 0
    after = streaming.telemetry.snapshot()
    assert after.bytes_up - before.bytes_up == x.nbytes
    assert after.bytes_down - before.bytes_down == y.nbytes
    assert streaming.device_memory.statistics().bytes_in_use == memory.bytes_in_use
    # Below the threshold a dispatch takes the one-block path.
    streaming.acquired_sizes.clear()
    small = x[: 1 << 10]
    (z,) = await streaming.dispatch(
        SCALE,
        small,
        ag.Out(small.size, np.float32),
        np.float32(2),
        np.int32(small.size),
        grid=4,
        block=256,
    )
    np.testing.assert_array_equal(z, small * 2)
    assert streaming.acquired_sizes == [2 * small.nbytes]


async def test_a_streamed_in_out_and_a_resident_result(
    streaming: Any, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(_N).astype(np.float32)
    (bumped,) = await streaming.dispatch(
        INC, ag.InOut(x), np.float32(1.5), np.int32(_N), **_launch(_N)
    )
    np.testing.assert_array_equal(bumped, x + np.float32(1.5))
    # A resident result of a streamed dispatch: only the input streams.
    (buf,) = await streaming.dispatch(
        SCALE, x, ag.Out(_N, np.float32, resident=True), np.float32(3), np.int32(_N), **_launch(_N)
    )
    assert isinstance(buf, ag.ResidentBuffer)
    np.testing.assert_array_equal(await streaming.download(buf), x * np.float32(3))
    await buf.aclose()


async def test_streamed_dispatches_keep_the_order_of_their_resident_buffers(streaming: Any) -> None:
    buf = await streaming.upload(np.zeros(_N, np.float32))
    first = streaming.dispatch(INC, buf, np.float32(1), np.int32(_N), **_launch(_N))
    # Reads buf after `first` wrote it; streams its 3 MiB output.
    read = streaming.dispatch(
        SCALE, buf, ag.Out(_N, np.float32), np.float32(10), np.int32(_N), **_launch(_N)
    )
    # Writes buf after `read` read it.
    second = streaming.dispatch(INC, buf, np.float32(1), np.int32(_N), **_launch(_N))
    (seen,), _, _ = await asyncio.gather(read, first, second)
    np.testing.assert_array_equal(seen, np.full(_N, 10, np.float32))
    np.testing.assert_array_equal(await streaming.download(buf), np.full(_N, 2, np.float32))


async def test_a_cancelled_streamed_dispatch_leaks_nothing(streaming: Any) -> None:
    n = 64 << 20  # 256 MiB of float32: 256 chunks up, 256 down
    x = np.ones(n, np.float32)
    memory = streaming.device_memory.statistics().bytes_in_use
    task = asyncio.ensure_future(
        streaming.dispatch(
            SCALE, x, ag.Out(n, np.float32), np.float32(2), np.int32(n), **_launch(n)
        )
    )
    await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(400):  # the dispatch runs on to its end, then gives everything back
        if (
            not streaming._cuda.streamed.tasks
            and streaming.pinned_pool.statistics().bytes_in_use == 0
        ):
            break
        await asyncio.sleep(0.01)
    assert not streaming._cuda.streamed.tasks
    assert streaming.pinned_pool.statistics().bytes_in_use == 0
    assert streaming.device_memory.statistics().bytes_in_use == memory
    (y,) = await streaming.dispatch(
        SCALE, x[:_N], ag.Out(_N, np.float32), np.float32(2), np.int32(_N), **_launch(_N)
    )
    np.testing.assert_array_equal(y, np.full(_N, 2, np.float32))
