"""The scheduler's state machine alone: each event's transition, with a fake runner.

No engine, no loop: the scheduler only records events and returns effects, so every test asserts
the exact effects (in order) and the states and predicates they leave. The dispatcher that
performs the effects is covered in test_dispatcher.py.
"""

from __future__ import annotations

import itertools

import pytest

import asyncgraph as ag
from asyncgraph._args._bound_args import BoundCall
from asyncgraph._jobs._scheduler import Job, JobState, Scheduler, Step
from asyncgraph._runtime._exceptions import BackendClosedError, CompileError, DeviceFaultError

SOURCE = r'extern "C" __global__ void {name}(float* x) {{ }}'


def kernel(name: str) -> ag.Kernel:
    """A kernel the scheduler only keys compiles by (its host function never runs)."""
    return ag.Kernel(SOURCE.format(name=name), name, host=lambda x: None)


K = kernel("k")
K2 = kernel("k2")


def state(job: Job) -> JobState:
    """*job*'s state, read afresh (an event changed it since the last assertion)."""
    return job.state


class FakeRunner:
    """The engine's predicates, set by the test; every question asked is recorded."""

    def __init__(self) -> None:
        self.uncompiled: set[ag.Kernel] = set()  # kernels that need compiling
        self.unstaged: set[Job] = set()  # jobs whose inputs need staging
        self.blocked: set[Job] = set()  # jobs whose dependencies are not far enough along
        self.asked: list[tuple[str, int]] = []

    def needs_compile(self, job: Job) -> bool:
        self.asked.append(("needs_compile", job.id))
        return job.call.kernel in self.uncompiled

    def needs_staging(self, job: Job) -> bool:
        self.asked.append(("needs_staging", job.id))
        return job in self.unstaged

    def is_ready(self, job: Job) -> bool:
        self.asked.append(("is_ready", job.id))
        return job not in self.blocked

    def scheduler(self, max_in_flight: int) -> Scheduler:
        """A scheduler asking these predicates (as the dispatcher hands it the engine's)."""
        return Scheduler(
            max_in_flight,
            needs_compile=self.needs_compile,
            needs_staging=self.needs_staging,
            is_ready=self.is_ready,
        )


