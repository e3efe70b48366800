"""Large transfers: asyncgraph's chunked upload/download against pageable copies and CuPy.

For 16 MiB, 256 MiB and 1 GiB, in one run on one GPU (GB/s, medians after a warm-up):
- raw ``cuMemcpyHtoD`` / ``cuMemcpyDtoH`` from and to pageable numpy memory (synchronous);
- ``cupy.asarray`` / ``cupy.asnumpy``;
- ``await backend.upload(x)`` / ``await backend.download(buf)`` (chunked through pinned memory),
  with the event loop's worst stall meanwhile (a 0.5 ms heartbeat), and ``download(buf,
  out=array)`` into an array reused from before (the raw rows also copy into one, while a new
  array pays a page fault per page on first touch).
For reference (not a target), at 256 MiB and 1 GiB: a dispatch of a copy kernel with a numpy
input and output, which streams both in chunks once they exceed the pinned cap, against CuPy's
``asarray`` + the same kernel + ``asnumpy`` (GB/s of input + output).
Device-to-device copies at the same sizes (GB/s of the buffer's bytes): ``cuMemcpyDtoDAsync`` +
``cuStreamSynchronize`` through ``cuda.bindings`` between two allocations made once, against
``await backend.copy(buf)`` within one backend and ``await group.copy_to(buf, 1)`` between two
backends of the same device (each a new buffer: its allocation timed with the copy, its
``aclose()`` after it, in an ``(info)`` row of its own with it), and between two GPUs
(``cuMemcpyPeerAsync``) where the machine has them. There, in the same run, PyTorch's
cross-device ``b.copy_(a)`` (``cuda:0`` to ``cuda:1``) with a synchronize, one at a time, and
raw ``cuMemcpyPeerAsync`` between two memory pools' allocations before and after each pool gave
the other device access (``cuMemPoolSetAccess``).
Targets: asyncgraph at least 1.5x the pageable bandwidth at 256 MiB, both directions; an awaited
``copy_to`` between GPUs (allocation included) at least 0.7x PyTorch's ``copy_`` + synchronize
at 16 MiB and 0.9x at 256 MiB and 1 GiB.

Run on a GPU:  python benchmarks/bench_transfer.py --json [PATH]
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
from cuda.bindings import driver as drv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncgraph as ag
from benchmarks import harness
from benchmarks.bench_dispatch import COPY

SIZES = {"16 MiB": 16 << 20, "256 MiB": 256 << 20, "1 GiB": 1 << 30}
REPS = {"16 MiB": 30, "256 MiB": 8, "1 GiB": 4}
DISPATCHED = ("256 MiB", "1 GiB")  # sizes of the copy-kernel dispatch rows


def copy_launch(nbytes: int) -> tuple[int, int]:
    """(grid, block) of COPY over *nbytes* (16 bytes per thread)."""
    return -(-(nbytes // 16) // 256), 256


def gbps(nbytes: int, us: float) -> float:
    """GB/s of *nbytes* moved in *us* µs."""
    return nbytes / us / 1e3


async def median_time_async(fn: Callable[[], Awaitable[object]], reps: int) -> tuple[float, float]:
    """Median µs of *fn* after one warm-up await, and the loop's worst stall (s) while it ran."""
    await fn()
    async with harness.Heartbeat() as beat:
        us = await harness.time_async(fn, reps, warmup=0)
    return us, beat.worst


def raw_rows() -> dict[str, float]:
    from cuda.core import Device

    Device(0).set_current()
    rows = {}
    for label, nbytes in SIZES.items():
        host = np.ones(nbytes, np.uint8)
        dev = drv.cuMemAlloc(nbytes)[1]
        ptr = host.ctypes.data
        up = harness.time_sync(lambda: drv.cuMemcpyHtoD(dev, ptr, nbytes), REPS[label], 1)  # noqa: B023
        down = harness.time_sync(lambda: drv.cuMemcpyDtoH(ptr, dev, nbytes), REPS[label], 1)  # noqa: B023
        rows[f"pageable cuMemcpyHtoD {label}, GB/s"] = gbps(nbytes, up)
        rows[f"pageable cuMemcpyDtoH {label}, GB/s"] = gbps(nbytes, down)
        drv.cuMemFree(dev)
    return rows


