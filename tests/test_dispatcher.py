"""The dispatcher with a fake engine: the order it performs effects in, and how it resolves jobs.

The engine records every call it gets into one log, and the resolution of each job's
PendingDispatch is logged there too (``set_outcome`` is wrapped), so a test reads the exact
interleaving of engine calls and resolutions. Events an effect raises (a launch that fails, a
compile reported from within ``start_compile``) must come after the batch in progress.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest
import structlog
from structlog.testing import capture_logs

import asyncgraph as ag
from asyncgraph._args._bound_args import BoundCall
from asyncgraph._buffers._resident import ResidentStore, in_use, track, writer_of
from asyncgraph._front import _dispatcher
from asyncgraph._front._dispatcher import Dispatcher
from asyncgraph._front._engine_protocols import Engine
from asyncgraph._jobs._pending import PendingDispatch, set_outcome
from asyncgraph._jobs._scheduler import Job, JobState
from asyncgraph._runtime._exceptions import BackendClosedError, DeviceFaultError
from asyncgraph._runtime._telemetry import Telemetry

SOURCE = r'extern "C" __global__ void {name}(float* x) {{ }}'
K = ag.Kernel(SOURCE.format(name="k"), "k", host=lambda x: None)
K2 = ag.Kernel(SOURCE.format(name="k2"), "k2", host=lambda x: None)

Log = list[tuple[str, int]]
Hook = Callable[[Job], None]


def state(job: Job) -> JobState:
    """*job*'s state, read afresh (an event changed it since the last assertion)."""
    return job.state


class FakeEngine:
    """The engine methods the dispatcher calls; predicates and per-job hooks set by the test."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.uncompiled: set[ag.Kernel] = set()
        self.unstaged: set[Job] = set()
        self.blocked: set[Job] = set()
        self.on_compile: dict[ag.Kernel, Hook] = {}
        self.on_launch: dict[Job, Hook] = {}

    def needs_compile(self, job: Job) -> bool:
        return job.call.kernel in self.uncompiled

    def needs_staging(self, job: Job) -> bool:
        return job in self.unstaged

    def is_ready(self, job: Job) -> bool:
        return job not in self.blocked

    def start_compile(self, job: Job) -> None:
        self.log.append(("compile", job.id))
        hook = self.on_compile.pop(job.call.kernel, None)
        if hook is not None:
            hook(job)

    def stage(self, job: Job) -> None:
        self.log.append(("stage", job.id))

    def launch(self, job: Job) -> None:
        self.log.append(("launch", job.id))
        hook = self.on_launch.pop(job, None)
        if hook is not None:
            hook(job)

    def release(self, job: Job) -> None:
        self.log.append(("release", job.id))


class Harness:
    """A dispatcher on the running loop, its fake engine, and the shared log."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_in_flight: int) -> None:
        self.log: Log = []
        self.engine = FakeEngine(self.log)
        self.afters: list[Log] = []  # the log as each after() call found it
        self.discarded: list[Any] = []  # buffers the dispatcher closed
        self.telemetry = Telemetry(lambda: (0, 0))
        self.loop = loop
        self._ids = itertools.count(1)
        self.dispatcher = Dispatcher(
            engine=lambda _sink: cast(Engine[Any], self.engine),
            max_in_flight=max_in_flight,
            telemetry=self.telemetry,
            log=structlog.get_logger(),
            nvtx=None,
            dispatch_events=True,
            after=lambda _scheduler: self.afters.append(list(self.log)),
            discard=self.discarded.append,
        )
        self.dispatcher.bind(loop)

    def job(self, k: ag.Kernel = K) -> Job:
        """A job numbered and given its PendingDispatch, as ``Backend._enqueue_job`` does."""
        job = Job(BoundCall(k, [], (1, 1, 1), (1, 1, 1), 0), timing=False)
        job.id = next(self._ids)
        job.pending = PendingDispatch(self.loop, job.id, k.name)
        return job

    def add(self, *jobs: Job) -> None:
        for job in jobs:
            self.dispatcher.add(job)


@pytest.fixture
def make(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Harness]:
    """Makes the test's harness; each resolution is logged as ("resolve", id) into its log."""
    logs: list[Log] = []

    def resolve(
        pending: PendingDispatch,
        outcome: tuple[Any, ...] | BaseException,
        device_time: float | None,
    ) -> None:
        logs[0].append(("resolve", pending.dispatch_id))
        set_outcome(pending, outcome, device_time)

    monkeypatch.setattr(_dispatcher, "set_outcome", resolve)

    def factory(max_in_flight: int) -> Harness:
        harness = Harness(asyncio.get_running_loop(), max_in_flight)
        logs.append(harness.log)
        return harness

    return factory


