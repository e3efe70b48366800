"""Soak through faults: a Ray actor pool serves many runs while a planted fault takes one of its
actors down every ``--fault-every`` runs, and the pool heals.

Tasks (``--concurrency``) send runs of a 4 KiB scale pipeline through ``pool.run`` and check
each result against numpy. Every ``--fault-every`` runs one of them plants the fault on the
next actor in turn (actor 1 first): on a GPU (``--device cuda``) a pipeline that faults it (a
kernel writing to an illegal address, ``DeviceFaultError``), on the CPU (``--device host``) a
pipeline that ends its actor's process (``os._exit``, Ray's ``ActorDiedError``). The pool takes
the actor out, replaces it and runs its setup there.

The script reports runs ok and runs lost, and checks that the only runs lost were in flight on
a faulted actor (every failed run failed with its actor's error, and as many failed as the
pool counts lost on the actors it replaced); for each fault the time to detect it (from
sending the faulting run to its error) and to replace the actor (from the failure seen to the
new actor taking runs); and each actor's memory at the start, between faults and at the end:
its process's RSS and, on a GPU, the device memory in use (the driver's count) and what its
backend holds. It exits 1 on a wrong result, a run lost that was not in flight on a faulted
actor, or a fault that was not healed.

Two GPUs (issue 36's soak):  python benchmarks/soak_faults.py --device cuda --actors 2 \
    --runs 200000 --fault-every 50000 --json
The CPU (host actors):       python benchmarks/soak_faults.py --device host --runs 2000 \
    --fault-every 500
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

import asyncgraph as ag
from benchmarks import harness
from benchmarks.ray_pipelines import die, memory, poke, scale_once, warm

FAULTS = {"host": die, "cuda": poke}  # the planted fault, by --device
N = 1024  # float32 elements: 4 KiB
MiB = 1 << 20


def start_ray(device: str, actors: int) -> None:
    """A local Ray: on the host with a fake GPU per actor (so each gets its own GPU id), on
    ``cuda`` with the machine's GPUs, at least *actors* of them."""
    import ray

    if device == "host":
        ray.init(num_gpus=actors, include_dashboard=False, log_to_driver=False)
        return
    ray.init(include_dashboard=False, log_to_driver=False)
    api: Any = ray  # cluster_resources() is unannotated
    gpus = api.cluster_resources().get("GPU", 0.0)
    if gpus < actors:
        ray.shutdown()
        raise SystemExit(f"{actors} actors need {actors} GPUs, and Ray sees {gpus:g}")


def is_actor_failure(exc: BaseException) -> bool:
    """Whether *exc* is the error of a run on an actor out of service: its backend failed,
    or its process died."""
    from ray.exceptions import RayActorError

    return isinstance(exc, ag.DeviceFaultError | RayActorError)


async def memory_of(pool: Any, slots: int, tries: int = 3) -> list[dict[str, Any]]:
    """Each slot's actor's memory (:func:`benchmarks.ray_pipelines.memory`). A sample that
    finds its actor out of service (a fault another sender planted meanwhile, or an actor that
    died on its own) is taken again once the pool healed, up to *tries* times."""

    async def one(slot: int) -> dict[str, Any]:
        for _ in range(tries - 1):
            try:
                sample: dict[str, Any] = await pool.run_on(slot, memory)
            except Exception as exc:
                if not (is_actor_failure(exc) or isinstance(exc, ag.BackendClosedError)):
                    raise
                await pool.wait_healed()
            else:
                return sample
        last: dict[str, Any] = await pool.run_on(slot, memory)
        return last

    return list(await asyncio.gather(*(one(i) for i in range(slots))))


async def plant(pool: Any, slot: int, device: str) -> dict[str, Any]:
    """Run the fault on actor *slot*: what it raised, and seconds until its error came."""
    sent = time.perf_counter()
    try:
        await pool.run_on(slot, FAULTS[device])
    except Exception as exc:
        return {"slot": slot, "error": type(exc).__name__, "detect_s": time.perf_counter() - sent}
    return {"slot": slot, "error": None, "detect_s": None}  # it did not fault


def first_tries(snap: Any) -> list[Any]:
    """The replacements that each answer a failure seen (not a second try after a failed
    start), in order."""
    return [r for r in snap.replacements if r.detected_after is not None]


