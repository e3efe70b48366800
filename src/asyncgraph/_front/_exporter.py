"""The resident store's :class:`~asyncgraph._buffers._resident.Exporter` for a backend.

DLPack and ``__cuda_array_interface__`` ask the backend where a buffer lives and how to order
after its uses; the engine answers, and releases come back on the backend's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncgraph._front._engine_protocols import Engine

    from .._buffers._resident import ResidentBuffer

__all__ = ("EngineExporter",)


class EngineExporter:
    """What resident buffers shared with other libraries ask of their backend.

    Args:
        engine: answers where memory lives and how to order after its uses (its exports).
        loop: the backend's loop now (``None`` before it is first used).
    """

    __slots__ = ("_engine", "_loop")

    def __init__(
        self, engine: Engine[Any], loop: Callable[[], asyncio.AbstractEventLoop | None]
    ) -> None:
        self._engine = engine
        self._loop = loop

    def export_device(self) -> tuple[int, int]:
        """See :meth:`Exporter.export_device`; the engine answers."""
        return self._engine.export_device()

    def export_pointer(self, storage: Any) -> int:
        """See :meth:`Exporter.export_pointer`; the engine answers."""
        return self._engine.storage_pointer(storage)

    def export_wait(self, buffer: ResidentBuffer, stream: int | None) -> None:
        """See :meth:`Exporter.export_wait`; the engine orders.

        Raises:
            BufferError: there is nothing to order after yet, or no stream to order on.
        """
        self._engine.export_wait(buffer, stream)

    def export_stream(self, buffer: ResidentBuffer) -> int | None:
        """See :meth:`Exporter.export_stream`; the engine answers."""
        return self._engine.export_stream(buffer)

    def call_threadsafe(self, fn: Callable[[], None]) -> None:
        """See :meth:`Exporter.call_threadsafe`; at once if the loop is gone."""
        loop = self._loop()
        if loop is None or loop.is_closed():
            fn()
            return
        try:
            loop.call_soon_threadsafe(fn)
        except RuntimeError:  # closed meanwhile: nothing else uses the store any more
            fn()
