"""The package's version, from its metadata (never a hard-coded string), and what a result
records of the code that produced it: the commit and the date."""

from __future__ import annotations

import datetime
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

__all__ = ("package_version", "provenance", "source_commit")


def package_version() -> str:
    """The installed version of asyncgraph (``"0+unknown"`` in a tree never installed)."""
    try:
        return version("asyncgraph")
    except PackageNotFoundError:
        return "0+unknown"


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_commit(directory: Path | None = None) -> tuple[str | None, bool | None]:
    """The git commit checked out where *directory* is (by default this package's source), and
    whether tracked files differ from it: ``(None, None)`` outside a git checkout (a wheel)."""
    where = Path(__file__).resolve().parent if directory is None else directory
    commit = _git(where, "rev-parse", "HEAD")
    if commit is None:
        return None, None
    changes = _git(where, "status", "--porcelain", "--untracked-files=no")
    return commit, None if changes is None else bool(changes)


def provenance(directory: Path | None = None) -> dict[str, Any]:
    """What a result records of the code that produced it, and when: ``commit`` and ``dirty``
    (:func:`source_commit` of *directory*), ``date`` (now, ISO 8601 in UTC) and ``asyncgraph``
    (:func:`package_version`, which alone says nothing in a tree never installed)."""
    commit, dirty = source_commit(directory)
    return {
        "commit": commit,
        "dirty": dirty,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "asyncgraph": package_version(),
    }
