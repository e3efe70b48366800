"""``dispatch(graph="auto")`` chooses eager dispatches or graph replays by measuring both.

The decision (``asyncgraph.capture._choice.Choice``) is fed costs here directly, so what it does
with them is checked without a clock. The stand-in scenarios then run the whole CUDA backend on
each core, with one way made 2 ms dearer per dispatch by the stand-in's host costs: "auto" must
settle on the other, say why in ``graph_cache.statistics()``, free the graphs it will not use,
and (once settled on eager) let the fast path take the dispatches.
"""

from __future__ import annotations

from typing import Any

import pytest

from asyncgraph.capture import GraphChoiceStatistics
from asyncgraph.capture._choice import GRAPH_GAIN, SAMPLES, Choice, ChoiceState
from tests.fake_driver import run_scenario

from .needs import CORES

US = 1e-6


def _choice(settled: list[Choice] | None = None, samples: int = 3) -> Choice:
    told = settled if settled is not None else []
    return Choice("k(float32[4]) grid (1, 1, 1) block (4, 1, 1)", told.append, samples)


def test_it_measures_eager_first_then_alternates() -> None:
    choice = _choice()
    ways = []
    for _ in range(6):
        eager = choice.eager
        ways.append("eager" if eager else "graph")
        assert choice.sampling
        choice.took(eager, 10 * US)
    assert ways == ["eager", "graph"] * 3
    assert choice.state is not ChoiceState.MEASURING


def test_it_settles_on_graphs_where_they_save_enough() -> None:
    settled: list[Choice] = []
    choice = _choice(settled)
    for eager_us, graph_us in ((30, 10), (31, 11), (29, 500)):  # one slow replay: the median
        choice.took(True, eager_us * US)
        choice.took(False, graph_us * US)
    assert settled == [choice]
    assert choice.state is ChoiceState.GRAPH
    assert (choice.eager, choice.sampling) == (False, False)
    stats = choice.statistics()
    assert isinstance(stats, GraphChoiceStatistics)
    assert stats.choice == "graph"
    assert stats.eager_seconds == pytest.approx(30 * US)
    assert stats.graph_seconds == pytest.approx(11 * US)
    assert (stats.eager_samples, stats.graph_samples) == (3, 3)
    assert stats.reason == (
        "graph: a replay took 11.0 µs, an eager dispatch 30.0 µs (medians of 3 and 3)"
    )


@pytest.mark.parametrize("graph_us", [100.0, 100.0 * GRAPH_GAIN + 0.5])
def test_it_settles_on_eager_where_graphs_save_too_little(graph_us: float) -> None:
    settled: list[Choice] = []
    choice = _choice(settled)
    for _ in range(3):
        choice.took(True, 100 * US)
        choice.took(False, graph_us * US)
    assert settled == [choice]
    assert choice.state is ChoiceState.EAGER
    assert (choice.eager, choice.sampling) == (True, False)
    assert choice.reason.startswith(f"eager: a replay took {graph_us:.1f} µs, an eager")
    assert choice.reason.endswith("; a graph must save 10% to be kept")


def test_graphs_saving_just_enough_are_kept() -> None:
    choice = _choice()
    for _ in range(3):
        choice.took(True, 100 * US)
        choice.took(False, 100 * GRAPH_GAIN * US)
    assert choice.state is ChoiceState.GRAPH


def test_late_and_surplus_samples_change_nothing() -> None:
    settled: list[Choice] = []
    choice = _choice(settled)
    for _ in range(5):  # dispatches in flight together: more eager samples than needed
        choice.took(True, 10 * US)
    assert choice.statistics().eager_samples == 3
    assert not choice.eager  # the replays are measured next
    for _ in range(3):
        choice.took(False, 1 * US)
    assert choice.state is ChoiceState.GRAPH
    choice.took(True, 1 * US)  # a sample still in flight when it settled
    choice.took(False, 1000 * US)
    assert settled == [choice]
    assert choice.statistics().graph_seconds == pytest.approx(1 * US)


def test_a_signature_that_cannot_be_recorded_settles_on_eager_at_once() -> None:
    settled: list[Choice] = []
    choice = _choice(settled)
    choice.unrecordable("it streams")
    assert settled == [choice]
    assert choice.state is ChoiceState.EAGER
    assert choice.reason == "eager: it streams"
    assert choice.statistics().eager_seconds is None
    choice.unrecordable("again")  # settled already: nothing changes
    assert settled == [choice]


def test_a_forgotten_choice_sends_dispatches_back_to_the_cache() -> None:
    choice = _choice()
    for _ in range(3):
        choice.took(True, 100 * US)
        choice.took(False, 200 * US)
    assert choice.eager
    choice.forget()
    assert choice.state is ChoiceState.FORGOTTEN
    assert (choice.eager, choice.sampling) == (False, False)


def test_the_measuring_reason_counts_the_samples() -> None:
    choice = Choice("k() grid (1, 1, 1) block (1, 1, 1)", lambda _c: None)
    choice.took(True, 1 * US)
    assert choice.reason == f"measuring: 1 of {SAMPLES} eager samples, 0 of {SAMPLES} replays"
    assert choice.statistics().choice == "measuring"


# -- the whole backend, on the stand-in ------------------------------------------------------

ROUNDS = 30  # tests/fake_driver/auto_scenario.py's dispatches per signature


@pytest.fixture(scope="module", params=CORES)
def seen(request: pytest.FixtureRequest) -> dict[str, Any]:
    """What ``auto_scenario`` observed on one core."""
    return run_scenario("tests.fake_driver.auto_scenario", request.param)


@pytest.mark.stand_in
@pytest.mark.nvrtc
@pytest.mark.parametrize("backend", ["lose", "lose_general"])
def test_where_graphs_lose_auto_settles_on_eager(seen: dict[str, Any], backend: str) -> None:
    lose = seen[backend]
    assert lose["right"]
    assert lose["resident_right"]
    scale = lose["choices"][0]
    assert scale["choice"] == "eager"
    assert scale["reason"].startswith("eager: a replay took ")
    assert (scale["eager"], scale["graph"]) == (SAMPLES, SAMPLES)
    assert lose["chose_eager"] == 1
    # Its graph was recorded once for the measurements, then freed.
    assert lose["captures"] == 1
    assert (lose["bytes"], lose["instances"]) == (0, 0)
    # Settled, every dispatch takes the fast path where the backend has one, else runs as a
    # plain dispatch: neither asks the graph cache any more.
    assert lose["fast_after"] == (ROUNDS if backend == "lose" else 0)
    assert lose["misses_after"] == 0


@pytest.mark.stand_in
@pytest.mark.nvrtc
@pytest.mark.parametrize("backend", ["win", "win_general"])
def test_where_graphs_win_auto_settles_on_graphs(seen: dict[str, Any], backend: str) -> None:
    win = seen[backend]
    assert win["right"]
    (scale,) = win["choices"]
    assert scale["choice"] == "graph"
    assert scale["reason"].startswith("graph: a replay took ")
    assert win["chose_graph"] == 1
    assert win["hits_after"] == ROUNDS  # every dispatch replays a graph
    assert win["updates"] == 1  # the new scalar: updated in place
    assert win["instances"] == 1


@pytest.mark.stand_in
@pytest.mark.nvrtc
def test_never_and_always_keep_their_meaning(seen: dict[str, Any]) -> None:
    assert seen["modes"] == {"always_hits": 2, "never_replays": 0}
    assert seen["cleared"] == []  # clear() forgets the choices
