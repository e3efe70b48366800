"""The Python fast path's records: its job (which is also its watch) and the lanes' rings.

The compiled core has the same in C (``_core_compiled``); :class:`FastJob` has the attributes the
rest of the backend reads of any job, so general-path code treats the two paths' jobs alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from asyncgraph.jobs._scheduler import JobState

if TYPE_CHECKING:
    from asyncgraph.args._bound_args import BoundCall
    from asyncgraph.buffers._resident import ResidentBuffer
    from asyncgraph.jobs._pending import PendingDispatch
    from asyncgraph.pool import PinnedBlock, StreamLane


__all__ = ("RING_BYTES", "FastJob", "FastLane", "JobPlan", "Ring")

_QUEUED = JobState.QUEUED
RING_BYTES = 2 << 20  # each lane's pinned staging ring


class JobPlan(Protocol):
    """What a job reads of its plan (``_fast_plan.FastPlan``, which imports this module)."""

    expected: float  # the plan's device time as learned, seconds (0.0: not yet)

    @property
    def template(self) -> BoundCall:
        """The plan's bound call without arguments (the job's ``call``)."""

    @property
    def returned(self) -> tuple[Any, ...]:
        """Per result ``(kind, index, offset, nbytes, dtype, shape)``."""


class FastLane(Protocol):
    """What the fast path uses of a lane (``_lanes.Lane``)."""

    index: int
    handle: Any
    scratch_ptr: int
    slot: StreamLane[Any]

    def settle(self) -> bool:
        """Wait until the work enqueued on the stream so far is done; whether it is."""
        ...


class FastJob:
    """A dispatch the fast path launched: its job in the scheduler, and its own watch in the
    reactor (``callback`` is ``None``: :meth:`FastPath.complete` completes it).

    It has what the rest of the backend reads of a job (``state``, ``event``, ``lane``,
    ``gpu_done``, ``pending``, ``call``, ``buffers``...), so a later dispatch on the general path
    orders itself after it like after any other.
    """

    __slots__ = (
        "args",
        "buffers",
        "call",
        "choice",
        "device_time",
        "event",
        "expect",
        "failure",
        "finished",
        "gpu_done",
        "held",
        "id",
        "lane",
        "outcome",
        "pending",
        "plan",
        "ring_end",
        "ring_start",
        "seen",
        "seq",
        "state",
        "t_dispatch",
    )

    # What every job has, the same for each of these.
    callback = None
    deps: tuple[Any, ...] = ()
    nvtx_range = None
    timing = False
    streamed = False
    replay = None
    device_buffer = None
    t_submit = 0.0

    def __init__(self, plan: JobPlan, args: tuple[object, ...], lane: FastLane, t: float) -> None:
        self.plan = plan
        self.call = plan.template
        self.args = args
        self.lane = lane
        self.t_dispatch = t
        self.state = _QUEUED  # until the scheduler's door admits it (FastDoor.admit_launched)
        self.buffers: list[ResidentBuffer] = []
        self.event: Any = None
        self.seq = 0
        self.expect = 0.0  # when its work is expected to end (perf_counter()); 0.0: unknown
        self.seen = 0.0  # when a waiter thread saw it complete (perf_counter()); 0.0: none
        self.held = False
        self.finished = False
        self.gpu_done = False
        self.failure: BaseException | None = None
        self.outcome: Any = None
        self.device_time: float | None = None
        self.ring_start = 0
        self.ring_end = 0
        self.id = 0
        self.pending: PendingDispatch = None  # type: ignore[assignment]  # set at once
        self.choice: Any = None  # graph="auto"'s choice, told its cost when it completes

    def __repr__(self) -> str:
        return f"<FastJob #{self.id} {self.call.kernel.name!r} {self.state.value}>"


class Ring:
    """A lane's pinned staging ring: dispatches take consecutive regions and give them back in
    the order they took them (work on one stream completes in order).

    ``head`` and ``tail`` count bytes since the ring was made; a region never wraps, so one that
    would is moved to the start of the next lap. It keeps what the compiled core keeps per lane
    (``LaneC``); the results are read out of it by ``FastPath._results``, in both cores.
    """

    __slots__ = ("block", "head", "ptr", "size", "tail", "view")

    def __init__(self, block: PinnedBlock) -> None:
        self.block = block
        self.ptr = block.ptr
        self.size = RING_BYTES
        self.view = block.array
        self.head = 0
        self.tail = 0
