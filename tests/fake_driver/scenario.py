"""Scenarios run against the stand-in driver (``fake_cuda.c``), in a process of their own.

``python -m tests.fake_driver.scenario NAME`` runs one and prints what it observed as JSON;
``tests/test_core_driver.py`` starts it with ``LD_LIBRARY_PATH`` pointing at the stand-in, under
each core, and checks the observations.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from cuda.bindings import driver as drv

from asyncgraph._args._bound_args import Arg, InArg, ScalarArg
from asyncgraph._args._kernel import Param
from asyncgraph._cuda.completion._reactor import Reactor
from asyncgraph._cuda.core._choose import core
from asyncgraph._cuda.driver._events import EventPool
from asyncgraph._runtime import _inbox, _loop

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_event_new.restype = ctypes.c_void_p
_lib.fake_event_complete.argtypes = [ctypes.c_void_p, ctypes.c_int]
_lib.fake_last_launch.restype = ctypes.c_ulonglong

ILLEGAL_ADDRESS = 700  # a sticky error: the context is lost


def _event() -> Any:
    return drv.CUevent(_lib.fake_event_new())


def _complete(event: Any, code: int = 0) -> None:
    _lib.fake_event_complete(ctypes.c_void_p(int(event)), code)


def _python_waiters() -> int:
    return sum(t.name.startswith("asyncgraph-waiter") for t in threading.enumerate())


def launch() -> dict[str, Any]:
    """Launch through the core's launcher; what the driver was given."""
    f4 = np.dtype(np.float32)
    params = (
        Param("x", "const float*", pointer=True, const=True, dtype=f4),
        Param("a", "float", pointer=False, const=False, dtype=f4),
        Param("n", "int", pointer=False, const=False, dtype=np.dtype(np.int32)),
        Param("m", "long long", pointer=False, const=False, dtype=np.dtype(np.int64)),
    )
    staged = InArg(0, np.zeros(8, np.float32), params[0])
    staged.offset = 512
    args: list[Arg] = [
        staged,
        ScalarArg(1, np.float32(2.5), params[1]),
        ScalarArg(2, np.int32(-7), params[2]),
        ScalarArg(3, np.int64(1 << 40), params[3]),
    ]
    launcher = core.Launcher(drv.CUfunction(), params)
    _lib.fake_expect_params(len(params))
    code = launcher.launch(args, 1 << 33, (3, 2, 1), (128, 1, 1), 1024, drv.CUstream(0x1234))
    dims = (ctypes.c_uint * 7)()
    stream = ctypes.c_size_t()
    raw = (ctypes.c_ubyte * 64)()
    count = _lib.fake_last_launch(dims, ctypes.byref(stream), raw, 4)
    slots = bytes(raw)
    return {
        "code": int(code),
        "launches": count,
        "dims": list(dims),
        "stream": stream.value,
        "pointer": int(np.frombuffer(slots[0:8], np.uint64)[0]),
        "a": float(np.frombuffer(slots[16:20], np.float32)[0]),
        "n": int(np.frombuffer(slots[32:36], np.int32)[0]),
        "m": int(np.frombuffer(slots[48:56], np.int64)[0]),
    }


def _reactor(loop: asyncio.AbstractEventLoop, faults: list[str]) -> tuple[Reactor, EventPool]:
    pool = EventPool(0)
    reactor = Reactor(
        loop, drv.CUcontext(), 2, pool, 1e-4, lambda e: faults.append(type(e).__name__)
    )
    return reactor, pool


def _later(delay: float, fn: Callable[[], None]) -> None:
    threading.Timer(delay, fn).start()


