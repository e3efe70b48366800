"""Where the event loop's time goes while dispatches run: cProfile of two scenarios.

1. 300 dispatches issued while a long kernel occupies the only stream (dispatch() must not wait).
2. 64 tasks x 100 awaited round trips of 16 KiB, with a 0.5 ms heartbeat (the loop's stalls).

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

from tests.kernels import SCALE
from tests.test_cuda import SPIN

import asyncgraph as ag


def report(profile: cProfile.Profile, title: str) -> None:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(18)
    print(f"===== {title}")
    print("\n".join(out.getvalue().splitlines()[:40]))


async def gated() -> None:
    async with ag.open_backend("cuda", streams=1) as gpu:
        x = np.ones(1 << 16, np.float32)
        await gpu.compile(SCALE)
        await gpu.compile(SPIN)
        await asyncio.gather(
            *(
                gpu.dispatch(
                    SCALE,
                    x,
                    ag.Out(x.size, np.float32),
                    np.float32(2),
                    np.int32(x.size),
                    grid=x.size // 256,
                    block=256,
                )
                for _ in range(300)
            )
        )
        clock_khz = gpu._device.properties.clock_rate  # type: ignore[attr-defined]
        gate = gpu.dispatch(SPIN, np.int64(clock_khz * 1000), ag.Out(1, np.int32), grid=1, block=1)
        profile = cProfile.Profile()
        t0 = time.perf_counter()
        profile.enable()
        pendings = [
            gpu.dispatch(
                SCALE,
                x,
                ag.Out(x.size, np.float32),
                np.float32(2),
                np.int32(x.size),
                grid=x.size // 256,
                block=256,
            )
            for _ in range(300)
        ]
        profile.disable()
        print(
            f"300 dispatch() calls behind a 1 s kernel: {(time.perf_counter() - t0) * 1e3:.1f} ms;"
            f" gate done: {gate.done()}"
        )
        report(profile, "gated dispatch() calls")
        await gate
        await asyncio.gather(*pendings)


async def heartbeat_run() -> None:
    async with ag.open_backend("cuda") as gpu:
        stalls: list[tuple[float, float]] = []
        stop = asyncio.Event()

        async def heartbeat() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                await asyncio.sleep(0.0005)
                stalls.append((time.perf_counter() - t0 - 0.0005, t0))

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
        beat = asyncio.create_task(heartbeat())
        t_start = time.perf_counter()
        profile.enable()
        await asyncio.gather(*(worker() for _ in range(64)))
        profile.disable()
        stop.set()
        await beat
        elapsed = time.perf_counter() - t_start
        worst = sorted(stalls, reverse=True)[:5]
        print(
            f"6400 round trips in {elapsed * 1e3:.1f} ms; {len(stalls)} beats; "
            "worst stalls (ms, at ms):",
            [(round(s * 1e3, 2), round((t - t_start) * 1e3, 1)) for s, t in worst],
        )
        report(profile, "64 tasks x 100 round trips")


async def main() -> None:
    await gated()
    await heartbeat_run()


if __name__ == "__main__":
    asyncio.run(main())
