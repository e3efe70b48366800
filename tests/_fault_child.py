"""A device fault and the recovery from it, in a process of its own.

``test_cuda_fault.py`` runs this file with ``python`` and reads the JSON report it prints last:
a fault ruins the device's primary context for the whole process, so it cannot share the test
process. Each step records what it saw; the test asserts on the report.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np

import asyncgraph as ag
from asyncgraph._demo._fault_kernel import POKE
from asyncgraph._demo._spin_kernel import SPIN

SCALE = ag.Kernel(
    r"""
extern "C" __global__ void scale(const float* x, float* out, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i];
}
""",
    "scale",
)


def _outcome(result: object) -> str:
    return type(result).__name__ if isinstance(result, BaseException) else "ok"


async def _scale_ok(backend: ag.Backend) -> bool:
    x = np.random.default_rng().standard_normal(4096).astype(np.float32)
    (y,) = await backend.dispatch(
        SCALE, x, ag.Out(x.size, np.float32), np.float32(3), np.int32(x.size), grid=16, block=256
    )
    return bool(np.allclose(y, 3 * x, rtol=1e-6))


def _probe_driver() -> dict[str, str]:
    """What the driver answers after the reset: is the process's device state still failed?"""
    import threading

    from cuda.bindings import driver as drv

    probe: dict[str, str] = {}
    dev = drv.cuDeviceGet(0)[1]
    for name, call in (
        ("ctx_create", lambda: drv.cuCtxCreate(None, 0, dev)),
        ("mem_get_info", drv.cuMemGetInfo),
    ):
        try:
            probe[name] = call()[0].name
        except Exception as exc:  # reported as found
            probe[name] = repr(exc)
    seen: list[str] = []
    thread = threading.Thread(target=lambda: seen.append(drv.cuDevicePrimaryCtxRetain(dev)[0].name))
    thread.start()
    thread.join()
    probe["retain_in_new_thread"] = seen[0] if seen else "?"
    return probe


async def main() -> dict[str, Any]:
    report: dict[str, Any] = {}
    backend = ag.open_backend("cuda")
    for kernel in (POKE, SPIN, SCALE):
        await backend.compile(kernel)
    report["before_ok"] = await _scale_ok(backend)
    clock_khz = backend._cuda.device.device.properties.clock_rate  # type: ignore[attr-defined]
    # Three long kernels in flight (on other streams), then the faulting one.
    spins = [
        backend.dispatch(SPIN, np.int64(clock_khz * 200), ag.Out(1, np.int32), grid=1, block=1)
        for _ in range(3)
    ]
    poke = backend.dispatch(POKE, ag.Out(1, np.float32), np.int64(1 << 40), grid=1, block=1)
    results = await asyncio.gather(poke, *spins, return_exceptions=True)
    report["in_flight"] = [_outcome(r) for r in results]
    report["fault_name"] = getattr(results[0], "name", None)
    report["failure"] = type(backend.failure).__name__
    report["repr"] = repr(backend)
    try:
        backend.dispatch(SPIN, np.int64(1), ag.Out(1, np.int32), grid=1, block=1)
        report["refused"] = "accepted"
    except ag.DeviceFaultError as exc:
        report["refused"] = str(exc)
    try:
        await asyncio.wait_for(backend.aclose(), 30)
        report["closed"] = "ok"
    except BaseException as exc:  # reported, the test asserts on it
        report["closed"] = repr(exc)
    try:
        ag.reset_device(0)
        fresh = ag.open_backend("cuda")
        try:
            report["after_ok"] = await _scale_ok(fresh)
        finally:
            await fresh.aclose()
    except Exception as exc:  # reported, the test asserts on it
        report["after_ok"] = repr(exc)
        report["probe"] = _probe_driver()
    return report


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
    sys.exit(0)