async def _wake() -> dict[str, Any]:
    """Events on two lanes that complete while the loop sleeps; then a sticky failure."""
    faults: list[str] = []
    reactor, pool = _reactor(_loop.current_loop(), faults)
    done: list[tuple[int, int, str | None]] = []
    finished = _loop.current_loop().create_future()
    events = [(lane, i, _event()) for i in range(3) for lane in (0, 1)]

    def callback(lane: int, i: int) -> Callable[[Any], None]:
        def call(error: Any) -> None:
            done.append((lane, i, None if error is None else type(error).__name__))
            if len(done) == len(events) and not finished.done():
                finished.set_result(None)

        return call

    for lane, i, event in events:
        drv.cuEventRecord(event, drv.CUstream(0))
        reactor.watch(lane, event, callback(lane, i))
    threads_while_waiting: list[int] = []

    def complete_all() -> None:
        threads_while_waiting.append(_python_waiters())
        for _lane, _i, event in events:
            _complete(event)
            time.sleep(0.002)

    _later(0.05, complete_all)  # the loop has long handed the lanes to the waiters by then
    await _loop.wait_for(finished, 10)
    handoffs = reactor.handoffs

    # A sticky failure while the loop sleeps: every watch fails, and the fault is reported.
    failing = [_event(), _event()]
    failed = _loop.current_loop().create_future()
    errors: list[str] = []

    def on_fail(error: Any) -> None:
        errors.append(type(error).__name__)
        if len(errors) == 2 and not failed.done():
            failed.set_result(None)

    for event in failing:
        drv.cuEventRecord(event, drv.CUstream(0))
        reactor.watch(0, event, on_fail)
    _later(0.05, lambda: _complete(failing[0], ILLEGAL_ADDRESS))
    await _loop.wait_for(failed, 10)
    _complete(failing[1], ILLEGAL_ADDRESS)

    joinables = reactor.close()
    for joinable in joinables:
        await _loop.current_loop().run_in_executor(None, joinable.join)
    reactor.collect()
    return {
        "done": done,
        "handoffs": handoffs,
        "python_waiters": threads_while_waiting[0],
        "errors": errors,
        "faults": faults,
        "events_back": len(pool.idle),
        "python_waiters_after_close": _python_waiters(),
    }


def wake_asyncio() -> dict[str, Any]:
    """:func:`_wake` on asyncio."""
    return asyncio.run(_wake())


def wake_no_reader() -> dict[str, Any]:
    """:func:`_wake` on an asyncio loop that cannot watch a file descriptor (as asyncio's
    proactor loop on Windows): the waiters fall back to Python threads."""

    def refuse(*_args: object) -> None:
        raise NotImplementedError

    async def main() -> dict[str, Any]:
        asyncio.get_running_loop().add_reader = refuse  # type: ignore[method-assign,assignment]  # a stand-in
        return await _wake()

    return asyncio.run(main())


def wake_uvloop() -> dict[str, Any]:
    """:func:`_wake` on uvloop."""
    import uvloop

    return uvloop.run(_wake())


def wake_trio() -> dict[str, Any]:
    """:func:`_wake` on trio (``_loop.TrioLoop``)."""
    import trio

    result: dict[str, Any] = trio.run(_wake)
    return result


def closed_loop() -> dict[str, Any]:
    """The loop closes while a waiter waits; the event completes later and a thread asks for
    the result (as ``pending.result()`` does): the callback still runs, on some thread."""
    loop = asyncio.new_event_loop()
    faults: list[str] = []
    reactor, pool = _reactor(loop, faults)
    event = _event()
    ran: list[str] = []

    async def start() -> None:
        drv.cuEventRecord(event, drv.CUstream(0))
        reactor.watch(1, event, lambda error: ran.append(threading.current_thread().name))
        await asyncio.sleep(0.05)  # polls for the window, then hands the lane off

    loop.run_until_complete(start())
    handoffs = reactor.handoffs
    loop.close()
    _complete(event)
    deadline = time.monotonic() + 5
    while not ran and time.monotonic() < deadline:
        _inbox.kick(loop)
        time.sleep(0.01)
    for joinable in reactor.close():
        joinable.join()
    reactor.collect()
    return {"ran": len(ran), "handoffs": handoffs, "events_back": len(pool.idle)}


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "launch": launch,
    "wake_asyncio": wake_asyncio,
    "wake_uvloop": wake_uvloop,
    "wake_no_reader": wake_no_reader,
    "wake_trio": wake_trio,
    "closed_loop": closed_loop,
}

if __name__ == "__main__":
    result = SCENARIOS[sys.argv[1]]()
    result["compiled"] = bool(core.COMPILED)
    print(json.dumps(result))
