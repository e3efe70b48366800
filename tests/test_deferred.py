"""The stand-in driver's deferred mode, where each stream runs its work in order when it gets to
it (``tests/fake_driver/fake_streams.c``), so that the order of the streams' work matters on a
machine without a GPU.

Each dispatch core runs, in child processes: a planted ordering bug (a missing stream wait),
which the deferred mode catches and the immediate mode lets pass; and the whole-backend
scenarios where order matters (ordering across both paths, full staging rings, a cancelled
awaiter, a fault, closing with work in flight), whose observations must be those of the
immediate mode.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fake_driver import build, environment, run_scenario
from tests.needs import CORES
from tests.test_fast_path import (
    test_a_cancelled_awaiter_leaves_the_dispatch_running as check_cancel,
)
from tests.test_fast_path import (
    test_a_fault_fails_the_dispatch_and_the_backend_still_closes as check_fault,
)
from tests.test_fast_path import (
    test_closing_waits_for_the_fast_path_and_frees_everything as check_close,
)
from tests.test_fast_path import (
    test_many_tasks_bounds_and_full_rings_stay_right as check_concurrency,
)
from tests.test_fast_path import (
    test_uses_of_one_buffer_keep_their_order_across_both_paths as check_ordering,
)

# The stand-in driver runs these, compiling kernels with NVRTC (tests/needs.py).
pytestmark = [pytest.mark.stand_in, pytest.mark.nvrtc]

ROOT = Path(__file__).resolve().parent.parent
ORDER = "tests.fake_driver.order_scenario"
IN_ORDER = ("ordering", "concurrency", "cancel", "fault", "close")


@pytest.mark.parametrize("core", CORES)
def test_the_deferred_mode_catches_a_missing_stream_wait(core: str) -> None:
    intact = run_scenario(ORDER, core, "missing_wait", streams="deferred")
    assert intact["readers_right"] == [True, True]
    assert intact["writer_right"]
    assert intact["waits"] == 2  # the writer's stream waited for each reader's
    assert intact["queued"] > 0  # the work was still queued when the streams ran
    planted = run_scenario(ORDER, core, "missing_wait", "planted", streams="deferred")
    assert planted["waits"] == 0
    assert planted["readers_right"] == [False, False]  # they read what the writer wrote


@pytest.mark.parametrize("core", CORES)
def test_the_immediate_mode_lets_a_missing_stream_wait_pass(core: str) -> None:
    planted = run_scenario(ORDER, core, "missing_wait", "planted")
    assert planted["queued"] == 0
    assert planted["readers_right"] == [True, True]


@pytest.mark.parametrize("path", ["fast", "general"])
@pytest.mark.parametrize("core", CORES)
def test_work_enqueued_before_a_failed_record_is_waited_for(core: str, path: str) -> None:
    # The record fails after the copies and the kernel were enqueued: the staging they use is
    # not handed to the next dispatch, nor is their buffer to a reader on another stream,
    # before the stream ran them. (In the immediate mode they ran at once, so this passed.)
    general = ("general",) if path == "general" else ()
    seen = run_scenario(ORDER, core, "record_fails", *general, streams="deferred")
    assert seen["failed"] == seen["buffer_failed"] == "CudaError"
    assert seen["staging_right"] == [True, True, True]
    assert seen["reader_right"]
    assert seen["failure"] == "None"  # the stream was waited for: the backend goes on
    assert seen["after_right"]
    assert (seen["fast"] > 0) is (path == "fast" and core == "compiled")


@pytest.mark.parametrize("path", ["fast", "general"])
@pytest.mark.parametrize("core", CORES)
def test_a_stream_that_cannot_be_waited_for_fails_the_backend(core: str, path: str) -> None:
    general = ("general",) if path == "general" else ()
    seen = run_scenario(ORDER, core, "record_and_sync_fail", *general, streams="deferred")
    seen.pop("stderr")
    assert seen == {
        "compiled": core == "compiled",
        "failed": "CudaError",
        "failure": "DeviceFaultError",
        "later": "DeviceFaultError",
        "closed": True,
    }


@pytest.fixture(scope="module", params=CORES)
def deferred(request: pytest.FixtureRequest) -> dict[str, Any]:
    """What the scenarios where order matters observed on one core, in the deferred mode."""
    try:
        directory = build()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    core: str = request.param
    done = subprocess.run(
        [sys.executable, "-m", "tests.fake_driver.backend_scenario", *IN_ORDER],
        cwd=ROOT,
        env=environment(directory, core, streams="deferred"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "unimplemented" not in done.stderr, done.stderr[-4000:]
    assert "queued work still uses" not in done.stderr, done.stderr[-4000:]
    observed: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert observed["compiled"] is (core == "compiled")
    assert observed["streams"] == "deferred"
    return observed


def test_uses_of_one_buffer_keep_their_order_when_streams_defer(deferred: dict[str, Any]) -> None:
    check_ordering(deferred)


def test_full_rings_and_many_tasks_stay_right_when_streams_defer(
    deferred: dict[str, Any],
) -> None:
    check_concurrency(deferred)


def test_a_cancelled_awaiter_leaves_deferred_work_running(deferred: dict[str, Any]) -> None:
    check_cancel(deferred)


def test_a_fault_fails_deferred_work_and_the_backend_still_closes(
    deferred: dict[str, Any],
) -> None:
    check_fault(deferred)


def test_closing_waits_for_deferred_work_and_frees_everything(deferred: dict[str, Any]) -> None:
    check_close(deferred)


@pytest.mark.parametrize("streams", ["immediate", "deferred"])
@pytest.mark.parametrize("core", CORES)
def test_the_stand_in_injects_failures_and_a_fault_fails_every_later_call(
    core: str, streams: str
) -> None:
    seen = run_scenario(ORDER, core, "injected", streams=streams)
    assert seen["launch"] == ["CudaError", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "cuLaunchKernel"]
    assert seen["copy"] == ["CudaError", "CUDA_ERROR_INVALID_VALUE", "cuMemcpyHtoDAsync"]
    assert seen["after"]  # an injected failure fails its dispatch only
    assert seen["info"] == [0, 256 << 20, True]  # cuMemGetInfo: the device's size, less in use
    assert seen["oom"] == "AllocationError"
    assert seen["fault"] == ["DeviceFaultError", "CUDA_ERROR_ILLEGAL_ADDRESS", "cuEventQuery"]
    # Records, memsets, allocations, streams and waits fail too once the process faulted.
    assert set(seen["after_fault"].values()) == {700}, seen["after_fault"]


@pytest.mark.parametrize("core", CORES)
def test_the_deferred_mode_runs_spin_as_a_long_kernel(core: str) -> None:
    seen = run_scenario(ORDER, core, "long_kernel", streams="deferred")
    assert seen["flag"] == 1
    assert seen["took"] >= 0.1  # 2e8 cycles at 2 GHz
    assert seen["ticks"] >= 5  # and the loop went on meanwhile
