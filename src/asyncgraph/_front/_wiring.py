"""A backend's collaborators, each complete when made, made in dependency order: what
``Backend.__init__`` composes (``docs/architecture.md``, "Built in dependency order")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from asyncgraph._args._plan_cache import Plans
from asyncgraph._buffers._resident import ResidentStore, discard
from asyncgraph._front._buffer_transfers import Transfers
from asyncgraph._front._dispatcher import Dispatcher
from asyncgraph._front._exporter import EngineExporter
from asyncgraph._runtime import _loop
from asyncgraph._runtime._nvtx import NvtxRanges
from asyncgraph._runtime._telemetry import Telemetry

from ._engine_protocols import FastFront, Links
from ._lifecycle import Lifecycle, Room

if TYPE_CHECKING:
    import asyncio

    from asyncgraph._args._bound_args import BoundCall
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._jobs._pending import PendingDispatch
    from asyncgraph._jobs._scheduler import Job

    from ._engine_protocols import Engine
    from ._options import BackendOptions

__all__ = ("Parts", "assemble")


@attrs.frozen
class Parts:
    """What a backend is made of (``assemble``)."""

    telemetry: Telemetry
    dispatcher: Dispatcher
    engine: Engine[Any]
    store: ResidentStore
    life: Lifecycle
    transfers: Transfers
    plans: Plans
    fast: Callable[..., PendingDispatch | None] | None  # the fast path's dispatch (CUDA)


def assemble(
    name: str,
    options: BackendOptions,
    make_engine: Callable[[Links], Engine[Any]],
    *,
    log: Any,
    ids: Iterator[int],
    counts: Callable[[], tuple[int, int]],
    bind_call: Callable[[Kernel, tuple[object, ...], object, object, object], BoundCall],
    run_prepared: Callable[[Job], Awaitable[Any]],
    loop_of: Callable[[], asyncio.AbstractEventLoop | None],
) -> Parts:
    """Make a backend's collaborators, each given what it uses.

    The dispatcher and the engine need each other: the dispatcher makes the engine, handing
    itself over as its sink (in its :class:`Links`). The :class:`Room` comes first, shared by
    the dispatcher (told of each batch) and the lifecycle; the plans come last, told of the
    fast path. *counts* gives the scheduler's in-flight and queued counts to telemetry,
    *bind_call* and *run_prepared* are what graphs use of the front (``Links``), and *loop_of*
    the loop the backend belongs to.

    Raises:
        UnsupportedError: NVTX ranges asked for without the nvtx package (before anything
            opens).
    """
    nvtx = NvtxRanges() if options.nvtx_enabled else None
    room = Room(options.max_queued)
    telemetry = Telemetry(counts, lambda: engine.pool_counters())
    dispatcher = Dispatcher(
        engine=lambda sink: make_engine(
            Links(
                sink=sink,
                bind_call=bind_call,
                run_prepared=run_prepared,
                telemetry=telemetry,
                log=log,
            )
        ),
        max_in_flight=options.max_in_flight,
        telemetry=telemetry,
        log=log,
        nvtx=nvtx,
        dispatch_events=options.dispatch_events_enabled,
        after=room.after_batch,
        discard=discard,
    )
    engine = dispatcher.engine
    store = ResidentStore(name, engine.free_storage, EngineExporter(engine, loop_of))
    life = Lifecycle(
        name=name,
        engine=engine,
        dispatcher=dispatcher,
        store=store,
        room=room,
        telemetry=telemetry,
        log=log,
        loop=_loop.running_loop(),
    )
    transfers = Transfers(
        engine=engine, store=store, lifecycle=life, sink=dispatcher, telemetry=telemetry
    )
    door = dispatcher.scheduler.fast_door
    fast = engine.fast_path(
        FastFront(door=door, lifecycle=life, ids=ids, dispatcher=dispatcher, store=store)
    )
    learn = None if fast is None else fast.learn  # the plans' news, for the fast path
    plans = Plans(engine.limits, store, engine.takes_device_arrays, learn)
    return Parts(
        telemetry,
        dispatcher,
        engine,
        store,
        life,
        transfers,
        plans,
        fast.dispatch if fast is not None else None,
    )
