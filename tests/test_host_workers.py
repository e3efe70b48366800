"""The host backend's worker threads: BackendOptions.host_workers, not streams."""

from __future__ import annotations

import os
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
