"""The dispatch cores' failure paths, on the CUDA backend over the stand-in driver.

``python -m tests.fake_driver.core_scenario NAME`` runs one and prints what it saw as one JSON
line; ``tests/test_core_failures.py`` runs them on each dispatch core.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import structlog

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE
from asyncgraph._cuda.core._choose import core
from tests.fake_driver import reset
from tests.kernels import INC

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_last_launch.restype = ctypes.c_ulonglong
N = 1024


def _mode(mode: str) -> None:
    _lib.fake_set_complete_mode(mode.encode())


def _launches() -> int:
    """How many kernels the stand-in was asked to launch so far."""
    dims = (ctypes.c_uint * 7)()
    stream = ctypes.c_size_t()
    params = (ctypes.c_ubyte * 16)()
    return int(_lib.fake_last_launch(dims, ctypes.byref(stream), params, 0))


def _inc(gpu: Any, buffer: Any) -> Any:
    return gpu.dispatch(INC, buffer, np.float32(1), np.int32(N), grid=4, block=256)


def _scale(gpu: Any, x: Any) -> Any:
    return gpu.dispatch(
        SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
    )


def _tracking(buffer: Any) -> list[Any]:
    """The buffer's record of its uses in flight (private fields, read by a test on purpose)."""
    return [buffer._in_use, buffer._writer is None, len(buffer._readers)]


def _error(call: Callable[[], Any]) -> str:
    try:
        call()
    except Exception as exc:
        return type(exc).__name__
    return "no error"


class _Refusing(int):
    """A stream's count of work that refuses to grow once: a step of the commit that raises."""

    def __add__(self, other: Any) -> Any:
        raise RuntimeError("injected: the commit step failed")


async def commit_fails() -> dict[str, Any]:
    """A step of the fast path's commit raises (the lane's count refuses to grow), for a
    dispatch that writes a resident buffer and one that reads it: nothing may be left of
    either, and the buffer and the backend still close."""
    seen: dict[str, Any] = {}
    x = np.ones(N, np.float32)
    gpu: Any = ag.open_backend("cuda", streams=1)
    for kernel in (SCALE, INC):
        await gpu.compile(kernel)
    buf = await gpu.upload(x)
    for _ in range(2):  # plans made: the fast path takes the next ones
        await _inc(gpu, buf)
        await _scale(gpu, buf)
    slot = gpu.stream_pool.lanes[0]
    fast = gpu.telemetry.snapshot().fast_path_dispatches
    launches = _launches()
    for name, use in (("writer", _inc), ("reader", _scale)):
        slot.outstanding = _Refusing(slot.outstanding)
        error = _error(lambda use=use: use(gpu, buf))  # type: ignore[misc]  # bound now
        slot.outstanding = int(slot.outstanding)
        seen[name] = {
            "error": error,
            "tracking": _tracking(buf),
            "outstanding": gpu.outstanding,
            "lane": int(slot.outstanding),
        }
    seen["launched"] = _launches() - launches
    seen["fast"] = gpu.telemetry.snapshot().fast_path_dispatches - fast
    try:  # the backend goes on, and closes (a use left behind would hold both forever)
        await asyncio.wait_for(_inc(gpu, buf), 5)
        seen["right"] = bool(np.array_equal(await gpu.download(buf), x + 3))
        await buf.aclose()
        await asyncio.wait_for(gpu.aclose(), 5)
        seen["closed"] = True
    except TimeoutError:
        seen["closed"] = False
    return seen


PAIR = ag.Kernel(
    r"""
extern "C" __global__ void pair(float* a, const float* b, int n) { }
""",
    "pair",
)


def _uses(buffer: Any) -> list[Any]:
    """The buffer's uses in flight, by identity (private fields, read by a test on purpose)."""
    return [int(buffer._in_use), id(buffer._writer), [id(use) for use in buffer._readers]]


