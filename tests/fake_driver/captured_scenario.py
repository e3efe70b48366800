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


async def main() -> dict[str, Any]:
    async with ag.open_backend("cuda") as gpu:
        await gpu.compile(INC)
        return {"updates": await updates(gpu)}


if __name__ == "__main__":
    reset(_lib)
    _lib.fake_set_complete_mode(b"instant")
    print(json.dumps(asyncio.run(main())))
