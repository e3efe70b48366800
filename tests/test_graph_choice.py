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
from asyncgraph.capture._choice import (
    BLOCK,
    GRAPH_GAIN,
    REMEASURE_AFTER,
    REMEASURE_FIRST,
    REMEASURE_MAX,
    REPLAYS_TOLD_EVERY,
    SAMPLES,
    Choice,
    ChoiceState,
)
from tests.fake_driver import run_scenario

from .needs import CORES

US = 1e-6


def _choice(settled: list[Choice] | None = None, samples: int = 3, block: int = 3) -> Choice:
    told = settled if settled is not None else []
    return Choice(
        "k(float32[4]) grid (1, 1, 1) block (4, 1, 1)", told.append, samples, block, REPLAYS
    )


REPLAYS = 10  # replays, once settled on graphs, before measuring again (in these tests)


def _state(choice: Choice) -> ChoiceState:
    """*choice*'s state, read afresh (not narrowed by an earlier assertion)."""
    return choice.state


def _measure(choice: Choice, eager_us: float, graph_us: float) -> list[str]:
    """Feed *choice* the cost of the way it asks for until it settles; the ways asked."""
    ways = []
    while choice.state is ChoiceState.MEASURING:
        assert choice.sampling
        ways.append("eager" if choice.eager else "graph")
        choice.took(choice.eager, (eager_us if choice.eager else graph_us) * US)
        assert len(ways) < 100
    return ways


def test_it_measures_in_blocks_eager_first_each_after_one_not_counted() -> None:
    choice = _choice(samples=4, block=2)
    ways = _measure(choice, 30, 10)
    assert ways == (["eager"] * 3 + ["graph"] * 3) * 2
    stats = choice.statistics()
    assert (stats.eager_samples, stats.graph_samples) == (4, 4)


def test_the_first_of_each_block_is_not_counted() -> None:
    choice = _choice(samples=2, block=2)
    for eager, us in ((True, 900), (True, 30), (True, 30), (False, 900), (False, 10)):
        choice.took(eager, us * US)
    assert choice.state is ChoiceState.MEASURING
    choice.took(False, 10 * US)
    assert _state(choice) is ChoiceState.GRAPH
    eager_s, graph_s = choice.medians()
    assert eager_s == pytest.approx(30 * US)
    assert graph_s == pytest.approx(10 * US)


def test_it_settles_on_graphs_where_they_save_enough() -> None:
    settled: list[Choice] = []
    choice = _choice(settled)
    for us in (0, 30, 31, 29):  # the first of the block is not counted
        choice.took(True, us * US)
    for us in (0, 10, 11, 500):  # one slow replay: the median
        choice.took(False, us * US)
    assert settled == [choice]
    assert choice.state is ChoiceState.GRAPH
    assert (choice.eager, choice.sampling) == (False, False)
    stats = choice.statistics()
    assert isinstance(stats, GraphChoiceStatistics)
    assert stats.choice == "graph"
    assert stats.eager_seconds == pytest.approx(30 * US)
    assert stats.graph_seconds == pytest.approx(11 * US)
    assert (stats.eager_samples, stats.graph_samples, stats.remeasured) == (3, 3, 0)
    assert stats.reason == (
        "graph: a replay took 11.0 µs, an eager dispatch 30.0 µs (medians of 3 and 3)"
    )


@pytest.mark.parametrize("graph_us", [100.0, 100.0 * GRAPH_GAIN + 0.5])
def test_it_settles_on_eager_where_graphs_save_too_little(graph_us: float) -> None:
    settled: list[Choice] = []
    choice = _choice(settled)
    _measure(choice, 100, graph_us)
    assert settled == [choice]
    assert choice.state is ChoiceState.EAGER
    assert (choice.eager, choice.sampling) == (True, False)
    assert choice.reason.startswith(f"eager: a replay took {graph_us:.1f} µs, an eager")
    assert choice.reason.endswith("; a graph must save 10% to be kept")


def test_graphs_saving_just_enough_are_kept() -> None:
    choice = _choice()
    _measure(choice, 100, 100 * GRAPH_GAIN)
    assert choice.state is ChoiceState.GRAPH


