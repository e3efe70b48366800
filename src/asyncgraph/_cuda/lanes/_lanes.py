"""Lanes: a stream with its handle and scratch buffer, and the one way to record and watch.

Every event the engine waits for is recorded on a lane and watched by the reactor through
:meth:`Lane.record_and_watch`: it takes an event from the pool, records it, gives it back if the
record fails (so no error path leaks an event), and hands it to the reactor, which returns it to
the pool after the callback ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from cuda.bindings import driver as drv

from asyncgraph._cuda.core._choose import core
from asyncgraph._cuda.driver._driver import SUCCESS, error_for
from asyncgraph._runtime._exceptions import CudaError, DeviceFaultError
from asyncgraph._runtime._priority import NORMAL

if TYPE_CHECKING:
    from asyncgraph._cuda.driver._events import EventPool
    from asyncgraph.pool import StreamLane, StreamOrderedDeviceMemory

__all__ = ("SCRATCH_BYTES", "Lane", "Owner", "Watcher")

record = core.record

# Dispatches needing at most this much device memory use their lane's scratch buffer.
SCRATCH_BYTES = 1 << 20


class Watcher(Protocol):
    """What a lane asks of the reactor (``Reactor.watch``)."""

    def watch(
        self,
        lane: int,
        event: Any,
        callback: Callable[[CudaError | None], None],
        expect: float = 0.0,
    ) -> Any:
        """Call *callback* once *event* (recorded on lane *lane*) completed; the watch."""
        ...


class Owner(Protocol):
    """What a lane uses of its device (``Device``)."""

    events: EventPool

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """See ``Device.loop``."""
        ...

    @property
    def reactor(self) -> Watcher:
        """The completion reactor."""
        ...

    def fail(self, error: DeviceFaultError) -> None:
        """Fail the device (and every CUDA backend of the process: a sticky fault)."""
        ...


class Lane:
    """One stream of the backend: its ``cuda.core`` stream, ``CUstream`` handle and scratch.

    Attributes:
        index: its index in the stream pool (and the reactor's lane).
        slot: its place in the stream pool (``outstanding``, ``leased``).
        stream: the ``cuda.core`` Stream; handle: the ``CUstream``.
        scratch: device memory every small dispatch on this lane uses, ordered by the stream.
        rank: the rank of the priority class whose dispatches run on it.
    """

    __slots__ = (
        "_device",
        "handle",
        "index",
        "rank",
        "scratch",
        "scratch_ptr",
        "seen",
        "slot",
        "stream",
    )

    def __init__(
        self, device: Owner, slot: StreamLane[Any], scratch: Any | None, rank: int = NORMAL
    ) -> None:
        self._device = device
        self.rank = rank  # the priority class whose work runs here (``_runtime/_priority``)
        self.slot = slot
        self.index = slot.index
        self.stream = slot.stream
        self.handle = drv.CUstream(int(slot.stream.handle))
        self.scratch = scratch  # None on a wait lane (``_foreign_work``), which runs no dispatch
        self.scratch_ptr = int(scratch.handle) if scratch is not None else 0
        self.seen = 0.0  # see future()

    def __repr__(self) -> str:
        return f"<Lane {self.index} outstanding={self.slot.outstanding}>"

    def take(self) -> None:
        """Count one more piece of work placed here."""
        self.slot.add(1)

    def give(self) -> None:
        """Count one piece of work done."""
        self.slot.add(-1)

    def record(self) -> Any:
        """Take an event and record it on this stream.

        Raises:
            CudaError: the record failed (the event went back to its pool).
        """
        events = self._device.events
        event = events.take()
        code = record(event, self.handle)[0]
        if code != SUCCESS:
            events.give(event)
            raise error_for(code, "cuEventRecord")
        return event

    def watch(
        self, event: Any, callback: Callable[[CudaError | None], None], expect: float = 0.0
    ) -> Any:
        """Call ``callback(error)`` on the loop once *event* completed; the event is then
        recycled (nothing may wait on it after the callback). *expect*: when the work is
        expected to end (``perf_counter()``), if known. Returns the watch."""
        return self._device.reactor.watch(self.index, event, callback, expect)

    def settle(self) -> bool:
        """Wait (blocking) until the work enqueued on this stream so far is done; whether it is.

        For a failure that left work enqueued with no event watching it (its record failed):
        what that work uses (staging, buffers) must not be reused or released before it ran.
        If the stream cannot be synchronized either, nothing on the device can be known done:
        the device fails (``Device.fail``), and ``False`` is returned.
        """
        code = drv.cuStreamSynchronize(self.handle)[0]
        if code == SUCCESS:
            return True
        error = error_for(code, "cuStreamSynchronize")
        if not isinstance(error, DeviceFaultError):
            error = DeviceFaultError(
                error.code,
                error.name,
                error.call,
                "work enqueued on a stream could not be waited for after its event failed to "
                "record, so nothing the backend enqueued can be known done",
            )
        self._device.fail(error)
        return False

    def record_and_watch(self, callback: Callable[[CudaError | None], None]) -> Any:
        """Record an event after the work enqueued so far and watch it; returns the event."""
        event = self.record()
        self.watch(event, callback)
        return event

    def future(
        self, event: Any, on_done: Callable[[CudaError | None, bool], Any], expect: float = 0.0
    ) -> asyncio.Future[Any]:
        """A future for *event*: ``on_done(error, cancelled)`` runs first, on the loop, even if
        the awaiting task was cancelled (so resources are released after the work, never
        before); its return value is the future's result. *expect*: as for :meth:`watch`;
        while ``on_done`` runs, :attr:`seen` says when a waiter thread saw the event complete
        (0.0: the loop's own poll did)."""
        loop = self._device.loop
        future: asyncio.Future[Any] = loop.create_future()

        watches: list[Any] = []  # its watch, once made (a failed device finishes it at once)

        def done(error: CudaError | None) -> None:
            outcome: BaseException | None = error
            value = None
            self.seen = watches[0].seen if watches else 0.0
            try:
                value = on_done(error, future.cancelled())
            except BaseException as exc:
                outcome = exc
            if future.done():
                return
            try:
                if outcome is not None:
                    future.set_exception(outcome)
                else:
                    future.set_result(value)
            except RuntimeError:  # the loop closed (Reactor.adopt settles this): none to wake
                pass

        watches.append(self.watch(event, done, expect))
        return future

    def free_scratch(self, memory: StreamOrderedDeviceMemory) -> None:
        """Give the scratch buffer back (closing; every dispatch completed)."""
        scratch, self.scratch = self.scratch, None
        self.scratch_ptr = 0
        if scratch is not None:
            memory.unreserve(scratch, self.stream)
