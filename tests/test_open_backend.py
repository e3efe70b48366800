"""open_backend: device selection, options, and the CLI."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import structlog

import asyncgraph as ag
from asyncgraph.__main__ import main
from asyncgraph.front._detect import probe_cuda

Array = np.ndarray[Any, Any]

no_cuda = pytest.mark.skipif(probe_cuda().available, reason="this machine has a CUDA device")


@no_cuda
async def test_auto_picks_the_host_and_says_why() -> None:
    with structlog.testing.capture_logs() as logs:
        backend = ag.open_backend()
        async with backend:
            assert backend.name == "host"
    selected = [e for e in logs if e["event"] == "backend.selected"]
    assert len(selected) == 1
    assert selected[0]["device"] == "host"
    assert selected[0]["reason"] == probe_cuda().reason
    # Nothing went wrong: the choice is a debug event, not noise in every service's log.
    assert selected[0]["log_level"] == "debug"


@pytest.mark.cuda
async def test_opening_a_cuda_backend_is_a_debug_event() -> None:
    with structlog.testing.capture_logs() as logs:
        async with ag.open_backend("cuda") as backend:
            assert backend.kind == "cuda"
    (opened,) = [e for e in logs if e["event"] == "backend.opened"]
    assert opened["log_level"] == "debug"
    assert opened["device"] == "cuda:0"


@no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0])
def test_forcing_cuda_without_it_raises(device: str | int) -> None:
    with pytest.raises(ag.DeviceUnavailableError, match=rf"^device={device!r} needs CUDA, but "):
        ag.open_backend(device)


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "", None, 1.5])
def test_unknown_device_forms(device: object) -> None:
    with pytest.raises(ag.DeviceUnavailableError, match=r"is not a device asyncgraph knows; "):
        ag.open_backend(device)  # type: ignore[arg-type]  # deliberately wrong


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match=r"^BackendOptions.streams must be a positive int, got 0$"):
        ag.BackendOptions(streams=0)
    with pytest.raises(ValueError, match=r"^BackendOptions.poll_window must be a non-negative"):
        ag.BackendOptions(poll_window=-1)
    with pytest.raises(TypeError, match=r"^pass either options=BackendOptions\(...\) or its"):
        ag.open_backend("host", options=ag.BackendOptions(), streams=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'stream'"):
        ag.open_backend("host", stream=2)


async def test_options_reach_the_backend() -> None:
    async with ag.open_backend("host", options=ag.BackendOptions(streams=3)) as backend:
        assert backend.options.streams == 3


def test_cli_info(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "asyncgraph" in out
    assert "cuda-core" in out
    expected = "cuda:0" if probe_cuda().available else "host"
    assert f"auto picks     {expected}" in out


def test_cli_demo_checks_every_result(capsys: pytest.CaptureFixture[str]) -> None:
    logging = structlog.get_config()
    assert main(["demo", "--device", "host", "--dispatches", "60"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "dispatches     60 concurrent" in out
    assert "OK: all 60 results match numpy" in out
    # Its results alone: the backend's routine log lines (opened, closed) are not among them.
    assert [line.split()[0] for line in out.splitlines()] == [
        "backend", "dispatches", "throughput", "queue", "latency", "worst", "OK:",
    ]  # fmt: skip
    assert "backend.opened" not in captured.err
    assert structlog.get_config() == logging  # as it found it


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.0, "0.0 us"), (853.25e-6, "853.2 us"), (9_999.9e-6, "9,999.9 us"),
     (0.010, "10.0 ms"), (0.3981072, "398.1 ms"), (12.5, "12,500.0 ms")],
)  # fmt: skip
def test_cli_durations_are_in_ms_past_10000_us(seconds: float, shown: str) -> None:
    from asyncgraph.__main__ import duration

    assert duration(seconds) == shown


def test_cli_demo_fails_on_a_mismatch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncgraph.demo import _demo

    # A wrong host implementation must make the demo exit non-zero.
    def wrong(x: Array, y: Array, out: Array, a: np.float32, n: np.int32) -> None:
        out[:] = x + y

    monkeypatch.setattr(_demo.SAXPY, "host", wrong)
    assert main(["demo", "--device", "host", "--dispatches", "30"]) == 1
    assert "FAILED: 10 of 30 results mismatched numpy" in capsys.readouterr().out
