"""Captured graphs updated in place, on the CUDA backend over the stand-in driver: ``python -m
tests.fake_driver.captured_scenario`` prints what it observed as one JSON line
(``tests/test_captured_graphs.py`` checks it on each core).

The stand-in runs the ``inc`` kernel on the host, so what a replay computed shows which scalar
each kernel node held.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
from typing import Any

import numpy as np

import asyncgraph as ag
from tests.fake_driver import reset
from tests.kernels import INC

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_live_graphs.restype = ctypes.c_long
N = 256


def _error(fn: Any) -> str | None:
    """The type and message of what *fn()* raised, or ``None``."""
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def updates(gpu: Any) -> dict[str, Any]:
    """``CapturedGraph.update``: new scalars by the quick check, other arguments bound."""
    buf = await gpu.upload(np.zeros(N, np.float32))
    other = await gpu.upload(np.zeros(N, np.float32))
    async with gpu.capture() as cap:
        first = await cap.dispatch(INC, buf, np.float32(1), np.int32(N), grid=1, block=N)
        await cap.dispatch(INC, buf, np.float32(10), np.int32(N), grid=1, block=N)
    graph = cap.graph
    await graph.replay()  # 1 + 10
    updates_before = gpu.telemetry.snapshot().graph_updates
    graph.update(first, buf, np.float32(100), np.int32(N))
    await graph.replay()  # 100 + 10
    graph.update(first, buf, np.float32(1000), np.int32(N // 2))  # half the buffer
    await graph.replay()  # 1000 + 10 on the first half, 10 on the second
    seen: dict[str, Any] = {}
    total = await gpu.download(buf)
    seen["first_half"] = float(total[0])
    seen["second_half"] = float(total[-1])
    seen["telemetry_updates"] = gpu.telemetry.snapshot().graph_updates - updates_before
    seen["updates"] = graph.updates
    # Not simply new scalars: checked as dispatch() checks them.
    seen["other_buffer"] = _error(lambda: graph.update(first, other, np.float32(1), np.int32(N)))
    seen["float64"] = _error(lambda: graph.update(first, buf, np.float64(1), np.int32(N)))
    seen["python_float"] = _error(lambda: graph.update(first, buf, 1.0, np.int32(N)))
    seen["too_few"] = _error(lambda: graph.update(first, buf, np.float32(1)))
    seen["not_ours"] = _error(lambda: graph.update("first", buf, np.float32(1), np.int32(N)))
    seen["updates_after_errors"] = graph.updates
    graph.close()
    seen["closed"] = _error(lambda: graph.update(first, buf, np.float32(1), np.int32(N)))
    await buf.aclose()
    await other.aclose()
    return seen


async def _chain(cap: Any, buf: Any, steps: list[float], out: Any = None) -> list[Any]:
    """Record ``inc`` on *buf* once per step (into *out* too, zeroed first, when given)."""
    recorded = []
    for step in steps:
        recorded.append(
            await cap.dispatch(INC, buf, np.float32(step), np.int32(N), grid=1, block=N)
        )
        if out is not None:
            await cap.dispatch(
                INC, ag.Out(into=out), np.float32(step), np.int32(N), grid=1, block=N
            )
    return recorded


async def recaptures(gpu: Any) -> dict[str, Any]:
    """``capture(into=graph)``: in place where the new capture has the same nodes, else a new
    executable graph; the graph runs what the last capture recorded either way."""
    seen: dict[str, Any] = {}
    buf = await gpu.upload(np.zeros(N, np.float32))
    other = await gpu.upload(np.zeros(N, np.float32))
    out = await gpu.upload(np.zeros(N, np.float32))
    live = _lib.fake_live_graphs()
    async with gpu.capture() as cap:
        old = await _chain(cap, buf, [1, 2, 3])
    graph = cap.graph
    await graph.replay()  # buf: 6
    # The same dispatches with other scalars and another buffer: updated in place.
    async with gpu.capture(into=graph) as again:
        new = await _chain(again, other, [10, 20, 30])
    seen["same_graph"] = again.graph is graph
    seen["in_place"] = (graph.recaptures, graph.updated_in_place)
    seen["live_graphs"] = _lib.fake_live_graphs() - live
    await graph.replay()  # other: 60; buf stays 6
    seen["after_in_place"] = [float((await gpu.download(b))[0]) for b in (buf, other)]
    seen["dispatches_are_new"] = graph.dispatches == new
    seen["old_dispatch"] = _error(lambda: graph.update(old[0], buf, np.float32(1), np.int32(N)))
    graph.update(new[1], other, np.float32(200), np.int32(N))  # the new dispatch's node
    await graph.replay()  # other: 60 + 10 + 200 + 30
    seen["updated_after_in_place"] = float((await gpu.download(other))[0])
    # The same buffers, new scalars: recorded again from the last capture, nothing bound.
    binds = gpu._plans.hits + gpu._plans.misses
    async with gpu.capture(into=graph) as repeat:
        again = await _chain(repeat, other, [1, 2, 3])
    seen["repeat_binds"] = gpu._plans.hits + gpu._plans.misses - binds
    seen["repeat_in_place"] = (graph.recaptures, graph.updated_in_place)
    await graph.replay()  # other: 300 + 6
    graph.update(again[2], other, np.float32(-3), np.int32(N))
    await graph.replay()  # other: 306 + 1 + 2 - 3
    seen["after_repeat"] = float((await gpu.download(other))[0])
    # A buffer closed since: bound, and refused as dispatch() refuses it.
    await other.aclose()

    async def stale() -> None:
        async with gpu.capture(into=graph) as closed:
            await _chain(closed, other, [1])

    try:
        await stale()
    except ag.StaleBufferError as exc:
        seen["stale"] = str(exc).split(";")[0]
    other = await gpu.upload(np.zeros(N, np.float32))
    async with gpu.capture(into=graph) as back:
        await _chain(back, other, [10, 20, 30])
    await graph.replay()
    seen["back"] = float((await gpu.download(other))[0])
    # Other nodes (two more dispatches, and memsets of the outputs): instantiated anew.
    async with gpu.capture(into=graph) as third:
        await _chain(third, buf, [1, 1], out)
    seen["instantiated"] = (graph.recaptures, graph.updated_in_place)
    seen["live_graphs_after"] = _lib.fake_live_graphs() - live
    await graph.replay()  # buf: 6 + 2; out: 1 (zeroed, then + 1 by the last)
    seen["after_new"] = [float((await gpu.download(b))[0]) for b in (buf, other, out)]
    # Foreign work in the capture: never in place (the k-th kernel node may not be ours).
    async with gpu.capture(into=graph) as foreign:
        await _chain(foreign, buf, [1, 1], out)
        # A kernel launched on the capture stream by other code than the backend's own.
        await _foreign_inc(gpu, foreign, other)
    seen["with_foreign"] = (graph.recaptures, graph.updated_in_place)
    seen["telemetry_captures"] = gpu.telemetry.snapshot().graph_captures
    seen["errors"] = {
        "not_a_graph": _error(lambda: gpu.capture(into="graph")),
        "closed": None,
    }
    async with ag.open_backend("cuda") as second:
        seen["errors"]["other_backend"] = _error(lambda: second.capture(into=graph))
    graph.close()
    seen["errors"]["closed"] = _error(lambda: gpu.capture(into=graph))
    seen["live_graphs_closed"] = _lib.fake_live_graphs() - live
    for b in (buf, other, out):
        await b.aclose()
    return seen


async def _foreign_inc(gpu: Any, cap: Any, buf: Any) -> None:
    """``inc`` on *buf* launched straight on ``cap.stream`` through the driver."""
    from cuda.bindings import driver as drv

    launcher = gpu._cuda.launches.launchers[INC]
    pointer = int(buf.__cuda_array_interface__["data"][0])
    launcher.launch_values([pointer, np.float32(1000), np.int32(N)], (1, 1, 1), (N, 1, 1), 0,
                           drv.CUstream(cap.stream.handle))  # fmt: skip


async def main() -> dict[str, Any]:
    async with ag.open_backend("cuda") as gpu:
        await gpu.compile(INC)
        return {"updates": await updates(gpu), "recaptures": await recaptures(gpu)}


if __name__ == "__main__":
    reset(_lib)
    _lib.fake_set_complete_mode(b"instant")
    print(json.dumps(asyncio.run(main())))
