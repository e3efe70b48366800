"""The whole error tree of asyncgraph.

Every error the library raises on purpose derives from :class:`AsyncGraphError`; where a
standard exception means the same thing, it is a co-base, so ``except ValueError`` keeps
working for callers who do not know this library::

    AsyncGraphError
     ├─ CudaError(code, name, call)       a driver call failed; code kept as data
     │   └─ DeviceFaultError             sticky fault (illegal address...): all CUDA backends fail
     ├─ CompileError(log)
     ├─ DispatchError (ValueError)       bad arguments (to dispatch, options, a Kernel...)
     │   ├─ ArgumentTypeError (TypeError) an argument of the wrong kind or dtype
     │   └─ ShapeMismatchError           shapes that do not fit
     ├─ HostFunctionError                a kernel's host= function broke its contract
     ├─ BatchFunctionError               a function batched by batch() broke its contract
     ├─ AllocationError (MemoryError)    device or pinned memory exhausted after trimming caches
     ├─ QueueFullError                   BackendOptions.max_queued dispatches already queued
     ├─ WithdrawnError                   a queued dispatch was withdrawn before it launched
     │   └─ QueueTimeoutError (TimeoutError) it waited out its queue_timeout
     ├─ CaptureError
     ├─ StaleBufferError                 a freed, reused or foreign resident buffer
     ├─ DeviceUnavailableError           no CUDA driver or device where one was required
     ├─ UnsupportedError                 the backend cannot do this (a kernel without host=...)
     │   └─ NotPicklableError (TypeError) a resident buffer pickled to leave its process (Ray)
     ├─ GroupError (ValueError)          a device group or actor pool cannot do what was asked
     ├─ StartTimeoutError (TimeoutError) an actor pool's actors did not start in time
     └─ BackendClosedError               the backend (or a batcher) is closed or closing
"""

from __future__ import annotations

__all__ = (
    "AllocationError",
    "ArgumentTypeError",
    "AsyncGraphError",
    "BackendClosedError",
    "BatchFunctionError",
    "CaptureError",
    "CompileError",
    "CudaError",
    "DeviceFaultError",
    "DeviceUnavailableError",
    "DispatchError",
    "GroupError",
    "HostFunctionError",
    "NotPicklableError",
    "QueueFullError",
    "QueueTimeoutError",
    "ShapeMismatchError",
    "StaleBufferError",
    "StartTimeoutError",
    "UnsupportedError",
    "WithdrawnError",
)


class AsyncGraphError(Exception):
    """Base class of every error asyncgraph raises on purpose."""


class CudaError(AsyncGraphError):
    """A CUDA driver call failed.

    Attributes:
        code: the numeric ``CUresult``.
        name: its symbolic name, e.g. ``"CUDA_ERROR_OUT_OF_MEMORY"``.
        call: the driver function that returned it, e.g. ``"cuMemcpyHtoDAsync"``.
    """

    def __init__(self, code: int, name: str, call: str, detail: str = "") -> None:
        self.code = code
        self.name = name
        self.call = call
        message = f"{call} failed with {name} ({code})"
        if detail:
            message = f"{message}: {detail}"
        super().__init__(message)

    def __reduce__(self) -> tuple[type[CudaError], tuple[int, str, str]]:
        return (type(self), (self.code, self.name, self.call))


class DeviceFaultError(CudaError):
    """A sticky device error (illegal address, misaligned access, trap...).

    The driver keeps the whole process failed afterwards, every GPU of it: every dispatch in
    flight on any CUDA backend of the process fails with this error, and every one of them
    refuses new work at the call (``asyncgraph.process_fault()`` names the first fault). See
    ``docs/errors.md`` for recovery: isolation is one process per GPU.
    """


class CompileError(AsyncGraphError):
    """NVRTC could not compile a kernel's source.

    Attributes:
        log: the compiler's log, as NVRTC wrote it.
        kernel: the name of the kernel being compiled.
    """

    def __init__(self, kernel: str, log: str) -> None:
        self.kernel = kernel
        self.log = log
        super().__init__(f"kernel {kernel!r} failed to compile:\n{log}")

    def __reduce__(self) -> tuple[type[CompileError], tuple[str, str]]:
        return (type(self), (self.kernel, self.log))


