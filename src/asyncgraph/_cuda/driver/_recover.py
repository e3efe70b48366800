"""Recovering a device after a fault: resetting its primary context."""

from __future__ import annotations

import operator
from typing import SupportsIndex

from asyncgraph._runtime import _poison
from asyncgraph._runtime._exceptions import (
    ArgumentTypeError,
    DeviceFaultError,
    DeviceUnavailableError,
    DispatchError,
)

__all__ = ("reset_device",)


def reset_device(device: int = 0) -> None:
    """Reset the primary CUDA context of *device* so the process can use the GPU again.

    A device fault (an out-of-bounds write, say) is sticky: it ruins the device's primary
    context for everything in the process, and every CUDA call on it fails from then on. Close
    the failed backend first (``await backend.aclose()``), then call this, then open a new
    backend. The reset destroys every allocation, stream and loaded module of *every* library
    in the process on that device (CuPy and PyTorch share the primary context): drop their
    objects before, and do not use them after.

    Args:
        device: the device's ordinal.

    Some drivers keep the process's device state failed after a fault whatever is reset (an
    NVIDIA H100 with driver 580 does, after an illegal address): then this raises
    :class:`DeviceFaultError`, and only a new process can use the GPU. See ``docs/errors.md``.
    Where the reset brings the device back, the process's fault
    (:func:`~asyncgraph.process_fault`) is forgotten, so new backends may open; backends that
    failed stay failed.

    Raises:
        ArgumentTypeError: *device* is not an int (a ``bool`` included).
        DispatchError: *device* is negative.
        DeviceUnavailableError: there is no CUDA driver, or no such device.
        DeviceFaultError: the driver still reports the fault after the reset; restart the
            process.
        CudaError: the driver refused the reset.
    """
    ordinal = _ordinal(device)
    where = f"reset_device(device={ordinal})"
    try:
        # cuda-python loads only now: importing asyncgraph loads none of it.
        from cuda.bindings import driver as drv

        from asyncgraph._cuda.driver._driver import check, is_sticky

        (code,) = drv.cuInit(0)
    except Exception as exc:  # cuda.pathfinder raises when libcuda is not on the machine
        text = str(exc).strip()
        detail = text.splitlines()[0] if text else type(exc).__name__
        raise DeviceUnavailableError(
            f"{where}: no CUDA driver library (libcuda) was found, so there is no GPU to "
            f"reset: {detail}"
        ) from exc
    if code != drv.CUresult.CUDA_SUCCESS:
        raise DeviceUnavailableError(
            f"{where}: the CUDA driver cannot be used here (cuInit failed with {code.name}), "
            "so there is no GPU to reset"
        )
    count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    if count == 0:
        raise DeviceUnavailableError(f"{where}: the CUDA driver reports no device on this machine")
    if ordinal >= count:
        have = "device 0" if count == 1 else f"0 to {count - 1}"
        raise DeviceUnavailableError(
            f"{where}: there is no CUDA device {ordinal}; this machine has {count} ({have})"
        )
    device = ordinal
    handle = check(drv.cuDeviceGet(device), "cuDeviceGet")
    check(drv.cuDevicePrimaryCtxReset(handle), "cuDevicePrimaryCtxReset")
    # The reset leaves the primary context uninitialised; retaining it initialises it again
    # (the retain is kept: it stands for the one the reset dropped) and makes it current.
    code, context = drv.cuDevicePrimaryCtxRetain(handle)
    if is_sticky(code):
        # Seen on an NVIDIA H100 80GB HBM3 with driver 580.159.04 after an illegal address:
        # the driver keeps the whole process's device state failed, reset or not.
        raise DeviceFaultError(
            int(code),
            code.name,
            "cuDevicePrimaryCtxRetain",
            f"the driver keeps device {device} failed for this process even after the reset; "
            "restart the process to use the GPU again (let a supervisor restart the worker)",
        )
    check((code,), "cuDevicePrimaryCtxRetain")
    check(drv.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    _poison.clear()  # the device came back: new backends may open


def _ordinal(device: object) -> int:
    """*device* as a device ordinal, checked before any driver call."""
    if isinstance(device, bool) or not isinstance(device, SupportsIndex):
        raise ArgumentTypeError(
            f"reset_device(device={device!r}): pass the device's ordinal, an int (0 is the "
            "first GPU)"
        )
    ordinal = operator.index(device)
    if ordinal < 0:
        raise DispatchError(
            f"reset_device(device={ordinal}): a device ordinal is 0 or more (0 is the first GPU)"
        )
    return ordinal
