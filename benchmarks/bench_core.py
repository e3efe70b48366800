"""The dispatch core's own cost, compiled beside Python, with the driver stubbed out.

Both cores run in this one process against the stand-in driver of ``tests/fake_driver`` (built
here with the C compiler and loaded as ``libcuda.so.1``; the script starts itself again with
``LD_LIBRARY_PATH`` set), so what is timed is the code above the driver, not the GPU:

- packing a 4-argument call (a staged array, a float, an int, an int64) and launching it, from
  the bound arguments and from launch values, beside the bare ``cuda.bindings`` launch call the
  Python core makes;
- an event record and query;
- a completion's wake-up: an idle loop whose lane was handed to a waiter, the event completed
  by a thread outside Python, timed from that completion to the reactor's callback on the loop,
  alone and beside a Python thread that keeps the GIL busy.

    python benchmarks/bench_core.py [--reps N] [--json [PATH]]
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from benchmarks.harness import (
    arguments,
    cpu,
    percentile,
    print_table,
    python_version,
    write_json,
)

DEVICE = "stand-in driver"
BATCH = 1000


def _restart_on_the_stand_in() -> None:
    """Build the stand-in and run this script again with it as the driver library."""
    from tests.fake_driver import build, environment

    try:
        directory = build()
    except RuntimeError as exc:
        raise SystemExit(f"bench_core needs the stand-in driver: {exc}") from None
    env = environment(directory, "python", complete="manual")
    env["ASYNCGRAPH_BENCH_STAND_IN"] = "1"
    raise SystemExit(subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode)


def _per_call_ns(fn: Any, reps: int) -> float:
    """The median, over *reps* batches of ``BATCH`` calls, of one call's time in ns."""
    for _ in range(BATCH):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(BATCH):
            fn()
        samples.append((time.perf_counter_ns() - t0) / BATCH)
    return percentile(samples, 50)


def _calls(cores: dict[str, Any], reps: int) -> list[tuple[str, str, float]]:
    from cuda.bindings import driver as drv

    from asyncgraph._args._bound_args import InArg, ScalarArg
    from asyncgraph._args._kernel import Param

    f4, i4, i8 = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64)
    params = (
        Param("x", "const float*", pointer=True, const=True, dtype=f4),
        Param("a", "float", pointer=False, const=False, dtype=f4),
        Param("n", "int", pointer=False, const=False, dtype=i4),
        Param("m", "long long", pointer=False, const=False, dtype=i8),
    )
    staged = InArg(0, np.zeros(8, np.float32), params[0])
    staged.offset = 256
    args = [
        staged,
        ScalarArg(1, np.float32(2), params[1]),
        ScalarArg(2, np.int32(4096), params[2]),
        ScalarArg(3, np.int64(7), params[3]),
    ]
    values = [1 << 33, np.float32(2), np.int32(4096), np.int64(7)]
    stream = drv.CUstream(0x1000)
    lib = ctypes.CDLL("libcuda.so.1")
    lib.fake_event_new.restype = ctypes.c_void_p
    event = drv.CUevent(lib.fake_event_new())
    rows = []
    for name, core in cores.items():
        rows += _core_rows(name, core, params, args, values, stream, event, reps)
    raw = cores["python"].Launcher(drv.CUfunction(), params)
    rows.append(
        (
            "bare cuda.bindings cuLaunchKernel call",
            "reference",
            _per_call_ns(
                lambda: drv.cuLaunchKernel(
                    raw.function, 16, 1, 1, 256, 1, 1, 0, stream, raw.kernel_params, 0
                ),
                reps,
            ),
        )
    )
    return rows


def _core_rows(
    name: str,
    core: Any,
    params: Any,
    args: list[Any],
    values: list[Any],
    stream: Any,
    event: Any,
    reps: int,
) -> list[tuple[str, str, float]]:
    from cuda.bindings import driver as drv

    launcher = core.Launcher(drv.CUfunction(), params)
    record, query = core.record, core.query
    grid, block = (16, 1, 1), (256, 1, 1)
    return [
        (
            "launch from bound arguments",
            name,
            _per_call_ns(lambda: launcher.launch(args, 1 << 33, grid, block, 0, stream), reps),
        ),
        (
            "launch from launch values",
            name,
            _per_call_ns(lambda: launcher.launch_values(values, grid, block, 0, stream), reps),
        ),
        (
            "event record + query",
            name,
            _per_call_ns(lambda: (record(event, stream), query(event)), reps),
        ),
    ]


