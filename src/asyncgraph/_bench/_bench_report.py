"""What ``python -m asyncgraph bench`` measured, and how it is shown: rows, table, JSON, plot.

A run yields a :class:`BenchReport`: the machine, the settings and one :class:`Row` per line of
the table, each a :class:`LatencyRow` (raw samples in µs; median, p90 and p99 computed from
them), a :class:`RateRow` (dispatches per second) or a :class:`SkippedRow` (a peer that could
not run, and why). :func:`format_report` lays out the table, :func:`write_json` and
:func:`write_plot` write the files, and :class:`Progress` draws the progress bar meanwhile.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TextIO

import attrs

from ._bench_results import layout, write_results
from ._bench_results import slug as slug  # one file-name rule for every benchmark
from ._harness import percentile as percentile  # one percentile for every benchmark

__all__ = (
    "BenchReport",
    "BenchSettings",
    "LatencyRow",
    "Progress",
    "RateRow",
    "Row",
    "SkippedRow",
    "default_path",
    "format_report",
    "format_table",
    "percentile",
    "render_bar",
    "slug",
    "write_json",
    "write_plot",
)

LATENCY = "latency (us)"
THROUGHPUT = "throughput"
PLOT_HINT = "pip install 'asyncgraph[plot]'"
PLOT_COLORS = {"asyncgraph": "#9ecae1", "peer": "#d9d9d9"}  # box fill by source


# -- summaries ---------------------------------------------------------------------------------


def default_path(device: str, suffix: str) -> Path:
    """``asyncgraph-bench-<device slug><suffix>`` in the current directory."""
    return Path(f"asyncgraph-bench-{slug(device)}{suffix}")


# -- settings, rows and the report -------------------------------------------------------------


_AT_LEAST_ONE = attrs.validators.ge(1)


@attrs.frozen(kw_only=True)
class BenchSettings:
    """How many repetitions each row runs.

    Attributes:
        reps: timed repetitions of each latency row.
        warmup: untimed repetitions before them.
        dispatches_per_task: dispatches each task of the throughput row awaits, one by one.
        tasks: concurrent tasks of the throughput row.
    """

    reps: int = attrs.field(validator=_AT_LEAST_ONE)
    warmup: int = attrs.field(validator=attrs.validators.ge(0))
    dispatches_per_task: int = attrs.field(validator=_AT_LEAST_ONE)
    tasks: int = attrs.field(default=64, validator=_AT_LEAST_ONE)

    @classmethod
    def scaled(cls, reps: int) -> BenchSettings:
        """*reps* timed repetitions; a tenth of that (at least 3) to warm up and per task.

        Raises:
            ValueError: *reps* is less than 1.
        """
        tenth = max(reps // 10, 3)
        return cls(reps=reps, warmup=tenth, dispatches_per_task=tenth)


@attrs.frozen(kw_only=True)
class Row:
    """One line of the table: a scenario, what ran in it, and whose it is.

    Attributes:
        scenario: the group it belongs to (``"empty kernel"``...).
        label: what was measured, naming who (``"asyncgraph: await dispatch"``).
        source: ``"asyncgraph"`` or ``"peer"`` (raw CUDA, CuPy, PyTorch).
    """

    section: ClassVar[str] = LATENCY
    columns: ClassVar[tuple[str, ...]] = ("median", "p90", "p99", "n")

    scenario: str
    label: str
    source: str

    def cells(self) -> tuple[str, ...]:
        """The row's cells after its label."""
        return ()

    def to_json(self) -> dict[str, Any]:
        """The row as JSON data."""
        return {"scenario": self.scenario, "label": self.label, "source": self.source}


@attrs.frozen(kw_only=True)
class LatencyRow(Row):
    """A distribution of latencies: one sample per repetition, in µs."""

    samples_us: tuple[float, ...] = attrs.field(validator=attrs.validators.min_len(1))

    @property
    def median_us(self) -> float:
        """The median sample."""
        return percentile(self.samples_us, 50)

    @property
    def p90_us(self) -> float:
        """The 90th percentile."""
        return percentile(self.samples_us, 90)

    @property
    def p99_us(self) -> float:
        """The 99th percentile."""
        return percentile(self.samples_us, 99)

    def cells(self) -> tuple[str, ...]:
        """Median, p90 and p99 in µs, and the number of samples."""
        figures = (self.median_us, self.p90_us, self.p99_us)
        return (*(f"{value:,.1f}" for value in figures), f"{len(self.samples_us):,}")

    def to_json(self) -> dict[str, Any]:
        """The row, its summary and its samples as JSON data."""
        return {
            **super().to_json(),
            "kind": "latency",
            "n": len(self.samples_us),
            "median_us": round(self.median_us, 3),
            "p90_us": round(self.p90_us, 3),
            "p99_us": round(self.p99_us, 3),
            "samples_us": [round(value, 3) for value in self.samples_us],
        }


