"""A transfer in progress when aclose() begins: the close waits for it, and keeps nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag


async def _upload_racing_close(backend: ag.Backend, array: np.ndarray[Any, Any]) -> None:
    """Hold an upload after its copy finished, close the backend, then let the upload end."""
    copied = asyncio.Event()
    go_on = asyncio.Event()
    engine: Any = backend._engine  # the test stands between the front and its engine
    upload_storage = engine.upload_storage
    freed: list[Any] = []
    free_storage = engine.free_storage

    async def held(array: np.ndarray[Any, Any]) -> Any:
        storage = await upload_storage(array)  # the backend's own copy
        copied.set()
        await go_on.wait()
        return storage

    def free(storage: Any) -> None:
        freed.append(storage)
        free_storage(storage)

    engine.upload_storage = held  # the race, made certain
    engine.free_storage = free  # to see the copy freed
    upload = asyncio.create_task(backend.upload(array))
    await copied.wait()
    closing = asyncio.create_task(backend.aclose())
    await asyncio.sleep(0.02)
    assert not closing.done()  # it waits for the upload in progress
    assert " closing in_flight=0 queued=0 buffers=0>" in repr(backend)
    go_on.set()
    with pytest.raises(
        ag.BackendClosedError,
        match=r"^backend \S+ was closed while upload\(\) copied the array; the copy was freed$",
    ):
        await upload
    await closing
    assert repr(backend).endswith(" closed in_flight=0 queued=0 buffers=0>")
    assert backend._store.bytes_live == 0
    assert len(freed) == 1


async def test_an_upload_racing_close_is_waited_for_and_freed() -> None:
    # Over 1 MiB: the host backend copies it in a thread, off the loop.
    await _upload_racing_close(ag.open_backend("host"), np.ones(1 << 20, np.float32))


@pytest.mark.cuda
async def test_an_upload_racing_close_is_waited_for_and_freed_on_cuda() -> None:
    # 64 MiB goes up in chunks; the device memory must not stay behind a closed backend.
    await _upload_racing_close(ag.open_backend("cuda"), np.ones(16 << 20, np.float32))


async def test_a_download_in_progress_completes_before_the_close() -> None:
    backend = ag.open_backend("host")
    data = np.arange(1 << 20, dtype=np.float32)
    buffer = await backend.upload(data)
    engine: Any = backend._engine  # the test stands between the front and its engine
    download_storage = engine.download_storage
    go_on = asyncio.Event()

    async def held(
        buffer: ag.ResidentBuffer, use: Any, deps: list[Any], out: np.ndarray[Any, Any] | None
    ) -> np.ndarray[Any, Any]:
        await go_on.wait()
        array: np.ndarray[Any, Any] = await download_storage(buffer, use, deps, out)
        return array

    engine.download_storage = held  # hold it in progress
    download = asyncio.create_task(backend.download(buffer))
    await asyncio.sleep(0)
    closing = asyncio.create_task(backend.aclose())
    await asyncio.sleep(0.02)
    assert not closing.done()
    assert repr(buffer).endswith(" 1 in use>")  # not freed under the copy
    go_on.set()
    np.testing.assert_array_equal(await download, data)
    await closing
    assert buffer.is_closed
    assert backend._store.bytes_live == 0
