"""Closing when the event loop ends first: a later loop closes, the run waits for a close.

Each test runs its own ``asyncio.run`` calls (sync tests: pytest-asyncio's loop would be the
owner otherwise). The loop-generic variants, under trio and on a GPU too, are in
``test_loops.py``.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag

from .kernels import SCALE, Recorder, probe_kernel
from .loops import LOOPS, run

_OWN_THREADS = ("asyncgraph-host", "asyncgraph-waiter")


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(_OWN_THREADS)}


def _probe(backend: ag.Backend, rec: Recorder) -> ag.PendingDispatch:
    x = np.arange(4, dtype=np.float32)
    return backend.dispatch(
        probe_kernel(rec), x, ag.Out(4, np.float32), np.int32(4), grid=1, block=4
    )


def _assert_closed(backend: ag.Backend, before: set[threading.Thread]) -> None:
    assert repr(backend) == "<HostBackend host closed in_flight=0 queued=0 buffers=0>"
    assert backend._store.bytes_live == 0
    assert _threads() - before == set()  # its worker threads were joined
    gc.collect()  # and it does not warn that it was not closed (ResourceWarning is an error)


def test_a_later_loop_closes_a_backend_whose_loop_ended() -> None:
    before = _threads()

    async def use() -> tuple[ag.Backend, ag.ResidentBuffer]:
        backend = ag.open_backend("host")
        buffer = await backend.upload(np.ones(4, np.float32))
        (out,) = await backend.dispatch(
            SCALE, np.ones(4, np.float32), ag.Out(4, np.float32), np.float32(2), np.int32(4),
            grid=1, block=4,
        )  # fmt: skip
        np.testing.assert_array_equal(out, np.full(4, 2.0))
        return backend, buffer

    backend, buffer = asyncio.run(use())
    assert _threads() - before  # a worker thread runs on
    asyncio.run(backend.aclose())
    assert buffer.is_closed
    _assert_closed(backend, before)
    asyncio.run(backend.aclose())  # idempotent, from yet another loop


def test_a_later_loop_waits_for_the_work_the_ended_loop_left() -> None:
    before = _threads()
    rec = Recorder()
    rec.release.clear()

    async def start() -> tuple[ag.Backend, list[ag.PendingDispatch]]:
        backend = ag.open_backend("host", max_in_flight=1)
        return backend, [_probe(backend, rec), _probe(backend, rec)]

    backend, (running, queued) = asyncio.run(start())
    threading.Timer(0.05, rec.release.set).start()
    asyncio.run(backend.aclose())
    assert running.done()
    np.testing.assert_array_equal(running.result()[0], np.arange(4) * 2)
    with pytest.raises(
        ag.BackendClosedError,
        match=r"^backend host was left open when its event loop ended, before dispatch #2 of "
        r"'probe' started$",
    ):
        queued.result()
    snap = backend.telemetry.snapshot()
    assert (snap.dispatches_completed, snap.dispatches_failed) == (1, 1)
    _assert_closed(backend, before)


def test_a_dispatch_in_flight_when_its_loop_ends_still_resolves() -> None:
    rec = Recorder()
    rec.release.clear()

    async def start() -> tuple[ag.Backend, ag.PendingDispatch]:
        backend = ag.open_backend("host")
        return backend, _probe(backend, rec)

    backend, pending = asyncio.run(start())
    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(pending.result, 5)  # blocks in another thread
        rec.release.set()
        (out,) = result.result()
    np.testing.assert_array_equal(out, np.arange(4) * 2)
    assert backend.telemetry.snapshot().dispatches_completed == 1
    asyncio.run(backend.aclose())
    assert backend.is_closed


def test_closing_from_a_loop_in_another_thread_is_refused_while_the_owner_runs() -> None:
    async def main() -> None:
        backend = ag.open_backend("host")
        with pytest.raises(
            ag.UnsupportedError,
            match=r"^backend host belongs to another event loop, which is still open; close it "
            r"on that loop \(from another thread: "
            r"asyncio.run_coroutine_threadsafe\(backend.aclose\(\), loop\)\)$",
        ):
            await asyncio.to_thread(asyncio.run, backend.aclose())
        assert repr(backend) == "<HostBackend host open in_flight=0 queued=0 buffers=0>"
        (out,) = await backend.dispatch(
            SCALE, np.ones(2, np.float32), ag.Out(2, np.float32), np.float32(3), np.int32(2),
            grid=1, block=2,
        )  # fmt: skip
        np.testing.assert_array_equal(out, np.full(2, 3.0))
        await backend.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("how", ["left running", "cancelled"])
def test_a_close_the_loop_ends_during_still_finishes(how: str) -> None:
    before = _threads()
    rec = Recorder()
    rec.release.clear()
    kept: dict[str, Any] = {}

    async def main() -> None:
        backend = kept["backend"] = ag.open_backend("host")
        kept["buffer"] = await backend.upload(np.ones(4, np.float32))
        kept["pending"] = _probe(backend, rec)
        threading.Timer(0.2, rec.release.set).start()  # after the checks below
        if how == "left running":
            kept["task"] = asyncio.create_task(backend.aclose())
            await asyncio.sleep(0)
        else:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(backend.aclose(), 0.01)
        assert repr(backend) == "<HostBackend host closing in_flight=1 queued=0 buffers=1>"

    asyncio.run(main())  # it cancels the close, then waits for it
    assert kept["pending"].done()
    assert kept["buffer"].is_closed
    _assert_closed(kept["backend"], before)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_backend_opened_outside_a_loop_closes_before_any_use(loop: Any) -> None:
    """As in the quickstart's options: opened with no loop running, then closed on one."""
    before = _threads()
    backend = ag.open_backend("host", host_workers=2)
    run(loop, backend.aclose)
    _assert_closed(backend, before)
    run(loop, backend.aclose)  # idempotent, from another run too
