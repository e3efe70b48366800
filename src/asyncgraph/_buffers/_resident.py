"""Resident buffers: memory that stays on the backend between dispatches.

A :class:`ResidentStore` owns every buffer of one backend. A handle (:class:`ResidentBuffer`)
carries its store, a slot and the slot's generation; freeing a buffer bumps the generation, so a
freed, reused or foreign handle is refused (:class:`StaleBufferError`), never reaching memory.

Each buffer also tracks the dispatches in flight that use it, for two purposes:
- ordering: a dispatch that reads a buffer waits for the last dispatch that wrote it, and one that
  writes waits for the readers and the writer before it (read-after-write, write-after-read);
- lifetime: ``aclose()`` refuses new uses at once but frees the memory only after the last use in
  flight completed.

This module is the one implementation of a buffer's and a store's states. Where the compiled core
is built, it is compiled too (``_resident.pxd`` declares both classes as extension types, and the
functions the compiled fast path calls: :meth:`ResidentStore.is_live`, :func:`track_uses`,
:func:`untrack` and the readers), and the compiled core calls those through C; elsewhere the same
source runs as plain Python.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod
from typing import Any, NoReturn, Protocol

import numpy as np

from asyncgraph._runtime import _checkpoint
from asyncgraph._runtime._exceptions import ArgumentTypeError, NotPicklableError, StaleBufferError

from ._dlpack import make_capsule

__all__ = (
    "Exporter",
    "ResidentBuffer",
    "ResidentStore",
    "check_buffer",
    "discard",
    "hold",
    "identity",
    "in_use",
    "let_go",
    "readers_of",
    "storage_of",
    "track",
    "track_uses",
    "untrack",
    "uses_of",
    "writer_of",
)


class Use(Protocol):
    """Something in flight that uses a buffer (a dispatch); opaque to the store."""


class Exporter(Protocol):
    """What a backend does for buffers exported to other libraries (loop thread, except
    ``call_threadsafe``)."""

    def export_device(self) -> tuple[int, int]:
        """The DLPack device: (device type, ordinal)."""

    def export_pointer(self, storage: Any) -> int:
        """The address of a buffer's memory."""

    def export_wait(self, buffer: ResidentBuffer, stream: int | None) -> None:
        """DLPack: order the consumer's *stream* after every use of *buffer* in flight.

        Raises:
            BufferError: a use in flight has not started, so there is nothing to wait on yet.
        """
        ...

    def export_stream(self, buffer: ResidentBuffer) -> int | None:
        """``__cuda_array_interface__``: the stream a consumer must wait on for the write in
        flight to *buffer*, or ``None`` when no write is in flight."""
        ...

    def call_threadsafe(self, fn: Callable[[], None]) -> None:
        """Run *fn* on the loop's thread soon (from any thread)."""
        ...


