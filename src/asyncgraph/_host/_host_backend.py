"""HostBackend: the same contract as CUDA, with kernels' ``host=`` functions in worker threads.

It is the backend ``open_backend("auto")`` picks where no CUDA device is found, and the
reference the CUDA backend is tested against. User code never runs on the event loop's thread:
host functions run in a pool of ``options.host_workers`` worker threads (one per CPU core by
default), outputs are zero-filled before they run, inputs reach them read-only, and completions
return to the loop in batches. The workers are daemon threads (``_workers``): one that never
returns does not hold the process's exit.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import os
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from time import perf_counter
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from asyncgraph._args._arguments import LaunchLimits
from asyncgraph._args._bound_args import BoundCall, InOutArg, host_copy
from asyncgraph._args._checks import describe, describe_value
from asyncgraph._buffers._dlpack import KDL_CPU
from asyncgraph._buffers._resident import ResidentBuffer, Use, in_use, storage_of
from asyncgraph._front._backend import Backend
from asyncgraph._jobs._scheduler import Job, wait_finished
from asyncgraph._runtime import _inbox, _loop
from asyncgraph._runtime._exceptions import AllocationError, HostFunctionError, UnsupportedError
from asyncgraph._runtime._inbox import Inbox
from asyncgraph._runtime._telemetry import PoolCounters

from ._workers import Workers

if TYPE_CHECKING:
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._front._engine_protocols import Engine, FastFront, Links
    from asyncgraph._front._lease import StreamLease
    from asyncgraph._front._options import BackendOptions
    from asyncgraph._jobs._pending import PendingDispatch
    from asyncgraph._runtime._finished import Finished
    from asyncgraph.capture._cache import GraphCacheStatistics

__all__ = ("HostBackend", "HostEngine", "HostGraphCache")

# Copies larger than this run in a worker thread rather than on the loop's thread.
_INLINE_COPY_BYTES = 1 << 20


_NO_STREAMS = (
    "{what}: backend host has no CUDA streams to wait for; open a CUDA backend "
    "(open_backend('cuda')), or wait for the other library's GPU work in a thread, e.g. "
    "await asyncio.to_thread(torch.cuda.synchronize)"
)


class _HostJob(Job):
    __slots__ = ("finished",)

    def __init__(self, call: BoundCall, timing: bool) -> None:
        super().__init__(call, timing)
        self.finished = threading.Event()


def _returned_error(job: _HostJob, args: list[Any], result: object) -> HostFunctionError | None:
    """The error for a host function that returned *result* (not None), or None when *result*
    is its own output arrays (``return out``, ``return out, out2``): harmless, so allowed."""
    outputs = [value for arg, value in zip(job.call.args, args, strict=True) if arg.output]
    return host_return_error(job.call.kernel.name, outputs, result)


def host_return_error(
    kernel_name: str, outputs: list[Any], result: object
) -> HostFunctionError | None:
    """The error for a ``host=`` function of *kernel_name* that returned *result*, or None when
    *result* is None or its own *outputs* (``return out``, ``return out, out2``)."""
    if result is None:
        return None
    items = result if isinstance(result, tuple | list) else (result,)
    if all(any(item is out for out in outputs) for item in items):
        return None
    if inspect.iscoroutine(result):
        result.close()  # never awaited, on purpose: no warning about it
    return HostFunctionError(
        f"the host= function of kernel {kernel_name!r} returned "
        f"{describe_value(result)}, which the dispatch cannot use; write the results into the "
        "output arguments (e.g. out[:] = 2 * x) and return None"
    )


def _no_memory(what: str, nbytes: int) -> AllocationError:
    """numpy could not allocate *nbytes* for *what*: the error the GPU backend would raise."""
    return AllocationError(
        f"{what} needs {nbytes} bytes, more than the host could allocate; free memory or ask "
        "for less"
    )


def _no_memory_for_arg(job: _HostJob, index: int) -> AllocationError:
    """The worker could not allocate the array of argument *index* (an Out, or an InOut copy)."""
    arg = job.call.args[index]
    value = arg.value
    what = f"InOut(<{value.dtype} array {value.shape}>)" if type(arg) is InOutArg else repr(value)
    return _no_memory(f"{describe(index, job.call.kernel, arg.param)}, {what},", value.nbytes)


def _shaped(what: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> AllocationError:
    """numpy could not allocate *what* of *shape* and *dtype* (the size computed exactly)."""
    return _no_memory(
        f"{what} of shape {shape} and dtype {dtype}", math.prod(shape) * dtype.itemsize
    )


def _copy_to(out: np.ndarray[Any, Any], array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    np.copyto(out, array)
    return out


class HostBackend(Backend):
    """Runs kernels' ``host=`` implementations in worker threads.

    Made by ``open_backend("host")`` (or ``"auto"`` without a GPU); no public constructor.
    ``BackendOptions.host_workers`` threads run host functions (default: one per CPU core);
    ``streams`` means nothing here.

    The workers share the event loop's process, and its GIL: a host function that runs Python
    bytecode for a long time (loops over elements) holds the GIL and delays the loop's tasks, by
    tens to hundreds of milliseconds, more with more workers (``docs/dispatch.md`` has figures).
    Write host functions as whole-array numpy operations, which release the GIL while they
    compute, and lower ``host_workers`` (to 1 or 2) where host functions are GIL-bound and the
    loop's latency matters.
    """

    def __init__(self, options: BackendOptions) -> None:
        super().__init__("host", options, lambda links: HostEngine(options, links))
        self._graph_cache = HostGraphCache()

    @property
    def graph_cache(self) -> HostGraphCache:
        """The CUDA backend's cache of recorded graphs, as the host has it: always empty (every
        dispatch runs its host function), so code that reads ``backend.graph_cache`` runs on
        either backend."""
        return self._graph_cache


class HostGraphCache:
    """``backend.graph_cache`` on the host backend, which records no graphs: its statistics
    are zeros, and :meth:`clear` has nothing to free."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<HostGraphCache signatures=0 bytes=0 hits=0 misses=0 choices=0>"

    def statistics(self) -> GraphCacheStatistics:
        """Zeros, in the CUDA backend's :class:`~asyncgraph.capture.GraphCacheStatistics`."""
        # Here, not at the top: the graphs' modules load cuda.core, which the host needs not.
        from asyncgraph.capture._cache import GraphCacheStatistics

        return GraphCacheStatistics(
            hits=0,
            misses=0,
            captures=0,
            updates=0,
            evictions=0,
            bytes=0,
            signatures=0,
            instances=0,
            measuring=0,
            chose_eager=0,
            chose_graph=0,
            choices=(),
        )

    def clear(self) -> None:
        """Nothing to free."""