async def soak(
    runs: int, fault_every: int, device: str, actors: int, concurrency: int
) -> dict[str, Any]:
    from asyncgraph.ray import open_actor_pool

    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    expected = 2 * x
    faults: list[dict[str, Any]] = []
    lost: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    between = {k * fault_every + fault_every // 2 for k in range(runs // fault_every + 1)}
    count = {"next": 0, "ok": 0, "wrong": 0}
    max_replacements = runs // fault_every + actors  # every fault, and a failed start or two
    pool = open_actor_pool(
        actors, device=device, setup=warm, max_replacements=max_replacements, start_timeout=120
    )
    async with pool:
        samples.append({"at": "start", "run": 0, "actors": await memory_of(pool, actors)})

        async def sender() -> None:
            while count["next"] < runs:
                k = count["next"]
                count["next"] += 1
                if k and k % fault_every == 0:
                    fault = await plant(pool, (len(faults) + 1) % actors, device)
                    faults.append({"run": k, **fault})
                    print(f"run {k:,}: fault on actor {fault['slot']}: {fault['error']}")
                    continue
                if k in between and k > fault_every:
                    await pool.wait_healed()
                    seen = await memory_of(pool, actors)
                    samples.append({"at": "between", "run": k, "actors": seen})
                try:
                    out = await pool.run(scale_once, x)
                except Exception as exc:
                    failure = is_actor_failure(exc)
                    lost.append({"run": k, "error": type(exc).__name__, "actor_failure": failure})
                    continue
                count["ok"] += 1
                count["wrong"] += not np.array_equal(out, expected)

        started = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        snap = await asyncio.wait_for(pool.wait_healed(), 300)
        samples.append({"at": "end", "run": runs, "actors": await memory_of(pool, actors)})
    replaced = first_tries(snap)
    for fault, replacement in zip(faults, replaced, strict=False):
        fault.update(
            reason=replacement.reason,
            outcome=replacement.outcome,
            pool_detected_after_s=replacement.detected_after,
            replace_s=replacement.seconds,
            runs_lost=replacement.runs_lost - 1,  # the faulting run itself is no loss
        )
    in_flight_lost = sum(r.runs_lost for r in replaced) - len(replaced)
    return {
        **harness.environment(f"{device} backend" if device == "host" else harness.device_name()),
        "runs": runs,
        "fault_every": fault_every,
        "actors": actors,
        "concurrency": concurrency,
        "seconds": elapsed,
        "runs_per_s": runs / elapsed,
        "runs_ok": count["ok"],
        "wrong_results": count["wrong"],
        "runs_lost": len(lost),
        "lost_in_flight_on_faulted_actors": in_flight_lost,
        "only_in_flight_lost": (
            len(lost) == in_flight_lost
            and all(run["actor_failure"] for run in lost)
            and snap.runs_failed == sum(r.runs_lost for r in replaced)
        ),
        "faults": faults,
        "all_healed": (
            len(replaced) == len(faults)
            and all(f["error"] is not None and f.get("outcome") == "replaced" for f in faults)
            and snap.live == actors
        ),
        "replacements": [
            {
                "slot": r.slot,
                "generation": r.generation,
                "outcome": r.outcome,
                "seconds": r.seconds,
                "error": r.error,
            }
            for r in snap.replacements
        ],
        "lost": lost[:100],
        "memory": samples,
        "memory_change": _memory_change(samples),
    }


def _memory_change(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per slot, the change of each memory count from the first sample after the first fault
    was healed (or the start) to the end, in bytes."""
    first = next((s for s in samples if s["at"] == "between"), samples[0])
    last = samples[-1]
    change: dict[str, Any] = {}
    for before, after in zip(first["actors"], last["actors"], strict=True):
        change[str(before["slot"])] = {
            key: None if before[key] is None else after[key] - before[key]
            for key in ("rss", "device_used", "backend_device")
        }
    return change


def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / MiB:,.1f}"


def report(result: dict[str, Any]) -> None:
    print(f"device: {result['device']}, {result['actors']} actors")
    print(
        f"{result['runs']:,} runs from {result['concurrency']} tasks in "
        f"{result['seconds']:.1f} s ({result['runs_per_s']:,.0f}/s): ok {result['runs_ok']:,}, "
        f"wrong {result['wrong_results']}, lost {result['runs_lost']} "
        f"(in flight on a faulted actor: {result['lost_in_flight_on_faulted_actors']}; only "
        f"those lost: {'yes' if result['only_in_flight_lost'] else 'NO'})"
    )
    harness.print_table(
        ("fault at run", "actor", "error", "detect s", "replace s", "runs lost", "outcome"),
        [
            (
                f"{f['run']:,}",
                f["slot"],
                str(f["error"]),
                f["detect_s"] or float("nan"),
                f.get("replace_s") or float("nan"),
                f.get("runs_lost", -1),
                f.get("outcome", "—"),
            )
            for f in result["faults"]
        ],
        ("d", "", ".3f", ".2f", "d", ""),
    )
    harness.print_table(
        ("memory", "actor", "generation", "RSS MiB", "device used MiB", "backend MiB"),
        [
            (
                f"{s['at']} (run {s['run']:,})",
                a["slot"],
                a["generation"],
                _mib(a["rss"]),
                _mib(a["device_used"]),
                _mib(a["backend_device"]),
            )
            for s in result["memory"]
            for a in s["actors"]
        ],
        ("d", "d", "", "", ""),
    )


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("--runs", type=int, default=200_000, help="runs in all (default 200,000)")
    parser.add_argument(
        "--fault-every", type=int, default=50_000, help="runs between faults (default 50,000)"
    )
    parser.add_argument("--device", choices=sorted(FAULTS), default="cuda")
    parser.add_argument("--actors", type=int, default=2, help="actors in the pool (default 2)")
    parser.add_argument(
        "--concurrency", type=int, default=32, help="tasks sending runs at once (default 32)"
    )
    args = parser.parse_args()
    if args.actors < 1 or args.fault_every < 2 or args.runs < args.fault_every:
        parser.error("pass --actors 1 or more, and --runs at least --fault-every (at least 2)")
    import ray

    start_ray(args.device, args.actors)
    try:
        result = harness.run(
            soak(args.runs, args.fault_every, args.device, args.actors, args.concurrency)
        )
    finally:
        ray.shutdown()
    report(result)
    harness.write_json(result, args.json, script=__file__, device=result["device"])
    failed = (
        result["wrong_results"] or not result["only_in_flight_lost"] or not result["all_healed"]
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
