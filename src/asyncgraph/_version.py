"""The package's version, from its metadata (never a hard-coded string)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ("package_version",)


def package_version() -> str:
    """The installed version of asyncgraph (``"0+unknown"`` in a tree never installed)."""
    try:
        return version("asyncgraph")
    except PackageNotFoundError:
        return "0+unknown"
