"""asyncgraph on Ray: a pool of async actors, one per GPU, each holding its own backend.

When one process is not enough (dispatch-bound work, or more than one machine), run one
backend per GPU in a Ray actor, and send each actor whole pipelines, never single dispatches:
a call to an actor costs about a millisecond. ``pip install 'asyncgraph[ray]'``.

.. code-block:: python

    from asyncgraph.ray import open_actor_pool

    async def infer(worker, x):                 # runs on an actor, with its backend
        out, = await worker.backend.dispatch(kernel, x, ag.Out(x.shape, x.dtype), ...)
        return out

    async with open_actor_pool(2, device="cuda") as pool:   # two actors, a GPU each
        y = await pool.run(infer, x)                         # on the least busy actor

Each actor is a Ray async actor: its methods run on one event loop, where its backend was
opened, and up to Ray's ``max_concurrency`` of them at once. Ray's concurrency groups give a
group its own event loop, which a backend refuses (``UnsupportedError``): do not use them with
this pool. The pool awaits Ray's object refs, so call it from asyncio (not trio).

A resident buffer lives on its actor's backend and cannot leave the actor: a pipeline returns
``await worker.backend.download(buffer)``, not the buffer (``NotPicklableError``).

The pool heals. A sticky device fault ruins every CUDA context of its process, so isolation is
one process per GPU, and an actor whose backend failed (a run failed with
:class:`~asyncgraph.DeviceFaultError`) or whose process died (Ray's ``RayActorError``) is taken
out the moment a run's error shows it: no run is placed there afterwards. A new actor asking
Ray for the same resources takes its slot, the old one stopped, and runs the pool's ``setup``
before it takes runs; runs wait for it when no other actor is live. ``max_replacements`` bounds
the replacements (past it the pool stays smaller), and :meth:`ActorPool.snapshot` tells them.

An actor alive but useless (its event loop blocked by a synchronous call, a deadlock) shows no
error: the pool probes every live actor on its event loop every ``health_check_period``
seconds, and takes out, as a failed one, an actor that does not answer within
``health_check_timeout`` seconds; it is stopped at once, and the runs in flight on it fail.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from asyncgraph._front._options import BackendOptions
from asyncgraph._runtime._resource import AsyncResource
from asyncgraph._runtime._telemetry import logger
from asyncgraph._scale._ray_actor import ActorInfo as ActorInfo
from asyncgraph._scale._ray_actor import Pipeline, buffers_refused, describe, failure_of, is_async
from asyncgraph._scale._ray_actor import Worker as Worker
from asyncgraph._scale._ray_health import HealthCheck, check_seconds
from asyncgraph._scale._ray_slots import (
    Closing,
    Effects,
    Failed,
    PoolActor,
    SlotTable,
    Start,
    Started,
    StartFailed,
)
from asyncgraph._scale._ray_snapshot import PoolSnapshot as PoolSnapshot
from asyncgraph._scale._ray_snapshot import Replacement as Replacement
from asyncgraph._scale._ray_snapshot import SlotSnapshot as SlotSnapshot
from asyncgraph._scale._ray_start import Starter, retrieve

from ._runtime._exceptions import ArgumentTypeError, BackendClosedError, GroupError

__all__ = (
    "ActorInfo",
    "ActorPool",
    "PoolSnapshot",
    "Replacement",
    "SlotSnapshot",
    "Worker",
    "open_actor_pool",
)

# How long a replacement lets the runs in flight on the failed actor end (each with its own
# error) before it stops that actor: a device fault fails them at once, a dead process too.
DRAIN_SECONDS = 5.0


def open_actor_pool(
    size: int,
    *,
    device: str | int = "auto",
    num_gpus: float = 1,
    options: BackendOptions | None = None,
    actor_options: dict[str, Any] | None = None,
    start_timeout: float | None = 60.0,
    setup: Pipeline | None = None,
    max_replacements: int | None = 8,
    health_check_period: float | None = 10.0,
    health_check_timeout: float | None = 30.0,
) -> ActorPool:
    """A pool of *size* Ray actors, each with a backend on *device*, opened by ``async with``.

    Ray must be initialised first (``ray.init()``); each actor asks Ray for *num_gpus* GPUs,
    so Ray sets its ``CUDA_VISIBLE_DEVICES`` and ``device="cuda"`` is the GPU it was given,
    and for no CPU unless ``actor_options`` gives ``num_cpus`` (Ray would otherwise hold one
    CPU for each actor's whole life, which a pool of more actors than CPUs never gets).

    Args:
        size: how many actors (one per GPU, usually).
        device: what each actor's backend opens (``open_backend``'s argument).
        num_gpus: GPUs each actor asks Ray for.
        options: each backend's :class:`BackendOptions`.
        actor_options: more of Ray's actor options (``num_cpus``, ``resources``,
            ``runtime_env``, ...); every actor, replacements included, gets the same.
        start_timeout: seconds for the actors to start and open their backends (``None``: no
            limit), at open and for each replacement; see :meth:`ActorPool.open`.
        setup: ``async def setup(worker)``, run on every actor once it started (the first
            ones and each replacement) before it takes runs: load weights into
            ``worker.state`` here, since a replacement starts with an empty state.
        max_replacements: how many actors the pool may start in place of failed ones over its
            life (a failed start counts), so that a fault that comes back does not restart
            actors forever; past it a failed actor's slot stays empty. ``None``: no bound.
        health_check_period: seconds between two health checks of each live actor, a probe
            answered on the actor's event loop; ``None`` (or *health_check_timeout*
            ``None``): no health check.
        health_check_timeout: seconds an actor has to answer a health check; one that does
            not is taken out as a failed one ("it did not answer a health check in 30 s"),
            stopped at once (its runs in flight fail) and replaced.

    Raises:
        GroupError: *size* is not a positive int, *num_gpus* not a number of 0 or more,
            *start_timeout* not a positive number, *setup* not an async function,
            *max_replacements* not an int of 0 or more, or *health_check_period* or
            *health_check_timeout* not a positive, finite number of seconds.
        ArgumentTypeError: *health_check_period* or *health_check_timeout* is not a number
            (nor ``None``).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise GroupError(f"open_actor_pool({size!r}): pass a positive number of actors")
    if start_timeout is not None and (
        isinstance(start_timeout, bool)
        or not isinstance(start_timeout, int | float)
        or not start_timeout > 0
    ):
        raise GroupError(
            f"open_actor_pool(start_timeout={start_timeout!r}): pass a positive number of "
            "seconds, or None to wait as long as it takes"
        )
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int | float) or not num_gpus >= 0:
        raise GroupError(
            f"open_actor_pool(num_gpus={num_gpus!r}): pass the GPUs each actor asks Ray for, a "
            "number of 0 or more (a fraction shares a GPU)"
        )
    if setup is not None and not is_async(setup):
        raise GroupError(
            f"open_actor_pool(setup={setup!r}): pass an async function that takes the worker "
            "('async def setup(worker)'), or None"
        )
    if max_replacements is not None and (
        isinstance(max_replacements, bool)
        or not isinstance(max_replacements, int)
        or max_replacements < 0
    ):
        raise GroupError(
            f"open_actor_pool(max_replacements={max_replacements!r}): pass a whole number of "
            "replacements, 0 or more (0: never replace an actor), or None for no bound"
        )
    for name, seconds in (
        ("health_check_period", health_check_period),
        ("health_check_timeout", health_check_timeout),
    ):
        check_seconds(name, seconds)
    # An actor that names any resource keeps one CPU for its whole life unless num_cpus says
    # otherwise (Ray's rule; without any, it asks for none): ask for none unless told.
    actor_options = {"num_gpus": num_gpus, "num_cpus": 0, **(actor_options or {})}
    starter = Starter(
        size, device, options or BackendOptions(), actor_options, start_timeout, setup
    )
    health = None
    if health_check_period is not None and health_check_timeout is not None:
        health = (float(health_check_period), float(health_check_timeout))
    return ActorPool(size, starter, max_replacements, health)