async def test_effects_in_order_and_raised_events_queue_behind(
    make: Callable[[int], Harness],
) -> None:
    h = make(2)
    d, engine = h.dispatcher, h.engine
    engine.uncompiled = {K, K2}
    j1, j2, j3 = h.job(K), h.job(K), h.job(K2)
    h.add(j1, j2, j3)  # j1 starts K's compile, j2 waits for it, j3 waits for a slot
    assert h.log == [("compile", 1)]
    assert j3.state is JobState.QUEUED

    def fail(job: Job) -> None:
        raise RuntimeError("launch failed")

    def cached(job: Job) -> None:  # K2 is found in the cache: reported from start_compile
        engine.uncompiled.discard(K2)
        d.compiled(K2, None)

    engine.on_launch[j1] = fail
    engine.on_compile[K2] = cached
    engine.uncompiled.discard(K)
    d.compiled(K, None)  # the batch: [LAUNCH j1, LAUNCH j2]
    assert h.log == [
        ("compile", 1),
        ("launch", 1),  # raises: launch_failed's effects wait for the batch
        ("launch", 2),
        ("resolve", 1),
        ("compile", 3),  # j3 took j1's slot; its compile reports at once
        ("launch", 3),  # after the batch in which compiled() was reported
    ]
    assert isinstance(j1.pending.exception(), RuntimeError)
    assert (j1.state, j2.state, j3.state) == (JobState.DONE, JobState.LAUNCHED, JobState.LAUNCHED)
    assert h.telemetry.dispatches_failed == 1
    assert h.afters[-1] == h.log  # after() ran once the backlog was done too
    assert not d._running


async def test_resolve_with_results_counts_and_untracks(make: Callable[[int], Harness]) -> None:
    h = make(4)
    d = h.dispatcher
    freed: list[object] = []
    store = ResidentStore("test", freed.append)
    storage = np.zeros(4, np.float32)
    buffer = store.add(storage, (4,), np.dtype(np.float32))
    j = h.job()
    assert track(buffer, j, write=True) == []
    j.buffers.append(buffer)
    h.add(j)
    assert in_use(buffer)
    await buffer.aclose()  # closed while in use: freed when the job lets go of it
    assert freed == []

    result = np.arange(3)
    with capture_logs() as logs:
        d.collecting(j)
        assert j.state is JobState.COLLECTING
        d.done(j, (result,), 0.125)
    assert h.log == [("launch", 1), ("resolve", 1)]
    assert j.pending.done()
    assert j.pending.device_time == 0.125
    (out,) = await j.pending
    assert out is result
    assert not in_use(buffer)
    assert writer_of(buffer) is None
    assert freed == [storage]
    t = h.telemetry
    assert (t.dispatches_completed, t.dispatches_failed) == (1, 0)
    assert (t.device_time.count, t.completion_latency.count, t.queue_wait.count) == (1, 1, 1)
    assert t.submit_time.count == 1
    assert [(e["event"], e["dispatch_id"]) for e in logs] == [("dispatch.completed", 1)]


async def test_resolve_with_an_error_counts_a_failure(make: Callable[[int], Harness]) -> None:
    h = make(4)
    d = h.dispatcher
    j1, j2 = h.job(), h.job()
    h.add(j1, j2)
    fault = DeviceFaultError(700, "CUDA_ERROR_ILLEGAL_ADDRESS", "cuStreamSynchronize")
    with capture_logs() as logs:
        d.done(j1, fault, 1.0)
        d.done(j1, (), None)  # the completion racing the failure: nothing more
        d.done(j2, (), None)
    assert h.log == [("launch", 1), ("launch", 2), ("resolve", 1), ("resolve", 2)]
    with pytest.raises(DeviceFaultError) as info:
        await j1.pending
    assert info.value is fault
    assert await j2.pending == ()
    assert j2.pending.device_time is None
    t = h.telemetry
    assert (t.dispatches_completed, t.dispatches_failed) == (1, 1)
    assert t.device_time.count == 0  # a failure's device time is not recorded
    assert [e["event"] for e in logs] == ["dispatch.failed", "dispatch.completed"]


async def test_drop_queued_and_abandon_waiting_release_then_resolve(
    make: Callable[[int], Harness],
) -> None:
    h = make(3)
    d, engine = h.dispatcher, h.engine
    compiling, staging, launched, queued1, queued2 = h.job(K), *(h.job(K2) for _ in range(4))
    engine.uncompiled = {K}
    engine.unstaged = {staging}
    h.add(compiling, staging, launched, queued1, queued2)
    assert h.log == [("compile", 1), ("stage", 2), ("launch", 3)]

    def closed(job: Job) -> BaseException:
        return BackendClosedError(f"closed before #{job.id}")

    del h.log[:]
    d.drop_queued(closed)
    assert h.log == [("release", 4), ("resolve", 4), ("release", 5), ("resolve", 5)]
    del h.log[:]
    d.abandon_waiting(closed)
    assert h.log == [("release", 1), ("resolve", 1), ("release", 2), ("resolve", 2)]
    for job in (compiling, staging, queued1, queued2):
        assert isinstance(job.pending.exception(), BackendClosedError)
    assert launched.state is JobState.LAUNCHED
    assert not launched.pending.done()
    del h.log[:]
    engine.uncompiled.clear()
    d.compiled(K, None)  # the abandoned compile reports: nothing to do, after() not called
    d.staged(staging, None)
    assert h.log == []
    assert h.telemetry.dispatches_failed == 4


