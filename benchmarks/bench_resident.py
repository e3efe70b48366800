"""An awaited dispatch over resident buffers against its peers, in one run on one GPU.

The same ``scale`` kernel (``out[i] = a * x[i]``, float32) over device memory that stays on the
device, no transfers, for 4 KiB, 1 MiB and 64 MiB arrays (medians in µs after a warm-up):
- raw: ``cuda.core.launch`` + ``cuStreamSynchronize`` on a non-blocking stream;
- CuPy: ``RawKernel`` of the same source on a non-blocking stream + ``stream.synchronize()``;
- PyTorch (where installed): ``torch.mul(x, a, out=y)`` + stream synchronize, PyTorch's own
  kernel for the same work (it cannot launch ours), for reference;
- asyncgraph: ``await backend.dispatch(scale, x_buf, y_buf, a, n)`` on asyncio and uvloop, where
  the event loop keeps serving while the GPU runs; and, for reference, with ``Out(into=y_buf)``,
  which zero-fills ``y_buf`` first (one more memset, which the peers do not do).
Target: asyncgraph at most 1.2x CuPy. The peers run first (raw, CuPy, PyTorch), then
asyncgraph on asyncio and on uvloop: the GPU has left its idle clocks by the time asyncgraph's
rows run, as in bench_dispatch. Every contender gets the same warm-up: half a second of untimed
calls before its first timed row (the first timed row came out slow on asyncio without it), and
the harness's 100 untimed calls before each row.

Run on a GPU:  python benchmarks/bench_resident.py --json [PATH]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from cuda.bindings import driver as drv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgraph as ag
from benchmarks import harness
from benchmarks.bench_dispatch import SCALE, SCALE_SRC

SIZES = {"4 KiB": 1 << 10, "1 MiB": 1 << 18, "64 MiB": 1 << 24}  # float32 elements
BLOCK = 256
TARGET = 1.2
WARM_UP = 0.5  # seconds of untimed calls before each contender's first timed row


def warm_up(fn: Any) -> None:
    """Call *fn* for :data:`WARM_UP` seconds, untimed (not in a smoke run)."""
    deadline = time.perf_counter() + (0.0 if harness.smoke() else WARM_UP)
    while time.perf_counter() < deadline:
        fn()


async def warm_up_async(fn: Any) -> None:
    """Await *fn()* for :data:`WARM_UP` seconds, untimed (not in a smoke run)."""
    deadline = time.perf_counter() + (0.0 if harness.smoke() else WARM_UP)
    while time.perf_counter() < deadline:
        await fn()


def grid(n: int) -> int:
    return -(-n // BLOCK)


def raw_rows(reps: dict[str, int]) -> dict[str, float]:
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, StreamOptions, launch

    dev = Device(0)
    dev.set_current()
    arch = "sm_" + "".join(map(str, dev.compute_capability))
    obj = Program(SCALE_SRC, code_type="c++", options=ProgramOptions(arch=arch)).compile("cubin")
    scale = obj.get_kernel("scale")
    stream = dev.create_stream(options=StreamOptions(nonblocking=True))
    handle = drv.CUstream(int(stream.handle))
    rows: dict[str, float] = {}
    for label, n in SIZES.items():
        d_x = drv.cuMemAlloc(4 * n)[1]
        d_y = drv.cuMemAlloc(4 * n)[1]
        cfg = LaunchConfig(grid=grid(n), block=BLOCK)
        args = (np.uint64(int(d_x)), np.uint64(int(d_y)), np.float32(2), np.int32(n))

        def run(cfg: Any = cfg, args: Any = args) -> None:
            launch(stream, cfg, scale, *args)
            drv.cuStreamSynchronize(handle)

        if not rows:
            warm_up(run)
        rows[f"raw {label}: launch + stream synchronize"] = harness.time_sync(run, reps[label])
        drv.cuMemFree(d_x)
        drv.cuMemFree(d_y)
    stream.close()
    return rows


def cupy_rows(reps: dict[str, int]) -> dict[str, float]:
    try:
        import cupy as cp
    except ImportError:
        return {}
    kernel = cp.RawKernel(SCALE_SRC, "scale")
    stream = cp.cuda.Stream(non_blocking=True)
    rows: dict[str, float] = {}
    with stream:
        for label, n in SIZES.items():
            x = cp.asarray(np.random.default_rng().standard_normal(n, dtype=np.float32))
            y = cp.empty_like(x)

            def run(x: Any = x, y: Any = y, n: int = n) -> None:
                kernel((grid(n),), (BLOCK,), (x, y, np.float32(2), np.int32(n)))
                stream.synchronize()

            run()
            assert np.array_equal(cp.asnumpy(y), 2 * cp.asnumpy(x))
            if not rows:
                warm_up(run)
            rows[f"CuPy {label}: same kernel + stream synchronize"] = harness.time_sync(
                run, reps[label]
            )
    return rows


def torch_rows(reps: dict[str, int]) -> dict[str, float]:
    try:
        import torch
    except ImportError:
        return {}
    stream = torch.cuda.Stream()
    rows: dict[str, float] = {}
    with torch.cuda.stream(stream):
        for label, n in SIZES.items():
            x = torch.randn(n, device="cuda")
            y = torch.empty_like(x)

            def run(x: Any = x, y: Any = y) -> None:
                torch.mul(x, 2.0, out=y)
                stream.synchronize()

            if not rows:
                warm_up(run)
            rows[f"PyTorch {label}: torch.mul + stream synchronize"] = harness.time_sync(
                run, reps[label]
            )
    return rows


async def asyncgraph_rows(reps: dict[str, int], loop_name: str) -> dict[str, float]:
    rows: dict[str, float] = {}
    async with ag.open_backend("cuda") as gpu:
        await gpu.compile(SCALE)
        for label, n in SIZES.items():
            data = np.random.default_rng().standard_normal(n, dtype=np.float32)
            x = await gpu.upload(data)
            y = gpu.empty(n, np.float32)
            a, count, g = np.float32(2), np.int32(n), grid(n)

            async def run(
                x: Any = x, y: Any = y, a: Any = a, count: Any = count, g: int = g
            ) -> object:
                return await gpu.dispatch(SCALE, x, y, a, count, grid=g, block=BLOCK)

            async def run_into(
                x: Any = x, y: Any = y, a: Any = a, count: Any = count, g: int = g
            ) -> object:
                return await gpu.dispatch(SCALE, x, ag.Out(into=y), a, count, grid=g, block=BLOCK)

            await run()
            np.testing.assert_array_equal(await gpu.download(y), 2 * data)
            if not rows:
                # On the H100 the first row came out slow on asyncio after the usual warm-up
                # of 100 alone (24.7 µs for 4 KiB, then 17.3 µs for 1 MiB in the same run).
                await warm_up_async(run)
            await run_into(a=np.float32(3))
            np.testing.assert_array_equal(await gpu.download(y), 3 * data)
            before = gpu.telemetry.snapshot()
            rows[f"asyncgraph {label}: awaited dispatch ({loop_name})"] = await harness.time_async(
                run, reps[label]
            )
            rows[
                f"(info) asyncgraph {label}: Out(into=), zero-filled first ({loop_name})"
            ] = await harness.time_async(run_into, reps[label])
            after = gpu.telemetry.snapshot()
            assert after.bytes_up == before.bytes_up  # resident: nothing moves
            assert after.bytes_down == before.bytes_down
            await x.aclose()
            await y.aclose()
    return rows


def main() -> None:
    args = harness.arguments(
        __doc__,
        reps=3000,
        reps_help="timed repetitions of the small sizes (64 MiB: a tenth, at least 30)",
    ).parse_args()
    reps = {"4 KiB": args.reps, "1 MiB": args.reps, "64 MiB": max(args.reps // 10, 30)}
    # The peers first: the GPU has left its idle clocks by the time asyncgraph's rows run, as
    # in bench_dispatch.
    results = raw_rows(reps)
    results.update(cupy_rows(reps))
    results.update(torch_rows(reps))
    awaited, loops = harness.run_on_loops(lambda loop_name: asyncgraph_rows(reps, loop_name))
    results.update(awaited)

    device = harness.device_name()
    targets = {}
    for label in SIZES:
        cupy = results.get(f"CuPy {label}: same kernel + stream synchronize")
        for loop_name in loops:
            ours = results[f"asyncgraph {label}: awaited dispatch ({loop_name})"]
            if cupy is not None:
                targets[f"{label} / CuPy ({loop_name}) <= {TARGET}"] = ours / cupy
    print(f"device: {device}")
    harness.print_table(("measurement (median µs)", "value"), results.items(), (".1f",))
    print()
    harness.print_targets(targets)
    harness.write_json(
        {
            **harness.environment(device),
            "reps": reps,
            "median_us": results,
            "targets": targets,
            "verdicts": harness.verdicts(targets),
        },
        args.json,
        script=__file__,
        device=device,
    )


if __name__ == "__main__":
    main()
