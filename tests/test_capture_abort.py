"""A capture that ends early frees the graph it captured into once, on the stand-in driver.

The capture builder captures into a graph of its own, which ending the capture hands back and
the builder's ``close()`` destroys. Aborting an active capture (an error inside ``async with
backend.capture()``) destroyed it a second time; a real driver does not say, the stand-in
counts it (``fake_refused_graph_destroys``). ``test_cuda_graphs.py`` runs the same captures on
a GPU.
"""

from __future__ import annotations

import pytest

from tests.fake_driver import run_scenario

from .needs import CORES


@pytest.mark.stand_in
@pytest.mark.nvrtc
@pytest.mark.parametrize("core", CORES)
def test_an_aborted_capture_destroys_its_graph_once(core: str) -> None:
    seen = run_scenario("tests.fake_driver.capture_scenario", core)
    assert seen["active_aborted"] is True
    assert seen["active_refused_destroys"] == 0
    assert seen["invalidated"] is True
    assert seen["live_graphs"] == 0  # every graph of the two captures is gone
    assert seen["usable"] is True
