"""One workload, everything it lets a user observe: run on each dispatch core, it must print the
same (``tests/test_core_parity.py``).

``python -m tests.fake_driver.parity_scenario`` runs round trips (the first of a signature on
the general path, the rest on the fast path), resident buffers written by dispatches in flight,
``Out(into=...)``, 32 concurrent dispatches, refused input, a failed launch and a failed event,
on the CUDA backend over the stand-in driver; then, noting after each step the telemetry counts
(the histograms' counts too), the in-flight counts and each buffer's uses (the writer and the
readers, by kind and dispatch id): empty kernels, a resident buffer read, written and read again
by dispatches in flight together (``Out(into=)`` among them), dispatches past a full in-flight
bound (the general path takes them), and a task awaiting a dispatch cancelled while it runs. It
prints one JSON line: results, errors (type and message), and those steps.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import attrs
import numpy as np

import asyncgraph as ag
from asyncgraph._bench._bench_run import EMPTY, SCALE
from asyncgraph._cuda.core._choose import core
from asyncgraph._runtime._telemetry import TelemetrySnapshot
from tests.fake_driver import reset
from tests.kernels import INC

_lib = ctypes.CDLL("libcuda.so.1")
N = 1024
INVALID_VALUE = 1  # not sticky: the backend goes on
# Telemetry that counts (the histograms measure time, which differs from run to run: of them,
# only how many values each holds is compared).
TIMED = {"queue_wait", "submit_time", "completion_latency", "device_time"}
BY_CLASS = {"queue_wait_by_class", "completion_latency_by_class"}  # class -> histogram
COUNTS = [f.name for f in attrs.fields(TelemetrySnapshot) if f.name not in TIMED | BY_CLASS]


def _scale(gpu: Any, x: Any) -> Any:
    return gpu.dispatch(
        SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
    )


def _inc(gpu: Any, buffer: Any) -> Any:
    return gpu.dispatch(INC, buffer, np.float32(1), np.int32(N), grid=4, block=256)


def _tracking(buffer: Any) -> list[Any]:
    """The buffer's record of its uses in flight (private fields, read by a test on purpose)."""
    return [buffer._in_use, buffer._writer is None, len(buffer._readers)]


def _use(use: Any) -> list[Any] | None:
    """A buffer's use in flight, as both cores must show it: its kind and dispatch id."""
    return None if use is None else [type(use).__name__, use.id]


def _uses(buffer: Any) -> list[Any]:
    """The buffer's uses in flight: how many, the writer, the readers."""
    return [buffer._in_use, _use(buffer._writer), [_use(reader) for reader in buffer._readers]]


def _counts(gpu: Any) -> dict[str, Any]:
    snapshot = gpu.telemetry.snapshot()
    counts = {name: getattr(snapshot, name) for name in COUNTS}
    by_class = {
        f"{name} values": {c: h.count for c, h in getattr(snapshot, name).items()}
        for name in sorted(BY_CLASS)
    }
    return (
        counts
        | {f"{name} values": getattr(snapshot, name).count for name in sorted(TIMED)}
        | by_class
    )


async def _outcome(call: Callable[[], Awaitable[Any]]) -> list[Any]:
    """``[type, message]`` of what awaiting *call()* raised, or ``["ok", checksum]``."""
    try:
        result = await call()
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    values = result if isinstance(result, tuple) else (result,)
    return [
        "ok",
        [float(v.sum()) if isinstance(v, np.ndarray) else type(v).__name__ for v in values],
    ]


async def _awaited(pending: Awaitable[Any]) -> list[Any]:
    """:func:`_outcome` of awaiting *pending*."""
    return await _outcome(lambda: pending)


