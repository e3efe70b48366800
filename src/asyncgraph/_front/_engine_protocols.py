"""The seam between the front (:class:`~asyncgraph.Backend`) and an engine, whole in one module.

An engine (the CUDA engine in ``asyncgraph._cuda``, the host engine in ``_host._host_backend``) does
the work: it compiles, stages, launches and collects dispatches, and makes, reads and frees resident
storage. The front does everything a user touches: validation, the scheduler, pending results,
telemetry, resident buffers, closing. They meet through the five types of this module, and no
other (``docs/architecture.md``, "The seam"; ``tests/test_engine_seam.py`` counts them):

- :class:`Engine`, the one contract an engine implements, generic in the job type it runs
  (``CudaEngine`` is an ``Engine[CudaJob]``). Its methods come in groups, one per collaborator of
  the front: each collaborator holds the engine and uses its group alone;
- :class:`Sink`, what an engine reports about its jobs (the front's dispatcher);
- :class:`Links`, what an engine is made with: its sink, the front's validation and submission
  (for graphs and captures), the telemetry and the logger;
- :class:`FastFront`, what an engine's fast path may use of the front, and :class:`FastDispatch`,
  the fast path an engine hands back (``Engine.fast_path``).

Neither side reaches into the other's private members. The fast path enters the front through
named doors, each its owner's operation with its invariant stated there: the scheduler's
:class:`~asyncgraph._jobs._fast_door.FastDoor` (``admit_launched``, ``complete_launched``), the
resident store's ``is_live``, ``track_uses``, ``untrack`` and what they read, and the pending
result's ``new_pending`` and ``set_outcome``. It reads the lifecycle, and hands a job the general
way to the dispatcher's ``done``; it changes nothing else of the front. The compiled core calls
those doors through C: their modules are compiled from their Python source where the core is
built.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs
import numpy as np

if TYPE_CHECKING:
    from asyncgraph._args._arguments import LaunchLimits
    from asyncgraph._args._bound_args import BoundCall
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._args._plan_cache import Plan
    from asyncgraph._buffers._resident import ResidentBuffer, ResidentStore, Use
    from asyncgraph._jobs._fast_door import FastDoor
    from asyncgraph._jobs._pending import PendingDispatch
    from asyncgraph._jobs._scheduler import Job
    from asyncgraph._runtime._exceptions import DeviceFaultError
    from asyncgraph._runtime._telemetry import PoolCounters, Telemetry

    from ._lease import StreamLease

__all__ = ("Engine", "FastDispatch", "FastFront", "JobT", "Links", "Sink")

JobT = TypeVar("JobT", bound="Job")  # the job type an engine makes and runs


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
class Links:
    """What an engine is made with: where it reports, what graphs use of the front, and what it
    counts into.

    Attributes:
        sink: the scheduler's events (the front's dispatcher).
        bind_call: ``bind_call(kernel, args, grid, block, shared_mem)`` validates arguments as
            ``dispatch()`` does, into a ``BoundCall`` (raises ``DispatchError`` as
            ``dispatch()``, ``BackendClosedError`` once the backend is closed); graphs and
            captures use it.
        run_prepared: ``run_prepared(job)`` numbers and schedules a job made outside
            ``dispatch()`` (a graph replay); the awaitable gives its results. On failure to
            schedule, the job is released.
        telemetry: the backend's counters.
        log: the backend's bound logger.
    """

    sink: Sink
    bind_call: Callable[[Kernel, tuple[object, ...], object, object, object], BoundCall]
    run_prepared: Callable[[Job], Awaitable[Any]]
    telemetry: Telemetry
    log: Any


@attrs.frozen(kw_only=True)
class FastFront:
    """What an engine's fast path may use of the front (:meth:`Engine.fast_path`).

    Attributes:
        door: the scheduler's door: a job admitted straight to launched, and its completion
            while nothing waits (``FastDoor``); nothing else of the scheduler.
        lifecycle: the backend's ``Lifecycle``: its state, loop and the queue's waiting room
            (read only, by the compiled core). Typed ``Any``: the lifecycle closes the engine,
            so it uses this module, which naming it here would close an import cycle with.
        dispatcher: completes a job the general way (``Dispatcher.done``) when anything waits.
        store: the resident store (``is_live``).
        ids: the dispatch numbers (shared with the general path).
    """

    door: FastDoor
    lifecycle: Any
    dispatcher: Sink
    store: ResidentStore
    ids: Iterator[int]


class FastDispatch(Protocol):
    """An engine's fast path: the steady state of ``dispatch()`` in one call."""

    def dispatch(
        self,
        kernel: Kernel,
        args: tuple[object, ...],
        grid: object,
        block: object,
        shared_mem: object,
        timing: object,
        graph: object,
        rank: int = ...,
    ) -> PendingDispatch | None:
        """Launch the call and return its pending result, or ``None`` having changed nothing
        (then the general path runs, and raises whatever is wrong with the call). *rank*: its
        priority class's (``runtime/_priority``), the default class's if not given."""
        ...

    def learn(self, plan: Plan, call: BoundCall) -> None:
        """A plan was made from *call* (``Plans``): launch the calls that fit it, if it can."""
        ...


