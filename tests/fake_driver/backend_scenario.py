"""Whole-backend scenarios against the stand-in driver, each in a process of its own.

``python -m tests.fake_driver.backend_scenario [NAME...]`` runs them (all by default) on the
CUDA backend (the stand-in loaded as ``libcuda.so.1``: ``tests.fake_driver.environment``) and
prints what each observed, as one JSON line; ``tests/test_fast_path.py`` runs them on each
dispatch core and checks the observations. Most compare the fast path with the general path
(``fast_path_enabled=False``) on the same inputs, fresh random ones each run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import asyncgraph as ag
from asyncgraph._bench._bench_run import EMPTY, SCALE
from asyncgraph._cuda.core._choose import core
from asyncgraph._jobs._pending import PendingDispatch
from tests.fake_driver import reset
from tests.kernels import FILL, INC

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_live_allocations.restype = ctypes.c_long
_lib.fake_live_events.restype = ctypes.c_long
_lib.fake_live_streams.restype = ctypes.c_long

SAXPY = ag.Kernel(
    r"""
extern "C" __global__ void saxpy(const float* x, const float* y, float* out, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
""",
    "saxpy",
)
N = 1024
Array = np.ndarray[Any, Any]


def _open(**options: Any) -> Any:
    """The CUDA backend (on the stand-in), typed loosely: scenarios use its CUDA-only API."""
    return ag.open_backend("cuda", **options)


def _mode(mode: str) -> None:
    _lib.fake_set_complete_mode(mode.encode())


def _rng() -> np.random.Generator:
    return np.random.default_rng()


async def _compiled(gpu: Any) -> None:
    for kernel in (EMPTY, SCALE, INC, FILL, SAXPY):
        await gpu.compile(kernel)


async def _mix(gpu: Any, rng: np.random.Generator, rounds: int) -> dict[str, float]:
    """Every argument kind the fast path takes, checked against numpy; the largest error."""
    worst = {"scale": 0.0, "saxpy": 0.0, "in_out": 0.0, "chain": 0.0, "into": 0.0, "fill": 0.0}
    for _ in range(rounds):
        x = rng.standard_normal(N, dtype=np.float32)
        y = rng.standard_normal(N, dtype=np.float32)
        a = np.float32(rng.standard_normal())
        (out,) = await gpu.dispatch(
            SCALE, x, ag.Out(N, np.float32), a, np.int32(N), grid=4, block=256
        )
        worst["scale"] = max(worst["scale"], float(np.abs(out - a * x).max()))
        (out,) = await gpu.dispatch(
            SAXPY, x, y, ag.Out(N, np.float32), a, np.int32(N), grid=4, block=256
        )
        worst["saxpy"] = max(worst["saxpy"], float(np.abs(out - (a * x + y)).max()))
        (bumped,) = await gpu.dispatch(INC, ag.InOut(x), a, np.int32(N), grid=4, block=256)
        worst["in_out"] = max(worst["in_out"], float(np.abs(bumped - (x + a)).max()))
        buf = await gpu.upload(x)
        steps = int(rng.integers(2, 12))
        for _ in range(steps):
            await gpu.dispatch(INC, buf, a, np.int32(N), grid=4, block=256)
        expected = x.copy()
        for _ in range(steps):
            expected += a
        worst["chain"] = max(
            worst["chain"], float(np.abs(await gpu.download(buf) - expected).max())
        )
        dst = gpu.empty(N, np.float32)
        (same,) = await gpu.dispatch(
            SCALE, buf, ag.Out(into=dst), a, np.int32(N), grid=4, block=256
        )
        got = await gpu.download(same)
        worst["into"] = max(
            worst["into"], float(np.abs(got - a * expected).max()) + (same is not dst)
        )
        big = np.int64(N)
        (filled,) = await gpu.dispatch(FILL, ag.Out(N, np.float32), a, big, grid=4, block=256)
        worst["fill"] = max(worst["fill"], float(np.abs(filled - a).max()))
        await buf.aclose()
        await dst.aclose()
    return worst


async def results() -> dict[str, Any]:
    """The same random work on the fast path and the general path: errors and what ran."""
    seen: dict[str, Any] = {}
    for fast in (True, False):
        async with _open(fast_path_enabled=fast) as gpu:
            await _compiled(gpu)
            worst = await _mix(gpu, _rng(), 5)
            snap = gpu.telemetry.snapshot()
            seen["fast" if fast else "general"] = {
                "worst": worst,
                "dispatches": snap.dispatches,
                "fast_path_dispatches": snap.fast_path_dispatches,
                "failed": snap.dispatches_failed,
            }
    return seen


def _calls(gpu: Any, stale: Any, foreign: Any) -> dict[str, Callable[[], Any]]:
    """Invalid variants of a planned call, each refused by the general path's checks."""
    x = np.ones(N, np.float32)
    out = ag.Out(N, np.float32)
    a, n = np.float32(2), np.int32(N)

    def call(*args: Any, **keywords: Any) -> Callable[[], Any]:
        keywords.setdefault("grid", 4)
        keywords.setdefault("block", 256)
        return lambda: gpu.dispatch(SCALE, *args, **keywords)

    return {
        "float64 input": call(x.astype(np.float64), out, a, n),
        "strided input": call(np.ones(2 * N, np.float32)[::2], out, a, n),
        "Python float": call(x, out, 2.0, n),
        "int64 scalar": call(x, out, a, np.int64(N)),
        "Out of float64": call(x, ag.Out(N, np.float64), a, n),
        "one argument short": call(x, out, a),
        "grid of True": call(x, out, a, n, grid=True),
        "block too large": call(x, out, a, n, block=4096),
        "shared memory too large": call(x, out, a, n, shared_mem=1 << 30),
        "closed buffer": call(stale, out, a, n),
        "another backend's buffer": call(foreign, out, a, n),
        "timing of a string": call(x, out, a, n, timing="yes"),
        "graph of a number": call(x, out, a, n, graph=3),
    }


async def errors() -> dict[str, Any]:
    """Each invalid variant of a call the fast path knows: the error, on either path."""
    seen: dict[str, Any] = {}
    async with ag.open_backend("host") as host:
        foreign = await host.upload(np.ones(N, np.float32))
        for fast in (True, False):
            async with _open(fast_path_enabled=fast) as gpu:
                await _compiled(gpu)
                x = np.ones(N, np.float32)
                for _ in range(3):  # planned, and (on the fast path) launched from the plan
                    await gpu.dispatch(
                        SCALE,
                        x,
                        ag.Out(N, np.float32),
                        np.float32(2),
                        np.int32(N),
                        grid=4,
                        block=256,
                    )
                stale = await gpu.upload(x)
                await gpu.dispatch(
                    SCALE,
                    stale,
                    ag.Out(N, np.float32),
                    np.float32(2),
                    np.int32(N),
                    grid=4,
                    block=256,
                )
                await stale.aclose()
                outcome = {}
                for name, make in _calls(gpu, stale, foreign).items():
                    try:
                        await make()
                    except Exception as exc:
                        outcome[name] = [type(exc).__name__, str(exc)]
                    else:
                        outcome[name] = ["no error", ""]
                # The backend goes on after each.
                (after,) = await gpu.dispatch(
                    SCALE, x, ag.Out(N, np.float32), np.float32(3), np.int32(N), grid=4, block=256
                )
                outcome["after"] = ["ok" if np.array_equal(after, 3 * x) else "wrong", ""]
                seen["fast" if fast else "general"] = outcome
        await foreign.aclose()
    return seen


async def _concurrent(gpu: Any, tasks: int, rounds: int, size: int) -> int:
    """*tasks* tasks awaiting *rounds* dispatches each; how many results were wrong."""
    wrong = 0

    async def worker(seed: int) -> None:
        nonlocal wrong
        rng = np.random.default_rng(seed)
        for _ in range(rounds):
            x = rng.standard_normal(size, dtype=np.float32)
            a = np.float32(rng.standard_normal())
            (out,) = await gpu.dispatch(
                SCALE,
                x,
                ag.Out(size, np.float32),
                a,
                np.int32(size),
                grid=(size + 255) // 256,
                block=256,
            )
            wrong += not np.array_equal(out, a * x)

    await asyncio.gather(*(worker(int(s)) for s in _rng().integers(0, 1 << 30, tasks)))
    return wrong


async def concurrency() -> dict[str, Any]:
    """Many tasks at once: the steady state, a bound in-flight count (queued work completes the
    general way), and staging larger than the rings hold (the general path takes over)."""
    seen: dict[str, Any] = {}
    cases = {"64 tasks": ({}, 64, 20, N), "8 in flight": ({"max_in_flight": 8}, 32, 20, N),
             "rings full": ({}, 64, 4, 12_000)}  # fmt: skip
    for name, (options, tasks, rounds, size) in cases.items():
        _mode("queries:3")  # polls find some running: the reactor's lanes fill up
        async with _open(**options) as gpu:
            await _compiled(gpu)
            wrong = await _concurrent(gpu, tasks, rounds, size)
            snap = gpu.telemetry.snapshot()
            for _ in range(200):  # an event a waiter thread still holds comes back when it wakes
                events = gpu.event_statistics()
                if events.created == events.idle:
                    break
                await asyncio.sleep(0.01)
            seen[name] = {
                "wrong": wrong,
                "dispatches": snap.dispatches,
                "completed": snap.dispatches_completed,
                "fast_path_dispatches": snap.fast_path_dispatches,
                "in_flight": snap.in_flight,
                "events_out": events.created - events.idle,
                "pinned_in_use": gpu.pinned_pool.statistics().bytes_in_use,
            }
    return seen


async def ordering() -> dict[str, Any]:
    """Uses of one buffer alternating between the fast path and the general path (timing=True
    goes the general way), with downloads between: each sees the ones before it."""
    rng = _rng()
    async with _open() as gpu:
        await _compiled(gpu)
        x = rng.standard_normal(N, dtype=np.float32)
        buf = await gpu.upload(x)
        expected = x.copy()
        checks = []
        pendings = []
        for i in range(40):
            step = np.float32(i % 7 - 3)
            pendings.append(
                gpu.dispatch(INC, buf, step, np.int32(N), grid=4, block=256, timing=i % 3 == 0)
            )
            expected += step
            if i % 10 == 9:
                checks.append(bool(np.array_equal(await gpu.download(buf), expected)))
        for pending in pendings:
            await pending
        snap = gpu.telemetry.snapshot()
        return {
            "checks": checks,
            "fast_path_dispatches": snap.fast_path_dispatches,
            "dispatches": snap.dispatches,
            "tracking": _tracking(buf),
        }


def _tracking(buffer: Any) -> list[Any]:
    """The buffer's record of its uses in flight (private fields, read by a test on purpose)."""
    return [buffer._in_use, buffer._writer is None, len(buffer._readers)]


async def cancel() -> dict[str, Any]:
    """A task awaiting a fast-path dispatch is cancelled while the kernel runs: the dispatch
    still completes, and everything it held comes back."""
    async with _open() as gpu:
        await _compiled(gpu)
        x = np.ones(N, np.float32)
        for _ in range(3):
            await gpu.dispatch(
                SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
            )
        before = gpu.telemetry.snapshot().fast_path_dispatches
        _mode("manual")  # the kernel "runs" until the mode changes
        pending = gpu.dispatch(
            SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
        )
        task = asyncio.ensure_future(_awaited(pending))
        await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        was_done = pending.done()
        _mode("instant")
        (out,) = await pending
        for _ in range(10):
            await asyncio.sleep(0)
        snap = gpu.telemetry.snapshot()
        events = gpu.event_statistics()
        return {
            "fast": snap.fast_path_dispatches - before,
            "done_when_cancelled": was_done,
            "result": bool(np.array_equal(out, 2 * x)),
            "in_flight": snap.in_flight,
            "events_out": events.created - events.idle,
        }


async def _awaited(pending: Awaitable[Any]) -> Any:
    return await pending


async def fault() -> dict[str, Any]:
    """A fault on a fast-path dispatch: it fails, the backend refuses work, and closes."""
    _lib.fake_fail_next_events.argtypes = [ctypes.c_int, ctypes.c_int]
    seen: dict[str, Any] = {}
    gpu = _open()
    await _compiled(gpu)
    x = np.ones(N, np.float32)
    for _ in range(3):
        await gpu.dispatch(
            SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
        )
    before = gpu.telemetry.snapshot().fast_path_dispatches
    _lib.fake_fail_next_events(1, 700)
    try:
        await gpu.dispatch(
            SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
        )
    except Exception as exc:
        seen["failed"] = type(exc).__name__
    seen["fast"] = gpu.telemetry.snapshot().fast_path_dispatches - before
    try:
        gpu.dispatch(SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256)
    except Exception as exc:
        seen["later"] = type(exc).__name__
    await gpu.aclose()
    seen["closed"] = gpu.is_closed
    return seen


async def close() -> dict[str, Any]:
    """Dispatches still in flight when the backend closes: each completes, then everything the
    backend holds is freed (what the stand-in still counts live afterwards)."""
    base = {"allocations": _lib.fake_live_allocations(), "events": _lib.fake_live_events(),
            "streams": _lib.fake_live_streams()}  # fmt: skip
    x = np.ones(N, np.float32)
    _mode("queries:5")
    async with _open() as gpu:
        await _compiled(gpu)
        buf = await gpu.upload(x)
        for _ in range(3):
            await gpu.dispatch(
                SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
            )
        pendings = [
            gpu.dispatch(
                SCALE, buf, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
            )
            for _ in range(50)
        ]
        fast = gpu.telemetry.snapshot().fast_path_dispatches
    done = sum(p.done() and p.exception() is None for p in pendings)
    return {
        "fast": fast,
        "completed": done,
        "live": {
            "allocations": _lib.fake_live_allocations() - base["allocations"],
            "events": _lib.fake_live_events() - base["events"],
            "streams": _lib.fake_live_streams() - base["streams"],
        },
    }


async def telemetry() -> dict[str, Any]:
    """The same work on either path: the counts and histograms' sizes the snapshot gives."""
    seen: dict[str, Any] = {}
    rng = np.random.default_rng(11)
    x = rng.standard_normal(N, dtype=np.float32)
    for fast in (True, False):
        async with _open(fast_path_enabled=fast) as gpu:
            await _compiled(gpu)
            buf = await gpu.upload(x)
            for _ in range(20):
                await gpu.dispatch(
                    SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
                )
                await gpu.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
                await gpu.dispatch(EMPTY, np.int32(1), grid=1, block=1)
            snap = gpu.telemetry.snapshot()
            counts = ("dispatches", "dispatches_completed", "dispatches_failed", "bytes_up",
                      "bytes_down", "copies_up", "copies_down")  # fmt: skip
            histograms = ("queue_wait", "submit_time", "completion_latency")
            seen["fast" if fast else "general"] = {name: getattr(snap, name) for name in counts} | {
                name: getattr(snap, name).count for name in histograms
            }
            seen["fast" if fast else "general"]["placements"] = (
                gpu.stream_pool.statistics().placements
            )
    return seen


async def classes() -> dict[str, Any]:
    """Dispatches of each priority class, checked against numpy: the lanes they run on (of
    their class), how many took the fast path, and their class's telemetry; then a buffer
    written by the default class and read by the high one while the write runs (the read goes
    the general way, ordered by an event), and a chain of one buffer's uses within the high
    class (ordered by its lane)."""
    rng = _rng()
    seen: dict[str, Any] = {}
    async with _open() as gpu:
        await _compiled(gpu)
        lanes = gpu._cuda.device.lanes
        x = rng.standard_normal(N, dtype=np.float32)  # the plan learned, by the general path
        await gpu.dispatch(SCALE, x, ag.Out(N, np.float32), x[0], np.int32(N), grid=4, block=256)
        for name in ("high", "normal", "low"):
            before = gpu.telemetry.snapshot()
            worst = 0.0
            ranks: list[int] = []
            for k in range(20):
                x = rng.standard_normal(N, dtype=np.float32)
                a = np.float32(rng.standard_normal())
                if k == 0:
                    _mode("manual")  # in flight until the mode changes: its lane is busy
                pending = gpu.dispatch(
                    SCALE, x, ag.Out(N, np.float32), a, np.int32(N), grid=4, block=256,
                    priority=name,
                )  # fmt: skip
                if k == 0:
                    ranks = sorted({lane.rank for lane in lanes if lane.slot.outstanding})
                    _mode("instant")
                (out,) = await pending
                worst = max(worst, float(np.abs(out - a * x).max()))
            snap = gpu.telemetry.snapshot()
            seen[name] = {
                "worst": worst,
                "ranks": ranks,
                "fast": snap.fast_path_dispatches - before.fast_path_dispatches,
                "latency": snap.completion_latency_by_class[name].count
                - before.completion_latency_by_class[name].count,
                "wait": snap.queue_wait_by_class[name].count
                - before.queue_wait_by_class[name].count,
            }
        x = rng.standard_normal(N, dtype=np.float32)
        a, b = np.float32(rng.standard_normal()), np.float32(rng.standard_normal())
        buf = await gpu.upload(x)
        # Both plans learned, each use finished before the next: then, with the write in flight.
        await gpu.dispatch(INC, buf, np.float32(0), np.int32(N), grid=4, block=256)
        await gpu.dispatch(
            SCALE, buf, ag.Out(N, np.float32), b, np.int32(N), grid=4, block=256, priority="high"
        )
        before = gpu.telemetry.snapshot().fast_path_dispatches
        _mode("manual")
        written = gpu.dispatch(INC, buf, a, np.int32(N), grid=4, block=256)
        read = gpu.dispatch(
            SCALE, buf, ag.Out(N, np.float32), b, np.int32(N), grid=4, block=256,
            priority="high",
        )  # fmt: skip
        _mode("instant")
        await written
        (out,) = await read
        seen["across"] = {
            "fast": gpu.telemetry.snapshot().fast_path_dispatches - before,
            "right": bool(np.array_equal(out, (x + a) * b)),
        }
        before = gpu.telemetry.snapshot().fast_path_dispatches
        _mode("manual")
        chain = [
            gpu.dispatch(INC, buf, a, np.int32(N), grid=4, block=256, priority="high")
            for _ in range(5)
        ]
        ranks = sorted({lane.rank for lane in lanes if lane.slot.outstanding})
        _mode("instant")
        for pending in chain:
            await pending
        expected = x + a
        for _ in range(5):
            expected += a
        seen["chain"] = {
            "fast": gpu.telemetry.snapshot().fast_path_dispatches - before,
            "ranks": ranks,
            "right": bool(np.array_equal(await gpu.download(buf), expected)),
        }
        await buf.aclose()
    return seen


async def pending_slots() -> dict[str, Any]:
    """Every slot of a pending result the fast path made is set, as the front sets them."""
    async with _open() as gpu:
        await _compiled(gpu)
        for _ in range(3):
            pending = gpu.dispatch(EMPTY, np.int32(1), grid=1, block=1)
            unset = [
                name
                for name in PendingDispatch.__slots__
                # _traceback: set on failure; _withdraw: on a dispatch that may be withdrawn
                if name not in ("__weakref__", "_traceback", "_withdraw")
                and not hasattr(pending, name)
            ]
            await pending
        return {"unset": unset, "type": type(pending).__name__,
                "fast": gpu.telemetry.snapshot().fast_path_dispatches}  # fmt: skip


def trio() -> dict[str, Any]:
    """Under trio the fast path steps aside: dispatches run the general way, and right."""
    import trio as trio_

    async def main() -> dict[str, Any]:
        async with _open() as gpu:
            await _compiled(gpu)
            worst = await _mix(gpu, _rng(), 2)
            return {"worst": worst, "fast": gpu.telemetry.snapshot().fast_path_dispatches}

    result: dict[str, Any] = trio_.run(main)
    return result


async def calls() -> dict[str, Any]:
    """Calls per awaited fast-path dispatch, from a deterministic profile (cProfile): all of
    them (the asyncio loop's own, for the poll the dispatch asks for, included), and those of
    functions of asyncgraph's own modules. Each profiled dispatch starts alike: the loop has
    just run the reactor's poll."""
    import cProfile
    import pstats

    from cuda.bindings import driver as drv

    seen: dict[str, Any] = {}
    async with _open() as gpu:
        # The device's context current on the thread, as in a program that used the device
        # already (PyTorch, CuPy): the backend finds its own current and pushes nothing.
        drv.cuCtxSetCurrent(gpu._cuda.device.context)
        await _compiled(gpu)
        x = np.ones(N, np.float32)
        buf = await gpu.upload(x)
        rows: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
            "empty": ((EMPTY, np.int32(1)), {"grid": 1, "block": 1}),
            "4 KiB": ((SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N)),
                      {"grid": 4, "block": 256}),
            "resident": ((INC, buf, np.float32(1), np.int32(N)), {"grid": 4, "block": 256}),
            # A replay of the graph cache's graph of the 4 KiB call, routed to the fast path.
            "4 KiB, graph='always'": ((SCALE, x, ag.Out(N, np.float32), np.float32(2),
                                       np.int32(N)),
                                      {"grid": 4, "block": 256, "graph": "always"}),
        }  # fmt: skip
        before = gpu.telemetry.snapshot().fast_path_dispatches
        count = 50
        for row, (args, keywords) in rows.items():
            for _ in range(5):
                await gpu.dispatch(*args, **keywords)
            total = ours = 0
            for _ in range(count):
                await asyncio.sleep(0)
                profile = cProfile.Profile()
                profile.enable()
                await gpu.dispatch(*args, **keywords)
                profile.disable()
                stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]  # its table
                for (filename, _line, _name), (_cc, nc, *_rest) in stats.items():
                    total += nc
                    ours += nc if "asyncgraph" in filename else 0
            seen[row] = {"all": total / count, "asyncgraph": ours / count}
        seen["fast"] = gpu.telemetry.snapshot().fast_path_dispatches - before
        # The first of each was planned; the replay's first recorded its graph and replayed it
        # on the fast path at once.
        seen["expected_fast"] = len(rows) * (count + 4) + 1
    return seen


