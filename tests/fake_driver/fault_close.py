"""A CUDA backend (the stand-in driver) that faults while it holds 150 resident buffers, then
closes: ``python -m tests.fake_driver.fault_close`` prints what it saw as one JSON line, and
``tests/test_group_failures.py`` checks that nothing else was printed for its memory."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
from typing import Any

import numpy as np
import structlog

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE
from tests.fake_driver import reset

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_fail_next_events.argtypes = [ctypes.c_int, ctypes.c_int]
N = 1024


async def main() -> dict[str, Any]:
    seen: dict[str, Any] = {}
    x = np.ones(N, np.float32)
    with structlog.testing.capture_logs() as logs:
        gpu = ag.open_backend("cuda")
        buffers = [await gpu.upload(x) for _ in range(150)]
        _lib.fake_fail_next_events(1, 700)
        try:
            await gpu.dispatch(
                SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
            )
        except Exception as exc:
            seen["fault"] = type(exc).__name__
        await gpu.aclose()
        del buffers
        gc.collect()
    abandoned = [e for e in logs if e["event"] == "backend.memory_abandoned"]
    seen["abandoned_events"] = len(abandoned)
    seen["device_buffers"] = abandoned[0]["device_buffers"] if abandoned else 0
    seen["bytes"] = abandoned[0]["bytes"] if abandoned else 0
    return seen


if __name__ == "__main__":
    reset(_lib)
    _lib.fake_set_complete_mode(b"instant")
    print(json.dumps(asyncio.run(main())))