async def tracking_fails() -> dict[str, Any]:
    """The commit tracks a dispatch's first buffer (written: its writer and readers replaced),
    then the second one's tracking raises: the first must be put back exactly as it was, its
    unfinished uses included, or a later use would not wait for them."""
    x = np.ones(N, np.float32)
    gpu: Any = ag.open_backend("cuda", streams=1)
    for kernel in (SCALE, INC, PAIR):
        await gpu.compile(kernel)
    first, second = await gpu.upload(x), await gpu.upload(x)
    for _ in range(2):  # plans made
        await gpu.dispatch(PAIR, first, second, np.int32(N), grid=4, block=256)
        await _inc(gpu, first)
        await _scale(gpu, first)
    _mode("manual")  # uses of the first buffer still running: a writer, then a reader
    running = [_inc(gpu, first), _scale(gpu, first)]
    before = _uses(first)
    second._in_use = _Refusing(0)
    error = _error(lambda: gpu.dispatch(PAIR, first, second, np.int32(N), grid=4, block=256))
    seen = {
        "error": error,
        "first_put_back": _uses(first) == before,
        "first_uses": _uses(first)[0],
        "second_in_use": int(second._in_use),
        "outstanding": gpu.outstanding,
    }
    second._in_use = 0
    _mode("instant")
    for pending in running:
        await pending
    seen["right"] = bool(np.array_equal(await gpu.download(first), x + 3))
    for buffer in (first, second):
        await buffer.aclose()
    try:
        await asyncio.wait_for(gpu.aclose(), 5)
        seen["closed"] = True
    except TimeoutError:
        seen["closed"] = False
    return seen


async def readers_not_a_list() -> dict[str, Any]:
    """A buffer's readers field cannot hold something else than a list: the compiled build of
    its module refuses the assignment, and the buffer's dispatches go on as before."""
    x = np.ones(N, np.float32)
    async with ag.open_backend("cuda") as gpu:
        for kernel in (SCALE, INC):
            await gpu.compile(kernel)
        buf: Any = await gpu.upload(x)
        for _ in range(2):
            await _inc(gpu, buf)
            await _scale(gpu, buf)
        try:
            buf._readers = ("not", "a", "list")  # a layout change, say
            assigned = "no error"
        except TypeError:
            assigned = "TypeError"
        fast = gpu.telemetry.snapshot().fast_path_dispatches
        (out,) = await _scale(gpu, buf)
        await _inc(gpu, buf)
        right = bool(np.array_equal(out, 2 * (x + 2))) and bool(
            np.array_equal(await gpu.download(buf), x + 3)
        )
        taken = gpu.telemetry.snapshot().fast_path_dispatches - fast
        outstanding = gpu.outstanding
        await buf.aclose()
    return {"assigned": assigned, "right": right, "fast": taken, "outstanding": outstanding}


async def _warm(gpu: Any) -> None:
    """The kernel compiled and its plan made: the fast path takes the next dispatches."""
    await gpu.compile(SCALE)
    for _ in range(3):
        await _scale(gpu, np.ones(N, np.float32))


def _attempt(gpu: Any) -> dict[str, Any]:
    """A dispatch, from wherever this runs: what it said, and what it started."""
    launches = _launches()
    fast = gpu.telemetry.snapshot().fast_path_dispatches
    try:
        _scale(gpu, np.ones(N, np.float32))
        outcome = "dispatched"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    return {
        "outcome": outcome,
        "launched": _launches() - launches,
        "outstanding": gpu.outstanding,
        "fast": gpu.telemetry.snapshot().fast_path_dispatches - fast,
    }


async def nested_loop() -> dict[str, Any]:
    """A second event loop runs inside the backend's, on its thread (as nest_asyncio runs
    one), and dispatches: the backend belongs to the outer loop."""
    async with ag.open_backend("cuda") as gpu:
        await _warm(gpu)
        outer = asyncio.get_running_loop()
        inner = asyncio.new_event_loop()

        async def use() -> dict[str, Any]:
            return _attempt(gpu)

        asyncio.events._set_running_loop(None)  # what nest_asyncio does to run the inner one
        try:
            seen = inner.run_until_complete(use())
        finally:
            asyncio.events._set_running_loop(outer)
            inner.close()
    return seen


