"""The health check of an actor pool: every live actor probed on its own event loop.

A pipeline that blocks its actor's event loop (a synchronous call that never returns, a
deadlock) leaves the actor's process alive, so no run's error shows it. :class:`HealthCheck`
asks each live actor, every ``period`` seconds, for its ``check_health`` answer, which the
actor gives from its event loop: an actor that does not answer within ``timeout`` seconds is
out of service, and so is one that answers that its backend failed (a fault a pipeline caught
and hid) or whose process died. Each such actor is told to the pool as a
:class:`~asyncgraph._scale._ray_slots.Failed` event; the pool's slot table does the rest, as
for a failure a run's error showed.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable
from typing import Any

from asyncgraph._runtime._exceptions import ArgumentTypeError, GroupError

from ._ray_actor import failure_of
from ._ray_slots import Failed, PoolActor
from ._ray_start import retrieve

__all__ = ("HealthCheck", "check_seconds")


class HealthCheck:
    """Probes the live actors of a pool, each on its own event loop, one probe at a time each.

    An actor is probed every *period* seconds (the next probe is sent at the first tick after
    the last one ended); one whose probe is not answered within *timeout* seconds, whose
    answer is its backend's fault, or whose probe fails with an error saying its process is
    gone, is passed to *failed* as a :class:`Failed` event. So a loop blocked from time *t* is
    seen by *t* + *period* + *timeout* (and a probe's round trip).

    Args:
        period: seconds between two probes of an actor.
        timeout: seconds an actor has to answer a probe.
        live: the pool's live actors now.
        failed: what to do with an actor found out of service (the pool advances its table).
        clock: seconds, for the time since an actor last answered.
    """

    def __init__(
        self,
        period: float,
        timeout: float,
        live: Callable[[], list[PoolActor]],
        failed: Callable[[Failed], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._period = period
        self._timeout = timeout
        self._live = live
        self._failed = failed
        self._clock = clock
        self._probes: dict[PoolActor, asyncio.Task[None]] = {}
        self._answered: dict[PoolActor, float] = {}  # when each actor last answered
        self._ticks: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start probing, on the running loop."""
        self._ticks = asyncio.get_running_loop().create_task(self._tick_forever())

    async def stop(self) -> None:
        """Stop probing; return once no probe is left."""
        tasks = [task for task in (self._ticks, *self._probes.values()) if task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._ticks = None

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            live = self._live()
            now = self._clock()
            for actor in [a for a in self._answered if a not in live]:
                del self._answered[actor]
            loop = asyncio.get_running_loop()
            for actor in live:
                self._answered.setdefault(actor, now)
                if actor not in self._probes:
                    probe = self._probes[actor] = loop.create_task(self._probe(actor))
                    probe.add_done_callback(functools.partial(self._probed, actor))

    def _probed(self, actor: PoolActor, _: asyncio.Task[None]) -> None:
        del self._probes[actor]

    async def _probe(self, actor: PoolActor) -> None:
        """Probe *actor* once; tell the pool if it is out of service."""
        ref = actor.handle.check_health.remote()
        answer: asyncio.Future[Any] = asyncio.wrap_future(ref.future())
        answer.add_done_callback(retrieve)  # left unanswered, it fails once the actor is stopped
        reason: str | None
        drain = True
        try:
            fault = await asyncio.wait_for(asyncio.shield(answer), self._timeout)
        except TimeoutError:
            reason, drain = f"it did not answer a health check in {self._timeout:g} s", False
        except Exception as exc:  # an error of Ray's: the actor's process is gone, or not
            reason = failure_of(exc)
        else:
            reason = None if fault is None else failure_of(fault)
            if reason is None:
                self._answered[actor] = self._clock()
        if reason is not None:
            since = self._clock() - self._answered.get(actor, self._clock())
            self._failed(Failed(actor, reason, since, drain))


def check_seconds(name: str, seconds: object) -> None:
    """Refuse a health check's *seconds* that are not a positive, finite number, nor ``None``."""
    if seconds is None:
        return
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ArgumentTypeError(
            f"open_actor_pool({name}={seconds!r}): pass a number of seconds (a float or an "
            f"int), or None to turn the health check off; got {type(seconds).__name__}"
        )
    if not (seconds > 0 and math.isfinite(seconds)):
        raise GroupError(
            f"open_actor_pool({name}={seconds!r}): pass a positive, finite number of seconds, "
            "or None to turn the health check off"
        )
