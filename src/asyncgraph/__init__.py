"""asyncgraph: awaitable GPU work for asyncio.

``await backend.dispatch(kernel, ...)`` runs a kernel on a CUDA device (or, without one, its
host implementation in worker threads) while the event loop keeps serving.
"""

import importlib
import typing

from ._exceptions import AllocationError as AllocationError
from ._exceptions import ArgumentTypeError as ArgumentTypeError
from ._exceptions import AsyncGraphError as AsyncGraphError
from ._exceptions import BackendClosedError as BackendClosedError
from ._exceptions import BatchFunctionError as BatchFunctionError
from ._exceptions import CaptureError as CaptureError
from ._exceptions import CompileError as CompileError
from ._exceptions import CudaError as CudaError
from ._exceptions import DeviceFaultError as DeviceFaultError
from ._exceptions import DeviceUnavailableError as DeviceUnavailableError
from ._exceptions import DispatchError as DispatchError
from ._exceptions import GroupError as GroupError
from ._exceptions import HostFunctionError as HostFunctionError
from ._exceptions import NotPicklableError as NotPicklableError
from ._exceptions import QueueFullError as QueueFullError
from ._exceptions import QueueTimeoutError as QueueTimeoutError
from ._exceptions import ShapeMismatchError as ShapeMismatchError
from ._exceptions import StaleBufferError as StaleBufferError
from ._exceptions import StartTimeoutError as StartTimeoutError
from ._exceptions import UnsupportedError as UnsupportedError
from ._exceptions import WithdrawnError as WithdrawnError

if typing.TYPE_CHECKING:
    from asyncgraph.args._arguments import InOut as InOut
    from asyncgraph.args._arguments import LaunchLimits as LaunchLimits
    from asyncgraph.args._arguments import Out as Out
    from asyncgraph.args._kernel import Kernel as Kernel
    from asyncgraph.args._kernel import Param as Param
    from asyncgraph.batching._batch_options import BatcherStatistics as BatcherStatistics
    from asyncgraph.batching._batch_options import BatchLaunches as BatchLaunches
    from asyncgraph.batching._batch_options import Row as Row
    from asyncgraph.batching._batched_function import BatchedFunction as BatchedFunction
    from asyncgraph.batching._batched_function import batch as batch
    from asyncgraph.batching._batcher import Batcher as Batcher
    from asyncgraph.batching._batcher import batcher as batcher
    from asyncgraph.buffers._resident import ResidentBuffer as ResidentBuffer
    from asyncgraph.front._backend import Backend as Backend
    from asyncgraph.front._lease import StreamLease as StreamLease
    from asyncgraph.front._open import open_backend as open_backend
    from asyncgraph.front._options import BackendOptions as BackendOptions
    from asyncgraph.jobs._pending import PendingDispatch as PendingDispatch
    from asyncgraph.runtime._poison import ProcessFault as ProcessFault
    from asyncgraph.runtime._poison import process_fault as process_fault
    from asyncgraph.runtime._recover import reset_device as reset_device
    from asyncgraph.runtime._telemetry import HistogramSnapshot as HistogramSnapshot
    from asyncgraph.runtime._telemetry import TelemetrySnapshot as TelemetrySnapshot
    from asyncgraph.scale._device_group import DeviceGroup as DeviceGroup
    from asyncgraph.scale._device_group import GroupSnapshot as GroupSnapshot
    from asyncgraph.scale._device_group import Replicated as Replicated
    from asyncgraph.scale._device_group import open_group as open_group

    __version__: str

# Each public name outside the error tree and the module that defines it. ``import asyncgraph``
# imports none of them: a name's module is imported the first time the name is used
# (``ag.Kernel``, ``from asyncgraph import Kernel``), so a process that only imports asyncgraph
# (pytest loading its plugin, say) loads neither numpy nor cuda-python. cuda-python loads only
# when a CUDA backend opens or ``reset_device`` is called.
_DEFINED_IN: dict[str, str] = {
    "Backend": "asyncgraph.front._backend",
    "BackendOptions": "asyncgraph.front._options",
    "BatchLaunches": "asyncgraph.batching._batch_options",
    "BatchedFunction": "asyncgraph.batching._batched_function",
    "Batcher": "asyncgraph.batching._batcher",
    "BatcherStatistics": "asyncgraph.batching._batch_options",
    "DeviceGroup": "asyncgraph.scale._device_group",
    "GroupSnapshot": "asyncgraph.scale._device_group",
    "HistogramSnapshot": "asyncgraph.runtime._telemetry",
    "InOut": "asyncgraph.args._arguments",
    "Kernel": "asyncgraph.args._kernel",
    "LaunchLimits": "asyncgraph.args._arguments",
    "Out": "asyncgraph.args._arguments",
    "Param": "asyncgraph.args._kernel",
    "PendingDispatch": "asyncgraph.jobs._pending",
    "ProcessFault": "asyncgraph.runtime._poison",
    "Replicated": "asyncgraph.scale._device_group",
    "ResidentBuffer": "asyncgraph.buffers._resident",
    "Row": "asyncgraph.batching._batch_options",
    "StreamLease": "asyncgraph.front._lease",
    "TelemetrySnapshot": "asyncgraph.runtime._telemetry",
    "batch": "asyncgraph.batching._batched_function",
    "batcher": "asyncgraph.batching._batcher",
    "open_backend": "asyncgraph.front._open",
    "open_group": "asyncgraph.scale._device_group",
    "process_fault": "asyncgraph.runtime._poison",
    "reset_device": "asyncgraph.runtime._recover",
}


if not typing.TYPE_CHECKING:  # to a type checker, the names are the imports above

    def __getattr__(name: str) -> object:
        if name == "__version__":
            from ._version import package_version

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
