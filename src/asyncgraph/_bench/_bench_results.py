"""What every benchmark prints and writes: ``python -m asyncgraph bench`` and the scripts under
``benchmarks/`` alike.

- :func:`layout` lines up cells in columns; :func:`format_table` and :func:`print_table` lay
  out a table of named rows with it (the bench's sectioned table uses it too).
- :func:`verdict` judges a measure against the bound its target's label ends with;
  :func:`verdicts` and :func:`print_targets` do so for a benchmark's targets.
- :func:`python_version`, :func:`version_of`, :func:`device_name`, :func:`cpu`,
  :func:`machine` and :func:`environment` describe where a measure was taken.
- :func:`slug` makes a name a file-name part; :func:`write_results` writes results as JSON.

How a benchmark measures is in ``_harness``.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

__all__ = (
    "cpu",
    "device_name",
    "environment",
    "format_table",
    "layout",
    "machine",
    "print_table",
    "print_targets",
    "python_version",
    "slug",
    "verdict",
    "verdicts",
    "version_of",
    "write_results",
)


# -- tables ------------------------------------------------------------------------------------


def layout(
    lines: Sequence[Sequence[str]], left: Sequence[bool], *, first_width: int = 0
) -> list[str]:
    """*lines* of cells in columns two spaces apart, each column as wide as its widest cell,
    trailing blanks stripped.

    A line of fewer cells than *left* has columns (a heading, a note that spans the figures)
    has its first cell aligned with the others and the rest written as they are; only its first
    cell counts toward the widths.

    Args:
        lines: the cells of each line, the first column first.
        left: for each column, whether it is left-aligned (else right-aligned).
        first_width: the least width of the first column (to line it up with another table's).
    """
    full = [line for line in lines if len(line) == len(left)]
    widths = [max((len(line[i]) for line in full), default=0) for i in range(len(left))]
    widths[0] = max(first_width, *(len(line[0]) for line in lines)) if lines else first_width

    def cells(line: Sequence[str]) -> Iterable[str]:
        if len(line) != len(left):
            return (line[0].ljust(widths[0]), *line[1:])
        return (
            cell.ljust(width) if is_left else cell.rjust(width)
            for cell, width, is_left in zip(line, widths, left, strict=True)
        )

    return ["  ".join(cells(line)).rstrip() for line in lines]


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
    return "\n".join(layout(lines, [True] + [not f for f in formats]))


def print_table(
    header: Sequence[str], rows: Iterable[Sequence[object]], formats: Sequence[str]
) -> None:
    """Prints :func:`format_table`'s table."""
    print(format_table(header, rows, formats))


# -- targets -----------------------------------------------------------------------------------


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


# -- where it ran ------------------------------------------------------------------------------


def python_version() -> str:
    """Python's version, ``"3.11.9"``."""
    return sys.version.split()[0]


def version_of(package: str) -> str:
    """The installed version of the distribution *package*, or ``"not installed"``."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def device_name(ordinal: int = 0) -> str:
    """The name of GPU *ordinal* as the driver gives it (``"NVIDIA H100 80GB HBM3"``)."""
    from cuda.core import Device

    return str(Device(ordinal).name)


def cpu() -> str:
    """The CPU's model name and how many cores this process may use."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {len(os.sched_getaffinity(0))} cores"


def machine() -> str:
    """The operating system and the number of CPUs."""
    return f"{platform.platform()}, {os.cpu_count()} CPUs"


def environment(device: str) -> dict[str, str]:
    """The ``device`` and ``python`` keys that open most benchmarks' results."""
    return {"device": device, "python": python_version()}


# -- files -------------------------------------------------------------------------------------


def slug(name: str) -> str:
    """*name* as a file-name part: each run of characters other than letters, digits, ``.``,
    ``_`` and ``-`` becomes one ``-`` (``NVIDIA H100 80GB HBM3`` → ``NVIDIA-H100-80GB-HBM3``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "unknown"


def write_results(data: Mapping[str, Any], path: Path, *, allow_nan: bool = True) -> Path:
    """Write *data* to *path* as JSON indented by two, with a final newline, its parent folder
    made if needed.

    Args:
        data: the results.
        path: the file.
        allow_nan: whether NaN and infinities may be written (as JSON's ``NaN``, which not
            every reader takes); where not, such a value raises ``ValueError``.

    Returns:
        *path*.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, allow_nan=allow_nan) + "\n")
    return path
