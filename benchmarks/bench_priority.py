"""High-priority 4 KiB round trips beside low-priority work that fills the GPU, with and
without priority classes.

The low class keeps the GPU full: spin kernels (``asyncgraph._demo._spin_kernel.SPIN``) of many
blocks, enough of them in flight that at least 100 ms of work is queued at any time. Each block
spins ``--block-us`` (20 µs by default), and each kernel has as many waves of blocks as fill the
GPU for ``--spin-ms``: a stream priority orders blocks and never preempts a running one, so a
high-priority kernel waits for a running low-priority block to end (``--block-us 20000`` shows
what kernels of long blocks cost it). Beside
it, one task makes 4 KiB round trips (a scale kernel), one at a time. Each way is timed in
turns (with priorities: the round trips ``"high"``, the spin kernels ``"low"``; without: both
of the default class), and, in each turn, the round trips on an idle GPU and the low class
alone. Per way: the round trips' p50 and p99, the p99 against the idle GPU's, and the low
class's throughput (spin kernels completed a second) against alone.
The GPU figures come from a GPU run (``docs/jobs.md``); CI runs it at smoke size on the
stand-in driver, where the kernels take no time.

    python benchmarks/bench_priority.py [--reps N] [--turns N] [--spin-ms MS] [--block-us US]
                                        [--json [PATH]]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE
from asyncgraph._demo._spin_kernel import SPIN
from benchmarks import harness

N = 1024  # float32 elements: 4 KiB
QUEUED_MS = 100.0  # low-priority work queued at any time, at least
THREADS = 128  # threads of each spin kernel's block
_WINDOW_S = 2.0  # each turn lasts at least this long, for the low class's throughput


def _gpu() -> tuple[float, int]:
    """The GPU's clock (Hz) and how many spin blocks it runs at once."""
    from cuda.core import Device

    props = Device(0).properties
    per_sm = props.max_threads_per_multiprocessor // THREADS
    return float(props.clock_rate) * 1e3, props.multiprocessor_count * per_sm


async def _turn(
    backend: ag.Backend,
    high: str | None,
    low: str | None,
    reps: int,
    spin: tuple[int, int],
    depth: int,
) -> tuple[list[float], float]:
    """One turn: *depth* spin kernels of class *low* kept in flight (*spin*: each one's cycles
    a block and blocks); round trips of class *high*, one at a time, at least *reps* of them
    (none with *reps* 0) and for at least ``_WINDOW_S``. Their latencies, and the spin kernels
    completed a second (from the first completion to the last)."""
    cycles, blocks = spin
    stop = asyncio.Event()
    ends: list[float] = []

    async def fill() -> None:
        in_flight: set[asyncio.Future[Any]] = set()
        while not stop.is_set():
            while len(in_flight) < depth:
                p = backend.dispatch(
                    SPIN,
                    np.int64(cycles),
                    ag.Out(1, np.int32),
                    grid=blocks,
                    block=THREADS,
                    priority=low,
                )
                in_flight.add(asyncio.ensure_future(_await(p)))
            finished, in_flight = await asyncio.wait(in_flight, return_when="FIRST_COMPLETED")
            ends.extend(time.perf_counter() for _ in finished)
        await asyncio.gather(*in_flight)

    rng = np.random.default_rng()
    window = 0.05 if harness.smoke() else _WINDOW_S
    filler = asyncio.ensure_future(fill()) if depth else None
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    latencies: list[float] = []
    while reps and (len(latencies) < reps or time.perf_counter() - t0 < window):
        x = rng.standard_normal(N, dtype=np.float32)
        start = time.perf_counter()
        (out,) = await backend.dispatch(
            SCALE,
            x,
            ag.Out(N, np.float32),
            np.float32(2),
            np.int32(N),
            grid=4,
            block=256,
            priority=high,
        )
        latencies.append(time.perf_counter() - start)
        if not np.array_equal(out, 2 * x):
            raise SystemExit("a round trip's result differs from numpy's")
    if not reps:
        await asyncio.sleep(window)
    stop.set()
    measured = len(ends)  # those that completed before the turn ended
    if filler is not None:
        await filler
    span = ends[measured - 1] - ends[0] if measured > 1 else 0.0
    return latencies, (measured - 1) / span if span else 0.0


