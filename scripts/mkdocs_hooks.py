"""MkDocs hooks of the docs site (``mkdocs.yml``): the pages link the results files and the
sources beside ``docs/`` as ``../benchmarks/results/NAME`` (which works on a checkout and on a
forge); the site carries the results files under ``results/`` and those links point there, so
that a link to a file that is not there still fails the strict build."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
_RESULTS_LINK = re.compile(r"\]\(\.\./benchmarks/results/")


def on_files(files: Files, config: Any) -> Files:
    """Add the results files to the site, under ``results/``."""
    for path in sorted(RESULTS.iterdir()):
        files.append(
            File(
                f"results/{path.name}",
                src_dir=str(RESULTS.parent),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point the pages' links to results files at the site's copies."""
    depth = page.file.src_uri.count("/")
    return _RESULTS_LINK.sub("](" + "../" * depth + "results/", markdown)
