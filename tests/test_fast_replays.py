"""Graph replays on the fast path over the stand-in driver, on each core and in both stream
modes (``tests/fake_driver/replay_scenario.py``): launched in one call, ordered after and before
eager dispatches of their buffers, their failures reported, the same results as the general
path's replays. The fast path is the compiled core's: on the Python core a backend with the
fast path enabled replays as jobs of the general path, and shows just what one without it
shows. ``test_cuda_graphs.py`` runs replays on a GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.fake_driver import run_scenario

from .needs import CORES, owners_compiled

pytestmark = [pytest.mark.stand_in, pytest.mark.nvrtc]

PATHS = ("fast", "general")


@pytest.fixture(scope="module", params=("immediate", "deferred"))
def streams(request: pytest.FixtureRequest) -> str:
    """When the stand-in's streams run their work: when enqueued, or when they get to it."""
    mode: str = request.param
    return mode


@pytest.fixture(scope="module", params=CORES)
def seen(request: pytest.FixtureRequest, streams: str) -> dict[str, Any]:
    """What ``replay_scenario`` observed on one core, in one stream mode."""
    return run_scenario("tests.fake_driver.replay_scenario", request.param, streams=streams)


@pytest.mark.parametrize("path", PATHS)
def test_captured_replays_run_in_order_with_eager_dispatches(
    seen: dict[str, Any], path: str
) -> None:
    captured = seen[path]["captured"]
    assert captured["alone"] == 55.0  # 5 replays of +1, +10
    assert captured["after_fill"] == 18.0  # the fill first, then the replay
    assert captured["before_fill"] == 3.0  # the replay first, then the fill
    assert captured["gathered"] == 3.0 + 8 * 11.0
    assert captured["in_flight"] == 0


@pytest.mark.parametrize("path", PATHS)
def test_a_replay_whose_event_fails_raises_and_the_graph_replays_again(
    seen: dict[str, Any], path: str
) -> None:
    captured = seen[path]["captured"]
    assert captured["failed"] == "CudaError"
    assert captured["after_failure"] == 91.0 + 2 * 11.0  # the failed one's work ran too


@pytest.mark.parametrize("path", PATHS)
def test_recorded_replays_compute_what_numpy_does(seen: dict[str, Any], path: str) -> None:
    recorded = seen[path]["recorded"]
    assert recorded["replays_right"]
    assert recorded["taking_turns_right"]
    assert recorded["always_right"]
    assert recorded["always_replays"] == 6
    assert recorded["always_hits"] == 5  # the first recorded the graph


def test_replays_take_the_fast_path_where_there_is_one(seen: dict[str, Any]) -> None:
    fast, general = seen["fast"], seen["general"]
    if not seen["compiled"]:  # no fast path: the general path replays them all
        assert fast == general
        assert (fast["captured"]["alone_fast"], fast["recorded"]["always_fast"]) == (0, 0)
        assert fast["recorded"]["always_binds"] == 6
        return
    assert (fast["captured"]["alone_fast"], fast["captured"]["gathered_fast"]) == (5, 8)
    assert (fast["recorded"]["replays_fast"], fast["recorded"]["always_fast"]) == (3, 6)
    # graph="always": bound on the general path the first time (which routes the cache's graphs
    # to the fast path) and when the scalar changed (its kernel node updated); else not bound.
    assert (fast["recorded"]["always_binds"], general["recorded"]["always_binds"]) == (2, 6)
    assert fast["captured"]["learned"]  # the graph's time, for the reactor's wake-up
    assert (general["captured"]["alone_fast"], general["recorded"]["always_fast"]) == (0, 0)
    assert not general["captured"]["learned"]


def test_a_batchers_padded_batches_replay_one_graph_on_the_fast_path(seen: dict[str, Any]) -> None:
    fast, general = seen["fast"]["batched"], seen["general"]["batched"]
    for batched in (fast, general):
        assert batched["right"]
        assert batched["replays"] == batched["batches"] == 5  # each batch, one replay
    if not seen["compiled"]:
        assert fast == general
        return
    assert (fast["fast"], fast["binds"]) == (5, 0)  # on the fast path, nothing bound
    assert (general["fast"], general["binds"]) == (0, 5)


# asyncgraph's own calls per awaited replay of a captured graph, per core and whether the owners
# of the pending result, the resident buffers and the fast door are compiled (tests.needs.OWNERS:
# they are wherever the compiled core is): on the compiled core the replay's coroutine and the
# graph host's hand-off (capture._replayed), FastPath.replay (called straight: the engine hands
# it to the graphs), the graph's launch address, its results and its turn; on the Python core a
# replay job of the general path's.
PINNED_REPLAY_CALLS = {("compiled", True): 8, ("python", True): 67, ("python", False): 79}


def test_a_captured_replay_makes_few_calls(seen: dict[str, Any]) -> None:
    fast, general = seen["fast"]["captured"], seen["general"]["captured"]
    build = ("compiled" if seen["compiled"] else "python", owners_compiled())
    assert fast["calls"] == PINNED_REPLAY_CALLS[build]
    if seen["compiled"]:
        assert general["calls"] > fast["calls"]
    else:
        assert general["calls"] == fast["calls"]
