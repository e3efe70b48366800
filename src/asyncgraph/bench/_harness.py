"""What ``python -m asyncgraph bench`` and the scripts under ``benchmarks/`` (through
``benchmarks/harness.py``) both measure with, so that a row means the same wherever it is
printed: timing calls one at a time, percentiles, the event loops they run on, and the names of
the files they write."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

__all__ = (
    "Clock",
    "LoopFactory",
    "loop_factories",
    "percentile",
    "samples_async",
    "samples_sync",
    "slug",
)

Clock = Callable[[], float]
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


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


def loop_factories() -> dict[str, LoopFactory | None]:
    """The event loops at hand, by name: asyncio's, and uvloop's where it is installed.

    asyncio's factory is ``None``: :class:`asyncio.Runner` then makes asyncio's default loop.
    """
    factories: dict[str, LoopFactory | None] = {"asyncio": None}
    try:
        import uvloop
    except ImportError:
        return factories
    factories["uvloop"] = uvloop.new_event_loop
    return factories


def slug(name: str) -> str:
    """*name* as a file-name part: each run of characters other than letters, digits, ``.``,
    ``_`` and ``-`` becomes one ``-`` (``NVIDIA H100 80GB HBM3`` → ``NVIDIA-H100-80GB-HBM3``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "unknown"
