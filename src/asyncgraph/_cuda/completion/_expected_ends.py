"""Expected ends of work, as the reactor uses them: which lanes it keeps polling for, which it
hands to their waiters at once, and how early a waiter pokes the loop (``_reactor``).

A watch may carry ``expect``, when its work is expected to end (``perf_counter()``; 0.0: not
known). The reactor pokes a margin before it, because a loop asleep in its selector wakes 50 to
150 us after its eventfd is written. The margin is learned from how late the loop answered
pokes (:func:`margin_after_poke`). While the loop polls for work within the margin instead of
handing it off, no poke tells it how late it would have woken, so each such poll eases the
margin back a little (:func:`eased`): one late answer (the loop busy with something else for a
while) must not keep it polling for good.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from asyncgraph._cuda.core._watches import POKE_MARGIN, POKE_MARGIN_LIMITS, POKE_TAIL, WatchLane

__all__ = (
    "NOT_SOON",
    "POKED",
    "WITHIN_MARGIN",
    "eased",
    "ends_late",
    "ends_soon",
    "margin_after_poke",
)

# A poke answered later than the margin allows raises the margin at once to a quarter more than
# that lateness; one answered sooner lowers it by FALL of the way.
FALL = 1 / 8
# What a poll within the margin eases it by, of the way back to POKE_MARGIN.
EASE = 1 / 64

# Why the loop keeps polling rather than handing off (ends_soon).
NOT_SOON = 0
WITHIN_MARGIN = 1  # some lane's oldest work, not handed off, ends within the margin
POKED = 2  # a poked lane's work is due, or passed its expected end by less than POKE_TAIL


def margin_after_poke(margin: float, lateness: float) -> float:
    """The poke margin after the loop answered a poke *lateness* seconds after its wake time."""
    wanted = 1.25 * lateness
    margin = wanted if wanted > margin else margin + (wanted - margin) * FALL
    low, high = POKE_MARGIN_LIMITS
    return min(max(margin, low), high)


def eased(margin: float) -> float:
    """The poke margin after a poll within it (no poke to learn from): eased back towards
    ``POKE_MARGIN``, where it starts, never below."""
    return margin - (margin - POKE_MARGIN) * EASE if margin > POKE_MARGIN else margin


def ends_late(lanes: Sequence[WatchLane], later: float) -> bool:
    """Whether every lane polled for (busy, not handed off) has its oldest work expected to
    end after *later*; and there is one."""
    found = False
    for lane in lanes:
        if lane.pending and lane.handed is None:
            expect = lane.pending[0].expect
            if not expect or expect < later:
                return False
            found = True
    return found


def ends_soon(lanes: Sequence[WatchLane], poked: Collection[int], now: float, margin: float) -> int:
    """Why the loop should keep polling at *now*: :data:`WITHIN_MARGIN`, :data:`POKED`, or
    :data:`NOT_SOON` (falsy) to hand off (*poked*: the indices of lanes whose waiter poked)."""
    for lane in lanes:
        pending = lane.pending
        if not pending:
            continue
        head = pending[0]
        left = head.expect - now
        if lane.handed is None:
            if 0.0 < left < margin:
                return WITHIN_MARGIN
        elif lane.handed is head and lane.index in poked and left > -POKE_TAIL:
            return POKED
    return NOT_SOON
