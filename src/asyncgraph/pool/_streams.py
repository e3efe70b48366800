"""The stream pool: placement of dispatches, and exclusive leases for foreign work.

Dispatches are placed, not leased: ``pick()`` returns the unleased stream with the fewest
dispatches outstanding (ties broken round-robin), so a long kernel on one stream does not hold up
short dispatches that other streams could run. ``lease()`` hands a stream out exclusively (for
``backend.stream()``), bounded so that one stream always stays for dispatches; waiting is
FIFO-fair and cancellation-safe.

The pool is generic over its streams so its logic is tested without a GPU; the CUDA backend
fills it with non-blocking ``cuda.core`` streams.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, Protocol, TypeVar, runtime_checkable

import attrs

from asyncgraph._runtime import _loop
from asyncgraph._runtime._exceptions import DispatchError

__all__ = ("StreamLane", "StreamPool", "StreamPoolProtocol", "StreamPoolStatistics")

T = TypeVar("T")

LEAST_OUTSTANDING: Final = "least_outstanding"
ROUND_ROBIN: Final = "round_robin"


class StreamLane(Generic[T]):
    """One stream of the pool with its bookkeeping.

    Attributes:
        index: position in the pool.
        stream: the stream object (a ``cuda.core.Stream`` on CUDA).
        outstanding: dispatches placed on it and not completed.
        leased: whether it is leased out exclusively (for good when made *reserved*: a lane
            its owner keeps for work of its own, outside a pool's placement and leases).
    """

    __slots__ = ("index", "leased", "outstanding", "stream")

    def __init__(self, index: int, stream: T, reserved: bool = False) -> None:
        self.index = index
        self.stream = stream
        self.outstanding = 0
        self.leased = reserved

    def __repr__(self) -> str:
        state = "leased" if self.leased else f"{self.outstanding} outstanding"
        return f"<StreamLane {self.index} {state}>"

    def add(self, count: int) -> None:
        """*count* more dispatches placed on it (fewer, once completed: negative)."""
        self.outstanding += count


@attrs.frozen(kw_only=True)
class StreamPoolStatistics:
    """Counts of a stream pool, frozen at the moment of ``statistics()``."""

    streams: int
    leased: int
    waiting: int
    outstanding: tuple[int, ...]
    leases_granted: int
    placements: int


@runtime_checkable
class StreamPoolProtocol(Protocol[T]):
    """What a backend needs of a stream pool."""

    def pick(self) -> StreamLane[T]:
        """The lane a new dispatch goes to (its ``outstanding`` is not changed)."""
        ...

    async def lease(self) -> StreamLane[T]:
        """Wait for a lane and hand it out exclusively."""
        ...

    def lease_nowait(self) -> StreamLane[T]:
        """Hand out a lane at once, or raise ``LookupError`` when none may be leased now."""
        ...

    def give_back(self, lane: StreamLane[T]) -> None:
        """End a lease."""
        ...

    def statistics(self) -> StreamPoolStatistics:
        """Frozen counts."""
        ...


class StreamPool(Generic[T]):
    """The default stream pool.

    Args:
        streams: the streams, at least one.
        placement: ``"least_outstanding"`` (default) or ``"round_robin"`` (kept to measure
            the default against).
    """

    def __init__(self, streams: Sequence[T], placement: str = LEAST_OUTSTANDING) -> None:
        if not streams:
            raise DispatchError("StreamPool([]); a stream pool needs at least one stream")
        if placement not in (LEAST_OUTSTANDING, ROUND_ROBIN):
            raise DispatchError(
                f"StreamPool(placement={placement!r}); placement must be "
                f"{LEAST_OUTSTANDING!r} or {ROUND_ROBIN!r}"
            )
        self.lanes = [StreamLane(i, s) for i, s in enumerate(streams)]
        self._placement = placement
        self._next = 0
        self._max_leases = max(1, len(self.lanes) - 1)
        self._leased = 0
        self._waiters: deque[asyncio.Future[StreamLane[T]]] = deque()
        self._leases_granted = 0
        self.placements = 0  # dispatches placed so far (the CUDA fast path counts its own)
        self._placed_elsewhere: list[Callable[[], int]] = []

    def __repr__(self) -> str:
        return (
            f"<StreamPool streams={len(self.lanes)} leased={self._leased} "
            f"waiting={len(self._waiters)} outstanding={[lane.outstanding for lane in self.lanes]}>"
        )

    # -- placement -----------------------------------------------------------------------------

    def pick(self) -> StreamLane[T]:
        """The lane a new dispatch goes to."""
        lanes = self.lanes
        n = len(lanes)
        start = self._next
        self._next = (start + 1) % n
        self.placements += 1
        if self._placement == ROUND_ROBIN:
            for k in range(n):
                lane = lanes[(start + k) % n]
                if not lane.leased:
                    return lane
            return lanes[start]
        best: StreamLane[T] | None = None
        for k in range(n):
            lane = lanes[(start + k) % n]
            if lane.leased:
                continue
            if lane.outstanding == 0:
                return lane
            if best is None or lane.outstanding < best.outstanding:
                best = lane
        # Every lane leased (a pool of one stream): share the least busy one.
        return best if best is not None else min(lanes, key=lambda lane: lane.outstanding)

    # -- leases --------------------------------------------------------------------------------

    def _free_lane(self) -> StreamLane[T] | None:
        if self._leased >= self._max_leases:
            return None
        candidates = [lane for lane in self.lanes if not lane.leased]
        return min(candidates, key=lambda lane: lane.outstanding) if candidates else None

    def _grant(self, lane: StreamLane[T]) -> StreamLane[T]:
        lane.leased = True
        self._leased += 1
        self._leases_granted += 1
        return lane

    def lease_nowait(self) -> StreamLane[T]:
        """Hand out a lane at once.

        Raises:
            LookupError: every lane that may be leased is leased, or others wait before you.
        """
        lane = self._free_lane() if not self._waiters else None
        if lane is None:
            raise LookupError("no stream is free to lease")
        return self._grant(lane)

    async def lease(self) -> StreamLane[T]:
        """Wait (FIFO) for a lane and hand it out exclusively.

        A checkpoint even when a lane is free. Cancelled while waiting, it leaves the queue; a
        lane granted in the same moment is passed on, never lost.
        """
        await _loop.sleep(0)
        try:
            return self.lease_nowait()
        except LookupError:
            pass
        waiter: asyncio.Future[StreamLane[T]] = _loop.current_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except BaseException:  # cancelled (asyncio or trio)
            if waiter.done() and not waiter.cancelled():
                # Granted just as we were cancelled: hand it on.
                self.give_back(waiter.result())
            else:
                self._waiters.remove(waiter)
            raise

    def give_back(self, lane: StreamLane[T]) -> None:
        """End a lease; the longest waiter gets the lane."""
        if not lane.leased:
            raise DispatchError(
                f"{lane!r} is not leased; give each lease back once, to the pool that lent it"
            )
        lane.leased = False
        self._leased -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._grant(lane))
                return

    def statistics(self) -> StreamPoolStatistics:
        """Frozen counts."""
        return StreamPoolStatistics(
            streams=len(self.lanes),
            leased=self._leased,
            waiting=len(self._waiters),
            outstanding=tuple(lane.outstanding for lane in self.lanes),
            leases_granted=self._leases_granted,
            placements=self.placements + sum(count() for count in self._placed_elsewhere),
        )

    def count_placements(self, count: Callable[[], int]) -> None:
        """Add *count()* to the placements :meth:`statistics` reports: the dispatches a fast
        path placed itself (the CUDA fast path's, counted in C)."""
        self._placed_elsewhere.append(count)

    @property
    def streams(self) -> list[Any]:
        """The pool's streams, in lane order."""
        return [lane.stream for lane in self.lanes]
