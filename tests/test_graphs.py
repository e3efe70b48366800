"""Graph machinery that runs without a GPU: modes, the capture lock, the host backend's answers."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph.capture import CaptureLock, CaptureMode, CaptureStatus, GraphCacheStatistics

from .kernels import SCALE


def test_capture_modes_parse_from_their_names() -> None:
    assert [m.value for m in CaptureMode] == ["global", "thread_local", "relaxed"]
    assert CaptureMode.parse("thread_local") is CaptureMode.THREAD_LOCAL
    assert CaptureMode.parse(CaptureMode.GLOBAL) is CaptureMode.GLOBAL
    with pytest.raises(ag.CaptureError, match=r"^mode='local'; pass one of 'global', "):
        CaptureMode.parse("local")
    assert [s.value for s in CaptureStatus] == ["none", "active", "invalidated"]


async def test_the_capture_lock_serialises_tasks_and_threads() -> None:
    lock = CaptureLock()
    inside = 0
    most = 0

    async def task() -> None:
        nonlocal inside, most
        async with lock:
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.001)
            inside -= 1

    def thread() -> None:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
            threading.Event().wait(0.001)
            inside -= 1

    threads = [threading.Thread(target=thread) for _ in range(4)]
    for t in threads:
        t.start()
    await asyncio.gather(*(task() for _ in range(8)))
    for t in threads:
        t.join()
    assert most == 1
    assert not lock.locked()
    assert lock.try_acquire()
    assert not lock.try_acquire()
    lock.release()


async def test_a_cancelled_wait_for_the_capture_lock_holds_nothing() -> None:
    lock = CaptureLock()
    assert lock.try_acquire()
    waiter = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0.002)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    lock.release()
    assert not lock.locked()


async def test_the_host_backend_has_no_graphs(host: ag.Backend) -> None:
    x = np.ones(4, np.float32)
    with pytest.raises(ag.UnsupportedError, match=r"^record\(\): the host backend has no CUDA"):
        await host.record(
            SCALE, x, ag.Out(4, np.float32), np.float32(2), np.int32(4), grid=1, block=4
        )
    with pytest.raises(ag.UnsupportedError, match=r"^capture\(\): the host backend has no CUDA"):
        host.capture()
    # dispatch(graph=...) runs the dispatch on the host, whatever the choice.
    for choice in ("never", "auto", "always"):
        (y,) = await host.dispatch(
            SCALE,
            x,
            ag.Out(4, np.float32),
            np.float32(2),
            np.int32(4),
            grid=1,
            block=4,
            graph=choice,
        )
        np.testing.assert_array_equal(y, x * 2)
    with pytest.raises(ag.ArgumentTypeError, match=r"^graph='yes'; pass 'never', 'auto' or"):
        host.dispatch(
            SCALE,
            x,
            ag.Out(4, np.float32),
            np.float32(2),
            np.int32(4),
            grid=1,
            block=4,
            graph="yes",
        )


async def test_graph_cache_metrics_read_the_same_on_the_host_backend(host: ag.Backend) -> None:
    # graphs.md's metrics code crashed on the host backend: it had no graph_cache.
    def metrics(backend: Any) -> dict[str, int]:
        stats = backend.graph_cache.statistics()
        return {"hits": stats.hits, "misses": stats.misses, "bytes": stats.bytes}

    x = np.ones(4, np.float32)
    for _ in range(4):
        await host.dispatch(
            SCALE, x, ag.Out(4, np.float32), np.float32(2), np.int32(4), grid=1, block=4,
            graph="auto",
        )  # fmt: skip
    assert metrics(host) == {"hits": 0, "misses": 0, "bytes": 0}  # the host records no graphs
    cache: Any = host.graph_cache  # type: ignore[attr-defined]  # not on every ag.Backend
    stats = cache.statistics()
    assert isinstance(stats, GraphCacheStatistics)
    assert (stats.signatures, stats.instances, stats.choices) == (0, 0, ())
    cache.clear()  # nothing to free, no error
    assert repr(cache) == "<HostGraphCache signatures=0 bytes=0 hits=0 misses=0 choices=0>"
