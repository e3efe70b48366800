"""A deadline kept to a fraction of a millisecond, on loops whose timers count milliseconds.

asyncio's selector rounds the time it waits for a timer up to whole milliseconds (a 0.5 ms
``call_later`` runs after about 1.1 ms), uvloop rounds it to the nearest millisecond (0.5 ms
or less runs at the next turn of the loop, early), and trio's epoll wait rounds up as asyncio's
does. :func:`call_at_deadline` calls ``fn(*args)`` at the first turn of the loop at or after
``delay`` seconds, by the process's clock (``time.perf_counter``; uvloop's ``loop.time()``
counts milliseconds too):

- while more than :data:`SLACK` is left, a timer of the loop waits for most of it (until
  about :data:`SLACK` before the deadline), and a timer that fires early (uvloop) arms
  another for what is left, instead of calling;
- for the last :data:`SLACK` or less, the deadline is checked once per turn of the loop
  (``call_soon`` chained; on trio a system task's checkpoints). On a busy loop that is one
  cheap callback per turn; on an otherwise idle loop it spins, for at most :data:`SLACK`
  and never longer than the delay itself.

No thread, no task (on asyncio), nothing per turn while the deadline is far.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ._trio_loop import TrioLoop

__all__ = ("SLACK", "Deadline", "call_at_deadline", "clock")

clock: Callable[[], float] = time.perf_counter  # the clock deadlines are kept to (tests swap it)

# How much of a delay is checked turn by turn rather than left to the loop's timer: a loop
# timer of millisecond resolution fires at most about this late (or early, on uvloop).
SLACK = 0.0011


class Deadline:
    """The handle of a deadline on an asyncio loop (uvloop included); ``cancel()`` stops it."""

    __slots__ = ("_args", "_at", "_fn", "_handle", "_loop")

    def __init__(
        self, loop: Any, delay: float, fn: Callable[..., object], args: tuple[Any, ...]
    ) -> None:
        self._loop = loop
        self._fn = fn
        self._args = args
        self._at = clock() + delay
        self._handle: Any = self._arm(delay)

    def _arm(self, left: float) -> Any:
        if left > SLACK:
            return self._loop.call_later(left - SLACK, self._check)
        return self._loop.call_soon(self._check)

    def _check(self) -> None:
        left = self._at - clock()
        if left > 0.0:
            self._handle = self._arm(left)  # early: wait more, by timer or turn by turn
        else:
            self._fn(*self._args)

    def cancel(self) -> None:
        """Do not call, if it has not been called (on the loop's thread)."""
        self._handle.cancel()


def call_at_deadline(loop: Any, delay: float, fn: Callable[..., object], *args: Any) -> Any:
    """Call ``fn(*args)`` on *loop* at its first turn at or after *delay* seconds from now.

    Returns:
        A handle whose ``cancel()`` stops the call (on the loop's thread).
    """
    if type(loop) is TrioLoop:
        return loop.call_at_deadline(delay, fn, *args, clock=clock, slack=SLACK)
    return Deadline(loop, delay, fn, args)