class HostEngine:
    """The host backend's engine, an ``Engine[_HostJob]``: host functions in a pool of worker
    threads.

    Args:
        options: the backend's options (``host_workers``).
        links: where it reports (``links.sink``), and the backend's logger.
    """

    kind = "host"
    limits = LaunchLimits()
    takes_device_arrays = False
    failure = None  # host functions cannot fault a device

    def __init__(self, options: BackendOptions, links: Links) -> None:
        workers = options.host_workers
        if workers is None:
            workers = os.cpu_count() or 1
        self._workers = Workers(workers, "asyncgraph-host")
        self._inbox: Inbox[tuple[_HostJob, Any, float | None]] | None = None
        self._sink = links.sink
        links.log.debug("backend.opened", kind=self.kind, workers=workers)

    def fast_path(self, front: FastFront) -> None:
        """None: a host dispatch runs in a worker thread, so the general path costs it little."""

    # -- the scheduler's predicates (kernels are checked at dispatch; workers order uses) -----

    def needs_compile(self, job: _HostJob) -> bool:
        """Never: host functions need no compiling."""
        return False

    def needs_staging(self, job: _HostJob) -> bool:
        """Never: workers read the caller's arrays."""
        return False

    def is_ready(self, job: _HostJob) -> bool:
        """Always: a worker waits for the uses a job depends on before it runs it."""
        return True

    # -- jobs ----------------------------------------------------------------------------------

    def check_kernel(self, kernel: Kernel) -> None:
        """Refuse kernels without a ``host=`` implementation.

        Raises:
            UnsupportedError: *kernel* has no ``host=``.
        """
        if kernel.host is None:
            raise UnsupportedError(
                f"kernel {kernel.name!r} has no host= implementation, so the host backend "
                "cannot run it; declare Kernel(..., host=fn) or open a CUDA backend"
            )

    def prepare(self, call: BoundCall, timing: bool) -> _HostJob:
        """The job for *call*."""
        self.check_kernel(call.kernel)
        return _HostJob(call, timing)

    def graph_job(
        self, call: BoundCall, always: bool, started: float, inline: bool
    ) -> _HostJob | PendingDispatch | None:
        """None: the host backend runs every dispatch."""
        return None

    async def compile(self, kernel: Kernel) -> None:
        """Nothing to compile (a checkpoint)."""
        await _loop.sleep(0)

    def start_compile(self, job: _HostJob) -> None:
        """Never called: nothing needs compiling."""
        self._sink.compiled(job.call.kernel, None)

    def stage(self, job: _HostJob) -> None:
        """Never called: nothing is staged."""
        self._sink.staged(job, None)

    def launch(self, job: _HostJob) -> None:
        """Hand *job* to a worker thread."""
        inbox = self._inbox
        if inbox is None:
            inbox = self._inbox = Inbox(self._sink.loop, self._on_done)
        self._workers.submit(functools.partial(self._run, job, inbox))

    def release(self, job: _HostJob) -> None:
        """A host job holds nothing before it runs."""

    def _on_done(self, item: tuple[_HostJob, Any, float | None]) -> None:
        job, outcome, seconds = item
        self._sink.done(job, outcome, seconds)

    @staticmethod
    def _run(job: _HostJob, inbox: Inbox[tuple[_HostJob, Any, float | None]]) -> None:
        """Worker thread: wait for earlier uses of shared buffers, run the host function.

        A host function returns None (or its own outputs); anything else fails the dispatch
        with :class:`HostFunctionError`, checked here so the loop's thread pays nothing for it,
        as does ``StopIteration``, which cannot be raised through ``await``.
        """
        try:
            for dep in job.deps:
                finished: threading.Event | Finished | None = getattr(dep, "finished", None)
                if finished is not None:
                    finished.wait()
            args: list[Any] = []
            try:
                for arg in job.call.args:
                    args.append(arg.host_value())
            except MemoryError as exc:  # the array of args[len(args)]: Out, or InOut's copy
                raise _no_memory_for_arg(job, len(args)) from exc
            # _prepare refused kernels without host=.
            host = cast(Callable[..., object], job.call.kernel.host)
            t0 = perf_counter()
            returned = host(*args)
            seconds = perf_counter() - t0
            if returned is not None:
                error = _returned_error(job, args, returned)
                if error is not None:
                    raise error
            item: tuple[_HostJob, Any, float | None] = (
                job,
                job.call.results(lambda arg: args[arg.index]),
                seconds if job.timing else None,
            )
        except StopIteration as exc:
            # Raised through await it would arrive as RuntimeError (PEP 479): wrap it instead.
            error = HostFunctionError(
                f"the host= function of kernel {job.call.kernel.name!r} raised StopIteration, "
                "which Python cannot raise through await; it is this error's __cause__ — catch "
                "it in the host function, or use next(it, default)"
            )
            error.__cause__ = exc
            item = (job, error, None)
        except BaseException as exc:
            item = (job, exc, None)
        finally:
            job.finished.set()
        inbox.post(item)

    # -- resident storage ----------------------------------------------------------------------

    async def upload_storage(self, array: np.ndarray[Any, Any]) -> Any:
        try:
            if array.nbytes <= _INLINE_COPY_BYTES:
                return host_copy(array)
            # Copies use the loop's default executor, never the workers: a worker may be blocked
            # waiting for this very copy to finish.
            return await self._sink.loop.run_in_executor(None, host_copy, array)
        except MemoryError as exc:
            raise _no_memory(f"a resident copy of {describe_value(array)}", array.nbytes) from exc

    def alloc_storage(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        try:
            return np.empty(shape, dtype)
        except (MemoryError, ValueError) as exc:  # ValueError: beyond numpy's size limit
            raise _shaped("a resident buffer", shape, dtype) from exc

    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        try:
            return np.empty(shape, dtype)
        except (MemoryError, ValueError) as exc:  # ValueError: beyond numpy's size limit
            raise _shaped("a host array", shape, dtype) from exc

    async def download_storage(
        self,
        buffer: ResidentBuffer,
        use: Use,
        deps: list[Use],
        out: np.ndarray[Any, Any] | None,
    ) -> np.ndarray[Any, Any]:
        await wait_finished(deps)
        storage = storage_of(buffer)
        copy = host_copy if out is None else functools.partial(_copy_to, out)
        if buffer.nbytes <= _INLINE_COPY_BYTES:
            return copy(storage)
        return await self._sink.loop.run_in_executor(None, copy, storage)

    def copies_from(self, other: Engine[Any]) -> bool:
        """Another host engine's storage is a numpy array too."""
        return isinstance(other, HostEngine)

    def copy_route(self, source: Engine[Any]) -> str:
        """Host memory to host memory."""
        return "host"

    async def copy_in(
        self, buffer: ResidentBuffer, use: Use, deps: list[Use], source: Engine[Any]
    ) -> Any:
        """A copy of *buffer*'s array, after the writers in *deps*."""
        return await self.download_storage(buffer, use, deps, None)

    def free_storage(self, storage: Any) -> None:
        """Host storage is a numpy array: dropping the reference frees it."""

    def storage_pointer(self, storage: Any) -> int:
        """The address of a host array."""
        return int(storage.ctypes.data)

    # -- interop -------------------------------------------------------------------------------

    def export_device(self) -> tuple[int, int]:
        """DLPack: host memory."""
        return (KDL_CPU, 0)

    def export_wait(self, buffer: ResidentBuffer, stream: int | None) -> None:
        """DLPack: host memory has no stream to order on.

        Raises:
            BufferError: a stream was given, or a dispatch in flight uses the buffer.
        """
        if stream not in (None, -1):
            raise BufferError(f"__dlpack__(stream={stream}): host memory has no streams")
        if in_use(buffer):
            raise BufferError(
                f"{buffer!r} is used by a dispatch in flight; await it before sharing the memory"
            )

    def export_stream(self, buffer: ResidentBuffer) -> int | None:
        """No stream: host memory."""
        return None

    # The host has no CUDA streams and no graphs: each of these raises UnsupportedError.

    def stream(self) -> AbstractAsyncContextManager[StreamLease]:
        raise UnsupportedError("backend host has no CUDA streams; stream() needs the CUDA backend")

    async def record(
        self,
        kernel: Kernel,
        args: tuple[object, ...],
        grid: object,
        block: object,
        shared_mem: object,
    ) -> Any:
        raise UnsupportedError("record(): the host backend has no CUDA graphs")

    def capture(self, mode: object, into: object) -> AbstractAsyncContextManager[Any]:
        raise UnsupportedError("capture(): the host backend has no CUDA graphs")

    def wait_foreign(self, work: object) -> Awaitable[None]:
        raise UnsupportedError(_NO_STREAMS.format(what="wait()"))

    def fence(self, job: _HostJob, after: object) -> None:
        raise UnsupportedError(_NO_STREAMS.format(what="dispatch(after=...)"))

    def order_foreign(self, stream: object, job: Job | None) -> bool:
        raise UnsupportedError(_NO_STREAMS.format(what="order()"))

    def pool_counters(self) -> PoolCounters:
        """No pinned pool: zeros."""
        return PoolCounters()

    # -- closing -------------------------------------------------------------------------------

    async def settle_after(self, ended: asyncio.AbstractEventLoop, jobs: list[Job]) -> None:
        """Wait for the jobs the ended loop left in flight.

        Host workers post their completions to inboxes, which handle them on the workers'
        threads once the loop is closed: wait for those in a thread of the new loop.
        """
        _inbox.settle(ended)
        left = [job.pending for job in jobs]
        if left:
            await self._sink.loop.run_in_executor(None, _wait_all, left)

    async def shutdown(self) -> None:
        """Stop the workers (nothing runs on them any more)."""
        await self._sink.loop.run_in_executor(None, self._workers.shutdown)

    def shutdown_now(self) -> None:
        """Stop the workers without a loop."""
        self._workers.shutdown_now()

    def release_unclosed(self) -> None:
        """Stop the workers of a backend dropped without closing (a host function that never
        returns keeps its thread, a daemon: not the process's exit)."""
        self._workers.shutdown_now()


def _wait_all(pendings: list[PendingDispatch]) -> None:
    """Block until every dispatch in *pendings* completed (in a worker thread)."""
    for pending in pendings:
        pending.exception()


if TYPE_CHECKING:
    # The contract, held by mypy for the engine's own jobs (the front holds an Engine[Any]).
    _CONTRACT: type[Engine[_HostJob]] = HostEngine
