"""Writes ``docs/performance.md`` and the README's figures from the committed results.

Run from the project root::

    python benchmarks/report.py          # rewrite docs/performance.md and the README's figures
    python benchmarks/report.py --check  # exit 1, saying what differs, where either is stale

Every figure on the page comes from a results file under ``benchmarks/results/`` (one per
benchmark and device, each recording the commit it measured and the date). The page is never
edited by hand: edit this script or the results, then run it; the tests fail while the page
differs from what this script makes of the results (``tests/test_performance_page.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "performance.md"
README = ROOT / "README.md"
# The README's figures sit between these two lines.
README_START = "<!-- figures: made by benchmarks/report.py from benchmarks/results/ -->"
README_END = "<!-- end of figures -->"
HEADLINE = "asyncgraph_bench"  # the results of `python -m asyncgraph bench`, one file per loop
LOOPS = ("asyncio", "uvloop")
# A label's run-time part, which becomes a column: "(asyncio)", "(compiled)", ", uvloop 20 us".
_COLUMN = re.compile(
    r"\s*\((asyncio|uvloop|python|Python|compiled|reference)\)|(?<=core), (asyncio|uvloop)"
)
_RUN_NAMES = {"python": "Python core"}

# Each benchmark the page shows, in its order: (file-name stem, title, what it measures, page);
# each is measured by benchmarks/<stem>.py but "server" (examples/server/load.py).
BENCHMARKS: tuple[tuple[str, str, str, str], ...] = (
    (
        "bench_dispatch",
        "Dispatch",
        "awaited dispatches beside raw CUDA, CuPy and PyTorch; 64 tasks; 64 MiB round trips",
        "dispatch.md",
    ),
    (
        "bench_resident",
        "Resident buffers",
        "a dispatch on resident buffers beside CuPy's and PyTorch's",
        "resident.md",
    ),
    (
        "bench_graphs",
        "CUDA graphs",
        "captured replays beside raw, CuPy and PyTorch graphs; graph='auto' beside 'never'",
        "graphs.md",
    ),
    (
        "bench_batch",
        "Batching",
        "requests through a batcher beside one dispatch per request, with and without HTTP",
        "batching.md",
    ),
    (
        "bench_load",
        "A service under load",
        "the example service's requests/s and tail latency beside a floor without the GPU work",
        "serving.md",
    ),
    (
        "bench_priority",
        "Priority classes",
        "high-priority 4 KiB round trips beside low-priority work that fills the GPU",
        "jobs.md",
    ),
    (
        "bench_latency",
        "Long kernels",
        "how late an awaited kernel of 20 µs to 10 ms completes, and the loop's CPU meanwhile",
        "core.md",
    ),
    (
        "bench_serve_torch",
        "Serving PyTorch",
        "a PyTorch MLP served through backend.wait() and ag.batch beside blocking calls",
        "serving-pytorch.md",
    ),
    (
        "bench_transfer",
        "Transfers",
        "uploads, downloads and peer copies beside pageable copies and PyTorch's",
        "pools.md",
    ),
    (
        "bench_scale",
        "Several GPUs",
        "a group and a Ray pool of two GPUs beside one",
        "scale-out.md",
    ),
    (
        "bench_heal",
        "A GPU fault and its replacement",
        "runs after an actor's GPU fails, and how soon its replacement serves",
        "scale-out.md",
    ),
    (
        "soak_faults",
        "Soak with faults",
        "200,000 runs over two Ray actors with a GPU fault every 50,000",
        "scale-out.md",
    ),
    (
        "soak",
        "Soak",
        "300,000 dispatches from 16 tasks: wrong results, failures, memory growth",
        "reliability.md",
    ),
    ("server", "The example service", "the example service's requests/s over HTTP", "serving.md"),
    (
        "bench_ray",
        "Ray actors",
        "a call through the actor pool beside a plain Ray actor's",
        "scale-out.md",
    ),
    (
        "bench_core",
        "The dispatch core",
        "the compiled core's calls beside the Python core's, on the stand-in driver",
        "core.md",
    ),
    (
        "bench_host_path",
        "The host path",
        "the dispatch path's own cost on the stand-in driver, per core",
        "core.md",
    ),
    (
        "primitives",
        "CUDA primitives",
        "what the driver calls asyncgraph builds on cost, without asyncgraph",
        "pools.md",
    ),
)

SCRIPTS = {"server": "examples/server/load.py"}

Cell = float | str | None


# -- reading -------------------------------------------------------------------------------------


def results_files(stem: str, folder: Path = RESULTS) -> list[Path]:
    """The JSON results of benchmark *stem* (one per device), by name."""
    return sorted(p for p in folder.glob(f"{stem}-*.json"))


def device_of(path: Path, stem: str) -> str:
    """The device part of a results file's name (``NVIDIA-H100-80GB-HBM3-x2``)."""
    return path.stem.removeprefix(f"{stem}-")


