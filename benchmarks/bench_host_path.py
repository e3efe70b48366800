"""The host cost of one dispatch, with no GPU: the whole CUDA path against the stand-in driver.

The stand-in driver of ``tests/fake_driver`` (built here with the C compiler and loaded as
``libcuda.so.1``) answers every driver call the CUDA backend makes at once: its copies are
``memcpy``, its kernels do nothing (or the few it emulates), its events complete when recorded.
So what this script times is everything above the driver: asyncgraph's Python (or compiled
code) for one awaited dispatch, from ``dispatch()`` to the results in the awaiting task.

For each dispatch core (a process each: the core is chosen at import) and each row (an empty
kernel, a 4 KiB round trip, a 4 KiB resident dispatch with ``Out(into=)``) it measures, on the
fast path and on the general path (``BackendOptions(fast_path_enabled=False)``):

- host µs per awaited dispatch: the median over batches of the mean of one batch, and the
  median ratio to the bare sequence below (the batches of the fast path, the general path and
  the bare sequence take turns, so that the machine's drift weighs on all three alike);
- calls per dispatch, from a deterministic profile (``cProfile``) of awaited dispatches: all
  calls, Python and built-in, and those of Python functions alone;

and beside them, in the same process, the bare sequence of driver calls the dispatch makes,
through ``cuda.bindings`` (launch, event record, a query; with the copies for 4 KiB, whose
output is zeroed in pinned memory and goes up with the input, as the dispatch does; the memset
of ``Out(into=)`` for the resident row), which is the floor any Python library pays.

    python benchmarks/bench_host_path.py [--reps N] [--json [PATH]]
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from benchmarks.harness import (
    arguments,
    cpu,
    median_us,
    percentile,
    print_table,
    python_version,
    write_json,
)

DEVICE = "stand-in driver"
CHILD = "ASYNCGRAPH_BENCH_HOST_PATH_CORE"
BATCH = 100  # awaited dispatches timed together
N = 1024  # float32 elements: 4 KiB
ROWS = ("empty kernel", "4 KiB round trip", "4 KiB resident")


# -- measuring, in the child process of one core ---------------------------------------------


Call = tuple[tuple[object, ...], dict[str, Any]]  # a dispatch's arguments and keywords


async def _batch(gpu: Any, call: Call) -> float:
    """Seconds per awaited dispatch over one batch of ``BATCH``."""
    args, keywords = call
    t0 = time.perf_counter()
    for _ in range(BATCH):
        await gpu.dispatch(*args, **keywords)
    return (time.perf_counter() - t0) / BATCH


def _bare_batch(fn: Callable[[], None]) -> float:
    """Seconds per bare sequence over one batch of ``BATCH``."""
    t0 = time.perf_counter()
    for _ in range(BATCH):
        fn()
    return (time.perf_counter() - t0) / BATCH


async def _calls(gpu: Any, call: Call, count: int) -> tuple[float, float]:
    """Calls per awaited dispatch, from ``dispatch()`` to the results in the awaiting task:
    all of them (Python and built-in functions), and those of Python functions alone."""
    args, keywords = call
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(count):
        await gpu.dispatch(*args, **keywords)
    profile.disable()
    stats = pstats.Stats(profile)
    total = python = 0
    for (filename, _line, _name), (_cc, nc, _tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]  # pstats keeps its table there
        total += nc
        if filename != "~":  # "~" marks built-in (C) functions
            python += nc
    return total / count, python / count


def _bare_sequences(gpu: Any) -> tuple[dict[str, Callable[[], None]], Callable[[], None]]:
    """Each row's bare driver-call sequence through cuda.bindings, the parameter blocks packed
    once (as a program launching the same arguments again would); and what gives back what
    they hold."""
    from cuda.bindings import driver as drv

    from asyncgraph._bench._bench_run import EMPTY, SCALE
    from asyncgraph._cuda.core._core_python import Launcher

    engine = gpu._cuda  # benchmarks read internals on purpose
    lane = engine.device.lanes[0]
    stream = lane.handle
    device_in, device_out = lane.scratch_ptr, lane.scratch_ptr + 4096
    empty = Launcher(engine.launches.launchers[EMPTY].function, EMPTY.params or ())
    empty.pack_values([np.int32(1)])
    scale = Launcher(engine.launches.launchers[SCALE].function, SCALE.params or ())
    scale.pack_values([device_in, device_out, np.float32(2), np.int32(N)])
    event = engine.device.events.take()
    host = engine.device.pinned.acquire(3 * 4096)
    x = np.ones(N, np.float32)
    launch, record, query = drv.cuLaunchKernel, drv.cuEventRecord, drv.cuEventQuery
    done = drv.CUresult.CUDA_SUCCESS

    def empty_sequence() -> None:
        launch(empty.function, 1, 1, 1, 1, 1, 1, 0, stream, empty.kernel_params, 0)
        record(event, stream)
        while query(event)[0] != done:
            pass

    def round_trip() -> None:
        host.array[:4096] = x.view(np.uint8)
        host.array[4096:8192] = 0  # the output, zeroed here and uploaded with the input
        drv.cuMemcpyHtoDAsync(device_in, host.ptr, 8192, stream)
        launch(scale.function, 4, 1, 1, 256, 1, 1, 0, stream, scale.kernel_params, 0)
        drv.cuMemcpyDtoHAsync(host.ptr + 4096, device_out, 4096, stream)
        record(event, stream)
        while query(event)[0] != done:
            pass
        host.array[4096:8192].view(np.float32).copy()

    def resident() -> None:
        drv.cuMemsetD8Async(device_out, 0, 4096, stream)
        launch(scale.function, 4, 1, 1, 256, 1, 1, 0, stream, scale.kernel_params, 0)
        record(event, stream)
        while query(event)[0] != done:
            pass

    def release() -> None:
        engine.device.pinned.release(host)
        engine.device.events.give(event)

    return dict(zip(ROWS, (empty_sequence, round_trip, resident), strict=True)), release


async def _calls_of(gpu: Any) -> dict[str, Call]:
    """Each row's dispatch on *gpu*, its kernels compiled and its result checked."""
    import asyncgraph as ag
    from asyncgraph._bench._bench_run import EMPTY, SCALE

    x = np.random.default_rng(7).standard_normal(N, dtype=np.float32)
    await gpu.compile(EMPTY)
    await gpu.compile(SCALE)
    a, n, n1 = np.float32(2), np.int32(N), np.int32(1)
    out = ag.Out(N, np.float32)
    src = await gpu.upload(x)
    into = ag.Out(into=gpu.empty(N, np.float32))
    (check,) = await gpu.dispatch(SCALE, x, out, a, n, grid=4, block=256)
    if not np.array_equal(check, 2 * x):
        raise SystemExit("the stand-in's scale kernel gave a wrong result")
    return {
        ROWS[0]: ((EMPTY, n1), {"grid": 1, "block": 1}),
        ROWS[1]: ((SCALE, x, out, a, n), {"grid": 4, "block": 256}),
        ROWS[2]: ((SCALE, src, into, a, n), {"grid": 4, "block": 256}),
    }


