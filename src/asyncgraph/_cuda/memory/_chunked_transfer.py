"""Large transfers between numpy arrays and device memory, through two pinned chunks.

A transfer of more than ``CHUNKED_ABOVE`` (1 MiB) goes in chunks of ``TRANSFER_CHUNK`` (32 MiB)
through two pinned blocks, so the host copy of one chunk (in threads, off the event loop)
overlaps the DMA of the other. The pinned memory needed stays two chunks whatever the size, and
neither the loop nor a driver call waits on a host copy of the whole array.

A block goes back to the pool only once the DMA that used it completed, also when the transfer
is cancelled or fails half-way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.bindings import driver as drv

from asyncgraph._cuda.driver._driver import check
from asyncgraph._cuda.lanes._staging_plan import copy_into
from asyncgraph._runtime import _loop
from asyncgraph._runtime._exceptions import CudaError

if TYPE_CHECKING:
    from asyncgraph._cuda.device._cuda_device import Device
    from asyncgraph._cuda.lanes._lanes import Lane
    from asyncgraph.pool import HostPool, PinnedBlock

__all__ = ("CHUNKED_ABOVE", "TRANSFER_CHUNK", "ChunkedTransfer", "chunked")

# Transfers above this size go in chunks; smaller ones in one pinned block.
CHUNKED_ABOVE = 1 << 20
TRANSFER_CHUNK = 32 << 20

WaitEvent = Callable[[Any, Callable[[CudaError | None, bool], Any]], "asyncio.Future[Any]"]


class _Slot:
    """A pinned block and the DMA in flight on it (if any)."""

    __slots__ = ("block", "busy", "give_back")

    def __init__(self, block: PinnedBlock) -> None:
        self.block = block
        self.busy: asyncio.Future[Any] | None = None  # completes when its DMA completed
        self.give_back = False  # the transfer ended: release the block once the DMA is done


class ChunkedTransfer:
    """One chunked transfer on one stream (loop thread).

    Args:
        pool: the pinned pool the two blocks come from.
        events: takes a fresh event (``EventPool.take``).
        wait_event: ``wait_event(event, on_done)`` as the backend's reactor offers it; the event
            goes back to its pool when it completed.
        handle: the ``CUstream`` the copies are enqueued on.
        copy: copies bytes between two uint8 arrays, in threads (``_copy_into``).
        chunk: bytes per chunk.
    """

    def __init__(
        self,
        pool: HostPool,
        events: Callable[[], Any],
        wait_event: WaitEvent,
        handle: Any,
        copy: Callable[[np.ndarray[Any, Any], np.ndarray[Any, Any]], None],
        chunk: int = TRANSFER_CHUNK,
    ) -> None:
        self._pool = pool
        self._events = events
        self._wait_event = wait_event
        self._handle = handle
        self._copy = copy
        self._chunk = chunk
        self._slots: list[_Slot] = []

    async def _host_copy(self, dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
        await _loop.current_loop().run_in_executor(None, self._copy, dst, src)

    def _slot(self, k: int) -> _Slot:
        while len(self._slots) <= k % 2:
            self._slots.append(_Slot(self._pool.acquire(self._chunk)))
        return self._slots[k % 2]

    def _dma_done(self, slot: _Slot) -> None:
        """Record an event after the DMA just enqueued on *slot*'s block."""
        event = self._events()
        check(drv.cuEventRecord(event, self._handle), "cuEventRecord")
        pool = self._pool

        def on_done(error: CudaError | None, _cancelled: bool) -> None:
            if slot.give_back:
                pool.release(slot.block)

        slot.busy = self._wait_event(event, on_done)

    @staticmethod
    async def _until_free(slot: _Slot) -> None:
        busy = slot.busy
        if busy is not None:
            # Shielded: a cancelled transfer must not cancel the wait, whose completion is what
            # releases the block. Raises the device's error if the DMA failed.
            await _loop.shield(busy)
            slot.busy = None

    async def upload(self, src: np.ndarray[Any, Any], device_ptr: int) -> None:
        """Copy the uint8 array *src* to *device_ptr*; returns once the last DMA completed."""
        try:
            for k, off in enumerate(range(0, src.size, self._chunk)):
                n = min(self._chunk, src.size - off)
                slot = self._slot(k)
                await self._until_free(slot)
                await self._host_copy(slot.block.array[:n], src[off : off + n])
                check(
                    drv.cuMemcpyHtoDAsync(device_ptr + off, slot.block.ptr, n, self._handle),
                    "cuMemcpyHtoDAsync",
                )
                self._dma_done(slot)
            for slot in self._slots:
                await self._until_free(slot)
        finally:
            self._release()

    async def download(self, device_ptr: int, dst: np.ndarray[Any, Any]) -> None:
        """Copy *dst.size* bytes from *device_ptr* into the uint8 array *dst*.

        The DMA of the next chunk runs while the host copies the previous one out.
        """
        offsets = list(range(0, dst.size, self._chunk))
        try:

            def enqueue(k: int) -> None:
                off = offsets[k]
                n = min(self._chunk, dst.size - off)
                slot = self._slot(k)
                check(
                    drv.cuMemcpyDtoHAsync(slot.block.ptr, device_ptr + off, n, self._handle),
                    "cuMemcpyDtoHAsync",
                )
                self._dma_done(slot)

            enqueue(0)
            for k, off in enumerate(offsets):
                if k + 1 < len(offsets):
                    # The other block was copied out in the previous round: refill it now, so
                    # its DMA runs while this chunk is copied out.
                    enqueue(k + 1)
                slot = self._slot(k)
                await self._until_free(slot)
                n = min(self._chunk, dst.size - off)
                await self._host_copy(dst[off : off + n], slot.block.array[:n])
        finally:
            self._release()

    def _release(self) -> None:
        """Give the blocks back: now if idle, else once their DMA completed."""
        for slot in self._slots:
            if slot.busy is None or slot.busy.done():
                self._pool.release(slot.block)
            else:
                slot.give_back = True
        self._slots = []


def chunked(device: Device, lane: Lane) -> ChunkedTransfer:
    """Chunked transfers on *lane* through the device's pinned pool."""
    return ChunkedTransfer(
        device.pinned,
        device.events.take,
        lane.future,
        lane.handle,
        copy_into,
        TRANSFER_CHUNK,
    )
