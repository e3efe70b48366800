"""Every script under ``benchmarks/`` runs once at a tiny size (``--smoke``), so that a change that
breaks one fails CI rather than the next GPU run.

Scripts that measure the CUDA backend run on the CPU against the stand-in driver
(``tests/fake_driver``); the others on the host backend. A smoke run measures nothing: it
checks that the script runs to its end and writes its JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fake_driver import environment

from .needs import stand_in

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

STAND_IN, HOST, GPU = "stand-in driver", "host backend", "a CUDA GPU with PyTorch"
# script -> (where it runs, its arguments for a tiny run, whether it writes --json)
SCRIPTS: dict[str, tuple[str, list[str], bool]] = {
    "bench_batch.py": (HOST, ["--backend", "host"], True),
    "bench_core.py": (STAND_IN, [], True),
    "bench_dispatch.py": (STAND_IN, [], True),
    "bench_graphs.py": (STAND_IN, [], True),
    "bench_heal.py": (HOST, ["--device", "host"], True),
    "bench_host_path.py": (STAND_IN, ["--profiled", "20"], True),
    "bench_latency.py": (STAND_IN, [], True),
    "bench_load.py": (
        HOST,
        [
            "--device",
            "host",
            "--tasks",
            "4",
            "--rounds",
            "3",
            "--pairs",
            "2",
            "--requests",
            "20",
            "--load-clients",
            "1",
        ],
        True,
    ),
    "bench_priority.py": (STAND_IN, [], True),
    "bench_ray.py": (HOST, ["--device", "host"], True),
    "bench_reactor.py": (STAND_IN, [], True),
    "bench_resident.py": (STAND_IN, [], True),
    "bench_scale.py": (HOST, ["--device", "host"], True),
    "bench_serve_torch.py": (GPU, ["--clients", "4"], True),
    "bench_transfer.py": (STAND_IN, [], True),
    "primitives.py": (STAND_IN, [], True),
    "profile_dispatch.py": (STAND_IN, [], False),
    "soak.py": (STAND_IN, ["--dispatches", "2000", "--every", "500"], True),
    "soak_faults.py": (
        HOST,
        ["--device", "host", "--runs", "300", "--fault-every", "100", "--concurrency", "8"],
        True,
    ),
}
# Scripts that start a local Ray (skipped, saying so, where Ray is not installed).
RAY_SCRIPTS = {"bench_heal.py", "bench_ray.py", "bench_scale.py", "soak_faults.py"}
# Scripts that judge their targets: each printed with "met" or "missed" (not every target has
# its peer in a smoke run: those are missed).
JUDGED = {"bench_dispatch.py", "bench_graphs.py", "bench_ray.py", "bench_transfer.py"}
# Scripts on the stand-in that compile no kernel (the others need NVRTC).
COMPILE_NOTHING = {"bench_core.py", "bench_reactor.py"}
# Modules the scripts import, not scripts themselves.
MODULES = {
    "__init__.py",
    "batch_loads.py",
    "callback_timer.py",
    "example_service.py",
    "graph_peers.py",
    "harness.py",
    "ray_pipelines.py",
    "report.py",  # writes docs/performance.md from the results (tests/test_performance_page.py)
}


def test_every_script_is_run_here() -> None:
    found = {path.name for path in BENCHMARKS.glob("*.py")}
    assert found - MODULES == set(SCRIPTS), "add the new script to SCRIPTS (or MODULES)"


def _scripts() -> list[Any]:
    """Each script, marked with what it needs on the stand-in (``tests/needs.py``)."""
    params: list[Any] = []
    for script in sorted(SCRIPTS):
        marks: list[pytest.MarkDecorator] = []
        if SCRIPTS[script][0] == STAND_IN:
            marks.append(pytest.mark.stand_in)
            if script not in COMPILE_NOTHING:
                marks.append(pytest.mark.nvrtc)
        params.append(pytest.param(script, marks=marks))
    return params


@pytest.mark.parametrize("script", _scripts())
def test_a_script_runs_at_a_tiny_size(script: str, tmp_path: Path) -> None:
    where, arguments, writes_json = SCRIPTS[script]
    if script in RAY_SCRIPTS and importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install -e '.[ray]')")
    if where == GPU:
        # PyTorch on a GPU is the whole subject of the script: on the GPU suite's machine it
        # runs here; CI (no GPU, no PyTorch) skips it, saying so.
        torch = pytest.importorskip("torch", reason="PyTorch is not installed")
        if not torch.cuda.is_available():
            pytest.skip("no CUDA GPU for PyTorch")
    core = os.environ.get("ASYNCGRAPH_CORE") or "compiled"
    if where == STAND_IN:
        env = environment(stand_in(), core)
    else:
        env = {**os.environ, "ASYNCGRAPH_CORE": core}
    out = tmp_path / "results.json"
    command = [sys.executable, str(BENCHMARKS / script), "--smoke", *arguments]
    if writes_json:
        command += ["--json", str(out)]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    if writes_json:
        results = json.loads(out.read_text())
        assert isinstance(results, dict)
        assert results
        # Every result says what code it measured, and when (benchmarks/harness.py).
        assert {"commit", "dirty", "date"} <= set(results["recorded"])
    if script in JUDGED:
        # Its targets come with a verdict each, as printed and in the JSON.
        judged = [line for line in done.stdout.splitlines() if line.endswith(("met", "missed"))]
        assert judged, done.stdout[-3000:]
        assert len(results["verdicts"]) == len(judged)
