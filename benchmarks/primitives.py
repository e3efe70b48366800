"""Driver primitives behind asyncgraph's hot-path choices, measured on the GPU at hand.

Measures, with medians of many repetitions after a warm-up:
- an empty-kernel launch through raw cuda.bindings and through cuda.core, each with event
  record and busy query; the cost of single driver calls on the dispatch path;
- stream-ordered allocation through cuda.core's default memory resource against raw calls;
- H2D/D2H bandwidth of 64 MiB from legacy pinned memory (cuMemHostAlloc), cuda.core's
  LegacyPinnedMemoryResource and PinnedMemoryResource, and pageable numpy memory;
- whether cuEventSynchronize releases the GIL (a thread blocks on it while Python runs).

Run:  python benchmarks/primitives.py [--json [PATH]]
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from cuda.bindings import driver as drv
from cuda.core import (
    Device,
    LaunchConfig,
    LegacyPinnedMemoryResource,
    PinnedMemoryResource,
    Program,
    ProgramOptions,
    launch,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncgraph._demo._spin_kernel import SPIN_SOURCE
from benchmarks import harness


def check(result: Any) -> Any:
    err = result[0] if isinstance(result, tuple) else result
    if err != drv.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"driver call failed: {err}")
    if isinstance(result, tuple):
        return result[1] if len(result) == 2 else result[1:]
    return None


def median_us(fn: Callable[[], object], reps: int = 2000, warmup: int = 200) -> float:
    """Median µs of *fn* (harness.time_sync with this script's repetitions)."""
    return harness.time_sync(fn, reps, warmup)


SRC = 'extern "C" __global__ void empty(int n) { }\n' + SPIN_SOURCE


def main() -> None:
    args = harness.arguments(__doc__).parse_args()
    dev = Device(0)
    dev.set_current()
    results: dict[str, Any] = harness.environment(dev.name)
    import cuda.bindings
    import cuda.core

    results["cuda_core"] = cuda.core.__version__
    results["cuda_bindings"] = cuda.bindings.__version__
    try:
        from cuda.core.utils import FileStreamProgramCache  # noqa: F401

        results["file_stream_program_cache"] = True
    except ImportError:
        results["file_stream_program_cache"] = False
    _, drv_version = drv.cuDriverGetVersion()
    results["driver_api"] = drv_version
    arch = "".join(map(str, dev.compute_capability))
    obj = Program(SRC, code_type="c++", options=ProgramOptions(arch=f"sm_{arch}")).compile("cubin")
    k_empty = obj.get_kernel("empty")
    k_spin = obj.get_kernel("spin")
    stream = dev.create_stream()
    s_handle = drv.CUstream(int(stream.handle))
    fn = drv.CUfunction(int(k_empty.handle))

    # Raw kernel params: void** array pointing at one int.
    n_val = ctypes.c_int32(7)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(n_val))
    params_addr = ctypes.addressof(params)
    ev_flags = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
    ev = check(drv.cuEventCreate(ev_flags))

    def raw_launch() -> None:
        drv.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s_handle, params_addr, 0)

    def raw_round() -> None:
        drv.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s_handle, params_addr, 0)
        drv.cuEventRecord(ev, s_handle)
        while drv.cuEventQuery(ev)[0] == drv.CUresult.CUDA_ERROR_NOT_READY:
            pass

    def raw_sync_round() -> None:
        drv.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s_handle, params_addr, 0)
        drv.cuStreamSynchronize(s_handle)

    cfg = LaunchConfig(grid=1, block=1)
    n32 = np.int32(7)

    def core_launch() -> None:
        launch(stream, cfg, k_empty, n32)

    def core_round() -> None:
        launch(stream, cfg, k_empty, n32)
        e = stream.record()
        while not e.is_done:
            pass

    def core_sync_round() -> None:
        launch(stream, cfg, k_empty, n32)
        stream.sync()

    stream.sync()
    results["us"] = us = {}
    us["raw launch call"] = median_us(raw_launch)
    stream.sync()
    us["raw launch+record+busy query"] = median_us(raw_round)
    us["raw launch+stream sync"] = median_us(raw_sync_round)
    us["cuda.core launch call"] = median_us(core_launch)
    stream.sync()
    us["cuda.core launch+record+is_done"] = median_us(core_round)
    us["cuda.core launch+stream.sync"] = median_us(core_sync_round)
    us["cuEventRecord call"] = median_us(lambda: drv.cuEventRecord(ev, s_handle))
    stream.sync()
    us["cuEventQuery (done)"] = median_us(lambda: drv.cuEventQuery(ev))
    ev2_holder: list[Any] = []

    def ev_create_destroy() -> None:
        e = drv.cuEventCreate(ev_flags)[1]
        drv.cuEventDestroy(e)

    us["cuEventCreate+Destroy"] = median_us(ev_create_destroy)
    del ev2_holder
    mr = dev.memory_resource

    def core_alloc() -> None:
        b = mr.allocate(4096, stream=stream)
        b.close(stream)

    us["cuda.core mr.allocate+close 4KiB"] = median_us(core_alloc)
    pool = check(drv.cuDeviceGetDefaultMemPool(0))

    def raw_alloc() -> None:
        p = drv.cuMemAllocFromPoolAsync(4096, pool, s_handle)[1]
        drv.cuMemFreeAsync(p, s_handle)

    us["raw cuMemAllocFromPoolAsync+FreeAsync 4KiB"] = median_us(raw_alloc)
    stream.sync()
    host4k = check(drv.cuMemHostAlloc(4096, 0))
    dev4k = check(drv.cuMemAlloc(4096))
    us["cuMemcpyHtoDAsync call 4KiB pinned"] = median_us(
        lambda: drv.cuMemcpyHtoDAsync(dev4k, host4k, 4096, s_handle)
    )
    us["cuMemsetD8Async call 4KiB"] = median_us(
        lambda: drv.cuMemsetD8Async(dev4k, 0, 4096, s_handle)
    )
    stream.sync()

    # Pinned kinds: bandwidth of 64 MiB copies.
    size = 64 << 20
    d_big = check(drv.cuMemAlloc(size))
    t0 = time.perf_counter()
    legacy = check(drv.cuMemHostAlloc(size, 0))
    results["cuMemHostAlloc 64MiB ms"] = (time.perf_counter() - t0) * 1e3
    ctypes.memset(legacy, 1, size)
    lpmr = LegacyPinnedMemoryResource()
    t0 = time.perf_counter()
    lbuf = lpmr.allocate(size)
    results["LegacyPinnedMemoryResource.allocate 64MiB ms"] = (time.perf_counter() - t0) * 1e3
    ctypes.memset(int(lbuf.handle), 1, size)
    try:
        pmr = PinnedMemoryResource()
        t0 = time.perf_counter()
        pbuf = pmr.allocate(size, stream=stream)
        stream.sync()
        results["PinnedMemoryResource.allocate 64MiB ms"] = (time.perf_counter() - t0) * 1e3
        ctypes.memset(int(pbuf.handle), 1, size)
        pinned_mr_ptr: int | None = int(pbuf.handle)
    except Exception as exc:
        results["PinnedMemoryResource error"] = repr(exc)
        pinned_mr_ptr = None
    pageable = np.ones(size, dtype=np.uint8)

    def bw(ptr: int, h2d: bool) -> float:
        def one() -> None:
            if h2d:
                drv.cuMemcpyHtoDAsync(d_big, ptr, size, s_handle)
            else:
                drv.cuMemcpyDtoHAsync(ptr, d_big, size, s_handle)
            drv.cuStreamSynchronize(s_handle)

        t = median_us(one, reps=30, warmup=5)
        return size / (t * 1e-6) / 1e9

    results["GB/s"] = gbs = {}
    kinds: dict[str, int | None] = {
        "legacy cuMemHostAlloc": legacy,
        "cuda.core LegacyPinnedMemoryResource": int(lbuf.handle),
        "cuda.core PinnedMemoryResource": pinned_mr_ptr,
        "pageable numpy": pageable.ctypes.data,
    }
    for name, ptr in kinds.items():
        if ptr is None:
            continue
        gbs[f"H2D {name}"] = bw(ptr, True)
        gbs[f"D2H {name}"] = bw(ptr, False)

    # Does cuEventSynchronize release the GIL?
    spin_ev = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_BLOCKING_SYNC | ev_flags))
    clock_khz = dev.properties.clock_rate
    cycles = np.int64(clock_khz * 200)  # about 200 ms
    done_flag = check(drv.cuMemAlloc(4))
    launch(stream, LaunchConfig(grid=1, block=1), k_spin, cycles, np.uint64(int(done_flag)))
    check(drv.cuEventRecord(spin_ev, s_handle))
    done = threading.Event()

    def waiter() -> None:
        drv.cuEventSynchronize(spin_ev)
        done.set()

    thread = threading.Thread(target=waiter)
    t0 = time.perf_counter()
    thread.start()
    spins = 0
    while not done.is_set():
        spins += 1
    thread.join()
    results["gil"] = {
        "python iterations while a thread sat in cuEventSynchronize": spins,
        "wait ms": (time.perf_counter() - t0) * 1e3,
    }
    check(drv.cuMemFree(done_flag))
    print(json.dumps(results, indent=2))
    harness.write_json(results, args.json, script=__file__, device=dev.name)


if __name__ == "__main__":
    main()
