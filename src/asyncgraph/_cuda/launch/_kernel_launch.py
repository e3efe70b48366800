"""Launching a kernel: packed parameter blocks, ``cuLaunchKernel``, and ordering on a stream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.bindings import driver as drv
from cuda.core import LaunchConfig, launch

from asyncgraph._cuda.core import _core_python
from asyncgraph._cuda.core._choose import core
from asyncgraph._cuda.driver._driver import SUCCESS, check, error_for, translate

if TYPE_CHECKING:
    from asyncgraph._args._bound_args import BoundCall
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._cuda.core._core_python import Launcher
    from asyncgraph._cuda.device._cuda_device import Device

    from ..lanes._staging_plan import CudaJob


__all__ = ("Launches", "launcher_for")

_DEFAULT_SHARED = 48 * 1024


def launcher_for(kernel: Kernel, loaded: Any) -> Launcher | None:
    """A launcher for *kernel* from the core that runs (``_choose``), or from the Python core
    when only it can pack the parameters; ``None`` when a parameter's type is unknown (then
    the dispatch goes through ``cuda.core.launch``, which packs any argument)."""
    params = kernel.params
    if params is None:
        return None
    maker: Any = None
    for candidate in (core.Launcher, _core_python.Launcher):
        if candidate.supports(params):
            maker = candidate
            break
    if maker is None:
        return None
    function = check(
        drv.cuKernelGetFunction(drv.CUkernel(int(loaded.handle))), "cuKernelGetFunction"
    )
    launcher: Launcher = maker(function, params)
    return launcher


class Launches:
    """Kernel launches of one device: loaded kernels, launchers, configs, shared memory."""

    def __init__(self, device: Device) -> None:
        self._device = device
        self.loaded: dict[Kernel, Any] = {}
        self.launchers: dict[Kernel, Launcher | None] = {}
        self._configs: dict[tuple[Any, ...], Any] = {}
        self._smem_set: dict[Any, int] = {}

    def add(self, kernel: Kernel, loaded: Any) -> None:
        """*kernel* is loaded as *loaded* (a ``cuda.core`` Kernel)."""
        self.loaded[kernel] = loaded
        # The fast path reads the launchers here when it meets a kernel it has none for.
        self.launchers[kernel] = launcher_for(kernel, loaded)

    def is_loaded(self, kernel: Kernel) -> bool:
        """Whether *kernel* is loaded on this device."""
        return kernel in self.loaded

    def clear(self) -> None:
        """Forget every kernel (closing)."""
        self.loaded.clear()
        self.launchers.clear()

    def config(self, call: BoundCall) -> Any:
        """The ``cuda.core`` LaunchConfig of *call*'s launch shape (cached)."""
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
                attribute, nbytes, drv.CUkernel(int(loaded.handle)), self._device.device.device_id
            ),
            "cuKernelSetAttribute",
        )
        self._smem_set[loaded] = nbytes

    def enqueue(self, job: CudaJob, base: int, handle: Any, stream: Any) -> None:
        """Enqueue *job*'s kernel (between its timing events) on *handle*; its staged arrays
        start at device address *base*."""
        call = job.call
        if call.shared_mem > _DEFAULT_SHARED:
            self._allow_shared(self.loaded[call.kernel], call.shared_mem)
        timing_events = self._device.timing_events
        if job.timing:
            job.start_event = timing_events.take()
            check(drv.cuEventRecord(job.start_event, handle), "cuEventRecord")
        launcher = self.launchers.get(call.kernel)
        if launcher is not None:
            if call.resident or call.foreign:
                code = launcher.launch_values(
                    self._values(job, base, handle), call.grid, call.block, call.shared_mem, handle
                )
            else:
                # The common case (arrays staged by this dispatch, and scalars): packed from
                # the arguments themselves.
                code = launcher.launch(
                    call.args, base, call.grid, call.block, call.shared_mem, handle
                )
            if code != SUCCESS:
                raise error_for(code, "cuLaunchKernel")
        else:
            args = self._arguments(job, base, handle)
            try:
                launch(stream, self.config(call), self.loaded[call.kernel], *args)
            except Exception as exc:
                raise translate(exc, "cuLaunchKernel") from exc
        if job.timing:
            job.end_event = timing_events.take()
            check(drv.cuEventRecord(job.end_event, handle), "cuEventRecord")

    def _values(self, job: CudaJob, base: int, handle: Any) -> list[Any]:
        """Each argument's launch value: the scalar, or the device pointer as an int; what an
        argument's kind needs before the launch (``Arg.enqueue_value``) is enqueued on the way
        (zeroing a resident output, waiting for a foreign producer)."""
        zero, after_producer = self.zero, self.after_producer
        return [arg.enqueue_value(base, handle, zero, after_producer) for arg in job.call.args]

    def zero(self, pointer: int, nbytes: int, stream: Any) -> None:
        """Zero *nbytes* at *pointer* on *stream* (``_bound_args.ZeroOn``)."""
        code = drv.cuMemsetD8Async(pointer, 0, nbytes, stream)[0]
        if code != SUCCESS:
            check((code,), "cuMemsetD8Async")

    def _arguments(self, job: CudaJob, base: int, handle: Any) -> list[Any]:
        """Launch arguments for ``cuda.core.launch`` (kernels without a launcher)."""
        return [
            value if arg.by_value else np.uint64(value)
            for arg, value in zip(job.call.args, self._values(job, base, handle), strict=True)
        ]

    def after_producer(self, producer: int, stream: Any) -> None:
        """Order *stream* after the work a foreign producer stream enqueued so far
        (``_bound_args.AfterProducer``)."""
        events = self._device.events
        event = events.take()
        try:
            check(drv.cuEventRecord(event, drv.CUstream(producer)), "cuEventRecord")
            check(drv.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")
        finally:
            events.give(event)
