"""Command line: ``python -m asyncgraph info | demo | bench``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import platform
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import structlog

from asyncgraph._bench._bench_results import version_of
from asyncgraph._opening._detect import probe_cuda

from ._runtime._exceptions import DeviceUnavailableError, UnsupportedError

BENCH_REPS = 3000  # timed repetitions of each latency row: seconds on a GPU, imports aside
QUICK_REPS = 20


def _nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"not found ({first}); install the extra: pip install 'asyncgraph[nvrtc]'"
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return f"unusable ({err.name})"
    return f"{major}.{minor}"


def _core_description() -> str:
    try:
        from asyncgraph._cuda.core._choose import describe
    except Exception as exc:  # cuda-bindings cannot even be imported
        return f"unavailable ({type(exc).__name__}: {exc})"
    return describe()


def info() -> int:
    """Print versions, what CUDA the machine has, and the backend 'auto' picks."""
    from ._runtime._version import package_version

    print(f"asyncgraph     {package_version()}")
    print(f"python         {platform.python_version()} ({sys.executable})")
    for package in ("numpy", "cuda-core", "cuda-bindings", "anyio", "attrs", "structlog"):
        print(f"{package:<14} {version_of(package)}")
    print(f"nvrtc          {_nvrtc_version()}")
    print(f"dispatch core  {_core_description()}")
    probe = probe_cuda()
    driver = ".".join(map(str, probe.driver_version)) if probe.driver_version else "none"
    print(f"cuda driver    {driver}")
    print(f"cuda           {'available' if probe.available else 'unavailable'}: {probe.reason}")
    for dev in probe.devices:
        cc = ".".join(map(str, dev.compute_capability))
        print(
            f"  cuda:{dev.ordinal}  {dev.name}  sm_{cc.replace('.', '')}  "
            f"{dev.total_memory / 2**30:.1f} GiB"
        )
    print(f"auto picks     {'cuda:0' if probe.available else 'host'}")
    return 0


def duration(seconds: float) -> str:
    """*seconds* for a reader: in microseconds up to 10,000 of them, in milliseconds past."""
    if seconds * 1e6 < 10_000:
        return f"{seconds * 1e6:,.1f} us"
    return f"{seconds * 1e3:,.1f} ms"


@contextlib.contextmanager
def _warnings_only() -> Iterator[None]:
    """structlog's warnings and errors only, on stderr, while the demo runs: its output is its
    results. structlog's configuration is as it was afterwards (the command is a program; the
    library itself never configures structlog)."""
    configured, config = structlog.is_configured(), structlog.get_config()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    try:
        yield
    finally:
        if configured:
            structlog.configure(**config)
        else:
            structlog.reset_defaults()


def demo(device: str, dispatches: int, parser: argparse.ArgumentParser) -> int:
    """Run the demo; exit status 1 on any mismatch, 2 (with the reason) if *device* cannot be
    opened."""
    from asyncgraph._demo._demo import TOLERANCE, demo_main

    try:
        with _warnings_only():
            report = asyncio.run(demo_main(device, dispatches))
    except (UnsupportedError, DeviceUnavailableError) as exc:
        parser.error(str(exc))
    print(f"backend        {report.backend}")
    print(f"dispatches     {report.dispatches} concurrent (saxpy, block_sum, laplace2d)")
    print(f"throughput     {report.rate:,.0f} dispatches/s ({report.seconds:.3f} s)")
    print(
        f"queue wait     p50 {duration(report.queue_wait_p50)}   "
        f"p99 {duration(report.queue_wait_p99)}"
    )
    print(f"latency        p50 {duration(report.latency_p50)}   p99 {duration(report.latency_p99)}")
    print(f"worst error    {report.worst_error:.2e} (tolerance {TOLERANCE:.0e})")
    if report.mismatches:
        print(f"FAILED: {report.mismatches} of {report.dispatches} results mismatched numpy")
        return 1
    print(f"OK: all {report.dispatches} results match numpy")
    return 0


def bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the bench: progress on stderr, the table on stdout, then the JSON and the plot."""
    from asyncgraph._bench._bench_peers import PEER_ROWS
    from asyncgraph._bench._bench_report import (
        PLOT_HINT,
        BenchSettings,
        default_path,
        format_report,
        write_json,
        write_plot,
    )
    from asyncgraph._bench._bench_run import run

    if args.reps < 1:
        parser.error("--reps must be at least 1")
    settings = BenchSettings.scaled(QUICK_REPS if args.quick else args.reps)
    try:
        with _warnings_only():  # the progress bar on stderr, the table alone on stdout
            report = run(args.device, settings, PEER_ROWS, sys.stderr, args.loop)
    except (UnsupportedError, DeviceUnavailableError) as exc:
        parser.error(str(exc))
    print(format_report(report))
    print()
    json_path = write_json(report, args.json or default_path(report.device, ".json"))
    print(f"json           {json_path}")
    if not args.no_plot:
        plot = write_plot(report, args.plot or default_path(report.device, ".png"))
        note = plot if plot is not None else f"not written: matplotlib is missing; {PLOT_HINT}"
        print(f"plot           {note}")
    return 0


def _bench_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "bench",
        help="asyncgraph's dispatch latency beside raw CUDA, CuPy and PyTorch: table, JSON, plot",
    )
    parser.add_argument(
        "--device",
        default="auto",
        help="auto (a GPU if there is one, else host), host, cuda, cuda:N",
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop (default asyncio); uvloop must be installed",
    )
    reps = parser.add_mutually_exclusive_group()
    reps.add_argument(
        "--reps",
        type=int,
        default=BENCH_REPS,
        help=f"timed repetitions of each latency row (default {BENCH_REPS}); a tenth of it "
        "warms up, and each of the 64 tasks awaits a tenth of it",
    )
    reps.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_REPS} repetitions: a smoke test, not a measure",
    )
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="default: ./asyncgraph-bench-<device>.json"
    )
    plot = parser.add_mutually_exclusive_group()
    plot.add_argument(
        "--plot",
        type=Path,
        metavar="PATH",
        help="the PNG of the latencies (default: ./asyncgraph-bench-<device>.png); "
        "needs matplotlib: pip install 'asyncgraph[plot]'",
    )
    plot.add_argument("--no-plot", action="store_true", help="write no plot")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m asyncgraph`` and the ``asyncgraph`` script."""
    parser = argparse.ArgumentParser(
        prog="python -m asyncgraph",
        description="asyncgraph's command line: python -m asyncgraph info | demo | bench",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, CUDA driver and devices, the backend 'auto' picks")
    demo_parser = sub.add_parser(
        "demo", help="run many concurrent dispatches of three kernels and check each result"
    )
    demo_parser.add_argument("--device", default="auto", help="auto, host, cuda, cuda:N")
    demo_parser.add_argument(
        "--dispatches",
        type=int,
        default=1200,
        help="concurrent dispatches to run, the three kernels in turn (default 1200)",
    )
    bench_parser = _bench_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    if args.command == "bench":
        return bench(args, bench_parser)
    if args.dispatches < 1:
        demo_parser.error("--dispatches must be at least 1")
    return demo(args.device, args.dispatches, demo_parser)


if __name__ == "__main__":
    sys.exit(main())