async def forked() -> dict[str, Any]:
    """The process forks inside a coroutine, and the child dispatches on the parent's
    backend: no loop runs in the child."""
    async with ag.open_backend("cuda") as gpu:
        await _warm(gpu)
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # the child: say what happened, and leave at once
            try:
                os.write(write, json.dumps(_attempt(gpu)).encode())
            finally:
                os._exit(0)
        os.close(write)
        return _heard(child, read)


def _heard(child: int, read: int) -> dict[str, Any]:
    """What *child* wrote to the pipe *read*, once it exited."""
    with os.fdopen(read) as pipe:
        seen: dict[str, Any] = json.loads(pipe.read() or "{}")
    os.waitpid(child, 0)
    return seen


async def _hang(gpu: Any) -> Any:
    """A dispatch whose kernel never finishes (the stand-in's events complete by hand only),
    handed to a waiter thread by the time this returns."""
    await _warm(gpu)
    _mode("manual")
    pending = _scale(gpu, np.ones(N, np.float32))
    await asyncio.sleep(0.3)  # the reactor's poll window is long over: a waiter holds it
    return pending


def _backend_events(logs: list[Any]) -> list[str]:
    return [e["event"] for e in logs if str(e["event"]).startswith("backend.")]


async def hung_close() -> dict[str, Any]:
    """``aclose(timeout=...)`` while a kernel has not finished: the timeout fails nothing that
    runs, says what still runs, and the close waits for it (a kernel that finishes late is no
    hung one: its result is kept); once it finishes, the close ends."""
    with structlog.testing.capture_logs() as logs:
        gpu = ag.open_backend("cuda")
        pending = await _hang(gpu)
        closing = asyncio.create_task(gpu.aclose(timeout=0.2))
        await asyncio.sleep(0.6)
        waited = not closing.done()
        waits = [e for e in logs if e["event"] == "backend.close_waits"]
        _mode("instant")  # the kernel finishes now
        began = time.perf_counter()
        await closing
        took = time.perf_counter() - began
    (out,) = pending.result()
    return {
        "waited": waited,
        "took": took,
        "closed": gpu.is_closed,
        "right": bool(np.array_equal(out, 2 * np.ones(N, np.float32))),
        "failure": getattr(gpu.failure, "name", None),
        "events": _backend_events(logs),
        "waits": waits[0]["dispatches"] == [pending.dispatch_id] if waits else False,
        "poisoned": ag.process_fault() is not None,
    }


_KEPT: list[Any] = []


def hung_exit(kept: bool) -> dict[str, Any]:
    """The backend is left unclosed while a kernel never finishes, dropped (or *kept* to the
    end), and the process exits: that must not wait for the kernel."""
    with structlog.testing.capture_logs() as logs:
        gpu: Any = asyncio.run(_dropped())
        if kept:
            _KEPT.append(gpu)  # still referenced when the interpreter shuts down
        del gpu
        gc.collect()
    return {"events": _backend_events(logs)}


async def _dropped() -> Any:
    gpu = ag.open_backend("cuda")
    await _hang(gpu)
    return gpu


