"""The boundary between the front (:class:`~asyncgraph.Backend`) and an implementation.

An engine (the CUDA engine in ``asyncgraph.cuda``, the host engine in ``host._host_backend``) does
the work: it compiles, stages, launches and collects dispatches, and makes, reads and frees resident
storage. The front does everything a user touches: validation, the scheduler, pending results,
telemetry, resident buffers, closing. They meet here, in small protocols, one per caller:

- what the front asks of an engine: :class:`Runs` (the dispatcher, and the scheduler's
  predicates), :class:`Jobs` (``dispatch()`` and ``compile()``), :class:`Allocates`
  (``empty()``, ``pinned_empty()``, the resident store, telemetry), :class:`Stores` (transfers),
  :class:`Exports` (DLPack), :class:`Streams` (leases, graphs, foreign work), :class:`Closes`
  (the lifecycle) and :class:`Describes` (what the front reads once, when it is made);
  :class:`Engine` names them together, for the one place that makes an engine;
- what an engine reports back, and is made with (:class:`Links`): :class:`Sink` (the
  scheduler's events, implemented by the front's dispatcher) and :class:`GraphFront` (the
  front's validation and submission, which graphs and captures use).

An engine's fast path, and what it may use of the front, are in ``_fast_front``.

Neither side reaches into the other's private members.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np

if TYPE_CHECKING:
    from asyncgraph._exceptions import DeviceFaultError
    from asyncgraph.args._arguments import LaunchLimits
    from asyncgraph.args._bound_args import BoundCall
    from asyncgraph.args._kernel import Kernel
    from asyncgraph.buffers._resident import ResidentBuffer, Use
    from asyncgraph.jobs._pending import PendingDispatch
    from asyncgraph.jobs._scheduler import Job
    from asyncgraph.runtime._telemetry import PoolCounters, Telemetry

    from ._lease import StreamLease

__all__ = (
    "Allocates",
    "Closes",
    "Describes",
    "Engine",
    "Exports",
    "GraphFront",
    "Jobs",
    "Links",
    "Runs",
    "Sink",
    "Stores",
    "Streams",
)


class Sink(Protocol):
    """What an engine reports about the jobs it runs (on the loop's thread)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the backend belongs to."""
        ...

    def compiled(self, kernel: Kernel, error: Callable[[Job], BaseException] | None) -> None:
        """*kernel* is loaded, or failed (*error* makes one error per waiting job)."""
        ...

    def staged(self, job: Job, error: BaseException | None) -> None:
        """*job*'s inputs are staged, or staging failed (what it took is released)."""
        ...

    def collecting(self, job: Job) -> None:
        """The device finished *job*; its results are being copied out."""
        ...

    def done(
        self, job: Job, outcome: tuple[Any, ...] | BaseException, device_time: float | None
    ) -> None:
        """*job* finished and everything it held is released."""
        ...

    def poke(self) -> None:
        """A use that parked jobs may depend on reached the device, or finished."""
        ...


@attrs.frozen(kw_only=True)
class GraphFront:
    """What graphs and captures use of the front: its validation and its submission.

    Attributes:
        bind_call: ``bind_call(kernel, args, grid, block, shared_mem)`` validates arguments
            as ``dispatch()`` does, into a ``BoundCall`` (raises ``DispatchError`` as
            ``dispatch()``, ``BackendClosedError`` once the backend is closed).
        run_prepared: ``run_prepared(job)`` numbers and schedules a job made outside
            ``dispatch()`` (a graph replay); the awaitable gives its results. On failure to
            schedule, the job is released.
    """

    bind_call: Callable[[Kernel, tuple[object, ...], object, object, object], BoundCall]
    run_prepared: Callable[[Job], Awaitable[Any]]


@attrs.frozen(kw_only=True)
class Links:
    """What an engine is made with: where it reports, and what it counts into.

    Attributes:
        sink: the scheduler's events (the front's dispatcher).
        graphs: the front's validation and submission, for graphs and captures.
        telemetry: the backend's counters.
        log: the backend's bound logger.
    """

    sink: Sink
    graphs: GraphFront
    telemetry: Telemetry
    log: Any


class Runs(Protocol):
    """What the dispatcher runs jobs with, and the scheduler's predicates (``Scheduler``'s
    ``Runner``), on the loop's thread."""

    def needs_compile(self, job: Job) -> bool:
        """Whether *job*'s kernel must compile before it launches."""
        ...

    def needs_staging(self, job: Job) -> bool:
        """Whether *job*'s inputs are copied into pinned memory off the loop first."""
        ...

    def is_ready(self, job: Job) -> bool:
        """Whether every use *job* depends on can be ordered after now."""
        ...

    def start_compile(self, job: Job) -> None:
        """Compile *job*'s kernel in the background; report :meth:`Sink.compiled`."""
        ...

    def stage(self, job: Job) -> None:
        """Stage *job*'s inputs off the loop; report :meth:`Sink.staged`."""
        ...

    def launch(self, job: Job) -> None:
        """Launch *job*; report :meth:`Sink.done`. Raises (having released) if it cannot."""
        ...

    def release(self, job: Job) -> None:
        """Give back what *job* holds; it failed before it ran (idempotent)."""
        ...


class Stores(Protocol):
    """Resident storage an engine makes, moves and frees (``Transfers``, ``ResidentStore``)."""

    async def upload_storage(self, array: np.ndarray[Any, Any]) -> Any:
        """Resident storage holding a copy of *array*."""
        ...

    async def download_storage(
        self,
        buffer: ResidentBuffer,
        use: Use,
        deps: list[Use],
        out: np.ndarray[Any, Any] | None,
    ) -> np.ndarray[Any, Any]:
        """Copy *buffer* out (as *use*, into *out* if given) after the uses in *deps*."""
        ...

    def copies_from(self, other: Stores) -> bool:
        """Whether :meth:`copy_in` copies resident storage of *other* (else the front copies
        through a host array)."""
        ...

    def copy_route(self, source: Stores) -> str:
        """How :meth:`copy_in` moves storage of *source* (which this :meth:`copies_from`)
        here: ``"device"``, ``"peer"``, ``"staged"`` or ``"host"`` (``Backend.copy_route``);
        sets up access to *source*'s memory the first time."""
        ...

    def copy_in(
        self, buffer: ResidentBuffer, use: Use, deps: list[Use], source: Stores
    ) -> Awaitable[Any]:
        """New storage here holding a copy of *buffer* (storage of *source*, which this
        :meth:`copies_from`), read as *use* after the uses in *deps*: an awaitable of it (a
        coroutine, or a future of a copy already enqueued)."""
        ...

    def free_storage(self, storage: Any) -> None:
        """Free resident storage (every use completed)."""
        ...


class Exports(Protocol):
    """What DLPack and ``__cuda_array_interface__`` ask of an engine (``_exporter``)."""

    def storage_pointer(self, storage: Any) -> int:
        """The address of resident storage."""
        ...

    def export_device(self) -> tuple[int, int]:
        """DLPack device of resident buffers."""
        ...

    def export_wait(self, buffer: ResidentBuffer, stream: int | None) -> None:
        """DLPack: order the consumer's *stream* after the uses of *buffer* in flight."""
        ...

    def export_stream(self, buffer: ResidentBuffer) -> int | None:
        """``__cuda_array_interface__``: the stream of the write in flight, or ``None``."""
        ...


class Streams(Protocol):
    """Streams and graphs: leases, records, captures and foreign work (``Backend.record``,
    ``capture``, ``stream``, ``wait``, ``order``)."""

    def stream(self) -> AbstractAsyncContextManager[StreamLease]:
        """Lease a stream for foreign work (raises ``UnsupportedError`` without streams)."""
        ...

    async def record(
        self,
        kernel: Kernel,
        args: tuple[object, ...],
        grid: object,
        block: object,
        shared_mem: object,
    ) -> Any:
        """Record one dispatch as a graph (raises ``UnsupportedError`` without graphs)."""
        ...

    def capture(self, mode: object, into: object) -> AbstractAsyncContextManager[Any]:
        """Capture dispatches into a new graph, or into *into* (raises ``UnsupportedError``
        without graphs)."""
        ...

    def wait_foreign(self, work: object) -> Awaitable[None]:
        """An awaitable for the work on another library's stream or event so far."""
        ...

    def order_foreign(self, stream: object, job: Job | None) -> bool:
        """Order *stream* after *job* on the device; ``False`` if *job* has not launched."""
        ...


class Closes(Protocol):
    """How an engine ends (``Lifecycle``)."""

    async def settle_after(self, ended: asyncio.AbstractEventLoop, jobs: list[Job]) -> None:
        """The backend's loop ended with *jobs* in flight: settle what it left (new loop)."""
        ...

    async def shutdown(self) -> None:
        """Release everything; nothing is in flight. Safe to call again if interrupted."""
        ...

    def shutdown_now(self) -> None:
        """Release everything without a loop; nothing was ever used."""
        ...

    def release_unclosed(self) -> None:
        """Best-effort release of a backend dropped without closing."""
        ...


class Jobs(Protocol):
    """What the front's ``dispatch()`` and ``compile()`` ask of an engine."""

    @property
    def failure(self) -> DeviceFaultError | None:
        """The device fault that failed the engine, or ``None``."""
        ...

    def check_kernel(self, kernel: Kernel) -> None:
        """Raise if this engine cannot run *kernel* at all."""
        ...

    def prepare(self, call: BoundCall, timing: bool) -> Job:
        """Make the job for *call*, checking the engine's own rules (before anything starts)."""
        ...

    def graph_job(
        self, call: BoundCall, always: bool, started: float, inline: bool
    ) -> Job | PendingDispatch | None:
        """The job of *call* under ``dispatch(graph="always" | "auto")``: a replay of a
        recorded graph, an eager job ``"auto"`` measures, or ``None`` (a plain dispatch).
        Where *inline* (nothing to fence it after), a replay may be launched at once: its
        pending result is returned, and the dispatch is done. *started* is ``perf_counter()``
        at the ``dispatch()`` call."""
        ...

    def fence(self, job: Job, after: object) -> None:
        """Have *job* run after the work on *after* (streams or events) so far."""
        ...

    def release(self, job: Job) -> None:
        """Give back what *job* holds; it failed before it ran (idempotent)."""
        ...

    async def compile(self, kernel: Kernel) -> None:
        """Compile and load *kernel* now (``backend.compile``)."""
        ...


class Allocates(Protocol):
    """Memory the front makes and frees through an engine (``empty``, ``pinned_empty``, the
    resident store), and the pinned pool's counters (telemetry)."""

    def alloc_storage(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """Uninitialised resident storage."""
        ...

    def free_storage(self, storage: Any) -> None:
        """Free resident storage (every use completed)."""
        ...

    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """An array for ``pinned_empty`` (page-locked where the engine has a pinned pool)."""
        ...

    def pool_counters(self) -> PoolCounters:
        """The pinned pool's counters for the telemetry snapshot."""
        ...


class Describes(Protocol):
    """What the front reads of an engine once, when it is made (its name, its plans)."""

    kind: str  # "cuda", "host"
    limits: LaunchLimits
    takes_device_arrays: bool  # whether dispatch() takes CuPy / PyTorch device arrays


class Engine(Describes, Jobs, Allocates, Runs, Stores, Exports, Streams, Closes, Protocol):
    """Every protocol an engine implements, named together for the one place that makes an
    engine (``Backend``), which hands each collaborator its own. Every method runs on the
    loop's thread."""
