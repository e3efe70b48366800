"""A sticky fault on one GPU fails every CUDA backend of the process (the stand-in driver, two
devices): in a group beside a host member, and among backends opened on their own.

``python -m tests.fake_driver.poison_scenario N`` faults device N (0 or 1) and prints what it
observed as one JSON line; ``tests/test_poison.py`` runs it on both cores and checks it. The
stand-in poisons the whole process as the driver does: after the fault every context answers
allocations, copies, launches and queries with the fault's error.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import os
import sys
import warnings
from typing import Any

import numpy as np
import structlog

os.environ["FAKE_CUDA_DEVICES"] = "2"  # read by the stand-in at each call

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE
from asyncgraph.pool import PinnedPool
from tests.fake_driver import reset

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_fail_next_events.argtypes = [ctypes.c_int, ctypes.c_int]
_lib.fake_launch_count.argtypes = [ctypes.c_char_p]
_lib.fake_launch_count.restype = ctypes.c_ulonglong
_lib.fake_pool_access_grants.restype = ctypes.c_long
N = 1024


def _scale(target: Any, x: object) -> ag.PendingDispatch:
    pending: ag.PendingDispatch = target.dispatch(
        SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
    )
    return pending


def _launches() -> int:
    return int(_lib.fake_launch_count(b"scale"))


async def _refused(target: Any, x: np.ndarray[Any, Any], count: int) -> dict[str, Any]:
    """*count* dispatches on *target*: how many raised at the call, with which errors, and how
    many kernels the driver launched meanwhile."""
    before = _launches()
    kinds: dict[str, int] = {}
    messages = set()
    for _ in range(count):
        try:
            pending = _scale(target, x)
        except Exception as exc:
            kinds[type(exc).__name__] = kinds.get(type(exc).__name__, 0) + 1
            messages.add(str(exc))
        else:
            kinds["accepted"] = kinds.get("accepted", 0) + 1
            await asyncio.gather(pending, return_exceptions=True)
    return {"kinds": kinds, "launched": _launches() - before, "messages": sorted(messages)}


async def in_a_group(faulty: int) -> dict[str, Any]:
    """cuda:0, cuda:1 and host in a group; device *faulty* faults."""
    seen: dict[str, Any] = {}
    x = np.random.default_rng().standard_normal(N, dtype=np.float32)
    async with ag.open_group(["cuda:0", "cuda:1", "host"]) as group:
        seen["routes"] = [list(r) for r in group.snapshot().copy_routes]
        seen["pool_grants"] = _lib.fake_pool_access_grants()
        await group.compile(SCALE)
        kept = [await group.upload(x, i) for i in (0, 1) for _ in range(20)]
        on_1 = await group.copy_to(kept[0], 1)
        seen["peer_copy_right"] = bool(np.array_equal(await group.download(on_1), x))
        for i in (0, 1):
            (out,) = await _scale(group[i], x)
            assert np.array_equal(out, 2 * x)
        _lib.fake_fail_next_events(1, 700)
        try:
            await _scale(group[faulty], x)
        except Exception as exc:
            seen["fault"] = type(exc).__name__
        seen["failed_at_once"] = [m.failure is not None for m in group]
        fault = ag.process_fault()
        seen["process_fault"] = None if fault is None else [fault.device, fault.error.name]
        other = group[1 - faulty]
        seen["other_refuses"] = await _refused(other, x, 100)
        seen["faulty_refuses"] = await _refused(group[faulty], x, 3)
        host = group[2]
        before = host.telemetry.snapshot().dispatches
        results = await asyncio.gather(
            *(_scale(group, x) for _ in range(100)), return_exceptions=True
        )
        ok = [r for r in results if not isinstance(r, BaseException)]
        seen["group_after"] = {
            "ok": len(ok),
            "right": sum(bool(np.array_equal(r[0], 2 * x)) for r in ok),
            "on_host": host.telemetry.snapshot().dispatches - before,
            "errors": sorted({type(r).__name__ for r in results if isinstance(r, BaseException)}),
        }
        snap = group.snapshot()
        seen["snapshot_failed"] = [[i, name, why] for i, name, why in snap.failed]
        seen["snapshot_fault"] = None if snap.process_fault is None else snap.process_fault.device
        del kept, on_1
    gc.collect()
    return seen


async def on_their_own(faulty: int) -> dict[str, Any]:
    """Two backends opened on their own, not knowing of each other; device *faulty* faults
    while the other's next dispatch has not seen it yet."""
    seen: dict[str, Any] = {}
    x = np.ones(N, np.float32)
    backends = [ag.open_backend("cuda:0"), ag.open_backend("cuda:1")]
    try:
        for backend in backends:
            await backend.compile(SCALE)
            for _ in range(3):
                await _scale(backend, x)
        bad, good = backends[faulty], backends[1 - faulty]
        _lib.fake_fail_next_events(1, 700)
        faulting = _scale(bad, x)  # the fault is the driver's now; nobody has seen it yet
        try:
            first = _scale(good, x)
        except Exception as exc:
            seen["first_after"] = ["at the call", type(exc).__name__]
        else:
            try:
                await first
                seen["first_after"] = ["completed"]
            except Exception as exc:
                seen["first_after"] = ["awaited", type(exc).__name__]
        await asyncio.gather(faulting, return_exceptions=True)
        seen["both_failed"] = [b.failure is not None for b in backends]
        seen["later"] = await _refused(good, x, 10)
        try:
            ag.open_backend(f"cuda:{1 - faulty}")
        except Exception as exc:
            seen["open_after"] = [type(exc).__name__, str(exc)]
        try:
            PinnedPool(0).acquire(1 << 20)
        except Exception as exc:
            seen["pinned_after"] = type(exc).__name__
        fault = ag.process_fault()
        seen["process_fault"] = None if fault is None else [fault.device, fault.error.name]
    finally:
        for backend in backends:
            await backend.aclose()
    return seen


def main(faulty: int) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught, structlog.testing.capture_logs() as logs:
        warnings.simplefilter("always")
        reset(_lib)
        _lib.fake_set_complete_mode(b"instant")
        seen["group"] = asyncio.run(in_a_group(faulty))
        reset(_lib)
        seen["own"] = asyncio.run(on_their_own(faulty))
        gc.collect()
    seen["warnings"] = [str(w.message) for w in caught]
    seen["failed_events"] = [
        e.get("first_seen_on") for e in logs if e.get("event") == "backend.failed"
    ]
    return seen


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)))
