"""A cancellation storm on each backend: 20,000 dispatches from 256 tasks, with random
cancellations and timeouts. Every result that was not cancelled is correct, everything the
backend held comes back, and nothing warns of a leaked resource."""

from __future__ import annotations

import asyncio
import gc
import random
import warnings
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag

from .kernels import INC, SCALE


@pytest.mark.parametrize("device", ["host", pytest.param("cuda", marks=pytest.mark.cuda)])
async def test_cancellation_storm_loses_nothing(device: str, seed: int) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        await _storm(device, seed)
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


async def _storm(device: str, seed: int) -> None:
    rng = random.Random(seed)  # each worker's own, from its seed drawn here
    # 25,600 dispatches; cancelling at most 25 workers leaves at least 23,100.
    tasks_n, per_task = 256, 100
    async with ag.open_backend(device, streams=4, max_in_flight=64) as backend:
        counters = [await backend.upload(np.zeros(8, np.float32)) for _ in range(16)]
        every: list[ag.PendingDispatch] = []
        incs: list[tuple[int, ag.PendingDispatch]] = []  # each increment, by counter
        checked = 0

        async def worker(seed: int) -> int:
            nonlocal checked
            local = random.Random(seed)
            ok = 0
            for _ in range(per_task):
                which = local.randrange(3)
                if which == 0:
                    # Resident increments: every one must land, unless it was withdrawn (its
                    # awaiter cancelled while it was queued): then it never ran.
                    index = local.randrange(len(counters))
                    pending = backend.dispatch(
                        INC, counters[index], np.float32(1), np.int32(8), grid=1, block=8
                    )
                    incs.append((index, pending))
                else:
                    n = local.randrange(1, 2000)
                    x = np.full(n, local.random(), np.float32)
                    a = np.float32(local.randrange(1, 5))
                    pending = backend.dispatch(
                        SCALE, x, ag.Out(n, np.float32), a, np.int32(n), grid=8, block=256
                    )
                every.append(pending)
                if local.random() < 0.2:
                    # A timeout that may or may not fire first.
                    try:
                        results = await asyncio.wait_for(_await(pending), local.random() * 0.002)
                    except TimeoutError:
                        continue
                else:
                    results = await pending
                if which != 0 and results:
                    (out,) = results
                    assert np.array_equal(out, x * a)
                    checked += 1
                ok += 1
            return ok

        tasks = [asyncio.create_task(worker(rng.randrange(2**32))) for _ in range(tasks_n)]
        # Cancel a random tenth of the workers at random moments.
        for _ in range(tasks_n // 10):
            await asyncio.sleep(rng.random() * 0.01)
            rng.choice(tasks).cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        cancelled = sum(isinstance(o, asyncio.CancelledError) for o in outcomes)
        assert 0 < cancelled <= tasks_n // 10
        assert not [
            o
            for o in outcomes
            if isinstance(o, BaseException) and not isinstance(o, asyncio.CancelledError)
        ]
        # The dispatches whose awaiters went away complete, or were withdrawn before they
        # launched (docs/jobs.md); none may be lost.
        withdrawn = 0
        for pending in every:
            try:
                await pending
            except ag.WithdrawnError:
                withdrawn += 1
        snap = backend.telemetry.snapshot()
        assert snap.dispatches == snap.dispatches_completed + withdrawn
        assert snap.dispatches_failed == snap.dispatches_withdrawn == withdrawn
        increments = [0] * len(counters)
        for index, pending in incs:
            increments[index] += pending.exception() is None
        assert snap.dispatches >= 20_000
        assert checked > 10_000
        for buffer, expected in zip(counters, increments, strict=True):
            assert buffer._in_use == 0
            np.testing.assert_array_equal(await backend.download(buffer), np.full(8, expected))
        assert repr(backend).endswith("in_flight=0 queued=0 buffers=16>")
        if device == "cuda":
            gpu: Any = backend
            assert gpu.pinned_pool.statistics().bytes_in_use == 0
            assert gpu.device_memory.statistics().bytes_in_use == 0
            assert gpu.stream_pool.statistics().outstanding == (0, 0, 0, 0)
            assert gpu._cuda.device.reactor.pending == 0
            assert gpu._cuda.small.lent == 0


async def _await(pending: ag.PendingDispatch) -> tuple[Any, ...]:
    return await pending
