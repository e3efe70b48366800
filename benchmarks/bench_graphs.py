"""CUDA graphs: asyncgraph's captured and cached graphs against raw graphs, CuPy and PyTorch.

In one run on one GPU (medians in µs after a warm-up; awaited rows on asyncio and uvloop):
- a chain of 50 small kernels (``inc`` over 1024 floats): ``await graph.replay()`` of an
  ``async with backend.capture()`` graph, against raw ``cuGraphLaunch`` + ``cuStreamSynchronize``
  of the same kernels captured through ``cuda.core``, CuPy's stream-captured graph
  (``graph.launch`` + synchronize) of the same kernel, and PyTorch's ``CUDAGraph.replay`` +
  synchronize of ``x.add_(1)`` (its own kernel); the same 50 launched eagerly, for reference;
- the 4 KiB round trip of bench_dispatch (upload, ``scale``, download) with ``graph="auto"``
  and ``graph="never"``, against CuPy's synchronous ``asarray`` + kernel + ``asnumpy``;
- changing a scalar: ``CapturedGraph.update`` against capturing the 50 dispatches again.
Targets: replay at most 1.15x raw, faster than CuPy's and PyTorch's replays; the 4 KiB round
trip with ``graph="auto"`` at most 0.6x CuPy's synchronous one; the 50 dispatches awaited
eagerly (no graph) at most 1.5x CuPy's 50 launches + synchronize.

Run on a GPU:  python benchmarks/bench_graphs.py --json [PATH]
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from cuda.bindings import driver as drv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgraph as ag
from benchmarks import harness
from benchmarks.bench_dispatch import N4K, SCALE, SCALE_SRC

CHAIN = 50
N = 1024
INC_SRC = r"""
extern "C" __global__ void inc(float* buf, float step, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) buf[i] += step;
}
"""
INC = ag.Kernel(INC_SRC, "inc")


async def asyncgraph_rows(reps: int, loop_name: str) -> dict[str, float]:
    rows: dict[str, float] = {}
    async with ag.open_backend("cuda") as opened:
        gpu: Any = opened
        await gpu.compile(INC)
        await gpu.compile(SCALE)
        buf = await gpu.upload(np.zeros(N, np.float32))
        async with gpu.capture() as cap:
            first = await cap.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
            for _ in range(CHAIN - 1):
                await cap.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
        graph = cap.graph
        graph.upload()
        await graph.replay()
        assert np.array_equal(await gpu.download(buf), np.full(N, CHAIN, np.float32))
        rows[
            f"asyncgraph 50-kernel graph, awaited replay ({loop_name})"
        ] = await harness.time_async(graph.replay, reps)

        async def eager() -> None:
            pending = [
                gpu.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
                for _ in range(CHAIN)
            ]
            await pending[-1]

        rows[f"(info) asyncgraph 50 dispatches, eager ({loop_name})"] = await harness.time_async(
            eager, max(reps // 10, 50), 20
        )
        # Changing a scalar: in place, against capturing the chain again.
        steps = itertools.count()
        rows[f"CapturedGraph.update of one scalar ({loop_name})"] = harness.time_sync(
            lambda: graph.update(first, buf, np.float32(next(steps) % 3), np.int32(N)), 200, 0
        )
        samples = []
        for _ in range(30):
            t0 = time.perf_counter()
            async with gpu.capture() as again:
                for _ in range(CHAIN):
                    await again.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
            again.graph.upload()
            samples.append(time.perf_counter() - t0)
            again.graph.close()
        rows[f"capture of the 50 dispatches again ({loop_name})"] = harness.median_us(samples)
        graph.close()
        # The 4 KiB round trip, with and without the graph cache.
        x = np.random.default_rng().standard_normal(N4K, dtype=np.float32)
        for choice in ("auto", "never"):

            async def round_trip(choice: str = choice) -> Any:
                return await gpu.dispatch(
                    SCALE,
                    x,
                    ag.Out(N4K, np.float32),
                    np.float32(2),
                    np.int32(N4K),
                    grid=4,
                    block=256,
                    graph=choice,
                )

            (y,) = await round_trip()
            (y,) = await round_trip()
            (y,) = await round_trip()
            assert np.array_equal(y, 2 * x)
            rows[
                f"asyncgraph 4 KiB round trip, graph={choice!r} ({loop_name})"
            ] = await harness.time_async(round_trip, reps)
        stats = gpu.graph_cache.statistics()
        assert stats.hits >= reps, stats
    return rows


def raw_rows(reps: int) -> dict[str, float]:
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, StreamOptions, launch

    dev = Device(0)
    dev.set_current()
    arch = "sm_" + "".join(map(str, dev.compute_capability))
    kernel = (
        Program(INC_SRC, code_type="c++", options=ProgramOptions(arch=arch))
        .compile("cubin")
        .get_kernel("inc")
    )
    stream = dev.create_stream(options=StreamOptions(nonblocking=True))
    handle = drv.CUstream(int(stream.handle))
    d_buf = drv.cuMemAlloc(4 * N)[1]
    cfg = LaunchConfig(grid=4, block=256)
    args = (np.uint64(int(d_buf)), np.float32(1), np.int32(N))
    builder = stream.create_graph_builder()
    builder.begin_building("thread_local")
    for _ in range(CHAIN):
        launch(builder, cfg, kernel, *args)
    builder.end_building()
    graph = builder.complete()
    graph.upload(stream)
    exe = drv.CUgraphExec(int(graph.handle))

    def replay() -> None:
        drv.cuGraphLaunch(exe, handle)
        drv.cuStreamSynchronize(handle)

    def eager() -> None:
        for _ in range(CHAIN):
            launch(stream, cfg, kernel, *args)
        drv.cuStreamSynchronize(handle)

    rows = {
        "raw 50-kernel graph: cuGraphLaunch + stream synchronize": harness.time_sync(replay, reps),
        "(info) raw 50 launches + stream synchronize": harness.time_sync(
            eager, max(reps // 10, 50), 20
        ),
    }
    graph.close()
    drv.cuMemFree(d_buf)
    stream.close()
    return rows


def cupy_rows(reps: int) -> dict[str, float]:
    try:
        import cupy as cp
    except ImportError:
        return {}
    kernel = cp.RawKernel(INC_SRC, "inc")
    stream = cp.cuda.Stream(non_blocking=True)
    x = cp.zeros(N, dtype=cp.float32)
    with stream:
        kernel((4,), (256,), (x, np.float32(1), np.int32(N)))
        stream.synchronize()
        stream.begin_capture()
        for _ in range(CHAIN):
            kernel((4,), (256,), (x, np.float32(1), np.int32(N)))
        graph = stream.end_capture()
        graph.upload(stream)

        def replay() -> None:
            graph.launch(stream)
            stream.synchronize()

        def eager() -> None:
            for _ in range(CHAIN):
                kernel((4,), (256,), (x, np.float32(1), np.int32(N)))
            stream.synchronize()

        rows = {
            "CuPy 50-kernel graph: launch + synchronize": harness.time_sync(replay, reps),
            "CuPy 50 launches + synchronize": harness.time_sync(eager, max(reps // 10, 50), 20),
        }
    scale = cp.RawKernel(SCALE_SRC, "scale")
    h = np.random.default_rng().standard_normal(N4K, dtype=np.float32)

    def round_trip() -> Any:
        d = cp.asarray(h)
        out = cp.empty_like(d)
        scale((4,), (256,), (d, out, np.float32(2), np.int32(N4K)))
        return cp.asnumpy(out)

    assert np.array_equal(round_trip(), 2 * h)
    rows["CuPy 4 KiB round trip, synchronous"] = harness.time_sync(round_trip, reps)
    return rows


def torch_rows(reps: int) -> dict[str, float]:
    try:
        import torch
    except ImportError:
        return {}
    x = torch.zeros(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CHAIN):
            x.add_(1.0)

    def replay() -> None:
        graph.replay()
        torch.cuda.current_stream().synchronize()

    return {"PyTorch 50-op graph (x.add_): replay + synchronize": harness.time_sync(replay, reps)}


def met(value: float, op: str, bound: float) -> bool:
    """Whether *value* meets ``value <op> bound``, *op* being ``"<="`` or ``"<"``."""
    return value <= bound if op == "<=" else value < bound


def main() -> None:
    args = harness.arguments(
        __doc__, reps=2000, reps_help="timed repetitions of each row (the eager rows take a tenth)"
    ).parse_args()
    reps = args.reps
    results, loops = harness.run_on_loops(lambda loop_name: asyncgraph_rows(reps, loop_name))
    results.update(raw_rows(reps))
    results.update(cupy_rows(reps))
    results.update(torch_rows(reps))

    device = harness.device_name()
    raw = results["raw 50-kernel graph: cuGraphLaunch + stream synchronize"]
    targets: dict[str, tuple[float, float, str]] = {}
    for loop_name in loops:
        ours = results[f"asyncgraph 50-kernel graph, awaited replay ({loop_name})"]
        targets[f"replay / raw graph ({loop_name})"] = (ours / raw, 1.15, "<=")
        for peer, row in (
            ("CuPy", "CuPy 50-kernel graph: launch + synchronize"),
            ("PyTorch", "PyTorch 50-op graph (x.add_): replay + synchronize"),
        ):
            if row in results:
                targets[f"replay / {peer} graph replay ({loop_name})"] = (
                    ours / results[row],
                    1.0,
                    "<",
                )
        if "CuPy 50 launches + synchronize" in results:
            eager = results[f"(info) asyncgraph 50 dispatches, eager ({loop_name})"]
            targets[f"50 eager dispatches / CuPy's 50 launches ({loop_name})"] = (
                eager / results["CuPy 50 launches + synchronize"],
                1.5,
                "<=",
            )
        if "CuPy 4 KiB round trip, synchronous" in results:
            auto = results[f"asyncgraph 4 KiB round trip, graph='auto' ({loop_name})"]
            targets[f"4 KiB round trip graph='auto' / CuPy sync ({loop_name})"] = (
                auto / results["CuPy 4 KiB round trip, synchronous"],
                0.6,
                "<=",
            )
    print(f"device: {device}")
    harness.print_table(("measurement (median µs)", "value"), results.items(), (".1f",))
    print()
    harness.print_table(
        ("target", "measured", ""),
        (
            (f"{name} {op} {bound}", value, "met" if met(value, op, bound) else "missed")
            for name, (value, bound, op) in targets.items()
        ),
        (".3f", ""),
    )
    harness.write_json(
        {
            **harness.environment(device),
            "reps": reps,
            "median_us": results,
            "targets": {k: {"measured": v, op: b} for k, (v, b, op) in targets.items()},
            "verdicts": {
                f"{k} {op} {b}": "met" if met(v, op, b) else "missed"
                for k, (v, b, op) in targets.items()
            },
        },
        args.json,
        script=__file__,
        device=device,
    )


if __name__ == "__main__":
    main()
