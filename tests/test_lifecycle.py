"""Cancellation, closing, and what a dropped backend does."""

from __future__ import annotations

import asyncio
import gc

import numpy as np
import pytest

import asyncgraph as ag

from .kernels import INC, SCALE, Recorder, probe_kernel
from .polling import until


async def test_cancelling_the_awaiter_does_not_cancel_the_work(host: ag.Backend) -> None:
    rec = Recorder()
    rec.release.clear()
    buf = await host.upload(np.zeros(4, np.float32))
    x = np.arange(4, dtype=np.float32)
    pending = host.dispatch(
        probe_kernel(rec), x, ag.Out(4, np.float32), np.int32(4), grid=1, block=4
    )
    inc = host.dispatch(INC, buf, np.float32(1), np.int32(4), grid=1, block=4)

    async def awaiter() -> object:
        return await pending

    task = asyncio.create_task(awaiter())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not pending.done()
    rec.release.set()
    (out,) = await pending  # the work completed regardless
    np.testing.assert_array_equal(out, x * 2)
    await inc
    snap = host.telemetry.snapshot()
    assert (snap.in_flight, snap.queued) == (0, 0)
    assert snap.dispatches_completed == 2
    assert buf._in_use == 0
    np.testing.assert_array_equal(await host.download(buf), np.ones(4))


async def test_cancelling_many_awaiters_returns_every_resource() -> None:
    async with ag.open_backend("host", max_in_flight=4) as backend:
        buffers = [await backend.upload(np.zeros(16, np.float32)) for _ in range(4)]
        pendings = []
        tasks = []
        for i in range(100):
            pending = backend.dispatch(
                INC, buffers[i % 4], np.float32(1), np.int32(16), grid=1, block=16
            )
            pendings.append(pending)
            # Every other awaiter times out at once and is cancelled.
            timeout = 0 if i % 2 else None
            tasks.append(asyncio.create_task(asyncio.wait_for(_await(pending), timeout)))
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert sum(isinstance(o, TimeoutError) for o in outcomes) == 50
        for pending in pendings:  # the work itself was never cancelled
            await pending
        snap = backend.telemetry.snapshot()
        assert (snap.in_flight, snap.queued, snap.dispatches_completed) == (0, 0, 100)
        assert all(b._in_use == 0 for b in buffers)
        # Every increment landed exactly once, cancelled awaiter or not.
        for buf in buffers:
            np.testing.assert_array_equal(await backend.download(buf), np.full(16, 25.0))


async def _await(pending: ag.PendingDispatch) -> object:
    return await pending


async def test_close_waits_for_work_in_flight() -> None:
    rec = Recorder()
    rec.release.clear()
    backend = ag.open_backend("host")
    x = np.ones(4, np.float32)
    pending = [
        backend.dispatch(probe_kernel(rec), x, ag.Out(4, np.float32), np.int32(4), grid=1, block=4)
        for _ in range(6)
    ]
    closing = asyncio.create_task(backend.aclose())
    await asyncio.sleep(0.01)
    assert backend.is_closed
    assert not closing.done()
    with pytest.raises(
        ag.BackendClosedError,
        match=r"^backend host is closed; open a new one with asyncgraph.open_backend\(\)$",
    ):
        backend.dispatch(
            SCALE, x, ag.Out(4, np.float32), np.float32(1), np.int32(4), grid=1, block=4
        )
    rec.release.set()
    await closing
    assert all(p.done() and p.exception() is None for p in pending)
    await backend.aclose()  # idempotent
    assert "closed" in repr(backend)


async def test_cancelled_close_still_finishes() -> None:
    rec = Recorder()
    rec.release.clear()
    backend = ag.open_backend("host")
    pending = backend.dispatch(
        probe_kernel(rec),
        np.ones(2, np.float32),
        ag.Out(2, np.float32),
        np.int32(2),
        grid=1,
        block=2,
    )
    closing = asyncio.create_task(backend.aclose())
    await asyncio.sleep(0.01)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    rec.release.set()
    await backend.aclose()
    assert pending.done()


async def test_resident_buffers_are_freed_at_close() -> None:
    backend = ag.open_backend("host")
    buf = await backend.upload(np.ones(3))
    await backend.aclose()
    assert buf.is_closed
    assert backend._store.bytes_live == 0


def _open_and_drop() -> None:
    ag.open_backend("host")
    gc.collect()


async def test_dropped_backend_warns() -> None:
    with pytest.warns(ResourceWarning, match=r"^backend host was not closed; use 'async with'"):
        _open_and_drop()


async def test_backend_belongs_to_its_loop(host: ag.Backend) -> None:
    def in_other_loop() -> None:
        async def use() -> None:
            host.dispatch(
                SCALE,
                np.ones(1, np.float32),
                ag.Out(1, np.float32),
                np.float32(1),
                np.int32(1),
                grid=1,
                block=1,
            )

        asyncio.run(use())

    with pytest.raises(
        ag.UnsupportedError,
        match=r"^backend host belongs to another event loop; open one backend per event loop$",
    ):
        await asyncio.to_thread(in_other_loop)


