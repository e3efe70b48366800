"""Scenarios where the order of the streams' work matters, for the stand-in's deferred mode.

``python -m tests.fake_driver.order_scenario NAME [planted]`` runs one on the CUDA backend over
the stand-in (``FAKE_CUDA_STREAMS`` says whether its streams run their work when it is enqueued
or when they get to it) and prints what it saw as one JSON line; ``tests/test_deferred.py``
runs them on each dispatch core, in both modes.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import asyncgraph as ag
from asyncgraph._bench import SCALE
from asyncgraph.cuda import _small
from asyncgraph.cuda._cores import core
from tests.fake_driver import reset
from tests.kernels import INC

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_run_streams.restype = ctypes.c_long
_lib.fake_queued_ops.restype = ctypes.c_long
_lib.fake_stream_waits.restype = ctypes.c_long
_lib.fake_stream_waits.argtypes = [ctypes.POINTER(ctypes.c_long)]
_lib.fake_fail_next.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
N = 1024


def _mode(mode: str) -> None:
    _lib.fake_set_complete_mode(mode.encode())


def _waits() -> int:
    enqueued = ctypes.c_long()
    _lib.fake_stream_waits(ctypes.byref(enqueued))
    return enqueued.value


def _scale(gpu: Any, x: Any) -> Any:
    """``out = 2 * x``, *x* a resident buffer or an array."""
    return gpu.dispatch(
        SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
    )


def _inc(gpu: Any, buffer: Any) -> Any:
    """``buffer += 1``."""
    return gpu.dispatch(INC, buffer, np.float32(1), np.int32(N), grid=4, block=256)


async def _settle() -> None:
    """Let the loop run the reactor's polls a few times."""
    for _ in range(5):
        await asyncio.sleep(0)


async def missing_wait(planted: bool = False) -> dict[str, Any]:
    """Two dispatches read a buffer on two streams, then a third writes it on another: the
    writer's stream must wait for both readers' events. With *planted* the waits are left out
    (the bug). The readers must see the buffer as it was before the writer."""
    if planted:
        vars(_small)["wait_deps"] = lambda deps, lane: None  # the planted bug
    rng = np.random.default_rng()
    x = rng.standard_normal(N, dtype=np.float32)
    async with ag.open_backend("cuda") as gpu:
        for kernel in (SCALE, INC):
            await gpu.compile(kernel)
        buf = await gpu.upload(x)
        for _ in range(2):  # plans made: the readers take the fast path
            await _scale(gpu, buf)
        waits_before = _waits()
        _mode("manual")  # nothing runs until the streams are run below
        readers = [_scale(gpu, buf) for _ in range(2)]
        writer = _inc(gpu, buf)
        await _settle()
        queued = _lib.fake_queued_ops()
        _lib.fake_run_streams(1)  # the newest work first: what a missing wait lets through
        _mode("instant")
        outs = [(await reader)[0] for reader in readers]
        await writer
        after = await gpu.download(buf)
        await buf.aclose()
        return {
            "readers_right": [bool(np.array_equal(out, 2 * x)) for out in outs],
            "writer_right": bool(np.array_equal(after, x + 1)),
            "queued": queued,
            "waits": _waits() - waits_before,
            "fast": gpu.telemetry.snapshot().fast_path_dispatches,
        }


SCENARIOS: dict[str, Callable[..., Any]] = {"missing_wait": missing_wait}

if __name__ == "__main__":
    reset(_lib)
    _mode("instant")
    name, *rest = sys.argv[1:]
    seen = asyncio.run(SCENARIOS[name](*(arg == "planted" for arg in rest)))
    print(json.dumps({"compiled": bool(core.COMPILED)} | seen))