async def catch_up() -> dict[str, Any]:
    """Two dispatches complete while the reactor's poll waits behind a busy callback; the task
    that then dispatches a third and awaits it (``__await__`` spins first) finishes the first
    two before the loop polls, and leaves its own to the poll (deferred streams: the first two
    complete only when the streams are run here)."""
    gpu: Any
    async with ag.open_backend("cuda") as gpu:
        await _warm(gpu)
        reactor = gpu._cuda.device.reactor  # its counters, read by a test on purpose
        x = np.arange(N, dtype=np.float32)
        _mode("manual")
        first, second = _scale(gpu, x), _scale(gpu, x + 1)
        _lib.fake_run_streams()  # both completed on the "GPU"; nobody has queried them
        _mode("instant")
        time.sleep(0.001)  # noqa: ASYNC251  # the loop is busy: its poll waited a millisecond
        polls, spins = reactor.polls, reactor.spins
        third = _scale(gpu, x + 2)
        reactor.spin()  # what awaiting it does before the task yields
        seen = {
            "done": [first.done(), second.done(), third.done()],
            "polls": reactor.polls - polls,
            "spins": reactor.spins - spins,
        }
        results = [(await pending)[0] for pending in (first, second, third)]
        seen["right"] = [bool(np.array_equal(results[k], 2 * (x + k))) for k in range(3)]
        return seen


async def _spins(seconds: float, times: int) -> dict[str, Any]:
    """*times* awaits, one at a time, of a spin kernel of *seconds* (deferred streams: that
    much wall time); the reactor's hand-offs and pokes, and the kernel's done flag."""
    from asyncgraph._demo._spin_kernel import SPIN

    gpu: Any
    async with ag.open_backend("cuda") as gpu:
        await gpu.compile(SPIN)
        done = gpu.empty(1, np.int32)
        reactor = gpu._cuda.device.reactor  # its counters, read by a test on purpose
        cycles = np.int64(2e9 * seconds)  # at the stand-in's clock (2 GHz)
        for _ in range(times):
            await gpu.dispatch(SPIN, cycles, done, grid=1, block=1)
        (flag,) = await gpu.download(done)
        return {"handoffs": reactor.handoffs, "pokes": reactor.pokes, "flag": int(flag)}


async def expected_end() -> dict[str, Any]:
    """Awaits of a 20 ms spin kernel, one at a time: from the second on, its plan's time is
    known, and the waiter pokes the loop before the kernel ends."""
    return await _spins(0.02, 6)


async def long_wait() -> dict[str, Any]:
    """Awaits of a 0.3 s spin kernel, the second with its time known: the waiter follows the
    event past ``FOLLOW_LONG_AFTER`` in longer sleeps and never sleeps in
    ``cuEventSynchronize`` (the Python core's call of it, through the bindings, is counted
    here)."""
    from cuda.bindings import driver as drv

    synchronized: list[object] = []
    real = drv.cuEventSynchronize

    def counted(event: object) -> Any:
        synchronized.append(event)
        return real(event)

    drv.cuEventSynchronize = counted
    try:
        seen = await _spins(0.3, 2)
    finally:
        drv.cuEventSynchronize = real
    return {**seen, "synchronized": len(synchronized)}


async def stale_expectation() -> dict[str, Any]:
    """A spin kernel's plan learns 200 ms from its first await, then runs 5 ms (deferred
    streams: wall time). The second await's waiter, handed a wake time near 200 ms, follows the
    event meanwhile: it reports the end when it comes, and pokes nobody."""
    from asyncgraph._demo._spin_kernel import SPIN

    gpu: Any
    async with ag.open_backend("cuda") as gpu:
        await gpu.compile(SPIN)
        done = gpu.empty(1, np.int32)
        reactor = gpu._cuda.device.reactor  # its counters, read by a test on purpose
        for seconds in (0.001, 0.2):  # the first dispatch of a plan learns nothing
            await gpu.dispatch(SPIN, np.int64(2e9 * seconds), done, grid=1, block=1)
        handoffs, pokes = reactor.handoffs, reactor.pokes
        await gpu.dispatch(SPIN, np.int64(2e9 * 0.005), done, grid=1, block=1)
        (flag,) = await gpu.download(done)
        return {
            "handoffs": reactor.handoffs - handoffs,
            "pokes": reactor.pokes - pokes,
            "flag": int(flag),
        }