async def spread() -> dict[str, Any]:
    """Lone awaited dispatches of the default class, one at a time, each held in flight while
    its lane is read: how many ran on each lane (the stream pool's lanes take the ties in turn,
    whatever other classes' lanes the backend has), and how many took the fast path."""
    async with _open() as gpu:
        await _compiled(gpu)
        lanes = gpu._cuda.device.lanes
        pool = len(gpu.stream_pool.lanes)
        x = np.ones(N, np.float32)
        await gpu.dispatch(
            SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
        )
        before = gpu.telemetry.snapshot()
        used = [0] * len(lanes)
        for _ in range(3 * pool):
            _mode("manual")  # in flight until the mode changes: its lane is busy
            pending = gpu.dispatch(
                SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
            )
            for lane in lanes:
                if lane.slot.outstanding:
                    used[lane.index] += 1
            _mode("instant")
            await pending
        fast = gpu.telemetry.snapshot().fast_path_dispatches - before.fast_path_dispatches
        return {"pool": pool, "used": used, "fast": fast}


SCENARIOS: dict[str, Callable[[], Any]] = {
    "calls": calls,
    "results": results,
    "errors": errors,
    "concurrency": concurrency,
    "ordering": ordering,
    "cancel": cancel,
    "fault": fault,
    "close": close,
    "telemetry": telemetry,
    "pending_slots": pending_slots,
    "trio": trio,
    "classes": classes,
    "spread": spread,
}


def run(name: str) -> Any:
    """Run one scenario (events complete at once unless it says otherwise; no fault left)."""
    reset(_lib)
    _mode("instant")
    observed = SCENARIOS[name]()
    if asyncio.iscoroutine(observed):
        observed = asyncio.run(observed)
    return observed


if __name__ == "__main__":
    names = sys.argv[1:] or list(SCENARIOS)
    streams = os.environ.get("FAKE_CUDA_STREAMS", "immediate")  # the stand-in's mode
    seen = {"compiled": bool(core.COMPILED), "streams": streams}
    print(json.dumps(seen | {name: run(name) for name in names}))
