"""Graph replays on the fast path, on the CUDA backend over the stand-in driver: ``python -m
tests.fake_driver.replay_scenario`` prints what it observed as one JSON line
(``tests/test_fast_replays.py`` checks it on each core, with the streams running their work at
once or when they get to it).

The stand-in runs ``inc`` and ``scale`` on the host, so what the buffers and results hold shows
the order the work ran in. Each part runs on a backend with the fast path and on one without,
where the general path replays the same graphs.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
from typing import Any

import numpy as np

import asyncgraph as ag
from asyncgraph._cuda.core._choose import core
from tests.fake_driver import reset
from tests.kernels import FILL, INC, SCALE

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_fail_next.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
N = 256
CUDA_ERROR_INVALID_VALUE = 1


def _fast(gpu: Any) -> int:
    return int(gpu.telemetry.snapshot().fast_path_dispatches)


async def _calls(replay: Any, count: int = 20) -> float:
    """Calls of asyncgraph's own functions per awaited ``replay()``, from a deterministic
    profile (cProfile), each after a loop turn."""
    import cProfile
    import pstats

    ours = 0
    for _ in range(count):
        await asyncio.sleep(0)
        profile = cProfile.Profile()
        profile.enable()
        await replay()
        profile.disable()
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]  # its table
        ours += sum(nc for (name, _, _), (_, nc, *_) in stats.items() if "asyncgraph" in name)
    return ours / count


async def captured(gpu: Any) -> dict[str, Any]:
    """A captured graph replayed alone, after and before eager dispatches of its buffer, from
    many tasks at once, and with the event after its launch failing once."""
    buf = await gpu.upload(np.zeros(N, np.float32))
    async with gpu.capture() as cap:
        await cap.dispatch(INC, buf, np.float32(1), np.int32(N), grid=1, block=N)
        await cap.dispatch(INC, buf, np.float32(10), np.int32(N), grid=1, block=N)
    graph = cap.graph
    seen: dict[str, Any] = {}
    before = _fast(gpu)
    for _ in range(5):
        await graph.replay()
    seen["alone"] = float((await gpu.download(buf))[0])  # 5 x 11
    seen["alone_fast"] = _fast(gpu) - before
    seen["learned"] = graph.expected > 0.0
    # Not awaited in between: an eager fill, the replay, another fill, run in that order.
    first = gpu.dispatch(FILL, buf, np.float32(7), np.int64(N), grid=1, block=N)
    replay = asyncio.ensure_future(graph.replay())
    await asyncio.sleep(0)  # the replay's task launches it
    await first
    await replay
    seen["after_fill"] = float((await gpu.download(buf))[0])  # 7 + 11
    replay = asyncio.ensure_future(graph.replay())
    await asyncio.sleep(0)
    last = gpu.dispatch(FILL, buf, np.float32(3), np.int64(N), grid=1, block=N)
    await replay
    await last
    seen["before_fill"] = float((await gpu.download(buf))[0])  # 3
    before = _fast(gpu)
    await asyncio.gather(*(graph.replay() for _ in range(8)))
    seen["gathered"] = float((await gpu.download(buf))[0])  # 3 + 8 x 11
    seen["gathered_fast"] = _fast(gpu) - before
    _lib.fake_fail_next(b"record", 1, CUDA_ERROR_INVALID_VALUE)
    try:
        await graph.replay()
        seen["failed"] = None
    except Exception as exc:
        seen["failed"] = type(exc).__name__
    await graph.replay()  # usable again
    seen["after_failure"] = float((await gpu.download(buf))[0])  # + 11 (it ran), + 11
    seen["in_flight"] = gpu.telemetry.snapshot().in_flight
    seen["calls"] = await _calls(graph.replay)
    graph.close()
    await buf.aclose()
    return seen


async def recorded(gpu: Any) -> dict[str, Any]:
    """A recorded dispatch replayed with new inputs and scalars, one replay at a time, and the
    same from graph="always" dispatches."""
    rng = np.random.default_rng()
    x = rng.standard_normal(N).astype(np.float32)
    graph = await gpu.record(
        SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=1, block=N
    )
    seen: dict[str, Any] = {}
    before = _fast(gpu)
    right = True
    for scale in (2.0, 3.0, -1.5):
        x = rng.standard_normal(N).astype(np.float32)
        (y,) = await graph.replay(x, ag.Out(N, np.float32), np.float32(scale), np.int32(N))
        right = right and bool(np.array_equal(y, x * np.float32(scale)))
    seen["replays_right"] = right
    seen["replays_fast"] = _fast(gpu) - before
    inputs = [rng.standard_normal(N).astype(np.float32) for _ in range(6)]
    results = await asyncio.gather(
        *(graph.replay(v, ag.Out(N, np.float32), np.float32(4), np.int32(N)) for v in inputs)
    )
    seen["taking_turns_right"] = all(
        np.array_equal(y, v * np.float32(4)) for (y,), v in zip(results, inputs, strict=True)
    )
    before = _fast(gpu)
    replays = gpu.telemetry.snapshot().graph_replays
    hits = gpu.graph_cache.statistics().hits
    binds = gpu._plans.hits + gpu._plans.misses
    right = True
    for scale in (5, 5, 5, 5, 6, 6):  # a new scalar: its kernel node updated, the general way
        x = rng.standard_normal(N).astype(np.float32)
        (y,) = await gpu.dispatch(
            SCALE, x, ag.Out(N, np.float32), np.float32(scale), np.int32(N), grid=1, block=N,
            graph="always",
        )  # fmt: skip
        right = right and bool(np.array_equal(y, x * np.float32(scale)))
    seen["always_right"] = right
    seen["always_replays"] = gpu.telemetry.snapshot().graph_replays - replays
    seen["always_hits"] = gpu.graph_cache.statistics().hits - hits
    seen["always_binds"] = gpu._plans.hits + gpu._plans.misses - binds
    seen["always_fast"] = _fast(gpu) - before
    graph.close()
    return seen


async def batched(gpu: Any) -> dict[str, Any]:
    """A batcher with ``graph="always"`` and one bucket: its padded batches replay one cached
    graph, on the fast path once the cache routed it (``scale`` over a batch of scalars)."""
    batcher = ag.batcher(
        gpu, SCALE, inputs=[ag.Row((), np.float32)], outputs=[ag.Row((), np.float32)],
        shared=(np.float32(3),), launch=lambda n: ((n + 255) // 256, 256), max_size=8,
        buckets=(8,), graph="always",
    )  # fmt: skip
    rng = np.random.default_rng()

    async def batches(count: int) -> bool:
        right = True
        for _ in range(count):
            rows = rng.standard_normal(8).astype(np.float32)
            results = await asyncio.gather(*(batcher(row) for row in rows))
            right = right and all(y == row * 3 for (y,), row in zip(results, rows, strict=True))
        return right

    right = await batches(1)  # the graph recorded, and routed to the fast path
    before = gpu.telemetry.snapshot()
    binds = gpu._plans.hits + gpu._plans.misses
    launched = batcher.statistics().batches
    right = await batches(5) and right
    after = gpu.telemetry.snapshot()
    launched = batcher.statistics().batches - launched
    await batcher.aclose()
    return {
        "right": right,
        "replays": after.graph_replays - before.graph_replays,
        "fast": after.fast_path_dispatches - before.fast_path_dispatches,
        "binds": gpu._plans.hits + gpu._plans.misses - binds,
        "batches": launched,
    }


async def main() -> dict[str, Any]:
    seen: dict[str, Any] = {"compiled": core.COMPILED}
    for name, fast in (("fast", True), ("general", False)):
        async with ag.open_backend("cuda", fast_path_enabled=fast) as gpu:
            for kernel in (INC, SCALE, FILL):
                await gpu.compile(kernel)
            seen[name] = {
                "captured": await captured(gpu),
                "recorded": await recorded(gpu),
                "batched": await batched(gpu),
            }
    return seen


if __name__ == "__main__":
    reset(_lib)
    _lib.fake_set_complete_mode(b"instant")
    print(json.dumps(asyncio.run(main())))
