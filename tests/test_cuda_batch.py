"""The batcher on a GPU: rows staged in pinned memory, one dispatch per batch, each caller's
rows right against numpy, with and without buckets (``graph="auto"`` replays a graph per
bucket). The semantics (cancellation, failures, closing) are in ``test_batch.py``, on the
host backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag

pytestmark = pytest.mark.cuda

F = 64  # features per row
AFFINE = ag.Kernel(
    r"""
extern "C" __global__ void affine_rows(const float* x, float* y, const float* bias, float a,
                                       int features, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * features) y[i] = a * x[i] + bias[i % features];
}
""",
    "affine_rows",
)


@pytest.fixture
async def gpu() -> AsyncIterator[Any]:
    async with ag.open_backend("cuda") as backend:
        await backend.compile(AFFINE)
        yield backend


@pytest.mark.parametrize("buckets", [None, (4, 8)])
async def test_concurrent_callers_get_their_rows(
    gpu: Any, buckets: Any, rng: np.random.Generator
) -> None:
    bias = rng.standard_normal(F, dtype=np.float32)
    resident_bias = await gpu.upload(bias)
    a = np.float32(1.5)
    batcher = ag.batcher(
        gpu, AFFINE,
        inputs=[ag.Row((F,), np.float32)], outputs=[ag.Row((F,), np.float32)],
        shared=(resident_bias, a, np.int32(F)),
        launch=lambda n: ((n * F + 255) // 256, 256),
        max_size=8, max_delay=0.002, buckets=buckets,
        graph="auto" if buckets else "never",
    )  # fmt: skip
    xs = [rng.standard_normal(F, dtype=np.float32) for _ in range(64 + 3)]
    async with batcher:
        results = await asyncio.gather(*(batcher(x) for x in xs))
    for x, (y,) in zip(xs, results, strict=True):
        assert y.shape == (F,)
        np.testing.assert_allclose(y, a * x + bias, rtol=1e-6, atol=1e-6)
    stats = batcher.statistics()
    assert stats.items == len(xs)
    assert stats.batches >= len(xs) // 8
    if buckets:
        # 67 items in batches padded to 4 or 8 rows: at least one padding row was added, and
        # none of them reached a caller (each caller's row is checked above).
        assert stats.padded_rows >= 1
    else:
        assert stats.padded_rows == 0
    await resident_bias.aclose()


async def test_many_puts_a_callers_rows_in_one_batch(gpu: Any, rng: np.random.Generator) -> None:
    bias = rng.standard_normal(F, dtype=np.float32)
    resident_bias = await gpu.upload(bias)
    a = np.float32(-0.5)
    batcher = ag.batcher(
        gpu, AFFINE,
        inputs=[ag.Row((F,), np.float32)], outputs=[ag.Row((F,), np.float32)],
        shared=(resident_bias, a, np.int32(F)),
        launch=lambda n: ((n * F + 255) // 256, 256),
        max_size=8,
    )  # fmt: skip
    async with batcher:
        one = rng.standard_normal(F, dtype=np.float32)
        (y,) = await batcher(one)  # a batch of one: the next idle caller would go alone
        np.testing.assert_allclose(y, a * one + bias, rtol=1e-6, atol=1e-6)
        for k in (3, 8, 11):
            x = rng.standard_normal((k, F), dtype=np.float32)
            (ys,) = await batcher.many(x)
            assert ys.shape == (k, F)
            np.testing.assert_allclose(ys, a * x + bias, rtol=1e-6, atol=1e-6)
    stats = batcher.statistics()
    assert (stats.items, stats.batches) == (1 + 3 + 8 + 11, 1 + 1 + 1 + 2)
    await resident_bias.aclose()
