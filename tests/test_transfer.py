"""The chunked transfer pipeline against a stand-in for the driver (no GPU needed).

The stand-in performs each copy only when its event "completes", a little later, the way DMA
does: a block reused before its copy completed would show up as wrong bytes, and a block given
back to the pool while a copy still reads it fails the fake pool's check.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

import numpy as np
import pytest

from asyncgraph._cuda.driver._driver import SUCCESS
from asyncgraph._cuda.memory import _chunked_transfer as _transfer
from asyncgraph._cuda.memory._chunked_transfer import ChunkedTransfer

from .polling import until

BASE = 1 << 40  # fake device addresses start here


class FakeBlock:
    def __init__(self, size: int) -> None:
        self.array = np.zeros(size, np.uint8)
        self.ptr = self.array.ctypes.data
        self.size = size


class FakeGpu:
    """Device memory, a queue of copies, and events that complete later: *delay* seconds after
    they are waited for, or, with ``delay=None``, only when the test calls :meth:`complete`."""

    def __init__(self, size: int, delay: float | None = 0.001) -> None:
        self.delay = delay  # seconds from an event's record to its completion
        self.held: list[Any] = []  # completions waiting for complete() (delay=None)
        self.memory = np.zeros(size, np.uint8)
        self.blocks: dict[int, FakeBlock] = {}
        self.pending: list[tuple[str, int, int, int]] = []
        self.enqueued = 0  # copies ever enqueued
        self.completed = 0  # copies ever performed
        self.acquired = 0
        self.released: list[FakeBlock] = []
        self.drv = types.SimpleNamespace(
            cuMemcpyHtoDAsync=self.htod, cuMemcpyDtoHAsync=self.dtoh, cuEventRecord=self.record
        )

    # the pool
    def acquire(self, nbytes: int) -> FakeBlock:
        block = FakeBlock(nbytes)
        self.blocks[block.ptr] = block
        self.acquired += 1
        return block

    def release(self, block: FakeBlock) -> None:
        busy = [op for op in self.pending if block.ptr in (op[1], op[2])]
        assert not busy, "a block went back to the pool while a copy still used it"
        assert block not in self.released, "a block was released twice"
        self.released.append(block)

    # the driver
    def htod(self, dst: int, src: int, n: int, _stream: Any) -> tuple[Any]:
        self.pending.append(("htod", dst, src, n))
        self.enqueued += 1
        return (SUCCESS,)

    def dtoh(self, dst: int, src: int, n: int, _stream: Any) -> tuple[Any]:
        self.pending.append(("dtoh", dst, src, n))
        self.enqueued += 1
        return (SUCCESS,)

    def record(self, event: list[int], _stream: Any) -> tuple[Any]:
        event.append(self.enqueued)  # completes every copy enqueued before it
        return (SUCCESS,)

    def _run(self, upto: int) -> None:
        """Perform the copies up to the *upto*-th ever enqueued."""
        count = max(upto - self.completed, 0)
        done, self.pending = self.pending[:count], self.pending[count:]
        self.completed += count
        for kind, dst, src, n in done:
            if kind == "htod":
                self.memory[dst - BASE : dst - BASE + n] = self.blocks[src].array[:n]
            else:
                self.blocks[dst].array[:n] = self.memory[src - BASE : src - BASE + n]

    def wait_event(self, event: list[int], on_done: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        upto = event[0]

        def complete() -> None:
            self._run(upto)
            on_done(None, future.cancelled())
            if not future.done():
                future.set_result(None)

        if self.delay is None:
            self.held.append(complete)
        else:
            loop.call_later(self.delay, complete)
        return future

    def complete(self) -> None:
        """Complete every event waited for so far (``delay=None``): their copies run."""
        held, self.held = self.held, []
        for complete in held:
            complete()


def _copy(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
    dst[:] = src


def _transfer_on(gpu: FakeGpu, chunk: int) -> ChunkedTransfer:
    return ChunkedTransfer(gpu, list, gpu.wait_event, None, _copy, chunk)  # type: ignore[arg-type]


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    fake = FakeGpu(1 << 16)
    monkeypatch.setattr(_transfer, "drv", fake.drv)
    return fake


async def test_upload_in_chunks_arrives_whole(gpu: FakeGpu, rng: np.random.Generator) -> None:
    src = rng.integers(0, 256, 10 * 1024 + 512, dtype=np.uint8)
    await _transfer_on(gpu, 1024).upload(src, BASE + 100)
    np.testing.assert_array_equal(gpu.memory[100 : 100 + src.size], src)
    assert gpu.acquired == 2
    assert len(gpu.released) == 2
    assert not gpu.pending


async def test_download_in_chunks_arrives_whole(gpu: FakeGpu, rng: np.random.Generator) -> None:
    gpu.memory[:] = rng.integers(0, 256, gpu.memory.size, dtype=np.uint8)
    dst = np.zeros(7 * 1024 + 3, np.uint8)
    await _transfer_on(gpu, 1024).download(BASE + 64, dst)
    np.testing.assert_array_equal(dst, gpu.memory[64 : 64 + dst.size])
    assert gpu.acquired == 2
    assert len(gpu.released) == 2


async def test_a_cancelled_upload_gives_its_blocks_back_after_their_copies(
    gpu: FakeGpu,
) -> None:
    gpu.delay = None  # copies complete when the test says: cancelled while both are in use
    src = np.ones(40 * 1024, np.uint8)
    task = asyncio.create_task(_transfer_on(gpu, 1024).upload(src, BASE))
    # Both blocks filled and their copies enqueued: the upload waits for the first one's.
    await until(lambda: len(gpu.held) == 2, "both blocks' copies to be waited for")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(gpu.pending) == 2  # both blocks' copies are still in flight...
    assert gpu.released == []  # ...so neither block went back yet
    gpu.complete()  # the copies complete
    assert not gpu.pending
    assert len(gpu.released) == 2  # each exactly once, none while a copy used it
