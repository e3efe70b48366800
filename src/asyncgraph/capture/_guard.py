"""The capture lock, the capture guard, and the names of capture modes and states."""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from cuda.bindings import driver as drv

from asyncgraph._runtime import _loop
from asyncgraph._runtime._exceptions import CaptureError

__all__ = (
    "CaptureGuard",
    "CaptureLock",
    "CaptureMode",
    "CaptureStatus",
    "capture_status",
    "capture_tail",
)


class CaptureMode(enum.Enum):
    """What other CUDA calls may do while a stream captures (``cudaStreamCaptureMode``).

    - ``GLOBAL``: potentially unsafe calls (event queries and syncs, legacy allocations) from
      any thread of the process invalidate the capture.
    - ``THREAD_LOCAL``: only such calls from the capturing thread do.
    - ``RELAXED``: none do; the capturing thread must itself avoid what cannot be captured.
    """

    GLOBAL = "global"
    THREAD_LOCAL = "thread_local"
    RELAXED = "relaxed"

    @classmethod
    def parse(cls, value: object) -> CaptureMode:
        """*value* as a mode: a :class:`CaptureMode` or its string value."""
        if isinstance(value, CaptureMode):
            return value
        for mode in cls:
            if value == mode.value:
                return mode
        names = ", ".join(repr(m.value) for m in cls)
        raise CaptureError(f"mode={value!r}; pass one of {names} (or asyncgraph.CaptureMode)")


class CaptureStatus(enum.Enum):
    """Whether a stream is capturing (``cuStreamIsCapturing``)."""

    NONE = "none"
    ACTIVE = "active"
    INVALIDATED = "invalidated"


_STATUS = {
    drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE: CaptureStatus.NONE,
    drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE: CaptureStatus.ACTIVE,
    drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED: CaptureStatus.INVALIDATED,
}


_SUCCESS = drv.CUresult.CUDA_SUCCESS
_ACTIVE = int(drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE)


def capture_tail(stream: Any) -> tuple[Any, int, int, int]:
    """``cuStreamGetCaptureInfo(stream)`` as a capture asks it: (the driver's code, the capture
    status, how many nodes the stream's next work would depend on, the first of them as an
    int, 0 if none)."""
    result = drv.cuStreamGetCaptureInfo(stream)
    deps = result[4]
    return result[0], int(result[1]), len(deps), int(deps[0]) if deps else 0


def capture_status(handle: Any) -> CaptureStatus:
    """The capture status of the ``CUstream`` *handle*."""
    code, status = drv.cuStreamIsCapturing(handle)
    if code != drv.CUresult.CUDA_SUCCESS:
        raise CaptureError(f"cuStreamIsCapturing failed: {code.name}")
    return _STATUS[status]


