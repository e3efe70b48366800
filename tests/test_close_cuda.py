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


def test_a_later_loop_closes_a_cuda_backend_whose_loop_ended_with_work_in_flight() -> None:
    before = _waiters()
    n = 4 << 20  # 16 MiB of results
    x = np.random.default_rng().random(n, dtype=np.float32)

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
