"""Priority classes on a real GPU: each class's streams carry its CUDA priority, results match
numpy in every class, and a resident buffer's order holds across classes.

Every test here carries the ``cuda`` marker and is skipped, with the reason, where no GPU is
found. Inputs are fresh random data every run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as drv

import asyncgraph as ag
from asyncgraph._runtime._priority import PRIORITIES

from .kernels import SCALE

pytestmark = pytest.mark.cuda

N = 1 << 16

# Spins, then adds: the write comes long after the kernel started, so a reader on another
# stream that was not ordered after it reads the buffer as it was.
SLOW_INC = ag.Kernel(
    r"""
extern "C" __global__ void slow_inc(float* buf, float step, int n, long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) buf[i] += step;
}
""",
    "slow_inc",
)


def _priority(handle: Any) -> int:
    err, value = drv.cuStreamGetPriority(handle)
    assert err == drv.CUresult.CUDA_SUCCESS, err
    return int(value)


async def test_each_class_runs_on_streams_of_its_cuda_priority() -> None:
    async with ag.open_backend("cuda", options=ag.BackendOptions(streams=4)) as opened:
        gpu: Any = opened
        device = gpu._cuda.device
        device.device.set_current()  # the range is the current context's
        err, least, greatest = drv.cuCtxGetStreamPriorityRange()
        assert err == drv.CUresult.CUDA_SUCCESS, err
        by_class = {
            name: {_priority(lane.handle) for lane in device.class_lanes[rank]}
            for rank, name in enumerate(PRIORITIES)
        }
        assert by_class["high"] == {int(greatest)}
        assert by_class["low"] == {int(least)}
        (normal,) = by_class["normal"]
        assert min(least, greatest) <= normal <= max(least, greatest)
        assert len(device.class_lanes[PRIORITIES.index("normal")]) == 4
        if least != greatest:  # a device with a range: high above normal above or at low
            assert int(greatest) < int(least)  # the range runs backwards on NVIDIA GPUs
            assert int(greatest) < normal <= int(least)


async def test_every_class_computes_what_numpy_does(rng: np.random.Generator) -> None:
    async with ag.open_backend("cuda") as gpu:

        async def one(priority: str) -> None:
            x = rng.standard_normal(N, dtype=np.float32)
            a = np.float32(rng.uniform(-3, 3))
            (out,) = await gpu.dispatch(
                SCALE, x, ag.Out(N, np.float32), a, np.int32(N),
                grid=N // 256, block=256, priority=priority,
            )  # fmt: skip
            np.testing.assert_array_equal(out, x * a)

        await asyncio.gather(*(one(PRIORITIES[k % 3]) for k in range(90)))
        snapshot = gpu.telemetry.snapshot()
        assert snapshot.dispatches_failed == 0


@pytest.mark.parametrize(("writer", "reader"), [("low", "high"), ("high", "low")])
async def test_a_buffer_written_in_one_class_is_read_after_the_write_in_another(
    writer: str, reader: str, rng: np.random.Generator
) -> None:
    async with ag.open_backend("cuda") as opened:
        gpu: Any = opened
        await gpu.compile(SLOW_INC)
        await gpu.compile(SCALE)
        cycles = np.int64(gpu._cuda.device.device.properties.clock_rate * 50)  # about 50 ms
        for _ in range(3):
            start = rng.standard_normal(N, dtype=np.float32)
            step, a = np.float32(rng.uniform(1, 2)), np.float32(rng.uniform(-3, 3))
            buf = await gpu.upload(start)
            written = gpu.dispatch(
                SLOW_INC, buf, step, np.int32(N), cycles,
                grid=N // 256, block=256, priority=writer,
            )  # fmt: skip
            read = gpu.dispatch(
                SCALE, buf, ag.Out(N, np.float32), a, np.int32(N),
                grid=N // 256, block=256, priority=reader,
            )  # fmt: skip
            (out,) = await read
            await written
            np.testing.assert_array_equal(out, (start + step) * a)
            np.testing.assert_array_equal(await gpu.download(buf), start + step)
            await buf.aclose()
