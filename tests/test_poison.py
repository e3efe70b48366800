"""A sticky CUDA fault poisons the process: every CUDA backend fails at once (``_poison``).

The registry's rules run here in-process; a real fault on one of two devices of the stand-in
driver, which poisons its process as the driver does, runs in a child process on both cores
(``tests/fake_driver/poison_scenario.py``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import asyncgraph as ag
from asyncgraph._runtime import _poison
from asyncgraph.pool import PinnedPool
from tests.fake_driver import run_scenario

from .needs import CORES


@pytest.fixture(autouse=True)
def healthy_process() -> Iterator[None]:
    """Each test starts and ends with the process's fault forgotten."""
    _poison.clear()
    yield
    _poison.clear()


class Member:
    """A stand-in for a CUDA device: counts how it was failed."""

    def __init__(self) -> None:
        self.errors: list[ag.DeviceFaultError] = []

    def fail(self, error: ag.DeviceFaultError) -> None:
        self.errors.append(error)


def _fault(call: str = "cuEventQuery") -> ag.DeviceFaultError:
    return ag.DeviceFaultError(700, "CUDA_ERROR_ILLEGAL_ADDRESS", call)


def test_the_first_fault_fails_every_member_once_and_wins() -> None:
    members = [Member() for _ in range(3)]
    for member in members:
        _poison.join(member)
    first, second = _fault(), _fault("cuMemAlloc")
    fault = _poison.record(first, "cuda:1")
    again = _poison.record(second, "cuda:0")
    assert again is fault
    assert ag.process_fault() is fault
    assert fault.error is first
    assert fault.device == "cuda:1"
    assert all(m.errors == [first] for m in members)
    assert re.fullmatch(
        r"CUDA_ERROR_ILLEGAL_ADDRESS in cuEventQuery, first seen on cuda:1 at "
        r"\d\d:\d\d:\d\d\.\d{3} UTC",
        fault.describe(),
    )


def test_a_first_fault_without_a_device_takes_the_first_that_names_one() -> None:
    _poison.record(_fault())
    assert ag.process_fault() is not None
    assert ag.process_fault().device is None  # type: ignore[union-attr]
    _poison.record(_fault(), "cuda:0")
    _poison.record(_fault(), "cuda:1")
    assert ag.process_fault().device == "cuda:0"  # type: ignore[union-attr]


def test_a_member_joining_a_poisoned_process_is_refused() -> None:
    _poison.record(_fault(), "cuda:1")
    member = Member()
    with pytest.raises(
        ag.DeviceFaultError,
        match=r"^open_backend failed with CUDA_ERROR_ILLEGAL_ADDRESS \(700\): no CUDA backend "
        r"opens in this process any more: a sticky CUDA fault \(CUDA_ERROR_ILLEGAL_ADDRESS in "
        r"cuEventQuery, first seen on cuda:1 at .*\) fails every CUDA backend of this process; "
        r"restart the process",
    ):
        _poison.join(member)
    _poison.record(_fault())
    assert member.errors == []  # never registered


def test_members_of_many_threads_are_failed_once() -> None:
    members = [Member() for _ in range(50)]
    for member in members:
        _poison.join(member)
    errors = [_fault() for _ in range(8)]
    threads = [threading.Thread(target=_poison.record, args=(e, "cuda:0")) for e in errors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first = ag.process_fault()
    assert first is not None
    assert all(m.errors == [first.error] for m in members)


def test_a_destroyed_context_is_sticky_but_poisons_nothing() -> None:
    from asyncgraph._cuda.driver._driver import error_for

    error = error_for(709, "cuEventQuery")
    assert isinstance(error, ag.DeviceFaultError)
    assert ag.process_fault() is None
    assert isinstance(error_for(700, "cuEventQuery"), ag.DeviceFaultError)
    assert ag.process_fault() is not None


def test_an_ordinary_error_poisons_nothing() -> None:
    from asyncgraph._cuda.driver._driver import error_for

    error = error_for(2, "cuMemAlloc")
    assert not isinstance(error, ag.DeviceFaultError)
    assert ag.process_fault() is None


def test_the_sticky_codes_are_the_drivers() -> None:
    from cuda.bindings import driver as drv

    for name, code in _poison.STICKY_CODES.items():
        assert int(getattr(drv.CUresult, name)) == code, name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access", "CUDA_ERROR_ILLEGAL_ADDRESS"),
        ("cuMemHostAlloc: CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_LAUNCH_FAILED"),
        ("CUDA_ERROR_OUT_OF_MEMORY: out of memory", None),
        ("something else", None),
    ],
)
def test_a_driver_failure_names_its_fault(text: str, expected: str | None) -> None:
    fault = _poison.fault_from(RuntimeError(text), "cuMemHostAlloc")
    if expected is None:
        assert fault is None
        assert ag.process_fault() is None
    else:
        assert isinstance(fault, ag.DeviceFaultError)
        assert fault.name == expected
        assert fault.call == "cuMemHostAlloc"
        assert ag.process_fault() is not None


