"""The fast path against the general path, on the whole CUDA backend over the stand-in driver.

Each dispatch core runs every scenario of ``tests/fake_driver/backend_scenario.py`` in a child
process that loads the stand-in as ``libcuda.so.1`` (no GPU needed); the tests check what they
observed: the same results (against numpy, on fresh random inputs) and the same errors on both
paths, the fast path actually taken, ordering of the uses of one buffer across both paths,
cancellation, faults, closing with work in flight, the same telemetry, and the calls a
dispatch makes. The fast path is the compiled core's: on the Python core a backend with the
fast path enabled runs the general path, and every scenario must show that. The CUDA suite
checks the same on a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fake_driver import environment

from .needs import CORES, owners_compiled, stand_in

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.stand_in, pytest.mark.nvrtc]

# asyncgraph's own calls per awaited dispatch (its functions, not the builtins and asyncio's they
# call), per core: a change to the hot path shows here first. On the compiled core
# Backend.dispatch and the fast path's own call (PendingDispatch.__await__ is compiled with its
# module, so no Python call); on the Python core the general path's (the scheduler, the
# dispatcher, the small path, the reactor), fewer where the owners of the pending result, the
# resident buffers and the fast door are compiled (they are wherever the compiled core is:
# tests.needs.OWNERS) than where they run as Python. One of them learns the plan's time
# (``_watches.learned``), so that its next dispatch's watch says when it is expected to end.
PINNED_CALLS = {
    ("compiled", True): {"empty": 2, "4 KiB": 2, "resident": 2},
    ("python", True): {"empty": 66, "4 KiB": 89, "resident": 77},
    ("python", False): {"empty": 74, "4 KiB": 97, "resident": 92},
}
# The same for a graph="always" 4 KiB dispatch that replays the graph cache's graph, per core:
# on the compiled core Backend.dispatch, the fast path's call, and the graph's turn
# (CachedGraph.take_fast, replay_done) and the cache's count of the hit.
PINNED_REPLAY_CALLS = {("python", True): 101, ("python", False): 109, ("compiled", True): 5}
REPLAY_ROW = "4 KiB, graph='always'"


@pytest.fixture(scope="module", params=CORES)
def seen(request: pytest.FixtureRequest) -> dict[str, Any]:
    """What every scenario observed on one core."""
    directory = stand_in()
    core: str = request.param
    done = subprocess.run(
        [sys.executable, "-m", "tests.fake_driver.backend_scenario"],
        cwd=ROOT,
        env=environment(directory, core),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "unimplemented" not in done.stderr, done.stderr[-4000:]
    observed: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert observed["compiled"] is (core == "compiled")
    observed["core"] = core
    return observed


def _fast(seen: dict[str, Any]) -> bool:
    """Whether the core that ran has the fast path (the compiled one)."""
    return bool(seen["compiled"])


def test_both_paths_compute_what_numpy_computes(seen: dict[str, Any]) -> None:
    results = seen["results"]
    for path in ("fast", "general"):
        assert all(error == 0.0 for error in results[path]["worst"].values()), results[path]
        assert results[path]["failed"] == 0
    assert results["general"]["fast_path_dispatches"] == 0
    # Every kind of argument took the fast path: all but the first dispatch of each of the six
    # signatures (scale, saxpy, in-out, a resident chain, into, fill). (A share of at least
    # 0.85 failed where the random chains were short: 33 of 39.)
    fast = results["fast"]
    general = fast["dispatches"] if not _fast(seen) else 6  # the Python core: every one
    assert fast["dispatches"] - fast["fast_path_dispatches"] == general


def test_invalid_calls_get_the_same_errors_on_both_paths(seen: dict[str, Any]) -> None:
    fast, general = seen["errors"]["fast"], seen["errors"]["general"]
    assert fast == general
    assert fast["after"] == ["ok", ""]
    refused = {name: kind for name, (kind, _message) in fast.items() if name != "after"}
    assert "no error" not in refused.values(), refused
    assert refused["closed buffer"] == "StaleBufferError"
    assert refused["another backend's buffer"] == "StaleBufferError"


def test_many_tasks_bounds_and_full_rings_stay_right(seen: dict[str, Any]) -> None:
    for name, case in seen["concurrency"].items():
        assert case["wrong"] == 0, name
        assert case["completed"] == case["dispatches"], name
        assert case["in_flight"] == 0, name
        assert case["events_out"] == 0, name  # every completion event back in its pool
        assert case["pinned_in_use"] == 0, name  # the rings are not pool blocks: nothing held
    steady = seen["concurrency"]["64 tasks"]
    full = seen["concurrency"]["rings full"]
    if not _fast(seen):
        assert steady["fast_path_dispatches"] == full["fast_path_dispatches"] == 0
        return
    assert steady["fast_path_dispatches"] == steady["dispatches"] - 1  # all but the first
    # Rings of 1 MiB hold about ten 96 KiB dispatches each: the rest went the general way.
    assert 0 < full["fast_path_dispatches"] < full["dispatches"]


def test_uses_of_one_buffer_keep_their_order_across_both_paths(seen: dict[str, Any]) -> None:
    ordering = seen["ordering"]
    assert ordering["checks"] == [True] * 4
    if _fast(seen):
        assert 0 < ordering["fast_path_dispatches"] < ordering["dispatches"]  # both paths ran
    else:
        assert ordering["fast_path_dispatches"] == 0
    assert ordering["tracking"] == [0, True, 0]  # no use left recorded on the buffer


def test_a_cancelled_awaiter_leaves_the_dispatch_running(seen: dict[str, Any]) -> None:
    cancel = seen["cancel"]
    assert cancel == {
        "fast": int(_fast(seen)),
        "done_when_cancelled": False,
        "result": True,
        "in_flight": 0,
        "events_out": 0,
    }


def test_a_fault_fails_the_dispatch_and_the_backend_still_closes(seen: dict[str, Any]) -> None:
    assert seen["fault"] == {
        "failed": "DeviceFaultError",
        "fast": int(_fast(seen)),
        "later": "DeviceFaultError",
        "closed": True,
    }


def test_closing_waits_for_the_fast_path_and_frees_everything(seen: dict[str, Any]) -> None:
    close = seen["close"]
    assert close["fast"] >= 50 if _fast(seen) else close["fast"] == 0
    assert close["completed"] == 50
    assert close["live"] == {"allocations": 0, "events": 0, "streams": 0}


def test_the_telemetry_is_the_same_on_both_paths(seen: dict[str, Any]) -> None:
    telemetry = seen["telemetry"]
    assert telemetry["fast"] == telemetry["general"]
    assert telemetry["fast"]["dispatches"] == telemetry["fast"]["completion_latency"] == 60


def test_pending_results_of_the_fast_path_are_whole(seen: dict[str, Any]) -> None:
    slots = seen["pending_slots"]
    assert slots == {"unset": [], "type": "PendingDispatch", "fast": 2 * _fast(seen)}


def test_under_trio_the_general_path_runs_and_is_right(seen: dict[str, Any]) -> None:
    assert seen["trio"]["fast"] == 0
    assert all(error == 0.0 for error in seen["trio"]["worst"].values())


def test_the_fast_path_makes_few_calls(seen: dict[str, Any]) -> None:
    calls = seen["calls"]
    assert calls["fast"] == (calls["expected_fast"] if _fast(seen) else 0)
    build = ("compiled" if _fast(seen) else "python", owners_compiled())
    pinned = PINNED_CALLS[build]
    assert {row: calls[row]["asyncgraph"] for row in pinned} == pinned
    assert calls[REPLAY_ROW]["asyncgraph"] == PINNED_REPLAY_CALLS[build]


def test_lone_dispatches_take_the_stream_pools_lanes_in_turn(seen: dict[str, Any]) -> None:
    # Each lane found idle: the ties go round the pool's lanes alone, never to another class's
    # lanes (which come after them), so each pool lane takes as many (the compiled fast path
    # once counted the other classes' lanes in its turn, and its first lane took half).
    spread = seen["spread"]
    pool = spread["pool"]
    assert spread["used"] == [3] * pool + [0] * (len(spread["used"]) - pool)
    assert spread["fast"] == (3 * pool if _fast(seen) else 0)


def test_each_class_runs_on_its_own_lanes_and_on_the_fast_path(seen: dict[str, Any]) -> None:
    classes = seen["classes"]
    for rank, name in enumerate(("high", "normal", "low")):
        got = classes[name]
        assert got["worst"] == 0.0, got
        assert got["ranks"] == [rank], got  # the lanes of its class alone
        assert got["fast"] == (20 if _fast(seen) else 0), got
        assert got["latency"] == got["wait"] == 20, got  # counted in its class
    # A use of a buffer in another class than the one it waits for: the general way.
    assert classes["across"] == {"fast": 1 if _fast(seen) else 0, "right": True}
    # Uses of one buffer within a class: ordered by its lane, on the fast path.
    assert classes["chain"] == {"fast": 5 if _fast(seen) else 0, "ranks": [0], "right": True}
