"""Resident storage on the device: upload, allocate, download, copy, free, and sharing it.

Uploads and downloads of at most ``CHUNKED_ABOVE`` bytes go through one pinned block and one
copy; larger ones stream in chunks. A download waits for the dispatches in flight that write the
buffer; dispatches that write it later are parked until the download's copy has its event.
A copy from another backend's buffer (``copy_in``) is one device-to-device copy, ordered the
same way: within one context ``cuMemcpyDtoDAsync``, between two ``cuMemcpyPeerAsync``, with
access to the other's memory set up once per pair where the devices allow it (``_peer_copies``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.bindings import driver as drv

from asyncgraph._args._bound_args import as_bytes
from asyncgraph._buffers._dlpack import KDL_CUDA
from asyncgraph._buffers._resident import ResidentBuffer, Use, storage_of, uses_of, writer_of
from asyncgraph._cuda.core._watches import learned
from asyncgraph._cuda.driver._driver import check, translate
from asyncgraph._cuda.lanes._staging_plan import dep_event
from asyncgraph._cuda.lanes._stream_order import chained_lane, wait_deps
from asyncgraph._jobs._scheduler import wait_finished
from asyncgraph._runtime._exceptions import AllocationError, CudaError

from ._chunked_transfer import CHUNKED_ABOVE, chunked
from ._peer_copies import DEVICE, route

if TYPE_CHECKING:
    from asyncgraph._cuda.device._cuda_device import Device
    from asyncgraph._front._engine_protocols import Sink
    from asyncgraph._runtime._finished import Download

__all__ = ("Storage",)


class Storage:
    """Resident storage of one device."""

    def __init__(self, device: Device) -> None:
        self._device = device
        self._sink: Sink = device.sink  # downloads let parked dispatches go

    async def upload(self, array: np.ndarray[Any, Any]) -> Any:
        """New device storage holding a copy of *array*."""
        device = self._device
        device.check_healthy()
        lane = device.lanes[device.stream_pool.pick().index]
        nbytes = array.nbytes
        storage = self._allocate(nbytes, lane.stream)
        if nbytes > CHUNKED_ABOVE:
            try:
                await chunked(device, lane).upload(as_bytes(array), int(storage.handle))
            except BaseException:
                with contextlib.suppress(Exception):
                    device.release_buffer(storage, lane.stream)  # after the copies in flight
                raise
            return storage
        block = device.pinned.acquire(nbytes)
        block.array[:nbytes] = as_bytes(array)
        try:
            check(
                drv.cuMemcpyHtoDAsync(int(storage.handle), block.ptr, nbytes, lane.handle),
                "cuMemcpyHtoDAsync",
            )
            event = lane.record()
        except CudaError:
            device.pinned.release(block)
            with contextlib.suppress(Exception):
                device.release_buffer(storage, lane.stream)
            raise

        def on_done(error: CudaError | None, cancelled: bool) -> Any:
            device.pinned.release(block)
            if error is not None or cancelled:
                device.release_buffer(storage, device.alloc_stream)
            return storage

        return await lane.future(event, on_done)

    def _allocate(self, nbytes: int, stream: Any) -> Any:
        device = self._device
        spare = device.spares.take(nbytes)  # freed after its last use: usable on any stream
        if spare is not None:
            return spare
        try:
            return device.memory_resource.allocate(nbytes, stream=stream)
        except Exception as exc:
            device.trim()
            try:
                return device.memory_resource.allocate(nbytes, stream=stream)
            except Exception as retry_exc:
                error = translate(retry_exc, "allocate")
                if isinstance(error, AllocationError):
                    raise AllocationError(
                        f"device out of memory allocating {nbytes} bytes for a resident "
                        "buffer; caches were trimmed first — free other resident buffers or "
                        "allocate less"
                    ) from retry_exc
                raise error from exc

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """New uninitialised device storage, usable from every stream at once."""
        device = self._device
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        storage = self._allocate(nbytes, device.alloc_stream)
        # The allocation stream holds only allocations: this returns at once, and makes the
        # memory usable from every stream.
        device.alloc_stream.sync()
        device.telemetry.count("sync_points")
        return storage

    def free(self, storage: Any) -> None:
        """Free device storage (every use completed), or keep it for the next allocation of
        its size (``_spares``)."""
        # After close (a DLPack consumer let go of a buffer late) the streams are gone; the
        # memory resource then frees without one.
        device = self._device
        if device.closed:
            device.release_buffer(storage, None)
        elif device.failure is not None or not device.spares.keep(storage, int(storage.size)):
            device.release_buffer(storage, device.alloc_stream)

    async def download(
        self,
        buffer: ResidentBuffer,
        use: Use,
        deps: list[Use],
        out: np.ndarray[Any, Any] | None,
    ) -> np.ndarray[Any, Any]:
        """Copy *buffer* into a new array (or *out*) after the writers in *deps*."""
        device = self._device
        device.check_healthy()
        if any(dep_event(dep) is False for dep in deps):
            # A writer is not launched yet (queued or compiling): wait for it to finish.
            await wait_finished(deps)
        # After writers on one stream, on that stream: ordered without a wait.
        lane = chained_lane(deps) or device.lanes[device.stream_pool.pick().index]
        wait_deps(deps, lane)
        nbytes = buffer.nbytes
        source = int(storage_of(buffer).handle)
        if nbytes > CHUNKED_ABOVE:
            # Later writers stay parked until the whole download finished (no event set).
            target = np.empty(buffer.shape, buffer.dtype) if out is None else out
            await chunked(device, lane).download(source, as_bytes(target))
            return target
        download: Download = use  # type: ignore[assignment]  # the front tracks a Download
        block = device.pinned.acquire(nbytes)
        try:
            check(
                drv.cuMemcpyDtoHAsync(block.ptr, source, nbytes, lane.handle),
                "cuMemcpyDtoHAsync",
            )
            event = lane.record()
        except CudaError:
            device.pinned.release(block)
            raise
        download.event = event
        self._sink.poke()
        shape, dtype = buffer.shape, buffer.dtype

        def on_done(error: CudaError | None, cancelled: bool) -> Any:
            # The reactor recycled the event: later writers must not wait on it.
            download.event = None
            download.finished.set()
            try:
                if error is not None or cancelled:
                    return None
                target = np.empty(shape, dtype) if out is None else out
                as_bytes(target)[:] = block.array[:nbytes]
                return target
            finally:
                device.pinned.release(block)

        array: np.ndarray[Any, Any] = await lane.future(event, on_done)
        return array

    def copy_in(
        self, buffer: ResidentBuffer, use: Use, deps: list[Use], source: Device
    ) -> Awaitable[Any]:
        """New storage here holding a copy of *buffer* (storage of *source*'s backend, this
        one's or another's), copied on the device after the writers in *deps*: enqueued now,
        with this device's context current, and the awaitable is its future; or, while a
        writer is not launched yet, a coroutine that waits for it first."""
        device = self._device
        device.check_healthy()
        source.check_healthy()
        if deps and any(dep_event(dep) is False for dep in deps):
            return device.ctx.steps(self._copy_after_writers(buffer, use, deps, source))
        return self._copy(buffer, use, deps, source)

    async def _copy_after_writers(
        self, buffer: ResidentBuffer, use: Use, deps: list[Use], source: Device
    ) -> Any:
        await wait_finished(deps)  # a writer is not launched yet
        self._device.check_healthy()
        source.check_healthy()
        return await self._copy(buffer, use, deps, source)

    def _copy(
        self, buffer: ResidentBuffer, use: Use, deps: list[Use], source: Device
    ) -> asyncio.Future[Any]:
        device = self._device
        lane = device.lanes[device.stream_pool.pick().index]
        nbytes = buffer.nbytes
        storage = self._allocate(nbytes, lane.stream)
        kind = route(device, source)
        try:
            if deps:  # events of another context are waited for all the same
                wait_deps(deps, lane)
            start = perf_counter()
            target, origin = int(storage.handle), int(storage_of(buffer).handle)
            if kind == DEVICE:
                check(
                    drv.cuMemcpyDtoDAsync(target, origin, nbytes, lane.handle),
                    "cuMemcpyDtoDAsync",
                )
            else:
                check(
                    drv.cuMemcpyPeerAsync(
                        target, device.context, origin, source.context, nbytes, lane.handle
                    ),
                    "cuMemcpyPeerAsync",
                )
            event = lane.record()
        except CudaError:
            with contextlib.suppress(Exception):
                device.release_buffer(storage, lane.stream)
            raise
        copy: Download = use  # type: ignore[assignment]  # the front tracks a Download
        copy.event = event  # the buffer's later writers wait for it

        # When it should end, at the pace such copies went so far (seconds a byte, learned).
        pace = device.copy_pace.get(kind, 0.0)

        def on_done(error: CudaError | None, cancelled: bool) -> Any:
            copy.event = None  # recycled by the reactor: later writers must not wait on it
            copy.finished.set()
            if error is not None or cancelled:  # failed, or nobody takes the copy
                device.release_buffer(storage, device.alloc_stream)
                return None
            if nbytes:  # (when a waiter thread saw it end, not when the loop heard of it)
                took = ((lane.seen or perf_counter()) - start) / nbytes
                device.copy_pace[kind] = learned(device.copy_pace.get(kind, 0.0), took)
            return storage

        expect = start + pace * nbytes if pace else 0.0
        future = lane.future(event, on_done, expect)
        if expect:  # awaited alone and ending soon: completed here, without a loop round trip
            device.reactor.spin(expect)
        return future

    # -- sharing with other libraries ------------------------------------------------------------

    def export_device(self) -> tuple[int, int]:
        """DLPack device of resident buffers: (``kDLCUDA``, ordinal)."""
        return (KDL_CUDA, self._device.device.device_id)

    def export_wait(self, buffer: ResidentBuffer, stream: int | None) -> None:
        """DLPack: make the consumer's *stream* (``None``: the legacy default stream; ``-1``:
        none) wait for every dispatch in flight that uses the buffer.

        Raises:
            BufferError: a use has not started, so there is nothing to order after yet.
        """
        events = _events_of(uses_of(buffer))
        if stream == -1 or not events:
            return
        target = drv.CUstream(1 if stream is None else int(stream))
        for event in events:
            check(drv.cuStreamWaitEvent(target, event, 0), "cuStreamWaitEvent")

    def export_stream(self, buffer: ResidentBuffer) -> int | None:
        """``__cuda_array_interface__``: the stream of the dispatch in flight that writes the
        buffer, or ``None``."""
        writer = writer_of(buffer)
        if writer is None or not _events_of([writer]):
            return None
        lane = getattr(writer, "lane", None)
        return int(lane.stream.handle) if lane is not None else None


def _events_of(uses: list[Any]) -> list[Any]:
    events = []
    for use in uses:
        event = dep_event(use)
        if event is False:
            raise BufferError(
                "a dispatch that uses this buffer is queued and has not started, so there "
                "is nothing to order after yet; await it first"
            )
        if event is not None:
            events.append(event)
    return events
