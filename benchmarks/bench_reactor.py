"""The completion reactor's pacing under a serving load, on the CPU against the stand-in driver.

The load of ``bench_serve_torch.py``'s ``wait`` way without a GPU: clients (64) each burn CPU
(200 µs, the request's own work), then more (130 µs, enqueueing the model), record an event on
one stream and await it through the reactor, as ``backend.wait(stream)`` does; the event
completes after emulated device time (60 µs, one request after another on the device, by a
thread outside Python: the stand-in's ``fake_complete_after``). A first burst warms up, then
the timed one runs, as in ``bench_serve_torch.py``: what the reactor learned from the end of one
burst meets the start of the next. A heartbeat task sleeps 1 ms and records how late it wakes.

Per loop (asyncio, uvloop) and dispatch core: requests/s, the heartbeat's stall p50/p99/max,
and the completions each poll delivered (each wakes one task): mean, p99, max, and the first
polls of the timed burst. The reactor wakes as many as fit in its iteration budget (2 ms) by
what woken tasks cost; here about 350 µs each, so about 5 a poll. On asyncio a sleeping task
wakes two loop iterations after its timer is due (the timer's callback runs at the end of one,
the task in the next), so its stall is about 2.5 iterations; on uvloop about 1.5.

The script starts itself again with the stand-in as the driver library (``tests/fake_driver``).

    python benchmarks/bench_reactor.py [--clients N] [--requests N] [--json [PATH]]
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks import harness

DEVICE = "stand-in driver"
STAND_IN_ENV = "ASYNCGRAPH_BENCH_STAND_IN"


def _restart_on_the_stand_in() -> None:
    """Build the stand-in and run this script again with it as the driver library."""
    from tests.fake_driver import build, environment

    try:
        directory = build()
    except RuntimeError as exc:
        raise SystemExit(f"bench_reactor needs the stand-in driver: {exc}") from None
    env = environment(directory, os.environ.get("ASYNCGRAPH_CORE", ""), complete="manual")
    env[STAND_IN_ENV] = "1"
    raise SystemExit(subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode)


def burn(seconds: float) -> None:
    """CPU work holding the GIL, as a request's own work and PyTorch's enqueueing do."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Device:
    """One stream of emulated work: each recorded event completes *work* seconds after the
    later of its record and the previous event's completion."""

    def __init__(self, work: float, idle: list[Any]) -> None:
        from cuda.bindings import driver as drv

        self._drv = drv
        self._lib = lib = ctypes.CDLL("libcuda.so.1")
        lib.fake_event_new.restype = ctypes.c_void_p
        lib.fake_complete_after.argtypes = [ctypes.c_void_p, ctypes.c_longlong]
        self.idle = idle  # events the reactor gave back, to record again
        self._work = work
        self._free_at = 0.0

    def record(self) -> Any:
        drv = self._drv
        event = self.idle.pop() if self.idle else drv.CUevent(self._lib.fake_event_new())
        drv.cuEventRecord(event, drv.CUstream(0))
        now = time.perf_counter()
        self._free_at = done = max(now, self._free_at) + self._work
        self._lib.fake_complete_after(int(event), int((done - now) * 1e9))
        return event


