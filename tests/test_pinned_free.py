"""A legacy pinned block is freed only once its device went idle (``pool/_legacy``), without a
GPU: the driver calls the wait makes are recorded in place of the driver's."""

from __future__ import annotations

from typing import Any

import pytest
from cuda.bindings import driver as drv

from asyncgraph.pool import _legacy
from asyncgraph.pool._legacy import LegacyPinned, settle

OK = drv.CUresult.CUDA_SUCCESS
FAILED = drv.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
RELAXED = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
GLOBAL = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL


class Driver:
    """Stands in for the driver calls :func:`settle` makes, recording them in order."""

    def __init__(self, active: bool = True, sync: Any = OK) -> None:
        self.calls: list[str] = []
        self.active = active
        self.sync = sync

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def record(name: str, result: tuple[Any, ...]) -> Any:
            def call(*args: Any) -> tuple[Any, ...]:
                self.calls.append(name)
                return result

            return call

        monkeypatch.setattr(drv, "cuDeviceGet", record("get", (OK, 0)))
        monkeypatch.setattr(
            drv, "cuDevicePrimaryCtxGetState", record("state", (OK, 0, int(self.active)))
        )
        monkeypatch.setattr(drv, "cuDevicePrimaryCtxRetain", record("retain", (OK, object())))
        monkeypatch.setattr(drv, "cuCtxPushCurrent", record("push", (OK,)))
        monkeypatch.setattr(drv, "cuCtxPopCurrent", record("pop", (OK, object())))
        monkeypatch.setattr(drv, "cuCtxSynchronize", record("sync", (self.sync,)))
        monkeypatch.setattr(drv, "cuDevicePrimaryCtxRelease", record("release", (OK,)))
        previous = iter([(OK, GLOBAL), (OK, RELAXED)])

        def exchange(mode: Any) -> tuple[Any, ...]:
            self.calls.append(f"exchange to {mode.name}")
            return next(previous)

        monkeypatch.setattr(drv, "cuThreadExchangeStreamCaptureMode", exchange)


class Buffer:
    size = 4096

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def close(self) -> None:
        self.calls.append("free")


def test_a_block_is_freed_after_its_device_synchronized(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = Driver()
    driver.install(monkeypatch)
    owner = LegacyPinned(Buffer(driver.calls), 0)
    owner.close()
    assert driver.calls == [
        "get",
        "state",
        "retain",
        "push",
        "exchange to CU_STREAM_CAPTURE_MODE_RELAXED",  # never invalidates another's capture
        "sync",
        "exchange to CU_STREAM_CAPTURE_MODE_GLOBAL",  # the thread's own mode, back
        "pop",
        "release",
        "free",
    ]
    assert owner.size == 4096  # what a faulted device's abandon reports


def test_a_failed_wait_leaves_the_thread_as_it_was_and_the_free_goes_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = Driver(sync=FAILED)
    driver.install(monkeypatch)
    LegacyPinned(Buffer(driver.calls), 0).close()  # raises nothing: the free reports the error
    assert driver.calls[-5:] == [
        "sync",
        "exchange to CU_STREAM_CAPTURE_MODE_GLOBAL",
        "pop",
        "release",
        "free",
    ]


def test_nothing_is_waited_for_without_a_device_or_an_active_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = Driver(active=False)
    driver.install(monkeypatch)
    settle(-1)  # allocated with no context current
    assert driver.calls == []
    settle(0)  # the primary context is not active: nothing runs on it
    assert driver.calls == ["get", "state"]


def test_the_allocator_records_the_device_current_at_allocation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Resource:
        def allocate(self, nbytes: int) -> Any:
            buffer = Buffer([])
            buffer.size = nbytes
            buffer.handle = 0x1000  # type: ignore[attr-defined]
            return buffer

    import cuda.core

    monkeypatch.setattr(cuda.core, "LegacyPinnedMemoryResource", Resource)
    monkeypatch.setattr(drv, "cuCtxGetDevice", lambda: (OK, 3))
    owner, ptr = _legacy.legacy_pinned_allocator()(8192)
    assert (owner.device, owner.size, ptr) == (3, 8192, 0x1000)
    monkeypatch.setattr(drv, "cuCtxGetDevice", lambda: (drv.CUresult.CUDA_ERROR_INVALID_CONTEXT, 0))
    owner, _ = _legacy.legacy_pinned_allocator()(8192)
    assert owner.device == -1  # no context current: nothing to wait for at the free
