"""Pipelines the Ray benchmarks send to their actors (an importable module, so Ray ships them
by reference, as a user's own module would be).

``bench_ray.py`` times :func:`echo` and :func:`scale_once`; ``soak_faults.py`` and
``bench_heal.py`` set their actors up with :func:`warm`, plant faults with :func:`die` (the
host: the actor's process ends) and :func:`poke` (a GPU: an illegal address), and read each
actor's memory with :func:`memory`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE
from asyncgraph._demo._fault_kernel import POKE


async def echo(worker: Any, x: Any) -> Any:
    """Return the argument: the pool's own cost."""
    return x


async def scale_once(worker: Any, x: Any) -> Any:
    """One dispatch of the scale kernel on the actor's backend."""
    (out,) = await worker.backend.dispatch(
        SCALE, x, ag.Out(x.shape, x.dtype), np.float32(2), np.int32(x.size),
        grid=(x.size + 255) // 256, block=256,
    )  # fmt: skip
    return out


async def warm(worker: Any) -> None:
    """The pool's setup: the kernels compiled (the fault's too, on a GPU, so that planting it
    costs no compile) and one dispatch run, before the actor takes runs."""
    await worker.backend.compile(SCALE)
    if worker.backend.kind == "cuda":
        await worker.backend.compile(POKE)
    await scale_once(worker, np.ones(1024, np.float32))


async def die(worker: Any) -> None:
    """The fault planted on the host: the actor's process ends at once."""
    os._exit(1)


async def poke(worker: Any) -> None:
    """The fault planted on a GPU: a kernel that writes to an illegal address (the run fails
    with DeviceFaultError, and every CUDA context of the actor's process with it)."""
    await worker.backend.dispatch(POKE, ag.Out(1, np.float32), np.int64(1 << 40), grid=1, block=1)


async def memory(worker: Any) -> dict[str, Any]:
    """The actor's memory: its process's resident bytes, and on a GPU the bytes in use on its
    device (the driver's count, every process's) and those its backend holds."""
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    seen: dict[str, Any] = {
        "slot": worker.index, "generation": worker.generation, "pid": os.getpid(), "rss": rss,
        "device_used": None, "backend_device": None,
    }  # fmt: skip
    if worker.backend.kind == "cuda":
        seen["device_used"] = _device_used(int(worker.backend.name.partition(":")[2]))
        stats = worker.backend.device_memory.statistics()
        seen["backend_device"] = stats.bytes_in_use + stats.bytes_reserved
    return seen


def _device_used(ordinal: int) -> int | None:
    """Bytes in use on GPU *ordinal*, every process's (the driver's ``cuMemGetInfo``, asked in
    its primary context, made current on this thread for the call); ``None`` if it fails."""
    from cuda.bindings import driver as drv

    ok = drv.CUresult.CUDA_SUCCESS
    code, device = drv.cuDeviceGet(ordinal)
    if code != ok:
        return None
    code, context = drv.cuDevicePrimaryCtxRetain(device)
    if code != ok:
        return None
    try:
        if drv.cuCtxPushCurrent(context)[0] != ok:
            return None
        try:
            code, free, total = drv.cuMemGetInfo()
        finally:
            drv.cuCtxPopCurrent()
        return int(total) - int(free) if code == ok else None
    finally:
        drv.cuDevicePrimaryCtxRelease(device)