class ResidentBuffer:
    """A buffer that lives on a backend (device memory on CUDA) between dispatches.

    Pass it to ``dispatch`` as an argument (no bytes move) or as ``Out(into=buffer)``; read it
    back with ``await backend.download(buffer)``; free it with ``await buffer.aclose()``.
    Made by ``backend.upload()`` and ``backend.empty()``; there is no public constructor.

    Other libraries can use its memory in place: ``torch.from_dlpack(buffer)``,
    ``cupy.from_dlpack(buffer)`` (and ``np.from_dlpack`` on the host backend) through DLPack,
    which keeps the memory until the consumer lets go, even if the buffer is closed first; and
    ``cupy.asarray(buffer)`` or ``torch.as_tensor(buffer, device="cuda")`` through
    ``__cuda_array_interface__`` (CUDA backend), a borrowed view that is valid until the buffer
    is closed. See ``docs/interop.md``.

    Attributes:
        shape: the array shape.
        dtype: the numpy dtype.
        nbytes: size in bytes.
    """

    # The fields, as slots here and as the extension type's fields in _resident.pxd (the same
    # names: keep the two alike).
    __slots__ = (
        "__weakref__",
        "_exports",
        "_generation",
        "_in_use",
        "_readers",
        "_slot",
        "_storage",
        "_store",
        "_writer",
        "dtype",
        "nbytes",
        "shape",
    )

    def __init__(
        self,
        store: ResidentStore,
        slot: int,
        generation: int,
        storage: Any,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
    ) -> None:
        self._store = store
        self._slot = slot
        self._generation = generation
        self._storage = storage
        self.shape = shape
        self.dtype = dtype
        self.nbytes = int(prod(shape)) * dtype.itemsize
        self._in_use = 0
        self._exports = 0  # DLPack tensors consumers still hold
        self._writer: Use | None = None
        self._readers: list[Use] = []

    @property
    def is_closed(self) -> bool:
        """Whether ``aclose()`` was called (or the backend closed); the handle is then stale."""
        return not self._store.is_live(self)

    @property
    def backend_name(self) -> str:
        """The name of the backend the buffer lives on (``"host"``, ``"cuda:0"``)."""
        return self._store.backend_name

    async def aclose(self) -> None:
        """Free the buffer.

        New uses are refused at once with :class:`StaleBufferError`; the memory itself is freed
        after the last dispatch in flight that uses it completed. Closing twice is harmless.
        """
        self._store._close(self)
        await _checkpoint.sleep(0)

    # -- interop -------------------------------------------------------------------------------

    def _exporter(self, protocol: str) -> Exporter:
        exporter = self._store.exporter
        if exporter is None:
            raise BufferError(f"{protocol}: the {self.backend_name} backend exports no memory")
        self._store.check(self, protocol)
        return exporter

    def __dlpack_device__(self) -> tuple[int, int]:
        """DLPack: (device type, device ordinal) of the memory."""
        return self._exporter("__dlpack_device__").export_device()

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """DLPack: a capsule over the buffer's memory, for ``torch.from_dlpack`` and the like.

        The consumer's *stream* is made to wait for dispatches in flight that write the buffer.
        The memory stays allocated until the consumer releases the tensor, even if the buffer
        is closed meanwhile. Only an unversioned capsule is made, which every consumer accepts.

        Raises:
            StaleBufferError: the buffer is closed.
            BufferError: a copy or another device was asked for, the backend exports no
                memory, or a dispatch that uses the buffer is queued and has not started.
        """
        del max_version  # an unversioned capsule is always allowed
        exporter = self._exporter("__dlpack__")
        device = exporter.export_device()
        if copy:
            raise BufferError("__dlpack__(copy=True): a resident buffer is only shared, not copied")
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError(f"__dlpack__(dl_device={dl_device}): the buffer lives on {device}")
        exporter.export_wait(self, stream)
        pointer = exporter.export_pointer(self._storage)
        self._exports += 1
        store = self._store

        def release() -> None:
            exporter.call_threadsafe(lambda: store._unexport(self))

        return make_capsule(pointer, self.shape, self.dtype, device, release)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3 of the CUDA array interface (CUDA backend only), a borrowed view.

        ``stream`` names the stream a consumer must wait on while a dispatch that writes the
        buffer is in flight, else it is ``None``. The view is valid until the buffer is closed.
        """
        exporter = self._store.exporter
        if exporter is None or exporter.export_device()[0] != 2:
            raise AttributeError(
                f"__cuda_array_interface__: a resident buffer of the {self.backend_name} backend "
                "is not device memory"
            )
        self._store.check(self, "__cuda_array_interface__")
        stream = exporter.export_stream(self)
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (exporter.export_pointer(self._storage), False),
            "strides": None,
            "version": 3,
            "stream": stream,
        }

    def __reduce__(self) -> NoReturn:
        """Refuse pickling (and :mod:`copy`): the memory cannot leave its backend this way.

        Raises:
            NotPicklableError: always; it says to download the buffer and send the array.
        """
        raise NotPicklableError(
            f"a resident buffer ({self.dtype} {self.shape} on {self.backend_name}) cannot be "
            "pickled: it lives on its backend, in the process that made it; download it "
            "first ('array = await backend.download(buffer)') and send the array"
        )

    def __repr__(self) -> str:
        state = "closed" if self.is_closed else f"{self._in_use} in use"
        return (
            f"<ResidentBuffer {self.dtype} {self.shape} on {self._store.backend_name} "
            f"slot={self._slot} gen={self._generation} {state}>"
        )


class ResidentStore:
    """Every resident buffer of one backend, with generation-checked handles.

    Args:
        backend_name: the owning backend's name, for messages.
        free_storage: frees a buffer's backend storage (device memory on CUDA).
        exporter: the backend's side of DLPack and ``__cuda_array_interface__``, if any.
    """

    # As ResidentBuffer's: the extension type's fields in _resident.pxd have the same names.
    __slots__ = (
        "__weakref__",
        "_buffers",
        "_free_slots",
        "_free_storage",
        "_generations",
        "backend_name",
        "bytes_live",
        "closed",
        "exporter",
    )

    def __init__(
        self,
        backend_name: str,
        free_storage: Callable[[Any], None],
        exporter: Exporter | None = None,
    ) -> None:
        self.backend_name = backend_name
        self._free_storage = free_storage
        self.exporter = exporter
        self._generations: list[int] = []
        self._buffers: list[ResidentBuffer | None] = []
        self._free_slots: list[int] = []
        self.bytes_live = 0
        self.closed = False  # the backend closed: every buffer was closed with it

    def __len__(self) -> int:
        return sum(1 for b in self._buffers if b is not None)

    def holds(self, buffer: ResidentBuffer) -> bool:
        """Whether *buffer* was made by this store (it may be closed since)."""
        check_buffer(buffer, "holds()")
        return buffer._store is self

    def __repr__(self) -> str:
        return (
            f"<ResidentStore {self.backend_name} buffers={len(self)} bytes={self.bytes_live} "
            f"free_slots={len(self._free_slots)}>"
        )

    def add(self, storage: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> ResidentBuffer:
        """Register backend *storage* as a new resident buffer and return its handle."""
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = len(self._buffers)
            self._buffers.append(None)
            self._generations.append(0)
        buffer = ResidentBuffer(self, slot, self._generations[slot], storage, shape, dtype)
        self._buffers[slot] = buffer
        self.bytes_live += buffer.nbytes
        return buffer

    @staticmethod
    def owns_type(value: object) -> bool:
        """Whether *value* is a resident buffer handle (of any store)."""
        return isinstance(value, ResidentBuffer)

    def check(self, buffer: ResidentBuffer, where: str) -> None:
        """Raise :class:`StaleBufferError` unless *buffer* is a live handle of this store."""
        other = buffer._store
        if other is not self:
            if other.closed:
                whose = f"of backend {other.backend_name}, which was closed"
            elif other.backend_name == self.backend_name:
                whose = f"of another backend (also named {other.backend_name})"
            else:
                whose = f"of another backend ({other.backend_name})"
            raise StaleBufferError(
                f"{where} is a resident buffer {whose}; upload the data to this backend "
                f"({self.backend_name}) with backend.upload()"
            )
        if self.closed:
            raise StaleBufferError(
                f"{where} is a resident buffer of backend {self.backend_name}, which was "
                "closed; open a new backend and upload the data to it"
            )
        if not self.is_live(buffer):
            raise StaleBufferError(
                f"{where} is a resident buffer that was closed (slot {buffer._slot}, "
                f"generation {buffer._generation}); upload the data again"
            )

    def is_live(self, buffer: ResidentBuffer) -> bool:
        """Whether *buffer* is a live handle of this store (:meth:`check` raises otherwise)."""
        slot = buffer._slot
        return (
            buffer._store is self
            and self._generations[slot] == buffer._generation
            and self._buffers[slot] is buffer
        )

    def close_all(self) -> None:
        """Close every buffer (at backend close, after all work completed) and free them."""
        self.closed = True
        for buffer in list(self._buffers):
            if buffer is not None:
                self._close(buffer)

    # -- internals -----------------------------------------------------------------------------

    def _close(self, buffer: ResidentBuffer) -> None:
        if buffer._store is not self or not self.is_live(buffer):
            return
        # Bump the generation now: the handle is stale from this moment.
        self._generations[buffer._slot] += 1
        self._buffers[buffer._slot] = None
        self._free_slots.append(buffer._slot)
        if buffer._in_use == 0 and buffer._exports == 0:
            self._free(buffer)

    def _unexport(self, buffer: ResidentBuffer) -> None:
        """A consumer released a DLPack tensor: free the memory if nothing else holds it."""
        buffer._exports -= 1
        idle = buffer._exports == 0 and buffer._in_use == 0 and buffer._storage is not None
        if idle and not self.is_live(buffer):
            self._free(buffer)

    def _free(self, buffer: ResidentBuffer) -> None:
        storage, buffer._storage = buffer._storage, None
        self.bytes_live -= buffer.nbytes
        if storage is not None:
            self._free_storage(storage)


# -- what backends ask of a buffer (they never touch its private fields) ------------------------
# The compiled fast path calls is_live, track_uses, untrack, writer_of, readers_of and
# storage_of through C (_resident.pxd declares them).


def _record(buffer: ResidentBuffer, use: Use, write: bool) -> None:
    """*use* of *buffer* in flight: a write becomes its writer (its readers done with), a read
    joins the readers. If it raises, nothing changed."""
    if write:
        if buffer._readers:
            buffer._readers = []
        buffer._writer = use
    else:
        buffer._readers.append(use)
    buffer._in_use += 1


def track(buffer: ResidentBuffer, use: Use, write: bool) -> list[Use]:
    """Record *use* of *buffer* (in flight until :func:`untrack`): a write becomes its writer,
    after the writer and the readers before it, a read joins the readers. Returns the earlier
    uses *use* must be ordered after; if it raises, nothing changed."""
    writer = buffer._writer
    if write:
        deps = list(buffer._readers)
        if writer is not None:
            deps.append(writer)
    else:
        deps = [writer] if writer is not None else []
    _record(buffer, use, write)
    return deps


def track_uses(buffers: list[ResidentBuffer], writes: tuple[bool, ...], use: Use) -> None:
    """Record *use* of each of *buffers* (written where *writes* says), as :func:`track` does
    without the earlier uses: on all or on none."""
    if len(buffers) == 1:
        _record(buffers[0], use, writes[0])  # all or nothing by itself
        return
    replaced: list[tuple[Use | None, list[Use]] | None] = []  # what each write replaced
    done = 0
    try:
        for buffer in buffers:
            write = writes[done]
            replaced.append((buffer._writer, buffer._readers) if write else None)
            _record(buffer, use, write)  # all or nothing by itself
            done += 1
    except BaseException:
        for k in range(done - 1, -1, -1):
            _forget(buffers[k], use, replaced[k])
        raise


def _forget(buffer: ResidentBuffer, use: Use, prior: tuple[Use | None, list[Use]] | None) -> None:
    """Undo :func:`_record` of *use* on *buffer* (*prior*: what a write replaced)."""
    buffer._in_use -= 1
    if prior is None:
        buffer._readers.remove(use)  # a read appended it there
    else:
        buffer._writer, buffer._readers = prior


def untrack(buffer: ResidentBuffer, use: Use) -> None:
    """Forget a finished *use*, once per track; frees the memory of a closed buffer left idle."""
    buffer._in_use -= 1
    if buffer._writer is use:
        buffer._writer = None
    elif use in buffer._readers:
        buffer._readers.remove(use)
    if (
        buffer._in_use == 0
        and buffer._exports == 0
        and buffer._storage is not None
        and not buffer._store.is_live(buffer)
    ):
        buffer._store._free(buffer)


def storage_of(buffer: ResidentBuffer) -> Any:
    """The backend storage behind *buffer* (a device allocation, a numpy array)."""
    return buffer._storage


def identity(buffer: ResidentBuffer) -> tuple[int, int]:
    """What tells *buffer* apart from any other, even one reusing its memory later."""
    return (id(buffer), buffer._generation)


def in_use(buffer: ResidentBuffer) -> bool:
    """Whether a dispatch or a download in flight uses *buffer*."""
    return buffer._in_use > 0


def writer_of(buffer: ResidentBuffer) -> Use | None:
    """The use in flight that writes *buffer*, if any."""
    return buffer._writer


def readers_of(buffer: ResidentBuffer) -> list[Use]:
    """The uses in flight that read *buffer*: its own list, to read only."""
    return buffer._readers


def uses_of(buffer: ResidentBuffer) -> list[Use]:
    """Every use of *buffer* in flight: the writer first, then the readers."""
    writer = buffer._writer
    return [writer, *buffer._readers] if writer is not None else list(buffer._readers)


def hold(buffer: ResidentBuffer) -> None:
    """Keep *buffer*'s memory, even closed, until :func:`let_go` (a recorded graph uses it)."""
    buffer._exports += 1


def let_go(buffer: ResidentBuffer) -> None:
    """End a :func:`hold`; frees the memory of a closed buffer nothing else uses."""
    buffer._store._unexport(buffer)


def discard(buffer: ResidentBuffer) -> None:
    """Close *buffer*, made for a dispatch that was refused or failed (nobody has it)."""
    buffer._store._close(buffer)


def check_buffer(value: object, where: str) -> None:
    """Raise unless *value* is a resident buffer (*where* names the call that was given it).

    Raises:
        ArgumentTypeError: it is something else (a numpy array, say).
    """
    if not isinstance(value, ResidentBuffer):
        raise ArgumentTypeError(
            f"{where} takes a resident buffer, got {type(value).__name__}; pass one that "
            "upload(), empty() or a dispatch's Out(..., resident=True) returned"
        )
