"""Load for the example service: concurrent requests, every answer checked, health probed.

    python examples/server/load.py --url http://127.0.0.1:8000 --requests 500 [--clients 4]

Sends *requests* requests to ``/v1/dense`` and ``/v1/saxpy`` (half each, fresh random inputs)
all at once, from ``--clients`` processes (one by default), and checks every answer against
numpy. Meanwhile a separate process asks ``/health`` every 10 ms, so the health latencies
measure the server, not the client's own loop. Prints a JSON report: requests/s, latency
percentiles, health-check latency under load, the backend's own dispatch latency, the
dispatches it made, and the rows per dispatch of the dense endpoint's batcher (``null`` with
``EXAMPLE_BATCH=0``: one dispatch per request), to compare the two.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import numpy as np

Array = np.ndarray[Any, Any]


def _percentiles(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {"count": 0}
    ms = np.asarray(seconds) * 1e3
    return {
        "count": len(seconds),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


class HealthProbe:
    """Asks ``/health`` every *interval* seconds from a child process, timing each answer.

    A process of its own, so the client's own work (500 requests on one loop, and the GIL)
    does not count as the server's latency.
    """

    def __init__(self, url: str, interval: float = 0.01) -> None:
        self._child = subprocess.Popen(
            [sys.executable, __file__, "--probe", "--url", url, "--interval", str(interval)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> tuple[list[float], list[str], list[float]]:
        """Stop probing; returns the latencies in seconds, the failures seen, and when each
        answer came (``time.time()``)."""
        output, _ = self._child.communicate("stop\n", timeout=60)
        result = json.loads(output)
        return result["latencies"], result["failures"], result["answered"]


def _probe(url: str, interval: float) -> None:
    """The probe process: ask /health until a line arrives on stdin, then print the timings."""
    stop = threading.Event()

    def wait_for_stop() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    latencies: list[float] = []
    answered: list[float] = []
    failures: list[str] = []
    with httpx.Client(base_url=url, timeout=30.0) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                response = client.get("/health")
                if response.status_code != 200 or response.json()["status"] != "ok":
                    failures.append(f"{response.status_code} {response.text[:200]}")
            except httpx.HTTPError as exc:
                failures.append(repr(exc))
            latencies.append(time.perf_counter() - t0)
            answered.append(time.time())
            stop.wait(interval)
    print(json.dumps({"latencies": latencies, "failures": failures[:5], "answered": answered}))


class Tally:
    """What the requests of one client process came to."""

    def __init__(self) -> None:
        self.ok = 0
        self.transport_errors = 0  # no answer at all: refused, reset, timed out
        self.errors: list[str] = []
        self.latencies: list[float] = []  # seconds, of the requests that got an answer


async def request_and_check(
    client: httpx.AsyncClient, tally: Tally, path: str, body: dict[str, Any], want: Array
) -> None:
    """POST *body* to *path* and count the answer in *tally*: right, wrong or none at all."""
    t0 = time.perf_counter()
    try:
        response = await client.post(path, json=body)
    except httpx.TransportError as exc:
        # Counted, not raised: one dropped connection must not lose the whole run's report.
        tally.transport_errors += 1
        tally.errors.append(f"{path}: no answer: {exc!r}")
        return
    tally.latencies.append(time.perf_counter() - t0)
    if response.status_code != 200:
        tally.errors.append(f"{path}: {response.status_code} {response.text[:200]}")
        return
    got = np.asarray(next(iter(response.json().values())), np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-4):
        tally.errors.append(f"{path}: answer differs from numpy")
        return
    tally.ok += 1


async def _send(url: str, requests: int, seed: int | None, start_at: float) -> dict[str, Any]:
    """Send *requests* requests at once from this process (at wall time *start_at*)."""
    rng = np.random.default_rng(seed)
    limits = httpx.Limits(max_connections=requests, max_keepalive_connections=requests)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120.0) as client:
        model = (await client.get("/v1/model")).json()
        w = np.asarray(model["w"], np.float32)
        b = np.asarray(model["b"], np.float32)

        jobs: list[tuple[str, dict[str, Any], Array]] = []
        for i in range(requests):
            if i % 2 == 0:
                x = rng.standard_normal((int(rng.integers(1, 5)), w.shape[0])).astype(np.float32)
                want = np.maximum(x.astype(np.float64) @ w + b, 0.0)
                jobs.append(("/v1/dense", {"x": x.tolist()}, want))
            else:
                n = int(rng.integers(1, 1000))
                x, y = rng.standard_normal((2, n)).astype(np.float32)
                a = float(rng.standard_normal())
                want = a * x.astype(np.float64) + y
                jobs.append(("/v1/saxpy", {"a": a, "x": x.tolist(), "y": y.tolist()}, want))

        tally = Tally()
        await asyncio.sleep(max(0.0, start_at - time.time()))
        t_start = time.time()
        await asyncio.gather(*(request_and_check(client, tally, *job) for job in jobs))
        t_end = time.time()
    return {
        "ok": tally.ok,
        "transport_errors": tally.transport_errors,
        "errors": tally.errors[:5],
        "latencies": tally.latencies,
        "t_start": t_start,
        "t_end": t_end,
    }


async def _send_from_processes(
    url: str, requests: int, clients: int, seed: int | None
) -> list[dict[str, Any]]:
    start_at = time.time() + 2.0  # every client has built its requests by then
    shares = [requests // clients + (k < requests % clients) for k in range(clients)]
    children = []
    for k, share in enumerate(shares):
        command = ["--worker", "--url", url, "--requests", str(share), "--start-at", repr(start_at)]
        command += ["--seed", str(-1 if seed is None else seed + k)]
        children.append(
            await asyncio.create_subprocess_exec(
                sys.executable, __file__, *command, stdout=subprocess.PIPE
            )
        )
    outputs = [await child.communicate() for child in children]
    return [json.loads(out) for out, _ in outputs]


async def run_load(
    url: str, requests: int = 500, seed: int | None = None, clients: int = 1
) -> dict[str, Any]:
    """Send *requests* concurrent requests to the service at *url* and check every answer.

    Args:
        url: the service.
        requests: how many, all at once.
        seed: for the random inputs (``None``: fresh ones).
        clients: processes to send them from (the requests split among them, starting
            together); one process of httpx tops out at a few hundred requests per second.

    Returns:
        The report: ``requests``, ``ok``, ``wrong`` (requests without a right answer: a wrong
        one, an error status, or none at all, the first few described in ``errors``),
        ``transport_errors`` (requests that got no answer), ``seconds``, ``requests_per_s``,
        ``latency`` and ``health`` (count, p50, p99, max in ms), ``health_during_load`` (the
        health answers that came while the requests were in flight), the backend's name and its own
        ``dispatch_latency_ms`` (p50, p99, from ``dispatch()`` to completion), the loop's turn
        while the requests were in flight (``loop_turn_ms``: count, p50, p99; how long a
        callback made ready waited to run, the floor under any completion), the dispatches
        the backend made meanwhile, and ``dense_rows_per_batch`` (rows per dispatch of the
        dense endpoint's batcher; ``None`` when the service runs with ``EXAMPLE_BATCH=0``).
    """
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        info = (await client.get("/health")).json()
        probe = HealthProbe(url)
        try:
            if clients == 1:
                parts = [await _send(url, requests, seed, time.time() + 0.5)]
            else:
                parts = await _send_from_processes(url, requests, clients, seed)
        finally:
            health, failures, answered = await asyncio.to_thread(probe.stop)
        start, end = min(p["t_start"] for p in parts), max(p["t_end"] for p in parts)
        after = (await client.get("/health", params={"since": start, "until": end})).json()
    seconds = end - start
    ok = sum(p["ok"] for p in parts)
    return {
        "backend": info["backend"],
        "requests": requests,
        "clients": clients,
        "ok": ok,
        "wrong": requests - ok,
        "transport_errors": sum(p["transport_errors"] for p in parts),
        "errors": [e for p in parts for e in p["errors"]][:5],
        "seconds": seconds,
        "requests_per_s": requests / seconds,
        "latency": _percentiles([t for p in parts for t in p["latencies"]]),
        "health": _percentiles(health),
        "health_failures": failures,
        "health_during_load": sum(1 for t in answered if start <= t <= end),
        "dispatch_latency_ms": after["dispatch_latency_ms"],
        "loop_turn_ms": after["loop_turn_ms"],
        "dispatches": after["dispatches"] - info["dispatches"],
        "dense_rows_per_batch": _per_batch(info, after),
    }


def _per_batch(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    """Rows per dispatch of the dense endpoint's batcher meanwhile (``None``: not batching)."""
    if after.get("dense_batches") is None:
        return None
    batches = after["dense_batches"] - before["dense_batches"]
    rows = after["dense_batched_rows"] - before["dense_batched_rows"]
    return rows / batches if batches else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--clients", type=int, default=1, help="processes sending the requests")
    # The parts run in child processes:
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--interval", type=float, default=0.01, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        _probe(args.url, args.interval)
    elif args.worker:
        seed = None if args.seed < 0 else args.seed
        print(json.dumps(asyncio.run(_send(args.url, args.requests, seed, args.start_at))))
    else:
        report = asyncio.run(run_load(args.url, args.requests, clients=args.clients))
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
