"""Outputs are zero-filled on the device before the kernel runs, however they are zeroed.

Small outputs beside inputs are zeroed in pinned staging and go up with the inputs (one copy
instead of a copy and a memset); bigger ones, and outputs of a dispatch without inputs, are
zeroed by a memset on the device. Either way a kernel that writes part of its output must see
zeros in the rest, even where the staging memory last held another dispatch's results: each
test first fills the lanes' staging rings with non-zero results, then checks every unwritten
element, on the fast path and on the general path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._cuda.core._fast_plan import RING_BYTES

pytestmark = pytest.mark.cuda

PARTIAL = ag.Kernel(
    r"""
extern "C" __global__ void partial(const float* x, float* out, int m)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < m) out[i] = x[i] + 1.0f;
}
""",
    "partial",
)

WRITE_NOTHING = ag.Kernel(
    r"""
extern "C" __global__ void write_nothing(float* out, int n) { }
""",
    "write_nothing",
)

# 1 KiB and 4 KiB outputs go up zeroed with the inputs; 64 KiB and 1 MiB ones are memset.
SIZES = [256, 1024, 16 * 1024, 256 * 1024]
# More than every lane's staging ring together (BackendOptions.streams lanes by default).
LANES_STAGING = (ag.BackendOptions().streams + 1) * RING_BYTES


@pytest.fixture(params=[True, False], ids=["fast", "general"])
async def gpu(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    options = ag.BackendOptions(fast_path_enabled=request.param)
    async with ag.open_backend("cuda", options=options) as backend:
        yield backend


def _grid(n: int) -> int:
    return (n + 255) // 256


@pytest.mark.parametrize("n", SIZES)
async def test_unwritten_outputs_are_zero_after_full_ones(
    gpu: Any, n: int, rng: np.random.Generator
) -> None:
    rounds = max(40, LANES_STAGING // (8 * n))  # small ones wrap the rings
    for r in range(rounds):
        x = rng.standard_normal(n, dtype=np.float32)
        m = n if r % 2 == 0 else int(rng.integers(0, n))  # full, then partial, in turns
        (out,) = await gpu.dispatch(
            PARTIAL, x, ag.Out(n, np.float32), np.int32(m), grid=_grid(n), block=256
        )
        np.testing.assert_array_equal(out[:m], x[:m] + np.float32(1))
        assert not out[m:].any(), f"round {r}: {np.count_nonzero(out[m:])} stale elements"


async def test_many_at_once_keep_their_own_zeros(gpu: Any, rng: np.random.Generator) -> None:
    """Concurrent dispatches share the rings: none sees another's results."""
    n = 1024

    async def one(m: int) -> None:
        x = rng.standard_normal(n, dtype=np.float32)
        (out,) = await gpu.dispatch(
            PARTIAL, x, ag.Out(n, np.float32), np.int32(m), grid=_grid(n), block=256
        )
        np.testing.assert_array_equal(out[:m], x[:m] + np.float32(1))
        assert not out[m:].any()

    for _ in range(10):
        await asyncio.gather(*(one(n if i % 2 == 0 else i % n) for i in range(64)))


@pytest.mark.parametrize("n", [1024, 256 * 1024])
async def test_outputs_without_inputs_are_zero(gpu: Any, n: int, rng: np.random.Generator) -> None:
    for _ in range(40):
        x = rng.standard_normal(n, dtype=np.float32)
        await gpu.dispatch(PARTIAL, x, ag.Out(n, np.float32), np.int32(n), grid=_grid(n), block=256)
        (out,) = await gpu.dispatch(
            WRITE_NOTHING, ag.Out(n, np.float32), np.int32(n), grid=1, block=1
        )
        assert not out.any()


async def test_small_outputs_go_up_with_the_inputs(gpu: Any, rng: np.random.Generator) -> None:
    """One upload and no memset for a 4 KiB output beside a 4 KiB input: the bytes of both
    are counted up, the output's down."""
    n = 1024
    x = rng.standard_normal(n, dtype=np.float32)
    call = (PARTIAL, x, ag.Out(n, np.float32), np.int32(n))
    await gpu.dispatch(*call, grid=_grid(n), block=256)
    before = gpu.telemetry.snapshot()
    (out,) = await gpu.dispatch(*call, grid=_grid(n), block=256)
    after = gpu.telemetry.snapshot()
    np.testing.assert_array_equal(out, x + np.float32(1))
    assert (after.copies_up - before.copies_up, after.copies_down - before.copies_down) == (1, 1)
    assert after.bytes_up - before.bytes_up == 2 * x.nbytes
    assert after.bytes_down - before.bytes_down == x.nbytes
