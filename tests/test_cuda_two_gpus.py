"""Two GPUs of one host: peer copies with access to each other's memory pools, and a sticky
fault on either GPU failing every CUDA backend of the process at once.

Skipped, with the reason, on a machine with fewer than two GPUs. The stand-in driver runs the
same paths with two devices in CI (``test_poison.py``, ``test_copy.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._opening._detect import probe_cuda

from .kernels import INC

pytestmark = pytest.mark.cuda

CHILD = Path(__file__).with_name("_poison_child.py")


def _gpus() -> int:
    probe = probe_cuda()
    return len(probe.devices) if probe.available else 0


needs_two = pytest.mark.skipif(_gpus() < 2, reason=f"needs two GPUs, found {_gpus()}")


@pytest.fixture
async def pair() -> AsyncIterator[ag.DeviceGroup]:
    async with ag.open_group(["cuda:0", "cuda:1"]) as group:
        await group.compile(INC)
        yield group


@needs_two
async def test_copies_between_the_gpus_go_peer_to_peer_and_are_right(
    pair: ag.DeviceGroup,
    rng: np.random.Generator,
) -> None:
    from cuda.bindings import driver as drv

    can = drv.cuDeviceCanAccessPeer(0, 1)[1] and drv.cuDeviceCanAccessPeer(1, 0)[1]
    routes = {(a, b): route for a, b, route in pair.snapshot().copy_routes}
    assert routes == {(0, 1): "peer" if can else "staged", (1, 0): "peer" if can else "staged"}
    for nbytes in (4096, 64 << 20):
        x = rng.standard_normal(nbytes // 4, dtype=np.float32)
        source = await pair.upload(x, 0)
        n = x.size
        pending = pair.dispatch(
            INC, source, np.float32(1), np.int32(n), grid=(n + 255) // 256, block=256
        )  # in flight while the copy is enqueued: the copy reads what it wrote
        there = await pair.copy_to(source, 1)
        await pending
        back = await pair.copy_to(there, 0)
        np.testing.assert_array_equal(await pair.download(there), x + np.float32(1))
        np.testing.assert_array_equal(await pair.download(back), x + np.float32(1))
        for buffer in (source, there, back):
            await buffer.aclose()


def _child(mode: str, faulty: int) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, str(CHILD), mode, str(faulty)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report, done.stderr


def _quiet(report: dict[str, Any], stderr: str) -> None:
    assert report["warnings"] == [], report["warnings"]
    for text in ("Warning", "failed during", "mr.deallocate() failed", "cuMemFreeAsync failed"):
        assert text not in stderr, stderr[-4000:]


@needs_two
@pytest.mark.parametrize("faulty", [0, 1])
def test_a_fault_on_either_gpu_fails_both_and_the_host_member_serves(faulty: int) -> None:
    report, stderr = _child("group", faulty)
    assert report["before_ok_0"] is True
    assert report["before_ok_1"] is True
    assert report["fault"][0] == "DeviceFaultError", report
    assert report["failed_at_once"] == [True, True, False], report
    assert report["process_fault"] == [f"cuda:{faulty}", "CUDA_ERROR_ILLEGAL_ADDRESS"], report
    other = report["other"]
    assert other["kinds"] == {"at the call: DeviceFaultError": 100}, other
    assert other["queued"] == 0, other
    (message,) = other["messages"]
    assert f"first seen on cuda:{faulty}" in message, message
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in message
    assert report["group_errors"] == [], report
    assert report["on_host"] == 100, report
    assert report["host_ok"] is True
    assert report["failed"] == [[0, "cuda:0"], [1, "cuda:1"]], report
    _quiet(report, stderr)


@needs_two
@pytest.mark.parametrize("faulty", [0, 1])
def test_a_fault_fails_a_backend_opened_on_its_own_on_the_other_gpu(faulty: int) -> None:
    report, stderr = _child("own", faulty)
    assert report["fault"] == "DeviceFaultError", report
    assert report["failed_at_once"] == [True, True], report
    assert report["other"]["kinds"] == {"at the call: DeviceFaultError": 100}, report
    assert report["other"]["queued"] == 0, report
    assert report["open_after"] == "DeviceFaultError", report
    _quiet(report, stderr)
