"""What the benchmark scripts add to the package's harness: their command line and where their
results go.

- :func:`arguments` is the scripts' command line (``--json [PATH]``, ``--reps``, ``--smoke``);
- :func:`write_json` writes a script's results where ``--json`` said, by default to
  ``benchmarks/results/<script>-<device>.json`` (:func:`results_path`), with the commit of the
  checkout they were measured at and the date.

Everything else a script measures, prints or describes with is the one harness that
``python -m asyncgraph bench`` uses too, named here so that a script needs one import:
``asyncgraph._bench._harness`` (timing, percentiles, smoke runs, the heartbeat, event loops) and
``asyncgraph._bench._bench_results`` (tables, verdicts, the environment, JSON files).

The scripts import it as ``benchmarks.harness`` (they put the project root on ``sys.path``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from asyncgraph._bench._bench_results import cpu as cpu
from asyncgraph._bench._bench_results import device_name as device_name
from asyncgraph._bench._bench_results import environment as environment
from asyncgraph._bench._bench_results import format_table as format_table
from asyncgraph._bench._bench_results import print_table as print_table
from asyncgraph._bench._bench_results import print_targets as print_targets
from asyncgraph._bench._bench_results import python_version as python_version
from asyncgraph._bench._bench_results import slug, write_results
from asyncgraph._bench._bench_results import verdict as verdict
from asyncgraph._bench._bench_results import verdicts as verdicts
from asyncgraph._bench._harness import SMOKE_ENV as SMOKE_ENV
from asyncgraph._bench._harness import SMOKE_REPS as SMOKE_REPS
from asyncgraph._bench._harness import UVLOOP_MISSING as UVLOOP_MISSING
from asyncgraph._bench._harness import Clock as Clock
from asyncgraph._bench._harness import Heartbeat as Heartbeat
from asyncgraph._bench._harness import LoopFactory as LoopFactory
from asyncgraph._bench._harness import loop_factories as loop_factories
from asyncgraph._bench._harness import median as median
from asyncgraph._bench._harness import median_us as median_us
from asyncgraph._bench._harness import percentile as percentile
from asyncgraph._bench._harness import run as run
from asyncgraph._bench._harness import run_on_loops as run_on_loops
from asyncgraph._bench._harness import samples_async as samples_async
from asyncgraph._bench._harness import samples_sync as samples_sync
from asyncgraph._bench._harness import smoke as smoke
from asyncgraph._bench._harness import time_async as time_async
from asyncgraph._bench._harness import time_async_in_turns as time_async_in_turns
from asyncgraph._bench._harness import time_sync as time_sync
from asyncgraph._runtime._version import provenance

# Where ``--json`` with no path writes: benchmarks/results/<script>-<device>.json.
RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent


class _Parser(argparse.ArgumentParser):
    """The scripts' parser: ``--smoke`` turns smoke runs on for the process and its children."""

    def parse_args(self, *args: Any, **kwargs: Any) -> Any:
        parsed = super().parse_args(*args, **kwargs)
        if parsed.smoke:
            os.environ[SMOKE_ENV] = "1"
            if getattr(parsed, "reps", None) is not None:
                parsed.reps = min(parsed.reps, SMOKE_REPS)
        return parsed


def arguments(
    doc: str | None,
    *,
    reps: int | None = None,
    reps_help: str = "timed repetitions of the short rows",
    results: bool = True,
) -> argparse.ArgumentParser:
    """The benchmark scripts' command line, described by the first line of *doc*.

    Args:
        doc: the script's docstring.
        reps: the default of ``--reps``; ``None`` for a script without one.
        reps_help: what ``--reps`` counts.
        results: whether the script takes ``--json [PATH]`` (see :func:`write_json`).
    """
    parser = _Parser(description=(doc or "").strip().split("\n")[0] or None)
    if results:
        parser.add_argument(
            "--json",
            nargs="?",
            const="",
            metavar="PATH",
            help="write the results as JSON to PATH; with no PATH, to "
            "benchmarks/results/<script>-<device>.json",
        )
    if reps is not None:
        parser.add_argument("--reps", type=int, default=reps, help=f"{reps_help} (default {reps})")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"a few repetitions of everything ({SMOKE_REPS}): checks that the script runs, "
        "measures nothing",
    )
    return parser


def results_path(script: str, device: str) -> Path:
    """The results file of *script* on *device*: ``benchmarks/results/<script>-<device>.json``.

    Args:
        script: the script's file (its ``__file__``) or name; its stem is used.
        device: the GPU's name, as a file-name part (``slug``: ``NVIDIA H100 80GB HBM3`` →
            ``NVIDIA-H100-80GB-HBM3``).
    """
    return RESULTS / f"{Path(script).stem}-{slug(device)}.json"


def write_json(
    data: Mapping[str, Any], destination: str | None, *, script: str, device: str
) -> Path | None:
    """Writes *data* (``write_results``) where ``--json`` said, with a ``recorded`` key: the
    commit of the checkout the script ran from (``git rev-parse HEAD``, ``None`` outside one),
    whether its tracked files had changes (``dirty``), the date (ISO 8601, UTC) and
    asyncgraph's version (``asyncgraph._runtime._version.provenance``).

    Args:
        data: the results.
        destination: ``--json``'s value: ``None`` (not given) writes nothing, ``""`` (given with
            no path) writes to :func:`results_path`, anything else is the path to write.
        script: the script's file or name, for :func:`results_path`.
        device: the GPU's name, for :func:`results_path`.

    Returns:
        The path written, or ``None``.
    """
    if destination is None:
        return None
    path = Path(destination) if destination else results_path(script, device)
    return write_results({**data, "recorded": provenance(ROOT)}, path)
