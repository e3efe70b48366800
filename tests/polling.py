"""Waiting for a condition in a test: polled under a deadline, never a fixed sleep.

A sleep long enough on an idle machine is too short on a loaded one (a worker thread that has
not run yet), and wastes the time everywhere else. :func:`until` returns as soon as the
condition holds and fails, saying what it waited for, once the deadline passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

__all__ = ("DEADLINE", "until", "until_sync")

DEADLINE = 10.0  # seconds: far beyond what any condition here takes, even under load


async def until(condition: Callable[[], bool], what: str = "", within: float = DEADLINE) -> None:
    """Let the loop run until *condition()* holds (asyncio, uvloop or trio).

    Raises:
        AssertionError: it did not hold within *within* seconds (the message says *what*).
    """
    deadline = time.monotonic() + within
    while not condition():  # plain counters and flags: no event to await
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {within} s for {what or condition!r}")
        await anyio.sleep(0.001)


def until_sync(condition: Callable[[], bool], what: str = "", within: float = DEADLINE) -> None:
    """:func:`until` for a thread without a loop."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {within} s for {what or condition!r}")
        time.sleep(0.001)
