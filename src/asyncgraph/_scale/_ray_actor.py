"""The actor side of ``asyncgraph.ray``: what runs in each actor's process, and what its errors say.

:class:`BackendActor` opens a backend on the actor's event loop and runs pipelines on it with a
:class:`Worker`. When its backend has failed, a run fails with a :class:`DeviceFaultError` (the
pipeline's own error chained to it, if it raised another), so that the pool can tell from the
error alone that the actor is out of service: :func:`failure_of` reads it, and a Ray error that
says the actor's process died. Any other error is the run's own. :func:`buffers_refused` tells
a resident buffer that tried to travel with a run from Ray's error for it, and :func:`is_async`
what a pipeline must be.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from asyncgraph._opening._open import open_backend
from asyncgraph._runtime._exceptions import BackendClosedError, DeviceFaultError, NotPicklableError

if TYPE_CHECKING:
    from asyncgraph._front._backend import Backend
    from asyncgraph._front._options import BackendOptions

__all__ = (
    "ActorInfo",
    "BackendActor",
    "Pipeline",
    "Worker",
    "buffers_refused",
    "describe",
    "failure_of",
    "is_async",
)

Pipeline = Callable[..., Awaitable[Any]]


@attrs.frozen
class ActorInfo:
    """Where one actor of a pool runs.

    Attributes:
        index: its slot in the pool (a replacement takes the slot of the actor it replaces).
        pid: its process.
        gpu_ids: the GPUs Ray gave it (``ray.get_gpu_ids()``).
        cuda_visible_devices: ``CUDA_VISIBLE_DEVICES`` in its process, as Ray set it.
        backend: its backend's name (``"cuda:0"``: the first GPU it can see).
        pci_bus_id: the PCI bus id of its backend's GPU; ``None`` for a host backend.
        generation: how many actors were started for its slot before it (0 for the pool's
            first; a replacement that failed to start counts).
        replaced: why the actor before it in its slot was replaced (``"its process died:
            ..."``); ``None`` for the pool's first actors.
        node_id: the Ray node it runs on (``ray.get_runtime_context().get_node_id()``, as
            ``ray.nodes()`` names it), so that a pool's spread over a cluster shows.
    """

    index: int
    pid: int
    gpu_ids: tuple[Any, ...]
    cuda_visible_devices: str | None
    backend: str
    pci_bus_id: str | None = None
    generation: int = 0
    replaced: str | None = None
    node_id: str | None = None


@attrs.define
class Worker:
    """What a pipeline gets as its first argument, on the actor that runs it.

    Attributes:
        backend: the actor's backend, open on the actor's event loop.
        state: a dict kept on the actor between runs (resident buffers, loaded weights).
        index: the actor's slot in the pool.
        generation: how many actors were started for the slot before this one (0 for the
            pool's first).
    """

    backend: Backend
    state: dict[str, Any]
    index: int
    generation: int = 0


class BackendActor:
    """The actor: a backend opened on the actor's event loop, and the pipelines run on it.

    Made remote by :func:`~asyncgraph.ray.open_actor_pool`; not used directly.
    """

    def __init__(self, index: int, generation: int = 0) -> None:
        self._index = index
        self._generation = generation
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
            generation=self._generation,
            node_id=ray.get_runtime_context().get_node_id(),
        )

    async def check_health(self) -> DeviceFaultError | None:
        """The pool's health check: answered on the actor's event loop (a loop that does not
        turn does not answer); the fault that failed its backend, or ``None``."""
        backend = self._backend
        return None if backend is None else backend.failure

    async def run(self, pipeline: Pipeline, *args: Any, **kwargs: Any) -> Any:
        """``await pipeline(worker, *args, **kwargs)`` with this actor's backend.

        The arguments come as Ray's own top-level arguments, so Ray passes large arrays
        through its object store instead of pickling them into the call.

        Raises:
            BackendClosedError: the actor's backend is closed.
            DeviceFaultError: the backend has failed (a device fault): the pipeline's own
                error, if it was one, else a new one for the backend's failure, the pipeline's
                error chained to it.
            Exception: what the pipeline raised.
        """
        backend = self._backend
        if backend is None or backend.is_closed:
            raise BackendClosedError(f"actor {self._index} of the pool is closed")
        worker = Worker(backend, self._state, self._index, self._generation)
        try:
            return await pipeline(worker, *args, **kwargs)
        except DeviceFaultError:
            raise
        except Exception as exc:
            if (failure := backend.failure) is None:
                raise
            raise DeviceFaultError(
                failure.code,
                failure.name,
                failure.call,
                f"the backend of actor {self._index} failed, and the pipeline raised "
                f"{type(exc).__name__}: {exc}",
            ) from exc

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
    from cuda.bindings import driver as drv

    from asyncgraph._cuda.driver._driver import check

    device = check(drv.cuDeviceGet(int(name.partition(":")[2])), "cuDeviceGet")
    bus = check(drv.cuDeviceGetPCIBusId(32, device), "cuDeviceGetPCIBusId")
    return bytes(bus).split(b"\0")[0].decode().strip()


def describe(error: BaseException) -> str:
    """``"DeviceFaultError: cuLaunchKernel failed with ..."``: an error's class and the first
    line of its message, Ray's own wrapping (``RayTaskError``) taken off."""
    cause = getattr(error, "cause", None)
    shown = cause if isinstance(cause, BaseException) else error
    first = str(shown).strip().partition("\n")[0]
    return f"{type(shown).__name__}: {first}" if first else type(shown).__name__


def failure_of(error: BaseException) -> str | None:
    """Why the actor that ran a run is out of service, if the run's *error* says so; ``None``
    for a run's own failure.

    An actor is out of service when its process died or cannot be reached (Ray's
    ``RayActorError``, raised by Ray itself: not one a pipeline raised, which comes wrapped in
    a ``RayTaskError``), or when its backend failed (a :class:`DeviceFaultError`: a sticky
    fault ruins every CUDA context of the process).
    """
    from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

    if isinstance(error, RayActorError) and not isinstance(error, RayTaskError):
        how = "cannot be reached" if isinstance(error, ActorUnavailableError) else "died"
        return f"its process {how}: {describe(error)}"
    if isinstance(error, DeviceFaultError):
        return f"its backend failed: {describe(error)}"
    return None


def is_async(fn: object) -> bool:
    """Whether *fn* is an async function: ``async def``, a ``functools.partial`` of one, or an
    object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004  # an async __call__, not callable()
    )


def _not_picklable(exc: BaseException) -> NotPicklableError | None:
    """The :class:`NotPicklableError` behind Ray's error *exc*, if that is what it wraps: an
    actor's result that held a resident buffer (``RayTaskError.cause``), or an argument that
    did (Ray's ``TypeError``, chained)."""
    cause = getattr(exc, "cause", None) or exc.__cause__
    return cause if isinstance(cause, NotPicklableError) else None


@contextlib.contextmanager
def buffers_refused(caught: type[Exception], message: str) -> Iterator[None]:
    """Raise :class:`NotPicklableError` with *message* for a *caught* error of Ray's that one
    wraps (a resident buffer went to or came from an actor); let any other through."""
    try:
        yield
    except caught as exc:
        if (buffer_error := _not_picklable(exc)) is None:
            raise
        raise NotPicklableError(message) from buffer_error