class CaptureLock:
    """One capture at a time per backend, across tasks and threads.

    Tasks use ``async with lock:`` (waits without blocking the loop, cancellation-safe); threads
    use ``with lock:``; the backend's own synchronous captures use :meth:`try_acquire`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def locked(self) -> bool:
        """Whether a capture holds the lock."""
        return self._lock.locked()

    def try_acquire(self) -> bool:
        """Take the lock if it is free; ``False`` if a capture holds it."""
        return self._lock.acquire(blocking=False)

    async def acquire(self) -> None:
        """Wait for the lock without blocking the event loop."""
        delay = 0.0002
        while not self._lock.acquire(blocking=False):
            # Polling keeps cancellation trivial: a cancelled wait never holds the lock.
            await _loop.sleep(delay)
            delay = min(delay * 2, 0.005)

    def release(self) -> None:
        """Give the lock back."""
        self._lock.release()

    async def __aenter__(self) -> CaptureLock:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def __enter__(self) -> CaptureLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class CaptureGuard:
    """Captures the work enqueued on one stream into an executable graph (``cuda.core``).

    ``with CaptureGuard(stream, handle, mode) as guard:`` begins the capture; work enqueued on
    the stream meanwhile is recorded, not run; ``guard.graph`` is the executable graph after a
    clean exit. On any error inside, or if the capture was invalidated, the guard ends the
    capture, discards the partial graph and leaves the stream usable (status ``NONE``); an
    invalidated capture raises :class:`CaptureError`.

    Args:
        stream: the ``cuda.core`` stream to capture on.
        handle: its ``CUstream``.
        mode: the :class:`CaptureMode`.
        reuse: called with the graph builder once the capture ended cleanly; it may update an
            executable graph it has in place with what was captured and return it (then
            ``reused`` is set, and nothing is instantiated), or return ``None``.
        tail: asks the driver about the capture's tail (:func:`capture_tail`'s answer; the
            dispatch core's is faster).
    """

    def __init__(
        self,
        stream: Any,
        handle: Any,
        mode: CaptureMode,
        reuse: Callable[[Any], Any] | None = None,
        tail: Callable[[Any], tuple[Any, int, int, int]] | None = None,
    ) -> None:
        self._stream = stream
        self._handle = handle
        self._mode = mode
        self._reuse = reuse
        self._tail = tail or capture_tail
        self._builder: Any = None
        self.graph: Any = None  # the executable graph (cuda.core Graph)
        self.nodes: dict[int, Any] = {}  # node handle -> cuda.core GraphNode, after the exit
        self.reused = False  # the executable graph is reuse()'s, updated in place

    @property
    def stream(self) -> Any:
        """The ``cuda.core`` stream it captures on."""
        return self._stream

    @property
    def handle(self) -> Any:
        """The ``CUstream`` it captures on."""
        return self._handle

    @property
    def status(self) -> CaptureStatus:
        """The stream's capture status now."""
        return capture_status(self._handle)

    def last_node(self) -> int:
        """The handle of the node the last capture call added (e.g. a kernel launch)."""
        code, status, count, node = self._tail(self._handle)
        if code != _SUCCESS:
            raise CaptureError(f"cuStreamGetCaptureInfo failed: {drv.CUresult(code).name}")
        if status != _ACTIVE:
            raise CaptureError(self._invalidated())
        if count != 1:
            raise CaptureError(f"expected one node at the capture's tail, found {count}")
        return node

    def _invalidated(self) -> str:
        return (
            f"the capture was invalidated: a CUDA call that cannot be captured ran during a "
            f"{self._mode.value!r} capture (an event query or synchronisation, a legacy "
            "allocation). Use mode='relaxed', or keep such calls out of the capture"
        )

    def __enter__(self) -> CaptureGuard:
        if capture_status(self._handle) is not CaptureStatus.NONE:
            raise CaptureError("the stream is already capturing")
        builder = self._stream.create_graph_builder()
        try:
            builder.begin_building(self._mode.value)
        except Exception as exc:
            with contextlib.suppress(Exception):
                builder.close()
            raise CaptureError(f"could not begin the capture: {exc}") from exc
        self._builder = builder
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        builder, self._builder = self._builder, None
        if exc_type is None and capture_status(self._handle) is CaptureStatus.ACTIVE:
            try:
                builder.end_building()
                reused = self._reuse(builder) if self._reuse is not None else None
                if reused is not None:
                    self.graph, self.reused = reused, True
                else:
                    self.graph = builder.complete()
                    definition = builder.graph_definition
                    self.nodes = {int(node.handle): node for node in definition.nodes()}
            except Exception as error:
                self._abort(builder)
                raise CaptureError(f"could not complete the captured graph: {error}") from error
            with contextlib.suppress(Exception):
                builder.close()
            return
        invalidated = capture_status(self._handle) is CaptureStatus.INVALIDATED
        self._abort(builder)
        if exc_type is None or invalidated:
            raise CaptureError(self._invalidated()) from exc

    def _abort(self, builder: Any) -> None:
        """End the capture whatever state it is in and discard what it recorded.

        The builder captures into a graph of its own (``cuStreamBeginCaptureToGraph``), which
        ending the capture hands back and the builder's ``close()`` destroys: destroying it
        here as well freed it twice (the stand-in driver counts such destroys; a real driver
        does not say). An active capture is ended through the builder; an invalidated one,
        which the builder cannot end, with ``cuStreamEndCapture``, which then gives no graph.
        """
        if capture_status(self._handle) is CaptureStatus.ACTIVE:
            with contextlib.suppress(Exception):
                builder.end_building()
        if capture_status(self._handle) is not CaptureStatus.NONE:
            drv.cuStreamEndCapture(self._handle)
        with contextlib.suppress(Exception):
            builder.close()
        if capture_status(self._handle) is not CaptureStatus.NONE:
            raise CaptureError("the stream is still capturing after the capture was ended")
        self.graph = None
