"""How every benchmark measures: ``python -m asyncgraph bench`` and the scripts under
``benchmarks/`` alike, so that a figure means the same wherever it is printed.

- :func:`samples_sync` and :func:`samples_async` time a call many times, one by one, after a
  warm-up; :func:`time_sync` and :func:`time_async` return the median of those in µs (a few
  repetitions only in a :func:`smoke` run); :func:`percentile`, :func:`median` and
  :func:`median_us` summarise
  samples; :class:`Heartbeat` measures how long the event loop stalls while work runs.
- :func:`loop_factories` lists the event loops at hand (asyncio, and uvloop where installed),
  :func:`loop_factory` names one, :func:`run` runs a coroutine on one and :func:`run_on_loops`
  runs a benchmark's rows on each.

What a benchmark prints and writes (tables, verdicts, the environment, JSON) is in
``_bench_results``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from asyncgraph._runtime._exceptions import UnsupportedError

__all__ = (
    "SMOKE_ENV",
    "SMOKE_REPS",
    "UVLOOP_MISSING",
    "Clock",
    "Heartbeat",
    "LoopFactory",
    "loop_factories",
    "loop_factory",
    "median",
    "median_us",
    "percentile",
    "run",
    "run_on_loops",
    "samples_async",
    "samples_sync",
    "smoke",
    "time_async",
    "time_async_in_turns",
    "time_sync",
)

T = TypeVar("T")
Clock = Callable[[], float]
LoopFactory = Callable[[], asyncio.AbstractEventLoop]

# Set by the scripts' ``--smoke`` (and inherited by their child processes): every timing of
# time_sync and time_async runs a few repetitions only, to check that a script runs.
SMOKE_ENV = "ASYNCGRAPH_BENCH_SMOKE"
SMOKE_REPS = 3
UVLOOP_MISSING = "uvloop is not installed: its rows are left out"


def smoke() -> bool:
    """Whether this is a smoke run (:data:`SMOKE_ENV` set, not ``"0"``): a check that a
    benchmark works, not a measure."""
    return os.environ.get(SMOKE_ENV, "") not in ("", "0")


# -- timing ------------------------------------------------------------------------------------


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


def median(values: Iterable[float]) -> float:
    """The median of *values*: their :func:`percentile` 50.

    Raises:
        ValueError: there are none.
    """
    return percentile(list(values), 50)


def median_us(samples: Iterable[float]) -> float:
    """The :func:`median` of *samples* (seconds), in µs."""
    return median(samples) * 1e6


def _smoke_sized(reps: int, warmup: int) -> tuple[int, int]:
    return (min(reps, SMOKE_REPS), min(warmup, 1)) if smoke() else (reps, warmup)


def time_sync(
    fn: Callable[[], object], reps: int, warmup: int = 100, *, clock: Clock = time.perf_counter
) -> float:
    """Calls *fn* *warmup* times, then times *reps* calls one by one; returns the median µs.

    In a :func:`smoke` run, at most :data:`SMOKE_REPS` calls and one warm-up.
    """
    reps, warmup = _smoke_sized(reps, warmup)
    return median_us(samples_sync(fn, reps, warmup, clock))


async def time_async(
    fn: Callable[[], Awaitable[object]],
    reps: int,
    warmup: int = 100,
    *,
    clock: Clock = time.perf_counter,
) -> float:
    """Awaits *fn()* *warmup* times, then times *reps* awaits one by one; returns the median µs.

    In a :func:`smoke` run, at most :data:`SMOKE_REPS` awaits and one warm-up.
    """
    reps, warmup = _smoke_sized(reps, warmup)
    return median_us(await samples_async(fn, reps, warmup, clock))


async def time_async_in_turns(
    fns: Mapping[str, Callable[[], Awaitable[object]]],
    reps: int,
    warmup: int = 100,
    *,
    sync: Mapping[str, Callable[[], object]] | None = None,
    turns: int = 10,
    clock: Clock = time.perf_counter,
) -> dict[str, float]:
    """Awaits each of *fns* *warmup* times, then times *reps* awaits of each in *turns* turns
    (each turn a share of every one's awaits, in an order that reverses from turn to turn),
    so that the machine's drift (a GPU's clocks rising, say) weighs on them alike; returns
    each one's median µs, by name. The functions of *sync* (peers that block) are called,
    not awaited, in the same turns, after *fns*.

    In a :func:`smoke` run, at most :data:`SMOKE_REPS` awaits each, one warm-up, one turn.

    Raises:
        ValueError: a name is both in *fns* and in *sync*.
    """
    blocking = dict(sync or {})
    if both := fns.keys() & blocking.keys():
        raise ValueError(f"{sorted(both)} named in fns and in sync; give each way one name")
    reps, warmup = _smoke_sized(reps, warmup)
    turns = max(1, min(turns, reps)) if not smoke() else 1
    order = [*fns, *blocking]
    samples: dict[str, list[float]] = {name: [] for name in order}
    for fn in fns.values():
        for _ in range(warmup):
            await fn()
    for call in blocking.values():
        samples_sync(call, 0, warmup)
    for turn in range(turns):
        share = reps * (turn + 1) // turns - reps * turn // turns
        for name in order if turn % 2 == 0 else reversed(order):
            if name in blocking:
                samples[name].extend(samples_sync(blocking[name], share, 0, clock))
            else:
                samples[name].extend(await samples_async(fns[name], share, 0, clock))
    return {name: median_us(values) for name, values in samples.items()}


class Heartbeat:
    """Measures the event loop's stalls while its ``async with`` block runs.

    A task sleeps *period* seconds in a loop and records how late each wake-up came.

    Attributes:
        stalls: seconds past *period* of each beat, in order.
        started: ``time.perf_counter()`` at the start of each beat, in the same order.
    """

    def __init__(self, period: float = 0.0005) -> None:
        self.period = period
        self.stalls: list[float] = []
        self.started: list[float] = []
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def worst(self) -> float:
        """The longest stall in seconds (0 before any beat)."""
        return max(self.stalls, default=0.0)

    async def __aenter__(self) -> Heartbeat:
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._beat(self._stop))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._stop is not None and self._task is not None:
            self._stop.set()
            await self._task

    async def _beat(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(self.period)
            self.stalls.append(time.perf_counter() - t0 - self.period)
            self.started.append(t0)


# -- event loops -------------------------------------------------------------------------------


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


def loop_factory(name: str) -> LoopFactory | None:
    """The factory of the event loop *name*: ``None`` for asyncio's default loop.

    Raises:
        UnsupportedError: *name* is ``"uvloop"`` and uvloop is not installed, or not a loop.
    """
    factories = loop_factories()
    if name in factories:
        return factories[name]
    if name == "uvloop":
        raise UnsupportedError(
            "--loop uvloop needs uvloop, which is not installed: pip install uvloop, "
            "or use --loop asyncio"
        )
    raise UnsupportedError(f"loop={name!r}; choose 'asyncio' or 'uvloop'")


def run(main: Coroutine[Any, Any, T], loop: str = "asyncio") -> T:
    """Runs *main* to completion on a new event loop of the kind named, and returns its result.

    Args:
        main: the coroutine to run.
        loop: ``"asyncio"`` or ``"uvloop"``.

    Raises:
        UnsupportedError: the loop named is not installed or not known (:func:`loop_factory`;
            *main* is closed unrun).
    """
    try:
        factory = loop_factory(loop)
    except UnsupportedError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def run_on_loops(
    rows: Callable[[str], Coroutine[Any, Any, Mapping[str, T]]],
) -> tuple[dict[str, T], tuple[str, ...]]:
    """Runs ``rows(loop_name)`` on asyncio, then on uvloop where it is installed.

    Where uvloop is not installed, prints :data:`UVLOOP_MISSING`.

    Returns:
        The rows of every run, merged in order, and the names of the loops that ran.
    """
    factories = loop_factories()
    if "uvloop" not in factories:
        print(UVLOOP_MISSING)
    merged: dict[str, T] = {}
    for name in factories:
        merged.update(run(rows(name), name))
    return merged, tuple(factories)
