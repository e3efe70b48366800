"""Dependent work on one stream: where a dispatch goes after the uses it depends on, and which
of them it waits for through events (runs without a GPU: the driver's wait is faked)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from cuda.bindings import driver as drv

import asyncgraph as ag
from asyncgraph._args._bound_args import BoundCall
from asyncgraph._cuda.driver._driver import SUCCESS
from asyncgraph._cuda.lanes import _stream_order as _launch
from asyncgraph._cuda.lanes._staging_plan import CudaJob
from asyncgraph._jobs._scheduler import JobState
from asyncgraph._runtime._finished import Download
from asyncgraph._runtime._priority import HIGH, LOW, NORMAL
from asyncgraph.pool import StreamLane

KERNEL = ag.Kernel('extern "C" __global__ void k(float* x) {}', "k")


class FakeLane:
    """A lane as the launch code reads it: its stream slot, handle and priority class."""

    def __init__(self, name: str, rank: int = NORMAL) -> None:
        # A lane of another class than the default one is reserved, as the device makes it.
        self.slot: StreamLane[None] = StreamLane(0, None, reserved=rank != NORMAL)
        self.handle = f"stream {name}"
        self.rank = rank


def _launched(lane: FakeLane | None, event: object = "event") -> CudaJob:
    job = CudaJob(BoundCall(KERNEL, [], (1, 1, 1), (1, 1, 1), 0), False)
    job.state = JobState.LAUNCHED
    job.lane, job.event = lane, event
    return job


def _download(event: object) -> Download:
    download = Download()
    download.event = event
    return download


def _finished(lane: FakeLane) -> CudaJob:
    job = _launched(lane, None)
    job.gpu_done = True
    return job


A, B = FakeLane("A"), FakeLane("B")


@pytest.mark.parametrize(
    ("deps", "expected"),
    [
        ([_launched(A), _launched(A)], A),
        ([_finished(B), _launched(A)], A),  # a finished use orders nothing
        ([_launched(A), _launched(B)], None),  # two streams: wait for one by event
        ([_launched(A), _launched(None, None)], None),  # not launched yet: no stream to follow
        ([_finished(A), _finished(B)], None),  # nothing unfinished: the least busy lane
        ([_launched(A), _download("copy")], None),  # a download's event is on no lane
    ],
)
def test_a_dispatch_follows_its_uses_only_when_they_run_on_one_lane(
    deps: list[Any], expected: FakeLane | None
) -> None:
    assert _launch.chained_lane(deps) is cast(Any, expected)


def test_a_leased_lane_is_not_followed() -> None:
    lane = FakeLane("leased")
    lane.slot.leased = True
    assert _launch.chained_lane([_launched(lane)]) is None


def test_a_dispatch_follows_its_uses_only_on_a_lane_of_its_own_class() -> None:
    high, low = FakeLane("high", HIGH), FakeLane("low", LOW)
    assert _launch.chained_lane([_launched(high)], HIGH) is cast(Any, high)
    assert _launch.chained_lane([_launched(low), _launched(low)], LOW) is cast(Any, low)
    assert _launch.chained_lane([_launched(high)], NORMAL) is None  # waits for it instead
    assert _launch.chained_lane([_launched(low)], HIGH) is None
    assert _launch.chained_lane([_launched(A)], HIGH) is None


def test_only_uses_on_other_streams_are_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[tuple[object, object]] = []

    def wait(handle: object, event: object, flags: int) -> tuple[Any]:
        waits.append((handle, event))
        return (SUCCESS,)

    monkeypatch.setattr(drv, "cuStreamWaitEvent", wait)
    deps = [
        _launched(A, "on A"),
        _launched(B, "on B"),
        _finished(B),
        _launched(None, None),  # unlaunched: waited for before the launch
        _download("download event"),
    ]
    _launch.wait_deps(deps, A)  # type: ignore[arg-type]  # a fake lane
    assert waits == [("stream A", "on B"), ("stream A", "download event")]