async def spin_skip() -> dict[str, Any]:
    """A lone watched event whose work is expected to end a second from now gets one query from
    ``spin()``, not a spin of its window: completed, it resolves inline; still running (the
    stand-in answers two queries NOT_READY), it is left to the poll. Expected to end at an
    unknown time, the same event is spun for until it completes (a window of 10 ms: time for
    three queries on any machine)."""
    gpu: Any
    async with ag.open_backend("cuda", spin_window=0.01) as gpu:
        device = gpu._cuda.device  # the reactor and a lane, driven by a test on purpose
        reactor, lane = device.reactor, device.lanes[0]
        seen: dict[str, Any] = {}
        cases = (
            ("far_done", "instant", 1.0),
            ("far", "queries:2", 1.0),
            ("unknown", "queries:2", 0),
        )
        for label, mode, away in cases:
            _mode(mode)
            done: list[object] = []
            ended = asyncio.Event()

            def finished(error: object, done: list[object] = done, ended: Any = ended) -> None:
                done.append(error)
                ended.set()

            expect = time.perf_counter() + away if away else 0.0
            reactor.watch(lane.index, lane.record(), finished, expect)
            spins = reactor.spins
            reactor.spin()
            seen[label] = {"spun": reactor.spins - spins, "done_inline": len(done)}
            # The loop's poll, or the waiter thread it hands the event to, completes it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), 30.0)
            seen[label]["done"] = len(done)
        _mode("instant")
        return seen


async def learned_times() -> dict[str, Any]:
    """Dispatches of one kernel with twelve input sizes (twelve plans, of which the plan cache
    keeps ``MAX_PLANS``), awaited twice each: how many plans' times the general path
    (``SmallPath``) learned and still holds once the others were let go of, and whether the
    last one's watch carried an expected end."""
    import gc

    from asyncgraph._args._plan_cache import MAX_PLANS

    gpu: Any
    async with ag.open_backend("cuda", fast_path_enabled=False) as gpu:
        small = gpu._cuda.small  # its learned times, read by a test on purpose
        reactor = gpu._cuda.device.reactor
        expects: list[float] = []
        real = reactor.watch

        def watch(lane: int, event: Any, callback: Any, expect: float = 0.0) -> Any:
            expects.append(expect)
            return real(lane, event, callback, expect)

        reactor.watch = watch
        try:
            for size in range(1, 13):
                x = np.ones(size * 8, np.float32)
                for _ in range(2):
                    await gpu.dispatch(
                        SCALE,
                        x,
                        ag.Out(x.size, np.float32),
                        np.float32(2),
                        np.int32(x.size),
                        grid=1,
                        block=256,
                    )
        finally:
            reactor.watch = real
        gc.collect()
        return {
            "held": len(small._took),
            "max_plans": MAX_PLANS,
            "first_expect": expects[0],
            "second_expect": expects[1] > 0.0,
        }


SCENARIOS: dict[str, Callable[..., Any]] = {
    "commit_fails": commit_fails,
    "readers_not_a_list": readers_not_a_list,
    "tracking_fails": tracking_fails,
    "nested_loop": nested_loop,
    "forked": forked,
    "hung_close": hung_close,
    "hung_exit": hung_exit,
    "catch_up": catch_up,
    "expected_end": expected_end,
    "stale_expectation": stale_expectation,
    "spin_skip": spin_skip,
    "long_wait": long_wait,
    "learned_times": learned_times,
}


def _say(seen: dict[str, Any]) -> None:
    print(json.dumps({"compiled": bool(core.COMPILED)} | seen), flush=True)
    if seen.get("closed") is False:
        os._exit(0)  # a close that never ends: asyncio.run would wait for it


async def _main(name: str) -> None:
    _say(await SCENARIOS[name]())


if __name__ == "__main__":
    reset(_lib)
    _mode("instant")
    if sys.argv[1] == "hung_exit":  # runs its own loop, and the process's exit is the point
        _say(hung_exit(sys.argv[2:] == ["kept"]))
    else:
        asyncio.run(_main(sys.argv[1]))