class DispatchError(AsyncGraphError, ValueError):
    """Arguments of a dispatch (or upload, or launch shape) are invalid; or an argument of
    another call of the library is (a ``BackendOptions`` field, ``aclose(timeout=)``...).

    Raised by ``dispatch()`` itself, before any work starts; the backend stays usable.
    """


class ArgumentTypeError(DispatchError, TypeError):
    """An argument is of a kind or dtype the kernel cannot take; or an argument of another
    call of the library is of the wrong type (``Kernel(source=None)``, ``on_close(42)``)."""


class ShapeMismatchError(DispatchError):
    """Shapes do not fit: an output of impossible shape, or a replay with other shapes."""


class HostFunctionError(AsyncGraphError):
    """A kernel's ``host=`` function broke the host contract, so its dispatch failed.

    A host function writes its results into the output arrays it is given and returns
    ``None``. Returning anything else (``return 2 * x``), or raising ``StopIteration`` (which
    Python cannot carry through ``await``; it is the ``__cause__``), fails the dispatch with
    this error instead of silently giving zeros. The backend stays usable.
    """


class BatchFunctionError(AsyncGraphError):
    """A function batched by ``asyncgraph.batch`` broke its contract, so its batch failed.

    It takes the inputs of a batch and returns an awaitable of one output per input, in order.
    Returning no awaitable (a plain ``def``), or outputs without ``len()`` or of another count,
    fails every caller of that batch with this error; the batched function goes on with the
    next batch.
    """


class QueueFullError(AsyncGraphError):
    """``dispatch()`` found ``BackendOptions.max_queued`` dispatches already waiting.

    Nothing was started; the backend stays usable. ``await backend.submit(...)`` waits for
    room instead of raising: that wait is the backpressure a server applies to its callers.
    """


class WithdrawnError(AsyncGraphError):
    """A dispatch was withdrawn before it launched: ``pending.cancel()`` returned ``True``, or
    every task that awaited it was cancelled.

    Its kernel never ran and what it held was released; awaiting it, ``result()`` and
    ``exception()`` give this error. The backend stays usable.
    """


class QueueTimeoutError(WithdrawnError, TimeoutError):
    """A dispatch waited its ``queue_timeout`` for an in-flight slot and was withdrawn.

    Nothing of it reached the device; what it held was released. Raise ``queue_timeout``, lower
    the load, or give the dispatch a higher ``priority`` (``docs/jobs.md``).
    """


class AllocationError(AsyncGraphError, MemoryError):
    """Device or pinned host memory is exhausted, after the caches were trimmed."""


class CaptureError(AsyncGraphError):
    """A CUDA graph capture failed or was used outside its rules."""


class StaleBufferError(AsyncGraphError):
    """A resident buffer handle was freed, belongs to another backend, or is otherwise stale."""


class DeviceUnavailableError(AsyncGraphError):
    """A CUDA device was required but no driver or device was found."""


class UnsupportedError(AsyncGraphError):
    """The backend cannot do what was asked (for example a kernel without ``host=`` on the
    host backend, or a blocking call on the event loop's own thread)."""


class NotPicklableError(UnsupportedError, TypeError):
    """A resident buffer was pickled: to be sent to another process (a Ray actor's result or
    argument), or copied with :mod:`copy`.

    Its memory lives on its backend, in the process that made it; download it first
    (``await backend.download(buffer)``) and send the array.
    """


class GroupError(AsyncGraphError, ValueError):
    """A device group or an actor pool cannot do what was asked: no devices, a GPU named twice,
    a group used before it is open, a member that is not in the group, a dispatch whose
    resident buffers live on different members, or an actor pool that its Ray cluster can
    never hold."""


class StartTimeoutError(AsyncGraphError, TimeoutError):
    """The actors of a Ray actor pool did not all start within its ``start_timeout``.

    The message says what Ray reports free; the actors the pool started are stopped.
    """


class BackendClosedError(AsyncGraphError):
    """The backend is closed, or closing, and takes no new work; or a batcher (or batched
    function) is closed and takes no new calls."""
