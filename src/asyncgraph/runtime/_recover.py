"""Recovering a device after a fault: resetting its primary context."""

from __future__ import annotations

from asyncgraph._exceptions import DeviceFaultError, DeviceUnavailableError
from asyncgraph.cuda.driver._driver import check, is_sticky
from asyncgraph.runtime import _poison

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
        DeviceUnavailableError: there is no such device.
        DeviceFaultError: the driver still reports the fault after the reset; restart the
            process.
        CudaError: the driver refused the reset.
    """
    from cuda.bindings import driver as drv

    check(drv.cuInit(0), "cuInit")
    count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    if not 0 <= device < count:
        raise DeviceUnavailableError(
            f"there is no CUDA device {device}; this machine has {count} (0 to {count - 1})"
        )
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
