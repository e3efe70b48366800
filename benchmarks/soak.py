"""Soak: a million awaited dispatches on one GPU, watching memory for growth.

16 tasks dispatch in a loop (three of four are an empty kernel, one of four a 4 KiB round trip
whose result is checked against numpy). Every ``--every`` dispatches the script samples host RSS,
the pinned pool's bytes (in use and idle), device bytes (dispatch memory, scratch and the
memory pool's reserve) and the CUDA events created. It reports the slope of each after the
warm-up (the first 10 % of samples), in bytes per 100,000 dispatches (target: flat), and the
latency percentiles of all awaits, p99.9 included.

Run on a GPU:  python benchmarks/soak.py --json [PATH]
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgraph as ag
from benchmarks import harness
from benchmarks.bench_dispatch import EMPTY, SCALE

TASKS = 16
N = 1024  # float32 elements: 4 KiB


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def sample(gpu: Any, done: int) -> dict[str, int]:
    """What the backend holds now, through its public statistics."""
    pinned = gpu.pinned_pool.statistics()
    device = gpu.device_memory.statistics()
    return {
        "dispatches": done,
        "rss": rss_bytes(),
        "pinned": pinned.bytes_in_use + pinned.bytes_idle,
        "device": device.bytes_in_use + device.bytes_reserved,
        "pool_reserved": device.pool_bytes_reserved or 0,
        "events": gpu.event_statistics().created,
    }


def slope_per_100k(samples: list[dict[str, int]], key: str) -> float:
    x = np.array([s["dispatches"] for s in samples], float)
    y = np.array([s[key] for s in samples], float)
    if len(x) < 2 or np.ptp(x) == 0:
        return 0.0
    return float(np.polyfit(x, y, 1)[0] * 100_000)


async def soak(total: int, every: int) -> dict[str, Any]:
    # Written in full now, so its pages are resident before the first sample (np.zeros would
    # map them as they are first written, which reads as RSS growth).
    latencies = np.full(total, -1.0)
    samples: list[dict[str, int]] = []
    count = 0
    wrong = 0
    async with ag.open_backend("cuda") as backend:
        gpu: Any = backend
        await gpu.compile(EMPTY)
        await gpu.compile(SCALE)
        n1 = np.int32(1)
        samples.append(sample(gpu, 0))
        next_sample = every

        async def worker(seed: int) -> None:
            nonlocal count, wrong, next_sample
            rng = np.random.default_rng(seed)
            x = rng.standard_normal(N, dtype=np.float32)
            out = ag.Out(N, np.float32)
            a, n = np.float32(2), np.int32(N)
            k = 0
            while count < total:
                index = count
                count += 1
                k += 1
                t0 = time.perf_counter()
                if k % 4:
                    await gpu.dispatch(EMPTY, n1, grid=1, block=1)
                else:
                    (result,) = await gpu.dispatch(SCALE, x, out, a, n, grid=4, block=256)
                    wrong += not np.array_equal(result, x * a)
                latencies[index] = time.perf_counter() - t0
                if count >= next_sample:
                    next_sample += every
                    samples.append(sample(gpu, count))

        t_start = time.perf_counter()
        await asyncio.gather(*(worker(seed) for seed in range(TASKS)))
        elapsed = time.perf_counter() - t_start
        samples.append(sample(gpu, count))
        snap = gpu.telemetry.snapshot()
        device_name = gpu.device_name
    after = samples[len(samples) // 10 :]
    us = latencies[:count] * 1e6
    return {
        "device": device_name,
        "dispatches": count,
        "tasks": TASKS,
        "seconds": elapsed,
        "dispatches_per_s": count / elapsed,
        "wrong_results": wrong,
        "failed": snap.dispatches_failed,
        "latency_us": {
            q: harness.percentile(us, p)
            for q, p in (("p50", 50), ("p99", 99), ("p99.9", 99.9), ("max", 100))
        },
        "slope_bytes_per_100k_after_warmup": {
            key: slope_per_100k(after, key) for key in ("rss", "pinned", "device", "pool_reserved")
        },
        "events_slope_per_100k_after_warmup": slope_per_100k(after, "events"),
        "change_after_warmup": {
            key: after[-1][key] - after[0][key]
            for key in ("rss", "pinned", "device", "pool_reserved", "events")
        },
        "samples": samples,
    }


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("--dispatches", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=10_000)
    args = parser.parse_args()
    result = harness.run(soak(args.dispatches, args.every))
    print(f"device: {result['device']}")
    print(
        f"{result['dispatches']:,} dispatches from {TASKS} tasks in {result['seconds']:.1f} s "
        f"({result['dispatches_per_s']:,.0f}/s); wrong results {result['wrong_results']}, "
        f"failed {result['failed']}"
    )
    print("latency us: " + ", ".join(f"{k} {v:.1f}" for k, v in result["latency_us"].items()))
    change = result["change_after_warmup"]
    slopes: list[tuple[str, object, int]] = [
        (key, slope, change[key])
        for key, slope in result["slope_bytes_per_100k_after_warmup"].items()
    ]
    events = result["events_slope_per_100k_after_warmup"]
    slopes.append(("events", f"{events:.2f}", change["events"]))
    harness.print_table(("after warm-up", "slope B/100k", "change B"), slopes, (".1f", ","))
    harness.write_json(result, args.json, script=__file__, device=result["device"])
    sys.exit(1 if result["wrong_results"] or result["failed"] else 0)


if __name__ == "__main__":
    main()
