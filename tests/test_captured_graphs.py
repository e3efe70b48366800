"""Captured graphs updated in place on the stand-in driver, on each core: ``CapturedGraph.update``
sets one kernel node's parameters (``Launcher.set_node``), and what the replays compute shows
it (``tests/fake_driver/captured_scenario.py``). ``test_cuda_graphs.py`` runs the same on a GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.fake_driver import run_scenario

from .needs import CORES

pytestmark = [pytest.mark.stand_in, pytest.mark.nvrtc]


@pytest.fixture(scope="module", params=CORES)
def seen(request: pytest.FixtureRequest) -> dict[str, Any]:
    """What ``captured_scenario`` observed on one core."""
    return run_scenario("tests.fake_driver.captured_scenario", request.param)


def test_update_sets_the_scalars_of_one_kernel_node(seen: dict[str, Any]) -> None:
    updates = seen["updates"]
    # (1 + 10), then (100 + 10), then (1000 + 10) on the first half only: n was updated too.
    assert (updates["first_half"], updates["second_half"]) == (1131.0, 131.0)
    assert updates["updates"] == updates["telemetry_updates"] == 2


def test_update_refuses_what_is_not_new_scalars_as_dispatch_does(seen: dict[str, Any]) -> None:
    updates = seen["updates"]
    assert updates["other_buffer"] == (
        "DispatchError: args[0] of 'inc' differs from the recorded argument; update() changes "
        "scalar arguments only (capture again for other buffers)"
    )
    assert updates["float64"].startswith(
        "ArgumentTypeError: args[1] of 'inc' (float step) is a float64 scalar"
    )
    assert updates["python_float"].startswith(
        "ArgumentTypeError: args[1] of 'inc' (float step) is a Python float"
    )
    assert (
        updates["too_few"]
        == "DispatchError: 'inc' takes 3 arguments (float* buf, float step, int n), got 2"
    )
    assert updates["not_ours"] == (
        "DispatchError: update() takes a RecordedDispatch of this graph (from cap.dispatch)"
    )
    assert updates["updates_after_errors"] == 2
    assert updates["closed"] == "BackendClosedError: this graph is closed; capture it again"
