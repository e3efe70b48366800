"""Two GPUs against one on a compute-bound kernel: a device group, and a Ray pool.

The kernel runs four independent chains of dependent ``fmaf`` per thread (``BURN``) over 132
blocks of 1024 threads, enough to keep every FP32 unit busy (a second kernel on the same GPU
finds nothing idle), about 0.25 ms on an NVIDIA H100 for the group rows; a block reads one
float and writes one, so the dispatches move almost no data and the host is not the bound.
Every result is checked against the chains' closed form in numpy. In one run:

- **group**: 64 dispatches at once (``asyncio.gather``) on ``open_group(["cuda:0", "cuda:1"])``
  against the same on ``open_backend("cuda:0")``: wall time, medians of ``--reps`` rounds;
- **pool**: 64 runs at once of a pipeline of 4 dispatches of a 1 ms chain (so that a run's
  Ray round trip, about a millisecond, does not hide the GPU) on ``open_actor_pool(2)`` against
  ``open_actor_pool(1)`` (Ray started here with the machine's GPUs; skipped without Ray).

Targets (issue 36): group at least 1.8x one backend; pool of 2 at least 1.8x pool of 1.
``--device host`` runs the same on host backends (and a local Ray with two fake GPUs), to check
that the script runs where there is no GPU; it measures nothing of interest.

    python benchmarks/bench_scale.py [--reps N] [--json [PATH]] [--device host]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

import asyncgraph as ag
from benchmarks import harness

BURN_SOURCE = r"""
extern "C" __global__ void burn(const float* x, float* y, float a, float b, int iters, float never)
{
    // Four independent chains of dependent fmaf per thread, 1024 threads a block: enough
    // independent work to keep every FP32 unit of an SM busy, so a second kernel on the same
    // GPU finds nothing idle to run on (compute-bound, unlike a single latency-bound chain).
    // A block reads one input and writes one output, so the dispatch moves almost no data.
    float v0 = x[blockIdx.x], v1 = v0 + 1.0f, v2 = v0 + 2.0f, v3 = v0 + 3.0f;
    for (int k = 0; k < iters; ++k) {
        v0 = fmaf(v0, a, b);
        v1 = fmaf(v1, a, b);
        v2 = fmaf(v2, a, b);
        v3 = fmaf(v3, a, b);
    }
    float r = 0.25f * (v0 + v1 + v2 + v3);
    // Every thread's chains count: the compiler cannot drop a write it cannot rule out.
    if (threadIdx.x == 0 || r == never) y[blockIdx.x] = r;
}
"""
A, B = np.float32(0.9999), np.float32(1e-4)  # the chains' fixed point is 1
NEVER = np.float32(-1e30)  # no chain reaches it
BLOCKS, THREADS = 132, 1024
N = BLOCKS  # one input and one output per block
GROUP_ITERS, POOL_ITERS = 14_000, 56_000  # about 0.25 ms and 1 ms on an H100
DISPATCHES = 64


def _burn_host(x: Any, y: Any, a: Any, b: Any, iters: Any, never: Any) -> None:
    y[:] = expected(x, int(iters))


BURN = ag.Kernel(BURN_SOURCE, "burn", host=_burn_host)


def expected(x: np.ndarray[Any, Any], iters: int) -> np.ndarray[Any, Any]:
    """The chains' closed form: ``v_k = f + (v_0 - f) a^k`` with the fixed point
    ``f = b / (1 - a)``, averaged over the four chains (``v_0`` = x, x + 1, x + 2, x + 3)."""
    fixed = float(B) / (1.0 - float(A))
    start = x.astype(np.float64) + 1.5  # the mean of the four starts
    return (fixed + (start - fixed) * float(A) ** iters).astype(np.float32)


def _check(out: np.ndarray[Any, Any], x: np.ndarray[Any, Any], iters: int) -> None:
    np.testing.assert_allclose(out, expected(x, iters), rtol=0, atol=2e-3)


def _burn(target: Any, x: np.ndarray[Any, Any], iters: int) -> ag.PendingDispatch:
    pending: ag.PendingDispatch = target.dispatch(
        BURN, x, ag.Out(N, np.float32), A, B, np.int32(iters), NEVER,
        grid=BLOCKS, block=THREADS,
    )  # fmt: skip
    return pending


async def _round(target: Any, xs: list[np.ndarray[Any, Any]], iters: int) -> float:
    """Seconds for len(xs) dispatches at once on *target*, every result checked."""
    t0 = time.perf_counter()
    results = await asyncio.gather(*(_burn(target, x, iters) for x in xs))
    elapsed = time.perf_counter() - t0
    for (out,), x in zip(results, xs, strict=True):
        _check(out, x, iters)
    return elapsed


async def group_rows(reps: int, device: str) -> dict[str, float]:
    rng = np.random.default_rng()
    xs = [rng.standard_normal(N, dtype=np.float32) for _ in range(DISPATCHES)]
    times: dict[str, list[float]] = {"one": [], "group": []}
    members = ["cuda:0", "cuda:1"] if device == "cuda" else ["host", "host"]
    async with ag.open_backend(members[0]) as one, ag.open_group(members) as group:
        await one.compile(BURN)
        await group.compile(BURN)
        for target in (one, group):
            await _round(target, xs, GROUP_ITERS)  # warm-up
        for _ in range(reps):  # in turns, so the machine's drift falls on both
            times["one"].append(await _round(one, xs, GROUP_ITERS))
            times["group"].append(await _round(group, xs, GROUP_ITERS))
        timed = one.dispatch(
            BURN, xs[0], ag.Out(N, np.float32), A, B, np.int32(GROUP_ITERS), NEVER,
            grid=BLOCKS, block=THREADS, timing=True,
        )  # fmt: skip
        await timed
        device_time = timed.device_time
        split = [m.telemetry.snapshot().dispatches for m in group]
    one_ms, group_ms = (harness.median(times[k]) * 1e3 for k in ("one", "group"))
    return {
        f"one backend, {DISPATCHES} dispatches, ms": one_ms,
        f"group of 2 GPUs, {DISPATCHES} dispatches, ms": group_ms,
        "group speed-up over one backend": one_ms / group_ms,
        "(info) dispatches on member 0 / member 1": split[0] / max(split[1], 1),
        **({"(info) one kernel, ms": device_time * 1e3} if device_time else {}),
    }


async def burn_pipeline(worker: Any, xs: list[np.ndarray[Any, Any]], iters: int) -> Any:
    """A run on an actor: one dispatch of the chain per array, all at once; the results."""
    import asyncio

    import numpy as np

    import asyncgraph as ag

    def host(x: Any, y: Any, a: Any, b: Any, iters: Any, never: Any) -> None:
        fixed = float(b) / (1.0 - float(a))
        y[:] = fixed + (x.astype(np.float64) + 1.5 - fixed) * float(a) ** int(iters)

    kernel = worker.state.get("burn")
    if kernel is None:
        kernel = worker.state["burn"] = ag.Kernel(BURN_SOURCE, "burn", host=host)
    n = xs[0].size
    launches = [
        worker.backend.dispatch(
            kernel,
            x,
            ag.Out(n, np.float32),
            np.float32(0.9999),
            np.float32(1e-4),
            np.int32(iters),
            np.float32(-1e30),
            grid=n,
            block=1024,
        )
        for x in xs
    ]
    results = await asyncio.gather(*launches)
    return [out for (out,) in results]


async def pool_rows(reps: int, device: str) -> dict[str, float]:
    try:
        import ray
    except ImportError:
        print("Ray is not installed: the pool rows are left out")
        return {}
    from asyncgraph.ray import open_actor_pool

    rng = np.random.default_rng()
    runs = [[rng.standard_normal(N, dtype=np.float32) for _ in range(4)] for _ in range(64)]
    ray.init(num_gpus=2, num_cpus=4, include_dashboard=False, log_to_driver=False)
    rows: dict[str, float] = {}
    try:
        times: dict[int, list[float]] = {1: [], 2: []}
        # Pools of 1 and 2 in turns, each opened anew (two GPUs in all: they cannot both hold
        # theirs at once); the first round of each is a warm-up.
        for size in (1, 2) * (reps + 1):
            async with open_actor_pool(size, device=device) as pool:
                await pool.broadcast(burn_pipeline, runs[0][:1], POOL_ITERS)  # compile
                t0 = time.perf_counter()
                results = await asyncio.gather(
                    *(pool.run(burn_pipeline, xs, POOL_ITERS) for xs in runs)
                )
                elapsed = time.perf_counter() - t0
                infos = pool.infos
            for outs, xs in zip(results, runs, strict=True):
                for out, x in zip(outs, xs, strict=True):
                    _check(out, x, POOL_ITERS)
            times[size].append(elapsed)
            if size == 2:
                rows["(info) pool of 2: distinct PCI bus ids"] = len({i.pci_bus_id for i in infos})
        one_ms, two_ms = (harness.median(times[k][1:]) * 1e3 for k in (1, 2))
        rows |= {
            "pool of 1, 64 runs of 4 dispatches, ms": one_ms,
            "pool of 2, 64 runs of 4 dispatches, ms": two_ms,
            "pool of 2 speed-up over pool of 1": one_ms / two_ms,
        }
    finally:
        ray.shutdown()
    return rows


def main() -> None:
    parser = harness.arguments(__doc__, reps=7, reps_help="rounds of each row")
    parser.add_argument(
        "--device",
        choices=("cuda", "host"),
        default="cuda",
        help="two GPUs (default), or host backends: a check that the script runs, no measure",
    )
    args = parser.parse_args()
    if args.device == "cuda":
        from cuda.bindings import driver as drv

        drv.cuInit(0)
        count = drv.cuDeviceGetCount()[1]
        if count < 2:
            print(f"needs two GPUs, found {count}")
            return
        device = harness.device_name()
    else:
        device = "host backend"
    rounds = 1 if harness.smoke() else args.reps
    rows = harness.run(group_rows(rounds, args.device))
    rows |= harness.run(pool_rows(1 if harness.smoke() else max(args.reps // 2, 2), args.device))
    targets = {"group / one backend >= 1.8": rows["group speed-up over one backend"]}
    if "pool of 2 speed-up over pool of 1" in rows:
        targets["pool of 2 / pool of 1 >= 1.8"] = rows["pool of 2 speed-up over pool of 1"]
    print(f"device: 2x {device}")
    harness.print_table(("measurement", "value"), rows.items(), (".2f",))
    print()
    harness.print_table(("target", "measured"), targets.items(), (".2f",))
    harness.write_json(
        {**harness.environment(f"2x {device}"), "rows": rows, "targets": targets},
        args.json,
        script=__file__,
        device=device,
    )


if __name__ == "__main__":
    main()
