"""Uploads, downloads and copies of resident buffers: checked, counted, and waited for by
closing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from asyncgraph._args._checks import check_upload
from asyncgraph._front._lifecycle import OPEN
from asyncgraph._runtime._exceptions import (
    ArgumentTypeError,
    BackendClosedError,
    ShapeMismatchError,
)
from asyncgraph._runtime._finished import Download

from .._buffers._resident import ResidentBuffer, check_buffer, track, untrack

if TYPE_CHECKING:
    from asyncgraph._front._engine_protocols import Engine, Sink
    from asyncgraph._front._lifecycle import Lifecycle
    from asyncgraph._runtime._telemetry import Telemetry

    from .._buffers._resident import ResidentStore

__all__ = ("Transfers",)


def check_out(out: object, buffer: ResidentBuffer) -> None:
    """Raise unless *out* is an array ``download(out=...)`` can copy *buffer* into."""
    if not isinstance(out, np.ndarray):
        raise ArgumentTypeError(f"download(out=...) takes a numpy array, got {type(out).__name__}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ArgumentTypeError(
            "download(out=...) needs a writable, C-contiguous array; pass np.empty(shape, dtype)"
        )
    if out.shape != buffer.shape or out.dtype != buffer.dtype:
        raise ShapeMismatchError(
            f"download(out=...) got a {out.dtype} array of shape {out.shape}; the buffer is "
            f"{buffer.dtype} of shape {buffer.shape}"
        )


class Transfers:
    """``upload``, ``download`` and ``copy`` of one backend (the front's collaborator).

    Args:
        engine: what makes, moves and frees the storage.
        store: the backend's resident buffers (and its name).
        lifecycle: the backend's state (closing waits for transfers in progress).
        sink: poked once a transfer's use reached the device (jobs parked behind it may go).
        telemetry: the backend's counters.
    """

    def __init__(
        self,
        *,
        engine: Engine[Any],
        store: ResidentStore,
        lifecycle: Lifecycle,
        sink: Sink,
        telemetry: Telemetry,
    ) -> None:
        self._name = store.backend_name
        self._engine = engine
        self._store = store
        self._life = lifecycle
        self._sink = sink  # poked once a transfer's use is in flight (parked jobs may go)
        self._telemetry = telemetry

    async def upload(self, array: np.ndarray[Any, Any]) -> ResidentBuffer:
        """A new resident buffer holding a copy of *array* (``Backend.upload``)."""
        check_upload(array, "upload()")
        life = self._life
        life.transfer_started()
        try:
            storage = await self._engine.upload_storage(array)
        finally:
            life.transfer_ended()
        if life.state != OPEN:
            # aclose() waited for this copy; the store is about to close, so keep nothing.
            self._engine.free_storage(storage)
            raise BackendClosedError(
                f"backend {self._name} was closed while upload() copied the array; the copy "
                "was freed"
            )
        self._telemetry.count("bytes_up", array.nbytes)
        self._telemetry.count("copies_up")
        return self._store.add(storage, array.shape, array.dtype)

    async def download(
        self, buffer: ResidentBuffer, out: np.ndarray[Any, Any] | None
    ) -> np.ndarray[Any, Any]:
        """*buffer*'s contents in a new array or *out* (``Backend.download``)."""
        check_buffer(buffer, "download()")
        self._store.check(buffer, "download()")
        if out is not None:
            check_out(out, buffer)
        use = Download()
        deps = track(buffer, use, write=False)
        self._life.transfer_started()
        try:
            array = await self._engine.download_storage(buffer, use, deps, out)
        finally:
            use.finished.set()
            untrack(buffer, use)
            self._life.transfer_ended()
            self._sink.poke()  # jobs parked behind the download may go
        self._telemetry.count("bytes_down", array.nbytes)
        self._telemetry.count("copies_down")
        return array

    def route(self, target: Transfers) -> str:
        """How :meth:`copy` moves bytes to *target*'s backend (``Backend.copy_route``)."""
        engine = target._engine
        if not engine.copies_from(self._engine):
            return "host"
        return engine.copy_route(self._engine)

    async def copy(self, buffer: ResidentBuffer, target: Transfers) -> ResidentBuffer:
        """A copy of *buffer* (of this backend) on *target*'s backend (``Backend.copy``): by
        *target*'s engine where it copies from this one's storage, else through the host."""
        check_buffer(buffer, "copy()")
        self._store.check(buffer, "copy()")
        engine = target._engine
        if not engine.copies_from(self._engine):
            return await target.upload(await self.download(buffer, None))
        use = Download()
        deps = track(buffer, use, write=False)
        lives = (self._life, target._life)
        for life in lives:
            life.transfer_started()
        try:
            storage = await engine.copy_in(buffer, use, deps, self._engine)
        finally:
            use.finished.set()
            untrack(buffer, use)
            for life in lives:
                life.transfer_ended()
            self._sink.poke()  # jobs parked behind the copy may go
        if target._life.state != OPEN:
            engine.free_storage(storage)
            raise BackendClosedError(
                f"backend {target._name} was closed while copy() copied the buffer; the copy "
                "was freed"
            )
        target._telemetry.count("buffer_copies")
        target._telemetry.count("buffer_copy_bytes", buffer.nbytes)
        return target._store.add(storage, buffer.shape, buffer.dtype)
