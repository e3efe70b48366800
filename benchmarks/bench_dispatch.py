"""asyncgraph's dispatch path against its peers, in one run on one GPU.

Rows (medians of many repetitions after a warm-up; awaited rows run on asyncio and uvloop):
- empty kernel with one scalar argument: raw launch + event record + busy cuEventQuery, against
  ``await backend.dispatch(...)``;
- a 4 KiB-in / 4 KiB-out one-kernel round trip: raw cuda.bindings with pinned buffers, CuPy
  synchronous (``asarray`` + kernel + ``asnumpy``), the same CuPy work awaited through
  ``run_in_executor``, PyTorch synchronous, and asyncgraph awaited;
- 64 tasks dispatching the empty kernel: dispatches per second, and the event loop's stalls
  (a 0.5 ms heartbeat) meanwhile;
- 64 MiB up + trivial kernel + 64 MiB down, against the pinned copy bandwidth of the same run:
  from a numpy input (copied into pinned staging first) and from a ``pinned_empty`` input (which
  goes up without a copy, like the raw row's pinned buffers);
- placement: short round trips while a 200 ms kernel occupies one stream, least-outstanding
  placement against round-robin.

The dispatch core that ran (chosen at import: ``ASYNCGRAPH_CORE``) is printed beside the
device and recorded as ``core``, so that a compiled core which did not load shows.

Run on a GPU:  python benchmarks/bench_dispatch.py --json [PATH]
"""

from __future__ import annotations

import asyncio
import ctypes
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from cuda.bindings import driver as drv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE_SOURCE
from asyncgraph._cuda.core._choose import core
from asyncgraph._demo._spin_kernel import SPIN
from benchmarks import harness

EMPTY = ag.Kernel('extern "C" __global__ void empty(int n) { }', "empty")
SCALE_SRC = SCALE_SOURCE  # the scale kernel the bench command measures, for every script
SCALE = ag.Kernel(SCALE_SRC, "scale")
COPY = ag.Kernel(
    r"""
extern "C" __global__ void copy4(const uint4* x, uint4* out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i];
}
""",
    "copy4",
)
N4K = 1024  # float32 elements: 4 KiB


# -- peers -------------------------------------------------------------------------------------


def raw_rows(reps: int) -> dict[str, float]:
    """Raw cuda.core / cuda.bindings: the floor everything else is compared with."""
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, StreamOptions, launch

    dev = Device(0)
    dev.set_current()
    arch = "sm_" + "".join(map(str, dev.compute_capability))
    obj = Program(
        EMPTY.source + SCALE_SRC, code_type="c++", options=ProgramOptions(arch=arch)
    ).compile("cubin")
    empty, scale = obj.get_kernel("empty"), obj.get_kernel("scale")
    stream = dev.create_stream(options=StreamOptions(nonblocking=True))
    handle = drv.CUstream(int(stream.handle))
    event = drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING)[1]
    one = LaunchConfig(grid=1, block=1)
    n1 = np.int32(1)

    def empty_round() -> None:
        launch(stream, one, empty, n1)
        drv.cuEventRecord(event, handle)
        while drv.cuEventQuery(event)[0] == drv.CUresult.CUDA_ERROR_NOT_READY:
            pass

    rows = {"raw empty: launch + record + busy query": harness.time_sync(empty_round, reps)}
    nbytes = N4K * 4
    h_in = drv.cuMemHostAlloc(nbytes, 0)[1]
    h_out = drv.cuMemHostAlloc(nbytes, 0)[1]
    d_in = drv.cuMemAlloc(nbytes)[1]
    d_out = drv.cuMemAlloc(nbytes)[1]
    pin_in = np.ctypeslib.as_array((ctypes.c_float * N4K).from_address(h_in))
    pin_out = np.ctypeslib.as_array((ctypes.c_float * N4K).from_address(h_out))
    x = np.random.default_rng().standard_normal(N4K, dtype=np.float32)
    cfg = LaunchConfig(grid=4, block=256)

    def round_trip() -> np.ndarray[Any, Any]:
        pin_in[:] = x
        drv.cuMemcpyHtoDAsync(d_in, h_in, nbytes, handle)
        launch(
            stream,
            cfg,
            scale,
            np.uint64(int(d_in)),
            np.uint64(int(d_out)),
            np.float32(2),
            np.int32(N4K),
        )
        drv.cuMemcpyDtoHAsync(h_out, d_out, nbytes, handle)
        drv.cuStreamSynchronize(handle)
        return pin_out.copy()

    assert np.array_equal(round_trip(), 2 * x)
    rows["raw 4 KiB round trip (pinned, sync)"] = harness.time_sync(round_trip, reps)
    # Pinned copy bandwidth, 64 MiB each way.
    size = 64 << 20
    h_big = drv.cuMemHostAlloc(size, 0)[1]
    d_big = drv.cuMemAlloc(size)[1]

    def up_down() -> None:
        drv.cuMemcpyHtoDAsync(d_big, h_big, size, handle)
        drv.cuMemcpyDtoHAsync(h_big, d_big, size, handle)
        drv.cuStreamSynchronize(handle)

    rows["raw pinned 64 MiB up + down"] = harness.time_sync(up_down, 30, 5)
    for ptr in (h_in, h_out, h_big):
        drv.cuMemFreeHost(ptr)
    for ptr in (d_in, d_out, d_big):
        drv.cuMemFree(ptr)
    drv.cuEventDestroy(event)
    stream.close()
    return rows


