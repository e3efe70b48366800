"""A CUDA dispatch's plan: its job record, staging layout and dependencies.

One dispatch makes at most one pinned block and one device allocation, laid out as
``[inputs | in-outs | outputs]`` (each 256-byte aligned), so it costs one host-to-device copy
(inputs and in-outs), one memset (outputs), the launch, one device-to-host copy (in-outs and
outputs), a stream-ordered free and an event record — whatever the number of arguments. A
dispatch with no transfers (resident buffers and scalars only) is the launch and the event.
Where the outputs are small (at most ``_bound_args.ZEROS_BY_COPY`` bytes) and there are inputs to
upload, the outputs are zeroed in the pinned staging instead and go up in the same copy as the
inputs (``_bound_args.upload_bytes``): one driver call less on the loop and one operation less on
the stream.

The layout itself is the call's (``_bound_args.lay_out``, computed when it was bound).
Dispatches whose arrays total more than the pinned cap (``pinned_pool_bytes``, at least
``STREAM_MIN``) are *streamed* (``_streamed``): their arrays go up and down in chunks.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncgraph._jobs._scheduler import Job, JobState
from asyncgraph._runtime._finished import Download
from asyncgraph.pool._pinned import pinned_memory_of

if TYPE_CHECKING:
    from asyncgraph._args._bound_args import BoundCall
    from asyncgraph.pool import HostPool, PinnedBlock

__all__ = (
    "BIG_COPY",
    "STREAM_MIN",
    "CudaJob",
    "copy_into",
    "dep_event",
    "plan",
)

# Staging copies of at least this many bytes run off the event loop, split over threads.
BIG_COPY = 4 << 20
_CHUNK = 4 << 20
# Dispatches moving more than max(pinned cap, this) bytes stream them in chunks.
STREAM_MIN = 64 << 20
_copiers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="asyncgraph-copy")


class CudaJob(Job):
    """A dispatch on the CUDA backend, with its staging and events."""

    __slots__ = (
        "block",
        "choice",
        "device_buffer",
        "direct",
        "end_event",
        "event",
        "fences",
        "gpu_done",
        "in_end",
        "lane",
        "out_block",
        "replay",
        "stage_hi",
        "stage_lo",
        "staged",
        "start_event",
        "started",
        "streamed",
        "total",
        "up_end",
    )

    def __init__(self, call: BoundCall, timing: bool) -> None:
        super().__init__(call, timing)
        self.block: PinnedBlock | None = None
        self.device_buffer: Any = None
        self.event: Any = None
        self.start_event: Any = None
        self.end_event: Any = None
        self.lane: Any = None  # the Lane it runs on, once launched
        # Its staging layout's bounds (the call's; 0 for a replay, whose graph stages).
        self.in_end = 0  # end of the inputs (start of the region copied back)
        self.up_end = 0  # end of the region copied up (inputs and in-outs)
        self.total = 0
        self.staged = False  # inputs already copied into the pinned block
        # Inputs that already lie in this backend's pinned memory go up straight from there:
        # (host pointer, device offset, bytes) each, or None when they are staged.
        self.direct: list[tuple[int, int, int]] | None = None
        # The device range [stage_lo, stage_hi) the staging block mirrors.
        self.stage_lo = 0
        self.stage_hi = 0
        self.out_block: PinnedBlock | None = None  # pinned memory the results will own
        self.gpu_done = False  # its event completed (its outputs may still be copied out)
        self.streamed = False  # its arrays go up and down in chunks (``_streamed``)
        self.replay: Any = None  # the graph it replays (CachedGraph / CapturedGraph), if any
        # What its stream waits for before it runs (``dispatch(after=)``): (event, ours) pairs.
        self.fences: list[tuple[Any, bool]] | None = None
        # A dispatch graph="auto" measures: the choice told its cost when it completes, counted
        # from ``started`` (``perf_counter()`` at its ``dispatch()`` call).
        self.choice: Any = None
        self.started = 0.0

    def measure(self, choice: Any, started: float) -> None:
        """Tell *choice* (``graph="auto"``'s) this job's cost from *started* (``perf_counter()``
        at its ``dispatch()`` call) when it completes (``SmallPath``)."""
        self.choice = choice
        self.started = started


def dep_event(dep: Any) -> Any:
    """What a use that depends on *dep* must wait for.

    Returns the event to wait on, ``None`` when *dep* already finished (nothing to wait for), or
    ``False`` when *dep* has no event yet (not launched: wait until it is).
    """
    if type(dep) is Download:
        if dep.finished.is_set():
            return None
    elif dep.state is JobState.DONE or dep.gpu_done:  # a job: a CudaJob, or the fast path's
        return None
    event = dep.event
    return event if event is not None else False


def copy_into(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
    """Copy bytes *src* into *dst* (equal-length uint8 arrays), chunks in parallel threads.

    numpy releases the GIL while it copies, so the chunks run truly in parallel.
    """
    n = dst.size
    if n < 2 * _CHUNK:
        dst[:] = src
        return
    bounds = [(start, min(start + _CHUNK, n)) for start in range(0, n, _CHUNK)]

    def part(bound: tuple[int, int]) -> None:
        lo, hi = bound
        dst[lo:hi] = src[lo:hi]

    list(_copiers.map(part, bounds))


def plan(call: BoundCall, timing: bool, pinned: HostPool, stream_above: int) -> CudaJob:
    """The job for *call*: its staging bounds, whether it streams, and which inputs go up from
    pinned memory directly."""
    job = CudaJob(call, timing)
    if not call.total:
        return job  # scalars, resident buffers and device arrays only: nothing to stage
    job.in_end, job.up_end, job.total = call.in_end, call.up_end, call.total
    if call.total > stream_above:
        job.streamed = True
        return job
    if call.bytes_in:
        job.direct = _direct_inputs(call, pinned)
    job.stage_lo = job.in_end if job.direct is not None else 0
    job.stage_hi = call.total
    return job


def _direct_inputs(call: BoundCall, pinned: HostPool) -> list[tuple[int, int, int]] | None:
    """Where each input lies in this backend's pinned memory, or ``None`` if one does not."""
    direct = []
    for arg in call.args:
        if arg.uploads:
            value = arg.value
            memory = pinned_memory_of(value)
            if memory is None or memory.owner is not pinned:
                return None
            direct.append((value.__array_interface__["data"][0], arg.offset, value.nbytes))
    return direct
