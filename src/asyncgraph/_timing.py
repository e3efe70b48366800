"""Timing calls one at a time, and percentiles: what ``python -m asyncgraph bench`` and the
scripts under ``benchmarks/`` (through ``benchmarks/harness.py``) both measure with, so that a
row means the same wherever it is printed."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

__all__ = ("Clock", "percentile", "samples_async", "samples_sync")

Clock = Callable[[], float]


def samples_sync(
    fn: Callable[[], object], reps: int, warmup: int, clock: Clock = time.perf_counter
) -> list[float]:
    """Call *fn* *warmup* times, then time *reps* calls one by one: each one's seconds."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        start = clock()
        fn()
        samples.append(clock() - start)
    return samples


async def samples_async(
    fn: Callable[[], Awaitable[object]], reps: int, warmup: int, clock: Clock = time.perf_counter
) -> list[float]:
    """Await *fn()* *warmup* times, then time *reps* awaits one by one: each one's seconds."""
    for _ in range(warmup):
        await fn()
    samples = []
    for _ in range(reps):
        start = clock()
        await fn()
        samples.append(clock() - start)
    return samples


def percentile(samples: Sequence[float] | np.ndarray[Any, Any], q: float) -> float:
    """The *q*-th percentile (0 to 100) of *samples*, interpolated between the nearest two as
    ``numpy.percentile`` does (``q=100`` is the largest).

    Raises:
        ValueError: *samples* is empty, or *q* is outside 0 to 100.
    """
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"q={q!r}; a percentile is between 0 and 100")
    return float(np.percentile(values, q))
