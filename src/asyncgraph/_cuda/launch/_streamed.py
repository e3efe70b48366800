"""Dispatches whose arrays stream up and down in pinned chunks, one task each.

Dispatches whose arrays total more than the pinned cap are too big to stage in one block: each
input goes up in chunks through two pinned blocks, the kernel runs, and each output comes down
the same way (``_chunked_transfer.ChunkedTransfer``), so the pinned memory they need stays two
chunks whatever their size.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as drv

from asyncgraph._args._bound_args import as_bytes
from asyncgraph._cuda.driver._driver import check
from asyncgraph._cuda.memory._chunked_transfer import chunked
from asyncgraph._jobs._scheduler import wait_finished
from asyncgraph._runtime import _loop
from asyncgraph._runtime._exceptions import BackendClosedError, CudaError

from ..lanes._staging_plan import CudaJob, dep_event
from ..lanes._stream_order import wait_deps

if TYPE_CHECKING:
    from asyncgraph._cuda.device._cuda_device import Device
    from asyncgraph._front._engine_protocols import Sink

    from ._kernel_launch import Launches
    from ._staged import SmallPath

__all__ = ("StreamedPath",)


class StreamedPath:
    """Runs streamed dispatches, each in a task of its own."""

    def __init__(self, device: Device, launches: Launches, small: SmallPath) -> None:
        self._device = device
        self._launches = launches
        self._small = small
        self._sink: Sink = device.sink
        self.tasks: set[asyncio.Task[None]] = set()

    def launch(self, job: CudaJob) -> None:
        """Start *job*'s task."""
        task = self._sink.loop.create_task(self._device.ctx.steps(self._run(job)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, job: CudaJob) -> None:
        """Order on one stream: the chunked uploads, the outputs' memset, the kernel, then the
        chunked downloads. The device buffer is freed (stream-ordered) after the last copy that
        uses it was enqueued, also when the job fails or the task is cancelled."""
        device = self._device
        sink = self._sink
        call = job.call
        telemetry = device.telemetry
        kernel_done: asyncio.Future[Any] | None = None
        interrupted: BaseException | None = None
        stream = None
        device_time = None
        try:
            device.check_healthy()
            if job.deps and any(dep_event(dep) is False for dep in job.deps):
                await wait_finished(job.deps)
            lane = device.placed(job.priority)
            lane.take()
            job.lane = lane
            stream = lane.stream
            handle = lane.handle
            if job.deps:
                wait_deps(job.deps, lane)
            if job.fences:
                device.foreign.wait_fences(job.fences, lane)
            job.device_buffer = device.memory.allocate(job.total, stream)
            base = int(job.device_buffer.handle)
            for arg in call.args:
                if arg.uploads:
                    await chunked(device, lane).upload(as_bytes(arg.value), base + arg.offset)
                    telemetry.bytes_up += arg.nbytes
                    telemetry.copies_up += 1
            if job.total > job.up_end:
                check(
                    drv.cuMemsetD8Async(base + job.up_end, 0, job.total - job.up_end, handle),
                    "cuMemsetD8Async",
                )
            self._launches.enqueue(job, base, handle, stream)
            event = job.event = lane.record()

            def kernel_finished(_error: CudaError | None, _cancelled: bool) -> None:
                job.gpu_done = True  # the event is recycled: later uses must not wait on it
                job.event = None

            kernel_done = lane.future(event, kernel_finished)
            sink.poke()  # uses of its resident buffers that waited for its event
            arrays: dict[int, Any] = {}  # the downloaded result of each staged output
            for arg in call.returned:
                if arg.offset >= 0:
                    out = arrays[arg.index] = arg.empty()  # type: ignore[attr-defined]  # staged
                    await chunked(device, lane).download(base + arg.offset, as_bytes(out))
                    telemetry.bytes_down += arg.nbytes
                    telemetry.copies_down += 1
            await kernel_done
            if job.timing:
                ms = check(
                    drv.cuEventElapsedTime(job.start_event, job.end_event), "cuEventElapsedTime"
                )
                device_time = ms / 1e3
            outcome: tuple[Any, ...] | BaseException = call.results(lambda arg: arrays[arg.index])
        except BaseException as exc:
            if kernel_done is not None:
                # Its completion releases the event; its error (if any) is this one's cause.
                with contextlib.suppress(BaseException):
                    await _loop.shield(kernel_done)
            elif job.lane is not None:
                job.lane.settle()  # no event follows what was enqueued: wait for the stream
            device_time = None
            if isinstance(exc, Exception):
                outcome = exc
            else:  # the task was cancelled (the loop is shutting down): say so to the caller
                interrupted = exc
                outcome = BackendClosedError(
                    "the event loop cancelled this dispatch while its arrays streamed; "
                    "close the backend before the loop ends"
                )
        finally:
            if job.device_buffer is not None and stream is not None:
                with contextlib.suppress(Exception):  # after a device fault frees fail too
                    device.memory.free(job.device_buffer, stream)
                job.device_buffer = None
            self._small.release(job)
        sink.done(job, outcome, device_time)
        if interrupted is not None:
            raise interrupted
