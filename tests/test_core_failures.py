"""The dispatch cores' failure paths, on each core, over the stand-in driver: what a step that
raises, a misused loop, a kernel that never finishes or a changed layout leave behind.

Each scenario of ``tests/fake_driver/core_scenario.py`` runs in a child process that loads the
stand-in as ``libcuda.so.1``.
"""

from __future__ import annotations

import pytest

from tests.fake_driver import run_scenario
from tests.test_fast_path import CORES

SCENARIO = "tests.fake_driver.core_scenario"


@pytest.mark.parametrize("core", CORES)
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


@pytest.mark.parametrize("core", CORES)
def test_a_readers_field_of_another_type_fails_the_call_safely(core: str) -> None:
    # The compiled core cast it unchecked and wrote past the end of a tuple (it crashed).
    seen = run_scenario(SCENARIO, core, "readers_not_a_list", timeout=60)
    errors = {"compiled": "TypeError", "python": "AttributeError"}[core]
    assert seen["reader"] == seen["writer"] == errors
    assert seen["outstanding"] == 0


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
