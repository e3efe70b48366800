"""``reset_device`` refuses a bad ordinal before it asks the driver, and says plainly that there
is no GPU to reset where there is no driver or no such device.

The no-driver case runs in a child process on this machine's own driver search (skipped where a
CUDA driver library is installed); the stand-in driver (``tests/fake_driver``) stands for a
driver with no device, or with fewer devices than asked for.
"""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import asyncgraph as ag
from tests.fake_driver import build, environment

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("device", ["x", "0", 1.0, None, True, [0]])
def test_a_device_that_is_not_an_ordinal_is_refused(device: object) -> None:
    with pytest.raises(
        ag.ArgumentTypeError,
        match=rf"^reset_device\(device={re.escape(repr(device))}\): pass the device's "
        r"ordinal, an int \(0 is the first GPU\)$",
    ):
        ag.reset_device(device)  # type: ignore[arg-type]  # what the test is about


def test_a_negative_ordinal_is_refused() -> None:
    with pytest.raises(
        ag.DispatchError,
        match=r"^reset_device\(device=-1\): a device ordinal is 0 or more \(0 is the first GPU\)$",
    ):
        ag.reset_device(-1)


def _child(code: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


_RESET = """
    import json, sys
    import asyncgraph as ag
    seen = {}
    for device in %s:
        try:
            ag.reset_device(device)
            seen[repr(device)] = "reset"
        except Exception as exc:
            seen[repr(device)] = [type(exc).__name__, str(exc)]
    seen["cuda_loaded"] = sorted(m for m in sys.modules if m.split(".")[0] == "cuda")
    print(json.dumps(seen))
"""


def _has_driver_library() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_without_a_driver_library_it_raises_device_unavailable() -> None:
    if _has_driver_library():
        pytest.skip("a CUDA driver library (libcuda.so.1) is installed here")
    seen = _child(_RESET % "[0]")
    kind, message = seen["0"]
    assert kind == "DeviceUnavailableError", seen
    assert message.startswith(
        "reset_device(device=0): no CUDA driver library (libcuda) was found, so there is no GPU "
        "to reset: "
    ), message


def test_bad_ordinals_never_reach_the_driver() -> None:
    # Refused before cuda.bindings is even imported.
    seen = _child(_RESET % "[-1, 'x']")
    assert seen["-1"][0] == "DispatchError", seen
    assert seen["'x'"][0] == "ArgumentTypeError", seen
    assert seen["cuda_loaded"] == [], seen


@pytest.fixture(scope="module")
def stand_in() -> Path:
    try:
        return build()
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ("0", "reset_device(device=0): the CUDA driver reports no device on this machine"),
        ("1", "reset_device(device=1): there is no CUDA device 1; this machine has 1 (device 0)"),
        ("2", "reset_device(device=3): there is no CUDA device 3; this machine has 2 (0 to 1)"),
    ],
)
def test_a_device_the_driver_does_not_have_is_unavailable(
    stand_in: Path, devices: str, expected: str
) -> None:
    device = int(expected.split("device=")[1].split(")")[0])
    env = {**environment(stand_in, "python"), "FAKE_CUDA_DEVICES": devices}
    seen = _child(_RESET % f"[{device}]", env)
    assert seen[str(device)] == ["DeviceUnavailableError", expected], seen
