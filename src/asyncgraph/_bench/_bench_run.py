"""``python -m asyncgraph bench``: the scenarios, asyncgraph's rows, and one run of them all.

Four scenarios, each a group of rows in the table (:data:`SCENARIOS`):

- *empty kernel*: ``await backend.dispatch(EMPTY, np.int32(1), grid=1, block=1)``;
- *4 KiB round trip*: the ``scale`` kernel over a 4 KiB float32 array in and a new one out,
  awaited, with and without ``graph="auto"``;
- *4 KiB resident*: the same kernel from a resident buffer into another, awaited: the output
  buffer passed as it is (written in place, as the CuPy row does), and as
  ``Out(into=buffer)``, which zero-fills it first (one more memset);
- *64 tasks, empty kernel*: 64 tasks awaiting the empty kernel one dispatch after another,
  in dispatches per second.

The peers' rows beside them (raw CUDA, CuPy, PyTorch) are in ``_bench_peers``; :func:`run_bench`
takes them as arguments and runs every asyncgraph row first, before CuPy or PyTorch are
imported, so their threads and caches do not weigh on asyncgraph's figures.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TextIO

import attrs
import numpy as np

from asyncgraph._args._arguments import Out
from asyncgraph._args._kernel import Kernel
from asyncgraph._opening._detect import DeviceInfo, probe_cuda
from asyncgraph._opening._open import open_backend
from asyncgraph._runtime._exceptions import AsyncGraphError
from asyncgraph._runtime._version import package_version, provenance

from ._bench_report import (
    BenchReport,
    BenchSettings,
    LatencyRow,
    Progress,
    RateRow,
    Row,
)
from ._bench_results import machine, python_version, version_of
from ._harness import run as run_on
from ._harness import samples_async

if TYPE_CHECKING:
    from asyncgraph._front._backend import Backend

__all__ = (
    "ASYNCGRAPH_ROWS",
    "BLOCK",
    "CONCURRENT",
    "COUNT",
    "EMPTY",
    "EMPTY_KERNEL",
    "EMPTY_SOURCE",
    "FACTOR",
    "GRID",
    "RESIDENT",
    "ROUND_TRIP",
    "SCALE",
    "SCALE_SOURCE",
    "SCENARIOS",
    "Awaited",
    "N",
    "Spec",
    "Target",
    "Throughput",
    "expect_scaled",
    "run",
    "run_bench",
    "time_async",
)

Array = np.ndarray[Any, Any]

EMPTY_SOURCE = 'extern "C" __global__ void empty(int n) { }'


def _empty_host(n: np.int32) -> None:
    """The empty kernel's host implementation: nothing, like the kernel."""


EMPTY = Kernel(EMPTY_SOURCE, "empty", host=_empty_host)

SCALE_SOURCE = r"""
extern "C" __global__ void scale(const float* x, float* out, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i];
}
"""


def _scale_host(x: Array, out: Array, a: np.float32, n: np.int32) -> None:
    out[: int(n)] = a * x[: int(n)]


SCALE = Kernel(SCALE_SOURCE, "scale", host=_scale_host)

N = 1024  # float32 elements: 4 KiB
COUNT = np.int32(N)
BLOCK = 256
GRID = N // BLOCK
FACTOR = np.float32(2)

EMPTY_KERNEL = "empty kernel"
ROUND_TRIP = "4 KiB round trip"
RESIDENT = "4 KiB resident"
CONCURRENT = "64 tasks, empty kernel"
SCENARIOS = (EMPTY_KERNEL, ROUND_TRIP, RESIDENT, CONCURRENT)
"""The scenarios in the table's order."""


@attrs.frozen(kw_only=True)
class Target:
    """What every row runs on.

    Attributes:
        backend: the open backend.
        device: its CUDA device, or ``None`` on the host backend.
        settings: the repetitions.
        x: the 4 KiB float32 input every round trip scales.
    """

    backend: Backend
    device: DeviceInfo | None
    settings: BenchSettings
    x: Array


class Spec(Protocol):
    """A row to run: asyncgraph's (:class:`Awaited`, :class:`Throughput`) or a peer's."""

    @property
    def scenario(self) -> str:
        """One of :data:`SCENARIOS`."""

    @property
    def label(self) -> str:
        """What it measures, naming who."""

    @property
    def source(self) -> str:
        """``"asyncgraph"`` or ``"peer"``."""

    async def run(self, target: Target) -> Row:
        """Measure on *target*."""


