"""Starting the actors of ``asyncgraph.ray``: what they ask Ray for, and whether they came.

:class:`Starter` knows how the pool's actors are made (the same Ray options and resources for
every one, the first ones and each replacement alike), refuses a pool the cluster can never
hold, starts actors within the pool's ``start_timeout`` (saying what Ray reports free when they
do not come, or that the cluster can no longer hold the pool when a node left) and runs the
pool's setup pipeline on each before it takes runs. An actor that
fails to start, or whose start is cancelled, is stopped before the error goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from asyncgraph._runtime._exceptions import GroupError, StartTimeoutError

from ._ray_actor import ActorInfo, BackendActor, Pipeline

if TYPE_CHECKING:
    from asyncgraph._front._options import BackendOptions

__all__ = ("Resources", "Starter", "retrieve")

Resources = dict[str, float]  # Ray's resources by name: "GPU", "CPU", "memory", custom ones


def retrieve(future: asyncio.Future[Any]) -> None:
    """A done callback: marks the future's exception retrieved (a caller that left, or an
    actor stopped while it started, leaves none unread)."""
    if not future.cancelled():
        future.exception()


def _demand(actor_options: dict[str, Any]) -> Resources:
    """What Ray holds for each actor while it lives, by resource name (the pool asks for no
    CPU unless ``num_cpus`` says so: ``open_actor_pool``)."""
    asked = {
        "GPU": actor_options.get("num_gpus"),
        "CPU": actor_options.get("num_cpus"),
        "memory": actor_options.get("memory"),
        **(actor_options.get("resources") or {}),
    }
    return {name: float(amount) for name, amount in asked.items() if amount}


def _amount(name: str, value: float) -> str:
    """``"2"``, or ``"1.5 GiB"`` for Ray's memory resources (counted in bytes)."""
    return f"{value / 2**30:.3g} GiB" if name in ("memory", "object_store_memory") else f"{value:g}"


def _amounts(resources: Resources, names: list[str]) -> str:
    """``"2 GPU, 1.5 GiB memory"``: *names* of *resources*, as Ray counts them."""
    return ", ".join(f"{_amount(n, resources.get(n, 0.0))} {n}" for n in names)


def _room(demand: Resources, nodes: list[Resources]) -> int:
    """How many actors asking for *demand* the *nodes* can hold (each from one node)."""
    return sum(
        min(int(have.get(name, 0.0) / amount + 1e-9) for name, amount in demand.items())
        for have in nodes
    )


def _nodes(count: int) -> str:
    return f"{count} node{'s' * (count != 1)}"


def _ray_resources() -> tuple[list[Resources], Resources, Resources]:
    """What Ray reports now: each live node's resources, the cluster's, and those free."""
    import ray

    api: Any = ray  # nodes(), cluster_resources() and available_resources() are unannotated
    nodes = [node["Resources"] for node in api.nodes() if node.get("Alive")]
    return nodes, api.cluster_resources(), api.available_resources()