async def serve(core: Any, settings: dict[str, float]) -> dict[str, Any]:
    """A warm-up burst, then the timed one, on the running loop; the figures of the second."""
    from cuda.bindings import driver as drv

    from asyncgraph._cuda.completion._reactor import Reactor
    from asyncgraph._cuda.core import _waiters
    from asyncgraph._cuda.driver._events import EventPool

    _waiters.core = core  # type: ignore[attr-defined]  # the waiters' core, for this row
    loop = asyncio.get_running_loop()
    pool = EventPool(0)
    device = Device(settings["device_us"] * 1e-6, pool.idle)
    watches = core.Watches(1, pool.idle, 0.0)
    reactor = Reactor(loop, drv.CUcontext(), watches, pool, 200e-6, lambda _error: None)
    burn_s, enqueue_s = settings["burn_us"] * 1e-6, settings["enqueue_us"] * 1e-6
    polls: list[int] = []  # per completion: the poll that delivered it

    def wait() -> asyncio.Future[None]:
        future = loop.create_future()

        def done(_error: object) -> None:
            polls.append(reactor.polls)
            if not future.done():
                future.set_result(None)

        reactor.watch(0, device.record(), done)
        return future

    async def client(requests: int) -> None:
        for _ in range(requests):
            burn(burn_s)
            burn(enqueue_s)
            await wait()

    clients, requests = int(settings["clients"]), int(settings["requests"])
    try:
        await asyncio.gather(*(client(requests) for _ in range(clients)))  # warm-up
        polls.clear()
        async with harness.Heartbeat(0.001) as heartbeat:
            t0 = time.perf_counter()
            await asyncio.gather(*(client(requests) for _ in range(clients)))
            elapsed = time.perf_counter() - t0
    finally:
        for joinable in reactor.close():
            await loop.run_in_executor(None, joinable.join)
    per_poll = np.unique(np.array(polls), return_counts=True)[1]
    stalls = np.array(heartbeat.stalls) * 1e3
    return {
        "requests_per_s": clients * requests / elapsed,
        "stall_p50_ms": harness.percentile(stalls, 50),
        "stall_p99_ms": harness.percentile(stalls, 99),
        "stall_max_ms": float(stalls.max()),
        "per_poll_mean": float(per_poll.mean()),
        "per_poll_p99": harness.percentile(per_poll, 99),
        "per_poll_max": int(per_poll.max()),
        "first_polls": [int(n) for n in per_poll[:6]],
    }


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients (default 64)")
    parser.add_argument("--requests", type=int, default=40, help="requests each (default 40)")
    parser.add_argument("--burn-us", type=float, default=200.0, help="CPU per request (200)")
    parser.add_argument("--enqueue-us", type=float, default=130.0, help="CPU to enqueue (130)")
    parser.add_argument("--device-us", type=float, default=60.0, help="device time (60)")
    args = parser.parse_args()
    if os.environ.get(STAND_IN_ENV) != "1":
        _restart_on_the_stand_in()
    from asyncgraph._cuda.core import _core_python as _core_py

    cores: dict[str, Any] = {"python": _core_py}
    try:
        from asyncgraph._cuda.core import _core_compiled as _core  # type: ignore[attr-defined]  # built in place
    except ImportError as exc:
        print(f"the compiled core is not built ({exc}): its rows are left out")
    else:
        cores = {"compiled": _core, **cores}
    settings = {
        "clients": args.clients,
        "requests": 2 if harness.smoke() else args.requests,
        "burn_us": args.burn_us,
        "enqueue_us": args.enqueue_us,
        "device_us": args.device_us,
    }
    if harness.smoke():
        settings["clients"] = min(args.clients, 4)
    rows: dict[str, dict[str, Any]] = {}
    for loop in harness.loop_factories():
        for name, core in cores.items():
            rows[f"{loop} {name}"] = harness.run(serve(core, settings), loop)
    if "uvloop" not in harness.loop_factories():
        print(harness.UVLOOP_MISSING)
    print(
        f"{DEVICE}: {settings['clients']:g} clients x {settings['requests']:g} requests, "
        f"{args.burn_us:g} + {args.enqueue_us:g} us of CPU and {args.device_us:g} us of device "
        "each\n"
    )
    harness.print_table(
        ("loop, core", "requests/s", "stall p50 ms", "p99 ms", "max ms", "per poll", "p99", "max",
         "first polls"),
        [
            (label, r["requests_per_s"], r["stall_p50_ms"], r["stall_p99_ms"], r["stall_max_ms"],
             r["per_poll_mean"], r["per_poll_p99"], r["per_poll_max"],
             " ".join(map(str, r["first_polls"])))
            for label, r in rows.items()
        ],
        (",.0f", ".2f", ".2f", ".2f", ".2f", ".0f", "d", ""),
    )  # fmt: skip
    harness.write_json(
        {**harness.environment(DEVICE), "settings": settings, "rows": rows},
        args.json,
        script=__file__,
        device=DEVICE,
    )


if __name__ == "__main__":
    main()