def cupy_rows() -> dict[str, float]:
    try:
        import cupy as cp
    except ImportError:
        return {}
    rows = {}
    for label, nbytes in SIZES.items():
        host = np.ones(nbytes, np.uint8)

        def to_device() -> None:
            cp.asarray(host)  # noqa: B023
            cp.cuda.Device().synchronize()

        up = harness.time_sync(to_device, REPS[label], 1)
        dev = cp.asarray(host)
        down = harness.time_sync(functools.partial(cp.asnumpy, dev), REPS[label], 1)
        rows[f"cupy.asarray {label}, GB/s"] = gbps(nbytes, up)
        rows[f"cupy.asnumpy {label}, GB/s"] = gbps(nbytes, down)
        del dev
        if label in DISPATCHED:
            kernel = cp.RawKernel(COPY.source, "copy4")
            grid, block = copy_launch(nbytes)

            def round_trip() -> np.ndarray:
                x = cp.asarray(host)  # noqa: B023
                y = cp.empty_like(x)
                kernel((grid,), (block,), (x, y, np.int64(nbytes // 16)))  # noqa: B023
                return cp.asnumpy(y)  # type: ignore[no-any-return]

            assert np.array_equal(round_trip(), host)
            t = harness.time_sync(round_trip, REPS[label], 1)
            rows[f"(info) CuPy asarray + copy kernel + asnumpy {label}, GB/s"] = gbps(2 * nbytes, t)
        cp.get_default_memory_pool().free_all_blocks()
    return rows


async def asyncgraph_rows() -> dict[str, float]:
    rows = {}
    async with ag.open_backend("cuda") as gpu:
        for label, nbytes in SIZES.items():
            host = np.ones(nbytes, np.uint8)

            async def up() -> None:
                buf = await gpu.upload(host)  # noqa: B023
                await buf.aclose()

            t_up, stall_up = await median_time_async(up, REPS[label])
            buf = await gpu.upload(host)
            t_down, stall_down = await median_time_async(
                lambda: gpu.download(buf),  # noqa: B023
                REPS[label],
            )
            warm = np.ones(nbytes, np.uint8)  # pages touched, like the raw rows' array
            t_into, _ = await median_time_async(
                lambda: gpu.download(buf, out=warm),  # noqa: B023
                REPS[label],
            )
            back = await gpu.download(buf)
            assert np.array_equal(back, host)
            rows[f"asyncgraph download into a reused array {label}, GB/s"] = gbps(nbytes, t_into)
            await buf.aclose()
            rows[f"asyncgraph upload {label}, GB/s"] = gbps(nbytes, t_up)
            rows[f"asyncgraph download {label}, GB/s"] = gbps(nbytes, t_down)
            rows[f"loop worst stall during upload {label}, ms"] = stall_up * 1e3
            rows[f"loop worst stall during download {label}, ms"] = stall_down * 1e3
            if label in DISPATCHED:
                grid, _block = copy_launch(nbytes)

                async def dispatch(
                    host: np.ndarray = host, nbytes: int = nbytes, grid: int = grid
                ) -> tuple[np.ndarray, ...]:
                    out = ag.Out(nbytes, np.uint8)
                    result: tuple[np.ndarray, ...] = await gpu.dispatch(
                        COPY, host, out, np.int64(nbytes // 16), grid=grid, block=256
                    )
                    return result

                (copied,) = await dispatch()
                assert np.array_equal(copied, host)
                del copied
                t, stall = await median_time_async(dispatch, REPS[label])
                rows[f"(info) asyncgraph dispatch, copy kernel {label}, GB/s"] = gbps(2 * nbytes, t)
                rows[f"loop worst stall during that dispatch {label}, ms"] = stall * 1e3
    return rows


def raw_device_rows() -> dict[str, float]:
    from cuda.core import Device

    Device(0).set_current()
    stream = drv.cuStreamCreate(1)[1]
    rows = {}
    for label, nbytes in SIZES.items():
        src, dst = drv.cuMemAlloc(nbytes)[1], drv.cuMemAlloc(nbytes)[1]

        def copy(src: int = src, dst: int = dst, nbytes: int = nbytes) -> None:
            drv.cuMemcpyDtoDAsync(dst, src, nbytes, stream)
            drv.cuStreamSynchronize(stream)

        t = harness.time_sync(copy, REPS[label], 1)
        rows[f"cuMemcpyDtoDAsync + synchronize {label}, GB/s"] = gbps(nbytes, t)
        drv.cuMemFree(src)
        drv.cuMemFree(dst)
    drv.cuStreamDestroy(stream)
    return rows


async def device_copy_rows() -> dict[str, float]:
    rows = {}
    count = drv.cuDeviceGetCount()[1]
    devices = ["cuda:0", "cuda:0"] + (["cuda:1"] if count > 1 else [])
    async with ag.open_group(devices) as group:
        for label, nbytes in SIZES.items():
            host = np.random.default_rng().integers(0, 255, nbytes, np.uint8)
            buf = await group.upload(host, 0)
            targets = {"asyncgraph copy() within one backend": group[0]}
            targets["asyncgraph copy_to() another backend of the device"] = group[1]
            if count > 1:
                targets["asyncgraph copy_to() the other GPU (peer)"] = group[2]
            for name, member in targets.items():
                check = await group[0].copy(buf, to=member)
                assert np.array_equal(await member.download(check), host)
                await check.aclose()
                # The awaited copy (the new buffer's allocation included), one at a time; its
                # aclose() follows outside the timing, and with it in a row of its own.
                copies, closed = [], []
                for _ in range(3 if harness.smoke() else REPS[label] + 3):
                    t0 = time.perf_counter()
                    copied = await group[0].copy(buf, to=member)
                    t1 = time.perf_counter()
                    await copied.aclose()
                    copies.append(t1 - t0)
                    closed.append(time.perf_counter() - t0)
                rows[f"{name} {label}, GB/s"] = gbps(
                    nbytes, harness.median_us(copies[3:] or copies)
                )
                rows[f"(info) {name}, with its aclose() {label}, GB/s"] = gbps(
                    nbytes, harness.median_us(closed[3:] or closed)
                )
            await buf.aclose()
    return rows


def _pool_of(device: int) -> object:
    """Device *device*'s default memory pool (``cuMemAllocFromPoolAsync`` memory)."""
    return drv.cuDeviceGetDefaultMemPool(device)[1]


def _grant(pool: object, device: int) -> None:
    """Give *device* read-write access to *pool*'s memory (``cuMemPoolSetAccess``)."""
    location = drv.CUmemLocation()
    location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    location.id = device
    access = drv.CUmemAccessDesc()
    access.location = location
    access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    assert drv.cuMemPoolSetAccess(pool, [access], 1)[0] == drv.CUresult.CUDA_SUCCESS


def raw_peer_rows() -> dict[str, float]:
    """``cuMemcpyPeerAsync`` + synchronize between two pools' allocations (one on each GPU),
    before and after each pool gave the other device access; context peer access is enabled
    both ways first, as it is all that covers ``cuMemAlloc`` memory."""
    from cuda.core import Device

    contexts = []
    for ordinal in (0, 1):
        Device(ordinal).set_current()
        contexts.append(drv.cuCtxGetCurrent()[1])
    for ordinal, peer in ((0, 1), (1, 0)):
        Device(ordinal).set_current()
        drv.cuCtxEnablePeerAccess(contexts[peer], 0)
    Device(1).set_current()
    stream = drv.cuStreamCreate(1)[1]
    pools = [_pool_of(0), _pool_of(1)]
    rows = {}
    for granted in (False, True):
        if granted:
            _grant(pools[0], 1)
            _grant(pools[1], 0)
        for label, nbytes in SIZES.items():
            src = drv.cuMemAllocFromPoolAsync(nbytes, pools[0], stream)[1]
            dst = drv.cuMemAllocFromPoolAsync(nbytes, pools[1], stream)[1]
            drv.cuStreamSynchronize(stream)

            def copy(src: object = src, dst: object = dst, nbytes: int = nbytes) -> None:
                drv.cuMemcpyPeerAsync(dst, contexts[1], src, contexts[0], nbytes, stream)
                drv.cuStreamSynchronize(stream)

            t = harness.time_sync(copy, REPS[label], 1)
            what = "pools with access set" if granted else "pools, context access only"
            rows[f"raw cuMemcpyPeerAsync, {what} {label}, GB/s"] = gbps(nbytes, t)
            drv.cuMemFreeAsync(src, stream)
            drv.cuMemFreeAsync(dst, stream)
            drv.cuStreamSynchronize(stream)
    drv.cuStreamDestroy(stream)
    return rows


def torch_peer_rows() -> dict[str, float]:
    """PyTorch's ``b.copy_(a)`` from ``cuda:0`` to ``cuda:1``: one at a time, each followed by
    a synchronize of both devices (the target's baseline), and 10 queued then one."""
    try:
        import torch
    except ImportError:
        return {}
    rows = {}
    for label, nbytes in SIZES.items():
        a = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda:0")
        b = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")

        def sync() -> None:
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)

        def one(a: object = a, b: object = b) -> None:
            b.copy_(a)  # type: ignore[attr-defined]
            sync()

        def ten(a: object = a, b: object = b) -> None:
            for _ in range(10):
                b.copy_(a)  # type: ignore[attr-defined]
            sync()

        one()
        assert torch.equal(a.cpu(), b.cpu())
        rows[f"PyTorch copy_ cuda:0 -> cuda:1 + synchronize {label}, GB/s"] = gbps(
            nbytes, harness.time_sync(one, REPS[label], 1)
        )
        rows[f"(info) PyTorch 10 copy_ queued + synchronize {label}, GB/s"] = gbps(
            10 * nbytes, harness.time_sync(ten, max(REPS[label] // 4, 1), 1)
        )
        del a, b
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    args = harness.arguments(__doc__).parse_args()
    if harness.smoke():
        # A check that the script runs: every size a 256th of its label, one repetition.
        print("smoke run: each size is a 256th of its label")
        for label in SIZES:
            SIZES[label] >>= 8
            REPS[label] = 1
    device = harness.device_name()
    rows = {**raw_rows(), **cupy_rows(), **harness.run(asyncgraph_rows())}
    rows |= raw_device_rows() | harness.run(device_copy_rows())
    two_gpus = drv.cuDeviceGetCount()[1] > 1
    if two_gpus:
        rows |= torch_peer_rows() | raw_peer_rows()
    targets = {}
    for row, raw in (
        ("upload", "HtoD"),
        ("download", "DtoH"),
        ("download into a reused array", "DtoH"),
    ):
        ours = rows[f"asyncgraph {row} 256 MiB, GB/s"]
        targets[f"asyncgraph {row} / pageable at 256 MiB >= 1.5"] = (
            ours / rows[f"pageable cuMemcpy{raw} 256 MiB, GB/s"]
        )
    peer = "asyncgraph copy_to() the other GPU (peer)"
    torch_row = "PyTorch copy_ cuda:0 -> cuda:1 + synchronize"
    for label, floor in (("16 MiB", 0.7), ("256 MiB", 0.9), ("1 GiB", 0.9)):
        if two_gpus and f"{torch_row} {label}, GB/s" in rows:
            targets[f"asyncgraph peer copy_to / PyTorch copy_ at {label} >= {floor}"] = (
                rows[f"{peer} {label}, GB/s"] / rows[f"{torch_row} {label}, GB/s"]
            )
    print(f"device: {device}")
    harness.print_table(("measurement", "value"), rows.items(), (".2f",))
    print()
    harness.print_targets(targets, ".2f")
    harness.write_json(
        {"device": device, "rows": rows, "targets": targets, "verdicts": harness.verdicts(targets)},
        args.json,
        script=__file__,
        device=device,
    )


if __name__ == "__main__":
    main()
