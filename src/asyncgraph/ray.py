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
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import attrs

from ._backend import Backend
from ._exceptions import BackendClosedError, GroupError
from ._open import open_backend
from ._options import BackendOptions

__all__ = ("ActorInfo", "ActorPool", "Worker", "open_actor_pool")

Pipeline = Callable[..., Awaitable[Any]]


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

    Raises:
        GroupError: *size* is not a positive int.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise GroupError(f"open_actor_pool({size!r}): pass a positive number of actors")
    return ActorPool(size, device, num_gpus, options or BackendOptions(), dict(actor_options or {}))


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
    ) -> None:
        self._size = size
        self._device = device
        self._actor_options = {"num_gpus": num_gpus, **actor_options}
        self._options = options
        self._actors: list[Any] = []
        self._busy: list[int] = []  # runs sent to each actor and not finished
        self._running: set[asyncio.Future[Any]] = set()
        self._turn = 0
        self._closing = False
        self.infos: tuple[ActorInfo, ...] = ()

    async def open(self) -> ActorPool:
        """Start the actors and open their backends.

        Raises:
            GroupError: the pool was opened before.
            Exception: what an actor raised while opening its backend; every actor is stopped.
        """
        import ray

        if self._actors or self._closing:
            raise GroupError("a pool opens once; make another with open_actor_pool()")
        remote: Any = ray.remote(BackendActor).options(**self._actor_options)
        actors: list[Any] = [remote.remote(i) for i in range(self._size)]
        try:
            infos = await asyncio.gather(
                *(a.start.remote(self._device, self._options) for a in actors)
            )
        except BaseException:
            for actor in actors:
                ray.kill(actor)
            raise
        self._actors = actors
        self._busy = [0] * len(actors)
        self.infos = tuple(infos)
        return self

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
        ref = self._actors[index].run.remote(pipeline, *args, **kwargs)
        future: asyncio.Future[Any] = asyncio.wrap_future(ref.future())
        self._busy[index] += 1
        self._running.add(future)

        def finished(done: asyncio.Future[Any], index: int = index) -> None:
            self._busy[index] -= 1
            self._running.discard(done)
            if not done.cancelled():
                done.exception()  # retrieved: a caller that left does not leave it unread

        future.add_done_callback(finished)
        return await asyncio.shield(future)

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