async def _await(p: ag.PendingDispatch) -> None:
    await p


async def measure(reps: int, turns: int, spin_ms: float, block_us: float) -> dict[str, Any]:
    async with ag.open_backend("cuda") as backend:
        await backend.compile(SPIN)
        await backend.compile(SCALE)
        clock_hz, at_once = _gpu()
        block_us = min(block_us, spin_ms * 1e3)
        waves = max(1, round(spin_ms * 1e3 / block_us))
        spin = (int(clock_hz * block_us / 1e6), waves * at_once)
        depth = max(2, int(QUEUED_MS / spin_ms) + 1)
        ways = {"with priorities": ("high", "low"), "without": (None, None)}
        lat: dict[str, list[float]] = {way: [] for way in ways}
        idle: list[float] = []  # the same round trips on an idle GPU
        rate: dict[str, list[float]] = {**{way: [] for way in ways}, "low alone": []}
        for _ in range(turns):
            idle += (await _turn(backend, "high", None, reps, spin, 0))[0]
            for way, (high, low) in ways.items():
                samples, per_s = await _turn(backend, high, low, reps, spin, depth)
                lat[way] += samples
                rate[way].append(per_s)
            rate["low alone"].append((await _turn(backend, None, "low", 0, spin, depth))[1])
    alone = harness.median(rate["low alone"])
    idle_p99 = harness.percentile(idle, 99)
    rows = {
        way: {
            "high_p50_us": harness.percentile(lat[way], 50) * 1e6,
            "high_p99_us": harness.percentile(lat[way], 99) * 1e6,
            "high_p99_vs_idle": harness.percentile(lat[way], 99) / idle_p99 if idle_p99 else 0.0,
            "low_per_s": harness.median(rate[way]),
            "low_vs_alone": harness.median(rate[way]) / alone if alone else 0.0,
        }
        for way in ways
    }
    mixed, plain = rows["with priorities"], rows["without"]
    return {
        "targets": {
            "high p99 / its p99 on an idle GPU, with priorities <= 2": mixed["high_p99_vs_idle"],
            "low class's throughput / alone, with priorities >= 0.9": mixed["low_vs_alone"],
            "(info) high p99 / its p99 on an idle GPU, without": plain["high_p99_vs_idle"],
        },
        "spin_ms": spin_ms,
        "block_us": block_us,
        "depth": depth,
        "blocks": spin[1],
        "low_alone_per_s": alone,
        "idle_high_p50_us": harness.percentile(idle, 50) * 1e6,
        "idle_high_p99_us": idle_p99 * 1e6,
        "ways": rows,
    }


def main() -> None:
    parser = harness.arguments(__doc__, reps=500, reps_help="round trips per turn and way")
    parser.add_argument("--turns", type=int, default=5, help="turns of each way (default 5)")
    parser.add_argument("--spin-ms", type=float, default=20.0, help="ms each spin kernel runs")
    parser.add_argument(
        "--block-us", type=float, default=20.0, help="µs each spin block runs (default 20)"
    )
    options = parser.parse_args()
    turns = 1 if options.smoke else options.turns
    results = asyncio.run(measure(options.reps, turns, options.spin_ms, options.block_us))
    device = harness.device_name()
    harness.print_table(
        ["way", "high p50 µs", "high p99 µs", "p99 vs idle", "low /s", "low vs alone"],
        [
            [
                way,
                r["high_p50_us"],
                r["high_p99_us"],
                r["high_p99_vs_idle"],
                r["low_per_s"],
                r["low_vs_alone"],
            ]
            for way, r in results["ways"].items()
        ],
        [".1f", ".1f", ".2f", ".1f", ".2f"],
    )
    print(
        f"\n{device}; spin kernels of {results['blocks']} blocks of {results['block_us']:g} µs, "
        f"{results['depth']} in flight; idle GPU: high p50 {results['idle_high_p50_us']:.1f} µs, "
        f"p99 {results['idle_high_p99_us']:.1f} µs; low alone "
        f"{results['low_alone_per_s']:.1f} /s; {harness.cpu()}"
    )
    harness.write_json({"device": device, **results}, options.json, script=__file__, device=device)


if __name__ == "__main__":
    main()
