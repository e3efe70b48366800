"""Device groups of CUDA backends on one GPU: two backends of one device, device-to-device
copies (``backend.copy``, ``group.copy_to``, ``group.replicate``), and a GPU member's fault
that stays its own.

Groups of two GPUs run the same code with ``cuMemcpyPeerAsync`` between the contexts; the
stand-in driver covers that path in CI (``test_copy.py``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE
from asyncgraph._demo._spin_kernel import SPIN

from .kernels import INC

pytestmark = pytest.mark.cuda

N = 1 << 20
CHILD = Path(__file__).with_name("_group_fault_child.py")


@pytest.fixture
async def pair() -> AsyncIterator[Any]:
    async with ag.open_group(["cuda:0", "cuda:0"]) as group:
        await group.compile(INC)
        await group.compile(SCALE)
        yield group


def _inc(target: Any, buffer: ag.ResidentBuffer, times: int = 1) -> list[ag.PendingDispatch]:
    n = buffer.shape[0]
    return [
        target.dispatch(INC, buffer, np.float32(1), np.int32(n), grid=(n + 255) // 256, block=256)
        for _ in range(times)
    ]


async def test_two_backends_of_one_device_share_the_work(
    pair: Any, rng: np.random.Generator
) -> None:
    xs = [rng.standard_normal(4096, dtype=np.float32) for _ in range(64)]
    results = await asyncio.gather(
        *(
            pair.dispatch(
                SCALE, x, ag.Out(4096, np.float32), np.float32(2), np.int32(4096),
                grid=16, block=256,
            )
            for x in xs
        )
    )  # fmt: skip
    assert all(np.array_equal(r[0], 2 * x) for r, x in zip(results, xs, strict=True))
    counts = [m.telemetry.snapshot().dispatches for m in pair]
    assert all(c > 0 for c in counts), counts


async def test_copy_reads_what_the_writers_in_flight_wrote(
    pair: Any, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(N, dtype=np.float32)
    source = await pair.upload(x, pair[0])
    writes = _inc(pair[0], source, 20)  # in flight when the copy starts
    copied = await pair.copy_to(source, pair[1])
    assert pair.member_of(copied) is pair[1]
    expected = x.copy()
    for _ in range(20):
        expected += np.float32(1)
    await asyncio.gather(*writes)
    assert np.array_equal(await pair.download(copied), expected)
    assert pair[1].telemetry.snapshot().buffer_copies == 1
    assert pair[1].telemetry.snapshot().buffer_copy_bytes == x.nbytes


async def test_a_writer_after_the_copy_waits_for_it(pair: Any, rng: np.random.Generator) -> None:
    x = rng.standard_normal(N, dtype=np.float32)
    source = await pair.upload(x, pair[0])
    gate = await pair.upload(np.zeros(1, np.int32), pair[0])
    # A long kernel on the source's member keeps its streams busy; the copy goes on the
    # target's stream, and the increments after it must not overtake it.
    spinning = pair[0].dispatch(SPIN, np.int64(20_000_000), gate, grid=1, block=1)
    copy = asyncio.ensure_future(pair.copy_to(source, pair[1]))
    await asyncio.sleep(0)
    writes = _inc(pair[0], source, 5)
    copied = await copy
    await asyncio.gather(spinning, *writes)
    assert np.array_equal(await pair.download(copied), x)
    expected = x.copy()
    for _ in range(5):
        expected += np.float32(1)
    assert np.array_equal(await pair.download(source), expected)


async def test_copy_within_one_backend_and_to_the_host(pair: Any, rng: np.random.Generator) -> None:
    x = rng.standard_normal(4096, dtype=np.float32)
    source = await pair[0].upload(x)
    twin = await pair[0].copy(source)
    assert twin is not source
    await asyncio.gather(*_inc(pair[0], twin))
    assert np.array_equal(await pair[0].download(source), x)
    assert np.array_equal(await pair[0].download(twin), x + np.float32(1))
    async with ag.open_backend("host") as host:
        on_host = await pair[0].copy(source, to=host)
        assert np.array_equal(await host.download(on_host), x)


async def test_replicate_uploads_once_and_copies_on_the_device(
    pair: Any, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(N, dtype=np.float32)
    up = [m.telemetry.snapshot().bytes_up for m in pair]
    replicated = await pair.replicate(x)
    for member in pair:
        assert np.array_equal(await member.download(replicated.on(member)), x)
    grew = [m.telemetry.snapshot().bytes_up - u for m, u in zip(pair, up, strict=True)]
    assert sorted(grew) == [0, x.nbytes], grew
    await replicated.aclose()


def test_a_gpu_members_fault_leaves_the_host_member_serving() -> None:
    done = subprocess.run(
        [sys.executable, str(CHILD)], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["before_ok"] is True
    assert report["fault"] == "DeviceFaultError", report
    assert report["after_errors"] == [], report
    assert report["on_host"] == 100, report
    assert report["after_ok"] is True
    assert report["failed"] == [[0, "cuda:0"]], report
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in report["why"], report
    assert len(report["abandoned_events"]) == 1, report
    assert "mr.deallocate() failed" not in done.stderr
