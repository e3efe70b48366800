"""Scenarios where the order of the streams' work matters, for the stand-in's deferred mode.

``python -m tests.fake_driver.order_scenario NAME [planted|general]`` runs one on the CUDA
backend over the stand-in (``FAKE_CUDA_STREAMS`` says whether its streams run their work when
it is enqueued or when they get to it) and prints what it saw as one JSON line;
``tests/test_deferred.py`` runs them on each dispatch core, in both modes.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE
from asyncgraph._cuda.core._choose import core
from asyncgraph._cuda.launch import _staged as _small
from tests.fake_driver import reset
from tests.kernels import INC, SPIN

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_run_streams.restype = ctypes.c_long
_lib.fake_queued_ops.restype = ctypes.c_long
_lib.fake_stream_waits.restype = ctypes.c_long
_lib.fake_stream_waits.argtypes = [ctypes.POINTER(ctypes.c_long)]
_lib.fake_fail_next.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
_lib.fake_fail_next_events.argtypes = [ctypes.c_int, ctypes.c_int]
_lib.fake_set_device_memory.argtypes = [ctypes.c_ulonglong]
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


def _in_out(gpu: Any, x: Any) -> Any:
    """``x + 1``, through the staging: an ``InOut`` goes up, and comes down where it went."""
    return gpu.dispatch(INC, ag.InOut(x), np.float32(1), np.int32(N), grid=4, block=256)


async def _failed(pending: Any) -> str:
    try:
        await pending
    except Exception as exc:
        return type(exc).__name__
    return "no error"


async def record_fails(general: bool = False) -> dict[str, Any]:
    """cuEventRecord fails after a dispatch's copies and kernel were enqueued (on the fast path,
    or with *general* the general one): the work is still queued. The next dispatch must not
    be given the staging the failed one's download is still to write, and a use of its buffer
    on another stream must come after its kernel."""
    rng = np.random.default_rng()
    seen: dict[str, Any] = {}
    async with ag.open_backend("cuda", streams=2, fast_path_enabled=not general) as gpu:
        for kernel in (SCALE, INC):
            await gpu.compile(kernel)
        x = rng.standard_normal(N, dtype=np.float32)
        for _ in range(2):  # plans made: the fast path takes the next ones (unless general)
            await _in_out(gpu, x)
        # The staging: the failed dispatch's download is still queued when the next one stages.
        before = gpu.telemetry.snapshot().fast_path_dispatches
        _lib.fake_fail_next(b"record", 1, 1)  # CUDA_ERROR_INVALID_VALUE, nothing recorded
        failing = _in_out(gpu, rng.standard_normal(N, dtype=np.float32))
        seen["failed"] = await _failed(failing)
        staging_right = []
        for _ in range(3):  # one on each stream, and again on the failed one's
            y = rng.standard_normal(N, dtype=np.float32)
            (after,) = await _in_out(gpu, y)
            staging_right.append(bool(np.array_equal(after, y + 1)))
        seen["staging_right"] = staging_right
        # The buffer: the failed dispatch's kernel is still queued when a reader comes.
        buf = await gpu.upload(x)
        for _ in range(2):
            await _inc(gpu, buf)
            await _scale(gpu, buf)
        _lib.fake_fail_next(b"record", 1, 1)
        seen["buffer_failed"] = await _failed(_inc(gpu, buf))
        (read,) = await _scale(gpu, buf)  # on the other stream: nothing holds the buffer
        _lib.fake_run_streams(0)
        final = await gpu.download(buf)
        seen["reader_right"] = bool(np.array_equal(read, 2 * final))
        seen["fast"] = gpu.telemetry.snapshot().fast_path_dispatches - before
        seen["failure"] = repr(gpu.failure)
        (last,) = await _in_out(gpu, x)
        seen["after_right"] = bool(np.array_equal(last, x + 1))
        await buf.aclose()
    return seen


async def record_and_sync_fail(general: bool = False) -> dict[str, Any]:
    """cuEventRecord fails after a dispatch's work was enqueued, and its stream cannot be
    synchronized either: nothing can be known done, so the backend fails (and still closes)."""
    seen: dict[str, Any] = {}
    x = np.ones(N, np.float32)
    gpu = ag.open_backend("cuda", streams=1, fast_path_enabled=not general)
    for kernel in (SCALE, INC):
        await gpu.compile(kernel)
    for _ in range(2):
        await _in_out(gpu, x)
    _lib.fake_fail_next(b"record", 1, 1)
    _lib.fake_fail_next(b"sync", 1, 1)
    seen["failed"] = await _failed(_in_out(gpu, x))
    seen["failure"] = type(gpu.failure).__name__
    try:
        _in_out(gpu, x)
    except Exception as exc:
        seen["later"] = type(exc).__name__
    await gpu.aclose()
    seen["closed"] = gpu.is_closed
    return seen


async def _error(pending: Any) -> list[Any]:
    try:
        await pending
    except Exception as exc:
        return [type(exc).__name__, getattr(exc, "name", None), getattr(exc, "call", None)]
    return ["no error", None, None]


async def injected() -> dict[str, Any]:
    """The stand-in's injected failures, through a backend: a launch, a copy, device memory
    running out; and, after a sticky fault, the calls that must fail too."""
    from cuda.bindings import driver as drv

    seen: dict[str, Any] = {}
    x = np.ones(N, np.float32)
    gpu: Any = ag.open_backend("cuda")
    for kernel in (SCALE, INC):
        await gpu.compile(kernel)
    for _ in range(2):
        await _scale(gpu, x)
    _lib.fake_fail_next(b"launch", 1, 701)  # CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    seen["launch"] = await _error(_scale(gpu, x))
    _lib.fake_fail_next(b"copy", 1, 1)
    seen["copy"] = await _error(_scale(gpu, x))
    (out,) = await _scale(gpu, x)
    seen["after"] = bool(np.array_equal(out, 2 * x))
    _lib.fake_set_device_memory(ctypes.c_ulonglong(256 << 20))
    code, free, total = drv.cuMemGetInfo()
    seen["info"] = [int(code), int(total), int(free) < int(total)]
    try:
        await gpu.upload(np.ones(512 << 20 >> 2, np.float32))  # 512 MiB on a 256 MiB device
        seen["oom"] = "no error"
    except Exception as exc:
        seen["oom"] = type(exc).__name__
    _lib.fake_set_device_memory(ctypes.c_ulonglong(80 << 30))
    stream = gpu._cuda.device.lanes[0].handle  # a stream and an event made before the fault
    event = drv.cuEventCreate(0)[1]
    _lib.fake_fail_next_events(1, 700)
    seen["fault"] = await _error(_scale(gpu, x))
    seen["after_fault"] = {
        "record": int(drv.cuEventRecord(event, stream)[0]),
        "memset": int(drv.cuMemsetD8Async(gpu._cuda.device.lanes[0].scratch_ptr, 0, 4, stream)[0]),
        "alloc": int(drv.cuMemAlloc(4)[0]),
        "stream": int(drv.cuStreamCreate(0)[0]),
        "wait": int(drv.cuStreamWaitEvent(stream, event, 0)[0]),
    }
    await gpu.aclose()
    return seen


async def long_kernel() -> dict[str, Any]:
    """spin() runs for its cycles in the deferred mode (2 GHz: 2e8 cycles are 0.1 s); the loop
    goes on meanwhile."""
    ticks = 0
    done = False

    async def tick() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0.005)

    async with ag.open_backend("cuda") as gpu:
        await gpu.compile(SPIN)
        ticker = asyncio.ensure_future(tick())
        began = time.perf_counter()
        (flag,) = await gpu.dispatch(SPIN, np.int64(2e8), ag.Out(1, np.int32), grid=1, block=1)
        took = time.perf_counter() - began
        done = True
        await ticker
    return {"took": took, "ticks": ticks, "flag": int(flag[0])}


SCENARIOS: dict[str, Callable[..., Any]] = {
    "missing_wait": missing_wait,
    "record_fails": record_fails,
    "record_and_sync_fail": record_and_sync_fail,
    "injected": injected,
    "long_kernel": long_kernel,
}

if __name__ == "__main__":
    reset(_lib)
    _mode("instant")
    name, *rest = sys.argv[1:]
    seen = asyncio.run(SCENARIOS[name](*(arg in ("planted", "general") for arg in rest)))
    print(json.dumps({"compiled": bool(core.COMPILED)} | seen))
