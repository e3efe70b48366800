"""One CUDA device as the engine uses it: context, lanes, memory, pinned pool, events, reactor.

:class:`Device` sets everything up when the backend opens and tears it down when it closes.
Its collaborators (the small and streamed paths, resident storage, graphs) share it and read
its resources as plain attributes; none of them sets anything up or frees anything itself.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as drv

from asyncgraph._args._arguments import LaunchLimits
from asyncgraph._cuda.completion._foreign_work import WAIT_LANES, ForeignWork
from asyncgraph._cuda.completion._reactor import Reactor
from asyncgraph._cuda.core._choose import core
from asyncgraph._cuda.device._spares import Spares
from asyncgraph._cuda.driver._context import OwnContext
from asyncgraph._cuda.driver._driver import check
from asyncgraph._cuda.driver._events import EventPool
from asyncgraph._cuda.driver._priorities import class_streams, device_priorities
from asyncgraph._cuda.lanes._lanes import SCRATCH_BYTES, Lane
from asyncgraph._cuda.lanes._stream_order import chained_lane
from asyncgraph._runtime import _poison
from asyncgraph._runtime._exceptions import CudaError, DeviceFaultError
from asyncgraph._runtime._poison import POISONING_CODES
from asyncgraph._runtime._priority import NORMAL, PRIORITIES
from asyncgraph._runtime._telemetry import PoolCounters, Telemetry
from asyncgraph.pool import HostPool, PinnedPool, StreamLane, StreamOrderedDeviceMemory, StreamPool
from asyncgraph.pool._abandon import abandon

if TYPE_CHECKING:
    from asyncgraph._cuda.core._waiters import Joinable
    from asyncgraph._front._engine_protocols import Links, Sink
    from asyncgraph._front._options import BackendOptions

__all__ = ("Device", "join")

_POOL_RESERVE = 64 << 20


class Device:
    """The resources of one CUDA backend, shared by its collaborators.

    Attributes:
        device: the ``cuda.core`` Device; handle: its ``CUdevice``.
        context, ctx: its primary context, as a ``CUcontext`` and as the :class:`OwnContext`
            made current around the backend's driver calls.
        limits: the launch limits dispatches are checked against.
        arch: e.g. ``"sm_90"``; name: e.g. ``"NVIDIA H100 80GB HBM3"``.
        lanes: one :class:`Lane` per stream of ``stream_pool``, by index, then those of the
            other priority classes (``class_lanes``), which the fast path and leases keep off.
        class_lanes: the lanes of each priority class, by rank (``PRIORITIES`` order): the
            default class's are ``stream_pool``'s; each class's streams have its CUDA priority
            (``stream_priorities``, from ``_cuda/driver/_priorities``).
        wait_lanes: the lanes awaited foreign work completes on (``_foreign_work``), after them.
        foreign: waits for, and ordering with, other libraries' streams and events.
        watches: what the reactor watches, per lane (the core's ``Watches``).
        stream_pool: placement and leases of the lanes' streams.
        pinned: the pinned host pool; memory: stream-ordered device memory.
        events / timing_events: event pools (without timing, not blocking-sync / with timing).
        alloc_stream: a stream that holds allocations only.
        sink, telemetry, log: where the backend's jobs report, its counters and its bound
            logger (the engine's :class:`~asyncgraph._front._engine_protocols.Links`).
    """

    def __init__(self, ordinal: int, options: BackendOptions, links: Links) -> None:
        """Set up in the device's primary context, which this makes current on the calling
        thread (the engine gives the thread back the context it had: ``CudaEngine``)."""
        from cuda.core import Device as CoreDevice
        from cuda.core import StreamOptions

        _poison.check("no CUDA backend opens in this process any more", "open_backend")
        self.sink: Sink = links.sink
        self.telemetry: Telemetry = links.telemetry
        self.log: Any = links.log
        self.ordinal = ordinal
        self.label = f"cuda:{ordinal}"
        device = self.device = CoreDevice(ordinal)
        self.handle = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
        device.set_current()
        props = device.properties
        self.limits = LaunchLimits(
            max_threads_per_block=props.max_threads_per_block,
            max_block=(props.max_block_dim_x, props.max_block_dim_y, props.max_block_dim_z),
            max_grid=(props.max_grid_dim_x, props.max_grid_dim_y, props.max_grid_dim_z),
            max_shared_mem=props.max_shared_memory_per_block_optin,
        )
        major, minor = device.compute_capability
        self.arch = f"sm_{major}{minor}"
        self.name = device.name
        self.options = options
        self.context = drv.CUcontext(int(device.context.handle))
        self.ctx = OwnContext(self.context)
        stream_options = StreamOptions(nonblocking=True)
        self.stream_priorities = device_priorities()
        by_class = [
            StreamOptions(nonblocking=True, priority=priority)
            for priority in self.stream_priorities
        ]
        streams = [device.create_stream(options=by_class[NORMAL]) for _ in range(options.streams)]
        self.stream_pool: StreamPool[Any] = StreamPool(streams)
        self.alloc_stream = device.create_stream(options=stream_options)
        self.owns_memory = options.device_memory is None
        self.memory_resource = (
            _own_memory_pool(device) if options.device_memory is None else options.device_memory
        )
        self.memory = StreamOrderedDeviceMemory(
            self.memory_resource, trim=self.trim, release=self.release_buffer
        )
        self.abandoned = [0, 0]  # device buffers and bytes left to a failed context
        self.spares = Spares(self.release_buffer)  # freed resident storage, kept for reuse
        # Seconds a byte of copy_in takes, by route (``_peer_copies``), learned: when one ends.
        self.copy_pace: dict[str, float] = {}
        # A pool given in the options (a device group's, shared by its members) is its
        # giver's to close, as a memory resource given in the options is.
        self.owns_pinned = options.host_pool is None
        self.pinned: HostPool = (
            PinnedPool(options.pinned_pool_bytes) if self.owns_pinned else options.host_pool
        )
        flags = drv.CUevent_flags
        # Not blocking-sync: on an H100 such an event's completion reached cuEventQuery about
        # 2 us later than a plain event's, on every dispatch. Nothing sleeps in
        # cuEventSynchronize on them: waiters follow their events (``_waiters``).
        self.events = EventPool(flags.CU_EVENT_DISABLE_TIMING)
        self.timing_events = EventPool(flags.CU_EVENT_DEFAULT)
        self.failure: DeviceFaultError | None = None
        self.closed = False
        self.leases = 0  # stream leases (and captures) not yet ended
        self._no_leases: asyncio.Future[None] | None = None  # closing waits for the last
        self.reactor_: Reactor | None = None
        # One scratch buffer per lane, kept until close. Allocated now, before any kernel
        # runs: growing the memory pool later may wait for kernels in flight (a short dispatch
        # was seen waiting for a 300 ms kernel on another stream).
        self.lanes = [
            Lane(self, slot, self.memory.reserve(SCRATCH_BYTES, slot.stream))
            for slot in self.stream_pool.lanes
        ]
        self.class_lanes: list[list[Lane]] = []
        for rank in range(len(PRIORITIES)):
            if rank == NORMAL:
                self.class_lanes.append(self.lanes[: len(streams)])
                continue
            lanes = []
            for _ in range(class_streams(options.streams)):
                stream = device.create_stream(options=by_class[rank])
                slot = StreamLane(len(self.lanes), stream, reserved=True)  # off the fast path
                lanes.append(Lane(self, slot, self.memory.reserve(SCRATCH_BYTES, stream), rank))
                self.lanes.append(lanes[-1])
            self.class_lanes.append(lanes)
        # Streams of their own that awaited foreign work completes on (``_foreign_work``): the
        # reactor's lanes after the pool's, outside the pool, so no dispatch waits behind it.
        n = len(self.lanes)
        self.wait_lanes = [
            Lane(self, StreamLane(n + k, device.create_stream(options=stream_options)), None)
            for k in range(WAIT_LANES)
        ]
        self.foreign = ForeignWork(self)
        # The reactor's hot half, made now: the fast path and the reactor share it.
        self.watches = core.Watches(
            n + WAIT_LANES, self.events.idle, options.spin_window, self.ctx.address
        )
        self.granted: set[int] = set()  # devices given access to this device's memory pool
        self.routes: dict[int, str] = {}  # how each context copies from here (``_peer_copies``)
        # Failed with every other CUDA backend of the process by a sticky fault anywhere.
        _poison.join(self)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the backend belongs to now."""
        return self.sink.loop

    # -- the reactor ---------------------------------------------------------------------------

    @property
    def reactor(self) -> Reactor:
        """The completion reactor, made on first use (it needs the backend's loop)."""
        reactor = self.reactor_
        if reactor is None:
            reactor = self.reactor_ = Reactor(
                self.loop,
                self.context,
                self.watches,
                self.events,
                self.options.poll_window,
                self.on_fault,
                self.telemetry,
                self.options.spin_window,
            )
        return reactor

    def on_fault(self, error: CudaError) -> None:
        """The reactor saw a sticky error: the device failed, and with it (for every sticky
        error but a destroyed context) every CUDA backend of the process (``_poison``)."""
        if not isinstance(error, DeviceFaultError):
            return
        if error.code in POISONING_CODES:
            _poison.record(error, self.label)  # fails this device too
        self.fail(error)

    def fail(self, error: DeviceFaultError) -> None:
        """Fail now: the one place a device becomes failed, by its own sticky error or by the
        process's poison (``_poison``, from any thread). It takes no more work: the front
        refuses new work at the call, the fast path steps aside (the watches' fault) and work
        watched from now on fails at once; memory is abandoned from now on, not freed."""
        if self.failure is not None:
            return
        fault = _poison.process_fault()
        self.failure = (
            error if fault is None else fault.refusal(f"backend {self.label} failed", error.call)
        )
        self.watches.fail_with(self.failure)
        if not self.closed:
            self.log.error(
                "backend.failed",
                error=str(error),
                code=error.name,
                first_seen_on=fault.device if fault is not None else self.label,
            )

    def release_buffer(self, buffer: Any, stream: Any) -> None:
        """Free a ``cuda.core`` device buffer ordered on *stream*; once the device failed,
        abandon it instead (``_abandon``: the failed context keeps it, quietly)."""
        if self.failure is None:
            buffer.close(stream)
            return
        self.abandoned[0] += 1
        self.abandoned[1] += abandon(buffer)

    def check_healthy(self) -> None:
        """Raise the device fault, if the device failed."""
        if self.failure is not None:
            raise self.failure

    # -- leases ------------------------------------------------------------------------------------

    def lease_started(self) -> None:
        """A stream was leased (to a user, or to a capture)."""
        self.leases += 1

    def lease_ended(self) -> None:
        """A lease ended; the last one lets a waiting close go on."""
        self.leases -= 1
        waiter = self._no_leases
        if not self.leases and waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_leases(self) -> None:
        """Wait until no stream is leased (closing: foreign work may still be enqueued)."""
        if self.leases:
            self._no_leases = self.loop.create_future()
            await self._no_leases

    # -- placement -----------------------------------------------------------------------------

    def lane_for(self, job: Any) -> Lane:
        """The lane *job* launches on: that of the uses it depends on when they all run on one
        lane of its class (ordered by the stream alone), else its class's least busy lane."""
        lane = chained_lane(job.deps, job.priority) if job.deps else None
        return lane if lane is not None else self.placed(job.priority)

    def placed(self, rank: int) -> Lane:
        """The least busy lane of the class of *rank* (the default class's: ``stream_pool``'s
        placement, which keeps off leased lanes)."""
        if rank == NORMAL:
            return self.lanes[self.stream_pool.pick().index]
        return min(self.class_lanes[rank], key=lambda lane: lane.slot.outstanding)

    # -- memory --------------------------------------------------------------------------------

    def trim(self) -> None:
        """Free what caches hold before an allocation is retried (device out of memory)."""
        self.spares.release(self.alloc_stream)
        self.pinned.trim(0)
        pool = getattr(self.memory_resource, "handle", None)
        if pool is not None:
            drv.cuMemPoolTrimTo(drv.CUmemoryPool(int(pool)), 0)

    def grant_access(self, ordinal: int) -> bool:
        """Give device *ordinal* read-write access to this device's memory pool (once), so that
        its peer copies read and write this device's memory directly (``_peer_copies``); whether it
        has that access. Memory that comes from no pool is covered by context access alone."""
        if ordinal in self.granted:
            return True
        resource = self.memory_resource
        peers = getattr(resource, "peer_accessible_by", None)
        try:
            if peers is not None:
                peers.add(ordinal)
            elif getattr(resource, "handle", None) is not None:
                location = drv.CUmemLocation()
                location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
                location.id = ordinal
                access = drv.CUmemAccessDesc()
                access.location = location
                access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                pool = drv.CUmemoryPool(int(resource.handle))
                check(drv.cuMemPoolSetAccess(pool, [access], 1), "cuMemPoolSetAccess")
        except Exception as exc:
            fault = _poison.fault_from(exc, "cuMemPoolSetAccess")
            if fault is not None:
                raise fault from exc
            self.log.warning("backend.peer_access_refused", peer=f"cuda:{ordinal}", error=str(exc))
            return False
        self.granted.add(ordinal)
        return True

    def pool_counters(self) -> PoolCounters:
        """The pinned pool's counters."""
        stats = self.pinned.statistics()
        return PoolCounters(
            hits=stats.hits,
            misses=stats.misses,
            bytes_cached=stats.bytes_idle,
            bytes_in_use=stats.bytes_in_use,
        )

    # -- closing -------------------------------------------------------------------------------

    def close_reactor(self) -> list[Joinable]:
        """Stop the reactor's waiter threads; what to join."""
        return self.reactor_.close() if self.reactor_ is not None else []

    def synchronize(self, threads: list[Joinable]) -> None:
        """Wait for the whole device, then for *threads* (a worker thread of a later loop)."""
        pushed = self.ctx.enter()  # a thread of the loop's executor: left as it was
        try:
            drv.cuCtxSynchronize()  # a fault's error surfaces in the events' queries
        finally:
            self.ctx.leave(pushed)
        join(threads)

    def release_all(self, extra_streams: list[Any]) -> None:
        """Free everything (closing; nothing is in flight). Safe to call twice."""
        if self.closed:
            return
        if self.reactor_ is not None:
            self.reactor_.collect()  # events the joined waiters still held go back first
        if self.owns_pinned:
            let_go = getattr(self.pinned, "abandon", None)
            if self.failure is not None and let_go is not None:
                self.abandoned[1] += let_go()  # its frees would fail too
            else:
                self.pinned.close()
        self.events.close()
        self.timing_events.close()
        for lane in self.lanes:
            lane.free_scratch(self.memory)  # abandoned, after a fault
        self.spares.release(self.alloc_stream)  # abandoned, after a fault
        self.closed = True
        waits = [lane.stream for lane in self.wait_lanes]
        own = [lane.stream for lane in self.lanes]  # the pool's and the other classes'
        for stream in [*own, self.alloc_stream, *waits, *extra_streams]:
            stream.close()
        if self.owns_memory:
            if self.failure is None:
                self.memory_resource.close()
            else:
                abandon(self.memory_resource)  # its pool went with the context
        if self.failure is not None and any(self.abandoned):
            buffers, nbytes = self.abandoned
            self.log.warning(
                "backend.memory_abandoned",
                device_buffers=buffers,
                bytes=nbytes,
                reason="the device failed: its device memory goes with the context, and its "
                "pinned blocks are not freed either",
            )


def join(threads: list[Joinable], timeout: float | None = None) -> int:
    """Join every one of *threads* (waiter threads, or the native ones), for at most *timeout*
    seconds in all if given; how many are still alive (waiting in the driver on work that does
    not finish: they end with it, or with the process)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread in threads:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return sum(thread.is_alive() for thread in threads)


def _own_memory_pool(device: Any) -> Any:
    """A stream-ordered memory pool owned by this backend, set up for many streams.

    - Cross-stream reuse with hidden dependencies is off: with it, an allocation on one
      stream may reuse memory freed on another and silently wait for that stream's work
      (seen on an H100: short dispatches waited 200 ms behind a long kernel elsewhere).
    - The release threshold is unlimited: by default a pool hands its free memory back at
      every synchronisation (the reactor's waiter threads synchronise), and re-mapping it
      stalls the loop for milliseconds. On out of memory the backend trims it.
    """
    from cuda.core import DeviceMemoryResource, DeviceMemoryResourceOptions, StreamOptions

    resource = DeviceMemoryResource(device, DeviceMemoryResourceOptions())
    pool = drv.CUmemoryPool(int(resource.handle))
    attr = drv.CUmemPool_attribute
    check(
        drv.cuMemPoolSetAttribute(pool, attr.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0),
        "cuMemPoolSetAttribute",
    )
    check(
        drv.cuMemPoolSetAttribute(
            pool, attr.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, drv.cuuint64_t(2**64 - 1)
        ),
        "cuMemPoolSetAttribute",
    )
    # Reserve some memory now: growing a fresh pool maps memory (15 ms for the first
    # allocation, measured), which would otherwise happen inside early dispatches.
    stream = device.create_stream(options=StreamOptions(nonblocking=True))
    resource.allocate(_POOL_RESERVE, stream=stream).close(stream)
    stream.sync()
    stream.close()
    return resource
