"""What the dispatch paths leave to the cycle collector, on the stand-in driver.

``python -m tests.fake_driver.cycles_scenario`` runs, with the collector off, the ways work goes
through a backend (small and large round trips, graph replays, resident buffers, uploads,
downloads and copies), then collects and prints as one JSON line the pinned pool's misses and
the objects of asyncgraph's that only the collector could free (``tests/test_cycles.py`` checks
it). An object the collector has to free lives until it runs: a job that keeps its result so
holds the result's pinned block, and each dispatch after it allocates a block of its own.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections import Counter
from typing import Any

import numpy as np

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE
from asyncgraph._cuda.core._choose import core
from tests.kernels import FILL

N = 1024
BIG = 1 << 20  # float32: 4 MiB results, which come back in pinned memory the arrays own
ROUNDS = 4


def _ours(thing: Any) -> str | None:
    """The name of *thing* if it is asyncgraph's (an instance of its classes, or its function),
    else ``None``."""
    if callable(thing) and getattr(thing, "__module__", "").startswith("asyncgraph"):
        return f"function {thing.__qualname__}"
    kind = type(thing)
    if kind.__module__.startswith("asyncgraph"):
        return f"{kind.__module__}.{kind.__qualname__}"
    return None


async def work(gpu: Any) -> dict[str, Any]:
    """Each way through the backend, :data:`ROUNDS` times, every result dropped at once."""
    seen: dict[str, Any] = {}
    pool = gpu.pinned_pool
    x = np.arange(N, dtype=np.float32)
    a, n = np.float32(2), np.int32(N)
    for graph in ("never", "always"):
        for _ in range(ROUNDS):
            (y,) = await gpu.dispatch(
                SCALE, x, ag.Out(N, np.float32), a, n, grid=4, block=256, graph=graph
            )
            assert float(y[1]) == 2.0
            del y
    before = pool.statistics()
    for i in range(ROUNDS):
        (big,) = await gpu.dispatch(
            FILL, ag.Out(BIG, np.float32), np.float32(i), np.int64(BIG), grid=BIG // 256, block=256
        )
        assert float(big[-1]) == i
        del big
    after = pool.statistics()
    seen["big_results_misses"] = after.misses - before.misses
    buffer = await gpu.upload(x)
    target = gpu.empty(N, np.float32)
    for _ in range(ROUNDS):
        await gpu.dispatch(SCALE, buffer, ag.Out(into=target), a, n, grid=4, block=256)
        assert float((await gpu.download(target))[1]) == 2.0
        twin = await gpu.copy(target)
        assert float((await gpu.download(twin))[1]) == 2.0
        del twin
    return seen


async def main() -> dict[str, Any]:
    seen: dict[str, Any] = {"compiled": bool(core.COMPILED)}
    async with ag.open_backend("cuda") as gpu:
        await gpu.compile(SCALE)
        await gpu.compile(FILL)
        await work(gpu)  # warm: plans made, graphs captured, blocks in the pool
        gc.collect()
        gc.disable()
        try:
            seen.update(await work(gpu))
            await asyncio.sleep(0)
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            names = (_ours(thing) for thing in gc.garbage)
            seen["garbage"] = dict(Counter(name for name in names if name is not None))
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
