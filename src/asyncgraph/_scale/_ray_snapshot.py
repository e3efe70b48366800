"""What an actor pool says of itself: ``pool.snapshot()``, frozen.

A :class:`PoolSnapshot` holds one :class:`SlotSnapshot` per slot of the pool and one
:class:`Replacement` per failure the pool saw (and per replacement that failed to start), in
the order they happened.
"""

from __future__ import annotations

from typing import Literal

import attrs

__all__ = ("Outcome", "PoolSnapshot", "Replacement", "SlotSnapshot", "SlotStateName")

SlotStateName = Literal["live", "replacing", "gone"]
Outcome = Literal["starting", "replaced", "start failed", "not replaced", "cancelled"]


@attrs.frozen(kw_only=True)
class Replacement:
    """One failure of an actor of the pool, and the replacement it called for.

    Attributes:
        slot: the slot of the actor that failed.
        generation: the generation of the actor started to replace it (for ``"not
            replaced"``, of the one that would have been).
        reason: why the actor was taken out: ``"its process died: ActorDiedError: ..."``,
            ``"its backend failed: DeviceFaultError: ..."``, ``"it did not answer a health
            check in 30 s"``, or ``"its replacement did not start: ..."`` for a second try.
        outcome: ``"starting"`` (under way), ``"replaced"`` (the new actor takes runs),
            ``"start failed"`` (the new actor did not start, or its setup failed; ``error``
            says why), ``"not replaced"`` (``max_replacements`` was spent: the slot is gone)
            or ``"cancelled"`` (the pool closed first).
        detected_after: seconds from sending the run whose error showed the failure to seeing
            that error, or, for a failure a health check showed, from the actor's last answer
            to a health check (or from its first being checked) to the check that showed it:
            an upper bound of how long the failure went unseen; ``None`` for a second try.
        seconds: seconds from seeing the failure to the new actor taking runs (failed tries
            before it included); ``None`` unless ``"replaced"``.
        runs_lost: runs on the failed actor that failed with an error saying it is out of
            service (so far; the one that showed it included); 0 for a second try.
        error: why the replacement did not start (``"start failed"``), else ``None``.
    """

    slot: int
    generation: int
    reason: str
    outcome: Outcome
    detected_after: float | None
    seconds: float | None
    runs_lost: int
    error: str | None


@attrs.frozen(kw_only=True)
class SlotSnapshot:
    """One slot of the pool.

    Attributes:
        index: its place in the pool (``worker.index``, ``ActorInfo.index``).
        state: ``"live"`` (its actor takes runs), ``"replacing"`` (its actor failed; a new one
            is starting) or ``"gone"`` (its actor failed and was not replaced).
        generation: the generation of its actor (the one that failed, unless live).
        pid: its live actor's process, else ``None``.
        node_id: the Ray node of its live actor, else ``None``.
        in_flight: runs in flight on its actor (on the failed one, while replacing).
        runs_ok: runs that succeeded on its actors, all generations.
        runs_failed: runs that failed on its actors, all generations.
        why: why it is replacing or gone, else ``None``.
    """

    index: int
    state: SlotStateName
    generation: int
    pid: int | None
    node_id: str | None
    in_flight: int
    runs_ok: int
    runs_failed: int
    why: str | None


@attrs.frozen(kw_only=True)
class PoolSnapshot:
    """An actor pool's state: its slots, its replacements and its runs.

    Attributes:
        size: slots the pool was opened with.
        live: slots whose actor takes runs.
        replacing: slots whose replacement is starting.
        gone: slots left empty (``max_replacements`` spent): the pool is that much smaller.
        in_flight: runs sent to actors and not finished.
        waiting: runs waiting for an actor (none live, a replacement coming).
        runs_ok: runs that succeeded (``run``, ``run_on`` and ``broadcast``; not the setup).
        runs_failed: runs that failed.
        max_replacements: the pool's bound (``None``: no bound).
        replacements_left: replacements it may still start (``None``: no bound).
        slots: each slot, in order.
        replacements: each failure seen and what came of it, in order.
    """

    size: int
    live: int
    replacing: int
    gone: int
    in_flight: int
    waiting: int
    runs_ok: int
    runs_failed: int
    max_replacements: int | None
    replacements_left: int | None
    slots: tuple[SlotSnapshot, ...]
    replacements: tuple[Replacement, ...]
