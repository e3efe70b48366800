"""Priority classes and queue deadlines: the names a caller passes, checked at the call.

A dispatch belongs to one of three classes, ``"high"``, ``"normal"`` (the default) and
``"low"``; the scheduler keeps them as ranks (0 is the highest), in :data:`PRIORITIES` order.
Callers pass names, never numbers: what a class means on a device (a CUDA stream priority) is
the engine's to map (``_cuda/driver/_priorities.py``).
"""

from __future__ import annotations

import math
from typing import Final

from asyncgraph._runtime._exceptions import ArgumentTypeError, DispatchError

__all__ = (
    "AGING",
    "HIGH",
    "LOW",
    "NORMAL",
    "PRIORITIES",
    "RANKS",
    "check_priority",
    "check_queue_timeout",
)

PRIORITIES: Final = ("high", "normal", "low")
HIGH: Final = 0
NORMAL: Final = 1
LOW: Final = 2
RANKS: Final = {name: rank for rank, name in enumerate(PRIORITIES)}  # each class's rank

# The starvation bound: a queued dispatch that has seen this many dispatches admitted since it
# was queued goes before every dispatch queued after it, whatever their class (docs/jobs.md).
AGING: Final = 16


def check_priority(value: object, where: str) -> int:
    """The rank of the class named *value* (``"high"`` 0, ``"normal"`` 1, ``"low"`` 2).

    Raises:
        DispatchError: *value* names no class (ArgumentTypeError if it is no string).
    """
    rank = RANKS.get(value) if isinstance(value, str) else None
    if rank is not None:
        return rank
    error = DispatchError if isinstance(value, str) else ArgumentTypeError
    raise error(f"{where}: priority={value!r}; pass 'high', 'normal' or 'low'")


def check_queue_timeout(value: object, where: str) -> float | None:
    """*value* as seconds a dispatch may wait for an in-flight slot, or ``None`` (no bound:
    *value* is ``None`` or ``math.inf``).

    Raises:
        ArgumentTypeError: *value* is no number. DispatchError: it is negative or NaN.
    """
    if value is None or value == math.inf:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentTypeError(
            f"{where}: queue_timeout={value!r}; pass a number of seconds, or None for no bound"
        )
    if math.isnan(value) or value < 0:
        raise DispatchError(
            f"{where}: queue_timeout={value!r}; pass a non-negative number of seconds, or None "
            "for no bound"
        )
    return float(value)
