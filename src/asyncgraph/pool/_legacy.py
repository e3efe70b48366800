"""Legacy pinned allocations (``cuMemAllocHost``), freed only once their device went idle.

``cuMemFreeHost`` waits until the whole device is idle, and while it waits it holds up the
driver calls of the process's other threads: on an NVIDIA H200, with a 300 ms kernel running, a
launch on the event loop's thread waited about 295 ms behind a free made in the pool's own
background thread (``_reaper``). So the free does not wait there: that thread first waits for
the device with ``cuCtxSynchronize`` (:func:`settle`), which holds up no other thread, and the
free then finds the device idle, or waits only for what was enqueued since.

The wait runs with the thread in the relaxed capture mode, so that it never invalidates
another thread's stream capture; where the driver refuses it (a capture in progress) or it
fails (a faulted device), the free goes ahead as before and reports what it finds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ("LegacyPinned", "legacy_pinned_allocator", "settle")


class LegacyPinned:
    """A ``cuda.core`` legacy pinned buffer and the device whose context it was allocated in.

    Args:
        buffer: the buffer (``LegacyPinnedMemoryResource.allocate``).
        device: the ordinal of the device that was current, or -1 if none was.
    """

    __slots__ = ("buffer", "device", "size")

    def __init__(self, buffer: Any, device: int) -> None:
        self.buffer = buffer
        self.device = device
        self.size = int(buffer.size)  # what ``_abandon`` reports, should the device fail

    def __repr__(self) -> str:
        return f"<LegacyPinned {self.size} bytes of device {self.device}>"

    def close(self) -> None:
        """Free the buffer once its device went idle (:func:`settle`); blocking, so call it off
        the event loop's thread (the pool's ``_reaper`` does)."""
        settle(self.device)
        self.buffer.close()


def legacy_pinned_allocator() -> Callable[[int], tuple[LegacyPinned, int]]:
    """``nbytes -> (owner, pointer)``: a :class:`LegacyPinned` of ``cuda.core``'s
    ``LegacyPinnedMemoryResource``, in the context current on the calling thread."""
    from cuda.core import LegacyPinnedMemoryResource

    resource = LegacyPinnedMemoryResource()

    def allocate(nbytes: int) -> tuple[LegacyPinned, int]:
        buffer = resource.allocate(nbytes)
        return LegacyPinned(buffer, _current_device()), int(buffer.handle)

    return allocate


def _current_device() -> int:
    from cuda.bindings import driver as drv

    code, device = drv.cuCtxGetDevice()
    return int(device) if code == drv.CUresult.CUDA_SUCCESS else -1


def settle(device: int) -> None:
    """Wait on this thread until device *device*'s primary context has run all the work
    enqueued in it; nothing if *device* is -1 or its primary context is not active (nothing
    runs there). Driver errors are not raised: the free that follows meets them."""
    if device < 0:
        return
    from cuda.bindings import driver as drv

    ok = drv.CUresult.CUDA_SUCCESS
    code, handle = drv.cuDeviceGet(device)
    if code != ok:
        return
    code, _flags, active = drv.cuDevicePrimaryCtxGetState(handle)
    if code != ok or not active:
        return
    code, context = drv.cuDevicePrimaryCtxRetain(handle)
    if code != ok:
        return
    try:
        if drv.cuCtxPushCurrent(context)[0] != ok:
            return
        relaxed = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        code, mode = drv.cuThreadExchangeStreamCaptureMode(relaxed)
        try:
            drv.cuCtxSynchronize()
        finally:
            if code == ok:
                drv.cuThreadExchangeStreamCaptureMode(mode)
            drv.cuCtxPopCurrent()
    finally:
        drv.cuDevicePrimaryCtxRelease(handle)