def expect_scaled(label: str, got: Array, x: Array) -> None:
    """Check that *got* is ``FACTOR * x``, so that a row never times wrong work.

    Raises:
        AsyncGraphError: it is not.
    """
    if not np.array_equal(got, FACTOR * x):
        raise AsyncGraphError(
            f"{label}: the result is not {FACTOR} * x; the measurement would be meaningless"
        )


async def time_async(fn: Callable[[], Awaitable[object]], settings: BenchSettings) -> list[float]:
    """Await *fn()* ``settings.warmup`` times, then time ``settings.reps`` awaits one by one.

    Returns:
        The latency of each timed await, in µs.
    """
    return [s * 1e6 for s in await samples_async(fn, settings.reps, settings.warmup)]


# -- asyncgraph's rows -------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Awaited:
    """An asyncgraph row of latencies; *measure* returns the samples in µs."""

    scenario: str
    label: str
    measure: Callable[[Target], Awaitable[list[float]]]
    source: str = "asyncgraph"

    async def run(self, target: Target) -> Row:
        """See :meth:`Spec.run`."""
        samples = await self.measure(target)
        return LatencyRow(
            scenario=self.scenario, label=self.label, source=self.source, samples_us=tuple(samples)
        )


@attrs.frozen(kw_only=True)
class Throughput:
    """An asyncgraph row of dispatches per second; *measure* returns (dispatches, seconds)."""

    scenario: str
    label: str
    measure: Callable[[Target], Awaitable[tuple[int, float]]]
    source: str = "asyncgraph"

    async def run(self, target: Target) -> Row:
        """See :meth:`Spec.run`."""
        dispatches, seconds = await self.measure(target)
        return RateRow(
            scenario=self.scenario,
            label=self.label,
            source=self.source,
            dispatches=dispatches,
            seconds=seconds,
        )


async def _empty(target: Target) -> list[float]:
    backend, one = target.backend, np.int32(1)
    return await time_async(lambda: backend.dispatch(EMPTY, one, grid=1, block=1), target.settings)


def _round_trip(graph: str) -> Callable[[Target], Awaitable[list[float]]]:
    async def measure(target: Target) -> list[float]:
        backend, x, out = target.backend, target.x, Out(N, np.float32)

        def call() -> Awaitable[tuple[Any, ...]]:
            return backend.dispatch(
                SCALE, x, out, FACTOR, COUNT, grid=GRID, block=BLOCK, graph=graph
            )

        samples = await time_async(call, target.settings)
        (result,) = await call()
        expect_scaled(f"4 KiB round trip, graph={graph!r}", result, x)
        return samples

    return measure


def _resident(into: bool) -> Callable[[Target], Awaitable[list[float]]]:
    """The kernel from one resident buffer into another: passed as it is (the kernel writes
    it in place, as CuPy's does), or as ``Out(into=buffer)``, which zero-fills it first."""

    async def measure(target: Target) -> list[float]:
        backend = target.backend
        x = await backend.upload(target.x)
        out = backend.empty(N, np.float32)
        try:
            arg: object = Out(into=out) if into else out
            samples = await time_async(
                lambda: backend.dispatch(SCALE, x, arg, FACTOR, COUNT, grid=GRID, block=BLOCK),
                target.settings,
            )
            expect_scaled("4 KiB resident", await backend.download(out), target.x)
        finally:
            await x.aclose()
            await out.aclose()
        return samples

    return measure


async def _concurrent(target: Target) -> tuple[int, float]:
    backend, one, settings = target.backend, np.int32(1), target.settings

    async def task() -> None:
        for _ in range(settings.dispatches_per_task):
            await backend.dispatch(EMPTY, one, grid=1, block=1)

    await asyncio.gather(*(task() for _ in range(settings.tasks)))  # to warm up
    start = time.perf_counter()
    await asyncio.gather(*(task() for _ in range(settings.tasks)))
    return settings.tasks * settings.dispatches_per_task, time.perf_counter() - start


