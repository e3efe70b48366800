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
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import attrs

from ._backend import Backend
from ._exceptions import BackendClosedError, GroupError, NotPicklableError, StartTimeoutError
from ._open import open_backend
from ._options import BackendOptions

__all__ = ("ActorInfo", "ActorPool", "Worker", "open_actor_pool")

Pipeline = Callable[..., Awaitable[Any]]
Resources = dict[str, float]  # Ray's resources by name: "GPU", "CPU", "memory", custom ones


@attrs.frozen
class ActorInfo:
    """Where one actor of a pool runs.

    Attributes:
        index: its place in the pool.
        pid: its process.
        gpu_ids: the GPUs Ray gave it (``ray.get_gpu_ids()``).
        cuda_visible_devices: ``CUDA_VISIBLE_DEVICES`` in its process, as Ray set it.
        backend: its backend's name (``"cuda:0"``: the first GPU it can see).
        pci_bus_id: the PCI bus id of its backend's GPU; ``None`` for a host backend.
    """

    index: int
    pid: int
    gpu_ids: tuple[Any, ...]
    cuda_visible_devices: str | None
    backend: str
    pci_bus_id: str | None = None


@attrs.define
class Worker:
    """What a pipeline gets as its first argument, on the actor that runs it.

    Attributes:
        backend: the actor's backend, open on the actor's event loop.
        state: a dict kept on the actor between runs (resident buffers, loaded weights).
        index: the actor's place in the pool.
    """

    backend: Backend
    state: dict[str, Any]
    index: int


class BackendActor:
    """The actor: a backend opened on the actor's event loop, and the pipelines run on it.

    Made remote by :func:`open_actor_pool`; not used directly.
    """

    def __init__(self, index: int) -> None:
        self._index = index
        self._backend: Backend | None = None
        self._state: dict[str, Any] = {}

    async def start(self, device: str | int, options: BackendOptions) -> ActorInfo:
        """Open the backend on this actor's loop; where the actor runs."""
        import ray

        backend = self._backend = open_backend(device, options=options)
        return ActorInfo(
            index=self._index,
            pid=os.getpid(),
            gpu_ids=tuple(ray.get_gpu_ids()),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            backend=backend.name,
            pci_bus_id=_pci_bus_id(backend.name),
        )

    async def run(self, pipeline: Pipeline, *args: Any, **kwargs: Any) -> Any:
        """``await pipeline(worker, *args, **kwargs)`` with this actor's backend.

        The arguments come as Ray's own top-level arguments, so Ray passes large arrays
        through its object store instead of pickling them into the call."""
        if self._backend is None or self._backend.is_closed:
            raise BackendClosedError(f"actor {self._index} of the pool is closed")
        return await pipeline(Worker(self._backend, self._state, self._index), *args, **kwargs)

    async def close(self) -> int:
        """Close the backend (its work in flight finishes first); its dispatch count."""
        backend, self._backend = self._backend, None
        self._state.clear()
        if backend is None:
            return 0
        await backend.aclose()
        return backend.telemetry.snapshot().dispatches


def _pci_bus_id(name: str) -> str | None:
    """The PCI bus id of CUDA backend *name*'s GPU (``"cuda:N"``), else ``None``."""
    if not name.startswith("cuda:"):
        return None
    from cuda.core import Device

    return str(Device(int(name.partition(":")[2])).pci_bus_id)


