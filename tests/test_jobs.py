"""Steering jobs: priority classes, queue deadlines, withdrawal and traces (``docs/jobs.md``).

Each scenario of ``tests/jobs_scenarios.py`` runs on the host backend here and on the CUDA
backend over the stand-in driver, on each dispatch core (in a child process), and both must
see what the docs promise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._cuda.driver._priorities import class_priorities
from tests.fake_driver import run_scenario
from tests.jobs_scenarios import SCENARIOS, N, _inc
from tests.needs import CORES

STAND_IN = "tests.fake_driver.jobs_scenario"


class HostHold:
    """The slot held by a host function that waits for its release."""

    def __init__(self) -> None:
        self._go = threading.Event()

    def take(self, backend: Any, priority: str = "normal") -> ag.PendingDispatch:
        def wait(buf: np.ndarray[Any, Any], step: np.float32, n: np.int32) -> None:
            self._go.wait(10)

        kernel = ag.Kernel(
            'extern "C" __global__ void hold(float* buf, float step, int n) {}', "hold", host=wait
        )
        buf = np.zeros(N, np.float32)
        pending: ag.PendingDispatch = backend.dispatch(
            kernel, buf, np.float32(1), np.int32(N), grid=1, block=N, priority=priority
        )
        return pending

    def release(self) -> None:
        self._go.set()


async def _host(name: str) -> dict[str, Any]:
    async with ag.open_backend("host", max_in_flight=1, host_workers=1) as backend:
        return await SCENARIOS[name](backend, HostHold())


@pytest.fixture(params=["host", *CORES])
def seen_of(request: pytest.FixtureRequest) -> Callable[[str], Any]:
    """Runs a scenario on the host backend, or on the stand-in with a dispatch core."""
    where = request.param

    def seen(name: str) -> Any:
        if where == "host":
            import asyncio

            return asyncio.run(_host(name))
        observed = run_scenario(STAND_IN, where, name)
        observed.pop("stderr")
        return observed

    return seen


pytestmark = pytest.mark.nvrtc  # the stand-in's runs compile INC with NVRTC


def test_queued_dispatches_start_by_class_then_in_call_order(seen_of: Any) -> None:
    seen = seen_of("order")
    assert seen["queued"] == 7
    assert seen["started"] == ["high2", "high4", "normal1", "normal5", "None6", "low0", "low3"]
    # The default class is "normal"; each class's histograms count its own.
    assert seen["waits"] == {"high": 2, "normal": 4, "low": 2}  # the held one is normal
    assert seen["latencies"] == {"high": 2, "normal": 4, "low": 2}


def test_a_low_dispatch_starts_within_the_aging_bound_while_high_work_keeps_coming(
    seen_of: Any,
) -> None:
    seen = seen_of("aging")
    assert seen["n"] == seen["total"] + 1
    # At most AGING dispatches queued after it start before it, though more kept coming.
    assert seen["before_low"] <= seen["aging"]
    assert seen["before_low"] < seen["total"]


def test_a_queue_deadline_withdraws_a_dispatch_behind_a_full_slot(seen_of: Any) -> None:
    seen = seen_of("timeout")
    assert (seen["error"], seen["is_timeout"]) == ("QueueTimeoutError", True)
    assert seen["elapsed"] < 0.1
    assert seen["message"].endswith(
        "waited its queue_timeout of 0.05 s for an in-flight slot and was withdrawn; its "
        "kernel did not run — raise queue_timeout, lower the load, or give it a higher priority"
    )
    assert seen["value"] == 0.0  # its kernel never ran
    assert seen["after"] == 1.0  # the next one did
    assert (seen["timed_out"], seen["in_flight"], seen["queued"]) == (1, 0, 0)
    if "inc_launches" in seen:
        assert seen["inc_launches"] == 2  # the held one and the one after


def test_cancel_withdraws_a_queued_dispatch_and_no_launched_one(seen_of: Any) -> None:
    seen = seen_of("cancel")
    assert (seen["first"], seen["again"], seen["launched"]) == (True, False, False)
    assert seen["error"] == "WithdrawnError"
    assert seen["message"].endswith(
        "was withdrawn before it launched (cancel() was called); its kernel did not run"
    )
    assert seen["value"] == 1.0  # only the dispatch after it ran
    assert seen["withdrawn"] == 1


def test_a_dispatch_every_awaiter_gave_up_on_is_withdrawn_and_others_run(seen_of: Any) -> None:
    seen = seen_of("abandoned")
    assert seen["one_left"] is False  # one awaiter left: still queued
    assert seen["error"] == "WithdrawnError"
    assert (seen["awaited"], seen["unawaited"], seen["called"]) == (0.0, 1.0, 1.0)


def test_queued_work_that_later_work_depends_on_is_not_withdrawn(seen_of: Any) -> None:
    seen = seen_of("dependent")
    assert seen["refused"] == [False, False, False, False]
    assert seen["value"] == 3.0
    assert seen["downloaded"] == 1.0


def test_bad_priorities_and_deadlines_are_refused_at_the_call(seen_of: Any) -> None:
    seen = seen_of("refused")
    assert seen == {
        "name": ["DispatchError", "dispatch(): priority='urgent'; pass 'high', 'normal' or 'low'"],
        "number": ["ArgumentTypeError", "dispatch(): priority=1; pass 'high', 'normal' or 'low'"],
        "negative": [
            "DispatchError",
            "dispatch(): queue_timeout=-1; pass a non-negative number of seconds, or None for "
            "no bound",
        ],
        "nan": [
            "DispatchError",
            "dispatch(): queue_timeout=nan; pass a non-negative number of seconds, or None for "
            "no bound",
        ],
        "text": [
            "ArgumentTypeError",
            "dispatch(): queue_timeout='1'; pass a number of seconds, or None for no bound",
        ],
        "dispatches": 0,
        **({"inc_launches": 0} if "inc_launches" in seen else {}),
    }


def test_backend_options_refuse_a_bad_default_class_or_deadline() -> None:
    with pytest.raises(
        ag.DispatchError, match=r"^BackendOptions: priority='top'; pass 'high', 'normal' or 'low'$"
    ):
        ag.BackendOptions(default_priority="top")
    with pytest.raises(ag.DispatchError, match=r"^BackendOptions: queue_timeout=-0.5; pass a "):
        ag.BackendOptions(queue_timeout=-0.5)


async def test_the_default_class_and_deadline_come_from_the_options() -> None:
    async with ag.open_backend(
        "host", max_in_flight=1, host_workers=1, default_priority="low", queue_timeout=0.02
    ) as backend:
        hold = HostHold()
        hold.take(backend, "high")
        late = _inc(backend, ag.InOut(np.zeros(N, np.float32)))
        with pytest.raises(ag.QueueTimeoutError):
            await late
        hold.release()
        await _inc(backend, ag.InOut(np.zeros(N, np.float32)))
        snap = backend.telemetry.snapshot()
        assert snap.completion_latency_by_class["low"].count == 2  # withdrawn ones too
        assert snap.queue_wait_by_class["low"].count == 1  # only the one submitted


@pytest.mark.stand_in
@pytest.mark.parametrize("core", CORES)
def test_each_class_runs_on_streams_of_its_cuda_priority(core: str) -> None:
    seen = run_scenario(STAND_IN, core, "streams")
    assert seen["range"] == [0, -5]  # the stand-in's, an H100's: 0 is the lowest
    assert seen["priorities"] == {"high": [-5], "normal": [-2], "low": [0]}
    assert seen["lanes"] == {"high": "high", "normal": "normal", "low": "low"}


@pytest.mark.parametrize(
    ("least", "greatest", "expected"),
    [((0), (-5), (-5, -2, 0)), (0, 0, (0, 0, 0)), (0, -1, (-1, 0, 0)), (3, -3, (-3, 0, 3))],
)
def test_class_priorities_stay_inside_the_range_whichever_way_it_runs(
    least: int, greatest: int, expected: tuple[int, ...]
) -> None:
    priorities = class_priorities(least, greatest)
    assert priorities == expected
    assert all(min(least, greatest) <= p <= max(least, greatest) for p in priorities)


async def test_a_batchers_class_and_queue_deadline_apply_to_its_batches() -> None:
    from tests.batching import Affine, F, make

    async with ag.open_backend("host", max_in_flight=1, host_workers=1) as backend:
        with pytest.raises(
            ag.DispatchError, match=r"^batcher\(\): priority='top'; pass 'high', 'normal' or 'low'$"
        ):
            make(backend, Affine(), priority="top")
        rows = make(backend, Affine(), max_size=2, queue_timeout=0.02, priority="low")
        hold = HostHold()
        held = hold.take(backend)
        calls = [rows(np.full(F, i, np.float32)) for i in range(2)]
        import asyncio

        results = await asyncio.gather(*calls, return_exceptions=True)
        assert [type(r).__name__ for r in results] == ["QueueTimeoutError"] * 2
        hold.release()
        await held
        assert backend.telemetry.snapshot().dispatches_timed_out == 1
        await rows.aclose()
