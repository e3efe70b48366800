"""The pools' logic, without a GPU: fake allocators and streams stand in for the driver."""

from __future__ import annotations

import asyncio
import ctypes
import random
import subprocess
import sys
from typing import Any

import attrs
import pytest

import asyncgraph as ag
from asyncgraph.pool import (
    WORST_CASE_WASTE,
    PinnedPool,
    StreamOrderedDeviceMemory,
    StreamPool,
    size_class,
)
from asyncgraph.pool._pinned import _reaper


class Owner:
    """A fake pinned allocation: host memory that records being closed."""

    closed = 0

    def __init__(self, size: int) -> None:
        self.buffer = (ctypes.c_uint8 * size)()

    def close(self) -> None:
        Owner.closed += 1


class FakeAllocator:
    def __init__(self, fail_after: int | None = None) -> None:
        self.calls = 0
        self.fail_after = fail_after

    def __call__(self, size: int) -> tuple[Any, int]:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise MemoryError("fake pinned memory exhausted")
        owner = Owner(size)
        return owner, ctypes.addressof(owner.buffer)


def settle() -> None:
    """Wait until the background thread finished the frees handed to it."""
    _reaper.flushed().result()


# A finalizer (PinnedMemory.__del__) may free a block on a thread that holds
# concurrent.futures' module-wide submit lock: the collector ran while ``submit`` made its
# Future. The free must not wait on that lock (it hung a copy thread, and the loop behind it).
_FREE_INSIDE_SUBMIT = """
import ctypes, os, sys, threading
from concurrent.futures import thread as futures_thread
from asyncgraph.pool import PinnedPool
from asyncgraph.pool._pinned import _reaper

closed = []

class Owner:
    def __init__(self, size):
        self.buffer = (ctypes.c_uint8 * size)()
    def close(self):
        closed.append(self)

def allocate(size):
    owner = Owner(size)
    return owner, ctypes.addressof(owner.buffer)

pool = PinnedPool(0, allocate)  # nothing idle is kept: a release frees
block = pool.acquire(4096)

def release_as_a_finalizer_inside_submit():
    with futures_thread._global_shutdown_lock:
        pool.release(block)

thread = threading.Thread(target=release_as_a_finalizer_inside_submit, daemon=True)
thread.start()
thread.join(20)
try:
    print("stuck" if thread.is_alive() else "returned")
    _reaper.flushed().result(20)
    print("freed", len(closed))
finally:
    sys.stdout.flush()
    os._exit(0)  # a stuck thread holds the lock that the exit's own clean-up takes
"""