def test_late_and_surplus_samples_change_nothing() -> None:
    settled: list[Choice] = []
    choice = _choice(settled)
    for _ in range(6):  # dispatches in flight together: more eager samples than needed
        choice.took(True, 10 * US)
    assert choice.statistics().eager_samples == 3
    assert not choice.eager  # the replays are measured next
    choice.took(True, 1000 * US)  # an eager one still in flight: not the replays' turn
    for _ in range(4):
        choice.took(False, 1 * US)
    assert choice.state is ChoiceState.GRAPH
    choice.took(True, 1 * US)  # a sample still in flight when it settled
    choice.took(False, 1000 * US)
    assert settled == [choice]
    assert choice.statistics().graph_seconds == pytest.approx(1 * US)
    assert choice.statistics().eager_seconds == pytest.approx(10 * US)


def test_a_choice_of_graphs_is_measured_again_after_its_replays() -> None:
    settled: list[Choice] = []
    choice = _choice(settled)
    _measure(choice, 30, 10)
    assert choice.state is ChoiceState.GRAPH
    for _ in range(REPLAYS - 1):
        choice.replayed()
    assert choice.state is ChoiceState.GRAPH
    choice.replayed()
    # Measured again from scratch, eager first.
    assert _state(choice) is ChoiceState.MEASURING
    assert (choice.eager, choice.sampling) == (True, True)
    assert choice.reason == "measuring again (1x): 0 of 3 eager samples, 0 of 3 replays"
    assert choice.statistics().remeasured == 1
    assert choice.medians() == (None, None)
    choice.replayed()  # a replay in flight: measuring already, nothing changes
    # This time the graphs lose: it settles on eager (the cache then frees them).
    _measure(choice, 30, 40)
    assert settled == [choice, choice]
    assert _state(choice) is ChoiceState.EAGER
    assert choice.reason == (
        "eager: a replay took 40.0 µs, an eager dispatch 30.0 µs (medians of 3 and 3; "
        "measured again 1x); a graph must save 10% to be kept"
    )
    for _ in range(3 * REPLAYS):  # settled on eager: no more measuring
        choice.replayed()
    assert _state(choice) is ChoiceState.EAGER


def test_each_time_graphs_win_again_the_next_measure_waits_twice_as_long() -> None:
    choice = _choice()
    _measure(choice, 30, 10)
    waits = []
    for _ in range(4):
        replays = 0
        while choice.state is ChoiceState.GRAPH:
            choice.replayed()
            replays += 1
        waits.append(replays)
        _measure(choice, 30, 10)
    assert waits == [REPLAYS, 2 * REPLAYS, 4 * REPLAYS, 8 * REPLAYS]
    assert choice.statistics().remeasured == 4


def test_the_wait_before_measuring_again_is_bounded() -> None:
    choice = Choice("k() grid (1, 1, 1) block (1, 1, 1)", lambda _c: None, 1, 1, REMEASURE_MAX)
    _measure(choice, 30, 10)
    for _ in range(REMEASURE_MAX):
        choice.replayed()
    assert choice.state is ChoiceState.MEASURING
    _measure(choice, 30, 10)
    for _ in range(REMEASURE_MAX):
        choice.replayed()
    assert choice.state is ChoiceState.MEASURING  # REMEASURE_MAX again, not twice it


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
    _measure(choice, 100, 200)
    assert choice.eager
    choice.forget()
    assert choice.state is ChoiceState.FORGOTTEN
    assert (choice.eager, choice.sampling) == (False, False)


def test_the_measuring_reason_counts_the_samples() -> None:
    choice = Choice("k() grid (1, 1, 1) block (1, 1, 1)", lambda _c: None)
    choice.took(True, 1 * US)  # the first of the block: not counted
    choice.took(True, 1 * US)
    assert choice.reason == f"measuring: 1 of {SAMPLES} eager samples, 0 of {SAMPLES} replays"
    assert choice.statistics().choice == "measuring"


