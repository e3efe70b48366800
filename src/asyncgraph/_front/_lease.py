"""Stream leases: a backend's CUDA stream lent for work that other libraries enqueue."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asyncgraph._runtime._exceptions import UnsupportedError

__all__ = ("StreamLease", "end_lease")


class StreamLease:
    """One of the backend's streams, lent to you alone inside ``async with backend.stream()``.

    Enqueue work of other libraries on it (PyTorch through ``torch.cuda.ExternalStream(
    lease.handle)``, CuPy through ``cupy.cuda.ExternalStream(lease.handle)``, ``cuda.core``
    through ``lease`` itself, which has ``__cuda_stream__``), then ``await lease.synchronize()``
    to wait for it without blocking the event loop. No dispatch is placed on a leased stream.
    Work still enqueued when the lease ends keeps running; later dispatches on that stream are
    ordered after it.

    Made by the engine that lends the stream (``Engine.stream``), with the backend's name and
    how to wait for the stream's work (``synchronize(lane)``).

    Attributes:
        index: the stream's index in the backend's stream pool.
    """

    __slots__ = ("_active", "_backend", "_lane", "_synchronize", "index")

    def __init__(
        self, backend: str, lane: Any, synchronize: Callable[[Any], Awaitable[None]]
    ) -> None:
        self._backend = backend
        self._lane = lane
        self._synchronize = synchronize
        self._active = True
        self.index: int = lane.index

    def _check(self, what: str) -> None:
        if not self._active:
            raise UnsupportedError(
                f"{what} of a stream lease that ended; use the lease inside "
                "'async with backend.stream() as lease:'"
            )

    @property
    def handle(self) -> int:
        """The ``CUstream`` handle as an int (what ``ExternalStream`` constructors take)."""
        self._check("handle")
        return int(self._lane.stream.handle)

    @property
    def stream(self) -> Any:
        """The ``cuda.core`` ``Stream``."""
        self._check("stream")
        return self._lane.stream

    def __cuda_stream__(self) -> tuple[int, int]:
        """The ``cuda.core`` stream protocol: (version 0, handle)."""
        return (0, self.handle)

    async def synchronize(self) -> None:
        """Wait until the work enqueued on the stream so far completed; the loop keeps running.

        Raises:
            DeviceFaultError: the work faulted (the backend fails, as for a dispatch).
            UnsupportedError: the lease ended.
        """
        self._check("synchronize()")
        await self._synchronize(self._lane)

    def __repr__(self) -> str:
        state = "active" if self._active else "ended"
        return f"<StreamLease stream {self.index} of {self._backend} {state}>"


def end_lease(lease: StreamLease) -> None:
    """The ``async with backend.stream()`` block ended: the lease refuses use from now on."""
    lease._active = False
