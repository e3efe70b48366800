"""CUDA stream priorities of the priority classes: the one place that reads the device's range.

``cuCtxGetStreamPriorityRange`` gives the context's *least* and *greatest* stream priority; the
range runs backwards (a numerically lower value is a higher priority: 0 is the lowest and -5
the highest on an NVIDIA H100), and a value outside it is clamped by the driver without a word.
:func:`class_priorities` maps each class into the range, so no caller handles its direction
or can step outside it.
"""

from __future__ import annotations

from cuda.bindings import driver as drv

from asyncgraph._runtime._priority import PRIORITIES

from ._driver import check

__all__ = ("class_priorities", "class_streams", "device_priorities")


def class_priorities(least: int, greatest: int) -> tuple[int, ...]:
    """The CUDA stream priority of each class, in ``PRIORITIES`` order, for the range
    *least* (the lowest priority) to *greatest* (the highest): ``"high"`` gets the greatest,
    ``"low"`` the least, ``"normal"`` the middle (rounded towards the least). A range of one
    value gives every class that value."""
    middle = least + int((greatest - least) / 2)  # towards least, whichever way the range runs
    by_class = {"high": greatest, "normal": middle, "low": least}
    return tuple(by_class[name] for name in PRIORITIES)


def class_streams(streams: int) -> int:
    """Streams of each class other than the default one, for *streams* of the default class
    (``BackendOptions.streams``): a quarter, at least one. Few, since the fast path, which
    keeps off them, steps over each of them when it places a dispatch."""
    return max(1, streams // 4)


def device_priorities() -> tuple[int, ...]:
    """:func:`class_priorities` of the current context's range.

    Raises:
        CudaError: ``cuCtxGetStreamPriorityRange`` failed.
    """
    least, greatest = check(drv.cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
    return class_priorities(int(least), int(greatest))
