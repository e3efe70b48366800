"""The pinned host pool: page-locked staging blocks, cached by size class.

Pinned memory is what makes a host-device copy asynchronous (a pageable copy blocks the calling
thread) and fast: on an NVIDIA H100 80GB HBM3, 64 MiB copies ran at about 54 GB/s from legacy
pinned memory (``cuMemHostAlloc``, which ``cuda.core.LegacyPinnedMemoryResource`` uses) and at
7.7 GB/s (H2D) from ``cuda.core.PinnedMemoryResource``; see
``benchmarks/results/primitives-*.json``. Allocating it costs milliseconds (44 ms for 64 MiB), so
blocks are cached.

Size classes: requests up to 4 KiB get 4 KiB; above that, each power-of-two range is split into 8
classes, so a block is at most 1/9 (11.1 %) larger than the request. Idle blocks beyond the byte
cap are freed, least recently used first.

The pool is not thread-safe: its owner (a backend, on its event loop's thread) acquires and
releases. Freeing pinned memory waits for the whole device to go idle, so freed blocks are
handed to a background thread. A backend releases a block only after the event of the last
copy that used it completed.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

import attrs
import numpy as np

from asyncgraph._runtime._exceptions import AllocationError, ArgumentTypeError, DispatchError
from asyncgraph._runtime._poison import fault_from, process_fault

from ._abandon import abandon
from ._reaper import Reaper

__all__ = (
    "HostPool",
    "PinnedBlock",
    "PinnedMemory",
    "PinnedPool",
    "PinnedPoolStatistics",
    "abandon_block",
    "allocate_staging",
    "free_staging",
    "pinned_memory_of",
    "size_class",
)

# Frees of pinned memory, off the caller's thread and safe from a finalizer (``_reaper``).
_reaper = Reaper("asyncgraph-pinned-free")


MIN_BLOCK = 4096
CLASSES_PER_OCTAVE = 8
WORST_CASE_WASTE = 1 / (CLASSES_PER_OCTAVE + 1)


def size_class(nbytes: int) -> int:
    """The block size the pool hands out for a request of *nbytes*.

    At most ``WORST_CASE_WASTE`` (1/9) of a block above 4 KiB is unused.
    """
    if nbytes <= MIN_BLOCK:
        return MIN_BLOCK
    step = 1 << max(nbytes.bit_length() - 1 - CLASSES_PER_OCTAVE.bit_length() + 1, 0)
    return -(-nbytes // step) * step


class PinnedBlock:
    """One pinned host block: its pointer, its size class, and a uint8 numpy view of it."""

    __slots__ = ("_owner", "array", "ptr", "size")

    def __init__(self, owner: Any, ptr: int, size: int) -> None:
        self._owner = owner  # keeps the allocation alive (a cuda.core Buffer)
        self.ptr = ptr
        self.size = size
        raw = memoryview((ctypes.c_uint8 * size).from_address(ptr)).cast("B")
        self.array: np.ndarray[Any, np.dtype[np.uint8]] = np.frombuffer(raw, dtype=np.uint8)

    def __repr__(self) -> str:
        return f"<PinnedBlock {self.size} bytes at {self.ptr:#x}>"


class PinnedMemory:
    """A pinned block lent to numpy arrays: it goes back to its pool when the last array over
    it is garbage-collected.

    numpy keeps the object whose ``__array_interface__`` it read as the array's base, so every
    view of :meth:`as_array` keeps this object, and so the block, alive. ``release`` runs on the
    thread that drops the last reference; the backend passes one that hands the block to its
    event loop's thread.
    """

    __slots__ = ("__array_interface__", "_release", "block", "nbytes", "owner")

    def __init__(
        self,
        block: PinnedBlock,
        nbytes: int,
        release: Callable[[PinnedBlock], None],
        owner: object = None,
    ) -> None:
        self.block = block
        self.nbytes = nbytes
        self.owner = owner  # whoever lent it (a backend checks for its own memory)
        self._release = release
        self.__array_interface__ = {
            "data": (block.ptr, False),
            "shape": (nbytes,),
            "typestr": "|u1",
            "version": 3,
        }

    def as_array(self) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The whole lent region as a writable uint8 array (whose base is this object)."""
        return np.asarray(self)

    def __del__(self) -> None:
        release = self._release
        self._release = None  # type: ignore[assignment]  # released once
        if release is not None:
            release(self.block)

    def __repr__(self) -> str:
        return f"<PinnedMemory {self.nbytes} bytes at {self.block.ptr:#x}>"


def pinned_memory_of(array: np.ndarray[Any, Any]) -> PinnedMemory | None:
    """The :class:`PinnedMemory` under *array* (a view of one), or ``None``."""
    base = array.base
    while isinstance(base, np.ndarray):
        base = base.base
    return base if isinstance(base, PinnedMemory) else None