@attrs.frozen(kw_only=True)
class RateRow(Row):
    """A throughput: *dispatches* completed in *seconds*."""

    section: ClassVar[str] = THROUGHPUT
    columns: ClassVar[tuple[str, ...]] = ("dispatches/s", "dispatches", "seconds")

    dispatches: int
    seconds: float

    @property
    def per_second(self) -> float:
        """Dispatches per second."""
        return self.dispatches / self.seconds

    def cells(self) -> tuple[str, ...]:
        """Dispatches per second, dispatches and seconds."""
        return (f"{self.per_second:,.0f}", f"{self.dispatches:,}", f"{self.seconds:.3f}")

    def to_json(self) -> dict[str, Any]:  # Row's, with the rate's figures
        return {
            **super().to_json(),
            "kind": "rate",
            "dispatches_per_s": round(self.per_second, 1),
            "dispatches": self.dispatches,
            "seconds": round(self.seconds, 6),
        }


@attrs.frozen(kw_only=True)
class SkippedRow(Row):
    """A latency row that did not run, and why (``"no CUDA device"``, ``"CuPy is not
    installed"``)."""

    reason: str

    def cells(self) -> tuple[str, ...]:
        """One cell that spans the figures: ``skipped: <reason>``."""
        return (f"skipped: {self.reason}",)

    def to_json(self) -> dict[str, Any]:
        """The row and its reason as JSON data."""
        return {**super().to_json(), "kind": "skipped", "reason": self.reason}