async def _measure(reps: int, profiled: int) -> dict[str, Any]:
    """Every row on the fast path, the general path and bare, batches interleaved (so the
    machine's drift weighs on all three alike); then the calls of each path."""
    import asyncgraph as ag
    from asyncgraph._cuda.core._choose import describe

    results: dict[str, Any] = {"core": describe(), "rows": []}
    async with (
        ag.open_backend("cuda") as fast,
        ag.open_backend("cuda", fast_path_enabled=False) as general,
    ):
        # The device's context current on the thread, as in a program that uses the device
        # already: the bare sequences need it, and the backends then find theirs current.
        from cuda.bindings import driver as drv

        drv.cuCtxSetCurrent(fast._cuda.device.context)  # type: ignore[attr-defined]  # a CUDA backend
        paths = {
            "fast": (fast, await _calls_of(fast)),
            "general": (general, await _calls_of(general)),
        }
        bare, release = _bare_sequences(fast)
        for row in ROWS:
            for gpu, calls in paths.values():
                for _ in range(2):
                    await _batch(gpu, calls[row])
            samples: dict[str, list[float]] = {"fast": [], "general": [], "bare": []}
            for _ in range(max(1, reps // BATCH)):
                for name, (gpu, calls) in paths.items():
                    samples[name].append(await _batch(gpu, calls[row]))
                samples["bare"].append(_bare_batch(bare[row]))
            for name, (gpu, calls) in paths.items():
                total, python = await _calls(gpu, calls[row], profiled)
                ratios = [t / b for t, b in zip(samples[name], samples["bare"], strict=True)]
                results["rows"].append(
                    {
                        "row": row,
                        "path": name,
                        "us": median_us(samples[name]),
                        "x_bare": percentile(ratios, 50),
                        "calls": total,
                        "python_calls": python,
                    }
                )
            results["rows"].append({"row": row, "path": "bare", "us": median_us(samples["bare"])})
        release()
        results["fast_path_dispatches"] = fast.telemetry.snapshot().fast_path_dispatches
        results["general_fast_path_dispatches"] = general.telemetry.snapshot().fast_path_dispatches
    return results


def _child(core: str, reps: int, profiled: int) -> None:
    print(json.dumps(asyncio.run(_measure(reps, profiled))))


# -- the parent: build the stand-in, run each core, report ---------------------------------


def _run_core(directory: Path, core: str, reps: int, profiled: int) -> dict[str, Any] | None:
    from tests.fake_driver import environment

    env = environment(directory, core, complete="instant")
    env[CHILD] = core
    done = subprocess.run(
        [sys.executable, __file__, "--reps", str(reps), "--profiled", str(profiled)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        print(f"the {core} core's run failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        raise SystemExit(1)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if core == "compiled" and not result["core"].startswith("compiled"):
        print(f"the compiled core is not available ({result['core']}): its rows are left out")
        return None
    return result


def main() -> None:
    parser = arguments(__doc__, reps=5000, reps_help="timed dispatches per row")
    parser.add_argument(
        "--profiled", type=int, default=1000, help="dispatches profiled per row (default 1000)"
    )
    options = parser.parse_args()
    core = os.environ.get(CHILD)
    if core is not None:
        _child(core, options.reps, options.profiled)
        return
    from tests.fake_driver import build

    directory = build()
    by_core = {}
    for name in ("python", "compiled"):
        result = _run_core(directory, name, options.reps, options.profiled)
        if result is not None:
            by_core[name] = result
    table = []
    for name, result in by_core.items():
        for entry in result["rows"]:
            if entry["path"] == "bare":
                table.append((entry["row"], name, "bare driver calls", entry["us"], 1.0, "", ""))
            else:
                table.append(
                    (
                        entry["row"],
                        name,
                        entry["path"],
                        entry["us"],
                        entry["x_bare"],
                        entry["calls"],
                        entry["python_calls"],
                    )
                )
    print_table(
        ("dispatch", "core", "path", "host µs", "x bare", "calls", "Python calls"),
        table,
        ("", "", ".2f", ".2f", ".1f", ".1f"),
    )
    where = cpu()
    print(f"\n{DEVICE} on {where}, Python {python_version()}")
    write_json(
        {"device": DEVICE, "cpu": where, "python": python_version(), "cores": by_core},
        options.json,
        script=__file__,
        device=DEVICE,
    )


if __name__ == "__main__":
    main()
