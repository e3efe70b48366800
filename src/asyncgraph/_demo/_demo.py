"""The demo: three kernels of different shapes, many concurrent dispatches, every result checked.

The kernels are declared with CUDA source and a host implementation, so the demo runs on
whichever backend ``open_backend("auto")`` picks. Each result is checked against an independent
float64 numpy reference, not against the host implementation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from asyncgraph._args._arguments import Out
from asyncgraph._args._kernel import Kernel
from asyncgraph._opening._open import open_backend

if TYPE_CHECKING:
    from asyncgraph._front._backend import Backend

__all__ = ("BLOCK_SUM", "DEMO_KERNELS", "LAPLACE2D", "SAXPY", "DemoReport", "run_demo")

Array = np.ndarray[Any, Any]

SAXPY_SOURCE = r"""
extern "C" __global__ void saxpy(const float* x, const float* y, float* out, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a * x[i] + y[i];
    }
}
"""


def _saxpy_host(x: Array, y: Array, out: Array, a: np.float32, n: np.int32) -> None:
    np.add(a * x[:n], y[:n], out=out[:n])


SAXPY = Kernel(SAXPY_SOURCE, "saxpy", host=_saxpy_host)
"""``out = a * x + y`` over ``n`` float32 elements; launch ``grid=ceil(n/256), block=256``."""

BLOCK_SUM_SOURCE = r"""
#define BLOCK 256
extern "C" __global__ void __launch_bounds__(BLOCK) block_sum(const float* x, float* out, int n)
{
    __shared__ float partial[BLOCK];
    int i = blockIdx.x * BLOCK + threadIdx.x;
    partial[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int stride = BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            partial[threadIdx.x] += partial[threadIdx.x + stride];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x] = partial[0];
    }
}
"""
BLOCK = 256


def _block_sum_host(x: Array, out: Array, n: np.int32) -> None:
    count = int(n)
    blocks = out.shape[0]
    padded = np.zeros(blocks * BLOCK, dtype=np.float32)
    padded[:count] = x[:count]
    out[:] = padded.reshape(blocks, BLOCK).sum(axis=1, dtype=np.float32)


BLOCK_SUM = Kernel(BLOCK_SUM_SOURCE, "block_sum", host=_block_sum_host)
"""Sum of each 256-element block of ``x`` into ``out[block]``; launch ``block=256``."""

LAPLACE2D_SOURCE = r"""
extern "C" __global__ void laplace2d(const float* u, float* out, int h, int w)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row > 0 && row < h - 1 && col > 0 && col < w - 1) {
        int i = row * w + col;
        out[i] = u[i - w] + u[i + w] + u[i - 1] + u[i + 1] - 4.0f * u[i];
    }
}
"""


def _laplace2d_host(u: Array, out: Array, h: np.int32, w: np.int32) -> None:
    grid = u.reshape(int(h), int(w))
    res = out.reshape(int(h), int(w))
    res[1:-1, 1:-1] = (
        grid[:-2, 1:-1] + grid[2:, 1:-1] + grid[1:-1, :-2] + grid[1:-1, 2:] - 4.0 * grid[1:-1, 1:-1]
    )


LAPLACE2D = Kernel(LAPLACE2D_SOURCE, "laplace2d", host=_laplace2d_host)
"""5-point Laplacian of an ``h`` x ``w`` float32 grid (interior only; the border stays 0);
launch ``block=(16, 16)``, ``grid=(ceil(w/16), ceil(h/16))``."""

DEMO_KERNELS = (SAXPY, BLOCK_SUM, LAPLACE2D)


# -- references in float64, independent of the host implementations -------------------------


def saxpy_reference(x: Array, y: Array, a: float) -> Array:
    """float64 reference of :data:`SAXPY`."""
    return a * x.astype(np.float64) + y.astype(np.float64)


def block_sum_reference(x: Array, blocks: int) -> Array:
    """float64 reference of :data:`BLOCK_SUM`."""
    padded = np.zeros(blocks * BLOCK)
    padded[: x.size] = x
    sums: Array = padded.reshape(blocks, BLOCK).sum(axis=1)
    return sums


def laplace2d_reference(u: Array) -> Array:
    """float64 reference of :data:`LAPLACE2D`."""
    g = u.astype(np.float64)
    out = np.zeros_like(g)
    out[1:-1, 1:-1] = g[:-2, 1:-1] + g[2:, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:] - 4.0 * g[1:-1, 1:-1]
    return out


def relative_error(got: Array, want: Array) -> float:
    """``max|got - want| / max(1, max|want|)``, NaN-aware (NaN counts as infinite error)."""
    diff = np.abs(got.astype(np.float64) - want)
    if not np.all(np.isfinite(diff)):
        return float("inf")
    return float(diff.max(initial=0.0) / max(1.0, float(np.abs(want).max(initial=0.0))))


async def run_saxpy(backend: Backend, rng: np.random.Generator, n: int) -> float:
    """Dispatch :data:`SAXPY` on fresh random inputs; return its relative error."""
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    a = np.float32(rng.uniform(-4, 4))
    (out,) = await backend.dispatch(
        SAXPY, x, y, Out(n, np.float32), a, np.int32(n), grid=(n + 255) // 256, block=256
    )
    return relative_error(out, saxpy_reference(x, y, float(a)))


async def run_block_sum(backend: Backend, rng: np.random.Generator, n: int) -> float:
    """Dispatch :data:`BLOCK_SUM` on fresh random inputs; return its relative error."""
    x = rng.standard_normal(n, dtype=np.float32)
    blocks = (n + BLOCK - 1) // BLOCK
    (out,) = await backend.dispatch(
        BLOCK_SUM, x, Out(blocks, np.float32), np.int32(n), grid=blocks, block=BLOCK
    )
    return relative_error(out, block_sum_reference(x, blocks))


async def run_laplace2d(backend: Backend, rng: np.random.Generator, h: int, w: int) -> float:
    """Dispatch :data:`LAPLACE2D` on a fresh random grid; return its relative error."""
    u = rng.standard_normal((h, w), dtype=np.float32)
    (out,) = await backend.dispatch(
        LAPLACE2D,
        u,
        Out((h, w), np.float32),
        np.int32(h),
        np.int32(w),
        grid=((w + 15) // 16, (h + 15) // 16),
        block=(16, 16),
    )
    return relative_error(out, laplace2d_reference(u))


TOLERANCE = 1e-5


@attrs.frozen(kw_only=True)
class DemoReport:
    """What the demo did and measured."""

    backend: str
    dispatches: int
    mismatches: int
    worst_error: float
    seconds: float
    queue_wait_p50: float
    queue_wait_p99: float
    latency_p50: float
    latency_p99: float

    @property
    def rate(self) -> float:
        """Dispatches per second over the whole run."""
        return self.dispatches / self.seconds if self.seconds > 0 else 0.0


async def run_demo(backend: Backend, dispatches: int = 1200, seed: int | None = None) -> DemoReport:
    """Run *dispatches* concurrent dispatches of the three demo kernels and check every result.

    Args:
        backend: the backend to run on.
        dispatches: how many dispatches, split evenly over the three kernels.
        seed: seed for the random inputs (fresh entropy when ``None``).

    Returns:
        The report; ``mismatches`` counts results off by more than ``TOLERANCE``.
    """
    rng = np.random.default_rng(seed)
    jobs: list[Coroutine[Any, Any, float]] = []
    for i in range(dispatches):
        sub = np.random.default_rng(rng.integers(2**63))
        which = i % 3
        if which == 0:
            jobs.append(run_saxpy(backend, sub, int(sub.integers(1, 65_536))))
        elif which == 1:
            jobs.append(run_block_sum(backend, sub, int(sub.integers(1, 65_536))))
        else:
            h, w = (int(v) for v in sub.integers(3, 256, size=2))
            jobs.append(run_laplace2d(backend, sub, h, w))
    t0 = time.perf_counter()
    errors = await asyncio.gather(*jobs)
    seconds = time.perf_counter() - t0
    snap = backend.telemetry.snapshot()
    return DemoReport(
        backend=backend.name,
        dispatches=dispatches,
        mismatches=sum(1 for e in errors if not e <= TOLERANCE),
        worst_error=max(errors, default=0.0),
        seconds=seconds,
        queue_wait_p50=snap.queue_wait.quantile(0.5),
        queue_wait_p99=snap.queue_wait.quantile(0.99),
        latency_p50=snap.completion_latency.quantile(0.5),
        latency_p99=snap.completion_latency.quantile(0.99),
    )


async def demo_main(device: str | int = "auto", dispatches: int = 1200) -> DemoReport:
    """Open a backend on *device*, run the demo on it and close it."""
    async with open_backend(device) as backend:
        return await run_demo(backend, dispatches)
