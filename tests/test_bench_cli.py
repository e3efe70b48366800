"""``python -m asyncgraph bench`` on the host backend, and the pure parts of its report.

Every run here is ``--quick`` on ``--device host``, so it needs no GPU; no test looks at how
fast anything was, only at what the command prints and writes.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog

import asyncgraph as ag
from asyncgraph.__main__ import main
from asyncgraph._bench._bench_peers import PEER_ROWS, Peer
from asyncgraph._bench._bench_report import (
    BenchSettings,
    LatencyRow,
    Progress,
    RateRow,
    SkippedRow,
    default_path,
    format_table,
    percentile,
    render_bar,
    slug,
)
from asyncgraph._bench._bench_run import ASYNCGRAPH_ROWS, Target
from asyncgraph._opening._detect import DeviceInfo, probe_cuda

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOT_HINT = "pip install 'asyncgraph[plot]'"
LATENCY_KEYS = {"median_us", "p90_us", "p99_us"}


def bench(*args: str) -> int:
    """``python -m asyncgraph bench --quick --device host *args``, in this process."""
    return main(["bench", "--quick", "--device", "host", *args])


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every ``import matplotlib...`` fail, as where it is not installed."""
    loaded = [name for name in sys.modules if name.partition(".")[0] == "matplotlib"]
    for name in {"matplotlib", *loaded}:
        monkeypatch.setitem(sys.modules, name, None)


# -- the command on the host backend -----------------------------------------------------------


def test_bench_prints_asyncgraph_rows_and_why_each_peer_was_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench("--json", str(tmp_path / "out.json"), "--no-plot") == 0

    out, err = capsys.readouterr()
    assert "asyncgraph bench on host (host), asyncio, 20 repetitions after 3 to warm up" in out
    for spec in ASYNCGRAPH_ROWS:
        assert f"  {spec.label}  " in out
    for spec in PEER_ROWS:
        assert any(
            line.startswith(f"  {spec.label} ") and line.endswith("skipped: no CUDA device")
            for line in out.splitlines()
        ), spec.label
    assert "dispatches/s" in out
    assert f"json           {tmp_path / 'out.json'}" in out
    assert not any(line.startswith("plot") for line in out.splitlines())  # --no-plot
    assert "[##############################]  12/12  done" in err  # the progress bar, on stderr


def test_bench_prints_the_table_first_and_no_routine_log_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # structlog's backend.opened and backend.closed lines came on stdout before the table.
    logging = structlog.get_config()
    assert bench("--json", str(tmp_path / "out.json"), "--no-plot") == 0
    out, err = capsys.readouterr()
    assert out.startswith("asyncgraph bench on host (host), asyncio, ")
    assert "backend.opened" not in out + err
    assert "backend.closed" not in out + err
    assert structlog.get_config() == logging  # as it found it


def test_bench_json_has_the_documented_structure(tmp_path: Path) -> None:
    path = tmp_path / "results" / "bench.json"
    assert bench("--json", str(path), "--no-plot") == 0

    data = read(path)
    assert data["device"] == "host"
    assert data["backend"] == "host"
    assert data["driver"] is None
    assert data["loop"] == "asyncio"
    assert isinstance(data["machine"], str)
    assert {"python", "numpy", "cuda-core", "cuda-bindings", "asyncgraph"} <= set(data["versions"])
    # The code it measured and when: the version alone is "0+unknown" in a tree never installed.
    assert set(data["recorded"]) == {"commit", "dirty", "date", "asyncgraph"}
    assert data["recorded"]["date"].endswith("+00:00")
    assert (data["reps"], data["warmup"], data["tasks"], data["dispatches_per_task"]) == (
        20,
        3,
        64,
        3,
    )
    rows = data["rows"]
    assert [row["label"] for row in rows if row["source"] == "asyncgraph"] == [
        spec.label for spec in ASYNCGRAPH_ROWS
    ]
    for row in rows:
        assert {"scenario", "label", "source", "kind"} <= set(row)
        if row["kind"] == "latency":
            figures = [row[key] for key in ("median_us", "p90_us", "p99_us")]
            assert all(math.isfinite(f) for f in figures), row
            assert min(figures) > 0, row
            assert figures == sorted(figures), row
            assert row["n"] == len(row["samples_us"]) == 20
            assert all(math.isfinite(s) for s in row["samples_us"])
            assert min(row["samples_us"]) > 0
        elif row["kind"] == "rate":
            assert row["dispatches"] == 64 * 3
            assert math.isfinite(row["dispatches_per_s"])
            assert row["dispatches_per_s"] > 0
            assert row["seconds"] > 0
        else:
            assert row == {
                "scenario": row["scenario"],
                "label": row["label"],
                "source": "peer",
                "kind": "skipped",
                "reason": "no CUDA device",
            }
    kinds = [row["kind"] for row in rows]
    assert (kinds.count("latency"), kinds.count("rate"), kinds.count("skipped")) == (5, 1, 5)


