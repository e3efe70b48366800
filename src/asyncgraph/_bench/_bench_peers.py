"""The peers ``python -m asyncgraph bench`` measures asyncgraph against, on CUDA devices only.

- raw CUDA: ``cuLaunchKernel`` + ``cuEventRecord`` + a busy ``cuEventQuery`` loop, through
  ``cuda.bindings``, the floor under an awaited empty dispatch;
- CuPy, synchronous: ``cp.asarray`` + the same ``scale`` kernel + ``cp.asnumpy``; and the kernel
  over arrays already on the device + ``stream.synchronize()``;
- PyTorch, synchronous: ``torch.from_numpy(x).cuda()``, ``* a``, ``.cpu().numpy()``; and
  ``torch.mul`` over tensors already on the device + ``torch.cuda.synchronize()``.

Each row is skipped, with the reason, where it cannot run: on the host backend ("no CUDA
device"), where its library is not importable, or where it failed. CuPy and PyTorch are
imported only here, inside the rows, after asyncgraph's rows ran.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from ._bench_report import BenchSettings, LatencyRow, Row, SkippedRow
from ._bench_run import (
    BLOCK,
    COUNT,
    EMPTY_KERNEL,
    EMPTY_SOURCE,
    FACTOR,
    GRID,
    RESIDENT,
    ROUND_TRIP,
    SCALE_SOURCE,
    Spec,
    Target,
    expect_scaled,
)
from ._harness import samples_sync

__all__ = ("PEER_ROWS", "Peer", "time_sync")

Array = np.ndarray[Any, Any]


def time_sync(fn: Callable[[], object], settings: BenchSettings) -> list[float]:
    """Call *fn* ``settings.warmup`` times, then time ``settings.reps`` calls one by one.

    Returns:
        The latency of each timed call, in µs.
    """
    return [s * 1e6 for s in samples_sync(fn, settings.reps, settings.warmup)]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


@attrs.frozen(kw_only=True)
class Peer:
    """A peer's row of latencies on a CUDA device.

    Attributes:
        scenario: the scenario it stands beside asyncgraph in.
        label: what it measures, naming the peer.
        missing: why the peer cannot run here (its library is not importable...), or ``None``.
        measure: the samples in µs on the target and its CUDA device ordinal.
    """

    scenario: str
    label: str
    missing: Callable[[], str | None]
    measure: Callable[[Target, int], list[float]]
    source: str = "peer"

    async def run(self, target: Target) -> Row:
        """Measure the row on *target*, or skip it, saying why."""
        if target.device is None:
            return self._skipped("no CUDA device")
        reason = self.missing()
        if reason is not None:
            return self._skipped(reason)
        try:
            samples = self.measure(target, target.device.ordinal)
        except Exception as exc:  # a broken peer costs its own row, not the bench
            return self._skipped(f"failed: {_first_line(exc)}")
        return LatencyRow(
            scenario=self.scenario, label=self.label, source=self.source, samples_us=tuple(samples)
        )

    def _skipped(self, reason: str) -> SkippedRow:
        return SkippedRow(
            scenario=self.scenario, label=self.label, source=self.source, reason=reason
        )


def _importable(module: str, name: str) -> Callable[[], str | None]:
    """A ``missing`` check: why *module* (the library *name*) cannot be imported, or ``None``."""

    def missing() -> str | None:
        try:
            importlib.import_module(module)
        except Exception as exc:
            if isinstance(exc, ModuleNotFoundError) and exc.name == module:
                return f"{name} is not installed"
            return f"{name} cannot be imported: {_first_line(exc)}"
        return None

    return missing


def _nothing_missing() -> str | None:
    return None  # cuda.core and cuda.bindings are asyncgraph's own dependencies


_cupy_missing = _importable("cupy", "CuPy")


def _torch_missing() -> str | None:
    reason = _importable("torch", "PyTorch")()
    if reason is None and not importlib.import_module("torch").cuda.is_available():
        return "PyTorch was built without CUDA, or sees no device"
    return reason


# -- raw CUDA ----------------------------------------------------------------------------------


def _raw_empty(target: Target, ordinal: int) -> list[float]:
    from cuda.bindings import driver as drv
    from cuda.core import Device, Program, ProgramOptions, StreamOptions

    from asyncgraph._cuda.driver._driver import check

    device = Device(ordinal)
    device.set_current()
    arch = "sm_" + "".join(map(str, device.compute_capability))
    code = Program(EMPTY_SOURCE, code_type="c++", options=ProgramOptions(arch=arch))
    kernel = code.compile("cubin").get_kernel("empty")
    function = check(
        drv.cuKernelGetFunction(drv.CUkernel(int(kernel.handle))), "cuKernelGetFunction"
    )
    stream = device.create_stream(options=StreamOptions(nonblocking=True))
    handle = drv.CUstream(int(stream.handle))
    event = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
    # The parameter block cuLaunchKernel reads: the address of each argument's value.
    value = np.ones(1, np.int32)
    addresses = np.array([value.ctypes.data], np.uint64)
    params = int(addresses.ctypes.data)
    not_ready = drv.CUresult.CUDA_ERROR_NOT_READY

    def launch() -> Any:
        return drv.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, handle, params, 0)

    def round_trip() -> None:
        launch()
        drv.cuEventRecord(event, handle)
        while drv.cuEventQuery(event)[0] == not_ready:
            pass

    try:
        check(launch(), "cuLaunchKernel")
        check(drv.cuStreamSynchronize(handle), "cuStreamSynchronize")
        return time_sync(round_trip, target.settings)
    finally:
        check(drv.cuEventDestroy(event), "cuEventDestroy")
        stream.close()


# -- CuPy --------------------------------------------------------------------------------------


def _cupy_round_trip(target: Target, ordinal: int) -> list[float]:
    import cupy as cp

    x = target.x
    with cp.cuda.Device(ordinal):
        kernel = cp.RawKernel(SCALE_SOURCE, "scale")

        def work() -> Array:
            d_x = cp.asarray(x)
            d_out = cp.empty_like(d_x)
            kernel((GRID,), (BLOCK,), (d_x, d_out, FACTOR, COUNT))
            result: Array = cp.asnumpy(d_out)
            return result

        samples = time_sync(work, target.settings)
        expect_scaled("CuPy round trip", work(), x)
    return samples


def _cupy_resident(target: Target, ordinal: int) -> list[float]:
    import cupy as cp

    with cp.cuda.Device(ordinal):
        kernel = cp.RawKernel(SCALE_SOURCE, "scale")
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            d_x = cp.asarray(target.x)
            d_out = cp.empty_like(d_x)

            def work() -> None:
                kernel((GRID,), (BLOCK,), (d_x, d_out, FACTOR, COUNT))
                stream.synchronize()

            samples = time_sync(work, target.settings)
            expect_scaled("CuPy resident", cp.asnumpy(d_out), target.x)
    return samples


# -- PyTorch -----------------------------------------------------------------------------------


def _torch_round_trip(target: Target, ordinal: int) -> list[float]:
    import torch

    x, factor = target.x, float(FACTOR)

    def work() -> Array:
        result: Array = (torch.from_numpy(x).cuda(ordinal) * factor).cpu().numpy()
        return result

    samples = time_sync(work, target.settings)
    expect_scaled("PyTorch round trip", work(), x)
    return samples


def _torch_resident(target: Target, ordinal: int) -> list[float]:
    import torch

    device = torch.device("cuda", ordinal)
    d_x = torch.from_numpy(target.x).to(device)
    d_out = torch.empty_like(d_x)
    factor = float(FACTOR)

    def work() -> None:
        torch.mul(d_x, factor, out=d_out)
        torch.cuda.synchronize(device)

    samples = time_sync(work, target.settings)
    expect_scaled("PyTorch resident", d_out.cpu().numpy(), target.x)
    return samples


PEER_ROWS: tuple[Spec, ...] = (
    Peer(
        scenario=EMPTY_KERNEL,
        label="raw: cuLaunchKernel + cuEventRecord + busy cuEventQuery",
        missing=_nothing_missing,
        measure=_raw_empty,
    ),
    Peer(
        scenario=ROUND_TRIP,
        label="CuPy: asarray + kernel + asnumpy, synchronous",
        missing=_cupy_missing,
        measure=_cupy_round_trip,
    ),
    Peer(
        scenario=ROUND_TRIP,
        label="PyTorch: from_numpy().cuda() * a, .cpu().numpy(), synchronous",
        missing=_torch_missing,
        measure=_torch_round_trip,
    ),
    Peer(
        scenario=RESIDENT,
        label="CuPy: same kernel + stream.synchronize()",
        missing=_cupy_missing,
        measure=_cupy_resident,
    ),
    Peer(
        scenario=RESIDENT,
        label="PyTorch: torch.mul + torch.cuda.synchronize()",
        missing=_torch_missing,
        measure=_torch_resident,
    ),
)
"""The peers' rows, in the order they run."""
