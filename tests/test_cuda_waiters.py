"""The reactor's waiters on a GPU, under asyncio, uvloop and trio: an idle loop hands a long
kernel's event to a waiter, which wakes the loop (native threads through an eventfd when the
compiled core runs, Python threads otherwise), and the results are right."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._cuda.core._choose import core

from .kernels import SCALE, SPIN
from .loops import run
from .test_loops import loop

__all__ = ("loop",)

pytestmark = pytest.mark.cuda


def _python_waiters() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("asyncgraph-waiter")]


def test_an_idle_loop_is_woken_by_the_waiters(loop: Any, rng: np.random.Generator) -> None:
    seen: dict[str, Any] = {}

    async def main() -> None:
        # A short poll window: the loop, with nothing else to do, hands off soon.
        async with ag.open_backend("cuda", poll_window=1e-4, spin_window=0.0) as gpu:
            await gpu.compile(SPIN)
            clock_khz = gpu._cuda.device.device.properties.clock_rate  # type: ignore[attr-defined]  # a CUDA backend
            x = rng.standard_normal(4096).astype(np.float32)
            for _ in range(3):
                # 20 ms of GPU work, then a dispatch ordered after it on the same buffer.
                (flag,) = await gpu.dispatch(
                    SPIN, np.int64(clock_khz * 20), ag.Out(1, np.int32), grid=1, block=1
                )
                assert flag[0] == 1
                (out,) = await gpu.dispatch(
                    SCALE,
                    x,
                    ag.Out(x.shape, x.dtype),
                    np.float32(3),
                    np.int32(x.size),
                    grid=16,
                    block=256,
                )
                np.testing.assert_allclose(out, 3 * x, rtol=1e-6)
            seen["sync_points"] = gpu.telemetry.snapshot().sync_points
            seen["threads"] = _python_waiters()
            # Several lanes waiting at once: each wakes the loop once its kernel is done.
            flags = await _concurrently(gpu, clock_khz, 4)
            assert all(f[0] == 1 for f in flags)

    run(loop, main)
    assert seen["sync_points"] >= 3  # each long kernel went to a waiter
    if core.NativeWaiter is not None:
        assert seen["threads"] == []  # the waiters ran outside Python
    else:
        assert seen["threads"]


async def _concurrently(gpu: ag.Backend, clock_khz: int, n: int) -> list[Any]:
    results: list[Any] = [None] * n

    async def one(i: int) -> None:
        (results[i],) = await gpu.dispatch(
            SPIN, np.int64(clock_khz * 10), ag.Out(1, np.int32), grid=1, block=1
        )

    async with anyio.create_task_group() as tasks:
        for i in range(n):
            tasks.start_soon(one, i)
    return results
