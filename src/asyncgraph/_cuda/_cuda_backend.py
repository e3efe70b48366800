"""CudaBackend: the front composed with the CUDA engine, and the CUDA-only extras."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncgraph._cuda.driver._events import EventStatistics
from asyncgraph._front._backend import Backend

from ._cuda_engine import CudaEngine

if TYPE_CHECKING:
    from asyncgraph._front._engine_protocols import Links
    from asyncgraph._front._options import BackendOptions
    from asyncgraph.capture._cache import GraphCache
    from asyncgraph.capture._guard import CaptureLock
    from asyncgraph.pool import HostPool, StreamOrderedDeviceMemory, StreamPool

__all__ = ("CudaBackend",)


class CudaBackend(Backend):
    """Runs kernels on one CUDA device.

    Made by ``open_backend("cuda" | "cuda:N" | N)`` (or ``"auto"`` with a GPU); no public
    constructor. Everything a backend does is :class:`~asyncgraph.Backend`'s; this adds what only
    a CUDA device has.

    Attributes:
        arch: the device's architecture, e.g. ``"sm_90"``.
        device_name: the device's name, e.g. ``"NVIDIA H100 80GB HBM3"``.
    """

    def __init__(self, ordinal: int, options: BackendOptions) -> None:
        engines: list[CudaEngine] = []  # the one the front makes, kept for the extras below

        def make(links: Links) -> CudaEngine:
            engines.append(CudaEngine(ordinal, options, links))
            return engines[0]

        super().__init__(f"cuda:{ordinal}", options, make)
        self._cuda = engines[0]
        self.arch = self._cuda.device.arch
        self.device_name = self._cuda.device.name

    @property
    def pinned_pool(self) -> HostPool:
        """The pinned host pool staging this backend's transfers."""
        return self._cuda.device.pinned

    @property
    def device_memory(self) -> StreamOrderedDeviceMemory:
        """The stream-ordered device memory of this backend's dispatches."""
        return self._cuda.device.memory

    @property
    def stream_pool(self) -> StreamPool[Any]:
        """The streams dispatches are placed on."""
        return self._cuda.device.stream_pool

    def event_statistics(self) -> EventStatistics:
        """How many CUDA events the backend created, and how many are back in its pools."""
        device = self._cuda.device
        return EventStatistics(
            created=device.events.created,
            idle=len(device.events.idle),
            timing_created=device.timing_events.created,
            timing_idle=len(device.timing_events.idle),
        )

    @property
    def capture_lock(self) -> CaptureLock:
        """The lock that lets one capture at a time run on this backend."""
        return self._cuda.graphs.lock

    @property
    def graph_cache(self) -> GraphCache:
        """The cache of recorded graphs behind ``dispatch(..., graph="auto")``."""
        return self._cuda.graphs.cache
