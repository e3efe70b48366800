"""A device fault on a real GPU: every dispatch in flight fails, the backend refuses new work
and closes cleanly; then ``reset_device`` either brings the device back (a fresh backend
computes correctly) or says that only a new process can use it (what driver 580 does).

The fault runs in a child process (``_fault_child.py``): it ruins the context of the process
it happens in.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cuda

CHILD = Path(__file__).with_name("_fault_child.py")


def test_a_device_fault_fails_in_flight_work_and_says_how_to_recover() -> None:
    done = subprocess.run(
        [sys.executable, str(CHILD)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["before_ok"] is True
    # The faulting dispatch and the three long kernels in flight beside it all fail.
    assert report["in_flight"] == ["DeviceFaultError"] * 4, report
    assert report["fault_name"] == "CUDA_ERROR_ILLEGAL_ADDRESS", report
    assert report["failure"] == "DeviceFaultError"
    assert "failed" in report["repr"]
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in report["refused"], report
    assert "takes no new work" in report["refused"]
    assert report["closed"] == "ok", report
    print(report)  # which recovery this driver allows, for the run's log
    # Either the reset brought the device back and a fresh backend computes correctly, or the
    # driver keeps the process failed and reset_device says to restart the process.
    if report["after_ok"] is not True:
        assert report["after_ok"].startswith("DeviceFaultError("), report
        assert "restart the process" in report["after_ok"], report
