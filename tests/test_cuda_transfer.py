"""Large uploads and downloads in pinned chunks, on a GPU."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph import _cuda
from asyncgraph._transfer import CHUNKED_ABOVE

pytestmark = pytest.mark.cuda


@pytest.fixture
async def gpu(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setattr(_cuda, "TRANSFER_CHUNK", 1 << 20)  # many chunks from a few MiB
    async with ag.open_backend("cuda") as backend:
        yield backend


@pytest.mark.parametrize(
    "nbytes",
    [CHUNKED_ABOVE + 1, 2 << 20, (5 << 19) + 12, 7 << 20],
    ids=["just-over", "two-chunks", "two-and-a-half", "seven"],
)
async def test_chunked_round_trip_matches(gpu: Any, nbytes: int) -> None:
    data = np.random.default_rng().integers(0, 256, nbytes, dtype=np.uint8)
    before = gpu.pinned_pool.statistics()
    buf = await gpu.upload(data)
    back = await gpu.download(buf)
    np.testing.assert_array_equal(back, data)
    after = gpu.pinned_pool.statistics()
    assert after.bytes_in_use == 0
    # Two blocks of one chunk each way, whatever the size.
    assert after.hits + after.misses - before.hits - before.misses == 4
    assert max(after.bytes_idle, before.bytes_idle) <= 2 * (1 << 20) * 2


async def test_chunked_transfers_of_other_dtypes_and_shapes(gpu: Any) -> None:
    data = np.random.default_rng().standard_normal((700, 900)).astype(np.float64)  # 4.8 MiB
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
async def test_download_into_an_array_of_yours(gpu: Any, nbytes: int) -> None:
    data = np.random.default_rng().integers(0, 256, nbytes, dtype=np.uint8)
    buf = await gpu.upload(data)
    out = np.zeros(nbytes, np.uint8)
    assert await gpu.download(buf, out=out) is out
    np.testing.assert_array_equal(out, data)
