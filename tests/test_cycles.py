"""Nothing the dispatch paths make waits for the cycle collector, on each core, over the
stand-in driver (``tests/fake_driver/cycles_scenario.py``, in a child process).

A completion callback that its watch holds, and that holds the watch, keeps the job (and its
result's pinned block) alive until the collector runs: each large result then allocates a new
pinned block, and the collector later frees the old ones from the pool's thread, where a
pinned free waits for the device.
"""

from __future__ import annotations

import pytest

from tests.fake_driver import run_scenario
from tests.needs import CORES

pytestmark = [pytest.mark.stand_in, pytest.mark.nvrtc]


@pytest.mark.parametrize("streams", ["immediate", "deferred"])
@pytest.mark.parametrize("core", CORES)
def test_the_dispatch_paths_leave_nothing_to_the_collector(core: str, streams: str) -> None:
    seen = run_scenario("tests.fake_driver.cycles_scenario", core, streams=streams, timeout=120)
    assert seen["compiled"] == (core == "compiled")
    assert seen["garbage"] == {}, "freed only by the cycle collector"
    # A dropped large result gave its pinned block back at once, for the next one to take.
    assert seen["big_results_misses"] == 0
