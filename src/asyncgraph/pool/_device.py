"""Device memory: stream-ordered allocation through any ``cuda.core`` MemoryResource.

The default is the device's own memory resource (``Device.memory_resource``, the driver's
default memory pool, allocating with ``cuMemAllocFromPoolAsync``); plug another in with
``BackendOptions(device_memory=...)``. Allocations and frees are ordered on the stream that uses
the memory, so a free enqueued right after the last copy that reads it is safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import attrs

from asyncgraph._runtime._exceptions import AllocationError
from asyncgraph._runtime._poison import fault_from

__all__ = ("DeviceMemory", "DeviceMemoryStatistics", "StreamOrderedDeviceMemory")


@attrs.frozen(kw_only=True)
class DeviceMemoryStatistics:
    """Counts of a device memory adapter, frozen at the moment of ``statistics()``.

    ``bytes_in_use`` counts the allocations of dispatches in flight; ``bytes_reserved`` counts
    long-lived scratch memory the backend holds until it closes (not part of ``bytes_in_use``).
    ``pool_bytes_reserved`` is what the memory resource's pool holds from the driver (its
    ``reserved_mem_current``: free blocks it keeps for reuse included), or ``None`` for a
    resource that is no memory pool.
    """

    allocations: int
    frees: int
    bytes_in_use: int
    peak_bytes_in_use: int
    out_of_memory: int
    bytes_reserved: int = 0
    pool_bytes_reserved: int | None = None


@runtime_checkable
class DeviceMemory(Protocol):
    """What a backend needs of device memory."""

    def allocate(self, nbytes: int, stream: Any) -> Any:
        """A ``cuda.core`` Buffer of *nbytes*, ordered on *stream*."""
        ...

    def free(self, buffer: Any, stream: Any) -> None:
        """Free *buffer*, ordered after the work already enqueued on *stream*."""
        ...

    def statistics(self) -> DeviceMemoryStatistics:
        """Frozen counts."""
        ...


class StreamOrderedDeviceMemory:
    """The default :class:`DeviceMemory`: any ``cuda.core`` MemoryResource, stream-ordered.

    Args:
        resource: the memory resource (``Device.memory_resource`` by default in the backend).
        trim: called once when an allocation fails for lack of memory, to free caches before
            the one retry.
    """

    def __init__(
        self,
        resource: Any,
        trim: Callable[[], None] | None = None,
        release: Callable[[Any, Any], None] | None = None,
    ) -> None:
        self.resource = resource
        self._trim = trim
        # How a buffer is given back: ``buffer.close(stream)`` unless the owner says otherwise
        # (a backend whose device failed abandons its buffers instead: ``pool._abandon``).
        self._release = release if release is not None else _close
        self._allocations = 0
        self._frees = 0
        self._in_use = 0
        self._peak = 0
        self._oom = 0
        self._reserved = 0

    def __repr__(self) -> str:
        return (
            f"<StreamOrderedDeviceMemory {type(self.resource).__name__} "
            f"in_use={self._in_use} B peak={self._peak} B reserved={self._reserved} B "
            f"allocations={self._allocations}>"
        )

    def allocate(self, nbytes: int, stream: Any) -> Any:
        """Allocate *nbytes* on *stream*.

        Raises:
            AllocationError: the device is out of memory even after trimming caches.
        """
        buffer = self._allocate(nbytes, stream)
        self._allocations += 1
        self._in_use += nbytes
        self._peak = max(self._peak, self._in_use)
        return buffer

    def reserve(self, nbytes: int, stream: Any) -> Any:
        """Allocate *nbytes* the caller keeps for a long time (scratch memory), counted in
        ``bytes_reserved``; give it back with :meth:`unreserve`.

        Raises:
            AllocationError: the device is out of memory even after trimming caches.
        """
        buffer = self._allocate(nbytes, stream)
        self._reserved += nbytes
        return buffer

    def unreserve(self, buffer: Any, stream: Any) -> None:
        """Free a buffer from :meth:`reserve`, ordered on *stream*."""
        self._reserved -= int(buffer.size)
        self._release(buffer, stream)

    def _allocate(self, nbytes: int, stream: Any) -> Any:
        try:
            buffer = self.resource.allocate(nbytes, stream=stream)
        except Exception as exc:
            fault = fault_from(exc, "cuMemAllocFromPoolAsync")
            if fault is not None:  # a sticky fault, here or anywhere in the process
                raise fault from exc
            if "OUT_OF_MEMORY" not in str(exc):
                raise
            self._oom += 1
            if self._trim is not None:
                self._trim()
            try:
                buffer = self.resource.allocate(nbytes, stream=stream)
            except Exception as retry_exc:
                raise AllocationError(
                    f"device out of memory allocating {nbytes} bytes "
                    f"({self._in_use} bytes in use by this backend); caches were trimmed "
                    "first — make the work smaller or free resident buffers"
                ) from retry_exc
        return buffer

    def free(self, buffer: Any, stream: Any) -> None:
        """Free *buffer* ordered on *stream*."""
        self._in_use -= int(buffer.size)
        self._frees += 1
        self._release(buffer, stream)

    def statistics(self) -> DeviceMemoryStatistics:
        """Frozen counts."""
        return DeviceMemoryStatistics(
            allocations=self._allocations,
            frees=self._frees,
            bytes_in_use=self._in_use,
            peak_bytes_in_use=self._peak,
            out_of_memory=self._oom,
            bytes_reserved=self._reserved,
            pool_bytes_reserved=_pool_reserved(self.resource),
        )


def _pool_reserved(resource: Any) -> int | None:
    """The bytes a ``cuda.core`` memory pool holds from the driver, or ``None``."""
    if getattr(resource, "is_closed", False):
        return None
    try:
        return int(resource.attributes.reserved_mem_current)
    except Exception:  # a resource without pool attributes, or a driver that refuses
        return None


def _close(buffer: Any, stream: Any) -> None:
    buffer.close(stream)