def open_actor_pool(
    size: int,
    *,
    device: str | int = "auto",
    num_gpus: float = 1,
    options: BackendOptions | None = None,
    actor_options: dict[str, Any] | None = None,
    start_timeout: float | None = 60.0,
) -> ActorPool:
    """A pool of *size* Ray actors, each with a backend on *device*, opened by ``async with``.

    Ray must be initialised first (``ray.init()``); each actor asks Ray for *num_gpus* GPUs,
    so Ray sets its ``CUDA_VISIBLE_DEVICES`` and ``device="cuda"`` is the GPU it was given.

    Args:
        size: how many actors (one per GPU, usually).
        device: what each actor's backend opens (``open_backend``'s argument).
        num_gpus: GPUs each actor asks Ray for.
        options: each backend's :class:`BackendOptions`.
        actor_options: more of Ray's actor options (``num_cpus``, ``resources``, ...).
        start_timeout: seconds for every actor to start and open its backend (``None``: no
            limit); see :meth:`ActorPool.open`.

    Raises:
        GroupError: *size* is not a positive int, or *start_timeout* not a positive number.
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
    return ActorPool(
        size, device, num_gpus, options or BackendOptions(), dict(actor_options or {}),
        start_timeout,
    )  # fmt: skip


def _demand(actor_options: dict[str, Any]) -> Resources:
    """What Ray holds for each actor while it lives, by resource name (an actor asks for no
    CPU unless ``num_cpus`` says so)."""
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


def _ray_resources() -> tuple[list[Resources], Resources, Resources]:
    """What Ray reports now: each live node's resources, the cluster's, and those free."""
    import ray

    api: Any = ray  # nodes(), cluster_resources() and available_resources() are unannotated
    nodes = [node["Resources"] for node in api.nodes() if node.get("Alive")]
    return nodes, api.cluster_resources(), api.available_resources()


def _refuse_what_cannot_fit(size: int, demand: Resources) -> None:
    """Raise :class:`GroupError` if the Ray cluster's live nodes can never hold *size* actors
    asking for *demand* each (an actor's resources come from one node)."""
    if not demand:
        return
    nodes, total, _ = _ray_resources()
    room = sum(
        min(int(have.get(name, 0.0) / amount + 1e-9) for name, amount in demand.items())
        for have in nodes
    )
    if room >= size:
        return
    names = list(demand)
    has = _amounts(total, names)
    fewer = f"open at most {room}, ask" if room else "ask"
    raise GroupError(
        f"open_actor_pool({size}) asks Ray for {size} actor{'s' * (size != 1)} of "
        f"{_amounts(demand, names)} each, "
        f"but its cluster has {has} on {len(nodes)} node{'s' * (len(nodes) != 1)}, room for "
        f"{room or 'none'} of them; {fewer} less of each, or add nodes"
    )


def _retrieve(future: asyncio.Future[Any]) -> None:
    """A done callback: marks the future's exception retrieved (a caller that left, or an
    actor stopped while it started, leaves none unread)."""
    if not future.cancelled():
        future.exception()


def _not_picklable(exc: BaseException) -> NotPicklableError | None:
    """The :class:`NotPicklableError` behind Ray's error *exc*, if that is what it wraps: an
    actor's result that held a resident buffer (``RayTaskError.cause``), or an argument that
    did (Ray's ``TypeError``, chained)."""
    cause = getattr(exc, "cause", None) or exc.__cause__
    return cause if isinstance(cause, NotPicklableError) else None


class ActorPool:
    """Ray actors with a backend each; :meth:`run` sends a pipeline to the least busy one.

    Made by :func:`open_actor_pool`; open it with ``async with`` (or :meth:`open`).
    """

    def __init__(
        self,
        size: int,
        device: str | int,
        num_gpus: float,
        options: BackendOptions,
        actor_options: dict[str, Any],
        start_timeout: float | None = 60.0,
    ) -> None:
        self._size = size
        self._device = device
        self._actor_options = {"num_gpus": num_gpus, **actor_options}
        self._options = options
        self._start_timeout = start_timeout
        self._actors: list[Any] = []
        self._busy: list[int] = []  # runs sent to each actor and not finished
        self._running: set[asyncio.Future[Any]] = set()
        self._turn = 0
        self._closing = False
        self.infos: tuple[ActorInfo, ...] = ()

    async def open(self) -> ActorPool:
        """Start the actors and open their backends.

        A pool that the cluster's live nodes can never hold (more GPUs, CPUs, memory or custom
        resources than they have, counting that each actor takes its share from one node) is
        refused at once, before any actor starts, unless ``actor_options`` gives a
        ``scheduling_strategy`` (a placement group, say), which this check does not model.

        Raises:
            GroupError: the pool was opened before, or the cluster can never hold it (the
                message says what it has).
            StartTimeoutError: the actors did not all start within ``start_timeout`` (taken by
                other work, or slow to start); the message says what Ray reports free.
            Exception: what an actor raised while opening its backend.

            On any error, every actor started is stopped.
        """
        import ray

        if self._actors or self._closing:
            raise GroupError("a pool opens once; make another with open_actor_pool()")
        demand = _demand(self._actor_options)
        if "scheduling_strategy" not in self._actor_options:
            _refuse_what_cannot_fit(self._size, demand)
        remote: Any = ray.remote(BackendActor).options(**self._actor_options)
        actors: list[Any] = [remote.remote(i) for i in range(self._size)]
        try:
            infos = await self._start(actors, demand)
        except BaseException:
            for actor in actors:
                ray.kill(actor)
            raise
        self._actors = actors
        self._busy = [0] * len(actors)
        self.infos = tuple(infos)
        return self

    async def _start(self, actors: list[Any], demand: Resources) -> list[ActorInfo]:
        """Each actor's :class:`ActorInfo`, once all started; the first error, or
        :class:`StartTimeoutError` at ``start_timeout``."""
        starts = [
            asyncio.wrap_future(a.start.remote(self._device, self._options).future())
            for a in actors
        ]
        for start in starts:
            start.add_done_callback(_retrieve)
        _, waiting = await asyncio.wait(
            starts, timeout=self._start_timeout, return_when=asyncio.FIRST_EXCEPTION
        )
        for start in starts:
            if start.done() and (error := start.exception()) is not None:
                raise error
        if waiting:
            names = list(demand) or ["CPU"]
            _, total, now = _ray_resources()
            free = ", ".join(
                f"{_amount(n, now.get(n, 0.0))} of {_amount(n, total.get(n, 0.0))} {n}"
                for n in names
            )
            raise StartTimeoutError(
                f"{len(waiting)} of {len(actors)} actors of the pool did not start within "
                f"{self._start_timeout:g} s (start_timeout); each asks for "
                f"{_amounts(demand, names)}, and Ray reports free now: {free}. Other actors or "
                "tasks hold what they need, or they are slow to start; the pool's actors were "
                "stopped. Free the resources, open fewer actors, or give a longer start_timeout"
            )
        return [start.result() for start in starts]

    def __len__(self) -> int:
        return len(self._actors)

    def _pick(self) -> int:
        n = len(self._actors)
        best = self._turn % n
        for k in range(1, n):
            i = (self._turn + k) % n
            if self._busy[i] < self._busy[best]:
                best = i
        self._turn = best + 1
        return best

    async def run(self, pipeline: Pipeline, *args: Any, **kwargs: Any) -> Any:
        """``await pipeline(worker, *args, **kwargs)`` on the actor with the fewest runs in
        flight (equals take turns); its result.

        The pipeline, its arguments and its result travel through Ray (pickled). Cancelling
        the caller stops its wait, not the run, which the pool still counts until it ends.

        Raises:
            BackendClosedError: the pool is closing or closed.
            GroupError: the pool is not open.
            NotPicklableError: the arguments or the result held a resident buffer.
            Exception: what the pipeline raised (Ray's error, an instance of its class too).
        """
        return await self.run_on(None, pipeline, *args, **kwargs)

    async def run_on(self, index: int | None, pipeline: Pipeline, *args: Any, **kwargs: Any) -> Any:
        """Like :meth:`run`, on actor *index* (its ``worker.state`` is that actor's)."""
        if self._closing:
            raise BackendClosedError("the actor pool is closing; it takes no new runs")
        if not self._actors:
            raise GroupError("the pool is not open; use 'async with open_actor_pool(...)'")
        if index is None:
            index = self._pick()
        elif not 0 <= index < len(self._actors):
            raise GroupError(f"actor {index} of a pool of {len(self._actors)}")
        name = getattr(pipeline, "__qualname__", repr(pipeline))
        try:
            ref = self._actors[index].run.remote(pipeline, *args, **kwargs)
        except TypeError as exc:
            if (buffer_error := _not_picklable(exc)) is None:
                raise
            raise NotPicklableError(
                f"pool.run({name}, ...) got a resident buffer among its arguments; it lives on "
                "a backend of this process, not on the actors': pass its contents ('await "
                "backend.download(buffer)'), and upload them inside the pipeline if need be"
            ) from buffer_error
        future: asyncio.Future[Any] = asyncio.wrap_future(ref.future())
        self._busy[index] += 1
        self._running.add(future)

        def finished(done: asyncio.Future[Any], index: int = index) -> None:
            self._busy[index] -= 1
            self._running.discard(done)
            _retrieve(done)

        future.add_done_callback(finished)
        try:
            return await asyncio.shield(future)
        except Exception as exc:
            if (buffer_error := _not_picklable(exc)) is None:
                raise
            raise NotPicklableError(
                f"pipeline {name} on actor {index} sent a resident buffer out of the actor (in "
                "its result, say); a resident buffer lives on its actor's backend: return "
                "'await worker.backend.download(buffer)' from the pipeline instead, or keep the "
                "buffer in worker.state"
            ) from buffer_error

    async def broadcast(self, pipeline: Pipeline, *args: Any, **kwargs: Any) -> list[Any]:
        """Run *pipeline* on every actor at once (to load state into each); the results in
        actor order."""
        return list(
            await asyncio.gather(
                *(self.run_on(i, pipeline, *args, **kwargs) for i in range(len(self._actors)))
            )
        )

    @property
    def in_flight(self) -> tuple[int, ...]:
        """Runs in flight on each actor."""
        return tuple(self._busy)

    async def aclose(self) -> None:
        """Refuse new runs, let those in flight finish, close every backend, stop the actors.
        Idempotent."""
        import ray

        self._closing = True
        if self._running:
            await asyncio.wait(list(self._running))
        actors, self._actors = self._actors, []
        try:
            await asyncio.gather(*(a.close.remote() for a in actors))
        finally:
            for actor in actors:
                ray.kill(actor)

    async def __aenter__(self) -> ActorPool:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "closed" if self._closing else ("open" if self._actors else "not open")
        return f"<ActorPool {len(self._actors) or self._size} actors {state}>"