def _note_why_stopped(error: Exception, actor: PoolActor) -> None:
    """Add to a run's *error* why the pool stopped its *actor*, when the error is the actor's
    end and the pool took it out for another reason (a health check it did not answer)."""
    why = actor.out_of_service
    if why is not None and failure_of(error) not in (None, why):
        error.add_note(f"actor {actor.slot} of the pool was taken out and stopped: {why}")


class ActorPool(AsyncResource):
    """Ray actors with a backend each; :meth:`run` sends a pipeline to the least busy one.

    Made by :func:`open_actor_pool`; open it with ``async with`` (or :meth:`open`).
    """

    def __init__(
        self,
        size: int,
        starter: Starter,
        max_replacements: int | None,
        health: tuple[float, float] | None = None,
    ) -> None:
        self._size = size
        self._starter = starter
        self._max_replacements = max_replacements
        self._health = health  # the health check's period and timeout, or None: none
        self._health_check: HealthCheck | None = None  # probing while the pool is open
        self._table: SlotTable | None = None  # made when the pool opens
        self._closing = False
        self._closed = False
        self._running: set[asyncio.Future[Any]] = set()
        self._changed: list[asyncio.Future[None]] = []  # woken when a slot changes state
        self._waiting = 0  # runs waiting for an actor
        self._replacing: set[asyncio.Task[None]] = set()

    async def open(self) -> ActorPool:
        """Start the actors, open their backends and run the setup on each.

        A pool that the cluster's live nodes can never hold (more GPUs, CPUs, memory or custom
        resources than they have, counting that each actor takes its share from one node) is
        refused at once, before any actor starts, unless ``actor_options`` gives a
        ``scheduling_strategy`` (a placement group, say), which this check does not model. On
        any error, every actor started is stopped.

        Raises:
            GroupError: the pool was opened before, or the cluster can never hold it (the
                message says what it has).
            StartTimeoutError: the actors did not all start within ``start_timeout`` (taken by
                other work, or slow to start); the message says what Ray reports free.
            Exception: what an actor raised while opening its backend, or the setup raised.
        """
        if self._table is not None or self._closing:
            raise GroupError("a pool opens once; make another with open_actor_pool()")
        self._starter.refuse_what_cannot_fit()
        started = await self._starter.start(range(self._size))
        table = self._table = SlotTable(started, self._max_replacements)
        if self._health is not None:
            period, timeout = self._health
            check = self._health_check = HealthCheck(period, timeout, table.live, self._failed)
            check.start()
        return self

    def __len__(self) -> int:
        """Live actors (0 once closed)."""
        return 0 if self._table is None or self._closed else len(self._table.live())

    @property
    def infos(self) -> tuple[ActorInfo, ...]:
        """Where each live actor runs, in slot order; a replacement's says its ``generation``
        and why the actor before it was ``replaced``."""
        return () if self._table is None else tuple(a.info for a in self._table.live())

    @property
    def in_flight(self) -> tuple[int, ...]:
        """Runs in flight on each slot's actor (the failed one's, while it is replaced)."""
        return () if self._table is None else self._table.in_flight()

    def snapshot(self) -> PoolSnapshot:
        """The pool's slots, replacements and runs, frozen."""
        if self._table is None:
            left = self._max_replacements
            return PoolSnapshot(
                size=self._size,
                live=0,
                replacing=0,
                gone=0,
                in_flight=0,
                waiting=0,
                runs_ok=0,
                runs_failed=0,
                max_replacements=left,
                replacements_left=left,
                slots=(),
                replacements=(),
            )
        return self._table.snapshot(self._waiting)

    async def run(self, pipeline: Pipeline, *args: Any, **kwargs: Any) -> Any:
        """``await pipeline(worker, *args, **kwargs)`` on the live actor with the fewest runs
        in flight (equals take turns); its result.

        The pipeline, its arguments and its result travel through Ray (pickled). Cancelling
        the caller stops its wait, not the run, which the pool still counts until it ends.
        While no actor is live and a replacement is starting, the run waits for it.

        Raises:
            BackendClosedError: the pool is closing or closed.
            GroupError: the pool is not open; or no actor is live and none is coming
                (``max_replacements`` is spent).
            NotPicklableError: the arguments or the result held a resident buffer.
            DeviceFaultError: the actor's backend failed (the actor is replaced).
            ray.exceptions.RayActorError: the actor's process died (the actor is replaced).
            Exception: what the pipeline raised (Ray's error, an instance of its class too).
        """
        return await self.run_on(None, pipeline, *args, **kwargs)

    async def run_on(self, index: int | None, pipeline: Pipeline, *args: Any, **kwargs: Any) -> Any:
        """Like :meth:`run`, on the actor of slot *index* (its ``worker.state`` is that
        actor's); while that slot's actor is being replaced, the run waits for the new one.

        Raises:
            GroupError: there is no slot *index*, or its actor failed and was not replaced.
            ArgumentTypeError: *pipeline* is not an async function (checked before anything
                is sent).
        """
        name = getattr(pipeline, "__qualname__", repr(pipeline))
        if not is_async(pipeline):
            raise ArgumentTypeError(
                f"pool.run({name}, ...): a pipeline is an async function, "
                "'async def pipeline(worker, ...)', awaited on the actor's event loop; got "
                f"{type(pipeline).__name__} {name}"
            )
        actor = await self._actor_for(index)
        with buffers_refused(
            TypeError,
            f"pool.run({name}, ...) got a resident buffer among its arguments; it lives on a "
            "backend of this process, not on the actors': pass its contents ('await "
            "backend.download(buffer)'), and upload them inside the pipeline if need be",
        ):
            ref = actor.handle.run.remote(pipeline, *args, **kwargs)
        future: asyncio.Future[Any] = asyncio.wrap_future(ref.future())
        actor.sent()
        self._running.add(future)
        future.add_done_callback(functools.partial(self._finished, actor, time.monotonic()))
        with buffers_refused(
            Exception,
            f"pipeline {name} on actor {actor.slot} sent a resident buffer out of the actor (in "
            "its result, say); a resident buffer lives on its actor's backend: return 'await "
            "worker.backend.download(buffer)' from the pipeline instead, or keep the buffer in "
            "worker.state",
        ):
            try:
                return await asyncio.shield(future)
            except Exception as exc:
                _note_why_stopped(exc, actor)
                raise

    async def broadcast(self, pipeline: Pipeline, *args: Any, **kwargs: Any) -> list[Any]:
        """Run *pipeline* on every actor at once (to load state into each); the results in
        slot order.

        A slot being replaced runs it on its new actor, once started; a slot left empty (past
        ``max_replacements``) is skipped. A later replacement does not run it again: state
        every actor needs belongs in the pool's ``setup``.

        Raises:
            GroupError: no actor is live and none is coming; or a slot it waited for was left
                empty.
            Exception: what :meth:`run_on` raises, for the first slot that failed.
        """
        table = self._open_table()
        slots = table.reachable()
        if not slots:
            table.choose(None)  # raises: no actor is live, and none is coming
        return list(
            await asyncio.gather(*(self.run_on(i, pipeline, *args, **kwargs) for i in slots))
        )

    async def wait_healed(self) -> PoolSnapshot:
        """Wait until no replacement is under way (every slot live, or left empty past
        ``max_replacements``); the pool's snapshot then."""
        await asyncio.sleep(0)
        while self._table is not None and not self._table.is_settled():
            await self._wait_for_change()
        return self.snapshot()

    def _open_table(self) -> SlotTable:
        if self._closing:
            raise BackendClosedError("the actor pool is closing; it takes no new runs")
        if self._table is None:
            raise GroupError("the pool is not open; use 'async with open_actor_pool(...)'")
        return self._table

    async def _actor_for(self, index: int | None) -> PoolActor:
        """The actor a run goes to; waits while the one it needs is being replaced."""
        while (actor := self._open_table().choose(index)) is None:
            self._waiting += 1
            try:
                await self._wait_for_change()
            finally:
                self._waiting -= 1
        return actor

    async def _wait_for_change(self) -> None:
        """Park until a slot changes state (or the pool closes); leaves the line if cancelled."""
        waiter = asyncio.get_running_loop().create_future()
        self._changed.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._changed:
                self._changed.remove(waiter)

    def _failed(self, event: Failed) -> None:
        """A health check found an actor out of service."""
        if self._table is not None and not self._closing:
            self._apply(self._table.advance(event))

    def _finished(self, actor: PoolActor, sent: float, done: asyncio.Future[Any]) -> None:
        """A run's done callback: count it, and take its actor out if its error says so."""
        self._running.discard(done)
        retrieve(done)
        error = None if done.cancelled() else done.exception()
        reason = None if error is None else failure_of(error)
        actor.finished(ok=not done.cancelled() and error is None, lost=reason is not None)
        if reason is not None and self._table is not None:
            self._apply(self._table.advance(Failed(actor, reason, time.monotonic() - sent)))

    def _apply(self, effects: Effects) -> None:
        """Carry out what the slot table decided."""
        import ray

        for handle in effects.kills:
            ray.kill(handle)
        for level, event, fields in effects.logs:
            getattr(logger, level)(event, **fields)
        for start in effects.starts:
            task = asyncio.get_running_loop().create_task(self._replace(start))
            self._replacing.add(task)
            task.add_done_callback(self._replacing.discard)
        if effects.wake:
            changed, self._changed = self._changed, []
            for waiter in changed:
                if not waiter.done():
                    waiter.set_result(None)

    async def _replace(self, start: Start) -> None:
        """Start a new actor for a slot, the failed one drained and stopped first; tell the
        table how it went."""
        import ray

        if start.failed is not None:
            if start.drain:
                await start.failed.wait_idle(DRAIN_SECONDS)
            ray.kill(start.failed.handle)
        event: Started | StartFailed
        try:
            [(handle, info)] = await self._starter.start([start.slot], start.generation)
        except Exception as exc:  # any failure to start is the replacement's outcome
            event = StartFailed(start.slot, describe(exc))
        else:
            event = Started(start.slot, PoolActor(start.slot, start.generation, handle, info))
        if self._table is not None:
            self._apply(self._table.advance(event))

    async def aclose(self) -> None:
        """Refuse new runs, stop the replacements under way, let the runs in flight finish,
        close every live actor's backend, stop the actors. Idempotent.

        Runs waiting for a replacement fail with :class:`BackendClosedError`.
        """
        import ray

        self._closing = True
        if self._health_check is not None:
            await self._health_check.stop()
        table = self._table
        if table is not None:
            self._apply(table.advance(Closing()))
        replacing = list(self._replacing)
        for task in replacing:
            task.cancel()
        if replacing:
            await asyncio.wait(replacing)
        if self._running:
            await asyncio.wait(list(self._running))
        if table is None or self._closed:
            return
        self._closed = True
        try:
            closed = await asyncio.gather(
                *(actor.handle.close.remote() for actor in table.live()), return_exceptions=True
            )
        finally:
            for handle in table.handles():
                ray.kill(handle)
        for result in closed:
            # An actor that died, or whose backend failed, since its last run has nothing to
            # close; anything else is the close's own error.
            if isinstance(result, Exception) and failure_of(result) is None:
                raise result

    async def __aenter__(self) -> ActorPool:
        return await self.open()

    def __repr__(self) -> str:
        if self._table is None:
            return f"<ActorPool {'closed' if self._closing else 'not open'} [{self._size} actors]>"
        live, replacing, gone = self._table.counts()
        return (
            f"<ActorPool {'closed' if self._closing else 'open'} [actors: {live} live, "
            f"{replacing} replacing, {gone} gone | runs: {sum(self._table.in_flight())} in "
            f"flight, {self._waiting} waiting]>"
        )
