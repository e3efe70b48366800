"""The dispatch cores' failure paths, on each core, over the stand-in driver: what a step that
raises, a misused loop, a kernel that never finishes or a changed layout leave behind.

Each scenario of ``tests/fake_driver/core_scenario.py`` runs in a child process that loads the
stand-in as ``libcuda.so.1``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fake_driver import build, environment, run_scenario
from tests.needs import CORES

# The fast path's commit, which only the compiled core has (the Python core runs the general
# path, whose failures the rest of the suite covers).
FAST_PATH_CORES = [pytest.param("compiled", marks=pytest.mark.compiled)]

# The stand-in driver runs these, compiling kernels with NVRTC (tests/needs.py).
pytestmark = [pytest.mark.stand_in, pytest.mark.nvrtc]

SCENARIO = "tests.fake_driver.core_scenario"
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("core", FAST_PATH_CORES)
def test_a_commit_step_that_raises_leaves_nothing_behind(core: str) -> None:
    # The lane's count refuses to grow, for a dispatch that writes a buffer and one that reads
    # it: the error reaches the caller, nothing is in flight or tracked, nothing launched, and
    # the buffer and the backend still close.
    seen = run_scenario(SCENARIO, core, "commit_fails", timeout=60)
    for use in ("writer", "reader"):
        assert seen[use] == {
            "error": "RuntimeError",
            "tracking": [0, True, 0],
            "outstanding": 0,
            "lane": 0,
        }, use
    assert seen["launched"] == 0
    assert seen["fast"] == 0
    assert seen["right"]
    assert seen["closed"]


@pytest.mark.parametrize("core", FAST_PATH_CORES)
def test_a_readers_field_of_another_type_cannot_be_set(core: str) -> None:
    # The compiled core once cast it unchecked and wrote past the end of a tuple (it crashed);
    # the buffer's compiled module types the field, so no such state can arise.
    seen = run_scenario(SCENARIO, core, "readers_not_a_list", timeout=60)
    outcome = {key: seen[key] for key in ("assigned", "right", "fast", "outstanding")}
    assert outcome == {"assigned": "TypeError", "right": True, "fast": 2, "outstanding": 0}


@pytest.mark.parametrize("core", CORES)
def test_a_dispatch_inside_a_nested_loop_is_refused_at_the_call(core: str) -> None:
    # The compiled core asked whether the loop's thread was this one, launched the dispatch
    # and counted it in flight; only its await raised.
    seen = run_scenario(SCENARIO, core, "nested_loop", timeout=60)
    seen.pop("stderr")
    assert seen == {
        "compiled": core == "compiled",
        "outcome": "UnsupportedError: backend cuda:0 belongs to another event loop; open one "
        "backend per event loop",
        "launched": 0,
        "outstanding": 0,
        "fast": 0,
    }


@pytest.mark.parametrize("core", CORES)
def test_a_dispatch_in_a_forked_child_is_refused_at_the_call(core: str) -> None:
    seen = run_scenario(SCENARIO, core, "forked", timeout=60)
    seen.pop("stderr")
    assert seen == {
        "compiled": core == "compiled",
        "outcome": "UnsupportedError: backend cuda:0 is used from a thread with no running "
        "event loop; call it from async code on the loop it belongs to",
        "launched": 0,
        "outstanding": 0,
        "fast": 0,
    }


@pytest.mark.parametrize("kept", [False, True], ids=["dropped", "kept"])
@pytest.mark.parametrize("core", CORES)
def test_a_kernel_that_never_finishes_does_not_hold_the_process_exit(core: str, kept: bool) -> None:
    # The backend is left unclosed with a dispatch whose kernel never finishes, its event in a
    # waiter thread's cuEventSynchronize; asyncio.run returns and the process exits. The
    # compiled core's waiter joined that thread forever: the process stayed alive.
    try:
        directory = build()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    began = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", SCENARIO, "hung_exit", "kept" if kept else "dropped"],
            cwd=ROOT,
            env=environment(directory, core),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the process was still alive 30 s after its work was done")
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr[-3000:]
    assert took < 15, took
    # Reported: when the backend is collected, or else as the process exits.
    events = ("backend.dropped_in_flight", "backend.exit_in_flight")
    assert any(event in done.stdout for event in events), done.stdout[-3000:]


@pytest.mark.parametrize("core", CORES)
def test_a_close_with_a_timeout_says_what_still_runs_and_keeps_its_result(core: str) -> None:
    # aclose(timeout=) fails only what was queued: a dispatch already running completes, with
    # its result (the documented contract; a GPU test holds it with a 200 ms kernel), and the
    # close says which dispatches it waits for once the timeout ran out.
    seen = run_scenario(SCENARIO, core, "hung_close", timeout=60)
    assert seen["waited"] is True  # the timeout did not end the close
    assert seen["waits"]  # backend.close_waits names the running dispatch
    assert seen["closed"]
    assert seen["right"] is True
    assert seen["failure"] is None
    assert seen["took"] < 5, seen["took"]
    assert seen["events"][-1] == "backend.closed"
    assert not seen["poisoned"]


@pytest.mark.parametrize("core", FAST_PATH_CORES)
def test_a_tracking_step_that_raises_puts_the_buffers_back(core: str) -> None:
    # The first buffer was tracked as written (its unfinished writer and reader replaced) when
    # the second one's tracking raised: it gets them back, so later uses still wait for them.
    seen = run_scenario(SCENARIO, core, "tracking_fails", timeout=60)
    assert seen["error"] == "RuntimeError"
    assert seen["first_put_back"]
    assert seen["first_uses"] == 2  # the two still running
    assert seen["second_in_use"] == 0
    assert seen["outstanding"] == 2  # nothing else in flight
    assert seen["right"]
    assert seen["closed"]
