"""A CUDA dispatch's plan: its job record, staging layout and dependencies.

One dispatch makes at most one pinned block and one device allocation, laid out as
``[inputs | in-outs | outputs]`` (each 256-byte aligned), so it costs one host-to-device copy
(inputs and in-outs), one memset (outputs), the launch, one device-to-host copy (in-outs and
outputs), a stream-ordered free and an event record — whatever the number of arguments. A
dispatch with no transfers (resident buffers and scalars only) is the launch and the event.

Dispatches whose arrays total more than the pinned cap (``pinned_pool_bytes``, at least
``STREAM_MIN``) are *streamed* (``_streamed``): their arrays go up and down in chunks.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .._args import DEVICE, IN, INOUT, OUT, BoundCall
from .._checks import check_pointer_dtype
from .._exceptions import ArgumentTypeError, DispatchError
from .._scheduler import Job, JobState
from ..pool import HostPool, PinnedBlock
from ..pool._pinned import pinned_memory_of

__all__ = (
    "BIG_COPY",
    "STREAM_MIN",
    "CudaJob",
    "as_bytes",
    "copy_into",
    "dep_event",
    "layout",
    "plan",
)

_ALIGN = 256
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
        "device_buffer",
        "direct",
        "end_event",
        "event",
        "foreign",
        "gpu_done",
        "in_end",
        "lane",
        "offsets",
        "out_block",
        "replay",
        "stage_hi",
        "stage_lo",
        "staged",
        "start_event",
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
        self.offsets: list[int] = []
        self.in_end = 0  # end of the inputs (start of the region copied back)
        self.up_end = 0  # end of the region copied up (inputs and in-outs)
        self.total = 0
        self.foreign: list[tuple[int, int | None]] = []  # (pointer, producer stream) per DEVICE
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


def dep_event(dep: Any) -> Any:
    """What a use that depends on *dep* must wait for.

    Returns the event to wait on, ``None`` when *dep* already finished (nothing to wait for), or
    ``False`` when *dep* has no event yet (not launched: wait until it is).
    """
    if isinstance(dep, Job):
        if dep.state is JobState.DONE or getattr(dep, "gpu_done", False):
            return None
        event = getattr(dep, "event", None)
        return event if event is not None else False
    finished = getattr(dep, "finished", None)
    if finished is not None and finished.is_set():
        return None
    event = getattr(dep, "event", None)
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


def as_bytes(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """*array*'s bytes as a flat uint8 view."""
    return array.reshape(-1).view(np.uint8)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def layout(args: list[tuple[int, Any, Any]]) -> tuple[list[int], tuple[int, int, int]]:
    """Where each staged argument lies in ``[inputs | in-outs | outputs]`` (256-byte aligned,
    -1 for the others), and the bounds: end of the inputs, end of the region copied up, total."""
    offsets = [-1] * len(args)
    pos = in_end = up_end = 0
    for want in (IN, INOUT, OUT):
        if want == INOUT:
            in_end = pos
        elif want == OUT:
            up_end = pos
        for i, (kind, value, _param) in enumerate(args):
            if kind == want:
                offsets[i] = pos
                pos += _aligned(value.nbytes)
    return offsets, (in_end, up_end, pos)


def plan(call: BoundCall, timing: bool, pinned: HostPool, stream_above: int) -> CudaJob:
    """The job for *call*: its layout, whether it streams, which inputs go up from pinned
    memory directly, and its foreign device arrays (checked here, before anything starts)."""
    job = CudaJob(call, timing)
    args = call.args
    if not call.bytes_in and not call.bytes_out:
        # Scalars and resident buffers only: nothing to stage.
        if any(kind == DEVICE for kind, _value, _param in args):
            _plan_foreign(job)
        return job
    job.offsets, (job.in_end, job.up_end, pos) = layout(args)
    job.total = pos
    if pos > stream_above:
        job.streamed = True
        _plan_foreign(job)
        return job
    if call.bytes_in:
        job.direct = _direct_inputs(call, job.offsets, pinned)
    job.stage_lo = job.in_end if job.direct is not None else 0
    job.stage_hi = pos
    _plan_foreign(job)
    return job


def _direct_inputs(
    call: BoundCall, offsets: list[int], pinned: HostPool
) -> list[tuple[int, int, int]] | None:
    """Where each input lies in this backend's pinned memory, or ``None`` if one does not."""
    direct = []
    for i, (kind, value, _param) in enumerate(call.args):
        if kind in (IN, INOUT):
            memory = pinned_memory_of(value)
            if memory is None or memory.owner is not pinned:
                return None
            direct.append((value.__array_interface__["data"][0], offsets[i], value.nbytes))
    return direct


def _plan_foreign(job: CudaJob) -> None:
    for i, (kind, value, param) in enumerate(job.call.args):
        if kind == DEVICE:
            where = f"args[{i}] of {job.call.kernel.name!r}"
            job.foreign.append(_foreign_array(value, where, param))


def _foreign_array(value: Any, where: str, param: Any) -> tuple[int, int | None]:
    """Pointer and producer stream of a device array with ``__cuda_array_interface__``."""
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is None:
        raise ArgumentTypeError(
            f"{where} is a device array without __cuda_array_interface__; pass a CuPy array or "
            "a PyTorch CUDA tensor"
        )
    try:
        shape = tuple(int(d) for d in cai["shape"])
        dtype = np.dtype(cai["typestr"])
        data = cai["data"]
        strides = cai.get("strides")
        pointer = int(data[0])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ArgumentTypeError(
            f"{where} has a malformed __cuda_array_interface__ ({type(exc).__name__}: {exc}); "
            "it needs 'shape', 'typestr' and 'data' (version 3)"
        ) from None
    if strides is not None:
        expected = []
        step = dtype.itemsize
        for dim in reversed(shape):
            expected.append(step)
            step *= dim
        if tuple(reversed(expected)) != tuple(strides) and int(np.prod(shape)) > 1:
            raise DispatchError(
                f"{where} is a device array that is not C-contiguous; make it contiguous "
                "first (cupy.ascontiguousarray(x) or x.contiguous())"
            )
    if int(np.prod(shape, dtype=np.int64)) == 0:
        raise DispatchError(f"{where} is an empty device array; skip the dispatch")
    check_pointer_dtype(dtype, where, param)
    stream = cai.get("stream")
    return pointer, (int(stream) if stream else None)