_DRIVER = re.compile(r"\bdriver (\d{3}\.\d+(?:\.\d+)?)\b")


def provenance(data: Mapping[str, Any], path: Path | None = None) -> tuple[str, str, str]:
    """(commit, date, driver) a results file records; ``"not recorded"`` where it does not.

    The driver is the JSON's, else the one the text table beside it (*path* with ``.txt``)
    names in its first lines."""
    recorded = data.get("recorded") or {}
    commit = data.get("measured_commit") or recorded.get("commit") or "not recorded"
    date = str(recorded.get("date") or "not recorded")[:10]
    driver = data.get("driver") or recorded.get("driver")
    text = path.with_suffix(".txt") if path is not None else None
    if driver is None and text is not None and text.exists():
        found = _DRIVER.search("\n".join(text.read_text(encoding="utf-8").splitlines()[:5]))
        driver = found.group(1) if found else None
    if driver is None and "driver_api" in data:
        api = int(data["driver_api"])
        driver = f"CUDA {api // 1000}.{api % 1000 // 10}"
    elif driver is not None and re.fullmatch(r"\d+\.\d+", str(driver)):
        driver = f"CUDA {driver}"
    return str(commit), date, str(driver or "not recorded")


def _as_number(value: Any) -> Cell:
    if isinstance(value, bool) or value is None:
        return None if value is None else str(value).lower()
    if isinstance(value, int | float):
        return float(value)
    return str(value)


def _bound(label: str, entry: Mapping[str, Any]) -> str:
    for op in ("<=", ">=", "<", ">"):
        if op in entry:
            return f"{label} {op} {entry[op]:g}"
    return label


def targets(data: Mapping[str, Any]) -> list[tuple[str, Cell, str]]:
    """A results file's targets as (label with its bound, measured, ``met``/``missed``/``""``),
    from each of the forms the benchmarks write."""
    from asyncgraph._bench._bench_results import verdict

    raw = data.get("targets")
    rows: list[tuple[str, Cell, str]] = []
    if isinstance(raw, list):
        for entry in raw:
            met = entry.get("met")
            rows.append(
                (
                    entry["target"],
                    _as_number(entry["measured"]),
                    _met(met) if met is not None else "",
                )
            )
        return rows
    for label, value in (raw or {}).items():
        if isinstance(value, Mapping):
            label = _bound(label, value)
            measured = _as_number(value.get("measured"))
            if "met" in value:
                rows.append((label, measured, _met(value["met"])))
                continue
        else:
            measured = _as_number(value)
        judged = verdict(label, measured) if isinstance(measured, float) else ""
        rows.append((label, measured, judged))
    return rows


def _met(met: Any) -> str:
    return "met" if met else "missed"


def figures(stem: str, data: Mapping[str, Any]) -> list[tuple[str, Cell, str]]:
    """What a file without targets shows: (label, value, ``""``)."""
    rows: list[tuple[str, Cell, str]] = []
    if stem == "bench_core":
        rows += [(f"{r['call']}, ns ({r['core']})", r["ns"], "") for r in data["calls_ns"]]
        rows += [(f"{r['row']}, p50 µs ({r['core']})", r["p50"], "") for r in data["wakes_us"]]
    elif stem == "bench_host_path":
        for core in data["cores"].values():
            name = "compiled" if "compiled" in core["core"].lower() else "Python"
            rows += [
                (f"{r['row']}, {r['path']} path, µs ({name})", r["us"], "") for r in core["rows"]
            ]
    elif stem == "bench_ray":
        rows += [
            (f"{r['row']}: pool / plain actor", _as_number(r["ratio"]), "") for r in data["rows"]
        ]
    elif stem == "primitives":
        rows += [(f"{k}, µs", v, "") for k, v in data["us"].items()]
    elif stem == "server":
        for key, run in data["runs"].items():
            if key.endswith("-1"):
                rows.append(
                    (f"{key.removesuffix('-1')}: requests/s, first run", run["requests_per_s"], "")
                )
    elif stem in {"soak", "soak_faults"}:
        for key, value in data.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                rows.append((key.replace("_", " "), float(value), ""))
        if "latency_us" in data:
            rows += [(f"latency {k}, µs", v, "") for k, v in data["latency_us"].items()]
    return rows