class Jobs:
    """Numbered jobs, as ``Backend._enqueue_job`` numbers them (the scheduler keys by id)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def __call__(self, k: ag.Kernel = K) -> Job:
        call = BoundCall(k, [], (1, 1, 1), (1, 1, 1), 0)
        job = Job(call, timing=False)
        job.id = next(self._ids)
        return job


@pytest.fixture
def runner() -> FakeRunner:
    return FakeRunner()


@pytest.fixture
def new() -> Jobs:
    return Jobs()


def failing(job: Job) -> BaseException:
    """An error factory: one error per job, naming it."""
    return CompileError(job.call.kernel.name, f"failed for #{job.id}")


def closed(job: Job) -> BaseException:
    return BackendClosedError(f"closed before #{job.id} started")


def test_add_with_room_launches(runner: FakeRunner, new: Jobs) -> None:
    s = runner.scheduler(2)
    assert s.is_idle()
    j1 = new()
    assert s.add(j1) == [(Step.LAUNCH, j1)]
    assert j1.state is JobState.LAUNCHED
    assert (s.in_flight, s.queued, s.is_idle(), s.has_parked()) == (1, 0, False, False)
    assert s.jobs_in_flight() == [j1]
    assert repr(j1) == "<Job #1 'k' launched>"
    assert repr(s) == "<Scheduler in_flight=1 queued=0 parked=0 compiling=0>"


def test_add_beyond_bound_waits_and_is_admitted_fifo(runner: FakeRunner, new: Jobs) -> None:
    s = runner.scheduler(1)
    j1, j2, j3 = new(), new(), new()
    assert s.add(j1) == [(Step.LAUNCH, j1)]
    assert s.add(j2) == []
    assert s.add(j3) == []
    assert j2.state is j3.state is JobState.QUEUED
    assert (s.in_flight, s.queued) == (1, 2)
    assert repr(s) == "<Scheduler in_flight=1 queued=2 parked=0 compiling=0>"

    # The finished job is resolved before the admitted one launches; the oldest goes first.
    assert s.done(j1, (), None) == [(Step.RESOLVE, j1), (Step.LAUNCH, j2)]
    assert (j1.state, j2.state, j3.state) == (JobState.DONE, JobState.LAUNCHED, JobState.QUEUED)
    assert (s.in_flight, s.queued) == (1, 1)
    assert s.done(j2, (), None) == [(Step.RESOLVE, j2), (Step.LAUNCH, j3)]
    assert s.done(j3, (), None) == [(Step.RESOLVE, j3)]
    assert s.is_idle()
    assert repr(j3) == "<Job #3 'k' done>"


def test_compile_is_started_once_per_kernel(runner: FakeRunner, new: Jobs) -> None:
    runner.uncompiled = {K, K2}
    s = runner.scheduler(8)
    j1, j2, j3 = new(K), new(K), new(K2)
    assert s.add(j1) == [(Step.COMPILE, j1)]
    assert s.add(j2) == []  # waits for the compile j1 started
    assert s.add(j3) == [(Step.COMPILE, j3)]  # another kernel: its own compile
    assert j1.state is j2.state is j3.state is JobState.COMPILING
    assert s.in_flight == 3
    assert repr(s) == "<Scheduler in_flight=3 queued=0 parked=0 compiling=3>"
    assert repr(j2) == "<Job #2 'k' compiling>"


def test_compiled_routes_every_waiting_job(runner: FakeRunner, new: Jobs) -> None:
    runner.uncompiled = {K}
    s = runner.scheduler(8)
    plain, staged, parked = new(), new(), new()
    runner.unstaged = {staged}
    runner.blocked = {parked}
    assert s.add(plain) == [(Step.COMPILE, plain)]
    assert s.add(staged) == []
    assert s.add(parked) == []

    runner.uncompiled.clear()
    assert s.compiled(K, None) == [(Step.LAUNCH, plain), (Step.STAGE, staged)]
    assert plain.state is JobState.LAUNCHED
    assert staged.state is JobState.STAGING
    assert parked.state is JobState.PARKED
    assert s.has_parked()
    assert repr(s) == "<Scheduler in_flight=3 queued=0 parked=1 compiling=0>"
    assert s.compiled(K, None) == []  # a second report finds nobody waiting


def test_compile_failure_fails_each_job_and_admits_queued(runner: FakeRunner, new: Jobs) -> None:
    runner.uncompiled = {K}
    s = runner.scheduler(2)
    j1, j2, j3, j4 = new(K), new(K), new(K2), new(K2)
    assert s.add(j1) == [(Step.COMPILE, j1)]
    assert s.add(j2) == []
    assert s.add(j3) == []
    assert s.add(j4) == []
    assert s.queued == 2

    assert s.compiled(K, failing) == [
        (Step.RELEASE, j1),
        (Step.RESOLVE, j1),
        (Step.RELEASE, j2),
        (Step.RESOLVE, j2),
        (Step.LAUNCH, j3),
        (Step.LAUNCH, j4),
    ]
    assert j1.state is j2.state is JobState.DONE
    assert isinstance(j1.outcome, CompileError)
    assert isinstance(j2.outcome, CompileError)
    assert j1.outcome is not j2.outcome  # each job gets its own error
    assert "#1" in str(j1.outcome)
    assert "#2" in str(j2.outcome)
    assert (s.in_flight, s.queued) == (2, 0)
    assert repr(s) == "<Scheduler in_flight=2 queued=0 parked=0 compiling=0>"


def test_staging_then_launch(runner: FakeRunner, new: Jobs) -> None:
    s = runner.scheduler(2)
    j = new()
    runner.unstaged = {j}  # still true afterwards: a staged job is not staged again
    assert s.add(j) == [(Step.STAGE, j)]
    assert j.state is JobState.STAGING
    assert repr(j) == "<Job #1 'k' staging>"
    assert s.staged(j, None) == [(Step.LAUNCH, j)]
    assert state(j) is JobState.LAUNCHED
    assert s.staged(j, None) == []  # a stray report for a job past staging changes nothing
    assert state(j) is JobState.LAUNCHED


def test_staging_failure_resolves_without_release(runner: FakeRunner, new: Jobs) -> None:
    s = runner.scheduler(1)
    j1, j2 = new(), new()
    runner.unstaged = {j1}
    assert s.add(j1) == [(Step.STAGE, j1)]
    assert s.add(j2) == []
    error = MemoryError("no pinned memory")
    # The engine released what staging took: no RELEASE, and the slot goes to the next job.
    assert s.staged(j1, error) == [(Step.RESOLVE, j1), (Step.LAUNCH, j2)]
    assert j1.state is JobState.DONE
    assert j1.outcome is error
    assert s.in_flight == 1


def test_parked_until_poked_ready(runner: FakeRunner, new: Jobs) -> None:
    s = runner.scheduler(2)
    asked = len(runner.asked)
    assert s.poke() == []  # nothing parked: no question asked
    assert len(runner.asked) == asked

    j = new()
    runner.blocked = {j}
    assert s.add(j) == []
    assert j.state is JobState.PARKED
    assert s.has_parked()
    assert s.in_flight == 1  # a parked job holds its slot
    assert repr(s) == "<Scheduler in_flight=1 queued=0 parked=1 compiling=0>"
    assert repr(j) == "<Job #1 'k' parked>"
    assert s.poke() == []  # still not ready
    assert j.state is JobState.PARKED

    runner.blocked.clear()
    assert s.poke() == [(Step.LAUNCH, j)]
    assert state(j) is JobState.LAUNCHED
    assert not s.has_parked()
    assert s.poke() == []


def test_launch_failed_resolves_without_release(runner: FakeRunner, new: Jobs) -> None:
    s = runner.scheduler(1)
    j1, j2 = new(), new()
    assert s.add(j1) == [(Step.LAUNCH, j1)]
    assert s.add(j2) == []
    fault = DeviceFaultError(700, "CUDA_ERROR_ILLEGAL_ADDRESS", "cuLaunchKernel")
    assert s.launch_failed(j1, fault) == [(Step.RESOLVE, j1), (Step.LAUNCH, j2)]
    assert j1.state is JobState.DONE
    assert j1.outcome is fault
    assert s.jobs_in_flight() == [j2]


def test_done_twice_resolves_once(runner: FakeRunner, new: Jobs) -> None:
    s = runner.scheduler(2)
    j = new()
    assert s.add(j) == [(Step.LAUNCH, j)]
    fault = DeviceFaultError(700, "CUDA_ERROR_ILLEGAL_ADDRESS", "cuStreamSynchronize")
    assert s.done(j, fault, None) == [(Step.RESOLVE, j)]
    # The normal completion racing the failure changes nothing.
    assert s.done(j, ("late",), 0.25) == []
    assert s.launch_failed(j, RuntimeError("later still")) == []
    assert j.outcome is fault
    assert j.device_time is None
    assert s.is_idle()


def test_collecting_then_done(runner: FakeRunner, new: Jobs) -> None:
    s = runner.scheduler(2)
    j, parked = new(), new()
    runner.blocked = {parked}
    assert s.add(j) == [(Step.LAUNCH, j)]
    assert s.add(parked) == []
    s.collecting(j)
    assert j.state is JobState.COLLECTING
    assert repr(j) == "<Job #1 'k' collecting>"
    assert s.in_flight == 2
    s.collecting(parked)  # only a launched job starts collecting
    assert parked.state is JobState.PARKED

    assert s.done(j, ("result",), 0.5) == [(Step.RESOLVE, j)]
    assert state(j) is JobState.DONE
    assert j.outcome == ("result",)
    assert j.device_time == 0.5
    s.collecting(j)  # a late report does not revive it
    assert state(j) is JobState.DONE


def test_drop_queued_fails_queued_jobs_only(runner: FakeRunner, new: Jobs) -> None:
    s = runner.scheduler(1)
    j1, j2, j3 = new(), new(), new()
    assert s.add(j1) == [(Step.LAUNCH, j1)]
    assert s.add(j2) == []
    assert s.add(j3) == []
    assert s.drop_queued(closed) == [
        (Step.RELEASE, j2),
        (Step.RESOLVE, j2),
        (Step.RELEASE, j3),
        (Step.RESOLVE, j3),
    ]
    assert j1.state is JobState.LAUNCHED
    assert j2.state is j3.state is JobState.DONE
    assert isinstance(j2.outcome, BackendClosedError)
    assert "#2" in str(j2.outcome)
    assert (s.in_flight, s.queued, s.is_idle()) == (1, 0, False)
    assert s.drop_queued(closed) == []
    assert s.done(j1, (), None) == [(Step.RESOLVE, j1)]
    assert s.is_idle()


def test_abandon_waiting_fails_jobs_not_launched(runner: FakeRunner, new: Jobs) -> None:
    runner.uncompiled = {K}
    s = runner.scheduler(8)
    compiling, waiting, staging, parked, launched, collecting = (
        new(K),
        new(K),
        *map(new, [K2] * 4),
    )
    runner.unstaged = {staging}
    runner.blocked = {parked}
    assert s.add(compiling) == [(Step.COMPILE, compiling)]
    assert s.add(waiting) == []
    assert s.add(staging) == [(Step.STAGE, staging)]
    assert s.add(parked) == []
    assert s.add(launched) == [(Step.LAUNCH, launched)]
    assert s.add(collecting) == [(Step.LAUNCH, collecting)]
    s.collecting(collecting)

    assert s.abandon_waiting(closed) == [
        (Step.RELEASE, compiling),
        (Step.RESOLVE, compiling),
        (Step.RELEASE, waiting),
        (Step.RESOLVE, waiting),
        (Step.RELEASE, staging),
        (Step.RESOLVE, staging),
        (Step.RELEASE, parked),
        (Step.RESOLVE, parked),
    ]
    for job in (compiling, waiting, staging, parked):
        assert job.state is JobState.DONE
        assert isinstance(job.outcome, BackendClosedError)
    assert launched.state is JobState.LAUNCHED
    assert collecting.state is JobState.COLLECTING
    assert s.jobs_in_flight() == [launched, collecting]
    assert not s.has_parked()
    assert repr(s) == "<Scheduler in_flight=2 queued=0 parked=0 compiling=0>"

    # The compile they waited for reports later: nobody is routed, nothing staged or launched.
    runner.uncompiled.clear()
    assert s.compiled(K, None) == []
    assert s.staged(staging, None) == []
    assert s.poke() == []
    assert compiling.state is waiting.state is staging.state is JobState.DONE


def test_job_finished_while_compiling_leaves_the_waiting_list(
    runner: FakeRunner, new: Jobs
) -> None:
    runner.uncompiled = {K}
    s = runner.scheduler(8)
    j1, j2 = new(K), new(K)
    assert s.add(j1) == [(Step.COMPILE, j1)]
    assert s.add(j2) == []
    fault = DeviceFaultError(700, "CUDA_ERROR_ILLEGAL_ADDRESS", "cuModuleLoadData")
    assert s.done(j1, fault, None) == [(Step.RESOLVE, j1)]
    assert repr(s) == "<Scheduler in_flight=1 queued=0 parked=0 compiling=1>"
    assert s.done(j2, fault, None) == [(Step.RESOLVE, j2)]
    assert repr(s) == "<Scheduler in_flight=0 queued=0 parked=0 compiling=0>"

    # Nobody waits for kernel K any more: the next job starts a compile of its own.
    j3 = new(K)
    assert s.add(j3) == [(Step.COMPILE, j3)]
    runner.uncompiled.clear()
    assert s.compiled(K, None) == [(Step.LAUNCH, j3)]
    assert j1.state is j2.state is JobState.DONE


def test_finished_compiling_job_is_not_routed_by_its_compile(runner: FakeRunner, new: Jobs) -> None:
    runner.uncompiled = {K}
    s = runner.scheduler(8)
    j1, j2 = new(K), new(K)
    assert s.add(j1) == [(Step.COMPILE, j1)]
    assert s.add(j2) == []
    assert s.done(j1, RuntimeError("failed"), None) == [(Step.RESOLVE, j1)]
    runner.uncompiled.clear()
    assert s.compiled(K, None) == [(Step.LAUNCH, j2)]  # j1 is not launched after it finished
    assert j1.state is JobState.DONE


# -- the fast path's door --------------------------------------------------------------------------


def test_the_fast_door_admits_straight_to_launched_and_completes(
    runner: FakeRunner, new: Jobs
) -> None:
    s = runner.scheduler(2)
    door = s.fast_door
    j1 = new()
    door.admit_launched(j1)
    assert j1.state is JobState.LAUNCHED
    assert (s.in_flight, s.queued, s.admitted(j1.id)) == (1, 0, j1)
    assert runner.asked == []  # nothing to compile, stage or wait for: no question asked
    assert door.complete_launched(j1, (1,)) is True
    assert (j1.state, j1.outcome, s.is_idle()) == (JobState.DONE, (1,), True)


def test_the_fast_door_declines_to_complete_while_a_job_waits(
    runner: FakeRunner, new: Jobs
) -> None:
    s = runner.scheduler(1)
    door = s.fast_door
    j1, j2 = new(), new()
    door.admit_launched(j1)
    assert s.add(j2) == []  # queued behind the fast path's job
    assert door.complete_launched(j1, ()) is False  # changed nothing: the general way instead
    assert (j1.state, s.in_flight, s.queued) == (JobState.LAUNCHED, 1, 1)
    assert s.done(j1, (), None) == [(Step.RESOLVE, j1), (Step.LAUNCH, j2)]


def test_the_fast_door_takes_an_admission_back(runner: FakeRunner, new: Jobs) -> None:
    s = runner.scheduler(1)
    j1 = new()
    s.fast_door.admit_launched(j1)
    s.fast_door.withdraw(j1)
    assert s.is_idle()
    assert (s.fast_door.in_flight, s.fast_door.limit) == ({}, 1)  # the scheduler's own, read
