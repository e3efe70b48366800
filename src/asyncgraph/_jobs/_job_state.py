"""The states a dispatch's job moves through (the scheduler's state machine, ``_scheduler``)."""

from __future__ import annotations

import enum

__all__ = ("JobState",)


class JobState(enum.Enum):
    """Where a dispatch is on its way."""

    QUEUED = "queued"  # waiting for an in-flight slot
    COMPILING = "compiling"  # its kernel compiles
    STAGING = "staging"  # its inputs are copied into pinned memory off the loop
    PARKED = "parked"  # a use it depends on has not reached the device yet
    LAUNCHED = "launched"  # handed to the engine, which runs it
    COLLECTING = "collecting"  # the device finished; its results are being copied out
    DONE = "done"  # its outcome is known
