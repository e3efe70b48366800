"""When a job that has not launched may be withdrawn without breaking the order of its buffers.

A job that writes a resident buffer is part of that buffer's order: later uses are ordered
after it, and it was recorded as the buffer's writer in place of the uses before it (which it
is ordered after). So it is kept, whatever asks for its withdrawal, while a later use of a
buffer it writes depends on it (that use would read what it did not write), or while a use of
that buffer it is ordered after is unfinished (a later use would lose its order after that
one). A job that only reads buffers may always go: nothing is ordered after a read but writes,
which are ordered after the uses before it too.
"""

from __future__ import annotations

from typing import Any

from asyncgraph._buffers._resident import readers_of, writer_of

__all__ = ("kept_by_order",)


def kept_by_order(job: Any, done: object) -> bool:
    """Whether *job* (a scheduler ``Job``) must stay for its buffers' order, as above; *done*
    is the state of a job whose outcome is known."""
    written = [arg.buffer for arg in job.call.args if arg.buffer is not None and arg.writes]
    if not written:
        return False
    if any(writer_of(b) is not job or readers_of(b) for b in written):
        return True  # a later use depends on it
    return not all(_finished(dep, done) for dep in job.deps)


def _finished(use: object, done: object) -> bool:
    """Whether *use* (a job of either path, or a download) finished."""
    state = getattr(use, "state", None)
    if state is not None:
        return state is done
    finished = getattr(use, "finished", None)  # a Download's
    return finished is not None and bool(finished.is_set())
