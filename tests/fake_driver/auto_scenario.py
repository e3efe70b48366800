"""``dispatch(graph="auto")`` measuring eager dispatches against replays, on the CUDA backend over
the stand-in driver: ``python -m tests.fake_driver.auto_scenario`` prints what it observed as
one JSON line (``tests/test_graph_choice.py`` checks it on each core).

The stand-in's host costs (``fake_set_host_cost``) make one way far dearer than the other, so
which way is cheaper is never a near thing: a replay 2 ms dearer (graphs lose), then every
eager kernel launch 2 ms dearer (graphs win); and graphs winning, then losing once the
choice is measured again.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
from typing import Any

import numpy as np

import asyncgraph as ag
from asyncgraph._cuda.core._choose import core
from asyncgraph.capture._choice import REMEASURE_AFTER
from tests.fake_driver import reset
from tests.kernels import INC, SCALE

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_set_host_cost.argtypes = [ctypes.c_char_p, ctypes.c_double]
N = 1024
DEAR_US = 2000.0  # host time added to one way: far more than either costs on the stand-in
ROUNDS = 30  # dispatches of each signature: enough to measure both ways and settle


def _choices(gpu: Any) -> list[dict[str, Any]]:
    return [
        {
            "choice": c.choice,
            "reason": c.reason,
            "eager": c.eager_samples,
            "graph": c.graph_samples,
            "remeasured": c.remeasured,
        }
        for c in gpu.graph_cache.statistics().choices
    ]


async def _round_trips(gpu: Any, x: np.ndarray[Any, Any], scale: float) -> bool:
    """ROUNDS awaited 4 KiB round trips with graph="auto"; whether each result was right."""
    right = True
    for _ in range(ROUNDS):
        (y,) = await gpu.dispatch(
            SCALE, x, ag.Out(N, np.float32), np.float32(scale), np.int32(N), grid=4, block=256,
            graph="auto",
        )  # fmt: skip
        right = right and bool(np.array_equal(y, x * np.float32(scale)))
    return right


async def graphs_lose(gpu: Any) -> dict[str, Any]:
    """Replays cost 2 ms more: "auto" settles on eager, frees its graphs and, once settled,
    dispatches take the fast path (where the backend has one) or run as plain dispatches,
    without asking the graph cache (no more misses)."""
    _lib.fake_set_host_cost(b"graph_launch", DEAR_US)
    x = np.arange(N, dtype=np.float32)
    right = await _round_trips(gpu, x, 2.0)
    before = gpu.telemetry.snapshot().fast_path_dispatches
    misses = gpu.graph_cache.statistics().misses
    right = right and await _round_trips(gpu, x, 3.0)
    fast = gpu.telemetry.snapshot().fast_path_dispatches - before
    stats = gpu.graph_cache.statistics()
    # A resident buffer, updated in place: the same choice, with the buffers' order kept.
    buf = await gpu.upload(np.zeros(N, np.float32))
    for _ in range(ROUNDS):
        gpu.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256, graph="auto")
    total = await gpu.download(buf)
    await buf.aclose()
    _lib.fake_set_host_cost(b"graph_launch", 0.0)
    return {
        "right": right,
        "choices": _choices(gpu),
        "fast_after": fast,
        "misses_after": stats.misses - misses,
        "bytes": stats.bytes,
        "instances": stats.instances,
        "captures": stats.captures,
        "chose_eager": stats.chose_eager,
        "resident_total": float(total[0]),
        "resident_right": bool((total == ROUNDS).all()),
    }


async def graphs_win(gpu: Any) -> dict[str, Any]:
    """Every eager kernel launch costs 2 ms more: "auto" settles on graphs and replays them."""
    gpu.graph_cache.clear()
    _lib.fake_set_host_cost(b"launch", DEAR_US)
    x = np.arange(N, dtype=np.float32)
    right = await _round_trips(gpu, x, 2.0)
    hits = gpu.graph_cache.statistics().hits
    right = right and await _round_trips(gpu, x, -1.5)  # a new scalar: updated in place
    stats = gpu.graph_cache.statistics()
    _lib.fake_set_host_cost(b"launch", 0.0)
    return {
        "right": right,
        "choices": _choices(gpu),
        "hits_after": stats.hits - hits,
        "updates": stats.updates,
        "chose_graph": stats.chose_graph,
        "instances": stats.instances,
    }


async def graphs_win_then_lose(gpu: Any, always_first: bool = False) -> dict[str, Any]:
    """Graphs win, then replays turn 2 ms dearer: after REMEASURE_FIRST replays "auto" measures
    again, settles on eager and frees its graphs. *always_first*: the signature's graph is
    recorded by graph="always" dispatches first ("auto" adopts it)."""
    gpu.graph_cache.clear()
    _lib.fake_set_host_cost(b"launch", DEAR_US)
    x = np.arange(N, dtype=np.float32)
    for _ in range(3 if always_first else 0):
        await gpu.dispatch(
            SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256,
            graph="always",
        )  # fmt: skip
    right = await _round_trips(gpu, x, 2.0)
    won = _choices(gpu)
    _lib.fake_set_host_cost(b"launch", 0.0)
    _lib.fake_set_host_cost(b"graph_launch", DEAR_US)
    rounds = 0
    while gpu.graph_cache.statistics().chose_graph and rounds < 2 * REMEASURE_AFTER:
        right = right and await _round_trips(gpu, x, 2.0)
        rounds += ROUNDS
    before = gpu.telemetry.snapshot().fast_path_dispatches
    right = right and await _round_trips(gpu, x, 2.0)
    fast = gpu.telemetry.snapshot().fast_path_dispatches - before
    stats = gpu.graph_cache.statistics()
    _lib.fake_set_host_cost(b"graph_launch", 0.0)
    return {
        "right": right,
        "won": won,
        "choices": _choices(gpu),
        "rounds": rounds,
        "hits": stats.hits,
        "fast_after": fast,
        "bytes": stats.bytes,
        "instances": stats.instances,
    }


async def never_and_always(gpu: Any) -> dict[str, Any]:
    """Dispatches with graph="never" and "always" keep to it whatever "auto" chose."""
    gpu.graph_cache.clear()
    _lib.fake_set_host_cost(b"graph_launch", DEAR_US)
    x = np.arange(N, dtype=np.float32)
    await _round_trips(gpu, x, 2.0)  # "auto" settles on eager
    hits = gpu.graph_cache.statistics().hits
    for _ in range(3):
        await gpu.dispatch(
            SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256,
            graph="always",
        )  # fmt: skip
    always_hits = gpu.graph_cache.statistics().hits - hits
    replays = gpu.telemetry.snapshot().graph_replays
    for _ in range(3):
        await gpu.dispatch(
            SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
        )
    _lib.fake_set_host_cost(b"graph_launch", 0.0)
    return {
        "always_hits": always_hits,
        "never_replays": gpu.telemetry.snapshot().graph_replays - replays,
    }


def _cleared(gpu: Any) -> list[dict[str, Any]]:
    """The choices once ``graph_cache.clear()`` forgot them."""
    gpu.graph_cache.clear()
    return _choices(gpu)


async def main() -> dict[str, Any]:
    seen: dict[str, Any] = {}
    async with ag.open_backend("cuda") as gpu:
        await gpu.compile(SCALE)
        await gpu.compile(INC)
        seen["lose"] = await graphs_lose(gpu)
        seen["win"] = await graphs_win(gpu)
        seen["win_lose"] = await graphs_win_then_lose(gpu)
        seen["always_win_lose"] = await graphs_win_then_lose(gpu, always_first=True)
        seen["modes"] = await never_and_always(gpu)
        seen["cleared"] = _cleared(gpu)
    async with ag.open_backend("cuda", fast_path_enabled=False) as gpu:
        await gpu.compile(SCALE)
        await gpu.compile(INC)
        seen["lose_general"] = await graphs_lose(gpu)
        seen["win_general"] = await graphs_win(gpu)
        seen["win_lose_general"] = await graphs_win_then_lose(gpu)
    return seen


if __name__ == "__main__":
    reset(_lib)
    _lib.fake_set_complete_mode(b"instant")
    print(json.dumps({"compiled": bool(core.COMPILED)} | asyncio.run(main())))