@attrs.frozen(kw_only=True)
class PinnedPoolStatistics:
    """Counts of a pinned pool, frozen at the moment of ``statistics()``.

    Attributes:
        hits: requests served from idle blocks.
        misses: requests that allocated.
        blocks_in_use: blocks handed out and not released.
        bytes_in_use: their bytes.
        blocks_idle: cached idle blocks.
        bytes_idle: their bytes.
        bytes_cap: the cap on idle bytes.
        trimmed_blocks: idle blocks freed to stay under the cap (or by ``trim()``).
        allocated_bytes_total: bytes ever allocated.
    """

    hits: int
    misses: int
    blocks_in_use: int
    bytes_in_use: int
    blocks_idle: int
    bytes_idle: int
    bytes_cap: int
    trimmed_blocks: int
    allocated_bytes_total: int


@runtime_checkable
class HostPool(Protocol):
    """What a backend needs of a pinned host pool; plug another in with
    ``BackendOptions(host_pool=...)``."""

    def acquire(self, nbytes: int) -> PinnedBlock:
        """A block of at least *nbytes* (raises :class:`AllocationError` when exhausted)."""
        ...

    def release(self, block: PinnedBlock) -> None:
        """Give back a block no copy in flight uses any more."""
        ...

    def trim(self, keep_bytes: int = 0) -> int:
        """Free idle blocks until at most *keep_bytes* stay cached; return the bytes freed."""
        ...

    def statistics(self) -> PinnedPoolStatistics:
        """Frozen counts."""
        ...

    def close(self) -> None:
        """Free every idle block; blocks in use are freed when released."""
        ...


def _legacy_pinned_allocator() -> Callable[[int], tuple[Any, int]]:
    from cuda.core import LegacyPinnedMemoryResource

    resource = LegacyPinnedMemoryResource()

    def allocate(nbytes: int) -> tuple[Any, int]:
        buffer = resource.allocate(nbytes)
        return buffer, int(buffer.handle)

    return allocate


def allocate_staging(nbytes: int) -> PinnedBlock:
    """A pinned block of exactly *nbytes* outside any pool: staging a lane keeps for its
    lifetime (the fast path's ring). Give it back with :func:`free_staging`."""
    owner, ptr = _legacy_pinned_allocator()(nbytes)
    _reaper.start()  # here, not in a finalizer that frees it
    return PinnedBlock(owner, ptr, nbytes)


def free_staging(block: PinnedBlock) -> None:
    """Free a block from :func:`allocate_staging` once no copy uses it, off the caller's
    thread (:meth:`PinnedPool.wait_freed` waits for it)."""
    PinnedPool._free(block)


def abandon_block(block: PinnedBlock) -> int:
    """Let go of *block* without freeing it (its device failed, and the free would fail and
    warn: ``_abandon``); returns its size."""
    owner, block._owner = block._owner, None
    if owner is not None:
        abandon(owner)
    return block.size


