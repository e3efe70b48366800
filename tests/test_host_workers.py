"""The host backend's worker threads: BackendOptions.host_workers, not streams."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import structlog

import asyncgraph as ag

from .kernels import Recorder, probe_kernel
from .polling import until


def _host_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("asyncgraph-host")}


async def _peak(backend: ag.Backend, workers: int, dispatches: int = 8) -> int:
    """Run *dispatches* blocking host functions at once; how many ran concurrently.

    Once all of them were handed to the worker pool (which starts its threads as it is handed
    work) and *workers* of them run, the pool has all the threads it will have: there are
    *workers* of them, so no more can run before the functions are released.
    """
    before = _host_threads()
    rec = Recorder()
    rec.release.clear()
    kernel = probe_kernel(rec)
    x = np.ones(4, np.float32)
    pending = [
        backend.dispatch(kernel, x, ag.Out(4, np.float32), np.int32(4), grid=1, block=4)
        for _ in range(dispatches)
    ]
    await until(
        lambda: backend.telemetry.snapshot().in_flight == dispatches and rec.running == workers,
        f"all {dispatches} dispatches handed to the workers and {workers} of them running",
    )
    assert len(_host_threads() - before) == workers
    rec.release.set()
    for p in pending:
        (out,) = await p
        np.testing.assert_array_equal(out, 2 * x)
    return rec.peak


async def test_host_workers_sets_the_threads_and_streams_does_not() -> None:
    async with ag.open_backend("host", host_workers=3, streams=1) as backend:
        assert await _peak(backend, 3) == 3
    async with ag.open_backend("host", host_workers=1, streams=8) as backend:
        assert await _peak(backend, 1) == 1


@pytest.mark.parametrize(("cpus", "workers"), [(3, 3), (None, 1)])
async def test_the_default_is_one_worker_per_cpu(
    monkeypatch: pytest.MonkeyPatch, cpus: int | None, workers: int
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    with structlog.testing.capture_logs() as logs:
        async with ag.open_backend("host") as backend:
            assert await _peak(backend, workers) == workers
    (opened,) = [e for e in logs if e["event"] == "backend.opened"]
    # Opening is routine, not news for a service's log: debug, like the CUDA backend's.
    assert opened == {
        "event": "backend.opened",
        "device": "host",
        "kind": "host",
        "workers": workers,
        "log_level": "debug",
    }


async def test_the_workers_end_with_the_close() -> None:
    async with ag.open_backend("host", host_workers=2) as backend:
        assert await _peak(backend, 2) == 2
        threads = _host_threads()
    assert threads
    assert not any(thread.is_alive() for thread in threads)


# A host function that sleeps long on a backend never closed; the child returns from its
# loop once the function runs, and exits. The host workers were ThreadPoolExecutor threads,
# which Python joins before atexit hooks run: the exit waited for the sleep, and by then
# nothing was in flight to report.
_HUNG_CHILD = """
import asyncio, sys, threading, time
import numpy as np
import asyncgraph as ag

started = threading.Event()

def sleeps(x, out):
    started.set()
    time.sleep(120)

KERNEL = ag.Kernel(
    'extern "C" __global__ void sleeps(const float* x, float* out) {}', "sleeps", host=sleeps
)
KEPT = []

async def main():
    backend = ag.open_backend("host", host_workers=1)
    backend.dispatch(KERNEL, np.ones(4, np.float32), ag.Out(4, np.float32), grid=1, block=4)
    await asyncio.to_thread(started.wait)
    if sys.argv[1] == "kept":
        KEPT.append(backend)  # still referenced when the interpreter shuts down

asyncio.run(main())
print("returned", flush=True)
"""


@pytest.mark.parametrize("kept", [False, True], ids=["dropped", "kept"])
def test_a_host_function_that_never_returns_does_not_hold_the_process_exit(kept: bool) -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-W", "ignore::ResourceWarning", "-c", _HUNG_CHILD,
             "kept" if kept else "dropped"],
            capture_output=True,
            text=True,
            timeout=60,  # the host function sleeps 120 s
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the process was still alive 60 s after its work was done")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "returned" in done.stdout
    # Reported as dispatch.md promises: when the backend is collected, or else at the exit.
    events = ("backend.dropped_in_flight", "backend.exit_in_flight")
    assert any(event in done.stdout for event in events), done.stdout[-3000:]
