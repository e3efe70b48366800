"""A checkpoint on whichever loop runs (asyncio's, or trio's): what the lowest layers await,
without the loop adapter (``_loop``, which re-exports it)."""

from __future__ import annotations

import asyncio

__all__ = ("sleep",)


async def sleep(delay: float) -> None:
    """Sleep *delay* seconds (0: a checkpoint) on whichever loop runs."""
    if asyncio._get_running_loop() is not None:
        await asyncio.sleep(delay)
    else:
        import trio

        await trio.sleep(delay)
