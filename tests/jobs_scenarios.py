"""Steering jobs (priority classes, queue deadlines, withdrawal), one scenario per behaviour,
run alike on the host backend (``tests/test_jobs.py``) and on the CUDA backend over the
stand-in driver (``tests/fake_driver/jobs_scenario.py``, on each dispatch core).

Each scenario takes a backend of one in-flight slot (``max_in_flight=1``) and a :class:`Hold`:
the slot held by a dispatch that does not finish until ``hold.release()``, so that what is
dispatched meanwhile waits in the queue. It returns what it saw, as plain data.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

import numpy as np

import asyncgraph as ag
from asyncgraph._runtime._priority import AGING
from tests.kernels import INC

N = 4


class Hold(Protocol):
    """Holds a backend's one in-flight slot."""

    def take(self, backend: Any, priority: str = "normal") -> ag.PendingDispatch:
        """Dispatch what holds the slot (on the general path) and return it."""
        ...

    def release(self) -> None:
        """Let it finish; what is queued runs from now on, each as soon as it launches."""
        ...


def _inc(backend: ag.Backend, target: object, **steer: Any) -> ag.PendingDispatch:
    return backend.dispatch(INC, target, np.float32(1), np.int32(N), grid=1, block=N, **steer)


async def _value(backend: Any, buffer: ag.ResidentBuffer) -> float:
    return float((await backend.download(buffer))[0])


async def order(backend: Any, hold: Hold) -> dict[str, Any]:
    """Queued dispatches start high before normal before low, in call order within a class."""
    hold.take(backend)
    started: list[str] = []
    pending = []
    for i, priority in enumerate(["low", "normal", "high", "low", "high", "normal", None]):
        name = f"{priority}{i}"
        p = _inc(backend, ag.InOut(np.zeros(N, np.float32)), priority=priority)
        p.add_done_callback(partial(_append, started, name))
        pending.append(p)
    queued = backend.telemetry.snapshot().queued
    hold.release()
    await asyncio.gather(*pending)
    await asyncio.sleep(0)  # the last done callback
    snap = backend.telemetry.snapshot()
    return {
        "queued": queued,
        "started": started,
        "waits": {name: h.count for name, h in snap.queue_wait_by_class.items()},
        "latencies": {name: h.count for name, h in snap.completion_latency_by_class.items()},
    }


def _append(seen: list[str], name: str, _pending: ag.PendingDispatch) -> None:
    seen.append(name)


async def aging(backend: Any, hold: Hold) -> dict[str, Any]:
    """A queued low dispatch starts within the bound while high work keeps coming: each high
    one that finishes dispatches another, up to ``4 * AGING``."""
    hold.take(backend)
    started: list[str] = []
    pending: list[ag.PendingDispatch] = []
    total = 4 * AGING

    def high() -> None:
        name = f"high{len(pending)}"
        p = _inc(backend, ag.InOut(np.zeros(N, np.float32)), priority="high")
        pending.append(p)

        def done(_p: ag.PendingDispatch) -> None:
            started.append(name)
            if len(pending) < total:
                high()
            elif len(started) == total + 1:
                finished.set()

        p.add_done_callback(done)

    finished = asyncio.Event()
    low = _inc(backend, ag.InOut(np.zeros(N, np.float32)), priority="low")
    low.add_done_callback(partial(_append, started, "low"))
    for _ in range(4):
        high()
    hold.release()
    await low
    await asyncio.wait_for(finished.wait(), 30)
    return {"aging": AGING, "total": total, "before_low": started.index("low"), "n": len(started)}


async def timeout(backend: Any, hold: Hold) -> dict[str, Any]:
    """``queue_timeout=0.05`` behind a held slot: QueueTimeoutError within 0.1 s, the kernel
    never ran, nothing leaked; the backend goes on."""
    buffer = await backend.upload(np.zeros(N, np.float32))
    hold.take(backend)
    t0 = time.perf_counter()
    p = _inc(backend, buffer, queue_timeout=0.05)
    error = None
    try:
        await p
    except ag.QueueTimeoutError as exc:
        error = exc
    elapsed = time.perf_counter() - t0
    hold.release()
    after = await _inc(backend, ag.InOut(np.zeros(N, np.float32)), queue_timeout=0.05)
    snap = backend.telemetry.snapshot()
    return {
        "error": type(error).__name__,
        "is_timeout": isinstance(error, TimeoutError),
        "message": str(error),
        "elapsed": elapsed,
        "value": await _value(backend, buffer),
        "after": float(after[0][0]) if after else None,
        "timed_out": snap.dispatches_timed_out,
        "in_flight": snap.in_flight,
        "queued": snap.queued,
    }