def _spin_gil(stop: threading.Event) -> None:
    """A Python thread that keeps asking for the GIL (pure Python work)."""
    n = 0
    while not stop.is_set():
        for i in range(1000):
            n += i


async def _wake_latencies(count: int) -> list[float]:
    """µs from each completion (outside Python) to the reactor's callback on the loop."""
    from cuda.bindings import driver as drv

    from asyncgraph._cuda.completion._reactor import Reactor
    from asyncgraph._cuda.driver._events import EventPool

    lib = ctypes.CDLL("libcuda.so.1")
    lib.fake_event_new.restype = ctypes.c_void_p
    lib.fake_completed_ns.restype = ctypes.c_longlong
    lib.fake_completed_ns.argtypes = [ctypes.c_void_p]
    lib.fake_complete_after.argtypes = [ctypes.c_void_p, ctypes.c_longlong]
    loop = asyncio.get_running_loop()
    reactor = Reactor(loop, drv.CUcontext(), 1, EventPool(0), 50e-6, lambda _e: None)
    latencies = []
    for _ in range(count):
        handle = lib.fake_event_new()
        event = drv.CUevent(handle)
        drv.cuEventRecord(event, drv.CUstream(0))
        woken = loop.create_future()

        def done(_error: Any, woken: asyncio.Future[int] = woken) -> None:
            woken.set_result(time.clock_gettime_ns(time.CLOCK_MONOTONIC))

        reactor.watch(0, event, done)
        lib.fake_complete_after(handle, 3_000_000)  # long after the hand-off to the waiter
        at = await woken
        latencies.append((at - lib.fake_completed_ns(handle)) / 1e3)
    for joinable in reactor.close():
        await loop.run_in_executor(None, joinable.join)
    return latencies


def _wakes(cores: dict[str, Any], count: int) -> list[tuple[str, str, float, float]]:
    from asyncgraph._cuda.core import _waiters

    rows = []
    for contended in (False, True):
        for name, core in cores.items():
            _waiters.core = core  # type: ignore[attr-defined]  # the waiters' core, for this row
            stop = threading.Event()
            spinner = threading.Thread(target=_spin_gil, args=(stop,), daemon=True)
            if contended:
                spinner.start()
            try:
                latencies = asyncio.run(_wake_latencies(count))
            finally:
                stop.set()
                if contended:
                    spinner.join()
            label = (
                "wake-up, a Python thread busy" if contended else "wake-up, nothing else running"
            )
            rows.append((label, name, percentile(latencies, 50), percentile(latencies, 99)))
    return rows


def main() -> None:
    parser = arguments(__doc__, reps=300, reps_help=f"batches of {BATCH} calls per row")
    parser.add_argument("--wakes", type=int, default=200, help="wake-ups timed per row")
    options = parser.parse_args()
    if os.environ.get("ASYNCGRAPH_BENCH_STAND_IN") != "1":
        _restart_on_the_stand_in()
    from asyncgraph._cuda.core import _core_python as _core_py

    cores: dict[str, Any] = {"python": _core_py}
    try:
        from asyncgraph._cuda.core import _core_compiled as _core  # type: ignore[attr-defined]  # built in place
    except ImportError as exc:
        print(f"the compiled core is not built ({exc}): its rows are left out")
    else:
        cores["compiled"] = _core
    where = cpu()
    calls = _calls(cores, options.reps)
    print_table(["call", "core", "ns per call"], calls, ["", ".0f"])
    print()
    wakes = _wakes(cores, options.wakes)
    print_table(["completion to callback", "core", "p50 µs", "p99 µs"], wakes, ["", ".1f", ".1f"])
    print(f"\n{DEVICE} on {where}")
    write_json(
        {
            "device": DEVICE,
            "cpu": where,
            "python": python_version(),
            "calls_ns": [{"call": c, "core": k, "ns": v} for c, k, v in calls],
            "wakes_us": [{"row": r, "core": k, "p50": a, "p99": b} for r, k, a, b in wakes],
        },
        options.json,
        script=__file__,
        device=DEVICE,
    )


if __name__ == "__main__":
    main()