async def test_base_exception_from_launch_propagates_after_failing_the_job(
    make: Callable[[int], Harness],
) -> None:
    h = make(1)
    d, engine = h.dispatcher, h.engine
    j1, j2, j3 = h.job(), h.job(), h.job()
    interrupt = KeyboardInterrupt()

    def interrupted(job: Job) -> None:
        raise interrupt

    engine.on_launch[j1] = interrupted
    with pytest.raises(KeyboardInterrupt):
        d.add(j1)
    assert h.log == [("launch", 1), ("resolve", 1)]
    assert j1.state is JobState.DONE
    assert j1.pending.exception() is interrupt
    assert h.telemetry.dispatches_failed == 1
    assert not d._running
    assert h.afters == [h.log]

    h.add(j2, j3)  # still usable: j2 launches, j3 waits for the slot
    d.done(j2, (), None)
    d.done(j3, (), None)
    assert h.log[2:] == [("launch", 2), ("resolve", 2), ("launch", 3), ("resolve", 3)]
    assert d.scheduler.is_idle()


async def test_base_exception_from_launch_admits_the_next_job(
    make: Callable[[int], Harness],
) -> None:
    h = make(1)
    d, engine = h.dispatcher, h.engine
    j1, j2 = h.job(), h.job()
    engine.blocked = {j1}
    h.add(j1, j2)  # j1 parked holds the slot, j2 queued
    assert h.log == []

    def interrupted(job: Job) -> None:
        raise asyncio.CancelledError

    engine.on_launch[j1] = interrupted
    engine.blocked.clear()
    with pytest.raises(asyncio.CancelledError):
        d.poke()
    # The interrupted batch's backlog (j1's failure, j2 admitted to its slot) still ran.
    assert h.log == [("launch", 1), ("resolve", 1), ("launch", 2)]
    assert isinstance(j1.pending.exception(), asyncio.CancelledError)
    assert j2.state is JobState.LAUNCHED


async def test_base_exception_from_launch_keeps_the_rest_of_the_batch(
    make: Callable[[int], Harness],
) -> None:
    h = make(4)
    d, engine = h.dispatcher, h.engine
    engine.uncompiled = {K}
    j1, j2 = h.job(K), h.job(K)
    h.add(j1, j2)

    def interrupted(job: Job) -> None:
        raise KeyboardInterrupt

    engine.on_launch[j1] = interrupted
    engine.uncompiled.clear()
    with pytest.raises(KeyboardInterrupt):
        d.compiled(K, None)  # the batch: [LAUNCH j1, LAUNCH j2]
    assert j2.state is JobState.LAUNCHED  # as far as the scheduler knows
    assert ("launch", 2) in h.log  # but the engine never got it: nothing completes it


async def test_parked_jobs_launch_after_a_launch_in_the_same_run(
    make: Callable[[int], Harness],
) -> None:
    h = make(4)
    d, engine = h.dispatcher, h.engine
    engine.uncompiled = {K}
    j1, j2 = h.job(K), h.job(K2)
    engine.blocked = {j2}  # j2 uses a buffer j1 writes: ready once j1 is on the device
    h.add(j1, j2)
    assert j2.state is JobState.PARKED
    engine.on_launch[j1] = lambda job: engine.blocked.clear()  # no poke() reported
    engine.uncompiled.clear()
    del h.afters[:]
    d.compiled(K, None)
    assert h.log == [("compile", 1), ("launch", 1), ("launch", 2)]
    assert state(j2) is JobState.LAUNCHED
    assert h.afters == [h.log]  # one run, one after()


async def test_parked_jobs_poked_after_a_launch_even_with_a_backlog(
    make: Callable[[int], Harness],
) -> None:
    h = make(4)
    d, engine = h.dispatcher, h.engine
    engine.uncompiled = {K}
    j1, j2, j3 = h.job(K), h.job(K), h.job(K2)
    engine.blocked = {j3}  # j3 is ordered after j2
    h.add(j1, j2, j3)

    def fail(job: Job) -> None:
        raise RuntimeError("launch failed")

    engine.on_launch[j1] = fail  # puts launch_failed's effects in the backlog
    engine.on_launch[j2] = lambda job: engine.blocked.clear()
    engine.uncompiled.clear()
    d.compiled(K, None)  # the batch: [LAUNCH j1, LAUNCH j2]
    assert ("launch", 3) in h.log  # as without j1's failure


async def test_after_runs_after_each_batch(make: Callable[[int], Harness]) -> None:
    h = make(1)
    d = h.dispatcher
    j1, j2 = h.job(), h.job()
    h.add(j1)
    assert h.afters == [[("launch", 1)]]  # it sees the effects already performed
    h.add(j2)  # queued: no effects, no batch
    d.poke()  # nothing parked
    d.collecting(j1)
    assert len(h.afters) == 1
    d.done(j1, (), None)
    assert h.afters[-1] == [("launch", 1), ("resolve", 1), ("launch", 2)]
    assert len(h.afters) == 2
    d.done(j1, (), None)  # already done: no effects
    assert len(h.afters) == 2
    d.done(j2, (), None)
    assert len(h.afters) == 3
    assert j2.pending.done()
    assert d.loop is asyncio.get_running_loop()