async def workload() -> dict[str, Any]:
    seen: dict[str, Any] = {}
    x = np.arange(N, dtype=np.float32)
    gpu: Any
    async with ag.open_backend("cuda") as gpu:
        seen["round_trips"] = [await _outcome(partial(_scale, gpu, x + i)) for i in range(6)]

        buffer = await gpu.upload(x)
        await asyncio.gather(*(_inc(gpu, buffer) for _ in range(5)))  # in flight together
        seen["resident"] = float((await gpu.download(buffer)).sum())
        seen["resident_tracking"] = _tracking(buffer)

        target = gpu.empty(N, np.float32)
        into = ag.Out(into=target)
        seen["into"] = await _outcome(
            lambda: gpu.dispatch(SCALE, buffer, into, np.float32(3), np.int32(N), grid=4, block=256)
        )
        seen["into_result"] = float((await gpu.download(target)).sum())
        seen["target_tracking"] = _tracking(target)

        many = await asyncio.gather(*(_outcome(partial(_scale, gpu, x - i)) for i in range(32)))
        seen["concurrent"] = many

        seen["refused"] = [
            await _outcome(
                lambda: gpu.dispatch(
                    SCALE, x, ag.Out(N, np.float32), 2.0, np.int32(N), grid=4, block=256
                )
            ),
            await _outcome(
                lambda: gpu.dispatch(
                    SCALE, x, ag.Out(N, np.float64), np.float32(2), np.int32(N), grid=4, block=256
                )
            ),
        ]
        stale = gpu.empty(N, np.float32)
        await stale.aclose()
        seen["stale"] = await _outcome(lambda: _inc(gpu, stale))

        _lib.fake_fail_next(b"launch", 1, INVALID_VALUE)
        seen["launch_failed"] = await _outcome(lambda: _scale(gpu, x))
        _lib.fake_fail_next_events(1, INVALID_VALUE)
        seen["event_failed"] = await _outcome(lambda: _scale(gpu, x))
        seen["after_failures"] = await _outcome(lambda: _scale(gpu, x))

        snapshot = gpu.telemetry.snapshot()
        seen["telemetry"] = {name: getattr(snapshot, name) for name in COUNTS}
        seen["buffers_tracking"] = [_tracking(buffer), _tracking(target)]
        await buffer.aclose()
        await target.aclose()
    return seen


async def steps() -> list[Any]:
    """Step by step: after each, the telemetry counts and the uses of each buffer."""
    seen: list[Any] = []
    x = np.arange(N, dtype=np.float32)
    gpu: Any
    async with ag.open_backend("cuda", max_in_flight=3) as gpu:

        def note(label: str, *buffers: Any) -> None:
            seen.append([label, _counts(gpu), [_uses(buffer) for buffer in buffers]])

        for i in range(3):
            outcome = await _outcome(lambda: gpu.dispatch(EMPTY, np.int32(1), grid=1, block=1))
            note(f"empty {i}: {outcome}")

        buffer, target = await gpu.upload(x), gpu.empty(N, np.float32)
        note("uploaded", buffer, target)
        for cycle in range(2):  # the first of each signature takes the general path
            into = ag.Out(into=target)
            read = _scale(gpu, buffer)
            note(f"{cycle}: read", buffer, target)
            write = _inc(gpu, buffer)
            note(f"{cycle}: written", buffer, target)
            into_read = gpu.dispatch(
                SCALE, buffer, into, np.float32(3), np.int32(N), grid=4, block=256
            )
            note(f"{cycle}: read into the target", buffer, target)
            # Awaited in order: how many others completed meanwhile is up to the waiter threads.
            outcomes = [await _awaited(p) for p in (read, write, into_read)]
            note(f"{cycle}: awaited: {outcomes}", buffer, target)
        seen.append(["target", float((await gpu.download(target)).sum())])

        note(f"a round trip: {await _outcome(lambda: _scale(gpu, x))}")  # its plan learned
        _lib.fake_set_complete_mode(b"manual")  # the kernels "run" until the mode changes
        bounded = [_scale(gpu, x + i) for i in range(5)]  # 3 in flight: 2 wait in the queue
        note("past the bound")
        _lib.fake_set_complete_mode(b"instant")
        seen.append(["past the bound", [await _awaited(p) for p in bounded]])
        note("bound drained")

        _lib.fake_set_complete_mode(b"manual")
        pending = _inc(gpu, buffer)
        task = asyncio.ensure_future(_outcome(lambda: pending))
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        note(f"cancelled: done {pending.done()}", buffer)
        _lib.fake_set_complete_mode(b"instant")
        note(f"cancelled, then: {await _outcome(lambda: pending)}", buffer)
        await buffer.aclose()
        await target.aclose()
        note("closed", buffer, target)
    return seen


if __name__ == "__main__":
    reset(_lib)
    _lib.fake_set_complete_mode(b"instant")
    result = asyncio.run(workload())
    result["steps"] = asyncio.run(steps())
    print(json.dumps({"compiled": bool(core.COMPILED)} | result), flush=True)