class Engine(Protocol[JobT]):
    """The one contract of an engine, generic in the job type *JobT* it makes and runs.

    The front holds an ``Engine[Any]`` (it never looks inside a job); an engine implements
    ``Engine[ItsJob]``, so its methods take its own jobs, typed. Every method runs on the loop's
    thread. The groups below are the slices the front's collaborators use: what ``Backend``
    reads once and asks of ``dispatch()`` and ``compile()``; the dispatcher's (and, as bound
    methods, the scheduler's predicates); the resident memory's and the transfers'
    (``ResidentBuffers``, ``ResidentStore``, ``Transfers``); the exports' (``EngineExporter``);
    streams and graphs (``Backend.record``, ``capture``, ``stream``, ``wait``, ``order``); the
    lifecycle's (closing); and the fast path (``_wiring``).

    A job an engine gets from the scheduler at large rather than from its own ``prepare()``
    (``settle_after``'s in-flight jobs, ``order_foreign``'s) may be the fast path's own record:
    those are typed :class:`~asyncgraph._jobs._scheduler.Job`.
    """

    # -- what the front reads once, when it is made ----------------------------------------------

    kind: str  # "cuda", "host"
    limits: LaunchLimits
    takes_device_arrays: bool  # whether dispatch() takes CuPy / PyTorch device arrays

    @property
    def failure(self) -> DeviceFaultError | None:
        """The device fault that failed the engine, or ``None``."""
        ...

    # -- jobs: the front's dispatch() and compile() ----------------------------------------------

    def check_kernel(self, kernel: Kernel) -> None:
        """Raise if this engine cannot run *kernel* at all."""
        ...

    def prepare(self, call: BoundCall, timing: bool) -> JobT:
        """Make the job for *call*, checking the engine's own rules (before anything starts)."""
        ...

    def graph_job(
        self, call: BoundCall, always: bool, started: float, inline: bool
    ) -> JobT | PendingDispatch | None:
        """The job of *call* under ``dispatch(graph="always" | "auto")``: a replay of a
        recorded graph, an eager job ``"auto"`` measures, or ``None`` (a plain dispatch).
        Where *inline* (nothing to fence it after), a replay may be launched at once: its
        pending result is returned, and the dispatch is done. *started* is ``perf_counter()``
        at the ``dispatch()`` call."""
        ...

    def fence(self, job: JobT, after: object) -> None:
        """Have *job* run after the work on *after* (streams or events) so far."""
        ...

    async def compile(self, kernel: Kernel) -> None:
        """Compile and load *kernel* now (``backend.compile``)."""
        ...

    # -- running: the dispatcher's effects, and the scheduler's predicates -----------------------

    def needs_compile(self, job: JobT) -> bool:
        """Whether *job*'s kernel must compile before it launches (a predicate)."""
        ...

    def needs_staging(self, job: JobT) -> bool:
        """Whether *job*'s inputs are copied into pinned memory off the loop first (a
        predicate)."""
        ...

    def is_ready(self, job: JobT) -> bool:
        """Whether every use *job* depends on can be ordered after now (a predicate)."""
        ...

    def start_compile(self, job: JobT) -> None:
        """Compile *job*'s kernel in the background; report :meth:`Sink.compiled`."""
        ...

    def stage(self, job: JobT) -> None:
        """Stage *job*'s inputs off the loop; report :meth:`Sink.staged`."""
        ...

    def launch(self, job: JobT) -> None:
        """Launch *job*; report :meth:`Sink.done`. Raises (having released) if it cannot."""
        ...

    def release(self, job: JobT) -> None:
        """Give back what *job* holds; it failed before it ran (idempotent)."""
        ...

    # -- resident memory: empty(), pinned_empty(), the resident store, telemetry -----------------

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

    # -- transfers of resident storage (Transfers) -----------------------------------------------

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

    def copies_from(self, other: Engine[Any]) -> bool:
        """Whether :meth:`copy_in` copies resident storage of *other* (else the front copies
        through a host array)."""
        ...

    def copy_route(self, source: Engine[Any]) -> str:
        """How :meth:`copy_in` moves storage of *source* (which this :meth:`copies_from`)
        here: ``"device"``, ``"peer"``, ``"staged"`` or ``"host"`` (``Backend.copy_route``);
        sets up access to *source*'s memory the first time."""
        ...

    def copy_in(
        self, buffer: ResidentBuffer, use: Use, deps: list[Use], source: Engine[Any]
    ) -> Awaitable[Any]:
        """New storage here holding a copy of *buffer* (storage of *source*, which this
        :meth:`copies_from`), read as *use* after the uses in *deps*: an awaitable of it (a
        coroutine, or a future of a copy already enqueued)."""
        ...

    # -- exports: DLPack and __cuda_array_interface__ (EngineExporter) ---------------------------

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

    # -- streams and graphs: leases, records, captures and foreign work --------------------------

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

    # -- closing (Lifecycle) ---------------------------------------------------------------------

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

    # -- the fast path ---------------------------------------------------------------------------

    def fast_path(self, front: FastFront) -> FastDispatch | None:
        """The engine's fast path, if it has one (called once, when the front is complete)."""
        ...