def rows_of(stem: str, data: Mapping[str, Any]) -> list[tuple[str, Cell, str]]:
    """The rows a results file (or one run of it) shows."""
    return targets(data) if "targets" in data else figures(stem, data)


# -- laying out ----------------------------------------------------------------------------------


def number(value: Cell) -> str:
    """A figure as the page writes it: three decimals below 10, one below 100, whole above."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if math.isnan(value):
        return "did not run"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def markdown_table(
    header: Sequence[str], rows: Iterable[Sequence[str]], left: int = 1
) -> list[str]:
    """A Markdown table, its first *left* columns left-aligned and the others right-aligned."""
    align = [":---"] * left + ["---:"] * (len(header) - left)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def _cell(label: str, value: Cell, judged: str) -> str:
    mark = "" if label.startswith("(info)") else {"met": " ✓", "missed": " ✗"}.get(judged, "")
    return number(value) + mark


def pivot(columns: Mapping[str, list[tuple[str, Cell, str]]]) -> tuple[list[str], list[list[str]]]:
    """One row per label and one column per (source, loop): a label's ``(asyncio)`` and
    ``(uvloop)`` become two columns of one row."""
    split = any(_COLUMN.search(label) for rows in columns.values() for label, _, _ in rows)
    header: list[str] = []
    cells: dict[str, dict[str, str]] = {}
    for source, rows in columns.items():
        for label, value, judged in rows:
            loop = ""
            if split:
                found = _COLUMN.search(label)
                loop = (found.group(1) or found.group(2)).lower() if found else ""
                label = _COLUMN.sub("", label, count=1)
            column = " ".join(part for part in (source, loop) if part) or "measured"
            if column not in header:
                header.append(column)
            cells.setdefault(label, {})[column] = _cell(label, value, judged)
    body = [[label, *(by.get(column, "") for column in header)] for label, by in cells.items()]
    return header, body


def _link(path: Path) -> str:
    return f"[{path.name}](../benchmarks/results/{path.name})"


def benchmark_section(stem: str, title: str, what: str, page: str) -> list[str]:
    """A benchmark's heading, where and when each of its files measured, and its table."""
    files = results_files(stem)
    if not files:
        return []
    script = SCRIPTS.get(stem, f"benchmarks/{stem}.py")
    lines = [f"## {title}", "", f"`{script}`: {what} ([{page}]({page})).", ""]
    if len(files) == 1:
        lines = lines[:-1]  # its one measurement is the paragraph's second line, not a list
    columns: dict[str, list[tuple[str, Cell, str]]] = {}
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        device = str(data.get("device", device_of(path, stem)))
        if device_of(path, stem).endswith("-x2") and not device.startswith("2"):
            device = f"2 x {device}"
        commit, date, driver = provenance(data, path)
        measured = f"{device}, driver {driver}, {date}, commit `{commit}`: {_link(path)}"
        lines.append(f"- {measured}" if len(files) > 1 else f"Measured on {measured}.")
        source = device if len(files) > 1 else ""
        runs = data.get("runs")
        if (
            isinstance(runs, Mapping)
            and all(isinstance(r, Mapping) for r in runs.values())
            and any("targets" in r for r in runs.values())
        ):
            for name, run in runs.items():
                label = _RUN_NAMES.get(name, f"run {name}")
                columns[" ".join(p for p in (source, label) if p)] = rows_of(stem, run)
        else:
            columns[source] = rows_of(stem, data)
    header, body = pivot(columns)
    lines += ["", *markdown_table(["", *header], body), ""]
    return lines