def test_bench_writes_its_files_into_the_current_directory_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert bench("--no-plot") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["asyncgraph-bench-host.json"]


def test_bench_plots_a_png_where_matplotlib_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    assert bench() == 0

    png = tmp_path / "asyncgraph-bench-host.png"
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    assert "plot           asyncgraph-bench-host.png" in capsys.readouterr().out


def test_bench_without_matplotlib_says_how_to_install_it_and_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    without_matplotlib(monkeypatch)
    plot = tmp_path / "plot.png"
    assert bench("--json", str(tmp_path / "out.json"), "--plot", str(plot)) == 0

    assert not plot.exists()
    hints = [line for line in capsys.readouterr().out.splitlines() if PLOT_HINT in line]
    assert hints == [f"plot           not written: matplotlib is missing; {PLOT_HINT}"]


def test_bench_runs_on_uvloop(tmp_path: Path) -> None:
    pytest.importorskip("uvloop")
    path = tmp_path / "out.json"
    assert bench("--loop", "uvloop", "--json", str(path), "--no-plot") == 0
    data = read(path)
    assert data["loop"] == "uvloop"
    assert "uvloop" in data["versions"]


def test_python_m_asyncgraph_bench_exits_0(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asyncgraph", "bench", "--quick", "--device", "host", "--no-plot"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "asyncgraph: await dispatch" in done.stdout
    assert "12/12  done" in done.stderr
    assert read(tmp_path / "asyncgraph-bench-host.json")["device"] == "host"


# -- bad arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reps", "0"], "--reps must be at least 1"),
        (["--reps", "-3"], "--reps must be at least 1"),
        (["--loop", "trio"], "argument --loop: invalid choice: 'trio'"),
        (["--device", "nonsense"], "device='nonsense' is not a device asyncgraph knows"),
        (["--quick", "--reps", "5"], "argument --reps: not allowed with argument --quick"),
        (["--plot", "x.png", "--no-plot"], "argument --no-plot: not allowed with argument --plot"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    device = [] if "--device" in args else ["--device", "host"]
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *device, *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "python -m asyncgraph bench: error: " in err
    assert message in err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_uvloop_missing_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(SystemExit) as exit_info:
        bench("--loop", "uvloop", "--no-plot")
    assert exit_info.value.code == 2
    assert "--loop uvloop needs uvloop, which is not installed" in capsys.readouterr().err


@pytest.mark.skipif(probe_cuda().available, reason="a CUDA device is present")
def test_cuda_without_a_device_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--quick", "--device", "cuda", "--no-plot"])
    assert exit_info.value.code == 2
    assert "device='cuda' needs CUDA" in capsys.readouterr().err


# -- the peers' rows, with a pretend device ----------------------------------------------------

PRETEND = DeviceInfo(ordinal=0, name="pretend", compute_capability=(9, 0), total_memory=1 << 30)


async def run_peer(peer: Peer) -> Any:
    async with ag.open_backend("host") as backend:
        x = np.ones(4, np.float32)
        target = Target(backend=backend, device=PRETEND, settings=BenchSettings.scaled(4), x=x)
        return await peer.run(target)


def never_missing() -> str | None:
    return None


async def test_a_peer_that_runs_gives_its_samples() -> None:
    peer = Peer(scenario="s", label="l", missing=never_missing, measure=lambda t, o: [1.0, 2.0])
    assert await run_peer(peer) == LatencyRow(
        scenario="s", label="l", source="peer", samples_us=(1.0, 2.0)
    )


async def test_a_peer_that_fails_is_skipped_with_its_error() -> None:
    def broken(target: Target, ordinal: int) -> list[float]:
        raise ZeroDivisionError("division by zero\nmore detail")

    peer = Peer(scenario="s", label="l", missing=never_missing, measure=broken)
    row = await run_peer(peer)
    assert row.reason == "failed: ZeroDivisionError: division by zero"


async def test_a_peer_whose_library_is_missing_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    (cupy_round_trip,) = (p for p in PEER_ROWS if p.label.startswith("CuPy: asarray"))
    assert isinstance(cupy_round_trip, Peer)
    row = await run_peer(cupy_round_trip)
    assert row == SkippedRow(
        scenario=cupy_round_trip.scenario,
        label=cupy_round_trip.label,
        source="peer",
        reason="CuPy is not installed",
    )


# -- pure functions ----------------------------------------------------------------------------


def test_percentile_interpolates_like_numpy() -> None:
    samples = [4.0, 1.0, 3.0, 2.0, 1000.0]
    assert percentile(samples, 50) == 3.0
    assert percentile(samples, 0) == 1.0
    assert percentile(samples, 100) == 1000.0
    assert percentile(samples, 90) == pytest.approx(601.6)
    assert percentile([7.0], 99) == 7.0
    assert percentile([1.0, 2.0], 50) == 1.5


@pytest.mark.parametrize(
    ("samples", "q", "message"),
    [([], 50, r"^percentile of no samples$"), ([1.0], 101, r"^q=101; a percentile is between")],
)
def test_percentile_refuses_nonsense(samples: list[float], q: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        percentile(samples, q)


def test_latency_row_summarises_its_samples() -> None:
    row = LatencyRow(scenario="s", label="l", source="asyncgraph", samples_us=(4, 1, 3, 2, 1000))
    assert row.median_us == 3.0
    assert row.p90_us == pytest.approx(601.6)
    assert row.p99_us == pytest.approx(960.16)
    with pytest.raises(ValueError, match=r"^Length of 'samples_us' must be >= 1: 0$"):
        LatencyRow(scenario="s", label="l", source="asyncgraph", samples_us=())


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("host", "host"),
        ("  Quadro RTX/6000 (rev. 2)  ", "Quadro-RTX-6000-rev.-2"),
        ("???", "unknown"),
    ],
)
def test_slug(name: str, expected: str) -> None:
    assert slug(name) == expected


def test_default_paths_are_in_the_current_directory() -> None:
    assert default_path("NVIDIA H100", ".json") == Path("asyncgraph-bench-NVIDIA-H100.json")


def test_settings_scale_with_the_repetitions() -> None:
    assert BenchSettings.scaled(3000) == BenchSettings(
        reps=3000, warmup=300, dispatches_per_task=300
    )
    assert BenchSettings.scaled(1) == BenchSettings(reps=1, warmup=3, dispatches_per_task=3)
    with pytest.raises(ValueError, match=r"^'reps' must be >= 1: 0$"):
        BenchSettings.scaled(0)


def test_render_bar() -> None:
    assert render_bar(0, 4, "first", width=8) == "[........]  0/4  first"
    assert render_bar(3, 4, "last", width=8) == "[######..]  3/4  last"
    assert render_bar(4, 4, "done", width=8) == "[########]  4/4  done"
    assert render_bar(3, 12, "x", width=4) == "[#...]   3/12  x"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_writes_lines_to_a_log_and_redraws_on_a_terminal() -> None:
    log = io.StringIO()
    progress = Progress(2, log, width=4)
    progress.start("a")
    progress.start("b")
    progress.close()
    progress.close()
    assert log.getvalue() == "[....]  0/2  a\n[##..]  1/2  b\n[####]  2/2  done\n"

    screen = Terminal()
    progress = Progress(1, screen, width=2)
    progress.start("a long label")
    progress.close()
    # Redrawn over the longer line before it, whose end is blanked.
    assert screen.getvalue() == "\r[..]  0/1  a long label\r[##]  1/1  done" + " " * 8 + "\n"


def test_format_table() -> None:
    rows = [
        SkippedRow(scenario="empty kernel", label="raw: floor", source="peer", reason="no GPU"),
        LatencyRow(
            scenario="empty kernel",
            label="asyncgraph: await",
            source="asyncgraph",
            samples_us=(4.0, 1.0, 3.0, 2.0, 1000.0),
        ),
        RateRow(
            scenario="64 tasks",
            label="asyncgraph: 64 tasks",
            source="asyncgraph",
            dispatches=12_800,
            seconds=0.5,
        ),
    ]
    assert format_table(rows) == "\n".join(
        [
            "latency (us)            median    p90    p99  n",
            "empty kernel",
            "  raw: floor            skipped: no GPU",
            "  asyncgraph: await        3.0  601.6  960.2  5",
            "",
            "throughput              dispatches/s  dispatches  seconds",
            "64 tasks",
            "  asyncgraph: 64 tasks        25,600      12,800    0.500",
        ]
    )
