"""Load for the example service: concurrent requests, every answer checked, health probed.

    python examples/server/load.py --url http://127.0.0.1:8000 --requests 500

Sends *requests* requests to ``/v1/dense`` and ``/v1/saxpy`` (half each, fresh random inputs) all
at once, checks every answer against numpy, and meanwhile asks ``/health`` every 10 ms from a
separate thread, so the health latencies measure the server, not this client's own loop.
Prints a JSON report: requests/s, latency percentiles, health-check latency under load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


class HealthProbe(threading.Thread):
    """Asks ``/health`` every *interval* seconds until stopped, timing each answer."""

    def __init__(self, url: str, interval: float = 0.01) -> None:
        super().__init__(name="health-probe", daemon=True)
        self.url = url
        self.interval = interval
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30.0) as client:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    response = client.get("/health")
                    if response.status_code != 200 or response.json()["status"] != "ok":
                        self.failures.append(f"{response.status_code} {response.text[:200]}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.latencies.append(time.perf_counter() - t0)
                self.stop.wait(self.interval)


async def run_load(url: str, requests: int = 500, seed: int | None = None) -> dict[str, Any]:
    """Send *requests* concurrent requests to the service at *url* and check every answer.

    Returns:
        The report: ``requests``, ``ok``, ``wrong`` (answers that differ from numpy, with the
        first few described in ``errors``), ``seconds``, ``requests_per_s``, ``latency`` and
        ``health`` (count, p50, p99, max in ms) and the backend's name.
    """
    rng = np.random.default_rng(seed)
    limits = httpx.Limits(max_connections=requests, max_keepalive_connections=requests)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120.0) as client:
        info = (await client.get("/health")).json()
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
                n = int(rng.integers(1, 2000))
                x, y = rng.standard_normal((2, n)).astype(np.float32)
                a = float(rng.standard_normal())
                want = a * x.astype(np.float64) + y
                jobs.append(("/v1/saxpy", {"a": a, "x": x.tolist(), "y": y.tolist()}, want))

        latencies: list[float] = []
        errors: list[str] = []

        async def one(path: str, body: dict[str, Any], want: Array) -> bool:
            t0 = time.perf_counter()
            response = await client.post(path, json=body)
            latencies.append(time.perf_counter() - t0)
            if response.status_code != 200:
                errors.append(f"{path}: {response.status_code} {response.text[:200]}")
                return False
            got = np.asarray(next(iter(response.json().values())), np.float64)
            if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                errors.append(f"{path}: answer differs from numpy")
                return False
            return True

        probe = HealthProbe(url)
        probe.start()
        t0 = time.perf_counter()
        try:
            outcomes = await asyncio.gather(*(one(*job) for job in jobs))
        finally:
            seconds = time.perf_counter() - t0
            probe.stop.set()
            await asyncio.to_thread(probe.join)
    ok = sum(outcomes)
    return {
        "backend": info["backend"],
        "requests": requests,
        "ok": ok,
        "wrong": requests - ok,
        "errors": errors[:5],
        "seconds": seconds,
        "requests_per_s": requests / seconds,
        "latency": _percentiles(latencies),
        "health": _percentiles(probe.latencies),
        "health_failures": probe.failures[:5],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run_load(args.url, args.requests)), indent=2))


if __name__ == "__main__":
    main()
