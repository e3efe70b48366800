"""A device group of a CUDA member (the stand-in driver) and a host one, after a device fault;
and who closes a pinned pool given in the options.

``python -m tests.fake_driver.group_scenario`` prints what it observed as one JSON line;
``tests/test_group_failures.py`` runs it with the stand-in loaded as ``libcuda.so.1`` and
checks it.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
from typing import Any

import numpy as np

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE
from asyncgraph.pool import PinnedPool
from tests.fake_driver import reset

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_fail_next_events.argtypes = [ctypes.c_int, ctypes.c_int]
N = 1024


def _scale(target: Any, x: object) -> ag.PendingDispatch:
    pending: ag.PendingDispatch = target.dispatch(
        SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
    )
    return pending


async def main() -> dict[str, Any]:
    seen: dict[str, Any] = {}
    rng = np.random.default_rng()
    x = rng.standard_normal(N, dtype=np.float32)
    group = ag.open_group(["cuda", "host"])
    async with group:
        cuda: Any = group[0]  # the CUDA backend: it has a pinned pool
        host = group[1]
        seen["shared_pool"] = (
            group.pinned_pool is not None and cuda.pinned_pool is group.pinned_pool
        )
        await group.compile(SCALE)
        on_cuda = await group.upload(x, cuda)
        replicated = await group.replicate(x)
        (out,) = await _scale(cuda, x)
        assert np.array_equal(out, 2 * x)
        # A kernel on the CUDA member faults (an illegal address): the member fails.
        _lib.fake_fail_next_events(1, 700)
        try:
            await _scale(cuda, x)
        except Exception as exc:
            seen["fault"] = type(exc).__name__
        # The group goes on with the host member.
        before = host.telemetry.snapshot().dispatches
        results = await asyncio.gather(
            *(_scale(group, x) for _ in range(100)), return_exceptions=True
        )
        ok = [r for r in results if not isinstance(r, BaseException)]
        seen["after"] = {
            "ok": len(ok),
            "right": sum(bool(np.array_equal(r[0], 2 * x)) for r in ok),
            "on_host": host.telemetry.snapshot().dispatches - before,
        }
        try:
            _scale(group, on_cuda)
        except Exception as exc:
            seen["resident_on_failed"] = type(exc).__name__
        replicated_results = [await _scale(group, replicated) for _ in range(10)]
        seen["replicated"] = {
            "ok": len(replicated_results),
            "right": sum(bool(np.array_equal(r[0], 2 * x)) for r in replicated_results),
        }
        snap = group.snapshot()
        seen["failed"] = [[i, name] for i, name, _ in snap.failed]
        seen["why"] = snap.failed[0][2] if snap.failed else ""
        await replicated.aclose()
    seen["closed"] = all(m.is_closed for m in group)
    seen["pool_after_close"] = group.pinned_pool
    # A pool given in the options is its giver's: the backend leaves it open when it closes.
    pool = PinnedPool(1 << 20)
    reset(_lib)
    async with ag.open_backend("cuda", options=ag.BackendOptions(host_pool=pool)) as gpu:
        await gpu.download(await gpu.upload(x))
    seen["given_pool_idle_after_close"] = pool.statistics().bytes_idle
    pool.close()
    seen["given_pool_idle_after_its_close"] = pool.statistics().bytes_idle
    return seen


if __name__ == "__main__":
    reset(_lib)
    _lib.fake_set_complete_mode(b"instant")
    print(json.dumps(asyncio.run(main())))