async def cancel(backend: Any, hold: Hold) -> dict[str, Any]:
    """``cancel()`` withdraws a queued dispatch (True, its kernel never runs) and no launched
    one (False); the backend goes on."""
    buffer = await backend.upload(np.zeros(N, np.float32))
    held = hold.take(backend)
    p = _inc(backend, buffer)
    first, again, launched = p.cancel(), p.cancel(), held.cancel()
    error = p.exception() if p.done() else None
    hold.release()
    await held
    await _inc(backend, buffer)
    with contextlib.suppress(ag.WithdrawnError):
        await p
    return {
        "first": first,
        "again": again,
        "launched": launched,
        "error": type(error).__name__,
        "message": str(error),
        "value": await _value(backend, buffer),
        "withdrawn": backend.telemetry.snapshot().dispatches_withdrawn,
    }


async def abandoned(backend: Any, hold: Hold) -> dict[str, Any]:
    """A queued dispatch whose every awaiter was cancelled is withdrawn; one nobody awaited
    still runs (fire and forget); one a done callback waits for still runs."""
    awaited = await backend.upload(np.zeros(N, np.float32))
    unawaited = await backend.upload(np.zeros(N, np.float32))
    called = await backend.upload(np.zeros(N, np.float32))
    hold.take(backend)
    p = _inc(backend, awaited)
    tasks = [asyncio.ensure_future(_wait(p)) for _ in range(2)]
    forget = _inc(backend, unawaited)
    seen: list[int] = []
    with_callback = _inc(backend, called)
    with_callback.add_done_callback(lambda _p: seen.append(1))
    waiter = asyncio.ensure_future(_wait(with_callback))
    await asyncio.sleep(0)
    tasks[0].cancel()
    await asyncio.sleep(0)
    one_left = p.done()
    tasks[1].cancel()
    waiter.cancel()
    await asyncio.gather(*tasks, waiter, return_exceptions=True)
    hold.release()
    await forget  # it ran while nobody awaited it
    await with_callback
    return {
        "one_left": one_left,
        "error": type(p.exception()).__name__,
        "awaited": await _value(backend, awaited),
        "unawaited": await _value(backend, unawaited),
        "called": await _value(backend, called),
    }


async def _wait(p: ag.PendingDispatch) -> None:
    await p


async def dependent(backend: Any, hold: Hold) -> dict[str, Any]:
    """A queued dispatch that later work depends on (a dispatch, a download of a buffer it
    writes) is not withdrawn, by cancel() or its deadline; nor one that writes a buffer after
    a use of it that has not finished (the last of the chain: it follows one still queued)."""
    buffer = await backend.upload(np.zeros(N, np.float32))
    other = await backend.upload(np.zeros(N, np.float32))
    hold.take(backend)
    first = _inc(backend, buffer, queue_timeout=0.01)
    second = _inc(backend, buffer)
    third = _inc(backend, buffer)
    read = _inc(backend, other)
    download = asyncio.ensure_future(backend.download(other))
    await asyncio.sleep(0.05)  # past first's deadline
    refused = [first.cancel(), second.cancel(), read.cancel(), third.cancel()]
    hold.release()
    await first
    await second
    await third
    return {
        "refused": refused,
        "value": await _value(backend, buffer),
        "downloaded": float((await download)[0]),
    }


async def refused(backend: Any, hold: Hold) -> dict[str, Any]:
    """Bad priorities and deadlines are refused at the call, nothing started."""
    seen = {}
    cases: dict[str, dict[str, Any]] = {
        "name": {"priority": "urgent"},
        "number": {"priority": 1},
        "negative": {"queue_timeout": -1},
        "nan": {"queue_timeout": math.nan},
        "text": {"queue_timeout": "1"},
    }
    for case, steer in cases.items():
        try:
            _inc(backend, ag.InOut(np.zeros(N, np.float32)), **steer)
        except ag.DispatchError as exc:
            seen[case] = [type(exc).__name__, str(exc)]
    seen["dispatches"] = backend.telemetry.snapshot().dispatches
    return seen


SCENARIOS: dict[str, Callable[[Any, Hold], Awaitable[dict[str, Any]]]] = {
    "order": order,
    "aging": aging,
    "timeout": timeout,
    "cancel": cancel,
    "abandoned": abandoned,
    "dependent": dependent,
    "refused": refused,
}
