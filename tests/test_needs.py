"""The switches that turn the suite's own skips into failures (``tests/needs.py``)."""

from __future__ import annotations

import pytest

from . import needs


def test_a_missing_need_skips_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASYNCGRAPH_REQUIRE_NVRTC", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^no NVRTC; pip install it$"):
        needs.missing("no NVRTC; pip install it", "ASYNCGRAPH_REQUIRE_NVRTC")


@pytest.mark.parametrize("value", ["1", "yes"])
def test_with_its_switch_set_it_fails_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("ASYNCGRAPH_REQUIRE_NVRTC", value)
    with pytest.raises(
        pytest.fail.Exception,
        match=r"^no NVRTC; pip install it \(ASYNCGRAPH_REQUIRE_NVRTC is set: a failure\)$",
    ):
        needs.missing("no NVRTC; pip install it", "ASYNCGRAPH_REQUIRE_NVRTC")


@pytest.mark.parametrize("value", ["", "0", " 0 "])
def test_a_switch_of_zero_or_nothing_is_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ASYNCGRAPH_REQUIRE_STAND_IN", value)
    assert not needs.switched_on("ASYNCGRAPH_REQUIRE_STAND_IN")


def test_every_marker_has_a_switch_and_an_answer() -> None:
    assert set(needs.SWITCHES) == {"stand_in", "nvrtc", "compiled"}
    for marker in needs.SWITCHES:
        reason = needs.unmet(marker)
        assert reason is None or "needs" in reason or "compiled dispatch core" in reason