@attrs.frozen(kw_only=True)
class BenchReport:
    """One run of the bench: where it ran, how, and its rows in the table's order.

    Attributes:
        device: the GPU's name, or ``"host"``.
        backend: the backend's name (``"cuda:0"``, ``"host"``).
        driver: the CUDA driver's version (``"13.0"``), or ``None`` on the host backend.
        machine: the operating system and the number of CPUs.
        loop: ``"asyncio"`` or ``"uvloop"``.
        settings: the repetitions.
        versions: Python's and the packages' versions, by name.
        rows: the rows.
        recorded: the commit of asyncgraph's source (where it is a git checkout), whether it
            had changes, and the date of the run (``_version.provenance``).
    """

    device: str
    backend: str
    driver: str | None
    machine: str
    loop: str
    settings: BenchSettings
    versions: dict[str, str]
    rows: tuple[Row, ...]
    recorded: dict[str, Any] = attrs.field(factory=dict)

    def title(self) -> str:
        """One line naming the device, the loop and the repetitions."""
        where = self.backend if self.driver is None else f"{self.backend}, driver {self.driver}"
        return (
            f"asyncgraph bench on {self.device} ({where}), {self.loop}, "
            f"{self.settings.reps:,} repetitions after {self.settings.warmup:,} to warm up"
        )

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data."""
        return {
            "device": self.device,
            "backend": self.backend,
            "driver": self.driver,
            "machine": self.machine,
            "versions": self.versions,
            "recorded": self.recorded,
            "loop": self.loop,
            **attrs.asdict(self.settings),
            "rows": [row.to_json() for row in self.rows],
        }


# -- progress ----------------------------------------------------------------------------------


def render_bar(done: int, total: int, label: str, width: int = 30) -> str:
    """``[#####.........]  3/10  label``: *done* of *total* steps, *width* characters of bar."""
    filled = width * done // total if total else width
    count = f"{done:>{len(str(total))}}/{total}"
    return f"[{'#' * filled}{'.' * (width - filled)}]  {count}  {label}"


class Progress:
    """A plain-text progress bar, one step per row, on *stream* (stderr, say).

    On a terminal the bar is redrawn in place; elsewhere (a log, a pipe) each step is a line.
    """

    def __init__(self, total: int, stream: TextIO, width: int = 30) -> None:
        self._total = total
        self._stream = stream
        self._width = width
        self._done = 0
        self._shown = 0  # characters of the bar on screen, to blank when redrawn
        self._interactive = stream.isatty()
        self._closed = False

    def start(self, label: str) -> None:
        """Show that the step *label* starts (every step before it is done)."""
        self._show(render_bar(self._done, self._total, label, self._width))
        self._done = min(self._done + 1, self._total)

    def close(self) -> None:
        """Show the bar full and end its line. Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        self._show(render_bar(self._total, self._total, "done", self._width))
        if self._interactive:
            self._stream.write("\n")
            self._stream.flush()

    def _show(self, line: str) -> None:
        if self._interactive:
            self._stream.write("\r" + line.ljust(self._shown))
            self._shown = len(line)
        else:
            self._stream.write(line + "\n")
        self._stream.flush()


# -- the table ---------------------------------------------------------------------------------


def _section(rows: Sequence[Row], label_width: int) -> list[str]:
    """One section of the table: its header, then each scenario's name and rows (a skipped
    row's reason spans the figures)."""
    columns = rows[0].columns
    lines: list[Sequence[str]] = [(rows[0].section, *columns)]
    for scenario, members in itertools.groupby(rows, key=lambda row: row.scenario):
        lines.append((scenario,))
        lines.extend((f"  {row.label}", *row.cells()) for row in members)
    return layout(lines, [True] + [False] * len(columns), first_width=label_width)


def format_table(rows: Iterable[Row]) -> str:
    """The rows as a table: latency rows first, then throughput rows, each section grouped by
    scenario, figures right-aligned under their column; a skipped row says why instead."""
    by_section: dict[str, list[Row]] = {}
    for row in rows:
        by_section.setdefault(row.section, []).append(row)
    everything = [row for section in by_section.values() for row in section]
    names = [*by_section, *(row.scenario for row in everything)]
    names.extend(f"  {row.label}" for row in everything)
    width = max(map(len, names), default=0)
    return "\n\n".join("\n".join(_section(section, width)) for section in by_section.values())


def format_report(report: BenchReport) -> str:
    """The report's title line, a blank line and its table."""
    return f"{report.title()}\n\n{format_table(report.rows)}"


# -- files -------------------------------------------------------------------------------------


def write_json(report: BenchReport, path: Path) -> Path:
    """Write *report* to *path* as indented JSON (its parent folder made if needed).

    Returns:
        *path*.
    """
    return write_results(report.to_json(), path, allow_nan=False)


def write_plot(report: BenchReport, path: Path) -> Path | None:
    """Plot the latency rows of *report* into the PNG *path*, if matplotlib is installed.

    One horizontal box per row (the box from p25 to p75, a line at the median, whiskers from
    p1 to p99; asyncgraph's blue, the peers' grey), grouped by scenario, on a logarithmic µs
    axis, titled with the device. It draws on matplotlib's Agg canvas, never a screen.

    Returns:
        *path*, or ``None`` where matplotlib cannot be imported (nothing was written).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        return None
    rows = [row for row in report.rows if isinstance(row, LatencyRow)]
    ticks: list[float] = []  # one per scenario name and per row, top to bottom
    names: list[str] = []
    headers: list[int] = []  # indices of the ticks that name a scenario
    boxes: list[float] = []
    position = 0.0
    for scenario, members in itertools.groupby(rows, key=lambda row: row.scenario):
        headers.append(len(ticks))
        ticks.append(position)
        names.append(scenario)
        for row in members:
            position += 1
            ticks.append(position)
            names.append(row.label)
            boxes.append(position)
        position += 1.5  # a gap before the next scenario

    figure = Figure(figsize=(11, 1.5 + 0.4 * len(ticks)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    drawn = axes.boxplot(
        [row.samples_us for row in rows],
        positions=boxes,
        orientation="horizontal",
        whis=(1, 99),
        showfliers=False,
        widths=0.6,
        manage_ticks=False,
        patch_artist=True,
    )
    for box, row in zip(drawn["boxes"], rows, strict=True):
        box.set_facecolor(PLOT_COLORS.get(row.source, "white"))
    axes.set_xscale("log")
    axes.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.set_yticks(ticks, names)
    for index in headers:
        axes.get_yticklabels()[index].set_fontweight("bold")
    axes.invert_yaxis()
    axes.grid(axis="x", which="both", alpha=0.3)
    axes.set_xlabel(
        "latency, µs (box p25 to p75, line median, whiskers p1 to p99; blue asyncgraph, grey peers)"
    )
    axes.set_title(f"asyncgraph bench on {report.device} ({report.backend}, {report.loop})")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=110)
    return path
