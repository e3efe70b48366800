"""The slots of an actor pool, and the one place where their states change.

A pool of *size* actors has *size* slots. A slot is ``LIVE`` (its actor takes runs),
``REPLACING`` (its actor failed; a new one is starting) or ``GONE`` (its actor failed and
``max_replacements`` is spent, or the pool closed while it was replacing). Every change of a
slot's state is made by :meth:`SlotTable.advance`, on one of four events: an actor failed (a
run's error or a health check said so), a replacement started, a replacement failed to start,
the pool closes. It returns the
:class:`Effects` to carry out (replacements to start, actors to stop, events to log, waiting
runs to wake), which the pool does outside it. The pool asks everything else through
predicates (:meth:`SlotTable.choose`, :meth:`SlotTable.is_settled`, ...).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from asyncgraph._runtime._exceptions import GroupError

from ._ray_snapshot import Outcome, PoolSnapshot, Replacement, SlotSnapshot

if TYPE_CHECKING:
    from ._ray_actor import ActorInfo

__all__ = (
    "Closing",
    "Effects",
    "Failed",
    "PoolActor",
    "SlotTable",
    "Start",
    "StartFailed",
    "Started",
)


class _State(enum.Enum):
    LIVE = "live"
    REPLACING = "replacing"
    GONE = "gone"


@attrs.define(eq=False)
class PoolActor:
    """One actor of the pool: its slot, its generation, its Ray handle, and its runs."""

    slot: int
    generation: int
    handle: Any
    info: ActorInfo
    in_flight: int = 0
    runs_ok: int = 0
    runs_failed: int = 0
    runs_lost: int = 0  # failed with an error that says the actor is out of service
    out_of_service: str | None = None  # why the pool took it out, once it did
    _idle: list[asyncio.Future[None]] = attrs.field(factory=list, init=False)

    def sent(self) -> None:
        """A run was sent to it."""
        self.in_flight += 1

    def finished(self, ok: bool, lost: bool = False) -> None:
        """A run sent to it ended, well or not (*lost*: failed because the actor is out of
        service)."""
        self.in_flight -= 1
        if ok:
            self.runs_ok += 1
        else:
            self.runs_failed += 1
            self.runs_lost += lost
        if self.in_flight == 0:
            idle, self._idle = self._idle, []
            for waiter in idle:
                if not waiter.done():
                    waiter.set_result(None)

    async def wait_idle(self, timeout: float) -> None:  # noqa: ASYNC109  # a drain's bound, not a caller's deadline
        """Wait until no run is in flight on it, or *timeout* seconds."""
        if self.in_flight == 0:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._idle.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            if waiter in self._idle:
                self._idle.remove(waiter)


# -- events ------------------------------------------------------------------------------------


@attrs.frozen
class Failed:
    """A run's error, or a health check, said that *actor* is out of service, *detected_after*
    s after the run was sent (after the actor last answered a health check); *drain*: let the
    runs in flight on it end before it is stopped (not for an actor that does not answer)."""

    actor: PoolActor
    reason: str
    detected_after: float
    drain: bool = True


@attrs.frozen
class Started:
    """The replacement for *slot* started (and ran the setup): *actor*."""

    slot: int
    actor: PoolActor


@attrs.frozen
class StartFailed:
    """The replacement for *slot* did not start: *error*."""

    slot: int
    error: str


@attrs.frozen
class Closing:
    """The pool closes: no replacement starts from now on."""


Event = Failed | Started | StartFailed | Closing


# -- effects -----------------------------------------------------------------------------------


@attrs.frozen
class Start:
    """Start actor *generation* for *slot*; first stop *failed*, if given, letting the runs in
    flight on it end (for a while) if *drain*."""

    slot: int
    generation: int
    failed: PoolActor | None
    drain: bool = True


@attrs.define
class Effects:
    """What the pool does after an event, outside the table."""

    starts: list[Start] = attrs.Factory(list)
    kills: list[Any] = attrs.Factory(list)  # Ray handles of actors to stop now
    logs: list[tuple[str, str, dict[str, Any]]] = attrs.Factory(list)  # level, event, fields
    wake: bool = False  # wake the runs waiting for an actor


@attrs.define(eq=False)
class _Attempt:
    """A replacement, as it goes: what :class:`Replacement` reports."""

    slot: int
    generation: int
    reason: str
    seen_at: float
    detected_after: float | None
    failed: PoolActor | None
    outcome: Outcome = "starting"
    seconds: float | None = None
    error: str | None = None

    def report(self) -> Replacement:
        return Replacement(
            slot=self.slot,
            generation=self.generation,
            reason=self.reason,
            outcome=self.outcome,
            detected_after=self.detected_after,
            seconds=self.seconds,
            runs_lost=self.failed.runs_lost if self.failed is not None else 0,
            error=self.error,
        )


@attrs.define(eq=False)
class _Slot:
    index: int
    actor: PoolActor  # the live one; while replacing or gone, the one that failed
    state: _State = _State.LIVE
    generations: int = 1  # actors started for it so far
    attempt: _Attempt | None = None  # the replacement under way
    why: str | None = None  # why it is replacing or gone


class SlotTable:
    """The pool's slots, their actors and the replacements, changed by :meth:`advance` only.

    Args:
        started: the pool's first actors, one per slot in order: ``(handle, info)``.
        max_replacements: how many replacements the pool may start; ``None``: no bound.
        clock: seconds, for the replacements' timings.
    """

    def __init__(
        self,
        started: list[tuple[Any, ActorInfo]],
        max_replacements: int | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._slots = [
            _Slot(i, PoolActor(i, 0, handle, info)) for i, (handle, info) in enumerate(started)
        ]
        self._actors = [slot.actor for slot in self._slots]  # every actor, for the counts
        self._attempts: list[_Attempt] = []
        self._max = max_replacements
        self._left = max_replacements
        self._clock = clock
        self._turn = 0
        self._closing = False

    # -- predicates ----------------------------------------------------------------------------

    def choose(self, index: int | None) -> PoolActor | None:
        """The actor to send a run to: slot *index*'s, or (``None``) the live one with the
        fewest runs in flight (equals take turns); ``None`` if it must wait for a replacement.

        Raises:
            GroupError: there is no slot *index*, or it is gone; no slot is live and none is
                being replaced.
        """
        slots = self._slots
        if index is not None:
            if not 0 <= index < len(slots):
                raise GroupError(f"actor {index} of a pool of {len(slots)}")
            slot = slots[index]
            if slot.state is _State.GONE:
                raise GroupError(
                    f"actor {index} of the pool is gone ({slot.why}), and max_replacements "
                    f"({self._max}) is spent; run on another actor (pool.run), or open a new "
                    "pool with a larger max_replacements"
                )
            return slot.actor if slot.state is _State.LIVE else None
        best: _Slot | None = None
        n = len(slots)
        for k in range(n):
            slot = slots[(self._turn + k) % n]
            if slot.state is _State.LIVE and (
                best is None or slot.actor.in_flight < best.actor.in_flight
            ):
                best = slot
        if best is not None:
            self._turn = best.index + 1
            return best.actor
        if any(slot.state is _State.REPLACING for slot in slots):
            return None
        whys = "; ".join(f"actor {slot.index}: {slot.why}" for slot in slots)
        raise GroupError(
            f"the pool has no live actor left, and max_replacements ({self._max}) is spent "
            f"({whys}); open a new pool, with a larger max_replacements if need be"
        )

    def is_settled(self) -> bool:
        """Whether no replacement is under way (every slot live or gone)."""
        return all(slot.state is not _State.REPLACING for slot in self._slots)

    def reachable(self) -> list[int]:
        """The slots that are live or being replaced, in order."""
        return [slot.index for slot in self._slots if slot.state is not _State.GONE]

    def live(self) -> list[PoolActor]:
        """The live actors, in slot order."""
        return [slot.actor for slot in self._slots if slot.state is _State.LIVE]

    def handles(self) -> list[Any]:
        """The Ray handle of every actor the pool had (to stop them all when it closes)."""
        return [actor.handle for actor in self._actors]

    def in_flight(self) -> tuple[int, ...]:
        """Runs in flight on each slot's actor."""
        return tuple(slot.actor.in_flight for slot in self._slots)

    def counts(self) -> tuple[int, int, int]:
        """Slots live, replacing and gone."""
        states = [slot.state for slot in self._slots]
        return (
            states.count(_State.LIVE),
            states.count(_State.REPLACING),
            states.count(_State.GONE),
        )

    def snapshot(self, waiting: int) -> PoolSnapshot:
        """The table as a :class:`PoolSnapshot`; *waiting*: runs waiting for an actor."""
        slots = []
        for slot in self._slots:
            mine = [actor for actor in self._actors if actor.slot == slot.index]
            is_live = slot.state is _State.LIVE
            slots.append(
                SlotSnapshot(
                    index=slot.index,
                    state=slot.state.value,
                    generation=slot.actor.generation,
                    pid=slot.actor.info.pid if is_live else None,
                    node_id=slot.actor.info.node_id if is_live else None,
                    in_flight=slot.actor.in_flight,
                    runs_ok=sum(actor.runs_ok for actor in mine),
                    runs_failed=sum(actor.runs_failed for actor in mine),
                    why=slot.why,
                )
            )
        live, replacing, gone = self.counts()
        return PoolSnapshot(
            size=len(slots),
            live=live,
            replacing=replacing,
            gone=gone,
            in_flight=sum(s.in_flight for s in slots),
            waiting=waiting,
            runs_ok=sum(s.runs_ok for s in slots),
            runs_failed=sum(s.runs_failed for s in slots),
            max_replacements=self._max,
            replacements_left=self._left,
            slots=tuple(slots),
            replacements=tuple(attempt.report() for attempt in self._attempts),
        )

    # -- the one place that changes state ------------------------------------------------------

    def advance(self, event: Event) -> Effects:
        """Make every change of state that *event* calls for; the effects to carry out."""
        effects = Effects()
        now = self._clock()
        if isinstance(event, Failed):
            slot = self._slots[event.actor.slot]
            if slot.actor is event.actor and slot.state is _State.LIVE:
                event.actor.out_of_service = event.reason
                self._replace(
                    slot, event.reason, now, event.detected_after, event.actor, effects, event.drain
                )
        elif isinstance(event, Started):
            slot, actor = self._slots[event.slot], event.actor
            attempt = slot.attempt
            if slot.state is not _State.REPLACING or attempt is None or self._closing:
                effects.kills.append(actor.handle)  # the pool closed while it started
                return effects
            actor.info = attrs.evolve(actor.info, replaced=attempt.reason)
            self._actors.append(actor)
            slot.actor, slot.state, slot.attempt, slot.why = actor, _State.LIVE, None, None
            attempt.outcome, attempt.seconds = "replaced", now - attempt.seen_at
            effects.wake = True
            effects.logs.append(
                (
                    "info",
                    "pool.actor_replaced",
                    {
                        "slot": slot.index,
                        "generation": actor.generation,
                        "pid": actor.info.pid,
                        "reason": attempt.reason,
                        "detected_after": attempt.detected_after,
                        "seconds": attempt.seconds,
                        "replacements_left": self._left,
                    },
                )
            )
        elif isinstance(event, StartFailed):
            slot = self._slots[event.slot]
            attempt = slot.attempt
            if slot.state is not _State.REPLACING or attempt is None:
                return effects
            attempt.outcome, attempt.error = "start failed", event.error
            effects.logs.append(
                (
                    "warning",
                    "pool.replacement_failed",
                    {
                        "slot": slot.index,
                        "generation": attempt.generation,
                        "error": event.error,
                        "replacements_left": self._left,
                    },
                )
            )
            reason = f"its replacement did not start: {event.error}"
            self._replace(slot, reason, attempt.seen_at, None, None, effects)
        else:
            self._closing = True
            for slot in self._slots:
                if slot.state is _State.REPLACING and slot.attempt is not None:
                    slot.attempt.outcome = "cancelled"
                    slot.state, slot.attempt, slot.why = _State.GONE, None, "the pool closed"
            effects.wake = True
        return effects

    def _replace(
        self,
        slot: _Slot,
        reason: str,
        seen_at: float,
        detected_after: float | None,
        failed: PoolActor | None,
        effects: Effects,
        drain: bool = True,
    ) -> None:
        """Part of :meth:`advance`: *slot*'s actor is out (*failed*, or its replacement did
        not start): replace it, or, past ``max_replacements`` (or closing), leave it gone."""
        if self._closing:
            slot.state, slot.attempt, slot.why = _State.GONE, None, reason
            if failed is not None:
                effects.kills.append(failed.handle)
            return
        attempt = _Attempt(
            slot.index, slot.generations, reason, seen_at, detected_after, failed, "not replaced"
        )
        self._attempts.append(attempt)
        if self._left == 0:
            slot.state, slot.attempt, slot.why = _State.GONE, None, reason
            if failed is not None:
                effects.kills.append(failed.handle)
            effects.wake = True
            live = sum(s.state is _State.LIVE for s in self._slots)
            effects.logs.append(
                (
                    "warning",
                    "pool.actor_lost",
                    {
                        "slot": slot.index,
                        "reason": reason,
                        "max_replacements": self._max,
                        "live": live,
                        "size": len(self._slots),
                    },
                )
            )
            return
        if self._left is not None:
            self._left -= 1
        attempt.outcome = "starting"
        slot.generations += 1
        slot.state, slot.attempt, slot.why = _State.REPLACING, attempt, reason
        effects.starts.append(Start(slot.index, attempt.generation, failed, drain))
