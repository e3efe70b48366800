"""What every benchmark script shares: event loops, timing, tables, the command line and results.

- :func:`run` runs a coroutine on asyncio or uvloop; :func:`run_on_loops` runs a script's rows on
  asyncio and on uvloop, leaving uvloop's rows out with a printed note where it is not installed.
- :func:`time_sync` and :func:`time_async` time a call many times after a warm-up and return the
  median in µs; :func:`median_us` and :func:`percentile` summarise samples a script takes itself;
  :class:`Heartbeat` measures how long the event loop stalls while work runs.
- :func:`format_table` and :func:`print_table` lay out every script's tables;
  :func:`print_targets` prints a script's targets with a verdict each (met or missed), which
  :func:`verdicts` gives for its results.
- :func:`arguments` is the shared command line (``--json [PATH]``, ``--reps``, ``--smoke``);
  :func:`write_json`
  writes the results there, by default to ``benchmarks/results/<script>-<device>.json``, the
  device named by :func:`device_name`, with the commit they were measured at and the date.

The scripts import it as ``benchmarks.harness`` (they put the project root on ``sys.path``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from asyncgraph._version import provenance
from asyncgraph.bench._harness import Clock as Clock  # the scripts' clock type
from asyncgraph.bench._harness import LoopFactory as LoopFactory  # the scripts' loop factory type
from asyncgraph.bench._harness import loop_factories as loop_factories  # asyncio, and uvloop if any
from asyncgraph.bench._harness import percentile as percentile  # the scripts' percentile
from asyncgraph.bench._harness import samples_async, samples_sync
from asyncgraph.bench._harness import slug as slug  # the results' file-name rule

T = TypeVar("T")

# Where ``--json`` with no path writes: benchmarks/results/<script>-<device>.json.
RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
UVLOOP_MISSING = "uvloop is not installed: its rows are left out"
# Set by ``--smoke`` (and inherited by a script's child processes): every timing runs a few
# repetitions only. CI runs each script so, to catch a script that no longer runs.
SMOKE_ENV = "ASYNCGRAPH_BENCH_SMOKE"
SMOKE_REPS = 3


def smoke() -> bool:
    """Whether this is a ``--smoke`` run: a check that the script works, not a measure."""
    return os.environ.get(SMOKE_ENV, "") not in ("", "0")


# -- event loops -------------------------------------------------------------------------------


def run(main: Coroutine[Any, Any, T], loop: str = "asyncio") -> T:
    """Runs *main* to completion on a new event loop of the kind named, and returns its result.

    Args:
        main: the coroutine to run.
        loop: ``"asyncio"`` or ``"uvloop"``.

    Raises:
        ValueError: the loop named is not installed or not known (*main* is closed unrun).
    """
    factories = loop_factories()
    if loop not in factories:
        main.close()
        raise ValueError(
            f"no event loop named {loop!r} is at hand; choose one of {', '.join(factories)}"
        )
    with asyncio.Runner(loop_factory=factories[loop]) as runner:
        return runner.run(main)


def run_on_loops(
    rows: Callable[[str], Coroutine[Any, Any, Mapping[str, T]]],
) -> tuple[dict[str, T], tuple[str, ...]]:
    """Runs ``rows(loop_name)`` on asyncio, then on uvloop where it is installed.

    Where uvloop is not installed, prints a note saying its rows are left out.

    Returns:
        The rows of every run, merged in order, and the names of the loops that ran.
    """
    factories = loop_factories()
    if "uvloop" not in factories:
        print(UVLOOP_MISSING)
    merged: dict[str, T] = {}
    for name in factories:
        merged.update(run(rows(name), name))
    return merged, tuple(factories)


# -- timing ------------------------------------------------------------------------------------


def median_us(samples: Iterable[float]) -> float:
    """The median of *samples* (seconds), in µs."""
    return statistics.median(samples) * 1e6


def time_sync(
    fn: Callable[[], object], reps: int, warmup: int = 100, *, clock: Clock = time.perf_counter
) -> float:
    """Calls *fn* *warmup* times, then times *reps* calls one by one; returns the median µs."""
    if smoke():
        reps, warmup = min(reps, SMOKE_REPS), min(warmup, 1)
    return median_us(samples_sync(fn, reps, warmup, clock))


async def time_async(
    fn: Callable[[], Awaitable[object]],
    reps: int,
    warmup: int = 100,
    *,
    clock: Clock = time.perf_counter,
) -> float:
    """Awaits *fn()* *warmup* times, then times *reps* awaits one by one; returns the median µs."""
    if smoke():
        reps, warmup = min(reps, SMOKE_REPS), min(warmup, 1)
    return median_us(await samples_async(fn, reps, warmup, clock))


class Heartbeat:
    """Measures the event loop's stalls while its ``async with`` block runs.

    A task sleeps *period* seconds in a loop and records how late each wake-up came.

    Attributes:
        stalls: seconds past *period* of each beat, in order.
        started: ``time.perf_counter()`` at the start of each beat, in the same order.
    """

    def __init__(self, period: float = 0.0005) -> None:
        self.period = period
        self.stalls: list[float] = []
        self.started: list[float] = []
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def worst(self) -> float:
        """The longest stall in seconds (0 before any beat)."""
        return max(self.stalls, default=0.0)

    async def __aenter__(self) -> Heartbeat:
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._beat(self._stop))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._stop is not None and self._task is not None:
            self._stop.set()
            await self._task

    async def _beat(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(self.period)
            self.stalls.append(time.perf_counter() - t0 - self.period)
            self.started.append(t0)


# -- tables ------------------------------------------------------------------------------------


def format_table(
    header: Sequence[str], rows: Iterable[Sequence[object]], formats: Sequence[str]
) -> str:
    """Lays out a table, each column as wide as its widest cell, two spaces apart.

    The first column and text columns are left-aligned, the others right-aligned.

    Args:
        header: the columns' titles.
        rows: one sequence of cells per row, a name first.
        formats: a format spec for each column after the first (``".1f"``, ``","``), or ``""``
            for a text column; a cell that is a ``str`` is written as it is.

    Raises:
        ValueError: a row, or *formats*, does not match the header's columns.
    """
    if len(formats) != len(header) - 1:
        raise ValueError(
            f"{len(header)} columns take {len(header) - 1} formats, not {len(formats)}"
        )
    lines = [list(header)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"row {row!r} has {len(row)} cells; the header has {len(header)}")
        name, *values = row
        lines.append(
            [str(name)]
            + [
                v if isinstance(v, str) else format(v, f)
                for v, f in zip(values, formats, strict=True)
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    left = [True] + [not f for f in formats]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if is_left else cell.rjust(width)
            for cell, width, is_left in zip(line, widths, left, strict=True)
        ).rstrip()
        for line in lines
    )


def print_table(
    header: Sequence[str], rows: Iterable[Sequence[object]], formats: Sequence[str]
) -> None:
    """Prints :func:`format_table`'s table."""
    print(format_table(header, rows, formats))


