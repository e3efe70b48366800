"""An engine's fast path (the steady state of a dispatch in one call), and what it may use of
the front.

The fast path enters the front through named doors, each its owner's operation with its
invariant stated there: the scheduler's :class:`~asyncgraph.jobs._fast_door.FastDoor`
(``admit_launched``, ``complete_launched``), the resident store's ``is_live``, ``track_uses``,
``untrack`` and what they read, and the pending result's ``new_pending`` and ``set_outcome``.
It reads the lifecycle, and hands a job the general way to the dispatcher's ``done``; it
changes nothing else of the front. The compiled core calls those doors through C: their
modules are compiled from their Python source where the core is built.

Kept apart from ``_engine_protocols``: what the fast path is handed (the lifecycle) itself uses the
engine's protocols, so this module sits above them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import attrs

from ._engine_protocols import Engine

if TYPE_CHECKING:
    from asyncgraph.args._bound_args import BoundCall
    from asyncgraph.args._kernel import Kernel
    from asyncgraph.args._plan_cache import Plan
    from asyncgraph.buffers._resident import ResidentStore
    from asyncgraph.jobs._fast_door import FastDoor
    from asyncgraph.jobs._pending import PendingDispatch

    from ._engine_protocols import Sink
    from ._lifecycle import Lifecycle

__all__ = ("FastDispatch", "FastEngine", "FastFront", "FrontEngine")


@attrs.frozen(kw_only=True)
class FastFront:
    """What an engine's fast path may use of the front (``Engine.fast_path``).

    Attributes:
        door: the scheduler's door: a job admitted straight to launched, and its completion
            while nothing waits (``FastDoor``); nothing else of the scheduler.
        lifecycle: the backend's state, loop and the queue's waiting room (read only).
        dispatcher: completes a job the general way (``Dispatcher.done``) when anything waits.
        store: the resident store (``is_live``).
        ids: the dispatch numbers (shared with the general path).
    """

    door: FastDoor
    lifecycle: Lifecycle
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
        """The engine's fast path, if it has one (called once, when the front is complete)."""
        ...


class FrontEngine(Engine, FastEngine, Protocol):
    """An engine as the front makes it: the engine's protocols, and its fast path."""
