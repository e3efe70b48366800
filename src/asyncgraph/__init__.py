"""asyncgraph: awaitable GPU work for asyncio.

``await backend.dispatch(kernel, ...)`` runs a kernel on a CUDA device (or, without one, its
host implementation in worker threads) while the event loop keeps serving.
"""

import importlib
import typing

from ._runtime._exceptions import AllocationError as AllocationError
from ._runtime._exceptions import ArgumentTypeError as ArgumentTypeError
from ._runtime._exceptions import AsyncGraphError as AsyncGraphError
from ._runtime._exceptions import BackendClosedError as BackendClosedError
from ._runtime._exceptions import BatchFunctionError as BatchFunctionError
from ._runtime._exceptions import CaptureError as CaptureError
from ._runtime._exceptions import CompileError as CompileError
from ._runtime._exceptions import CudaError as CudaError
from ._runtime._exceptions import DeviceFaultError as DeviceFaultError
from ._runtime._exceptions import DeviceUnavailableError as DeviceUnavailableError
from ._runtime._exceptions import DispatchError as DispatchError
from ._runtime._exceptions import GroupError as GroupError
from ._runtime._exceptions import HostFunctionError as HostFunctionError
from ._runtime._exceptions import NotPicklableError as NotPicklableError
from ._runtime._exceptions import QueueFullError as QueueFullError
from ._runtime._exceptions import QueueTimeoutError as QueueTimeoutError
from ._runtime._exceptions import ShapeMismatchError as ShapeMismatchError
from ._runtime._exceptions import StaleBufferError as StaleBufferError
from ._runtime._exceptions import StartTimeoutError as StartTimeoutError
from ._runtime._exceptions import UnsupportedError as UnsupportedError
from ._runtime._exceptions import WithdrawnError as WithdrawnError

if typing.TYPE_CHECKING:
    from asyncgraph._args._arguments import InOut as InOut
    from asyncgraph._args._arguments import LaunchLimits as LaunchLimits
    from asyncgraph._args._arguments import Out as Out
    from asyncgraph._args._kernel import Kernel as Kernel
    from asyncgraph._args._kernel import Param as Param
    from asyncgraph._batching._batch_options import BatcherStatistics as BatcherStatistics
    from asyncgraph._batching._batch_options import BatchLaunches as BatchLaunches
    from asyncgraph._batching._batch_options import Row as Row
    from asyncgraph._batching._batched_function import BatchedFunction as BatchedFunction
    from asyncgraph._batching._batched_function import batch as batch
    from asyncgraph._batching._batcher import Batcher as Batcher
    from asyncgraph._batching._batcher import batcher as batcher
    from asyncgraph._buffers._resident import ResidentBuffer as ResidentBuffer
    from asyncgraph._cuda.driver._recover import reset_device as reset_device
    from asyncgraph._front._backend import Backend as Backend
    from asyncgraph._front._lease import StreamLease as StreamLease
    from asyncgraph._front._options import BackendOptions as BackendOptions
    from asyncgraph._jobs._pending import PendingDispatch as PendingDispatch
    from asyncgraph._opening._open import open_backend as open_backend
    from asyncgraph._runtime._poison import ProcessFault as ProcessFault
    from asyncgraph._runtime._poison import process_fault as process_fault
    from asyncgraph._runtime._telemetry import HistogramSnapshot as HistogramSnapshot
    from asyncgraph._runtime._telemetry import TelemetrySnapshot as TelemetrySnapshot
    from asyncgraph._scale._device_group import DeviceGroup as DeviceGroup
    from asyncgraph._scale._device_group import GroupSnapshot as GroupSnapshot
    from asyncgraph._scale._device_group import Replicated as Replicated
    from asyncgraph._scale._device_group import open_group as open_group

    __version__: str

# Each public name outside the error tree and the module that defines it. ``import asyncgraph``
# imports none of them: a name's module is imported the first time the name is used
# (``ag.Kernel``, ``from asyncgraph import Kernel``), so a process that only imports asyncgraph
# (pytest loading its plugin, say) loads neither numpy nor cuda-python. cuda-python loads only
# when a CUDA backend opens or ``reset_device`` is called.
_DEFINED_IN: dict[str, str] = {
    "Backend": "asyncgraph._front._backend",
    "BackendOptions": "asyncgraph._front._options",
    "BatchLaunches": "asyncgraph._batching._batch_options",
    "BatchedFunction": "asyncgraph._batching._batched_function",
    "Batcher": "asyncgraph._batching._batcher",
    "BatcherStatistics": "asyncgraph._batching._batch_options",
    "DeviceGroup": "asyncgraph._scale._device_group",
    "GroupSnapshot": "asyncgraph._scale._device_group",
    "HistogramSnapshot": "asyncgraph._runtime._telemetry",
    "InOut": "asyncgraph._args._arguments",
    "Kernel": "asyncgraph._args._kernel",
    "LaunchLimits": "asyncgraph._args._arguments",
    "Out": "asyncgraph._args._arguments",
    "Param": "asyncgraph._args._kernel",
    "PendingDispatch": "asyncgraph._jobs._pending",
    "ProcessFault": "asyncgraph._runtime._poison",
    "Replicated": "asyncgraph._scale._device_group",
    "ResidentBuffer": "asyncgraph._buffers._resident",
    "Row": "asyncgraph._batching._batch_options",
    "StreamLease": "asyncgraph._front._lease",
    "TelemetrySnapshot": "asyncgraph._runtime._telemetry",
    "batch": "asyncgraph._batching._batched_function",
    "batcher": "asyncgraph._batching._batcher",
    "open_backend": "asyncgraph._opening._open",
    "open_group": "asyncgraph._scale._device_group",
    "process_fault": "asyncgraph._runtime._poison",
    "reset_device": "asyncgraph._cuda.driver._recover",
}


if not typing.TYPE_CHECKING:  # to a type checker, the names are the imports above

    def __getattr__(name: str) -> object:
        if name == "__version__":
            from ._runtime._version import package_version

            value: object = package_version()
        else:
            module = _DEFINED_IN.get(name)
            if module is None:
                raise AttributeError(f"module 'asyncgraph' has no attribute {name!r}")
            value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later uses find it here, without calling this again
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})


__all__ = (
    "AllocationError",
    "ArgumentTypeError",
    "AsyncGraphError",
    "Backend",
    "BackendClosedError",
    "BackendOptions",
    "BatchFunctionError",
    "BatchLaunches",
    "BatchedFunction",
    "Batcher",
    "BatcherStatistics",
    "CaptureError",
    "CompileError",
    "CudaError",
    "DeviceFaultError",
    "DeviceGroup",
    "DeviceUnavailableError",
    "DispatchError",
    "GroupError",
    "GroupSnapshot",
    "HistogramSnapshot",
    "HostFunctionError",
    "InOut",
    "Kernel",
    "LaunchLimits",
    "NotPicklableError",
    "Out",
    "Param",
    "PendingDispatch",
    "ProcessFault",
    "QueueFullError",
    "QueueTimeoutError",
    "Replicated",
    "ResidentBuffer",
    "Row",
    "ShapeMismatchError",
    "StaleBufferError",
    "StartTimeoutError",
    "StreamLease",
    "TelemetrySnapshot",
    "UnsupportedError",
    "WithdrawnError",
    "__version__",
    "batch",
    "batcher",
    "open_backend",
    "open_group",
    "process_fault",
    "reset_device",
)
