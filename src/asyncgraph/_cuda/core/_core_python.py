"""The dispatch core in Python: the twin of the compiled ``_core_compiled`` extension.

Both modules offer the same things, and the rest of the CUDA backend calls them without
knowing which one runs (``_choose`` chooses):

- :class:`Launcher`: a kernel's parameter block, packed from a call's arguments, and its
  launch (``cuLaunchKernel``);
- ``record`` and ``query``: ``cuEventRecord`` and ``cuEventQuery``, returning the driver's
  result tuple as ``cuda.bindings`` does (the code first). Here they *are* the bindings, so
  the Python core adds no call of its own to an event record or query;
- ``capture_tail``: what a capture asks ``cuStreamGetCaptureInfo``; here it is the capture's
  own function (``capture._guard``), which the compiled core writes in C;
- ``NativeWaiter``: threads outside Python that follow an event until it completed and wake the
  event loop through an eventfd. It exists only compiled; here it is ``None``, and the
  reactor's waiter threads are Python threads instead (``_waiters``);
- ``Watch``, ``WatchLane``, ``Watches``: the completion reactor's hot half (``_watches``).

These are the leaf that talks to the driver, twinned in one shape each. The compiled extension
also holds the fast path (``FastPath``, ``FastJob``, ``KnownKernel``...), which has no twin: on
the Python core every dispatch takes the general path, the semantic reference.

A launch returns the driver's code (``0`` is success). Nothing raises for a failed driver call:
each caller turns a code into its error exactly once, in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.bindings import driver as drv

from asyncgraph.capture._guard import capture_tail as capture_tail

if TYPE_CHECKING:
    from asyncgraph._args._kernel import Param

__all__ = (
    "COMPILED",
    "Launcher",
    "NativeWaiter",
    "Watch",
    "WatchLane",
    "Watches",
    "capture_tail",
    "query",
    "record",
)

COMPILED = False
NativeWaiter: Any = None

_POINTER = np.dtype(np.uint64)
_launch = drv.cuLaunchKernel
_set_node = drv.cuGraphExecKernelNodeSetParams
_current, _push, _pop = drv.cuCtxGetCurrent, drv.cuCtxPushCurrent, drv.cuCtxPopCurrent
_SUCCESS = drv.CUresult.CUDA_SUCCESS
# cuEventRecord(event, stream) and cuEventQuery(event): (code,), NOT_READY while it runs.
record = drv.cuEventRecord
query = drv.cuEventQuery


class Launcher:
    """A loaded kernel's ``CUfunction`` and a reusable parameter block for ``cuLaunchKernel``.

    Each parameter has a 16-byte slot; the driver reads the array of slot addresses. A dispatch
    writes its values into the slots and launches: the driver copies the parameters during the
    call, and only the event loop's thread launches, so one block per kernel serves every
    dispatch. Measured on an NVIDIA H100 80GB HBM3, this is what takes the launch from about
    5 µs (``cuda.core.launch``) to the bare driver call.

    Args:
        function: the ``CUfunction``.
        params: the kernel's parameters; value parameters must have a dtype of at most 16
            bytes (``supports``).
    """

    __slots__ = ("_keep", "_node_params", "function", "kernel_params", "slot_views", "slots")

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
            dtype = param.dtype if not param.pointer and param.dtype is not None else _POINTER
            views.append(raw[16 * i : 16 * i + dtype.itemsize].view(dtype))
        self.slot_views: list[np.ndarray[Any, Any]] = views
        self._node_params: Any = None  # a CUDA_KERNEL_NODE_PARAMS for set_node, made once

    @staticmethod
    def supports(params: tuple[Param, ...]) -> bool:
        """Whether a launcher can pack *params* (every value parameter's dtype is known)."""
        return all(p.pointer or (p.dtype is not None and p.dtype.itemsize <= 16) for p in params)

    def pack(self, args: Any, base: int) -> None:
        """Write *args* (a call's bound arguments; staged arrays lie at *base* + their
        offset) into the parameter block."""
        for view, arg in zip(self.slot_views, args, strict=True):
            view[0] = arg.value if arg.by_value else base + arg.offset

    def pack_values(self, values: list[Any]) -> None:
        """Write each argument's launch value (scalars, and pointers as ints)."""
        for view, value in zip(self.slot_views, values, strict=True):
            view[0] = value

    def packed(self) -> bytes:
        """The parameter block's bytes, 16 per parameter."""
        return self.slots.tobytes()[: 16 * len(self.slot_views)]

    def launch(
        self,
        args: Any,
        base: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: Any,
    ) -> Any:
        """:meth:`pack` *args* and launch on *stream*; the driver's code."""
        for view, arg in zip(self.slot_views, args, strict=True):
            view[0] = arg.value if arg.by_value else base + arg.offset
        # Inline: one Python call fewer per launch.
        return _launch(self.function, *grid, *block, shared_mem, stream, self.kernel_params, 0)[0]

    def launch_values(
        self,
        values: list[Any],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: Any,
    ) -> Any:
        """:meth:`pack_values` and launch on *stream*; the driver's code."""
        for view, value in zip(self.slot_views, values, strict=True):
            view[0] = value
        # Inline: one Python call fewer per launch.
        return _launch(self.function, *grid, *block, shared_mem, stream, self.kernel_params, 0)[0]

    def set_node(
        self,
        graph_exec: Any,
        node: Any,
        values: list[Any],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        context: int,
    ) -> Any:
        """:meth:`pack_values` into the kernel *node* (its handle in the graph) of the
        executable graph *graph_exec*, in one ``cuGraphExecKernelNodeSetParams``, with the
        context at address *context* current (0: whichever is); the driver's code."""
        for view, value in zip(self.slot_views, values, strict=True):
            view[0] = value
        params = self._node_params
        if params is None:
            params = self._node_params = drv.CUDA_KERNEL_NODE_PARAMS()
            params.func = self.function
            params.kernelParams = self.kernel_params
            if context:
                params.ctx = drv.CUcontext(context)
        params.gridDimX, params.gridDimY, params.gridDimZ = grid
        params.blockDimX, params.blockDimY, params.blockDimZ = block
        params.sharedMemBytes = shared_mem
        pushed = False
        if context and int(_current()[1]) != context:
            pushed = _push(params.ctx)[0] == _SUCCESS
        try:
            return _set_node(graph_exec, node, params)[0]
        finally:
            if pushed:
                _pop()


# The hot half of the completion reactor, in Python (its module says more).
from ._watches import Watch as Watch  # noqa: E402  # after the names it does not use
from ._watches import Watches as Watches  # noqa: E402
from ._watches import WatchLane as WatchLane  # noqa: E402