def cupy_rows(reps: int) -> dict[str, float]:
    try:
        import cupy as cp
    except ImportError:
        return {}
    kernel = cp.RawKernel(SCALE_SRC, "scale")
    x = np.random.default_rng().standard_normal(N4K, dtype=np.float32)

    def work() -> np.ndarray[Any, Any]:
        d = cp.asarray(x)
        out = cp.empty_like(d)
        kernel((4,), (256,), (d, out, np.float32(2), np.int32(N4K)))
        host: np.ndarray[Any, Any] = cp.asnumpy(out)
        return host

    assert np.array_equal(work(), 2 * x)
    rows = {"CuPy 4 KiB round trip, synchronous": harness.time_sync(work, reps)}

    async def awaited() -> float:
        loop = asyncio.get_running_loop()
        return await harness.time_async(lambda: loop.run_in_executor(None, work), reps)

    rows["CuPy 4 KiB round trip, run_in_executor"] = harness.run(awaited())
    return rows


def torch_rows(reps: int) -> dict[str, float]:
    try:
        import torch
    except ImportError:
        return {}
    x = np.random.default_rng().standard_normal(N4K, dtype=np.float32)

    def work() -> np.ndarray[Any, Any]:
        d = torch.from_numpy(x).cuda()
        host: np.ndarray[Any, Any] = (d * 2).cpu().numpy()
        return host

    assert np.array_equal(work(), 2 * x)
    return {"PyTorch 4 KiB round trip, synchronous": harness.time_sync(work, reps)}


# -- asyncgraph --------------------------------------------------------------------------------


