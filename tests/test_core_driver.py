"""Both dispatch cores against a stand-in CUDA driver (``tests/fake_driver``), no GPU needed.

The stand-in is a small C library built here with the machine's C compiler and loaded as
``libcuda.so.1`` by a child process; its events complete when a test says so. The compiled
core's launches, event records and queries, and both kinds of waiter threads waking asyncio,
uvloop and trio, run for real against it. (The CUDA suite checks the same on a GPU.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fake_driver import environment

from .needs import CORES, stand_in

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.stand_in


@pytest.fixture(scope="module")
def fake_driver() -> Path:
    """A directory holding the stand-in ``libcuda.so.1``."""
    return stand_in()


def _run(fake_driver: Path, core: str, scenario: str) -> dict[str, Any]:
    env = environment(fake_driver, core, complete="manual")
    result = subprocess.run(
        [sys.executable, "-m", "tests.fake_driver.scenario", scenario],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    observed: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    assert observed["compiled"] is (core == "compiled")
    return observed


@pytest.mark.parametrize("core", CORES)
def test_a_launch_passes_the_driver_the_packed_arguments(fake_driver: Path, core: str) -> None:
    seen = _run(fake_driver, core, "launch")
    assert seen["code"] == 0
    assert seen["launches"] == 1
    assert seen["dims"] == [3, 2, 1, 128, 1, 1, 1024]
    assert seen["stream"] == 0x1234
    assert seen["pointer"] == (1 << 33) + 512
    assert seen["a"] == 2.5
    assert seen["n"] == -7
    assert seen["m"] == 1 << 40


@pytest.mark.parametrize("loop", ["asyncio", "uvloop", "trio"])
@pytest.mark.parametrize("core", CORES)
def test_waiters_wake_a_sleeping_loop(fake_driver: Path, core: str, loop: str) -> None:
    if loop != "asyncio":
        pytest.importorskip(loop)
    seen = _run(fake_driver, core, f"wake_{loop}")
    # Each lane's watches complete in order, all of them, without an error.
    for lane in (0, 1):
        assert [i for ln, i, _ in seen["done"] if ln == lane] == [0, 1, 2]
    assert all(error is None for _, _, error in seen["done"])
    assert seen["handoffs"] >= 2  # both lanes went to their waiters while the loop slept
    # Native waiters are no Python threads; the Python core's are.
    assert (seen["python_waiters"] == 0) is (core == "compiled")
    assert seen["errors"] == ["DeviceFaultError", "DeviceFaultError"]
    assert seen["faults"] == ["DeviceFaultError"]
    assert seen["python_waiters_after_close"] == 0
    # Every completed event went back to its pool (after the fault the context is lost, and
    # the failed ones are not reused).
    assert seen["events_back"] == 6


@pytest.mark.parametrize("core", CORES)
def test_a_loop_without_add_reader_gets_python_waiters(fake_driver: Path, core: str) -> None:
    seen = _run(fake_driver, core, "wake_no_reader")
    assert len(seen["done"]) == 6
    assert all(error is None for _, _, error in seen["done"])
    assert seen["handoffs"] >= 2
    assert seen["python_waiters"] >= 1  # on either core: the loop cannot watch the eventfd
    assert seen["python_waiters_after_close"] == 0


@pytest.mark.parametrize("core", CORES)
def test_a_wait_outlives_its_loop(fake_driver: Path, core: str) -> None:
    seen = _run(fake_driver, core, "closed_loop")
    assert seen["handoffs"] == 1
    assert seen["ran"] == 1
    assert seen["events_back"] == 1
