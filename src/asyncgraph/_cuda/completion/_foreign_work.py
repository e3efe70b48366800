"""Other libraries' CUDA streams and events: awaiting their work, and ordering with it.

Three things, all without blocking the event loop or the device:

- :meth:`ForeignWork.wait` (``backend.wait(stream_or_event)``): records one of the backend's
  pooled events on the caller's stream and hands it to the completion reactor, like a
  dispatch's. The reactor needs each of its lanes' events to complete in order, and has two
  lanes for foreign waits, outside the stream pool (no dispatch ever queues behind foreign
  work): the *direct* lane watches the events of one stream at a time (the stream of the
  first wait that finds it empty; a service waits on PyTorch's one stream, usually), in order
  since they are one stream's; waits on other streams meanwhile, and waits for events, go
  through the *relay* lane, a stream of the backend's own, which waits for them on the device
  (``cuStreamWaitEvent``) and records the event the reactor watches.
- :meth:`ForeignWork.fences` (``dispatch(..., after=...)``): events recorded on the caller's
  streams at ``dispatch()`` (or the caller's events), which the dispatch's stream waits for on
  the device before its copies and kernel.
- :meth:`ForeignWork.order` (``backend.order(stream, after=pending)``): the caller's stream
  waits on the device for a dispatch in flight.

A stream must belong to the backend's CUDA context (checked with ``cuStreamGetCtx``, before
anything is recorded); an event may come from anywhere, as ``cuStreamWaitEvent`` allows. A
handle passed as an ``int`` must name a live stream: the driver reads what it points to, so a
stale or made-up handle cannot be refused cleanly (it may crash the process), as with any
driver call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from cuda.bindings import driver as drv

from asyncgraph._args._checks import describe_value
from asyncgraph._cuda.core._choose import core
from asyncgraph._cuda.driver._driver import SUCCESS, check, error_for
from asyncgraph._cuda.lanes._staging_plan import dep_event
from asyncgraph._runtime._exceptions import ArgumentTypeError, DispatchError

if TYPE_CHECKING:
    import asyncio

    from asyncgraph._cuda.driver._context import OwnContext
    from asyncgraph._cuda.driver._events import EventPool
    from asyncgraph._cuda.lanes._lanes import Lane

__all__ = ("WAIT_LANES", "ForeignWork", "Owner", "resolve")

WAIT_LANES = 2  # reactor lanes of foreign waits: the relay lane (a stream), the direct one
_RELAY, _DIRECT = 0, 1
# Handles that name the calling thread's default streams rather than one stream.
_LEGACY, _PER_THREAD = 1, 2
_STREAM, _EVENT = "stream", "event"
record = core.record


def resolve(work: object) -> tuple[str, int]:
    """``("stream", handle)`` or ``("event", handle)`` for what *work* names.

    Streams: anything with ``__cuda_stream__`` (a ``cuda.core`` ``Stream``, a stream lease,
    CuPy's and recent PyTorch's streams), a PyTorch stream (``cuda_stream``), a CuPy stream
    (``ptr``), a ``CUstream``, or a handle as an ``int`` (``0`` is the legacy default stream).
    Events: a ``CUevent``, a ``cuda.core`` ``Event``, a PyTorch event (``cuda_event``, once
    recorded) or a CuPy event (``ptr``).

    Raises:
        ArgumentTypeError: *work* is none of these, or an event that was never recorded.
    """
    if isinstance(work, bool):
        raise ArgumentTypeError(f"{work!r} is not a CUDA stream or event")
    if isinstance(work, int):
        if work < 0:
            raise ArgumentTypeError(f"stream handle {work} is negative; pass a CUstream handle")
        return _STREAM, work
    if isinstance(work, drv.CUstream):
        return _STREAM, int(work)
    if isinstance(work, drv.CUevent):
        return _EVENT, int(work)
    module = type(work).__module__ or ""
    name = type(work).__name__
    if "Event" in name:
        handle = _event_handle(work, module)
        if handle is not None:
            if not handle:
                raise ArgumentTypeError(
                    f"{name} was never recorded, so there is no work to wait for; record it "
                    "on a stream first (event.record(stream))"
                )
            return _EVENT, handle
    protocol = getattr(work, "__cuda_stream__", None)
    if protocol is not None:
        version, handle = protocol() if callable(protocol) else protocol
        if version != 0:
            raise ArgumentTypeError(f"__cuda_stream__ version {version} is not supported (0 is)")
        return _STREAM, int(handle)
    if module.startswith("torch") and hasattr(work, "cuda_stream"):
        return _STREAM, int(work.cuda_stream)
    if module.startswith("cupy") and hasattr(work, "ptr"):
        return _STREAM, int(work.ptr)
    raise ArgumentTypeError(
        f"{describe_value(work)} is not a CUDA stream or event; pass a stream (torch.cuda.Stream, "
        "cupy.cuda.Stream, anything with __cuda_stream__, a CUstream or its handle as an int) "
        "or an event (torch.cuda.Event, cupy.cuda.Event, cuda.core Event, CUevent)"
    )


def _event_handle(work: Any, module: str) -> int | None:
    if module.startswith("torch"):
        return int(getattr(work, "cuda_event", 0) or 0)
    if module.startswith("cupy"):
        return int(work.ptr)
    if module.startswith("cuda.core"):
        return int(work.handle)
    return None


class Owner(Protocol):
    """What foreign work uses of its device (``Device``)."""

    name: str
    context: Any  # the context's CUcontext
    ctx: OwnContext
    events: EventPool
    wait_lanes: list[Lane]
    watches: Any  # the reactor's hot half (``core.Watches``)

    def check_healthy(self) -> None:
        """See ``Device.check_healthy``."""
        ...

    def lease_started(self) -> None:
        """A stream was leased."""
        ...

    def lease_ended(self) -> None:
        """A lease ended."""
        ...


class ForeignWork:
    """Waits for, and orders with, work other libraries enqueue on the backend's device."""

    def __init__(self, device: Owner) -> None:
        self._device = device
        self._direct_stream: int | None = None  # the stream the direct wait lane serves

    def _stream(self, handle: int) -> Any:
        """*handle* as a ``CUstream`` of the backend's context.

        Raises:
            DispatchError: the stream belongs to another context (or device), or the calling
                thread's default stream is another context's.
            ArgumentTypeError: *handle* is not a live stream.
        """
        device = self._device
        ours = int(device.context)
        stream = drv.CUstream(handle)
        if handle in (0, _LEGACY, _PER_THREAD):
            code, current = drv.cuCtxGetCurrent()
            if code != SUCCESS or int(current) != ours:
                raise DispatchError(
                    f"the default stream ({handle}) of this thread belongs to another CUDA "
                    f"context than {device.name}'s; make that device current, or pass a "
                    "stream of it"
                )
            return stream
        code, context = drv.cuStreamGetCtx(stream)
        if code != SUCCESS:
            raise ArgumentTypeError(
                f"stream handle {handle:#x} is not a live CUDA stream "
                f"({error_for(code, 'cuStreamGetCtx')})"
            ) from None
        if int(context) != ours:
            raise DispatchError(
                f"stream {handle:#x} belongs to another CUDA context or device than "
                f"{device.name}'s backend; wait for it on the backend of its own device"
            )
        return stream

    def _fence(self, work: object) -> tuple[Any, bool]:
        """An event that completes with *work* so far: ``(event, ours)``; ours go back to
        the pool once waited for. Nothing is recorded if *work* is refused."""
        kind, handle = resolve(work)
        if kind == _EVENT:
            return drv.CUevent(handle), False
        return self._record_on(self._stream(handle)), True

    def _record_on(self, stream: Any) -> Any:
        """One of the pool's events, recorded on *stream* (given back if the record fails)."""
        events = self._device.events
        event = events.take()
        code = record(event, stream)[0]
        if code != SUCCESS:
            events.give(event)
            raise error_for(code, "cuEventRecord")
        return event

    # -- backend.wait -------------------------------------------------------------------------

    def wait(self, work: object) -> asyncio.Future[None]:
        """A future that completes once the work on *work* (a stream or an event) so far
        completed; the event loop keeps running meanwhile.

        The event recorded on a stream is watched straight on the *direct* wait lane while that
        lane serves this one stream (it takes the stream when it has nothing pending): one
        stream's events complete in order, as the reactor needs. Waits for another stream
        while it serves one, and waits for events, go through the *relay* lane: it waits for
        them on the device (``cuStreamWaitEvent``) and an event recorded on it is watched.

        Cancelling the future stops nothing on the device; the events return to their pool
        once the work completed. A device fault fails it (and the backend) with
        ``DeviceFaultError``.

        Raises:
            ArgumentTypeError, DispatchError: see :func:`resolve` and ``_stream``.
            DeviceFaultError: the device failed earlier.
        """
        device = self._device
        device.check_healthy()
        kind, handle = resolve(work)
        stream = self._stream(handle) if kind == _STREAM else None  # the caller's context
        with device.ctx:
            return self._wait(handle, stream)

    def _wait(self, handle: int, stream: Any) -> asyncio.Future[None]:
        device = self._device
        if stream is not None:
            direct = device.wait_lanes[_DIRECT]
            if handle != self._direct_stream and not self._pending(direct):
                self._direct_stream = handle
            if handle == self._direct_stream:
                return self._watch(direct, self._record_on(stream))
            event, ours = self._record_on(stream), True
        else:
            event, ours = drv.CUevent(handle), False
        relay = device.wait_lanes[_RELAY]
        try:
            check(drv.cuStreamWaitEvent(relay.handle, event, 0), "cuStreamWaitEvent")
        finally:
            if ours:  # the wait took the work recorded so far
                device.events.give(event)
        return self._watch(relay, relay.record())

    def _pending(self, lane: Lane) -> bool:
        """Whether the reactor still watches events on *lane*."""
        return bool(self._device.watches.lanes[lane.index].pending)

    def _watch(self, lane: Lane, event: Any) -> asyncio.Future[None]:
        device = self._device
        # Closing waits for foreign waits in flight, as for stream leases.
        device.lease_started()
        return lane.future(event, lambda _error, _cancelled: device.lease_ended())

    # -- dispatch(after=) ---------------------------------------------------------------------

    def fences(self, after: object) -> list[Any]:
        """Events for ``dispatch(..., after=after)``: one stream or event, or a list or tuple
        of them. All are resolved and checked before anything is recorded.

        Raises:
            ArgumentTypeError, DispatchError: an item is refused; nothing was recorded.
        """
        items = list(after) if isinstance(after, (list, tuple)) else [after]
        for item in items:
            kind, handle = resolve(item)
            if kind == _STREAM:
                self._stream(handle)
        self._device.check_healthy()
        fences: list[Any] = []
        try:
            with self._device.ctx:
                for item in items:
                    fences.append(self._fence(item))
        except BaseException:
            self.drop(fences)
            raise
        return fences

    def wait_fences(self, fences: list[Any], lane: Lane) -> None:
        """Make *lane* wait for *fences* on the device, and give our events back."""
        try:
            for event, _ours in fences:
                check(drv.cuStreamWaitEvent(lane.handle, event, 0), "cuStreamWaitEvent")
        finally:
            self.drop(fences)

    def drop(self, fences: list[Any]) -> None:
        """Give back our events among *fences* (waited for, or never to be)."""
        events = self._device.events
        for event, ours in fences:
            if ours:
                events.give(event)
        fences.clear()

    # -- backend.order ------------------------------------------------------------------------

    def order(self, work: object, job: Any) -> bool:
        """Make the stream *work* wait on the device for *job* (a dispatch in flight). Returns
        ``False`` when *job* has not launched yet (the caller waits for it instead).

        Raises:
            ArgumentTypeError, DispatchError: *work* is not a stream of this backend's context.
        """
        kind, handle = resolve(work)
        if kind != _STREAM:
            raise ArgumentTypeError(
                "backend.order() orders a stream after a dispatch; pass the stream, not an event"
            )
        stream = self._stream(handle)
        event = dep_event(job) if job is not None else None
        if event is None:
            return True  # completed: nothing to wait for
        if event is False:
            return False
        with self._device.ctx:
            check(drv.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")
        return True
