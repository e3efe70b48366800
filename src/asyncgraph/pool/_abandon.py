"""What a faulted CUDA context took with it: its memory, let go of quietly.

After a sticky device fault (an illegal address, say) every driver call on the context fails
with the fault's error, frees included. ``cuda.core`` then prints a warning for each buffer
whose free fails, when the buffer is closed and again when it is destroyed: closing a failed
backend that held 150 resident buffers printed 150 lines. The memory is not coming back
anyway: it goes with the context (``asyncgraph.reset_device()``, or the process's end).

So once the backend failed, its device buffers, and its pinned blocks (whose frees wait for
the failed device and fail too), are *abandoned* instead of freed: neither closed nor ever
destroyed (their Python objects keep one reference they never give back, a few hundred bytes
each), and the backend logs one ``backend.memory_abandoned`` event with how many device
buffers and bytes it let go of. The pinned host memory stays allocated until the process ends,
which a process whose device faulted is best left to do (``docs/errors.md``).
"""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ("abandon",)

_incref = ctypes.pythonapi.Py_IncRef
_incref.argtypes = [ctypes.py_object]
_incref.restype = None


def abandon(buffer: Any) -> int:
    """Keep *buffer* (a ``cuda.core`` Buffer or memory resource) from ever being freed or
    destroyed; returns its size in bytes (0 if it has none)."""
    _incref(buffer)
    return int(getattr(buffer, "size", 0) or 0)