async def asyncgraph_rows(reps: int, label: str) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    async with ag.open_backend("cuda") as gpu:
        for kernel in (EMPTY, SCALE, COPY):
            await gpu.compile(kernel)
        n1 = np.int32(1)
        rows[f"asyncgraph empty, awaited ({label})"] = await harness.time_async(
            lambda: gpu.dispatch(EMPTY, n1, grid=1, block=1), reps
        )
        x = np.random.default_rng().standard_normal(N4K, dtype=np.float32)
        out_spec = ag.Out(N4K, np.float32)
        a, n = np.float32(2), np.int32(N4K)
        (check,) = await gpu.dispatch(SCALE, x, out_spec, a, n, grid=4, block=256)
        assert np.array_equal(check, 2 * x)
        rows[f"asyncgraph 4 KiB round trip, awaited ({label})"] = await harness.time_async(
            lambda: gpu.dispatch(SCALE, x, out_spec, a, n, grid=4, block=256), reps
        )

        # 64 tasks on the empty kernel, with a heartbeat measuring the loop's stalls.
        per_task = max(reps // 10, 200)

        async def worker() -> None:
            for _ in range(per_task):
                await gpu.dispatch(EMPTY, n1, grid=1, block=1)

        await asyncio.gather(*(worker() for _ in range(64)))  # warm-up
        async with harness.Heartbeat() as beat:
            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(64)))
            elapsed = time.perf_counter() - t0
        rows[f"asyncgraph 64 tasks empty, dispatches/s ({label})"] = 64 * per_task / elapsed
        rows[f"loop stall p99 us, 64 tasks ({label})"] = harness.percentile(beat.stalls, 99) * 1e6
        rows[f"loop stall max us, 64 tasks ({label})"] = beat.worst * 1e6

        # 64 MiB up + copy kernel + 64 MiB down.
        big = np.random.default_rng().integers(0, 2**32, (64 << 20) // 4, dtype=np.uint32)
        words = big.size // 4

        async def big_round() -> Any:
            return await gpu.dispatch(
                COPY,
                big,
                ag.Out(big.shape, np.uint32),
                np.int64(words),
                grid=(words + 255) // 256,
                block=256,
            )

        (res,) = await big_round()
        assert np.array_equal(res, big)
        del res
        rows[f"asyncgraph 64 MiB up + kernel + down ({label})"] = await harness.time_async(
            big_round, 20, 3
        )

        # The same from an input in pinned memory (pinned_empty): it goes up without a copy,
        # like the raw row's pinned buffers; the result lands in pinned memory either way.
        pinned = gpu.pinned_empty(big.shape, np.uint32)
        pinned[:] = big

        async def pinned_round() -> Any:
            return await gpu.dispatch(
                COPY,
                pinned,
                ag.Out(big.shape, np.uint32),
                np.int64(words),
                grid=(words + 255) // 256,
                block=256,
            )

        (res,) = await pinned_round()
        assert np.array_equal(res, big)
        del res
        rows[
            f"asyncgraph 64 MiB up + kernel + down, pinned input ({label})"
        ] = await harness.time_async(pinned_round, 20, 3)
    return rows


async def placement_rows() -> dict[str, float]:
    rows: dict[str, float] = {}
    for placement in ("least_outstanding", "round_robin"):
        async with ag.open_backend("cuda") as gpu:
            gpu.stream_pool._placement = placement  # type: ignore[attr-defined]
            await gpu.compile(SPIN)
            await gpu.compile(SCALE)
            clock_khz = gpu._cuda.device.device.properties.clock_rate  # type: ignore[attr-defined]
            x = np.ones(N4K, np.float32)
            long = gpu.dispatch(
                SPIN, np.int64(clock_khz * 200), ag.Out(1, np.int32), grid=1, block=1
            )
            latencies = await harness.samples_async(
                lambda: gpu.dispatch(
                    SCALE,
                    x,  # noqa: B023
                    ag.Out(N4K, np.float32),
                    np.float32(2),
                    np.int32(N4K),
                    grid=4,
                    block=256,
                ),
                40,
                0,
            )
            await long
            latencies.sort()
            rows[f"short round trip beside a 200 ms kernel, max us ({placement})"] = (
                latencies[-1] * 1e6
            )
    return rows


def main() -> None:
    args = harness.arguments(__doc__, reps=3000).parse_args()
    reps = args.reps
    results: dict[str, Any] = {}
    results.update(raw_rows(reps))
    results.update(cupy_rows(reps))
    results.update(torch_rows(reps))
    awaited, loops = harness.run_on_loops(lambda label: asyncgraph_rows(reps, label))
    results.update(awaited)
    results.update(harness.run(placement_rows()))

    device = harness.device_name()
    targets = {}
    for loopname in loops:
        rt = results[f"asyncgraph 4 KiB round trip, awaited ({loopname})"]
        targets[f"4 KiB round trip / CuPy sync ({loopname}) <= 1.0"] = rt / results.get(
            "CuPy 4 KiB round trip, synchronous", float("nan")
        )
        targets[f"4 KiB round trip / CuPy run_in_executor ({loopname}) <= 0.35"] = rt / results.get(
            "CuPy 4 KiB round trip, run_in_executor", float("nan")
        )
        targets[f"4 KiB round trip / PyTorch sync ({loopname}) <= 1.0"] = rt / results.get(
            "PyTorch 4 KiB round trip, synchronous", float("nan")
        )
        targets[f"empty awaited - raw, us ({loopname}) <= 4"] = (
            results[f"asyncgraph empty, awaited ({loopname})"]
            - results["raw empty: launch + record + busy query"]
        )
        targets[f"64 tasks dispatches/s ({loopname}) >= 80000"] = results[
            f"asyncgraph 64 tasks empty, dispatches/s ({loopname})"
        ]
        targets[f"64 MiB pinned input: share of pinned copy bandwidth ({loopname}) >= 0.9"] = (
            results["raw pinned 64 MiB up + down"]
            / results[f"asyncgraph 64 MiB up + kernel + down, pinned input ({loopname})"]
        )
        # Not a target: a pageable numpy input must first be copied into pinned staging.
        targets[f"(info) 64 MiB numpy input: share of pinned bandwidth ({loopname})"] = (
            results["raw pinned 64 MiB up + down"]
            / results[f"asyncgraph 64 MiB up + kernel + down ({loopname})"]
        )
    core_name = "compiled" if core.COMPILED else "python"
    print(f"device: {device}, dispatch core: {core_name}")
    harness.print_table(("measurement", "value"), results.items(), (".1f",))
    print()
    harness.print_targets(targets)
    harness.write_json(
        {
            **harness.environment(device),
            "reps": reps,
            "core": core_name,
            "us_or_rate": results,
            "targets": targets,
            "verdicts": harness.verdicts(targets),
        },
        args.json,
        script=__file__,
        device=device,
    )


if __name__ == "__main__":
    main()