def test_the_defaults_take_turns_and_measure_again_rarely() -> None:
    assert SAMPLES % BLOCK == 0
    assert SAMPLES >= 2 * BLOCK  # at least two turns of each way
    measured = 2 * SAMPLES + 2 * (SAMPLES // BLOCK)  # dispatches of one measurement
    assert measured < 0.05 * REMEASURE_AFTER  # measuring again costs little beside the replays
    assert measured < 0.5 * REMEASURE_FIRST  # once, soon after the first choice
    assert REMEASURE_FIRST < REMEASURE_AFTER < REMEASURE_MAX
    # The fast path's bulk count meets both.
    assert REMEASURE_FIRST % REPLAYS_TOLD_EVERY == 0
    assert REMEASURE_AFTER % REPLAYS_TOLD_EVERY == 0


def test_a_first_choice_of_graphs_is_checked_soon_then_rarely() -> None:
    # The first samples come while the signature is new: a choice of graphs made on them is
    # measured again after REMEASURE_FIRST replays, then after REMEASURE_AFTER, doubling.
    choice = Choice("k() grid (1, 1, 1) block (1, 1, 1)", lambda _c: None, 1, 1)
    waits = []
    for _ in range(4):
        _measure(choice, 30, 10)
        replays = 0
        while choice.state is ChoiceState.GRAPH:
            choice.replayed(REPLAYS_TOLD_EVERY)  # as the fast path tells them
            replays += REPLAYS_TOLD_EVERY
        waits.append(replays)
    assert waits == [REMEASURE_FIRST, REMEASURE_AFTER, 2 * REMEASURE_AFTER, 4 * REMEASURE_AFTER]
    # A choice of graphs that the first check finds wrong goes eager there.
    choice = Choice("k() grid (1, 1, 1) block (1, 1, 1)", lambda _c: None, 1, 1)
    _measure(choice, 30, 10)
    choice.replayed(REMEASURE_FIRST)
    _measure(choice, 10, 30)
    assert choice.state is ChoiceState.EAGER
    assert choice.reason.endswith("measured again 1x); a graph must save 10% to be kept")


def test_replays_told_in_bulk_count_as_many() -> None:
    choice = _choice()
    _measure(choice, 30, 10)
    choice.replayed(REPLAYS - 1)
    assert choice.state is ChoiceState.GRAPH
    choice.replayed(1)
    assert _state(choice) is ChoiceState.MEASURING


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
    # Settled, every dispatch takes the fast path where the backend has one (the compiled
    # core's), else runs as a plain dispatch: neither asks the graph cache any more.
    fast = backend == "lose" and seen["compiled"]
    assert lose["fast_after"] == (ROUNDS if fast else 0)
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
@pytest.mark.parametrize("backend", ["win_lose", "win_lose_general", "always_win_lose"])
def test_a_choice_of_graphs_that_turn_dearer_goes_eager_when_measured_again(
    seen: dict[str, Any], backend: str
) -> None:
    seen_ = seen[backend]
    assert seen_["right"]
    (won,) = seen_["won"]
    assert (won["choice"], won["remeasured"]) == ("graph", 0)
    (scale,) = seen_["choices"]
    assert (scale["choice"], scale["remeasured"]) == ("eager", 1)
    assert scale["reason"].startswith("eager: a replay took ")
    assert "measured again 1x" in scale["reason"]
    # Measured again once the graphs had been replayed REMEASURE_FIRST times (some of them in
    # the first ROUNDS, after the first measurement; the dispatches counted in rounds).
    assert REMEASURE_FIRST - ROUNDS <= seen_["rounds"] <= REMEASURE_FIRST + ROUNDS
    assert seen_["hits"] >= REMEASURE_FIRST
    assert (seen_["bytes"], seen_["instances"]) == (0, 0)  # its graphs freed
    fast = backend != "win_lose_general" and seen["compiled"]
    assert seen_["fast_after"] == (ROUNDS if fast else 0)


@pytest.mark.stand_in
@pytest.mark.nvrtc
def test_never_and_always_keep_their_meaning(seen: dict[str, Any]) -> None:
    assert seen["modes"] == {"always_hits": 2, "never_replays": 0}
    assert seen["cleared"] == []  # clear() forgets the choices