async def test_close_with_a_timeout_fails_only_what_had_not_started() -> None:
    rec = Recorder()
    rec.release.clear()
    backend = ag.open_backend("host", max_in_flight=2)
    x = np.ones(4, np.float32)
    pending = [
        backend.dispatch(probe_kernel(rec), x, ag.Out(4, np.float32), np.int32(4), grid=1, block=4)
        for _ in range(6)
    ]
    closing = asyncio.create_task(backend.aclose(timeout=0.05))
    queued = pending[2:]
    # Past the timeout the four queued dispatches are failed; the two running ones are held.
    await until(lambda: all(p.done() for p in queued), "the queued dispatches to be failed")
    for p in queued:
        with pytest.raises(
            ag.BackendClosedError,
            match=r"^backend host was closed before dispatch #\d of 'probe' started "
            r"\(aclose timeout\)$",
        ):
            await p
    assert not closing.done()  # the two submitted ones still run
    rec.release.set()
    await closing
    for p in pending[:2]:
        (out,) = await p
        np.testing.assert_array_equal(out, x * 2)
    snap = backend.telemetry.snapshot()
    assert (snap.dispatches_completed, snap.dispatches_failed, snap.in_flight, snap.queued) == (
        2,
        4,
        0,
        0,
    )


async def test_close_with_a_timeout_that_is_not_reached() -> None:
    backend = ag.open_backend("host")
    x = np.ones(4, np.float32)
    pending = backend.dispatch(
        SCALE, x, ag.Out(4, np.float32), np.float32(3), np.int32(4), grid=1, block=4
    )
    await backend.aclose(timeout=5)
    (out,) = await pending
    np.testing.assert_array_equal(out, x * 3)


async def test_compile_takes_a_kernel(host: ag.Backend) -> None:
    with pytest.raises(
        ag.ArgumentTypeError,
        match=r"^compile\(\) takes an asyncgraph.Kernel, got str; declare it with "
        r"asyncgraph.Kernel\(source, name, host=...\)$",
    ):
        await host.compile("scale")  # type: ignore[arg-type]  # deliberately wrong
    await host.compile(SCALE)  # the backend goes on


@pytest.mark.cuda
async def test_compile_takes_a_kernel_on_cuda() -> None:
    async with ag.open_backend("cuda") as gpu:
        with pytest.raises(
            ag.ArgumentTypeError, match=r"^compile\(\) takes an asyncgraph.Kernel, got str; "
        ):
            await gpu.compile("scale")  # type: ignore[arg-type]  # deliberately wrong
        await gpu.compile(SCALE)


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ("1", ag.ArgumentTypeError, r"^aclose\(timeout='1'\): pass a number of seconds, or None$"),
        (
            True,
            ag.ArgumentTypeError,
            r"^aclose\(timeout=True\): pass a number of seconds, or None$",
        ),
        (-1, ag.DispatchError, r"^aclose\(timeout=-1\): pass a number of seconds >= 0, or None$"),
        (float("nan"), ag.DispatchError, r"^aclose\(timeout=nan\): pass a number of seconds >= 0"),
    ],
)
async def test_a_bad_close_timeout_is_refused_before_the_close_begins(
    bad: object, error: type[Exception], message: str
) -> None:
    # Errors of the tree (they were a bare TypeError and ValueError), keeping those bases.
    backend = ag.open_backend("host")
    with pytest.raises(error, match=message) as raised:
        await backend.aclose(timeout=bad)  # type: ignore[arg-type]  # deliberately wrong
    assert isinstance(raised.value, TypeError if error is ag.ArgumentTypeError else ValueError)
    assert repr(backend) == "<HostBackend host open in_flight=0 queued=0 buffers=0>"
    x = np.ones(4, np.float32)
    (out,) = await backend.dispatch(
        SCALE, x, ag.Out(4, np.float32), np.float32(2), np.int32(4), grid=1, block=4
    )
    np.testing.assert_array_equal(out, x * 2)
    await backend.aclose(timeout=np.float64(1))


_NOT_AWAITABLE = (
    r"^open_backend\(\) is not awaitable; use 'async with asyncgraph.open_backend\(...\) as "
    r"backend:'$"
)


async def test_awaiting_open_backend_says_how_and_leaves_nothing_open() -> None:
    with pytest.raises(ag.UnsupportedError, match=_NOT_AWAITABLE):
        await ag.open_backend("host")
    gc.collect()  # the backend it made is gone, closed: no ResourceWarning
    backend = ag.open_backend("host")
    with pytest.raises(ag.UnsupportedError, match=_NOT_AWAITABLE):
        await backend
    assert repr(backend) == "<HostBackend host closed in_flight=0 queued=0 buffers=0>"
    await backend.aclose()  # harmless


async def test_awaiting_a_backend_in_use_leaves_it_open(host: ag.Backend) -> None:
    x = np.ones(4, np.float32)
    await host.dispatch(
        SCALE, x, ag.Out(4, np.float32), np.float32(2), np.int32(4), grid=1, block=4
    )
    with pytest.raises(ag.UnsupportedError, match=_NOT_AWAITABLE):
        await host
    assert not host.is_closed  # its owner still holds it and closes it


@pytest.mark.cuda
async def test_awaiting_open_backend_on_cuda_leaves_nothing_open() -> None:
    with pytest.raises(ag.UnsupportedError, match=_NOT_AWAITABLE):
        await ag.open_backend("cuda")
    gc.collect()
