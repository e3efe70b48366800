"""A sticky fault on one of two GPUs, in a process of its own: every CUDA backend fails.

``test_cuda_two_gpus.py`` runs ``python _poison_child.py MODE N``, which faults GPU N with an
illegal address and prints a JSON report last. MODE ``group``: ``cuda:0``, ``cuda:1`` and the
host in a group; ``own``: two backends opened on their own. The report says whether both CUDA
backends failed at once, what 100 later dispatches on the other GPU did (each must be refused at
the call, naming the fault, with nothing queued), and whether the host member served.
"""

from __future__ import annotations

import asyncio
import json
import sys
import warnings
from typing import Any

import numpy as np
import structlog

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE
from asyncgraph._demo._fault_kernel import POKE

N = 1 << 16


def _scale(target: Any, x: np.ndarray[Any, Any]) -> ag.PendingDispatch:
    pending: ag.PendingDispatch = target.dispatch(
        SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=N // 256, block=256
    )
    return pending


async def _refusals(target: ag.Backend, x: np.ndarray[Any, Any]) -> dict[str, Any]:
    """100 dispatches on *target*: what each did, and whether any reached the backend's queue."""
    before = target.telemetry.snapshot().dispatches
    kinds: dict[str, int] = {}
    messages: set[str] = set()
    for _ in range(100):
        try:
            pending = _scale(target, x)
        except Exception as exc:
            what = f"at the call: {type(exc).__name__}"
            messages.add(str(exc))
        else:
            try:
                await pending
                what = "ran"
            except Exception as exc:
                what = f"awaited: {type(exc).__name__}"
        kinds[what] = kinds.get(what, 0) + 1
    return {
        "kinds": kinds,
        "queued": target.telemetry.snapshot().dispatches - before,
        "messages": sorted(messages),
    }


async def group(faulty: int) -> dict[str, Any]:
    report: dict[str, Any] = {}
    rng = np.random.default_rng()
    x = rng.standard_normal(N, dtype=np.float32)
    async with ag.open_group(["cuda:0", "cuda:1", "host"]) as g:
        report["routes"] = [list(r) for r in g.snapshot().copy_routes]
        await g.compile(SCALE)
        await g[faulty].compile(POKE)
        buffers = [await g.upload(x, i) for i in (0, 1) for _ in range(20)]  # stranded
        for i in (0, 1):
            (out,) = await _scale(g[i], x)
            report[f"before_ok_{i}"] = bool(np.array_equal(out, 2 * x))
        target = buffers[0] if faulty == 0 else buffers[20]
        try:
            await g[faulty].dispatch(POKE, target, np.int64(1 << 40), grid=1, block=1)
        except Exception as exc:
            report["fault"] = [type(exc).__name__, str(exc)[:200]]
        report["failed_at_once"] = [m.failure is not None for m in g]
        fault = ag.process_fault()
        report["process_fault"] = None if fault is None else [fault.device, fault.error.name]
        report["other"] = await _refusals(g[1 - faulty], x)
        host = g[2]
        before = host.telemetry.snapshot().dispatches
        results = await asyncio.gather(
            *(_scale(g, rng.standard_normal(N, dtype=np.float32)) for _ in range(100)),
            return_exceptions=True,
        )
        report["group_errors"] = [type(r).__name__ for r in results if isinstance(r, BaseException)]
        report["on_host"] = host.telemetry.snapshot().dispatches - before
        y = rng.standard_normal(N, dtype=np.float32)
        (checked,) = await _scale(g, y)
        report["host_ok"] = bool(np.array_equal(checked, 2 * y))
        report["failed"] = [[i, name] for i, name, _ in g.snapshot().failed]
        del buffers
    return report


async def own(faulty: int) -> dict[str, Any]:
    report: dict[str, Any] = {}
    x = np.random.default_rng().standard_normal(N, dtype=np.float32)
    backends = [ag.open_backend("cuda:0"), ag.open_backend("cuda:1")]
    try:
        for backend in backends:
            await backend.compile(SCALE)
            (out,) = await _scale(backend, x)
            assert np.array_equal(out, 2 * x)
        bad, good = backends[faulty], backends[1 - faulty]
        await bad.compile(POKE)
        buffer = await bad.upload(x)
        try:
            await bad.dispatch(POKE, buffer, np.int64(1 << 40), grid=1, block=1)
        except Exception as exc:
            report["fault"] = type(exc).__name__
        report["failed_at_once"] = [b.failure is not None for b in backends]
        report["other"] = await _refusals(good, x)
        try:
            ag.open_backend(f"cuda:{1 - faulty}")
        except Exception as exc:
            report["open_after"] = type(exc).__name__
    finally:
        for backend in backends:
            await backend.aclose()
    return report


def main(mode: str, faulty: int) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught, structlog.testing.capture_logs() as logs:
        warnings.simplefilter("always")
        report = asyncio.run(group(faulty) if mode == "group" else own(faulty))
    report["warnings"] = [str(w.message)[:200] for w in caught]
    report["abandoned_events"] = sum(e.get("event") == "backend.memory_abandoned" for e in logs)
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
