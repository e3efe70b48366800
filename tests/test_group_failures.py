"""A member that failed or was closed takes no more of the group's work; the others go on.

On host backends a member is taken out by closing it; a real device fault of a CUDA member
beside a host one runs against the stand-in driver (``tests/fake_driver/group_scenario.py``),
so it runs without a GPU too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

import asyncgraph as ag
from tests.fake_driver import run_scenario

from .kernels import SCALE

N = 256


@pytest.fixture
async def group() -> AsyncIterator[ag.DeviceGroup]:
    async with ag.open_group(["host", "host", "host"]) as g:
        yield g


def _scale(group: ag.DeviceGroup, x: object) -> ag.PendingDispatch:
    return group.dispatch(
        SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=1, block=N
    )


async def test_a_closed_member_gets_no_more_work(group: ag.DeviceGroup) -> None:
    x = np.random.default_rng().standard_normal(N, dtype=np.float32)
    await group[1].aclose()
    for _ in range(30):
        (out,) = await _scale(group, x)
        np.testing.assert_array_equal(out, 2 * x)
    counts = [m.telemetry.snapshot().dispatches for m in group]
    assert counts[1] == 0
    assert counts[0] + counts[2] == 30
    assert min(counts[0], counts[2]) >= 10  # the others still take turns
    assert group.snapshot().failed == ((1, "host", "closed"),)


async def test_the_group_refuses_work_only_when_no_member_is_left(group: ag.DeviceGroup) -> None:
    x = np.random.default_rng().standard_normal(N, dtype=np.float32)
    await group[0].aclose()
    await group[2].aclose()
    (out,) = await _scale(group, x)  # member 1 is left
    np.testing.assert_array_equal(out, 2 * x)
    await group[1].aclose()
    with pytest.raises(ag.GroupError, match=r"no member of the group can take work: host: closed"):
        _scale(group, x)
    with pytest.raises(ag.GroupError, match="no member"):
        await group.replicate(x)
    assert [i for i, _, _ in group.snapshot().failed] == [0, 1, 2]


async def test_a_replicated_array_skips_a_member_that_was_out(group: ag.DeviceGroup) -> None:
    x = np.random.default_rng().standard_normal(N, dtype=np.float32)
    await group[2].aclose()
    replicated = await group.replicate(x)
    assert replicated.buffers[2] is None
    assert [b is not None for b in replicated.buffers] == [True, True, False]
    with pytest.raises(ag.GroupError, match="no copy"):
        replicated.on(group[2])
    for _ in range(6):
        (out,) = await _scale(group, replicated)
        np.testing.assert_array_equal(out, 2 * x)
    await replicated.aclose()
    assert all(b is None or b.is_closed for b in replicated.buffers)


def test_a_device_fault_stays_with_its_member() -> None:
    """``open_group(["cuda", "host"])`` on the stand-in driver: a kernel faults on the CUDA
    member; the next 100 dispatches of the group all run, on the host member."""
    seen = run_scenario("tests.fake_driver.group_scenario", "python")
    assert seen["fault"] == "DeviceFaultError"
    assert seen["after"] == {"ok": 100, "right": 100, "on_host": 100}
    assert seen["resident_on_failed"] == "DeviceFaultError"
    assert seen["replicated"] == {"ok": 10, "right": 10}
    assert seen["failed"] == [[0, "cuda:0"]]
    assert "illegal" in seen["why"].lower() or "700" in seen["why"]
    assert seen["closed"] is True
    assert seen["shared_pool"] is True  # the group's one pinned pool, its cap counted once
    assert seen["pool_after_close"] is None
    assert seen["given_pool_idle_after_close"] > 0  # left open, its blocks cached
    assert seen["given_pool_idle_after_its_close"] == 0


def test_a_failed_backend_lets_go_of_its_memory_quietly() -> None:
    """After a device fault every free fails, and cuda.core warned once per buffer (150 lines
    for 150 resident buffers); now the backend logs one event and nothing else is printed."""
    seen = run_scenario("tests.fake_driver.fault_close", "python")
    assert seen["fault"] == "DeviceFaultError"
    assert seen["abandoned_events"] == 1
    assert seen["device_buffers"] >= 150  # the resident buffers, and the lanes' scratch
    assert seen["bytes"] >= 150 * 4096
    assert "Warning" not in seen["stderr"], seen["stderr"][-2000:]
    assert "failed" not in seen["stderr"].lower(), seen["stderr"][-2000:]