class Starter:
    """Makes and starts the pool's actors, each asking Ray for the same resources.

    Args:
        size: the pool's actors.
        device: what each actor's backend opens.
        options: each backend's options.
        actor_options: Ray's actor options (``num_gpus`` included).
        start_timeout: seconds for actors to start and open their backends, or ``None``.
        setup: the pipeline each actor runs once started, before it takes runs, or ``None``.
    """

    def __init__(
        self,
        size: int,
        device: str | int,
        options: BackendOptions,
        actor_options: dict[str, Any],
        start_timeout: float | None,
        setup: Pipeline | None,
    ) -> None:
        self._size = size
        self._device = device
        self._options = options
        self._actor_options = actor_options
        self._start_timeout = start_timeout
        self._setup = setup
        self._demand = _demand(actor_options)
        self._remote: Any = None

    def _counted(self) -> bool:
        """Whether the fit of the pool is checked: it asks for resources, and places its actors
        by Ray's default (a ``scheduling_strategy``, a placement group say, is not modelled)."""
        return bool(self._demand) and "scheduling_strategy" not in self._actor_options

    def refuse_what_cannot_fit(self) -> None:
        """Raise :class:`GroupError` if the Ray cluster's live nodes can never hold the pool's
        actors (an actor's resources come from one node); no check where ``actor_options``
        gives a ``scheduling_strategy`` (a placement group, say), which it does not model."""
        if not self._counted():
            return
        demand, size = self._demand, self._size
        nodes, total, _ = _ray_resources()
        room = _room(demand, nodes)
        if room >= size:
            return
        names = list(demand)
        has = _amounts(total, names)
        fewer = f"open at most {room}, ask" if room else "ask"
        raise GroupError(
            f"open_actor_pool({size}) asks Ray for {size} actor{'s' * (size != 1)} of "
            f"{_amounts(demand, names)} each, "
            f"but its cluster has {has} on {_nodes(len(nodes))}, room "
            f"for {room or 'none'} of them; {fewer} less of each, or add nodes"
        )

    async def start(self, slots: Sequence[int], generation: int = 0) -> list[tuple[Any, ActorInfo]]:
        """New actors for *slots* (each of *generation*), started, set up: each actor's handle
        and :class:`ActorInfo`, in the order of *slots*.

        Raises:
            StartTimeoutError: they did not all start within ``start_timeout``.
            Exception: what an actor raised while opening its backend or running the setup.

            On any error, cancellation included, every actor made here is stopped.
        """
        import ray

        if self._remote is None:
            self._remote = ray.remote(BackendActor).options(**self._actor_options)
        actors: list[Any] = [self._remote.remote(slot, generation) for slot in slots]
        try:
            infos = await self._started(actors)
            if self._setup is not None:
                setups = [asyncio.wrap_future(a.run.remote(self._setup).future()) for a in actors]
                for setup in setups:
                    setup.add_done_callback(retrieve)
                await asyncio.gather(*setups)
        except BaseException:
            for actor in actors:
                ray.kill(actor)
            raise
        return list(zip(actors, infos, strict=True))

    async def _started(self, actors: list[Any]) -> list[ActorInfo]:
        """Each actor's :class:`ActorInfo`, once all started; the first error, or
        :class:`StartTimeoutError` at ``start_timeout``."""
        starts = [
            asyncio.wrap_future(a.start.remote(self._device, self._options).future())
            for a in actors
        ]
        for start in starts:
            start.add_done_callback(retrieve)
        _, waiting = await asyncio.wait(
            starts, timeout=self._start_timeout, return_when=asyncio.FIRST_EXCEPTION
        )
        for start in starts:
            if start.done() and (error := start.exception()) is not None:
                raise error
        if waiting:
            names = list(self._demand) or ["CPU"]
            nodes, total, now = _ray_resources()
            timeout = self._start_timeout or 0.0  # waiting is empty when there is no limit
            late = (
                f"{len(waiting)} of {len(actors)} actors of the pool did not start within "
                f"{timeout:g} s (start_timeout)"
            )
            if self._counted() and (room := _room(self._demand, nodes)) < self._size:
                has = {n: sum(node.get(n, 0.0) for node in nodes) for n in names}
                raise StartTimeoutError(
                    f"{late}: the cluster can no longer hold the pool (a node left, say), of "
                    f"{self._size} actors of {_amounts(self._demand, names)} each: its live "
                    f"nodes have {_amounts(has, names)} on {_nodes(len(nodes))}, room for "
                    f"{room or 'none'} of them; the actors that did not start were stopped. "
                    "Add nodes, or open a smaller pool"
                )
            free = ", ".join(
                f"{_amount(n, now.get(n, 0.0))} of {_amount(n, total.get(n, 0.0))} {n}"
                for n in names
            )
            raise StartTimeoutError(
                f"{late}; each asks for "
                f"{_amounts(self._demand, names)}, and Ray reports free now: {free}. Other "
                "actors or tasks hold what they need, or they are slow to start; the pool's "
                "actors were stopped. Free the resources, open fewer actors, or give a longer "
                "start_timeout"
            )
        return [start.result() for start in starts]
