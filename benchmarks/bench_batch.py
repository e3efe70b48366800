"""Dynamic batching (``ag.batcher``) against one dispatch per request, under concurrent clients.

The work is the example service's dense layer, ``relu(x @ W + b)``, with ``W`` and ``b``
resident on the backend, one 4 KiB row (1024 float32) per request (``batch_loads.py``). Each
request is served one of three ways: ``per-request``, one ``backend.dispatch`` of that row
alone; ``batched``, ``await batcher(x)`` through a batcher of the adaptive launch policy (the
default: a batch launches at the end of the turn of the loop in which its first caller found
nothing of the batcher in flight, else when the batch in flight completes, when full, or at
``--max-delay-us``); ``fixed delay``, the same through a batcher of the fixed-delay policy
(a batch waits for ``--max-size`` rows or ``--max-delay-us``).

Rows, on asyncio and uvloop (or the one ``--loop`` names), on the backend ``--backend`` names:

- 1, 8 and 64 clients, each awaiting its requests back to back (``--rounds`` each): requests/s,
  latency p50/p99/max (from the call to its return) and rows per dispatch, each way; the ways
  run in turns, ``--pairs`` times, requests/s the median of the loads, latencies pooled; at 64
  clients with three floors in the same turns: ``floor``, the same clients awaiting
  ``asyncio.sleep(0)`` (what the loop itself serves); ``batch floor``, the same clients each
  awaiting a future resolved 64 at a time with nothing behind it (what waiting for a batch
  costs the loop, whatever the batcher; ``batch_loads.BatchFloor``); ``dispatch floor``, the
  same futures resolved by the completion of one dispatch of 64 rows staged once (what a
  batcher whose per-item work cost nothing would serve, the GPU's round trip included;
  ``BatchFloor`` with ``batch_loads.DispatchFloor``'s release, its last result checked against
  numpy); ``rows floor``, the same with each client's own row written into staging and its
  row of the result handed back, every answer checked (what a batcher whose queue cost
  nothing would serve: ``batch_loads.RowsFloor``);
- the mixed load: 64 clients, each burning ``--burn-us`` of CPU before each request (the
  request's own work, holding the GIL), beside the floor (the same clients awaiting
  ``asyncio.sleep(0)`` instead of a dispatch); floor and the three ways in turns;
- why the batches of each batcher launched in each load (``statistics().launched``: full,
  idle, completion, deadline, flush), and their mean rows;
- issue 41's targets: batched >= 1.0x per-request requests/s at 1, 8 and 64 clients, with p99
  no worse at 8 and 64; at 64 clients batched >= 0.8x the dispatch floor's requests/s; in the
  mixed load, batched >= 0.95x the floor's.

Then the example service (``examples/server``) under uvicorn on each loop, its dense endpoint
batching (``EXAMPLE_BATCH=1``) and not, ``--http-pairs`` runs each in turns, each run
``load.py --requests --clients`` (``--http-requests``, ``--http-clients``; every answer checked
against numpy by ``load.py``): requests/s, latency p50/p99, dispatches and dense rows per
dispatch, and the target batched >= 0.95x per-request requests/s (the median of the runs);
``--http-requests 0`` leaves it out.

Both batchers and one dispatch per request are checked against numpy once at the start, and
every answer of every load is checked after the load, outside the timed part. The header gives
how long ``asyncio.sleep(max_delay)`` takes on each loop: the deadline is a timer of the loop.

``--backend stand-in`` runs the CUDA backend on the CPU, against the stand-in driver of
``tests/fake_driver`` (built here; ``--stand-in-complete`` says when its events complete,
``instant`` or ``after:US``): the host-side cost of each way, the dispatch floor's included.
The stand-in runs no dense layer, so its answers are not checked, and the example service is
left out.

Run on a GPU:     python benchmarks/bench_batch.py --backend cuda --json [PATH]
On the host:      python benchmarks/bench_batch.py --backend host
On the stand-in:  python benchmarks/bench_batch.py --backend stand-in --http-requests 0
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgraph as ag
from benchmarks import harness
from benchmarks.batch_loads import (
    Array,
    BatchFloor,
    DispatchFloor,
    RowsFloor,
    Service,
    Way,
    in_turns,
    pair_ratios,
)
from benchmarks.bench_load import Target, print_targets
from benchmarks.example_service import server_rows

CLIENTS = (1, 8, 64)
MIXED_CLIENTS = 64
FLOOR_CLIENTS = 64  # the back-to-back load that also runs the floor
WAYS = ("per-request", "batched", "fixed delay")
BATCHED = ("batched", "fixed delay")  # the ways through a batcher
FLOORS = ("floor", "batch floor", "dispatch floor", "rows floor")
REASONS = ("full", "idle", "completion", "deadline", "flush")
STAND_IN_ENV = "ASYNCGRAPH_BENCH_STAND_IN"
# The requests/s ratios of the back-to-back rows, (top, bottom, key), where both ways ran:
# ``rows_bound_ratio`` is the most a batcher that copies its callers' rows could reach of the
# dispatch floor, the last two the most any batcher could reach over one dispatch per request
# there, without the GPU and with it.
RATIOS = (
    ("batched", "per-request", "ratio"),
    ("fixed delay", "per-request", "fixed_ratio"),
    ("batched", "floor", "floor_ratio"),
    ("batched", "batch floor", "batch_floor_ratio"),
    ("batched", "dispatch floor", "dispatch_floor_ratio"),
    ("fixed delay", "dispatch floor", "fixed_dispatch_floor_ratio"),
    ("batched", "rows floor", "rows_floor_ratio"),
    ("rows floor", "dispatch floor", "rows_bound_ratio"),
    ("batch floor", "per-request", "bound_ratio"),
    ("dispatch floor", "per-request", "dispatch_bound_ratio"),
)


def _floor(x: Array) -> Awaitable[None]:
    """The floor: no work, one turn of the loop (what the clients' turns cost)."""
    return asyncio.sleep(0)


def _launches(service: Service) -> dict[str, dict[str, int]]:
    """By batched way: its batcher's batches by why they launched, and its items."""
    counts: dict[str, dict[str, int]] = {}
    for way, batcher in service.batchers.items():
        stats = batcher.statistics()
        counts[way] = {reason: getattr(stats.launched, reason) for reason in REASONS}
        counts[way]["items"] = stats.items
    return counts


def _since(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, Any]:
    """What each batcher launched between two :func:`_launches` (by why), and rows per batch."""
    launched: dict[str, Any] = {}
    for way, counts in after.items():
        delta = {key: counts[key] - before[way][key] for key in counts}
        batches = sum(delta[reason] for reason in REASONS)
        launched[way] = {
            "launched": {reason: delta[reason] for reason in REASONS},
            "rows_per_batch": delta["items"] / batches if batches else float("nan"),
        }
    return launched


async def _load(
    service: Service, loads: dict[str, Way], *, clients: int, rounds: int, burn_s: float, pairs: int
) -> dict[str, Any]:
    """:func:`in_turns`, with why each batcher's batches launched meanwhile."""
    before = _launches(service)
    row = await in_turns(service, loads, clients=clients, rounds=rounds, burn_s=burn_s, pairs=pairs)
    row["batchers"] = _since(_launches(service), before)
    return row


async def rows_on(
    loop: str,
    device: str,
    *,
    features: int,
    rounds: int,
    pairs: int,
    burn_s: float,
    max_size: int,
    max_delay: float,
    checked: bool,
) -> dict[str, dict[str, Any]]:
    """Every row on the running loop (named *loop*), with the backend's name and device."""
    async with ag.open_backend(device) as backend:
        service = await Service.open(
            backend, features, max_size=max_size, max_delay=max_delay, checked=checked
        )
        try:
            await service.first_check()
            # The batcher's deadline is a timer of the loop, whose resolution may be coarser.
            timer_us = await harness.time_async(lambda: asyncio.sleep(max_delay), 50, 5)
            ways: dict[str, Way] = {
                "per-request": service.per_request,
                "batched": service.batched,
                "fixed delay": service.fixed_delay,
            }
            clients: dict[str, Any] = {}
            for n in CLIENTS:
                loads = ways
                if n == FLOOR_CLIENTS:
                    dispatched = DispatchFloor(service, n)
                    loads = {
                        "floor": _floor, "batch floor": BatchFloor(n),
                        "dispatch floor": BatchFloor(n, dispatched.release),
                        "rows floor": RowsFloor(service, n), **ways,
                    }  # fmt: skip
                row = await _load(service, loads, clients=n, rounds=rounds, burn_s=0.0, pairs=pairs)
                if n == FLOOR_CLIENTS:
                    dispatched.check()
                by_pair = row.pop("pairs")
                for top, bottom, key in RATIOS:
                    if top in loads and bottom in loads:
                        row[key] = pair_ratios(by_pair, top, bottom)
                clients[str(n)] = row
            mixed = await _load(
                service,
                {"floor": _floor, **ways},
                clients=MIXED_CLIENTS,
                rounds=rounds,
                burn_s=burn_s,
                pairs=pairs,
            )
            by_pair = mixed.pop("pairs")
            mixed["ratio"] = {way: pair_ratios(by_pair, way, "floor") for way in WAYS}
        finally:
            await service.aclose()
    return {
        loop: {
            "backend": backend.name,
            "device": str(getattr(backend, "device_name", "host")),
            "timer_us": timer_us,
            "clients": clients,
            "mixed": mixed,
        }
    }


def http_rows(
    loops: Sequence[str], device: str, *, requests: int, clients: int, pairs: int
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The example service through HTTP (``load.py``), its dense endpoint batching
    (``EXAMPLE_BATCH=1``) and not, *pairs* times in turns, on each loop: by loop, by way,
    ``load.py``'s report of each run."""
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for loop in loops:
        runs: dict[str, list[dict[str, Any]]] = {"batched": [], "per-request": []}
        for _ in range(pairs):
            for way, flag in (("batched", "1"), ("per-request", "0")):
                report = server_rows([loop], device, requests, clients, {"EXAMPLE_BATCH": flag})
                runs[way].append(report[loop])
        rows[loop] = runs
    return rows


def print_http(rows: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    """One line per run of the example service: requests/s, latency, dispatches, rows each."""
    table: list[list[object]] = []
    for loop, runs in rows.items():
        for way, reports in runs.items():
            for report in reports:
                per_batch = report.get("dense_rows_per_batch")
                table.append(
                    [
                        f"{way} ({loop})",
                        f"{report['ok']}/{report['requests']}",
                        report["requests_per_s"],
                        report["latency"]["p50_ms"],
                        report["latency"]["p99_ms"],
                        report["dispatches"],
                        "" if per_batch is None else f"{per_batch:.1f}",
                    ]
                )
    harness.print_table(
        ("example service (load.py)", "ok", "requests/s", "p50 ms", "p99 ms", "dispatches",
         "dense rows/dispatch"),
        table,
        ("", ",.0f", ".1f", ".1f", "", ""),
    )  # fmt: skip


# -- targets and output ------------------------------------------------------------------------


def targets_of(rows: dict[str, Any], http: dict[str, Any]) -> list[Target]:
    """Issue 41's targets, per loop."""
    targets: list[Target] = []
    for loop, row in rows.items():
        for n in CLIENTS:
            load = row["clients"][str(n)]
            targets.append(
                Target(
                    f"{_clients(str(n))}: batched requests/s / per-request's, median of pairs "
                    f"({loop})",
                    load["ratio"]["median"],
                    1.0,
                    at_most=False,
                )
            )
            if n > 1:
                targets.append(
                    Target(
                        f"{_clients(str(n))}: batched p99 / per-request p99 ({loop})",
                        load["batched"]["p99_us"] / load["per-request"]["p99_us"],
                        1.0,
                    )
                )
        top = row["clients"][str(FLOOR_CLIENTS)]
        targets += [
            Target(
                f"64 clients: batched requests/s / dispatch floor's, median of pairs ({loop})",
                top["dispatch_floor_ratio"]["median"],
                0.8,
                at_most=False,
            ),
            Target(
                f"mixed: batched requests/s / floor's, median of pairs ({loop})",
                row["mixed"]["ratio"]["batched"]["median"],
                0.95,
                at_most=False,
            ),
        ]
    for loop, runs in http.items():
        batched = harness.median(r["requests_per_s"] for r in runs["batched"])
        alone = harness.median(r["requests_per_s"] for r in runs["per-request"])
        targets.append(
            Target(
                f"HTTP: batched requests/s / per-request's, medians of runs ({loop})",
                batched / alone,
                0.95,
                at_most=False,
            )
        )
    return targets


COLUMNS = ("requests/s", "p50 us", "p99 us", "max us", "rows/dispatch")
FORMATS = (",.0f", ".1f", ".1f", ".1f", ".1f")
KEYS = ("requests_per_s", "p50_us", "p99_us", "max_us", "rows_per_dispatch")


def _clients(n: str) -> str:
    return "1 client" if n == "1" else f"{n} clients"


def _cells(summary: dict[str, float]) -> list[object]:
    cells: list[object] = [summary[key] for key in KEYS]
    if cells[-1] != cells[-1]:  # nan: nothing dispatched (the floor)
        cells[-1] = ""
    return cells


def _ratio_cells(top: dict[str, float], bottom: dict[str, float], rps: dict[str, Any]) -> list[str]:
    spread = f"{rps['median']:.2f}x ({rps['low']:.2f} to {rps['high']:.2f})"
    latency = [f"{top[key] / bottom[key]:.2f}x" for key in KEYS[1:4]]
    return [spread, *latency, ""]


def print_results(rows: dict[str, Any], targets: list[Target]) -> None:
    """The tables: clients back to back, the mixed load, the targets."""
    closed: list[list[object]] = []
    for loop, row in rows.items():
        for n, load in row["clients"].items():
            for way in (*FLOORS, *WAYS) if "floor" in load else WAYS:
                closed.append([f"{_clients(n)}, {way} ({loop})", *_cells(load[way])])
            for top, bottom, key in RATIOS:
                if key in load:
                    closed.append(
                        [
                            f"{_clients(n)}, {top} / {bottom} ({loop})",
                            *_ratio_cells(load[top], load[bottom], load[key]),
                        ]
                    )
    harness.print_table(("clients back to back", *COLUMNS), closed, FORMATS)
    print()
    mixed: list[list[object]] = []
    for loop, row in rows.items():
        load = row["mixed"]
        for way in ("floor", *WAYS):
            mixed.append([f"{way} ({loop})", *_cells(load[way])])
        for way in WAYS:
            mixed.append(
                [
                    f"{way} / floor ({loop})",
                    *_ratio_cells(load[way], load["floor"], load["ratio"][way]),
                ]
            )
    harness.print_table(("mixed load", *COLUMNS), mixed, FORMATS)
    print()
    print_launches(rows)
    print()
    print_targets(targets)


def print_launches(rows: dict[str, Any]) -> None:
    """Why each batcher's batches launched in each load (warm-ups included), and their rows."""
    table: list[list[object]] = []
    for loop, row in rows.items():
        loads = [(_clients(n), load) for n, load in row["clients"].items()]
        for name, load in (*loads, ("mixed", row["mixed"])):
            for way, seen in load["batchers"].items():
                launched = seen["launched"]
                table.append(
                    [f"{name}, {way} ({loop})", *(launched[r] for r in REASONS),
                     seen["rows_per_batch"]]
                )  # fmt: skip
    harness.print_table(
        ("batches launched, by why", *REASONS, "rows/batch"),
        table,
        ("", "", "", "", "", ".1f"),
    )


def _restart_on_the_stand_in(complete: str) -> None:
    """Build the stand-in driver and run this script again with it as the driver library."""
    from tests.fake_driver import build, environment

    try:
        directory = build()
    except RuntimeError as exc:
        raise SystemExit(f"--backend stand-in needs the stand-in driver: {exc}") from None
    env = environment(directory, os.environ.get("ASYNCGRAPH_CORE", "python"), complete=complete)
    env[STAND_IN_ENV] = "1"
    raise SystemExit(subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode)


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument(
        "--backend",
        choices=("auto", "host", "cuda", "stand-in"),
        default="auto",
        help="the backend to measure (default auto: CUDA where there is a GPU, else the host; "
        "stand-in: the CUDA backend on the stand-in driver, answers unchecked)",
    )
    parser.add_argument(
        "--stand-in-complete",
        default="instant",
        help="with --backend stand-in: when its events complete, 'instant' or 'after:US' "
        "(default instant)",
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        help="run on this event loop only (default: asyncio, then uvloop where installed)",
    )
    parser.add_argument(
        "--features", type=int, default=1024, help="floats per row (default 1024: 4 KiB)"
    )
    parser.add_argument(
        "--rounds", type=int, default=100, help="requests per client in each load (default 100)"
    )
    parser.add_argument(
        "--pairs", type=int, default=5, help="loads of each way, in turns (default 5)"
    )
    parser.add_argument(
        "--burn-us", type=float, default=200.0, help="CPU per mixed-load request (default 200)"
    )
    parser.add_argument(
        "--max-size", type=int, default=64, help="the batchers' max_size (default 64)"
    )
    parser.add_argument(
        "--max-delay-us",
        type=float,
        default=500.0,
        help="the batchers' max_delay in µs (default 500)",
    )
    parser.add_argument(
        "--http-requests",
        type=int,
        default=2000,
        help="requests per run of the example service through HTTP (default 2000; 0: none)",
    )
    parser.add_argument(
        "--http-clients", type=int, default=8, help="load.py client processes (default 8)"
    )
    parser.add_argument(
        "--http-pairs", type=int, default=2, help="runs of the service each way (default 2)"
    )
    args = parser.parse_args()
    stand_in = args.backend == "stand-in"
    if stand_in and os.environ.get(STAND_IN_ENV) != "1":
        _restart_on_the_stand_in(args.stand_in_complete)
    device_option = "cuda" if stand_in else args.backend
    rounds, pairs = args.rounds, args.pairs
    http_requests, http_clients, http_pairs = args.http_requests, args.http_clients, args.http_pairs
    if harness.smoke():
        rounds, pairs = min(rounds, harness.SMOKE_REPS), 1
        http_requests, http_clients, http_pairs = min(http_requests, 20), 1, 1
    if stand_in:
        http_requests = 0  # load.py checks every answer: the stand-in computes none
    max_delay = args.max_delay_us * 1e-6
    # The library's debug and info events (backend opened, closed) would bury the tables.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    def on(loop: str) -> Coroutine[Any, Any, dict[str, dict[str, Any]]]:
        return rows_on(
            loop,
            device_option,
            features=args.features,
            rounds=rounds,
            pairs=pairs,
            burn_s=args.burn_us * 1e-6,
            max_size=args.max_size,
            max_delay=max_delay,
            checked=not stand_in,
        )

    t_start = time.perf_counter()
    loops: Sequence[str]
    if args.loop is not None:
        rows, loops = harness.run(on(args.loop), args.loop), (args.loop,)
    else:
        rows, loops = harness.run_on_loops(on)
    http: dict[str, Any] = {}
    if http_requests:
        requests, clients = http_requests, http_clients
        http = http_rows(loops, args.backend, requests=requests, clients=clients, pairs=http_pairs)
    first = next(iter(rows.values()))
    device = first["device"]
    if stand_in:
        device = f"stand-in driver ({os.environ.get('FAKE_CUDA_COMPLETE')} completion)"
    targets = targets_of(rows, http)

    print(f"device: {device} (backend {first['backend']})")
    if stand_in:
        print("the stand-in runs no dense layer: answers are not checked")
    print(
        f"{args.features} float32 per row ({args.features * 4 / 1024:g} KiB); {rounds} requests "
        f"per client per load, each way loaded {pairs} times in turns; batcher max_size "
        f"{args.max_size}, max_delay {args.max_delay_us:g} us; mixed load: {MIXED_CLIENTS} "
        f"clients, {args.burn_us:g} us of CPU per request"
    )
    timers = ", ".join(f"{row['timer_us']:.0f} us ({loop})" for loop, row in rows.items())
    print(f"the loop's timer: sleep(max_delay) returns after {timers}")
    print()
    print_results(rows, targets)
    if http:
        print()
        print(
            f"the example service through HTTP: load.py --requests {http_requests} --clients "
            f"{http_clients}, its dense endpoint batching and not, {http_pairs} runs each in turns"
        )
        print_http(http)
    print(f"\n{time.perf_counter() - t_start:.1f} s")
    harness.write_json(
        {
            **harness.environment(device),
            "backend": first["backend"],
            "settings": {
                "features": args.features,
                "rounds": rounds,
                "pairs": pairs,
                "burn_us": args.burn_us,
                "max_size": args.max_size,
                "max_delay_us": args.max_delay_us,
                "clients": list(CLIENTS),
                "mixed_clients": MIXED_CLIENTS,
                "http_requests": http_requests,
                "http_clients": http_clients,
                "http_pairs": http_pairs,
            },
            "loops": {
                loop: {key: row[key] for key in ("timer_us", "clients", "mixed")}
                for loop, row in rows.items()
            },
            "http": http,
            "targets": {t.label: {"measured": t.measured, "met": t.met} for t in targets},
        },
        args.json,
        script=__file__,
        device=device,
    )


if __name__ == "__main__":
    main()