def test_a_free_from_a_finalizer_inside_an_executors_submit_does_not_hang() -> None:
    from concurrent.futures import thread as futures_thread

    if not hasattr(futures_thread, "_global_shutdown_lock"):
        pytest.skip("this Python's concurrent.futures has no module-wide submit lock")
    done = subprocess.run(
        [sys.executable, "-c", _FREE_INSIDE_SUBMIT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.split() == ["returned", "freed", "1"], done.stdout + done.stderr


def test_size_classes_waste_at_most_a_ninth() -> None:
    rng = random.Random(7)
    sizes = [1, 4096, 4097, 5000, 1 << 20, (1 << 20) + 1] + [
        rng.randint(1, 1 << 36) for _ in range(20_000)
    ]
    for n in sizes:
        c = size_class(n)
        assert c >= n
        assert c >= 4096
        if n > 4096:
            assert (c - n) / c <= WORST_CASE_WASTE
    assert pytest.approx(1 / 9) == WORST_CASE_WASTE
    # Finer than powers of two: 8 classes between 1 MiB and 2 MiB.
    assert len({size_class(n) for n in range((1 << 20) + 1, 2 << 20, 4096)}) == 8


def test_blocks_are_reused_by_class() -> None:
    alloc = FakeAllocator()
    pool = PinnedPool(1 << 20, alloc)
    block = pool.acquire(5000)
    assert block.size == size_class(5000)
    block.array[:] = 7
    assert ctypes.c_uint8.from_address(block.ptr).value == 7  # the view is the memory
    pool.release(block)
    again = pool.acquire(4800)  # same class
    assert again is block
    other = pool.acquire(100_000)
    stats = pool.statistics()
    assert (stats.hits, stats.misses, alloc.calls) == (1, 2, 2)
    assert stats.blocks_in_use == 2
    assert stats.bytes_in_use == block.size + other.size
    assert repr(pool).startswith("<PinnedPool in_use=2 (")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        stats.hits = 0  # type: ignore[misc]  # frozen on purpose


def test_idle_bytes_stay_under_the_cap_oldest_freed_first() -> None:
    Owner.closed = 0
    pool = PinnedPool(3 * 4096, FakeAllocator())
    blocks = [pool.acquire(4096) for _ in range(5)]
    for b in blocks:
        pool.release(b)
    settle()
    stats = pool.statistics()
    assert stats.bytes_idle == 3 * 4096
    assert stats.trimmed_blocks == 2
    assert Owner.closed == 2
    # The two released first were freed: the newest three are reused.
    assert {id(pool.acquire(4096)) for _ in range(3)} == {id(b) for b in blocks[2:]}


def test_a_block_larger_than_the_cap_is_freed_on_release() -> None:
    Owner.closed = 0
    pool = PinnedPool(8192, FakeAllocator())
    big = pool.acquire(1 << 20)
    pool.release(big)
    settle()
    assert pool.statistics().bytes_idle == 0
    assert Owner.closed == 1


def test_release_errors_and_close() -> None:
    Owner.closed = 0
    pool = PinnedPool(1 << 20, FakeAllocator())
    a, b = pool.acquire(10), pool.acquire(10)
    pool.release(a)
    with pytest.raises(
        ag.DispatchError,
        match=r"is not in use in this pool; release each block once, to the pool that lent it$",
    ):
        pool.release(a)
    pool.close()
    pool.release(b)  # released after close: freed, not cached
    settle()
    assert Owner.closed == 2
    assert pool.statistics().bytes_idle == 0
    with pytest.raises(ag.AllocationError, match=r"^the pinned pool is closed$"):
        pool.acquire(10)


def test_exhaustion_trims_then_raises() -> None:
    pool = PinnedPool(1 << 20, FakeAllocator(fail_after=2))
    a = pool.acquire(4096)
    pool.release(a)
    b = pool.acquire(8192)  # second allocation still succeeds
    with pytest.raises(ag.AllocationError, match=r"even after freeing the pool's idle blocks$"):
        pool.acquire(16384)  # fails, trims the idle 4 KiB block, fails again
    assert pool.statistics().blocks_idle == 0
    pool.release(b)
    with pytest.raises(ag.AllocationError, match=r"^could not allocate 30720 bytes of pinned"):
        PinnedPool(0, FakeAllocator(fail_after=0)).acquire(30000)


def test_placement_prefers_idle_streams() -> None:
    pool: StreamPool[str] = StreamPool(["s0", "s1", "s2"])
    lanes = pool.lanes
    lanes[0].outstanding = 5  # a long kernel queue
    lanes[1].outstanding = 1
    assert pool.pick() is lanes[2]
    lanes[2].outstanding = 3
    assert pool.pick() is lanes[1]
    rr: StreamPool[str] = StreamPool(["a", "b"], placement="round_robin")
    rr.lanes[0].outstanding = 100
    assert [rr.pick().stream for _ in range(4)] == ["a", "b", "a", "b"]
    with pytest.raises(
        ag.DispatchError,
        match=r"^StreamPool\(placement='random'\); placement must be 'least_outstanding' or "
        r"'round_robin'$",
    ):
        StreamPool(["a"], placement="random")
    with pytest.raises(
        ag.DispatchError, match=r"^StreamPool\(\[\]\); a stream pool needs at least one stream$"
    ):
        StreamPool([])


@pytest.mark.parametrize(
    ("cap", "error", "message"),
    [
        (-1, ag.DispatchError, r"^PinnedPool\(cap_bytes=-1\); pass a number of bytes >= 0$"),
        ("1", ag.ArgumentTypeError, r"^PinnedPool\(cap_bytes='1'\); pass a number of bytes$"),
    ],
)
def test_a_pinned_pool_refuses_a_bad_cap(cap: object, error: type[Exception], message: str) -> None:
    # A bare ValueError (and a TypeError of the comparison) before.
    with pytest.raises(error, match=message):
        PinnedPool(cap, FakeAllocator())  # type: ignore[arg-type]  # the point


async def test_leases_are_bounded_fifo_and_exclusive() -> None:
    pool: StreamPool[str] = StreamPool(["s0", "s1", "s2"])
    first = await pool.lease()
    second = await pool.lease()
    assert {first.stream, second.stream} <= {"s0", "s1", "s2"}
    assert first is not second
    assert pool.pick() not in (first, second)  # dispatches avoid leased streams
    with pytest.raises(LookupError):
        pool.lease_nowait()  # one stream always stays for dispatches
    order: list[int] = []

    async def waiter(i: int) -> None:
        lane = await pool.lease()
        order.append(i)
        await asyncio.sleep(0)
        pool.give_back(lane)

    tasks = [asyncio.create_task(waiter(i)) for i in range(4)]
    for _ in range(3):  # lease() is a checkpoint before it queues
        await asyncio.sleep(0)
    assert pool.statistics().waiting == 4
    assert "waiting=4" in repr(pool)
    pool.give_back(first)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3]
    pool.give_back(second)
    stats = pool.statistics()
    assert (stats.leased, stats.waiting, stats.leases_granted) == (0, 0, 6)
    with pytest.raises(
        ag.DispatchError,
        match=r"is not leased; give each lease back once, to the pool that lent it$",
    ):
        pool.give_back(second)


async def test_a_cancelled_lease_waiter_leaves_the_queue() -> None:
    pool: StreamPool[str] = StreamPool(["s0", "s1"])
    held = await pool.lease()
    cancelled = asyncio.create_task(pool.lease())
    behind = asyncio.create_task(pool.lease())
    for _ in range(3):
        await asyncio.sleep(0)
    assert pool.statistics().waiting == 2
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert pool.statistics().waiting == 1
    pool.give_back(held)
    lane = await behind  # the lane skipped the cancelled waiter
    pool.give_back(lane)
    assert pool.statistics().leased == 0


async def test_a_lease_granted_as_its_waiter_is_cancelled_is_passed_on() -> None:
    pool: StreamPool[str] = StreamPool(["s0", "s1"])
    held = await pool.lease()
    racing = asyncio.create_task(pool.lease())
    behind = asyncio.create_task(pool.lease())
    for _ in range(3):
        await asyncio.sleep(0)
    assert pool.statistics().waiting == 2
    pool.give_back(held)  # grants the lane to `racing`...
    racing.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await racing
    lane = await behind
    assert lane is held
    pool.give_back(lane)
    assert pool.statistics().leased == 0


class FakeBuffer:
    def __init__(self, size: int) -> None:
        self.size = size
        self.closed_on: object = None

    def close(self, stream: object) -> None:
        self.closed_on = stream


class FakeResource:
    def __init__(self, fail: int = 0) -> None:
        self.fail = fail

    def allocate(self, nbytes: int, *, stream: object) -> FakeBuffer:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("CUDA_ERROR_OUT_OF_MEMORY: out of memory")
        return FakeBuffer(nbytes)


def test_device_memory_counts_and_frees_on_the_stream() -> None:
    memory = StreamOrderedDeviceMemory(FakeResource())
    a = memory.allocate(100, "s0")
    b = memory.allocate(50, "s1")
    memory.free(a, "s0")
    assert a.closed_on == "s0"
    stats = memory.statistics()
    assert (stats.allocations, stats.frees, stats.bytes_in_use, stats.peak_bytes_in_use) == (
        2,
        1,
        50,
        150,
    )
    memory.free(b, "s1")
    assert "in_use=0 B" in repr(memory)


def test_device_out_of_memory_trims_then_raises() -> None:
    trims: list[int] = []
    memory = StreamOrderedDeviceMemory(FakeResource(fail=1), trim=lambda: trims.append(1))
    assert memory.allocate(10, "s").size == 10  # one failure, trimmed, retried
    assert trims == [1]
    failing = StreamOrderedDeviceMemory(FakeResource(fail=2), trim=lambda: trims.append(2))
    with pytest.raises(ag.AllocationError, match=r"^device out of memory allocating 10 bytes"):
        failing.allocate(10, "s")
    assert failing.statistics().out_of_memory == 1


def test_reserved_scratch_is_counted_apart_from_dispatch_memory() -> None:
    memory = StreamOrderedDeviceMemory(FakeResource(fail=1), trim=lambda: None)
    scratch = memory.reserve(1 << 20, "s0")  # one OOM on the way: trimmed and retried
    stats = memory.statistics()
    assert (stats.bytes_reserved, stats.bytes_in_use, stats.allocations) == (1 << 20, 0, 0)
    assert stats.out_of_memory == 1
    assert "reserved=1048576 B" in repr(memory)
    memory.unreserve(scratch, "s0")
    assert scratch.closed_on == "s0"
    assert memory.statistics().bytes_reserved == 0
