"""Finding a CUDA driver and devices without failing when there are none."""

from __future__ import annotations

import functools
import os

import attrs

__all__ = ("CudaProbe", "DeviceInfo", "probe_cuda")


@attrs.frozen(kw_only=True)
class DeviceInfo:
    """One CUDA device as the driver reports it."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int


@attrs.frozen(kw_only=True)
class CudaProbe:
    """What the driver said: whether CUDA can be used here, and if not, why."""

    available: bool
    reason: str
    driver_version: tuple[int, int] | None = None
    devices: tuple[DeviceInfo, ...] = ()


@functools.cache
def probe_cuda() -> CudaProbe:
    """Look for a CUDA driver and devices; never raises.

    ``ASYNCGRAPH_DISABLE_CUDA=1`` makes it report CUDA as unavailable (to exercise the host
    backend on a machine that has a GPU). The answer is cached for the process.
    """
    if os.environ.get("ASYNCGRAPH_DISABLE_CUDA", "") not in ("", "0"):
        return CudaProbe(available=False, reason="ASYNCGRAPH_DISABLE_CUDA is set")
    try:
        from cuda.bindings import driver
    except Exception as exc:
        return CudaProbe(available=False, reason=f"cuda.bindings cannot be imported: {exc}")
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:
        # cuda.pathfinder raises when libcuda.so is not on the machine.
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return CudaProbe(
            available=False, reason=f"no CUDA driver library (libcuda) was found: {first_line}"
        )
    if err != driver.CUresult.CUDA_SUCCESS:
        return CudaProbe(available=False, reason=f"cuInit failed with {err.name}")
    err, version = driver.cuDriverGetVersion()
    driver_version = (version // 1000, (version % 1000) // 10) if err == 0 else None
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        return CudaProbe(
            available=False,
            reason="the CUDA driver reports no devices",
            driver_version=driver_version,
        )
    devices = []
    attr = driver.CUdevice_attribute
    for ordinal in range(count):
        _, dev = driver.cuDeviceGet(ordinal)
        _, raw_name = driver.cuDeviceGetName(256, dev)
        _, major = driver.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev
        )
        _, minor = driver.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev
        )
        _, total = driver.cuDeviceTotalMem(dev)
        devices.append(
            DeviceInfo(
                ordinal=ordinal,
                name=raw_name.split(b"\0", 1)[0].decode(errors="replace"),
                compute_capability=(major, minor),
                total_memory=int(total),
            )
        )
    return CudaProbe(
        available=True,
        reason=f"{count} CUDA device(s) found",
        driver_version=driver_version,
        devices=tuple(devices),
    )