def headline() -> tuple[list[str], dict[str, dict[str, float]]]:
    """The headline table from `python -m asyncgraph bench`'s results, and its medians by
    scenario and label (and loop, for asyncgraph's own rows)."""
    lines: list[str] = []
    columns: dict[str, dict[tuple[str, str], str]] = {}
    order: list[tuple[str, str]] = []
    medians: dict[str, dict[str, float]] = {}
    meta: list[str] = []
    for loop in LOOPS:
        found = results_files(f"{HEADLINE}_{loop}")
        for path in found:
            data = json.loads(path.read_text(encoding="utf-8"))
            commit, date, driver = provenance(data, path)
            meta.append(
                f"- {data['device']}, driver {driver}, {loop}, {date}, "
                f"commit `{commit}`: {_link(path)}"
            )
            for row in data["rows"]:
                key = (row["scenario"], row["label"])
                if key not in order:
                    order.append(key)
                if row["kind"] == "rate":
                    value = float(row["dispatches_per_s"])
                    text = f"{value:,.0f} /s"
                else:
                    value = float(row["median_us"])
                    text = f"{value:.1f} (p99 {row['p99_us']:.1f})"
                columns.setdefault(loop, {})[key] = text
                name = row["label"] if row["source"] == "peer" else f"{row['label']} ({loop})"
                medians.setdefault(row["scenario"], {}).setdefault(name, value)  # asyncio's first
    body = [
        [scenario, label, *(columns[loop].get((scenario, label), "") for loop in columns)]
        for scenario, label in order
    ]
    lines += [*meta, ""]
    header = ["scenario", "row", *(f"{loop}, µs" for loop in columns)]
    lines += markdown_table(header, body, left=2)
    return lines, medians


def page() -> str:
    """docs/performance.md as the results make it."""
    table, _ = headline()
    lines = [
        "# Performance",
        "",
        "<!-- Made by `python benchmarks/report.py` from benchmarks/results/: do not edit. -->",
        "",
        "What asyncgraph costs on the machines named with each table.",
        "`python benchmarks/report.py` wrote this page from the results files under",
        "`benchmarks/results/` (one per benchmark and device, with the commit it measured and",
        "the date); the tests fail while the page differs from what it makes of them. To measure",
        "your own machine, run `python -m asyncgraph bench` ([bench.md](bench.md)). A target's",
        "label ends with its bound; ✓ marks a target met, ✗ one missed. Times are medians in µs",
        "unless a row says otherwise.",
        "",
        "## An awaited dispatch beside raw CUDA, CuPy and PyTorch",
        "",
        "`python -m asyncgraph bench`: the median latency, and its p99, of each way to do the",
        "same work; the last row is dispatches per second from 64 tasks awaiting at once.",
        "",
        *table,
        "",
    ]
    for stem, title, what, where in BENCHMARKS:
        lines += benchmark_section(stem, title, what, where)
    return "\n".join(lines).rstrip("\n") + "\n"


def readme_figures() -> str:
    """The README's four figures, from the headline results."""
    _, medians = headline()

    def median(scenario: str, start: str) -> str:
        found = [v for k, v in medians.get(scenario, {}).items() if k.startswith(start)]
        if not found:
            return "—"
        return f"{found[0]:,.0f}" if found[0] >= 1000 else f"{found[0]:.1f}"

    device = json.loads(results_files(f"{HEADLINE}_asyncio")[0].read_text(encoding="utf-8"))[
        "device"
    ]
    rows = [
        ["empty kernel, awaited (µs)", "empty kernel", "raw"],
        ["4 KiB round trip (µs)", "4 KiB round trip", ""],
        ["resident 4 KiB dispatch (µs)", "4 KiB resident", ""],
    ]
    body = []
    for name, scenario, _ in rows:
        body.append(
            [
                name,
                median(scenario, "asyncgraph: await dispatch (asyncio)")
                if scenario != "4 KiB resident"
                else median(
                    scenario, "asyncgraph: await dispatch, buffer in, buffer out (asyncio)"
                ),
                median(scenario, "raw"),
                median(scenario, "CuPy"),
                median(scenario, "PyTorch"),
            ]
        )
    rate = median("64 tasks, empty kernel", "asyncgraph: 64 tasks awaiting at once (asyncio)")
    body.append(["dispatches/s, 64 tasks", rate, "—", "—", "—"])
    lines = [
        README_START,
        f"Medians on one {device} under asyncio, from `python -m asyncgraph bench`",
        "([docs/performance.md](docs/performance.md) has the rest and where each was measured;",
        "— : not measured by that benchmark):",
        "",
        *markdown_table(["", "asyncgraph", "raw CUDA", "CuPy", "PyTorch"], body),
        README_END,
    ]
    return "\n".join(lines)


def readme(current: str) -> str:
    """*current* README text with its figures made again."""
    start, end = current.index(README_START), current.index(README_END) + len(README_END)
    return current[:start] + readme_figures() + current[end:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail where a page is stale")
    args = parser.parse_args(argv)
    wanted = {PAGE: page(), README: readme(README.read_text(encoding="utf-8"))}
    stale = [path for path, text in wanted.items() if path.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(
                f"{path.relative_to(ROOT)} differs from the results: "
                "run python benchmarks/report.py"
            )
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
