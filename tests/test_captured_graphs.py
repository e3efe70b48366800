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


def test_a_capture_into_a_graph_with_the_same_nodes_updates_it_in_place(
    seen: dict[str, Any],
) -> None:
    again = seen["recaptures"]
    assert again["same_graph"]
    assert again["in_place"] == [1, 1]  # recaptures, updated in place
    assert again["live_graphs"] == 1  # nothing else instantiated
    assert again["after_in_place"] == [6.0, 60.0]  # the new buffer and scalars ran
    assert again["dispatches_are_new"]
    assert again["old_dispatch"] == (
        "DispatchError: update() takes a RecordedDispatch of this graph (from cap.dispatch)"
    )
    assert again["updated_after_in_place"] == 300.0  # 60 + 10 + 200 + 30


def test_a_capture_repeating_the_last_one_but_for_scalars_binds_nothing(
    seen: dict[str, Any],
) -> None:
    again = seen["recaptures"]
    assert again["repeat_binds"] == 0  # the last capture's dispatches were the plans
    assert again["repeat_in_place"] == [2, 2]
    assert again["after_repeat"] == 306.0  # 300 + 1 + 2 + 3, then + 1 + 2 - 3 (updated)
    # A buffer closed since is bound, and refused with dispatch()'s error.
    assert again["stale"] == (
        "args[0] of 'inc' (float* buf) is a resident buffer that was closed (slot 0, generation 1)"
    )
    assert again["back"] == 60.0  # the aborted capture left the graph usable


def test_a_capture_into_a_graph_with_other_nodes_replaces_its_executable_graph(
    seen: dict[str, Any],
) -> None:
    again = seen["recaptures"]
    assert again["instantiated"] == [4, 3]
    assert again["live_graphs_after"] == 1  # the old executable graph was freed
    assert again["after_new"] == [8.0, 60.0, 1.0]
    assert again["with_foreign"] == [5, 3]  # work of other code in it: never in place
    assert again["telemetry_captures"] == 7  # the updates' capture, and six into the graph
    assert again["errors"] == {
        "not_a_graph": "ArgumentTypeError: capture(into=...) takes a CapturedGraph (cap.graph "
        "of an earlier capture), got str",
        "closed": "BackendClosedError: capture(into=graph): the graph is closed; capture "
        "without into= for a new one",
        "other_backend": "DispatchError: capture(into=graph): the graph is another backend's; "
        "capture into a graph of this backend, or without into= for a new one",
    }
    assert again["live_graphs_closed"] == 0
