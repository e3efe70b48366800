"""Each CUDA backend makes its own context current around its driver calls, and leaves the
thread's current context as it found it.

Every kind of work (``tests/context_work.py``) runs with another context current on the loop's
thread (one made with ``cuCtxCreate`` on the same device, as another library would), with none
current (a fresh thread), and with another current on a worker thread running the loop; each
result is checked against numpy and the thread's context must be the one found after each
step. On the stand-in driver (in CI, both dispatch cores) the driver also counts every call
made outside the backend's context; on a GPU a call in the wrong context fails or gives wrong
results.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from .context_work import current, destroy, every_kind_of_work, push_foreign
from .fake_driver import run_scenario
from .needs import CORES


@pytest.mark.stand_in
@pytest.mark.nvrtc
@pytest.mark.parametrize("core", CORES)
def test_every_driver_call_runs_in_the_backends_context_on_the_stand_in(core: str) -> None:
    seen = run_scenario("tests.fake_driver.context_scenario", core)
    for case in ("foreign_on_main", "none_on_thread", "foreign_on_thread"):
        result = seen[case]
        assert "error" not in result, result
        assert result["wrong"] == [], case
        assert result["moved"] == [], case
        assert result["wrong_context_calls"] == 0, (case, result["first_wrong_call"])
    assert seen["foreign_on_main"]["still_foreign"] is True
    assert seen["foreign_on_thread"]["still_foreign"] is True
    assert seen["none_on_thread"]["still_none"] is True
    assert seen["none_on_thread"]["found"] == 0
    assert seen["two_backends"]["right"] == 100
    assert seen["two_backends"]["wrong_context_calls"] == 0


def _with_foreign() -> dict[str, Any]:
    foreign = push_foreign()
    try:
        seen = asyncio.run(every_kind_of_work())
        seen["still_foreign"] = current() == int(foreign)
        seen["foreign"] = int(foreign)
    finally:
        destroy(foreign)
    return seen


def _in_thread(body: Any) -> dict[str, Any]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box.update(body())
        except BaseException as exc:  # reported by the test, not lost in the thread
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box


@pytest.mark.cuda
def test_another_context_current_on_the_loops_thread() -> None:
    seen = _with_foreign()
    assert seen["found"] == seen["foreign"]
    assert seen["wrong"] == []
    assert seen["moved"] == []
    assert seen["still_foreign"] is True


@pytest.mark.cuda
def test_no_context_current_on_a_fresh_thread() -> None:
    def body() -> dict[str, Any]:
        seen = asyncio.run(every_kind_of_work())
        seen["after"] = current()
        return seen

    seen = _in_thread(body)
    assert seen["found"] == 0
    assert seen["wrong"] == []
    assert seen["moved"] == []
    assert seen["after"] == 0


@pytest.mark.cuda
def test_another_context_current_on_a_worker_thread() -> None:
    seen = _in_thread(_with_foreign)
    assert seen["wrong"] == []
    assert seen["moved"] == []
    assert seen["still_foreign"] is True