def test_in_a_poisoned_process_any_driver_failure_is_the_fault() -> None:
    _poison.record(_fault(), "cuda:1")
    fault = _poison.fault_from(RuntimeError("CUDA_ERROR_OUT_OF_MEMORY"), "cuMemHostAlloc")
    assert isinstance(fault, ag.DeviceFaultError)
    assert "cuMemHostAlloc failed: a sticky CUDA fault" in str(fault)


def _failing_allocator(text: str) -> Any:
    def allocate(nbytes: int) -> tuple[Any, int]:
        raise RuntimeError(text)

    return allocate


def test_the_pinned_pool_reports_a_fault_not_exhaustion() -> None:
    pool = PinnedPool(1 << 20, allocate=_failing_allocator("CUDA_ERROR_ILLEGAL_ADDRESS"))
    with pytest.raises(ag.DeviceFaultError, match=r"CUDA_ERROR_ILLEGAL_ADDRESS"):
        pool.acquire(4096)
    # Once poisoned, even a failure that names no fault is the fault's.
    other = PinnedPool(1 << 20, allocate=_failing_allocator("no memory"))
    with pytest.raises(ag.DeviceFaultError, match=r"a sticky CUDA fault"):
        other.acquire(4096)


def test_the_pinned_pool_still_reports_exhaustion_in_a_healthy_process() -> None:
    pool = PinnedPool(1 << 20, allocate=_failing_allocator("CUDA_ERROR_OUT_OF_MEMORY"))
    with pytest.raises(ag.AllocationError, match=r"^could not allocate 4096 bytes of pinned"):
        pool.acquire(4096)


def test_a_poisoned_process_frees_no_pinned_block() -> None:
    closed: list[int] = []

    class Owner:
        def close(self) -> None:
            closed.append(1)

    import numpy as np

    memory = np.zeros(8192, np.uint8)
    pool = PinnedPool(0, allocate=lambda n: (Owner(), memory.ctypes.data))
    block = pool.acquire(4096)
    _poison.record(_fault(), "cuda:0")
    pool.release(block)  # over the cap: freed, were the process healthy
    PinnedPool.wait_freed().result()
    assert closed == []


@pytest.mark.stand_in
@pytest.mark.nvrtc
@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("faulty", [0, 1])
def test_a_fault_on_one_gpu_fails_every_cuda_backend(core: str, faulty: int) -> None:
    """Two devices of the stand-in and the host in a group: device *faulty* faults. Both CUDA
    members fail at once, refuse work at the call with nothing launched, the host member serves
    the group, backends opened on their own fail too, and nothing warns."""
    seen = run_scenario("tests.fake_driver.poison_scenario", core, str(faulty))
    group, own = seen["group"], seen["own"]
    other = f"cuda:{1 - faulty}"
    # Before the fault: peer access both ways, each pool granted to the other device once.
    assert [0, 1, "peer"] in group["routes"]
    assert [1, 0, "peer"] in group["routes"]
    assert [0, 2, "host"] in group["routes"]
    assert group["pool_grants"] == 2
    assert group["peer_copy_right"] is True
    # The fault fails both CUDA members at once, not the host one.
    assert group["fault"] == "DeviceFaultError"
    assert group["failed_at_once"] == [True, True, False]
    assert group["process_fault"] == [f"cuda:{faulty}", "CUDA_ERROR_ILLEGAL_ADDRESS"]
    for refused, count in ((group["other_refuses"], 100), (group["faulty_refuses"], 3)):
        assert refused["kinds"] == {"DeviceFaultError": count}
        assert refused["launched"] == 0
        (message,) = refused["messages"]
        assert "takes no new work: a sticky CUDA fault" in message
        assert f"first seen on cuda:{faulty}" in message
        assert "restart the process" in message
    assert group["group_after"] == {"ok": 100, "right": 100, "on_host": 100, "errors": []}
    assert [row[:2] for row in group["snapshot_failed"]] == [[0, "cuda:0"], [1, "cuda:1"]]
    assert group["snapshot_fault"] == f"cuda:{faulty}"
    # Backends opened on their own: the other one's next dispatch sees the fault first (its
    # copy fails), and from then on both are failed; nothing opens; pinned memory is the fault.
    assert own["first_after"] == ["awaited", "DeviceFaultError"]
    assert own["both_failed"] == [True, True]
    assert own["later"]["kinds"] == {"DeviceFaultError": 10}
    assert own["later"]["launched"] == 0
    assert own["open_after"][0] == "DeviceFaultError"
    assert "no CUDA backend opens in this process any more" in own["open_after"][1]
    assert own["pinned_after"] == "DeviceFaultError"
    assert own["process_fault"] == [other, "CUDA_ERROR_ILLEGAL_ADDRESS"]
    # One backend.failed event per backend, and nothing printed or warned at close.
    assert len(seen["failed_events"]) == 4
    assert seen["warnings"] == []
    assert "Warning" not in seen["stderr"], seen["stderr"][-2000:]
    assert "failed" not in seen["stderr"].lower(), seen["stderr"][-2000:]
