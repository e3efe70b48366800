"""Where the event loop's time goes while dispatches run: cProfile of two scenarios.

1. 3,000 awaited dispatches of an empty kernel, one after another.
2. 64 tasks x 100 awaited round trips of 16 KiB, with a 0.5 ms heartbeat (the loop's stalls).
3. The same with asyncio's debug mode naming every callback that ran over 2 ms.

Prints the functions with the most own time, and the stalls. Run on a GPU:
    python benchmarks/profile_dispatch.py
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgraph as ag
from benchmarks import harness
from benchmarks.bench_dispatch import EMPTY, SCALE


def report(profile: cProfile.Profile, title: str) -> None:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(18)
    print(f"===== {title}")
    print("\n".join(out.getvalue().splitlines()[:40]))


async def sequential_empty() -> None:
    """cProfile of 3,000 awaited dispatches of an empty kernel, one at a time."""
    async with ag.open_backend("cuda") as gpu:
        await gpu.compile(EMPTY)
        n1 = np.int32(1)
        for _ in range(500):
            await gpu.dispatch(EMPTY, n1, grid=1, block=1)
        profile = cProfile.Profile()
        t0 = time.perf_counter()
        profile.enable()
        for _ in range(3000):
            await gpu.dispatch(EMPTY, n1, grid=1, block=1)
        profile.disable()
        print(
            f"3000 awaited empty dispatches: {(time.perf_counter() - t0) / 3000 * 1e6:.1f} us "
            "each (under cProfile)"
        )
        report(profile, "sequential awaited empty kernel")


async def heartbeat_run() -> None:
    async with ag.open_backend("cuda") as gpu:

        async def worker() -> None:
            x = np.ones(4096, np.float32)
            for _ in range(100):
                await gpu.dispatch(
                    SCALE,
                    x,
                    ag.Out(4096, np.float32),
                    np.float32(2),
                    np.int32(4096),
                    grid=16,
                    block=256,
                )

        await gpu.compile(SCALE)
        await asyncio.gather(*(worker() for _ in range(64)))
        profile = cProfile.Profile()
        async with harness.Heartbeat() as beat:
            t_start = time.perf_counter()
            profile.enable()
            await asyncio.gather(*(worker() for _ in range(64)))
            profile.disable()
        elapsed = time.perf_counter() - t_start
        worst = sorted(zip(beat.stalls, beat.started, strict=True), reverse=True)[:5]
        print(
            f"6400 round trips in {elapsed * 1e3:.1f} ms; {len(beat.stalls)} beats; "
            "worst stalls (ms, at ms):",
            [(round(s * 1e3, 2), round((t - t_start) * 1e3, 1)) for s, t in worst],
        )
        report(profile, "64 tasks x 100 round trips")


async def slow_callbacks() -> None:
    """asyncio's own report of callbacks over 2 ms while 64 tasks run round trips."""
    import logging

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("asyncio").addHandler(Keep())
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.002
    async with ag.open_backend("cuda") as gpu:

        async def worker() -> None:
            x = np.ones(4096, np.float32)
            for _ in range(100):
                await gpu.dispatch(
                    SCALE,
                    x,
                    ag.Out(4096, np.float32),
                    np.float32(2),
                    np.int32(4096),
                    grid=16,
                    block=256,
                )

        await gpu.compile(SCALE)
        await asyncio.gather(*(worker() for _ in range(64)))
        records.clear()
        await asyncio.gather(*(worker() for _ in range(64)))
    loop.set_debug(False)
    print(f"===== callbacks over 2 ms (asyncio debug): {len(records)}")
    for message in records[:8]:
        print("  ", message[:300])


async def main() -> None:
    await sequential_empty()
    await heartbeat_run()
    await slow_callbacks()


if __name__ == "__main__":
    harness.arguments(__doc__, results=False).parse_args()
    harness.run(main())
