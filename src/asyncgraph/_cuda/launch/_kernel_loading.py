"""Compiling and loading kernels: NVRTC in a thread, loading on the loop, failures remembered."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

from asyncgraph._runtime._exceptions import BackendClosedError, CompileError

from ._nvrtc import KernelCompiler, load_kernel

if TYPE_CHECKING:
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._cuda.device._cuda_device import Device
    from asyncgraph._front._engine_protocols import Sink

    from ._kernel_launch import Launches

__all__ = ("Kernels",)


@functools.cache
def _compiler() -> KernelCompiler:
    """One compiler (and memory cache) per process, shared by every CUDA backend."""
    return KernelCompiler()


class Kernels:
    """The kernels of one device: what is loaded, what compiles now, what failed."""

    def __init__(self, device: Device, launches: Launches) -> None:
        self._device = device
        self._launches = launches
        self._failed: dict[Kernel, CompileError] = {}
        self.tasks: set[asyncio.Task[None]] = set()  # compilations for queued dispatches

    def failed(self, kernel: Kernel) -> CompileError | None:
        """The error *kernel* failed to compile with, if it did."""
        return self._failed.get(kernel)

    async def load(self, kernel: Kernel) -> None:
        """Compile *kernel* (in a thread; the disk and memory caches first) and load it.

        Raises:
            CompileError: NVRTC failed (remembered: later dispatches fail at once).
        """
        failed = self._failed.get(kernel)
        if failed is not None:
            raise CompileError(failed.kernel, failed.log)
        compiler = _compiler()
        hits = compiler.hits
        device = self._device
        loop = device.loop
        try:
            cubin = await loop.run_in_executor(None, compiler.cubin, kernel, device.arch)
        except CompileError as exc:
            self._failed[kernel] = exc
            raise
        if not self._launches.is_loaded(kernel):
            self._launches.add(kernel, device.ctx.call(load_kernel, kernel, cubin))
            telemetry = device.telemetry
            if compiler.hits > hits:
                telemetry.compile_cache_hits += 1
            else:
                telemetry.compile_cache_misses += 1

    def start(self, kernel: Kernel, sink: Sink) -> None:
        """Compile *kernel* in a task; report ``sink.compiled`` when it is loaded or failed."""
        failed = self._failed.get(kernel)
        if failed is not None:
            sink.compiled(kernel, lambda _job: CompileError(failed.kernel, failed.log))
            return
        task = sink.loop.create_task(self._device.ctx.steps(self._compile_for_jobs(kernel, sink)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _compile_for_jobs(self, kernel: Kernel, sink: Sink) -> None:
        try:
            await self.load(kernel)
        except CompileError as exc:
            error = exc
            sink.compiled(kernel, lambda _job: CompileError(error.kernel, error.log))
        except Exception as exc:
            failure = exc
            sink.compiled(kernel, lambda _job: failure)
        except BaseException:  # the loop is ending: fail the jobs, so a close does not wait
            sink.compiled(
                kernel,
                lambda job: BackendClosedError(
                    f"the event loop ended while {kernel.name!r} compiled for dispatch "
                    f"#{job.id}; close the backend before the loop ends"
                ),
            )
            raise
        else:
            sink.compiled(kernel, None)
