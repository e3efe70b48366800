"""CUDA graphs: asyncgraph's captured and cached graphs against raw graphs, CuPy and PyTorch.

In one run on one GPU, on one dispatch core (medians in µs after a warm-up; awaited rows on
asyncio and uvloop):
- a chain of 50 small kernels (``inc`` over 1024 floats): ``await graph.replay()`` of an
  ``async with backend.capture()`` graph, against the same graph launched raw
  (``cuGraphLaunch`` + ``cuStreamSynchronize`` of its executable, on the same buffer), and
  against the peers: raw ``cuGraphLaunch`` + synchronize of the same kernels captured through
  ``cuda.core``, CuPy's stream-captured graph (``graph.launch`` + synchronize) of the same
  kernel, and PyTorch's ``CUDAGraph.replay`` + synchronize of ``x.add_(1)`` (its own kernel),
  each on a buffer of its own; the same 50 launched eagerly, for reference. All are replayed in
  each loop's run in turns with asyncgraph's replay (``time_async_in_turns``), and the peers'
  again at the end: the GPU's pace moves within a process (on an H100 its clocks rise over the
  first replays, and after 64 tasks of eager dispatches every graph's replay took about 9 µs
  more, CuPy's as well), so a replay is compared with the others of the same turns. Where a
  buffer lies in device memory moves this chain by a few µs too (``graph_peers``), so what an
  awaited replay costs is measured against the same graph launched raw;
- where a graph pays: 10 of these kernels captured as one graph (an awaited replay) against the
  same 10 dispatched eagerly (the last awaited);
- the round trip of bench_dispatch (upload, ``scale``, download) at 4 KiB and 1 MiB with
  ``graph="auto"`` and ``graph="never"`` (``"auto"`` measures both ways in its first turn, and
  again after 512 replays where it chose graphs, and keeps to the cheaper: what it chose, and
  why, is in the JSON), against CuPy's synchronous
  ``asarray`` + kernel + ``asnumpy`` at 4 KiB; for information, the 4 KiB one with
  ``graph="always"`` (a replay each time);
- 64 tasks awaiting dispatches of one signature with ``graph="always"``, against the same with
  ``graph="never"``: the empty kernel of bench_dispatch (whose 64-task row is eager dispatch's
  throughput), the replay machinery's own rate; and, for information, the 4 KiB round trip,
  whose copies bound eager and graphs alike. Dispatches and replays per second (the cache keeps
  a few graphs of a signature; a dispatch finding them all busy runs eagerly);
- changing a scalar: ``CapturedGraph.update``; capturing the 50 dispatches again into the graph
  (``capture(into=graph)``, new scalars each time), and, for reference, into a new graph.
Targets (issue 40): ``graph="auto"`` at most 1.0x ``"never"`` at 4 KiB and 1 MiB; the
10-kernel graph at most 0.4x its 10 eager dispatches; an update at most 4 µs; a capture into
the graph at most 500 µs; 64 tasks at least 60,000 replays a second (of the empty kernel's
signature); the replay at most 3 µs more than the same graph launched raw; and, from before,
the replay at most 1.15x that and faster than CuPy's and PyTorch's replays (each against the
replays of the same turns), the 50 dispatches
awaited eagerly at most 1.5x CuPy's 50 launches + synchronize. The 4 KiB ``"auto"`` round
trip against CuPy's synchronous one is kept as information.

Run on a GPU, once per core:  python benchmarks/bench_graphs.py --json
(``ASYNCGRAPH_CORE=python``: the results go to ``bench_graphs_python_core-<device>.json``)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgraph as ag
from asyncgraph._cuda.core._choose import core
from benchmarks import harness
from benchmarks.bench_dispatch import EMPTY, N4K, SCALE
from benchmarks.graph_peers import (
    BARE_REPLAY,
    CHAIN,
    CUPY_REPLAY,
    INC_SRC,
    RAW_REPLAY,
    SAME_REPLAY,
    TORCH_REPLAY,
    N,
    Replays,
    cupy_rows,
    peer_graphs,
    peer_rows,
    same_graph,
)

SHORT = 10  # the chain where a graph should pay: one launch for 10 nodes
N1M = 1 << 18  # float32 elements: 1 MiB
INC = ag.Kernel(INC_SRC, "inc")


async def _chain(cap: Any, buf: Any, length: int, step: float = 1.0) -> Any:
    """Record ``inc`` on *buf* *length* times; the first recorded dispatch."""
    first = None
    for _ in range(length):
        recorded = await cap.dispatch(INC, buf, np.float32(step), np.int32(N), grid=4, block=256)
        first = first or recorded
    return first


async def chain_rows(gpu: Any, reps: int, loop_name: str, peers: Replays) -> dict[str, float]:
    """The 50-kernel chain: replay (and, in the same turns, the same graph launched raw and
    the *peers*' replays), eager, update, captures; the 10-kernel chain."""
    rows: dict[str, float] = {}
    buf = await gpu.upload(np.zeros(N, np.float32))
    async with gpu.capture() as cap:
        first = await _chain(cap, buf, CHAIN)
    graph = cap.graph
    graph.upload()
    await graph.replay()
    assert np.array_equal(await gpu.download(buf), np.full(N, CHAIN, np.float32))
    # In turns with the peers': the GPU's pace moves within a process (its clocks rise over
    # the first replays; after many eager dispatches every graph replays slower).
    with contextlib.ExitStack() as raw_stack:
        raw, bare = same_graph(graph, raw_stack)
        rows.update(
            await harness.time_async_in_turns(
                {
                    f"asyncgraph 50-kernel graph, awaited replay ({loop_name})": graph.replay,
                    f"{BARE_REPLAY} ({loop_name})": bare,
                },
                reps,
                sync={
                    f"{SAME_REPLAY} ({loop_name})": raw,
                    **{f"{name} ({loop_name})": replay for name, replay in peers.items()},
                },
            )
        )

    async def eager(length: int = CHAIN) -> None:
        pending = [
            gpu.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
            for _ in range(length)
        ]
        await pending[-1]

    rows[f"(info) asyncgraph 50 dispatches, eager ({loop_name})"] = await harness.time_async(
        eager, max(reps // 10, 50), 20
    )
    # Changing a scalar: in place; capturing the chain again into the graph, and anew.
    steps = itertools.count()
    rows[f"CapturedGraph.update of one scalar ({loop_name})"] = harness.time_sync(
        lambda: graph.update(first, buf, np.float32(next(steps) % 3), np.int32(N)), 200, 0
    )
    into, anew = [], []
    for k in range(3 if harness.smoke() else 40):
        t0 = time.perf_counter()
        async with gpu.capture(into=graph) as again:
            await _chain(again, buf, CHAIN, float(k % 3))
        into.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        async with gpu.capture() as other:
            await _chain(other, buf, CHAIN)
        other.graph.upload()
        anew.append(time.perf_counter() - t0)
        other.graph.close()
    assert graph.updated_in_place == graph.recaptures, (graph.recaptures, graph.updated_in_place)
    skip = 0 if harness.smoke() else 10
    rows[f"capture of the 50 dispatches into the graph ({loop_name})"] = harness.median_us(
        into[skip:]
    )
    rows[f"(info) capture of the 50 dispatches into a new graph ({loop_name})"] = harness.median_us(
        anew[skip:]
    )
    graph.close()
    # Where a graph pays: 10 kernels, one launch.
    async with gpu.capture() as cap:
        await _chain(cap, buf, SHORT)
    short = cap.graph
    short.upload()
    rows[f"10-kernel graph, awaited replay ({loop_name})"] = await harness.time_async(
        short.replay, reps
    )
    rows[f"10 eager dispatches, the last awaited ({loop_name})"] = await harness.time_async(
        lambda: eager(SHORT), reps
    )
    short.close()
    await buf.aclose()
    return rows


async def round_trip_rows(gpu: Any, reps: int, loop_name: str) -> tuple[dict[str, float], Any]:
    """The round trip at 4 KiB and 1 MiB, ``graph="auto"`` and ``"never"``; and what "auto"
    chose for each."""
    rows: dict[str, float] = {}
    for n, size in ((N4K, "4 KiB"), (N1M, "1 MiB")):
        x = np.random.default_rng().standard_normal(n, dtype=np.float32)
        ways = {}
        for choice in ("auto", "never", "always") if n == N4K else ("auto", "never"):

            async def round_trip(choice: str = choice, x: Any = x, n: int = n) -> Any:
                return await gpu.dispatch(
                    SCALE, x, ag.Out(n, np.float32), np.float32(2), np.int32(n),
                    grid=(n + 255) // 256, block=256, graph=choice,
                )  # fmt: skip

            for _ in range(3):
                (y,) = await round_trip()
            assert np.array_equal(y, 2 * x)
            info = "(info) " if choice == "always" else ""  # what one replay costs here
            ways[f"{info}asyncgraph {size} round trip, graph={choice!r} ({loop_name})"] = round_trip
        # The two ways in turns (after both warmed up, "auto" past its choice), so that
        # neither is timed first on a machine that drifts.
        rows.update(
            await harness.time_async_in_turns(ways, reps if n == N4K else max(reps // 4, 50))
        )
    choices = [
        {
            "signature": c.signature,
            "choice": c.choice,
            "reason": c.reason,
            "eager_us": None if c.eager_seconds is None else c.eager_seconds * 1e6,
            "graph_us": None if c.graph_seconds is None else c.graph_seconds * 1e6,
            "remeasured": c.remeasured,
        }
        for c in gpu.graph_cache.statistics().choices
    ]
    return rows, choices


TASKS = 64  # tasks replaying one cached signature at once
PER_TASK = 200


async def many_tasks_rows(gpu: Any, loop_name: str) -> dict[str, float]:
    """64 tasks, each awaiting dispatches of one signature with ``graph="always"`` and, for
    comparison, ``"never"``: of the empty kernel, and of the 4 KiB round trip. Dispatches and
    replays per second (a dispatch finding every graph of its signature busy runs eagerly)."""
    x = np.random.default_rng().standard_normal(N4K, dtype=np.float32)
    n1 = np.int32(1)

    def round_trip(graph: str) -> Any:
        return gpu.dispatch(
            SCALE, x, ag.Out(N4K, np.float32), np.float32(2), np.int32(N4K),
            grid=(N4K + 255) // 256, block=256, graph=graph,
        )  # fmt: skip

    def empty(graph: str) -> Any:
        return gpu.dispatch(EMPTY, n1, grid=1, block=1, graph=graph)

    async def worker(count: int, call: Any, graph: str) -> None:
        for _ in range(count):
            results = await call(graph)
        if call is round_trip:
            assert np.array_equal(results[0], 2 * x)

    rows: dict[str, float] = {}
    for name, call in (("empty kernel", empty), ("4 KiB round trip", round_trip)):
        for graph in ("always", "never"):
            await asyncio.gather(*(worker(5, call, graph) for _ in range(TASKS)))  # warm-up
            replays = gpu.telemetry.snapshot().graph_replays
            start = time.perf_counter()
            await asyncio.gather(*(worker(PER_TASK, call, graph) for _ in range(TASKS)))
            took = time.perf_counter() - start
            share = (gpu.telemetry.snapshot().graph_replays - replays) / (TASKS * PER_TASK)
            info = "" if (name, graph) == ("empty kernel", "always") else "(info) "
            rows[f"{info}64 tasks, {name} with graph='{graph}', per second ({loop_name})"] = (
                TASKS * PER_TASK / took
            )
            if graph == "always":
                rows[f"(info) 64 tasks, {name}: share that replayed a graph ({loop_name})"] = share
                rows[f"{info}64 tasks, {name}: replays per second ({loop_name})"] = (
                    TASKS * PER_TASK * share / took
                )
    return rows


CHOICES: dict[str, Any] = {}  # loop -> what graph="auto" chose for each round trip


async def asyncgraph_rows(reps: int, loop_name: str, peers: Replays) -> dict[str, float]:
    async with ag.open_backend("cuda") as opened:
        gpu: Any = opened
        await gpu.compile(INC)
        await gpu.compile(SCALE)
        await gpu.compile(EMPTY)
        rows = await chain_rows(gpu, reps, loop_name, peers)
        trips, CHOICES[loop_name] = await round_trip_rows(gpu, reps, loop_name)
        rows.update(trips)
        rows.update(await many_tasks_rows(gpu, loop_name))
    return rows


def met(value: float, op: str, bound: float) -> bool:
    """Whether *value* meets ``value <op> bound``, *op* being ``"<="``, ``"<"`` or ``">="``."""
    if op == ">=":
        return value >= bound
    return value <= bound if op == "<=" else value < bound


def targets_of(
    results: dict[str, float], loops: tuple[str, ...]
) -> dict[str, tuple[float, float, str]]:
    """Each target: (measured, bound, operator), by name."""
    targets: dict[str, tuple[float, float, str]] = {}
    for loop_name in loops:
        row = f" ({loop_name})"
        for size in ("4 KiB", "1 MiB"):
            auto = results[f"asyncgraph {size} round trip, graph='auto'{row}"]
            never = results[f"asyncgraph {size} round trip, graph='never'{row}"]
            targets[f"{size} round trip graph='auto' / 'never'{row}"] = (auto / never, 1.0, "<=")
        targets[f"10-kernel graph / 10 eager dispatches{row}"] = (
            results[f"10-kernel graph, awaited replay{row}"]
            / results[f"10 eager dispatches, the last awaited{row}"],
            0.4,
            "<=",
        )
        targets[f"CapturedGraph.update of one scalar, µs{row}"] = (
            results[f"CapturedGraph.update of one scalar{row}"],
            4.0,
            "<=",
        )
        targets[f"capture of the 50 dispatches into the graph, µs{row}"] = (
            results[f"capture of the 50 dispatches into the graph{row}"],
            500.0,
            "<=",
        )
        ours = results[f"asyncgraph 50-kernel graph, awaited replay{row}"]
        raw = results[f"{SAME_REPLAY}{row}"]
        targets[f"replay / the same graph launched raw{row}"] = (ours / raw, 1.15, "<=")
        targets[f"replay - the same graph launched raw, µs{row}"] = (ours - raw, 3.0, "<=")
        for peer, peer_row in (("CuPy", CUPY_REPLAY), ("PyTorch", TORCH_REPLAY)):
            if f"{peer_row}{row}" in results:
                targets[f"replay / {peer} graph replay{row}"] = (
                    ours / results[f"{peer_row}{row}"],
                    1.0,
                    "<",
                )
        targets[f"64 tasks, replays of one cached signature per second{row}"] = (
            results[f"64 tasks, empty kernel: replays per second{row}"],
            60_000.0,
            ">=",
        )
        if "CuPy 50 launches + synchronize" in results:
            eager = results[f"(info) asyncgraph 50 dispatches, eager{row}"]
            targets[f"50 eager dispatches / CuPy's 50 launches{row}"] = (
                eager / results["CuPy 50 launches + synchronize"],
                1.5,
                "<=",
            )
    return targets


def main() -> None:
    args = harness.arguments(
        __doc__, reps=2000, reps_help="timed repetitions of each row (the eager rows take a tenth)"
    ).parse_args()
    reps = args.reps
    with contextlib.ExitStack() as stack:
        peers, raw_eager = peer_graphs(stack)
        results, loops = harness.run_on_loops(
            lambda loop_name: asyncgraph_rows(reps, loop_name, peers)
        )
        results.update(peer_rows(reps, peers, raw_eager))
        results.update(cupy_rows(reps))

    device = harness.device_name()
    core_name = "compiled" if core.COMPILED else "python"
    targets = targets_of(results, loops)
    info: dict[str, float] = {}
    for loop_name in loops:
        row = f" ({loop_name})"
        same = results[f"{SAME_REPLAY}{row}"]
        # What an event and its query loop cost beside a synchronize, in the least awaitable.
        info[f"(info) bare awaited replay - the same graph launched raw, µs{row}"] = (
            results[f"{BARE_REPLAY}{row}"] - same
        )
        # Where the buffers lie: the same kernels on the peers' buffers against asyncgraph's.
        for peer, peer_row in (("raw", RAW_REPLAY), ("CuPy", CUPY_REPLAY)):
            if f"{peer_row}{row}" in results:
                info[f"(info) the same graph launched raw - {peer} graph replay, µs{row}"] = (
                    same - results[f"{peer_row}{row}"]
                )
    if "CuPy 4 KiB round trip, synchronous" in results:
        for loop_name in loops:
            auto = results[f"asyncgraph 4 KiB round trip, graph='auto' ({loop_name})"]
            info[f"(info) 4 KiB round trip graph='auto' / CuPy sync ({loop_name})"] = (
                auto / results["CuPy 4 KiB round trip, synchronous"]
            )
    print(f"device: {device}, dispatch core: {core_name}")
    harness.print_table(("measurement (median µs)", "value"), results.items(), (".1f",))
    print()
    harness.print_table(
        ("target", "measured", ""),
        [
            *(
                (f"{name} {op} {bound}", value, "met" if met(value, op, bound) else "missed")
                for name, (value, bound, op) in targets.items()
            ),
            *((name, value, "") for name, value in info.items()),
        ],
        (".3f", ""),
    )
    print()
    for loop_name, choices in CHOICES.items():
        for choice in choices:
            print(f"graph='auto' ({loop_name}): {choice['signature']}: {choice['reason']}")
    harness.write_json(
        {
            **harness.environment(device),
            "core": core_name,
            "reps": reps,
            "median_us": results,
            "targets": {k: {"measured": v, op: b} for k, (v, b, op) in targets.items()},
            "information": info,
            "verdicts": {
                f"{k} {op} {b}": "met" if met(v, op, b) else "missed"
                for k, (v, b, op) in targets.items()
            },
            "auto_choices": CHOICES,
        },
        args.json,
        script=__file__ if core.COMPILED else "bench_graphs_python_core",
        device=device,
    )


if __name__ == "__main__":
    main()
