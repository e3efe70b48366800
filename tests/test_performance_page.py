"""docs/performance.md and the README's figures are what ``benchmarks/report.py`` makes of the
committed results, and the results are one current file per benchmark and device, each saying
what it measured and when."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from benchmarks import report

HASH_WORD = re.compile(r"\b[0-9a-f]{7}\b")


def test_the_performance_page_is_what_the_results_make() -> None:
    assert report.PAGE.read_text(encoding="utf-8") == report.page(), (
        "docs/performance.md is stale: run python benchmarks/report.py"
    )


def test_the_readmes_figures_are_what_the_results_make() -> None:
    current = report.README.read_text(encoding="utf-8")
    assert report.readme(current) == current, "README.md is stale: run python benchmarks/report.py"


def test_the_check_fails_on_a_stale_page(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "performance.md"
    stale.write_text(report.page().replace("✓", "✗", 1), encoding="utf-8")
    monkeypatch.setattr(report, "PAGE", stale)
    monkeypatch.setattr(report, "ROOT", tmp_path)
    assert report.main(["--check"]) == 1
    assert capsys.readouterr().out == (
        "performance.md differs from the results: run python benchmarks/report.py\n"
    )


def test_every_results_file_records_the_commit_and_date_it_measured() -> None:
    for path in sorted(report.RESULTS.glob("*.json")):
        commit, date, _ = report.provenance(json.loads(path.read_text(encoding="utf-8")))
        assert re.fullmatch(r"[0-9a-f]{40}", commit), path.name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), path.name


def test_the_results_are_few_and_named_after_benchmarks_and_devices() -> None:
    names = sorted(path.name for path in report.RESULTS.iterdir())
    assert len(names) <= 45
    known = (
        {stem for stem, *_ in report.BENCHMARKS}
        | {f"{report.HEADLINE}_{loop}" for loop in report.LOOPS}
        | {"sanitize"}
    )
    for name in names:
        assert name.split("-", 1)[0] in known, name
        assert not HASH_WORD.search(name.replace("-", " ").replace("_", " ")), name


def test_the_page_names_no_short_commit() -> None:
    assert not HASH_WORD.search(report.page())


def test_targets_are_read_from_each_form_the_benchmarks_write() -> None:
    data = {
        "targets": {
            "a / b (asyncio) <= 1.0": 0.5,
            "c / d (uvloop)": {"measured": 2.0, ">=": 3.0},
            "e (asyncio) >= 1": {"measured": 0.9, "met": False},
        }
    }
    assert report.targets(data) == [
        ("a / b (asyncio) <= 1.0", 0.5, "met"),
        ("c / d (uvloop) >= 3", 2.0, "missed"),
        ("e (asyncio) >= 1", 0.9, "missed"),
    ]
    listed = {"targets": [{"target": "replaced within 60 s", "measured": "1.09 s", "met": True}]}
    assert report.targets(listed) == [("replaced within 60 s", "1.09 s", "met")]


def test_a_labels_loop_becomes_a_column() -> None:
    header, body = report.pivot(
        {"": [("x (asyncio) <= 1", 0.5, "met"), ("x (uvloop) <= 1", 1.5, "missed")]}
    )
    assert header == ["asyncio", "uvloop"]
    assert body == [["x <= 1", "0.500 ✓", "1.500 ✗"]]


def test_the_driver_comes_from_the_json_else_from_the_table_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "bench_x-NVIDIA-H100.json"
    recorded = {"recorded": {"commit": "a" * 40, "date": "2026-11-27T17:46:45+00:00"}}
    assert report.provenance(recorded, path) == ("a" * 40, "2026-11-27", "not recorded")
    path.with_suffix(".txt").write_text("bench_x on one NVIDIA H100 (driver 580.159.04)\n")
    assert report.provenance(recorded, path)[2] == "580.159.04"
    assert report.provenance({**recorded, "driver": "13.0"}, path)[2] == "CUDA 13.0"
