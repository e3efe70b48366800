"""The cost of ``ActorPool.run`` beside a plain Ray async-actor call with the same arguments.

On a local Ray (one fake GPU), one actor each: a plain async actor whose method returns its
argument, and an ``asyncgraph.ray`` pool whose pipeline returns its argument. Both are awaited
one at a time from asyncio, interleaved, with a 4 KiB and a 1 MiB float32 array; the table
gives the median round trip of each and the median ratio of the pairs (issue 17's target: the
pool at most 1.2x the plain call).
A third row runs one 4 KiB dispatch on the actor's backend inside the pipeline (beside the
plain 4 KiB echo, for scale only).

    python benchmarks/bench_ray.py [--reps N] [--json [PATH]]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from benchmarks.harness import (
    arguments,
    median,
    median_us,
    print_table,
    print_targets,
    python_version,
    verdicts,
    write_json,
)
from benchmarks.ray_pipelines import echo, scale_once


class Plain:
    """A plain async actor: what the pool is compared with."""

    async def echo(self, x: Any) -> Any:
        await asyncio.sleep(0)
        return x


async def _pair(first: Any, second: Any, reps: int) -> tuple[float, float, float]:
    """Median µs of each call and the median ratio second/first, the two interleaved (their
    order alternating), so the machine's drift falls on both alike."""
    for _ in range(max(20, reps // 10)):
        await first()
        await second()
    a, b, ratios = [], [], []
    for rep in range(reps):
        times = {}
        for name, call in (
            (("a", first), ("b", second)) if rep % 2 else (("b", second), ("a", first))
        ):
            t0 = time.perf_counter()
            await call()
            times[name] = time.perf_counter() - t0
        a.append(times["a"])
        b.append(times["b"])
        ratios.append(times["b"] / times["a"])
    return median_us(a), median_us(b), median(ratios)


async def _rows(reps: int, device: str) -> list[tuple[str, float, float, float | str]]:
    import ray

    from asyncgraph.ray import open_actor_pool

    plain: Any = ray.remote(Plain).options(num_gpus=1).remote()
    rows: list[tuple[str, float, float, float | str]] = []
    async with open_actor_pool(1, device=device, num_gpus=0) as pool:
        for label, nbytes in (("4 KiB array", 4 << 10), ("1 MiB array", 1 << 20)):
            x = np.random.default_rng().standard_normal(nbytes // 4).astype(np.float32)
            raw, ours, ratio = await _pair(
                lambda x=x: plain.echo.remote(x), lambda x=x: pool.run(echo, x), reps
            )
            rows.append((f"echo, {label}", raw, ours, ratio))
        x = np.random.default_rng().standard_normal(1024).astype(np.float32)
        raw, ours, _ = await _pair(
            lambda: plain.echo.remote(x), lambda: pool.run(scale_once, x), reps
        )
        rows.append(("pool: one 4 KiB dispatch inside (not a like-for-like row)", raw, ours, "—"))
    ray.kill(plain)
    return rows


def main() -> None:
    parser = arguments(__doc__, reps=500, reps_help="timed round trips per row")
    parser.add_argument("--device", default="host", help="the pool's backends (default host)")
    options = parser.parse_args()
    import ray

    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        rows = asyncio.run(_rows(options.reps, options.device))
    finally:
        ray.shutdown()
    print_table(["row", "plain Ray call µs", "pool.run µs", "ratio"], rows, [".0f", ".0f", ".2f"])
    # Issue 17's target, for the like-for-like rows: the pool at most 1.2x the plain call.
    targets = {
        f"pool.run / plain Ray call, {row} (median ratio) <= 1.2": ratio
        for row, _, _, ratio in rows
        if isinstance(ratio, float)
    }
    print()
    print_targets(targets, ".2f")
    write_json(
        {
            "device": options.device,
            "python": python_version(),
            "ray": ray.__version__,
            "rows": [{"row": r, "plain_us": a, "pool_us": b, "ratio": c} for r, a, b, c in rows],
            "targets": targets,
            "verdicts": verdicts(targets),
        },
        options.json,
        script=__file__,
        device=f"{options.device} backend",
    )


if __name__ == "__main__":
    main()
