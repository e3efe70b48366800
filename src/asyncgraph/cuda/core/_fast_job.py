"""The Python fast path's records: its job (which is also its watch) and the lanes' rings.

The compiled core has the same in C (``_core_compiled``); :class:`FastJob` has the attributes the
rest of the backend reads of any job, so general-path code treats the two paths' jobs alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from asyncgraph.jobs._scheduler import JobState

from ._fast_plan import MAX_PLANS, RING_BYTES, describes

if TYPE_CHECKING:
    from asyncgraph.args._bound_args import BoundCall
    from asyncgraph.buffers._resident import ResidentBuffer
    from asyncgraph.jobs._pending import PendingDispatch
    from asyncgraph.pool import PinnedBlock, StreamLane

    from ._fast_plan import FastPlan

__all__ = ("FastJob", "FastLane", "KnownKernel", "Ring")

_QUEUED = JobState.QUEUED


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

    def __init__(self, plan: FastPlan, args: tuple[object, ...], lane: FastLane, t: float) -> None:
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


class KnownKernel:
    """What the fast path knows of one kernel: its launcher once loaded, its plans (most
    recently learned first), and whether ``graph="auto"`` steered one of them."""

    __slots__ = ("launcher", "plans", "steered")

    def __init__(self) -> None:
        self.launcher: Any = None
        self.plans: list[FastPlan] = []
        self.steered = False

    @staticmethod
    def of(kernels: dict[Any, KnownKernel], kernel: Any) -> KnownKernel:
        """What *kernels* knows of *kernel*, made empty if nothing yet."""
        known = kernels.get(kernel)
        if known is None:
            known = kernels[kernel] = KnownKernel()
        return known

    def learn(self, plan: FastPlan) -> None:
        """Launch calls of *plan* too (a few plans are kept)."""
        self.plans.insert(0, plan)
        del self.plans[MAX_PLANS:]

    def steer(self, call: BoundCall, choice: Any) -> None:
        """Set *choice* as ``auto`` of the plans that launch *call*'s signature (at once done
        if one has it already)."""
        if any(plan.auto is choice for plan in self.plans):
            return
        for plan in self.plans:
            if describes(plan, call):
                plan.auto = choice
                self.steered = True
