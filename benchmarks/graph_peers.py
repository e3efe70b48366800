"""The peers of ``bench_graphs``: the same 50-kernel chain as a raw ``cuda.core`` graph, a CuPy
graph and a PyTorch graph, each made once and timed as its replay (launch + synchronize); CuPy's
50 launches and its 4 KiB round trip; and asyncgraph's own captured graph launched raw
(:func:`same_graph`): its launch + synchronize, and the least an awaited replay can do (``bare``:
the launch, an event recorded after it and queried until done, in a coroutine).

The chain: ``inc`` over 1024 floats (:data:`INC_SRC`), :data:`CHAIN` times. The peers' graphs
work on buffers of their own, and where a buffer lies in device memory moves a chain of small
kernels by a few µs (on an NVIDIA H200 the same CuPy graph ran 4 µs faster over one of
asyncgraph's buffers than over another, 2 MiB further on); asyncgraph's own graph launched raw
runs the same kernels on the same buffer, so it alone measures what awaiting a replay costs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from cuda.bindings import driver as drv

from benchmarks import harness
from benchmarks.bench_dispatch import N4K, SCALE_SRC
from benchmarks.primitives import check

CHAIN = 50
N = 1024
INC_SRC = r"""
extern "C" __global__ void inc(float* buf, float step, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) buf[i] += step;
}
"""
# The peers' 50-kernel graphs (``peer_graphs``), each as its replay (launch + synchronize), by
# row name: each loop's run times them in turns with asyncgraph's replay.
Replays = dict[str, Callable[[], None]]

RAW_REPLAY = "raw 50-kernel graph: cuGraphLaunch + stream synchronize"
CUPY_REPLAY = "CuPy 50-kernel graph: launch + synchronize"
TORCH_REPLAY = "PyTorch 50-op graph (x.add_): replay + synchronize"
SAME_REPLAY = "asyncgraph's graph launched raw: cuGraphLaunch + stream synchronize"
BARE_REPLAY = "(info) bare awaited replay of asyncgraph's graph: launch, event, query loop"


def peer_graphs(stack: contextlib.ExitStack) -> tuple[Replays, Callable[[], None]]:
    """The 50-kernel graph of each peer installed (raw ``cuda.bindings`` always; CuPy and
    PyTorch where importable), each as its replay: launch + synchronize; and the raw 50
    launches + synchronize. *stack* frees them."""
    raw_replay, raw_eager = _raw_graph(stack)
    replays = {RAW_REPLAY: raw_replay}
    for name, make in ((CUPY_REPLAY, _cupy_graph), (TORCH_REPLAY, _torch_graph)):
        replay = make()
        if replay is not None:
            replays[name] = replay
    return replays, raw_eager


def same_graph(
    graph: Any, stack: contextlib.ExitStack
) -> tuple[Callable[[], None], Callable[[], Awaitable[None]]]:
    """asyncgraph's captured *graph* (its executable: ``CapturedGraph.launch_address``)
    launched raw on a stream of its own, in the current context: as a replay (launch +
    synchronize), and as its bare awaited replay. *stack* frees the stream and the event."""
    exe = drv.CUgraphExec(graph.launch_address())
    handle = check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING))
    stack.callback(drv.cuStreamDestroy, handle)
    event = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING))
    stack.callback(drv.cuEventDestroy, event)
    not_ready = drv.CUresult.CUDA_ERROR_NOT_READY

    def replay() -> None:
        drv.cuGraphLaunch(exe, handle)
        drv.cuStreamSynchronize(handle)

    async def bare() -> None:
        # No pool, no admission, no result, no yield to the loop: an awaitable can do no less.
        drv.cuGraphLaunch(exe, handle)
        drv.cuEventRecord(event, handle)
        while drv.cuEventQuery(event)[0] == not_ready:
            pass

    return replay, bare


def _cupy_graph() -> Callable[[], None] | None:
    """CuPy's stream-captured 50-kernel graph, as its replay (``None``: no CuPy)."""
    try:
        import cupy as cp
    except ImportError:
        return None
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

    return replay


def _torch_graph() -> Callable[[], None] | None:
    """PyTorch's 50-op ``CUDAGraph`` (``x.add_(1)``), as its replay (``None``: no PyTorch)."""
    try:
        import torch
    except ImportError:
        return None
    y = torch.zeros(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            y.add_(1.0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CHAIN):
            y.add_(1.0)

    def replay() -> None:
        graph.replay()
        torch.cuda.current_stream().synchronize()

    return replay


def _raw_graph(
    stack: contextlib.ExitStack,
) -> tuple[Callable[[], None], Callable[[], None]]:
    """The raw 50-kernel graph (``cuda.core`` capture) on a buffer of its own, as its replay;
    and the 50 launches."""
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
    stack.callback(stream.close)
    handle = drv.CUstream(int(stream.handle))
    d_buf = drv.cuMemAlloc(4 * N)[1]
    stack.callback(drv.cuMemFree, d_buf)
    cfg = LaunchConfig(grid=4, block=256)
    args = (np.uint64(int(d_buf)), np.float32(1), np.int32(N))
    builder = stream.create_graph_builder()
    builder.begin_building("thread_local")
    for _ in range(CHAIN):
        launch(builder, cfg, kernel, *args)
    builder.end_building()
    graph = builder.complete()
    stack.callback(graph.close)
    graph.upload(stream)
    exe = drv.CUgraphExec(int(graph.handle))

    def replay() -> None:
        drv.cuGraphLaunch(exe, handle)
        drv.cuStreamSynchronize(handle)

    def eager() -> None:
        for _ in range(CHAIN):
            launch(stream, cfg, kernel, *args)
        drv.cuStreamSynchronize(handle)

    return replay, eager


def peer_rows(reps: int, peers: Replays, raw_eager: Callable[[], None]) -> dict[str, float]:
    """The *peers*' graph replays again at the end of the run, and the raw 50 launches."""
    rows = {f"(info) {name}, at the end": harness.time_sync(fn, reps) for name, fn in peers.items()}
    rows["(info) raw 50 launches + stream synchronize"] = harness.time_sync(
        raw_eager, max(reps // 10, 50), 20
    )
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

        def eager() -> None:
            for _ in range(CHAIN):
                kernel((4,), (256,), (x, np.float32(1), np.int32(N)))
            stream.synchronize()

        rows = {"CuPy 50 launches + synchronize": harness.time_sync(eager, max(reps // 10, 50), 20)}
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
