"""The CUDA dispatch path: staging layout, launch, completion.

One dispatch makes at most one pinned block and one device allocation, laid out as
``[inputs | in-outs | outputs]`` (each 256-byte aligned), so it costs one host-to-device copy
(inputs and in-outs), one memset (outputs), the launch, one device-to-host copy (in-outs and
outputs), a stream-ordered free and an event record — whatever the number of arguments. A
dispatch with no transfers (resident buffers and scalars only) is the launch and the event.

The pinned block goes back to its pool only in the completion callback, after the event that
follows the last copy completed.

Small dispatches (at most ``SCRATCH_BYTES`` of device memory) use their stream's scratch buffer
(allocated when the backend opens) instead of a fresh allocation: every use of it is ordered
on that one stream, so a dispatch's upload cannot start before the previous dispatch's
download finished. That saves the stream-ordered allocation and free (about 10 µs of host
time per dispatch through ``cuda.core``, measured on an NVIDIA H100 80GB HBM3).

Dispatches whose arrays total more than the pinned cap (``pinned_pool_bytes``, at least
``STREAM_MIN``) are *streamed*: each input goes up in chunks through two pinned blocks, the kernel
runs, and each output comes down the same way (``_transfer.ChunkedTransfer``), so the pinned
memory they need stays two chunks whatever their size.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from cuda.bindings import driver as drv
from cuda.core import LaunchConfig, launch

from . import _loop
from ._args import (
    DEVICE,
    IN,
    INOUT,
    OUT,
    RESIDENT,
    RESIDENT_OUT,
    SCALAR,
    BoundCall,
)
from ._backend import Backend, Job
from ._checks import check_pointer_dtype
from ._cudadrv import SUCCESS, check, error_for, translate
from ._events import EventPool
from ._exceptions import ArgumentTypeError, BackendClosedError, CudaError, DispatchError
from ._kernel import Kernel, Param
from ._reactor import Reactor
from ._transfer import ChunkedTransfer
from .pool import HostPool, PinnedBlock, PinnedMemory, StreamOrderedDeviceMemory, StreamPool
from .pool._pinned import pinned_memory_of

__all__ = ("CudaDispatch", "CudaJob", "Launcher", "dep_event")

_ALIGN = 256
_DEFAULT_SHARED = 48 * 1024
# Staging copies of at least this many bytes run off the event loop, split over threads.
BIG_COPY = 4 << 20
# Outputs of at least this many bytes are downloaded into pinned memory that the result arrays
# then own (no copy out of staging), while the backend has lent less than its pinned budget.
PINNED_RESULTS = 1 << 20
_CHUNK = 4 << 20
# Dispatches needing at most this much device memory use their stream's scratch buffer.
SCRATCH_BYTES = 1 << 20
# Dispatches moving more than max(pinned cap, this) bytes stream them in chunks.
STREAM_MIN = 64 << 20
_copiers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="asyncgraph-copy")


def _copy_into(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
    """Copy bytes *src* into *dst* (equal-length uint8 arrays), chunks in parallel threads.

    numpy releases the GIL while it copies, so the chunks run truly in parallel.
    """
    n = dst.size
    if n < 2 * _CHUNK:
        dst[:] = src
        return
    bounds = [(start, min(start + _CHUNK, n)) for start in range(0, n, _CHUNK)]

    def part(bound: tuple[int, int]) -> None:
        lo, hi = bound
        dst[lo:hi] = src[lo:hi]

    list(_copiers.map(part, bounds))


def _as_bytes(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return array.reshape(-1).view(np.uint8)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def layout(args: list[tuple[int, Any, Any]]) -> tuple[list[int], tuple[int, int, int]]:
    """Where each staged argument lies in ``[inputs | in-outs | outputs]`` (256-byte aligned,
    -1 for the others), and the bounds: end of the inputs, end of the region copied up, total."""
    offsets = [-1] * len(args)
    pos = in_end = up_end = 0
    for want in (IN, INOUT, OUT):
        if want == INOUT:
            in_end = pos
        elif want == OUT:
            up_end = pos
        for i, (kind, value, _param) in enumerate(args):
            if kind == want:
                offsets[i] = pos
                pos += _aligned(value.nbytes)
    return offsets, (in_end, up_end, pos)


class Launcher:
    """A loaded kernel's ``CUfunction`` and a reusable parameter block for ``cuLaunchKernel``.

    Each parameter has a 16-byte slot; ``kernel_params`` is the address of the array of slot
    addresses the driver reads. A dispatch writes its values into the slots and launches: the
    driver copies the parameters during the call, and only the event loop's thread launches,
    so one block per kernel serves every dispatch. Measured on an NVIDIA H100 80GB HBM3, this
    is what takes the launch from about 5 µs (``cuda.core.launch``) to the bare driver call.
    """

    __slots__ = ("_keep", "function", "kernel_params", "slot_views", "slots")

    def __init__(self, function: Any, params: tuple[Param, ...]) -> None:
        self.function = function
        n = len(params)
        self.slots = np.zeros(2 * max(n, 1), np.uint64)
        base = self.slots.ctypes.data
        raw = self.slots.view(np.uint8)
        addresses = np.array([base + 16 * i for i in range(n)] or [0], np.uint64)
        self._keep = addresses
        self.kernel_params = int(addresses.ctypes.data) if n else 0
        views = []
        for i, param in enumerate(params):
            dtype = np.dtype(np.uint64) if param.pointer else param.dtype
            assert dtype is not None  # Launcher.for_kernel only takes fully typed kernels
            views.append(raw[16 * i : 16 * i + dtype.itemsize].view(dtype))
        self.slot_views: list[np.ndarray[Any, Any]] = views

    @staticmethod
    def for_kernel(kernel: Kernel, loaded: Any) -> Launcher | None:
        """A launcher for *kernel*, or ``None`` when a parameter's type is unknown (then the
        dispatch goes through ``cuda.core.launch``, which packs any argument)."""
        params = kernel.params
        if params is None or any(not p.pointer and p.dtype is None for p in params):
            return None
        if any(p.dtype is not None and p.dtype.itemsize > 16 for p in params):
            return None
        function = check(
            drv.cuKernelGetFunction(drv.CUkernel(int(loaded.handle))), "cuKernelGetFunction"
        )
        return Launcher(function, params)


class CudaJob(Job):
    """A dispatch on the CUDA backend, with its staging and events."""

    __slots__ = (
        "block",
        "device_buffer",
        "direct",
        "end_event",
        "event",
        "foreign",
        "gpu_done",
        "in_end",
        "lane",
        "offsets",
        "out_block",
        "replay",
        "stage_hi",
        "stage_lo",
        "staged",
        "start_event",
        "streamed",
        "total",
        "up_end",
    )

    def __init__(self, call: BoundCall, timing: bool) -> None:
        super().__init__(call, timing)
        self.block: PinnedBlock | None = None
        self.device_buffer: Any = None
        self.event: Any = None
        self.start_event: Any = None
        self.end_event: Any = None
        self.lane: Any = None
        self.offsets: list[int] = []
        self.in_end = 0  # end of the inputs (start of the region copied back)
        self.up_end = 0  # end of the region copied up (inputs and in-outs)
        self.total = 0
        self.foreign: list[tuple[int, int | None]] = []  # (pointer, producer stream) per DEVICE
        self.staged = False  # inputs already copied into the pinned block
        # Inputs that already lie in this backend's pinned memory go up straight from there:
        # (host pointer, device offset, bytes) each, or None when they are staged.
        self.direct: list[tuple[int, int, int]] | None = None
        # The device range [stage_lo, stage_hi) the staging block mirrors.
        self.stage_lo = 0
        self.stage_hi = 0
        self.out_block: PinnedBlock | None = None  # pinned memory the results will own
        self.gpu_done = False  # its event completed (its outputs may still be copied out)
        self.streamed = False  # its arrays go up and down in chunks (``_run_streamed``)
        self.replay: Any = None  # the graph it replays (CachedGraph / CapturedGraph), if any


def dep_event(dep: Any) -> Any:
    """What a use that depends on *dep* must wait for.

    Returns the event to wait on, ``None`` when *dep* already finished (nothing to wait for), or
    ``False`` when *dep* has no event yet (not launched: wait until it is).
    """
    if isinstance(dep, Job):
        if dep.pending.done() or getattr(dep, "gpu_done", False):
            return None
        event = getattr(dep, "event", None)
        return event if event is not None else False
    finished = getattr(dep, "finished", None)
    if finished is not None and finished.is_set():
        return None
    event = getattr(dep, "event", None)
    return event if event is not None else False


def _foreign_array(value: Any, where: str, param: Any) -> tuple[int, int | None]:
    """Pointer and producer stream of a device array with ``__cuda_array_interface__``."""
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is None:
        raise ArgumentTypeError(
            f"{where} is a device array without __cuda_array_interface__; pass a CuPy array or "
            "a PyTorch CUDA tensor"
        )
    try:
        shape = tuple(int(d) for d in cai["shape"])
        dtype = np.dtype(cai["typestr"])
        data = cai["data"]
        strides = cai.get("strides")
        pointer = int(data[0])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ArgumentTypeError(
            f"{where} has a malformed __cuda_array_interface__ ({type(exc).__name__}: {exc}); "
            "it needs 'shape', 'typestr' and 'data' (version 3)"
        ) from None
    if strides is not None:
        expected = []
        step = dtype.itemsize
        for dim in reversed(shape):
            expected.append(step)
            step *= dim
        if tuple(reversed(expected)) != tuple(strides) and int(np.prod(shape)) > 1:
            raise DispatchError(
                f"{where} is a device array that is not C-contiguous; make it contiguous "
                "first (cupy.ascontiguousarray(x) or x.contiguous())"
            )
    if int(np.prod(shape, dtype=np.int64)) == 0:
        raise DispatchError(f"{where} is an empty device array; skip the dispatch")
    check_pointer_dtype(dtype, where, param)
    stream = cai.get("stream")
    return pointer, (int(stream) if stream else None)


class CudaDispatch(Backend):
    """The dispatch path of the CUDA backend; ``CudaBackend`` sets this state up."""

    _pinned: HostPool
    _device_memory: StreamOrderedDeviceMemory
    _stream_pool: StreamPool[Any]
    _handles: list[Any]
    _events: EventPool
    _timing_events: EventPool
    _loaded: dict[Kernel, Any]
    _launchers: dict[Kernel, Launcher | None]
    _device: Any
    _reactor_: Reactor | None
    _tasks: set[asyncio.Task[None]]

    @property
    def _reactor(self) -> Reactor:
        raise NotImplementedError

    def _needs_compile(self, job: CudaJob) -> bool:
        raise NotImplementedError

    def _chunked(self, lane: Any) -> ChunkedTransfer:
        raise NotImplementedError

    def _wait_event(self, lane: int, event: Any, on_done: Any) -> asyncio.Future[Any]:
        raise NotImplementedError

    def _init_dispatch(self) -> None:
        self._parked: list[CudaJob] = []
        self._configs: dict[tuple[Any, ...], Any] = {}
        self._smem_set: dict[Any, int] = {}
        self._launchers = {}
        self._lent = 0  # bytes of pinned blocks lent to numpy arrays
        self._lend_limit = self.options.pinned_pool_bytes
        self._stream_above = max(self.options.pinned_pool_bytes, STREAM_MIN)
        # One scratch buffer per stream, kept until close. Allocated now, before any kernel
        # runs: growing the memory pool later may wait for kernels in flight (a short dispatch
        # was seen waiting for a 300 ms kernel on another stream).
        self._scratch: list[Any] = []
        self._scratch_ptrs: list[int] = []
        for lane in self._stream_pool.lanes:
            buffer = self._device_memory.reserve(SCRATCH_BYTES, lane.stream)
            self._scratch.append(buffer)
            self._scratch_ptrs.append(int(buffer.handle))

    # -- planning (in dispatch(), before anything starts) ---------------------------------------

    def _plan(self, call: BoundCall, timing: bool) -> CudaJob:
        job = CudaJob(call, timing)
        args = call.args
        if not call.bytes_in and not call.bytes_out:
            # Scalars and resident buffers only: nothing to stage.
            if any(kind == DEVICE for kind, _value, _param in args):
                self._plan_foreign(job)
            return job
        job.offsets, (job.in_end, job.up_end, pos) = layout(args)
        job.total = pos
        if pos > self._stream_above:
            job.streamed = True
            self._plan_foreign(job)
            return job
        if call.bytes_in:
            job.direct = self._direct_inputs(call, job.offsets)
        job.stage_lo = job.in_end if job.direct is not None else 0
        job.stage_hi = pos
        self._plan_foreign(job)
        return job

    def _claim_result_memory(self, job: CudaJob) -> None:
        """Give big outputs pinned memory of their own, which the result arrays will own."""
        out_bytes = job.total - job.in_end
        if out_bytes < PINNED_RESULTS or self._lent + out_bytes > self._lend_limit:
            return
        job.out_block = self._pinned.acquire(out_bytes)
        self._lent += job.out_block.size
        # Staging then holds the inputs only, or nothing when they go up straight from pinned.
        job.stage_hi = job.stage_lo if job.direct is not None else job.up_end

    def _direct_inputs(
        self, call: BoundCall, offsets: list[int]
    ) -> list[tuple[int, int, int]] | None:
        """Where each input lies in this backend's pinned memory, or ``None`` if one does not."""
        direct = []
        for i, (kind, value, _param) in enumerate(call.args):
            if kind in (IN, INOUT):
                memory = pinned_memory_of(value)
                if memory is None or memory.owner is not self._pinned:
                    return None
                direct.append((value.__array_interface__["data"][0], offsets[i], value.nbytes))
        return direct

    @staticmethod
    def _plan_foreign(job: CudaJob) -> None:
        for i, (kind, value, param) in enumerate(job.call.args):
            if kind == DEVICE:
                where = f"args[{i}] of {job.call.kernel.name!r}"
                job.foreign.append(_foreign_array(value, where, param))

    # -- starting ------------------------------------------------------------------------------

    def _start_job(self, job: CudaJob) -> None:
        if self._failure is not None:
            raise self._failure
        if job.call.kernel not in self._loaded and self._needs_compile(job):
            return
        self._start_loaded(job)

    def _start_loaded(self, job: CudaJob) -> None:
        if job.streamed:
            task = self._event_loop.create_task(self._run_streamed(job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if job.total and not job.staged and job.out_block is None:
            try:
                self._claim_result_memory(job)
            except Exception as exc:
                self._complete(job, exc)
                return
        if job.up_end >= BIG_COPY and not job.staged and job.direct is None:
            self._stage_off_loop(job)
            return
        if job.deps and any(dep_event(dep) is False for dep in job.deps):
            # A use it depends on is not launched yet (compiling, parked, or a download that
            # waits for its own writers): park it until that use has an event.
            self._parked.append(job)
            return
        try:
            self._launch(job)
        except Exception as exc:
            self._complete(job, exc)
        if self._parked:
            self._unpark()

    def _stage_off_loop(self, job: CudaJob) -> None:
        """Copy large inputs into pinned memory in threads, then start the job again."""
        try:
            block = job.block = self._pinned.acquire(job.stage_hi)
        except Exception as exc:
            self._release_job(job)
            self._complete(job, exc)
            return

        def stage() -> None:
            view = block.array
            for i, (kind, value, _param) in enumerate(job.call.args):
                if kind in (IN, INOUT):
                    off = job.offsets[i]
                    _copy_into(view[off : off + value.nbytes], _as_bytes(value))

        def staged(future: Any) -> None:
            error = future.exception()
            if error is not None:
                self._release_job(job)
                self._complete(job, error)
                return
            job.staged = True
            self._start_loaded(job)

        self._event_loop.run_in_executor(None, stage).add_done_callback(staged)

    def _launch_or_fail(self, job: CudaJob) -> None:
        try:
            self._launch(job)
        except Exception as exc:
            self._complete(job, exc)

    def _unpark(self) -> None:
        """Launch every parked job whose dependencies have events, until none is left ready.

        Jobs that share no buffer may launch out of call order; the ones that do are ordered by
        their dependencies, which is what call order means for them.
        """
        progress = True
        while progress and self._parked:
            progress = False
            for job in list(self._parked):
                if any(dep_event(dep) is False for dep in job.deps):
                    continue
                self._parked.remove(job)
                self._launch_or_fail(job)
                progress = True

    def _config(self, call: BoundCall) -> Any:
        key = (call.grid, call.block, call.shared_mem)
        config = self._configs.get(key)
        if config is None:
            config = self._configs[key] = LaunchConfig(
                grid=call.grid, block=call.block, shmem_size=call.shared_mem
            )
        return config

    def _allow_shared(self, loaded: Any, nbytes: int) -> None:
        if nbytes <= self._smem_set.get(loaded, _DEFAULT_SHARED):
            return
        attribute = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(
            drv.cuKernelSetAttribute(
                attribute, nbytes, drv.CUkernel(int(loaded.handle)), self._device.device_id
            ),
            "cuKernelSetAttribute",
        )
        self._smem_set[loaded] = nbytes

    def _launch(self, job: CudaJob) -> None:
        if job.replay is not None:
            self._launch_replay(job)
            return
        call = job.call
        lane = self._stream_pool.pick()
        lane.outstanding += 1
        job.lane = lane
        stream = lane.stream
        handle = self._handles[lane.index]
        telemetry = self.telemetry
        enqueued = False
        try:
            if job.deps:
                self._wait_deps(job.deps, handle)
            base = 0
            block = None
            if job.total:
                if job.stage_hi > job.stage_lo:
                    if job.block is None:
                        job.block = self._pinned.acquire(job.stage_hi - job.stage_lo)
                    block = job.block
                if not job.staged and job.direct is None and block is not None:
                    view = block.array
                    offsets = job.offsets
                    for i, (kind, value, _param) in enumerate(call.args):
                        if kind in (IN, INOUT):
                            off = offsets[i]
                            view[off : off + value.nbytes] = _as_bytes(value)
                if job.total <= SCRATCH_BYTES:
                    base = self._scratch_ptrs[lane.index]
                else:
                    job.device_buffer = self._device_memory.allocate(job.total, stream)
                    base = int(job.device_buffer.handle)
                enqueued = True
                if job.up_end:
                    if job.direct is not None:
                        for ptr, off, nbytes in job.direct:
                            check(
                                drv.cuMemcpyHtoDAsync(base + off, ptr, nbytes, handle),
                                "cuMemcpyHtoDAsync",
                            )
                        telemetry.copies_up += len(job.direct)
                    else:
                        check(
                            drv.cuMemcpyHtoDAsync(base, block.ptr, job.up_end, handle),  # type: ignore[union-attr]  # inputs are staged
                            "cuMemcpyHtoDAsync",
                        )
                        telemetry.copies_up += 1
                    telemetry.bytes_up += job.up_end
                if job.total > job.up_end:
                    check(
                        drv.cuMemsetD8Async(base + job.up_end, 0, job.total - job.up_end, handle),
                        "cuMemsetD8Async",
                    )
            self._enqueue_kernel(job, base, handle, stream)
            enqueued = True
            if job.total > job.in_end:
                down = job.total - job.in_end
                if job.out_block is not None:
                    target = job.out_block.ptr
                else:
                    target = block.ptr + job.in_end - job.stage_lo  # type: ignore[union-attr]  # outputs are staged
                check(
                    drv.cuMemcpyDtoHAsync(target, base + job.in_end, down, handle),
                    "cuMemcpyDtoHAsync",
                )
                telemetry.bytes_down += down
                telemetry.copies_down += 1
        except Exception as exc:
            failure: Exception | None = exc
        else:
            failure = None
        finally:
            if job.device_buffer is not None:
                self._device_memory.free(job.device_buffer, stream)
                job.device_buffer = None
        if failure is not None:
            if enqueued:
                # Copies may be in flight: release the staging only once they are done.
                cleanup = self._events.take()
                drv.cuEventRecord(cleanup, handle)
                self._reactor.watch(lane.index, cleanup, lambda _error: self._release_job(job))
            else:
                self._release_job(job)
            raise failure
        event = job.event = self._events.take()
        code = drv.cuEventRecord(event, handle)[0]
        if code != SUCCESS:
            self._events.give(event)
            job.event = None
            self._release_job(job)
            raise error_for(code, "cuEventRecord")
        reactor = self._reactor_ or self._reactor
        reactor.watch(lane.index, event, lambda error: self._done(job, error))
        job.pending._spin = reactor.spin

    @staticmethod
    def _wait_deps(deps: list[Any], handle: Any) -> None:
        """Make the stream *handle* wait for the launched uses in *deps* (finished ones need no
        wait; unlaunched ones were waited for before)."""
        for dep in deps:
            event = dep_event(dep)
            if event is not None and event is not False:
                check(drv.cuStreamWaitEvent(handle, event, 0), "cuStreamWaitEvent")

    def _launch_replay(self, job: CudaJob) -> None:
        """Launch the graph *job* replays (its inputs are in place) and watch its event."""
        lane = self._stream_pool.pick()
        lane.outstanding += 1
        job.lane = lane
        handle = self._handles[lane.index]
        try:
            if job.deps:
                self._wait_deps(job.deps, handle)
            job.replay._enqueue(handle)
        except Exception:
            self._release_job(job)
            raise
        event = self._events.take()
        code = drv.cuEventRecord(event, handle)[0]
        if code != SUCCESS:
            self._events.give(event)
            self._release_job(job)
            raise error_for(code, "cuEventRecord")
        job.event = event
        reactor = self._reactor_ or self._reactor
        reactor.watch(lane.index, event, lambda error: self._done(job, error))
        job.pending._spin = reactor.spin

    def _enqueue_kernel(self, job: CudaJob, base: int, handle: Any, stream: Any) -> None:
        """Enqueue *job*'s kernel (between its timing events) on *handle*; its staged arrays
        start at device address *base*."""
        call = job.call
        if call.shared_mem > _DEFAULT_SHARED:
            self._allow_shared(self._loaded[call.kernel], call.shared_mem)
        if job.timing:
            job.start_event = self._timing_events.take()
            check(drv.cuEventRecord(job.start_event, handle), "cuEventRecord")
        launcher = self._launchers.get(call.kernel)
        if launcher is not None:
            self._pack(job, launcher, base, handle)
            grid = call.grid
            block_dim = call.block
            code = drv.cuLaunchKernel(
                launcher.function,
                grid[0],
                grid[1],
                grid[2],
                block_dim[0],
                block_dim[1],
                block_dim[2],
                call.shared_mem,
                handle,
                launcher.kernel_params,
                0,
            )[0]
            if code != SUCCESS:
                raise error_for(code, "cuLaunchKernel")
        else:
            args = self._arguments(job, base, handle)
            try:
                launch(stream, self._config(call), self._loaded[call.kernel], *args)
            except Exception as exc:
                raise translate(exc, "cuLaunchKernel") from exc
        if job.timing:
            job.end_event = self._timing_events.take()
            check(drv.cuEventRecord(job.end_event, handle), "cuEventRecord")

    async def _run_streamed(self, job: CudaJob) -> None:
        """Run a dispatch whose arrays stream up and down in pinned chunks (a task per job).

        Order on one stream: the chunked uploads, the outputs' memset, the kernel, then the
        chunked downloads. The device buffer is freed (stream-ordered) after the last copy
        that uses it was enqueued, also when the job fails or the task is cancelled.
        """
        call = job.call
        telemetry = self.telemetry
        kernel_done: asyncio.Future[Any] | None = None
        interrupted: BaseException | None = None
        stream = None
        try:
            if self._failure is not None:
                raise self._failure
            if job.deps and any(dep_event(dep) is False for dep in job.deps):
                await self._wait_jobs(job.deps)
            lane = job.lane = self._stream_pool.pick()
            lane.outstanding += 1
            stream = lane.stream
            handle = self._handles[lane.index]
            if job.deps:
                self._wait_deps(job.deps, handle)
            job.device_buffer = self._device_memory.allocate(job.total, stream)
            base = int(job.device_buffer.handle)
            offsets = job.offsets
            for i, (kind, value, _param) in enumerate(call.args):
                if kind in (IN, INOUT):
                    await self._chunked(lane).upload(_as_bytes(value), base + offsets[i])
                    telemetry.bytes_up += value.nbytes
                    telemetry.copies_up += 1
            if job.total > job.up_end:
                check(
                    drv.cuMemsetD8Async(base + job.up_end, 0, job.total - job.up_end, handle),
                    "cuMemsetD8Async",
                )
            self._enqueue_kernel(job, base, handle, stream)
            event = self._events.take()
            code = drv.cuEventRecord(event, handle)[0]
            if code != SUCCESS:
                self._events.give(event)
                raise error_for(code, "cuEventRecord")
            job.event = event

            def kernel_finished(_error: CudaError | None, _cancelled: bool) -> None:
                job.gpu_done = True  # the event is recycled: later uses must not wait on it
                job.event = None

            kernel_done = self._wait_event(lane.index, event, kernel_finished)
            if self._parked:
                self._unpark()  # uses of its resident buffers that waited for its event
            results: list[Any] = []
            for i, (kind, value, _param) in enumerate(call.args):
                if kind in (OUT, INOUT):
                    out = np.empty(value.shape, value.dtype)
                    await self._chunked(lane).download(base + offsets[i], _as_bytes(out))
                    telemetry.bytes_down += value.nbytes
                    telemetry.copies_down += 1
                    results.append(out)
                elif kind == RESIDENT_OUT:
                    results.append(value)
            await kernel_done
            device_time = None
            if job.timing:
                ms = check(
                    drv.cuEventElapsedTime(job.start_event, job.end_event), "cuEventElapsedTime"
                )
                device_time = ms / 1e3
            outcome: tuple[Any, ...] | BaseException = tuple(results)
        except BaseException as exc:
            if kernel_done is not None:
                # Its completion releases the event; its error (if any) is this one's cause.
                with contextlib.suppress(BaseException):
                    await _loop.shield(kernel_done)
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
                    self._device_memory.free(job.device_buffer, stream)
                job.device_buffer = None
            self._release_job(job)
        self._complete(job, outcome, device_time)
        if self._parked:
            self._unpark()
        if interrupted is not None:
            raise interrupted

    def _free_scratch(self) -> None:
        """Give the scratch buffers back (closing; every dispatch completed)."""
        for index, buffer in enumerate(self._scratch):
            if buffer is not None:
                self._scratch[index] = None
                self._scratch_ptrs[index] = 0
                try:
                    self._device_memory.unreserve(buffer, self._stream_pool.lanes[index].stream)
                except Exception:
                    if self._failure is None:
                        raise  # after a device fault the context is lost and frees fail

    def _values(self, job: CudaJob, base: int, handle: Any) -> list[Any]:
        """Each argument's launch value: the scalar, or the device pointer as an int.

        Zeroes resident outputs and orders the stream after foreign producers on the way.
        """
        values: list[Any] = []
        foreign = iter(job.foreign)
        offsets = job.offsets
        for i, (kind, value, _param) in enumerate(job.call.args):
            if kind == SCALAR:
                values.append(value)
            elif kind == RESIDENT:
                values.append(int(value._storage.handle))
            elif kind == RESIDENT_OUT:
                ptr = int(value._storage.handle)
                check(drv.cuMemsetD8Async(ptr, 0, value.nbytes, handle), "cuMemsetD8Async")
                values.append(ptr)
            elif kind == DEVICE:
                ptr, producer = next(foreign)
                if producer is not None:
                    self._wait_foreign(producer, handle)
                values.append(ptr)
            else:
                values.append(base + offsets[i])
        return values

    def _pack(self, job: CudaJob, launcher: Launcher, base: int, handle: Any) -> None:
        """Write *job*'s arguments into the launcher's parameter slots."""
        views = launcher.slot_views
        if job.call.resident or job.foreign:
            for view, value in zip(views, self._values(job, base, handle), strict=True):
                view[0] = value
            return
        # The common case (arrays staged by this dispatch, and scalars), without a list.
        offsets = job.offsets
        for i, (kind, value, _param) in enumerate(job.call.args):
            views[i][0] = value if kind == SCALAR else base + offsets[i]

    def _arguments(self, job: CudaJob, base: int, handle: Any) -> list[Any]:
        """Launch arguments for ``cuda.core.launch`` (kernels without a launcher)."""
        return [
            value if kind == SCALAR else np.uint64(value)
            for (kind, _v, _p), value in zip(
                job.call.args, self._values(job, base, handle), strict=True
            )
        ]

    def _wait_foreign(self, producer: int, handle: Any) -> None:
        """Order our stream after the work a foreign producer stream enqueued so far."""
        stream = drv.CUstream(producer)
        event = self._events.take()
        try:
            check(drv.cuEventRecord(event, stream), "cuEventRecord")
            check(drv.cuStreamWaitEvent(handle, event, 0), "cuStreamWaitEvent")
        finally:
            self._events.give(event)

    # -- completion ----------------------------------------------------------------------------

    def _complete(
        self, job: Job, outcome: tuple[Any, ...] | BaseException, device_time: float | None = None
    ) -> None:
        if job.replay is not None and job.lane is None:  # type: ignore[attr-defined]  # a CudaJob
            # Failed before its graph was launched (closed, failed backend): free the graph.
            self._free_replay(job)  # type: ignore[arg-type]  # likewise
        super()._complete(job, outcome, device_time)

    def _abandon(self, job: Job) -> None:
        self._free_replay(job)  # type: ignore[arg-type]  # every job here is a CudaJob

    @staticmethod
    def _free_replay(job: CudaJob) -> None:
        """Give the graph *job* replays back to its next replay."""
        replay, job.replay = job.replay, None
        if replay is not None:
            replay._finished()

    def _release_job(self, job: CudaJob) -> None:
        if job.block is not None:
            self._pinned.release(job.block)
            job.block = None
        if job.out_block is not None:
            self._lent -= job.out_block.size
            self._pinned.release(job.out_block)
            job.out_block = None
        if job.start_event is not None:
            self._timing_events.give(job.start_event)
            job.start_event = None
        if job.end_event is not None:
            self._timing_events.give(job.end_event)
            job.end_event = None
        if job.lane is not None:
            job.lane.outstanding -= 1
            job.lane = None
        if job.replay is not None:
            self._free_replay(job)

    def _done(self, job: CudaJob, error: CudaError | None) -> None:
        # The reactor recycled the event: nothing may wait on it any more.
        job.gpu_done = True
        job.event = None
        try:
            self._finish_job(job, error)
        except Exception as exc:
            # Whatever went wrong while collecting results fails this dispatch, visibly.
            self._release_job(job)
            self._complete(job, exc)

    def _finish_job(self, job: CudaJob, error: CudaError | None) -> None:
        outcome: Any
        device_time = None
        if error is not None:
            outcome = error
        elif job.replay is not None:
            outcome = job.replay._collect(job.call)
        elif not job.call.n_results:
            outcome = ()
        elif job.total - job.in_end >= BIG_COPY and job.out_block is None:
            self._results_off_loop(job)
            return
        else:
            outcome = self._results(job)
        if error is None and job.timing:
            ms = check(drv.cuEventElapsedTime(job.start_event, job.end_event), "cuEventElapsedTime")
            device_time = ms / 1e3
        self._release_job(job)
        self._complete(job, outcome, device_time)
        if self._parked:
            self._unpark()

    def _results(self, job: CudaJob) -> tuple[Any, ...]:
        """The job's outputs: views of the pinned memory they were downloaded into, or new
        arrays copied out of the staging block (in a worker thread for big copies)."""
        results: list[Any] = []
        lent = None
        view = None
        if job.out_block is not None:
            lent = self._lend(job.out_block, job.total - job.in_end).as_array()
            job.out_block = None
        elif job.block is not None:  # Out(into=buffer) has a result but nothing staged
            view = job.block.array
        offsets = job.offsets
        for i, (kind, value, _param) in enumerate(job.call.args):
            if kind in (OUT, INOUT):
                nbytes = value.nbytes
                if lent is not None:
                    off = offsets[i] - job.in_end
                    results.append(lent[off : off + nbytes].view(value.dtype).reshape(value.shape))
                    continue
                out = np.empty(value.shape, value.dtype)
                off = offsets[i] - job.stage_lo
                _copy_into(_as_bytes(out), view[off : off + nbytes])  # type: ignore[index]  # staged kinds have a block
                results.append(out)
            elif kind == RESIDENT_OUT:
                results.append(value)
        return tuple(results)

    def _host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        nbytes = math.prod(shape) * dtype.itemsize
        block = self._pinned.acquire(nbytes)
        self._lent += block.size
        memory = self._lend(block, nbytes)
        return memory.as_array().view(dtype).reshape(shape)

    def _lend(self, block: PinnedBlock, nbytes: int) -> PinnedMemory:
        """Wrap *block* for numpy arrays; it comes back to the pool, on the loop's thread,
        once the last of them is garbage-collected. (``_lent`` already counts it.)"""
        loop = self._event_loop
        pool = self._pinned

        def give_back(block: PinnedBlock) -> None:
            self._lent -= block.size
            pool.release(block)

        def release(block: PinnedBlock) -> None:
            try:
                loop.call_soon_threadsafe(give_back, block)
            except RuntimeError:  # the loop is closed: nothing else uses the pool any more
                pool.release(block)

        return PinnedMemory(block, nbytes, release, owner=pool)

    def _results_off_loop(self, job: CudaJob) -> None:
        """Copy large outputs out of pinned memory in threads, then complete the job."""

        def finished(future: Any) -> None:
            error = future.exception()
            device_time = None
            if error is None and job.timing:
                ms = drv.cuEventElapsedTime(job.start_event, job.end_event)[1]
                device_time = ms / 1e3
            self._release_job(job)
            self._complete(job, error if error is not None else future.result(), device_time)
            if self._parked:
                self._unpark()

        future: Any
        try:
            future = self._event_loop.run_in_executor(None, self._results, job)
        except RuntimeError:  # the loop is closed (Reactor._settle_off_loop): copy right here
            future = Future()
            try:
                future.set_result(self._results(job))
            except Exception as exc:
                future.set_exception(exc)
        future.add_done_callback(finished)
