"""Ordering work on a stream after the dispatches it depends on: a wait on their events, or
the one lane they all run on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as drv

from asyncgraph._cuda.driver._driver import check
from asyncgraph._runtime._priority import NORMAL

from ._staging_plan import dep_event

if TYPE_CHECKING:
    from ._lanes import Lane

__all__ = ("chained_lane", "wait_deps")


def wait_deps(deps: list[Any], lane: Lane) -> None:
    """Make *lane*'s stream wait for the launched uses in *deps*.

    Uses on *lane* itself are ordered by the stream already, finished ones need no wait, and
    unlaunched ones were waited for before; the others are waited for through their events.
    """
    for dep in deps:
        event = dep_event(dep)
        if event is not None and event is not False and getattr(dep, "lane", None) is not lane:
            check(drv.cuStreamWaitEvent(lane.handle, event, 0), "cuStreamWaitEvent")


def chained_lane(deps: list[Any], rank: int = NORMAL) -> Lane | None:
    """The lane every unfinished use in *deps* runs on, if they all run on one of the priority
    class of *rank* that is not leased (a lane of another class than the default one is always
    taken); ``None`` otherwise.

    A dispatch placed there is ordered after them by the stream alone: a chain of dispatches
    on one resident buffer runs back to back, without an event wait between streams.
    """
    found: Lane | None = None
    for dep in deps:
        event = dep_event(dep)
        if event is None:
            continue  # finished
        lane = getattr(dep, "lane", None)
        if event is False or lane is None or (found is not None and lane is not found):
            return None
        found = lane
    if found is not None and (found.rank != rank or (rank == NORMAL and found.slot.leased)):
        return None
    return found
