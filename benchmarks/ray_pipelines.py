"""Pipelines the Ray benchmark sends to its actors (an importable module, so Ray ships them
by reference, as a user's own module would be)."""

from __future__ import annotations

from typing import Any

import numpy as np

import asyncgraph as ag
from asyncgraph._bench import SCALE


async def echo(worker: Any, x: Any) -> Any:
    """Return the argument: the pool's own cost."""
    return x


async def scale_once(worker: Any, x: Any) -> Any:
    """One dispatch of the scale kernel on the actor's backend."""
    (out,) = await worker.backend.dispatch(
        SCALE, x, ag.Out(x.shape, x.dtype), np.float32(2), np.int32(x.size),
        grid=(x.size + 255) // 256, block=256,
    )  # fmt: skip
    return out
