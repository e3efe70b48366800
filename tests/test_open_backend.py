"""open_backend: device selection, options, and the CLI."""

from __future__ import annotations

import re
from typing import Any

import attrs
import numpy as np
import pytest
import structlog

import asyncgraph as ag
from asyncgraph.__main__ import main
from asyncgraph._opening._detect import probe_cuda

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


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cuda:-1", "", None, 1.5, -1, True])
def test_unknown_device_forms(device: object) -> None:
    with pytest.raises(ag.DeviceUnavailableError, match=r"is not a device asyncgraph knows; "):
        ag.open_backend(device)  # type: ignore[arg-type]  # deliberately wrong


_INT_FIELDS = [
    ("streams", "a positive int"),
    ("host_workers", "a positive int or None"),
    ("max_in_flight", "a positive int"),
    ("max_queued", "a positive int or None"),
    ("pinned_pool_bytes", "a non-negative int"),
    ("graph_cache_bytes", "a non-negative int"),
    ("graph_repeats", "a positive int"),
]


@pytest.mark.parametrize(("field", "what"), _INT_FIELDS)
def test_a_bad_option_value_raises_an_error_of_the_tree(field: str, what: str) -> None:
    # A bare ValueError before: errors.md promises every error derives from AsyncGraphError.
    bad = 0 if what.startswith("a positive") else -1
    given: dict[str, Any] = {field: bad}
    with pytest.raises(
        ag.DispatchError, match=rf"^BackendOptions\.{field} must be {what}, got {bad}$"
    ) as raised:
        ag.open_backend("host", **given)
    assert isinstance(raised.value, ValueError)
    wrongs: list[Any] = ["4", 2.0, True]
    for wrong in wrongs:
        with pytest.raises(
            ag.ArgumentTypeError,
            match=rf"^BackendOptions\.{field} must be {what}, got {re.escape(repr(wrong))}$",
        ) as typed:
            ag.BackendOptions(**{field: wrong})
        assert isinstance(typed.value, TypeError)


@pytest.mark.parametrize("field", ["poll_window", "spin_window"])
def test_a_bad_window_raises_an_error_of_the_tree(field: str) -> None:
    what = rf"^BackendOptions\.{field} must be a non-negative number of seconds, got "
    bads: list[Any] = [-1, float("nan")]
    for bad in bads:
        with pytest.raises(ag.DispatchError, match=rf"{what}{bad}$"):
            ag.BackendOptions(**{field: bad})
    text: dict[str, Any] = {field: "1"}
    with pytest.raises(ag.ArgumentTypeError, match=rf"{what}'1'$"):
        ag.BackendOptions(**text)


def test_options_of_the_wrong_form_are_refused_with_what_to_pass() -> None:
    # options={...} failed with AttributeError: 'dict' object has no attribute 'max_queued'.
    with pytest.raises(
        ag.ArgumentTypeError,
        match=r"^open_backend\(options=\{'host_workers': 2\}\): pass "
        r"options=asyncgraph\.BackendOptions\(host_workers=2\), or the fields as keywords$",
    ):
        ag.open_backend("host", options={"host_workers": 2})  # type: ignore[arg-type]  # the point
    with pytest.raises(
        ag.ArgumentTypeError,
        match=r"^open_group\(options=4\): pass options=asyncgraph\.BackendOptions\(\.\.\.\), "
        r"or the fields as keywords$",
    ):
        ag.open_group(["host"], options=4)  # type: ignore[arg-type]  # the point
    with pytest.raises(
        ag.ArgumentTypeError,
        match=r"^open_backend\(\) takes options=BackendOptions\(\.\.\.\) or its fields as "
        r"keywords, not both$",
    ):
        ag.open_backend("host", options=ag.BackendOptions(), streams=2)
    fields = ", ".join(sorted(f.name for f in attrs.fields(ag.BackendOptions)))
    with pytest.raises(
        ag.ArgumentTypeError,
        match=rf"^open_backend\(stream=\.\.\.\): BackendOptions has no such field; its "
        rf"fields are {fields}$",
    ):
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


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("bogus", "device='bogus' is not a device asyncgraph knows; pass 'auto', 'host', "),
        pytest.param("cuda", "device='cuda' needs CUDA, but ", marks=no_cuda),
    ],
)
def test_cli_demo_with_a_device_it_cannot_open_says_why_and_exits_2(
    capsys: pytest.CaptureFixture[str], device: str, message: str
) -> None:
    # A 27- and a 30-line traceback before; the same as bench --device now.
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--device", device, "--dispatches", "3"])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    assert line.startswith(f"python -m asyncgraph demo: error: {message}")


def test_cli_help_is_plain_text_and_names_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    # The description was the module's docstring, reST double backticks and all.
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "``" not in top
    assert "info | demo | bench" in top
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    demo_help = capsys.readouterr().out
    # --dispatches had no help line of its own.
    assert "concurrent dispatches to run, the three kernels in turn (default 1200)" in " ".join(
        demo_help.split()
    )


def test_cli_demo_fails_on_a_mismatch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncgraph._demo import _demo

    # A wrong host implementation must make the demo exit non-zero.
    def wrong(x: Array, y: Array, out: Array, a: np.float32, n: np.int32) -> None:
        out[:] = x + y

    monkeypatch.setattr(_demo.SAXPY, "host", wrong)
    assert main(["demo", "--device", "host", "--dispatches", "30"]) == 1
    assert "FAILED: 10 of 30 results mismatched numpy" in capsys.readouterr().out