class PinnedPool:
    """The default :class:`HostPool`: legacy pinned blocks in size classes, under a byte cap.

    Args:
        cap_bytes: idle bytes kept cached at most.
        allocate: ``nbytes -> (owner, pointer)``; by default ``cuda.core``'s
            ``LegacyPinnedMemoryResource`` (``cuMemHostAlloc``). The owner is closed (if it has
            ``close()``) or dropped when the block is freed.
    """

    def __init__(
        self, cap_bytes: int, allocate: Callable[[int], tuple[Any, int]] | None = None
    ) -> None:
        if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int):
            raise ArgumentTypeError(f"PinnedPool(cap_bytes={cap_bytes!r}); pass a number of bytes")
        if cap_bytes < 0:
            raise DispatchError(f"PinnedPool(cap_bytes={cap_bytes}); pass a number of bytes >= 0")
        self._cap = cap_bytes
        self._allocate = allocate if allocate is not None else _legacy_pinned_allocator()
        # Idle blocks by size class; the OrderedDict keeps release order for trimming.
        self._idle: dict[int, list[PinnedBlock]] = {}
        self._lru: OrderedDict[int, PinnedBlock] = OrderedDict()
        self._in_use: dict[int, PinnedBlock] = {}
        self._bytes_idle = 0
        self._bytes_in_use = 0
        self._hits = 0
        self._misses = 0
        self._trimmed = 0
        self._allocated_total = 0
        self._closed = False
        self._abandoned = False  # closed after a device fault: blocks are let go of, not freed
        _reaper.start()  # here, not in a finalizer that frees the first block

    def __repr__(self) -> str:
        return (
            f"<PinnedPool in_use={len(self._in_use)} ({self._bytes_in_use} B) "
            f"idle={len(self._lru)} ({self._bytes_idle} B) cap={self._cap} B "
            f"hits={self._hits} misses={self._misses}>"
        )

    def acquire(self, nbytes: int) -> PinnedBlock:
        """A block of at least *nbytes* bytes, from the cache if one of its class is idle.

        Raises:
            AllocationError: pinned memory is exhausted even after the idle blocks were freed.
        """
        if self._closed:
            raise AllocationError("the pinned pool is closed")
        size = size_class(nbytes)
        idle = self._idle.get(size)
        if idle:
            block = idle.pop()
            del self._lru[id(block)]
            self._bytes_idle -= size
            self._hits += 1
        else:
            block = self._new_block(size)
            self._misses += 1
        self._in_use[id(block)] = block
        self._bytes_in_use += size
        return block

    def _new_block(self, size: int) -> PinnedBlock:
        try:
            owner, ptr = self._allocate(size)
        except Exception as exc:
            fault = fault_from(exc, "cuMemHostAlloc")
            if fault is not None:  # the process's CUDA is poisoned: no memory comes back
                raise fault from exc
            # Out of pinned memory (or a failed driver call): free the cache and try once more.
            if not self.trim(0):
                raise AllocationError(
                    f"could not allocate {size} bytes of pinned host memory; lower "
                    "BackendOptions.pinned_pool_bytes or the size of transfers"
                ) from None
            try:
                owner, ptr = self._allocate(size)
            except Exception as exc:
                fault = fault_from(exc, "cuMemHostAlloc")
                if fault is not None:
                    raise fault from exc
                raise AllocationError(
                    f"could not allocate {size} bytes of pinned host memory even after "
                    "freeing the pool's idle blocks"
                ) from exc
        self._allocated_total += size
        return PinnedBlock(owner, ptr, size)

    def release(self, block: PinnedBlock) -> None:
        """Take back a block whose last copy completed; cache it or free it over the cap."""
        if self._in_use.pop(id(block), None) is None:
            raise DispatchError(
                f"{block!r} is not in use in this pool; release each block once, to the pool "
                "that lent it"
            )
        self._bytes_in_use -= block.size
        if self._closed or block.size > self._cap:
            if self._abandoned:
                abandon_block(block)
            else:
                self._free(block)
            return
        self._idle.setdefault(block.size, []).append(block)
        self._lru[id(block)] = block
        self._bytes_idle += block.size
        if self._bytes_idle > self._cap:
            self.trim(self._cap)

    def trim(self, keep_bytes: int = 0) -> int:
        """Free idle blocks, least recently released first, until at most *keep_bytes* stay."""
        freed = 0
        while self._lru and self._bytes_idle > keep_bytes:
            _, block = self._lru.popitem(last=False)
            self._idle[block.size].remove(block)
            self._bytes_idle -= block.size
            freed += block.size
            self._trimmed += 1
            self._free(block)
        return freed

    def statistics(self) -> PinnedPoolStatistics:
        """Frozen counts."""
        return PinnedPoolStatistics(
            hits=self._hits,
            misses=self._misses,
            blocks_in_use=len(self._in_use),
            bytes_in_use=self._bytes_in_use,
            blocks_idle=len(self._lru),
            bytes_idle=self._bytes_idle,
            bytes_cap=self._cap,
            trimmed_blocks=self._trimmed,
            allocated_bytes_total=self._allocated_total,
        )

    def close(self) -> None:
        """See :meth:`HostPool.close`."""
        self._closed = True
        self.trim(0)

    def abandon(self) -> int:
        """Close, letting go of every idle block without freeing it, and of blocks in use
        when they are released (the device failed: frees would fail, each with a warning;
        ``_abandon``). Returns the bytes let go of now."""
        self._closed = self._abandoned = True
        let_go = 0
        for block in self._lru.values():
            let_go += abandon_block(block)
        self._lru.clear()
        self._idle.clear()
        self._bytes_idle = 0
        return let_go

    @staticmethod
    def wait_freed() -> Future[None]:
        """A future that completes once every block freed so far is back with the driver.

        Frees run in one background thread, in order; a backend awaits this when it closes,
        so that ``aclose()`` returns with its pinned memory released.
        """
        return _reaper.flushed()

    @staticmethod
    def _free(block: PinnedBlock) -> None:
        if process_fault() is not None:
            abandon_block(block)  # the poisoned driver would fail the free, with a warning
            return
        close = getattr(block._owner, "close", None)
        block._owner = None
        if close is not None:
            # Freeing pinned memory waits until the whole device is idle (measured on an
            # NVIDIA H100 80GB HBM3: 95 ms behind a 100 ms kernel), so it never runs on the
            # caller's thread, which is the event loop's; and this may run in a finalizer,
            # anywhere (``_reaper``).
            _reaper.submit(close)