_BOUND = re.compile(r"\s(<=|>=|<|>)\s*([-+]?[0-9][0-9_.e+-]*)$")


def verdict(target: str, measured: float) -> str:
    """``"met"`` or ``"missed"``: whether *measured* meets the bound *target* ends with
    (``"... <= 1.0"``, ``">= 0.9"``, ``"< 1"``, ``"> 2"``); NaN (a peer that did not run) never
    does. ``""`` for a row without a bound (``"(info) ..."``)."""
    found = _BOUND.search(target)
    if found is None:
        return ""
    op, bound = found.group(1), float(found.group(2))
    met = {
        "<=": measured <= bound,
        ">=": measured >= bound,
        "<": measured < bound,
        ">": measured > bound,
    }[op]
    return "met" if met else "missed"


def verdicts(targets: Mapping[str, float]) -> dict[str, str]:
    """:func:`verdict` of each target that has a bound, by its label."""
    return {label: v for label, value in targets.items() if (v := verdict(label, value))}


def print_targets(targets: Mapping[str, float], fmt: str = ".3f") -> None:
    """The targets (labels ending with their bound) as a table: measured, and met or missed."""
    print_table(
        ("target", "measured", ""),
        ((label, value, verdict(label, value)) for label, value in targets.items()),
        (fmt, ""),
    )


# -- command line and results ------------------------------------------------------------------


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


def device_name(ordinal: int = 0) -> str:
    """The name of GPU *ordinal* as the driver gives it (``"NVIDIA H100 80GB HBM3"``)."""
    from cuda.core import Device

    return str(Device(ordinal).name)


def environment(device: str) -> dict[str, str]:
    """The ``device`` and ``python`` keys that open most scripts' results."""
    return {"device": device, "python": sys.version.split()[0]}


def results_path(script: str, device: str) -> Path:
    """The results file of *script* on *device*: ``benchmarks/results/<script>-<device>.json``.

    Args:
        script: the script's file (its ``__file__``) or name; its stem is used.
        device: the GPU's name; each run of characters other than letters, digits, ``.``, ``_``
            and ``-`` becomes one ``-`` (``NVIDIA H100 80GB HBM3`` → ``NVIDIA-H100-80GB-HBM3``).
    """
    return RESULTS / f"{Path(script).stem}-{slug(device)}.json"


def write_json(
    data: Mapping[str, Any], destination: str | None, *, script: str, device: str
) -> Path | None:
    """Writes *data* as indented JSON where ``--json`` said, with a ``recorded`` key: the commit
    of the checkout the script ran from (``git rev-parse HEAD``, ``None`` outside one), whether
    its tracked files had changes (``dirty``), the date (ISO 8601, UTC) and asyncgraph's
    version (``asyncgraph._version.provenance``).

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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**data, "recorded": provenance(ROOT)}, indent=2) + "\n")
    return path
