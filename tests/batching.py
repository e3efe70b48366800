"""What the batcher tests share: the batch kernel of ``docs/batching.md`` with a host function
that records (and may hold, or fail) each batch, a batcher of it, each caller's row and its
answer, callers in cancel scopes of their own, and a wait on counts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np

import asyncgraph as ag

Array = np.ndarray[Any, Any]
F = 4  # features per row
HOUR = 3600.0

# The batch kernel of docs/batching.md: y[i] = a * x[i] + bias, for each of the n rows.
AFFINE_SRC = r"""
extern "C" __global__ void affine_rows(const float* x, float* y, const float* bias, float a,
                                       int features, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * features) y[i] = a * x[i] + bias[i % features];
}
"""


class Affine:
    """The host function: records each batch (n and its x), may hold it, fails on a poison row."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: list[tuple[int, Array]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def __call__(
        self, x: Array, y: Array, bias: Array, a: np.float32, features: np.int32, n: np.int32
    ) -> None:
        rows, f = int(n), int(features)
        xs = x.reshape(rows, f)
        with self.lock:
            self.batches.append((rows, xs.copy()))
        self.started.set()
        self.release.wait(10)
        if (xs[:, 0] == -1).any():
            raise ValueError("poison row")
        np.add(a * xs, bias.reshape(f), out=y.reshape(rows, f))


BIAS = np.arange(F, dtype=np.float32)
A = np.float32(2.0)


def make(
    backend: ag.Backend,
    host: Affine,
    *,
    max_size: int = 8,
    max_delay: float = HOUR,
    policy: str = "fixed_delay",
    **kw: Any,
) -> ag.Batcher:
    """The batcher of docs/batching.md; by default one that launches only full batches (or
    flushed ones): an hour's delay, the fixed-delay policy."""
    kernel = ag.Kernel(AFFINE_SRC, "affine_rows", host=host)
    return ag.batcher(
        backend, kernel,
        inputs=[ag.Row((F,), np.float32)], outputs=[ag.Row((F,), np.float32)],
        shared=(BIAS, A, np.int32(F)),
        launch=lambda n: ((n * F + 255) // 256, 256),
        max_size=max_size, max_delay=max_delay, policy=policy, **kw,
    )  # fmt: skip


def row(i: int) -> Array:
    return np.full(F, i, np.float32) + np.arange(F, dtype=np.float32) / 10


def want(i: int) -> Array:
    return A * row(i) + BIAS


class Callers:
    """Callers of *batch* with ``row(i)``, each in a cancel scope of its own: what each got
    (``got[i]``) and its scope (``scopes[i]``)."""

    def __init__(self, batch: ag.Batcher) -> None:
        self.batch = batch
        self.got: dict[int, Array] = {}
        self.scopes: dict[int, anyio.CancelScope] = {}

    async def call(self, i: int) -> None:
        with anyio.CancelScope() as self.scopes[i]:
            (self.got[i],) = await self.batch(row(i))


async def until(condition: Callable[[], bool]) -> None:
    """Wait until *condition()* holds (counters of the batcher, a thread's event)."""
    with anyio.fail_after(10):
        while not condition():  # polls plain counters: no event to await
            await anyio.lowlevel.checkpoint()


TWO_SRC = r"""
extern "C" __global__ void two_rows(const float* a, const float* b, float* c, float* d, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = 2.0f * a[i];
    if (i < n * 6) d[i] = b[i] + a[i / 6];
}
"""


def _two_rows(a: Array, b: Array, c: Array, d: Array, n: np.int32) -> None:
    rows = int(n)
    a1, c1 = a.reshape(rows), c.reshape(rows)
    np.multiply(a1, 2.0, out=c1)
    np.add(b.reshape(rows, 2, 3), a1[:, None, None], out=d.reshape(rows, 2, 3))


def make_two(backend: ag.Backend, *, max_delay: float) -> ag.Batcher:
    """A batcher of two inputs and two outputs: a value per item (``a``) and a 2 x 3 block
    (``b``); it answers ``2 * a`` and ``b + a``, up to 4 items a batch."""
    return ag.batcher(
        backend, ag.Kernel(TWO_SRC, "two_rows", host=_two_rows),
        inputs=[ag.Row((), np.float32), ag.Row((2, 3), np.float32)],
        outputs=[ag.Row((), np.float32), ag.Row((2, 3), np.float32)],
        launch=lambda n: ((n * 6 + 255) // 256, 256), max_size=4, max_delay=max_delay,
    )  # fmt: skip