ASYNCGRAPH_ROWS: tuple[Spec, ...] = (
    Awaited(scenario=EMPTY_KERNEL, label="asyncgraph: await dispatch", measure=_empty),
    Awaited(scenario=ROUND_TRIP, label="asyncgraph: await dispatch", measure=_round_trip("never")),
    Awaited(
        scenario=ROUND_TRIP,
        label='asyncgraph: await dispatch, graph="auto"',
        measure=_round_trip("auto"),
    ),
    Awaited(
        scenario=RESIDENT,
        label="asyncgraph: await dispatch, buffer in, buffer out",
        measure=_resident(into=False),
    ),
    Awaited(
        scenario=RESIDENT,
        label="asyncgraph: await dispatch, buffer in, Out(into=buffer) out (zero-filled first)",
        measure=_resident(into=True),
    ),
    Throughput(
        scenario=CONCURRENT, label="asyncgraph: 64 tasks awaiting at once", measure=_concurrent
    ),
)


# -- the run -----------------------------------------------------------------------------------


def _device_of(backend: Backend) -> DeviceInfo | None:
    """The CUDA device *backend* runs on, or ``None`` on the host backend."""
    if backend.kind != "cuda":
        return None
    return next((d for d in probe_cuda().devices if f"cuda:{d.ordinal}" == backend.name), None)


def _loop_name() -> str:
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.partition(".")[0] == "uvloop" else "asyncio"


def _versions(loop: str) -> dict[str, str]:
    """Python's version and the packages' that the figures depend on."""
    versions = {"python": python_version(), "asyncgraph": package_version()}
    versions.update((name, version_of(name)) for name in ("numpy", "cuda-core", "cuda-bindings"))
    for module in ("cupy", "torch", loop):  # the peers that ran, and the loop
        version = getattr(sys.modules.get(module), "__version__", None)
        if version is not None:
            versions[module] = str(version)
    return versions


def _display_key(row: Row) -> tuple[int, bool]:
    """Scenario by scenario; within one, the peers first, then asyncgraph."""
    return SCENARIOS.index(row.scenario), row.source == "asyncgraph"


async def run_bench(
    device: str | int, settings: BenchSettings, peers: Sequence[Spec], progress: TextIO
) -> BenchReport:
    """Open a backend on *device*, run asyncgraph's rows and then *peers* on it, and report.

    Args:
        device: what ``open_backend`` takes: ``"auto"``, ``"host"``, ``"cuda"``, ``"cuda:N"``.
        settings: the repetitions.
        peers: the peers' rows (``_bench_peers.PEER_ROWS``); they skip themselves, with the
            reason, where they cannot run.
        progress: where the progress bar goes (stderr, say): one step per row.

    Raises:
        DeviceUnavailableError: *device* is not a device, or not one found here.
    """
    specs = (*ASYNCGRAPH_ROWS, *peers)
    async with open_backend(device) as backend:
        info = _device_of(backend)
        x = np.random.default_rng(0).standard_normal(N, dtype=np.float32)
        target = Target(backend=backend, device=info, settings=settings, x=x)
        bar = Progress(len(specs) + 1, progress)
        try:
            bar.start("compiling the kernels")
            for kernel in (EMPTY, SCALE):
                await backend.compile(kernel)
            rows = []
            for spec in specs:
                bar.start(f"{spec.scenario}: {spec.label}")
                rows.append(await spec.run(target))
        finally:
            bar.close()
    driver = probe_cuda().driver_version
    loop = _loop_name()
    return BenchReport(
        device=info.name if info is not None else "host",
        backend=backend.name,
        driver=".".join(map(str, driver)) if info is not None and driver else None,
        machine=machine(),
        loop=loop,
        settings=settings,
        versions=_versions(loop),
        rows=tuple(sorted(rows, key=_display_key)),
        recorded=provenance(),
    )


def run(
    device: str,
    settings: BenchSettings,
    peers: Sequence[Spec],
    progress: TextIO,
    loop: str = "asyncio",
) -> BenchReport:
    """:func:`run_bench` on a new event loop of the kind *loop* names (``"asyncio"``,
    ``"uvloop"``).

    Raises:
        UnsupportedError: *loop* is not installed, or not a loop (``_harness.loop_factory``).
    """
    return run_on(run_bench(device, settings, peers, progress), loop)
