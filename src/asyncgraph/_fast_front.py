"""An engine's fast path (the steady state of a dispatch in one call), and what it may use of
the front.

Kept apart from ``_engine``: what the fast path is handed (the scheduler, the lifecycle, the
dispatcher) itself uses the engine's protocols, so this module sits above them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import attrs

from ._engine import Engine

if TYPE_CHECKING:
    from ._bound import BoundCall
    from ._dispatcher import Dispatcher
    from ._kernel import Kernel
    from ._lifecycle import Lifecycle
    from ._pending import PendingDispatch
    from ._plans import Plan
    from ._resident import ResidentStore
    from ._scheduler import Scheduler

__all__ = ("FastDispatch", "FastEngine", "FastFront", "FrontEngine")


@attrs.frozen(kw_only=True)
class FastFront:
    """What an engine's fast path may use of the front (``Engine.fast_path``).

    Attributes:
        scheduler: the scheduler, whose two common transitions the fast path takes itself
            (``Scheduler.fast_state``).
        lifecycle: the backend's state, loop and the queue's waiting room (read only).
        dispatcher: completes a job the general way (``Dispatcher.done``) when anything waits.
        store: the resident store (``is_live``).
        ids: the dispatch numbers (shared with the general path).
    """

    scheduler: Scheduler
    lifecycle: Lifecycle
    dispatcher: Dispatcher
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
    ) -> PendingDispatch | None:
        """Launch the call and return its pending result, or ``None`` having changed nothing
        (then the general path runs, and raises whatever is wrong with the call)."""
        ...

    def learn(self, plan: Plan, call: BoundCall) -> None:
        """A plan was made from *call* (``Plans``): launch the calls that fit it, if it can."""
        ...


class FastEngine(Protocol):
    """An engine that may have a fast path."""

    def fast_path(self, front: FastFront) -> FastDispatch | None:
        """The engine's fast path, if it has one (called once, after ``Engine.attach``)."""
        ...


class FrontEngine(Engine, FastEngine, Protocol):
    """An engine as the front holds it: the engine's protocols, and its fast path."""
