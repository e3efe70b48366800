"""A device group of a GPU and the host whose GPU member faults, in a process of its own.

``test_cuda_group.py`` runs this file with ``python`` and reads the JSON report it prints
last (a fault ruins the device's primary context for the whole process). The CUDA member
faults on an illegal address; every later ``group.dispatch`` must go to the host member and
be right, ``snapshot()`` must name the failed member, and closing must release the dead
context's memory quietly (one log event, no warning per buffer).
"""

from __future__ import annotations

import asyncio
import json
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


async def main() -> dict[str, Any]:
    report: dict[str, Any] = {}
    rng = np.random.default_rng()
    x = rng.standard_normal(N, dtype=np.float32)
    with structlog.testing.capture_logs() as logs:
        async with ag.open_group(["cuda:0", "host"]) as group:
            gpu, host = group[0], group[1]
            await group.compile(SCALE)
            await gpu.compile(POKE)
            buffers = [await gpu.upload(x) for _ in range(50)]  # memory the fault strands
            (out,) = await _scale(gpu, x)
            report["before_ok"] = bool(np.array_equal(out, 2 * x))
            try:
                await gpu.dispatch(POKE, buffers[0], np.int64(1 << 40), grid=1, block=1)
            except Exception as exc:
                report["fault"] = type(exc).__name__
            before = host.telemetry.snapshot().dispatches
            results = await asyncio.gather(
                *(_scale(group, rng.standard_normal(N, dtype=np.float32)) for _ in range(100)),
                return_exceptions=True,
            )
            errors = [type(r).__name__ for r in results if isinstance(r, BaseException)]
            report["after_errors"] = errors
            report["on_host"] = host.telemetry.snapshot().dispatches - before
            y = rng.standard_normal(N, dtype=np.float32)
            (checked,) = await _scale(group, y)
            report["after_ok"] = bool(np.array_equal(checked, 2 * y))
            snap = group.snapshot()
            report["failed"] = [[i, name] for i, name, _why in snap.failed]
            report["why"] = snap.failed[0][2] if snap.failed else ""
    report["abandoned_events"] = [
        {k: v for k, v in entry.items() if k in ("device_buffers", "bytes")}
        for entry in logs
        if entry.get("event") == "backend.memory_abandoned"
    ]
    return report


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
