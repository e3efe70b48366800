"""The CUDA backend on a real GPU: correctness against numpy, concurrency, pools, the reactor.

Every test here carries the ``cuda`` marker and is skipped, with the reason, where no GPU is
found. Inputs are fresh random data every run.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any, cast

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph.__main__ import main
from asyncgraph._demo._demo import (
    BLOCK,
    BLOCK_SUM,
    LAPLACE2D,
    SAXPY,
    block_sum_reference,
    laplace2d_reference,
    relative_error,
    saxpy_reference,
)
from asyncgraph.pool import PinnedPool

from .kernels import INC, SCALE, SPIN

pytestmark = pytest.mark.cuda

Array = np.ndarray[Any, Any]


@pytest.fixture
async def gpu() -> AsyncIterator[Any]:
    async with ag.open_backend("cuda") as backend:
        yield backend


SIZES = [1, 1000, 10**6, 10**8]


@pytest.mark.parametrize("n", SIZES)
async def test_saxpy_matches_numpy(gpu: Any, rng: np.random.Generator, n: int) -> None:
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    a = np.float32(rng.uniform(-3, 3))
    (out,) = await gpu.dispatch(
        SAXPY, x, y, ag.Out(n, np.float32), a, np.int32(n), grid=(n + 255) // 256, block=256
    )
    assert relative_error(out, saxpy_reference(x, y, float(a))) < 1e-6


@pytest.mark.parametrize("n", SIZES)
async def test_block_sum_matches_numpy(gpu: Any, rng: np.random.Generator, n: int) -> None:
    x = rng.standard_normal(n, dtype=np.float32)
    blocks = (n + BLOCK - 1) // BLOCK
    (out,) = await gpu.dispatch(
        BLOCK_SUM, x, ag.Out(blocks, np.float32), np.int32(n), grid=blocks, block=BLOCK
    )
    np.testing.assert_allclose(out, block_sum_reference(x, blocks), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 1), (25, 40), (1000, 1000), (10000, 10000)])
async def test_laplace2d_matches_numpy(
    gpu: Any, rng: np.random.Generator, shape: tuple[int, int]
) -> None:
    h, w = shape
    u = rng.standard_normal(shape, dtype=np.float32)
    (out,) = await gpu.dispatch(
        LAPLACE2D,
        u,
        ag.Out(shape, np.float32),
        np.int32(h),
        np.int32(w),
        grid=((w + 15) // 16, (h + 15) // 16),
        block=(16, 16),
    )
    assert relative_error(out, laplace2d_reference(u)) < 1e-5


# One elementwise kernel per dtype: out = x * a + y, computed in the type (float16 in float32
# and rounded, through PTX so no header is needed).
_AXPY = {
    "float32": ("float", "float", "out[i] = x[i] * a + y[i];"),
    "float64": ("double", "double", "out[i] = x[i] * a + y[i];"),
    "int32": ("int", "int", "out[i] = x[i] * a + y[i];"),
    "uint8": ("unsigned char", "unsigned char", "out[i] = (unsigned char)(x[i] * a + y[i]);"),
    "float16": (
        "half_t",
        "float",
        "float fx, fy, r; unsigned short h;"
        ' asm("cvt.f32.f16 %0, %1;" : "=f"(fx) : "h"(x[i]));'
        ' asm("cvt.f32.f16 %0, %1;" : "=f"(fy) : "h"(y[i]));'
        " r = fx * a + fy;"
        ' asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(r)); out[i] = h;',
    ),
}


def _axpy_kernel(dtype: str) -> ag.Kernel:
    ctype, atype, body = _AXPY[dtype]
    src = (
        "typedef unsigned short half_t;\n"
        f'extern "C" __global__ void axpy_{dtype}(const {ctype}* x, const {ctype}* y, '
        f"{ctype}* out, {atype} a, long long n)\n"
        "{ long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
        f"  if (i < n) {{ {body} }} }}\n"
    )
    return ag.Kernel(src, f"axpy_{dtype}")


AXPY = {dtype: _axpy_kernel(dtype) for dtype in _AXPY}


def _random(rng: np.random.Generator, dtype: str, n: int) -> Array:
    if dtype == "uint8":
        return rng.integers(0, 256, n, dtype=np.uint8)
    if dtype == "int32":
        return rng.integers(-(2**15), 2**15, n, dtype=np.int32)
    return rng.standard_normal(n).astype(dtype)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", list(_AXPY))
async def test_dtypes_match_numpy(gpu: Any, rng: np.random.Generator, dtype: str, n: int) -> None:
    x = _random(rng, dtype, n)
    y = _random(rng, dtype, n)
    if dtype in ("int32", "uint8"):
        a = np.dtype(dtype).type(rng.integers(1, 7))
    elif dtype == "float16":
        a = np.float32(rng.uniform(-2, 2))
    else:
        a = np.dtype(dtype).type(rng.uniform(-2, 2))
    (out,) = await gpu.dispatch(
        AXPY[dtype],
        x,
        y,
        ag.Out(n, dtype),
        a,
        np.int64(n),
        grid=(n + 255) // 256,
        block=256,
    )
    assert out.dtype == np.dtype(dtype)
    if dtype == "uint8":
        want = ((x.astype(np.int64) * int(a) + y) % 256).astype(np.uint8)
        np.testing.assert_array_equal(out, want)
    elif dtype == "int32":
        np.testing.assert_array_equal(out, x * a + y)
    else:
        # The error bound of a multiply-add with rounding unit u: |out - exact| <= 2u(|xa| + |y|),
        # plus, for float16, the final rounding to float16 (2^-11 relative, 2^-25 absolute).
        wide = np.dtype(np.longdouble if dtype == "float64" else np.float64)
        xa: Array = x.astype(wide) * np.asarray(a, dtype=wide)
        exact = xa + y.astype(wide)
        unit = 2.0**-53 if dtype == "float64" else 2.0**-24
        bound = 2 * unit * (np.abs(xa) + np.abs(y.astype(wide)))
        if dtype == "float16":
            bound = bound + 2.0**-11 * np.abs(exact) + 2.0**-25
        error = np.abs(out.astype(wide) - exact)
        assert np.all(error <= bound), f"worst excess {float(np.max(error - bound)):.3g}"


async def test_512_dispatches_from_64_tasks(gpu: Any, rng: np.random.Generator) -> None:
    async def worker(seed: int) -> float:
        local = np.random.default_rng(seed)
        worst = 0.0
        for _ in range(8):
            n = int(local.integers(1, 50_000))
            x = local.standard_normal(n, dtype=np.float32)
            y = local.standard_normal(n, dtype=np.float32)
            (out,) = await gpu.dispatch(
                SAXPY,
                x,
                y,
                ag.Out(n, np.float32),
                np.float32(2),
                np.int32(n),
                grid=(n + 255) // 256,
                block=256,
            )
            worst = max(worst, relative_error(out, saxpy_reference(x, y, 2.0)))
        return worst

    errors = await asyncio.gather(*(worker(int(s)) for s in rng.integers(0, 2**32, 64)))
    assert max(errors) < 1e-6
    snap = gpu.telemetry.snapshot()
    assert snap.dispatches_completed == 512
    assert snap.dispatches_failed == 0


def _baseline(gpu: Any) -> tuple[int, int, int, tuple[int, ...], int]:
    pinned = gpu.pinned_pool.statistics()
    device = gpu.device_memory.statistics()
    streams = gpu.stream_pool.statistics()
    return (
        pinned.blocks_in_use,
        pinned.bytes_in_use,
        device.bytes_in_use,
        streams.outstanding,
        gpu._cuda.device.reactor.pending,
    )


async def test_cancelled_awaiters_return_pools_to_baseline() -> None:
    # One stream, held up by a 1 s kernel: every dispatch below is still in flight when
    # half of its awaiters are cancelled.
    async with ag.open_backend("cuda", streams=1) as gpu:
        x = np.ones(1 << 16, np.float32)
        await gpu.dispatch(
            SCALE,
            x,
            ag.Out(x.size, np.float32),
            np.float32(2),
            np.int32(x.size),
            grid=x.size // 256,
            block=256,
        )
        await gpu.compile(SPIN)
        # Fill the pinned pool first: 300 cold pinned allocations alone take about 100 ms.
        await asyncio.gather(
            *(
                gpu.dispatch(
                    SCALE,
                    x,
                    ag.Out(x.size, np.float32),
                    np.float32(2),
                    np.int32(x.size),
                    grid=x.size // 256,
                    block=256,
                )
                for _ in range(300)
            )
        )
        baseline = _baseline(gpu)
        assert baseline == (0, 0, 0, (0,), 0)
        clock_khz = cast(Any, gpu)._cuda.device.device.properties.clock_rate
        gate = gpu.dispatch(SPIN, np.int64(clock_khz * 1000), ag.Out(1, np.int32), grid=1, block=1)
        pendings = []
        tasks = []
        # 30 dispatches (about 180 stream commands): 300 fill the stream's command queue
        # behind the gate, and CUDA then blocks the enqueuing call until the gate finishes.
        for i in range(30):
            pending = gpu.dispatch(
                SCALE,
                x * i,
                ag.Out(x.size, np.float32),
                np.float32(2),
                np.int32(x.size),
                grid=x.size // 256,
                block=256,
            )
            pendings.append(pending)
            tasks.append(asyncio.create_task(_await(pending)))
        await asyncio.sleep(0.01)
        assert not gate.done(), (
            f"gate finished early: error={gate.exception() if gate.done() else None!r} "
            f"device_time={gate.device_time}"
        )
        assert _baseline(gpu) != baseline  # work in flight holds pinned blocks and events
        for task in tasks[::2]:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert sum(isinstance(o, asyncio.CancelledError) for o in outcomes) == 15
        await gate
        for i, pending in enumerate(pendings):
            (out,) = await pending
            np.testing.assert_array_equal(out, x * i * 2)
        assert _baseline(gpu) == baseline


async def _await(pending: ag.PendingDispatch) -> object:
    return await pending


async def test_pools_reach_a_steady_state(gpu: Any, rng: np.random.Generator) -> None:
    async def burst(count: int) -> None:
        async def one(k: int) -> None:
            n = 1000 + (k % 7) * 3000
            x = rng.standard_normal(n, dtype=np.float32)
            (out,) = await gpu.dispatch(
                SCALE,
                x,
                ag.Out(n, np.float32),
                np.float32(3),
                np.int32(n),
                grid=(n + 255) // 256,
                block=256,
            )
            assert np.array_equal(out, x * np.float32(3))

        await asyncio.gather(*(one(k) for k in range(count)))

    for _ in range(3):  # warm-up
        await burst(2000)
    events0 = gpu._cuda.device.events.created
    misses = []
    for _ in range(5):  # 10,000 dispatches
        before = gpu.pinned_pool.statistics()
        await burst(2000)
        after = gpu.pinned_pool.statistics()
        # Nothing stays held between bursts (a leaked block would stay in use), and every
        # request is served.
        assert after.bytes_in_use == 0
        assert after.blocks_in_use == 0
        assert (after.hits + after.misses) - (before.hits + before.misses) == 2000
        misses.append(after.misses - before.misses)
    pinned1 = gpu.pinned_pool.statistics()
    # The pool holds what the mix of sizes in flight at its peak needed. How that mix peaks
    # varies with completion timing, so any burst may still add a block or a few of some size
    # class (kept for reuse; seen as [0, 0, 8, 0, 0], [5, 1, 1, 0, 0] and [0, 0, 0, 1, 0]).
    # Blocks that leaked would stay in use (checked exactly above); unbounded caching would
    # add blocks by the thousand. The growth must stay a few blocks in all.
    assert sum(misses) <= 16, misses
    assert pinned1.bytes_idle == pinned1.allocated_bytes_total  # everything back in the pool
    assert gpu._cuda.device.events.created <= events0 + 8
    assert gpu.device_memory.statistics().bytes_in_use == 0


async def test_small_dispatches_use_their_streams_scratch(rng: np.random.Generator) -> None:
    from asyncgraph._cuda.driver._priorities import class_streams
    from asyncgraph._cuda.lanes._lanes import SCRATCH_BYTES

    backend = ag.open_backend("cuda", options=ag.BackendOptions(streams=3))
    gpu = cast(Any, backend)
    async with backend:

        async def one(n: int) -> None:
            x = rng.standard_normal(n, dtype=np.float32)
            a = np.float32(rng.uniform(-3, 3))
            (out,) = await gpu.dispatch(
                SCALE, x, ag.Out(n, np.float32), a, np.int32(n), grid=(n + 255) // 256, block=256
            )
            assert np.array_equal(out, x * a)

        # Many small dispatches of mixed sizes in flight at once on every stream: each one
        # reuses its stream's scratch, ordered after the one before it.
        sizes = rng.integers(1, SCRATCH_BYTES // 8, 600)
        await asyncio.gather(*(one(int(n)) for n in sizes))
        stats = gpu.device_memory.statistics()
        assert stats.allocations == 0  # no per-dispatch allocation at all
        # One scratch buffer per stream: the default class's three, and the high and low
        # classes' own streams.
        assert stats.bytes_reserved == (3 + 2 * class_streams(3)) * SCRATCH_BYTES
        # A dispatch above the scratch size allocates and frees as before.
        await one(SCRATCH_BYTES // 4 + 1)
        stats = gpu.device_memory.statistics()
        assert (stats.allocations, stats.frees, stats.bytes_in_use) == (1, 1, 0)
    assert gpu.device_memory.statistics().bytes_reserved == 0  # given back on close


async def test_a_long_kernel_does_not_hold_up_short_dispatches(gpu: Any) -> None:
    # Load the kernels first: loading a module while a kernel runs may wait for it.
    await gpu.compile(SCALE)
    await gpu.compile(SPIN)
    # And free what earlier tests left to the collector: a pinned block freed while the long
    # kernel runs holds up every driver call of the process until it ends (docs/pools.md).
    gc.collect()
    await asyncio.wrap_future(PinnedPool.wait_freed())
    clock_khz = gpu._cuda.device.device.properties.clock_rate
    long = gpu.dispatch(SPIN, np.int64(clock_khz * 300), ag.Out(1, np.int32), grid=1, block=1)
    x = np.arange(1000, dtype=np.float32)
    for _ in range(20):
        (out,) = await gpu.dispatch(
            SCALE, x, ag.Out(1000, np.float32), np.float32(2), np.int32(1000), grid=4, block=256
        )
        np.testing.assert_array_equal(out, 2 * x)
    assert not long.done()  # 20 short round trips finished while the long kernel still ran
    (flag,) = await long
    assert flag[0] == 1


async def test_timing_measures_the_kernel(gpu: Any) -> None:
    clock_khz = gpu._cuda.device.device.properties.clock_rate
    pending = gpu.dispatch(
        SPIN, np.int64(clock_khz * 20), ag.Out(1, np.int32), grid=1, block=1, timing=True
    )
    await pending
    assert pending.device_time is not None
    assert 0.015 < pending.device_time < 0.5  # about 20 ms of spinning at clock_rate or above
    assert gpu.telemetry.snapshot().device_time.count == 1


async def test_compile_error_carries_the_log(gpu: Any) -> None:
    bad = ag.Kernel('extern "C" __global__ void bad(float* x) { x[0] = undefined_name; }', "bad")
    for _ in range(2):  # the failure is remembered, not recompiled
        with pytest.raises(ag.CompileError, match="undefined_name") as info:
            await gpu.dispatch(bad, ag.Out(1, np.float32), grid=1, block=1)
        assert 'identifier "undefined_name" is undefined' in info.value.log
    x = np.ones(4, np.float32)
    (out,) = await gpu.dispatch(
        SCALE, x, ag.Out(4, np.float32), np.float32(2), np.int32(4), grid=1, block=4
    )
    np.testing.assert_array_equal(out, 2 * x)


async def test_resident_buffers_on_the_gpu(gpu: Any, rng: np.random.Generator) -> None:
    data = rng.standard_normal(100_000, dtype=np.float32)
    buf = await gpu.upload(data)
    np.testing.assert_array_equal(await gpu.download(buf), data)
    out = gpu.empty(100_000, np.float32)
    before = gpu.telemetry.snapshot()
    for _ in range(30):
        gpu.dispatch(INC, buf, np.float32(1), np.int32(100_000), grid=391, block=256)
    (res,) = await gpu.dispatch(
        SCALE, buf, ag.Out(into=out), np.float32(2), np.int32(100_000), grid=391, block=256
    )
    assert res is out
    after = gpu.telemetry.snapshot()
    assert (after.bytes_up, after.bytes_down) == (before.bytes_up, before.bytes_down)
    np.testing.assert_allclose(await gpu.download(out), (data + 30) * 2, rtol=1e-6)
    await buf.aclose()
    with pytest.raises(ag.StaleBufferError):
        await gpu.download(buf)


async def test_inout_and_multiple_outputs(gpu: Any, rng: np.random.Generator) -> None:
    k = ag.Kernel(
        r"""
extern "C" __global__ void split(const int* x, int* lo, int* hi, double* acc, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { lo[i] = x[i] & 0xffff; hi[i] = x[i] >> 16; acc[i] += x[i]; }
}
""",
        "split",
    )
    n = 5000
    x = rng.integers(0, 2**31 - 1, n, dtype=np.int32)
    acc = rng.standard_normal(n)
    acc_before = acc.copy()
    lo, hi, acc2 = await gpu.dispatch(
        k,
        x,
        ag.Out(n, np.int32),
        ag.Out(n, np.int32),
        ag.InOut(acc),
        np.int32(n),
        grid=(n + 255) // 256,
        block=256,
    )
    np.testing.assert_array_equal(lo, x & 0xFFFF)
    np.testing.assert_array_equal(hi, x >> 16)
    np.testing.assert_array_equal(acc2, acc_before + x)
    np.testing.assert_array_equal(acc, acc_before)


async def test_launch_limits_come_from_the_device(gpu: Any) -> None:
    with pytest.raises(ag.DispatchError, match=r"^block=2048 has 2048 threads|dimension x"):
        gpu.dispatch(
            SCALE,
            np.ones(4, np.float32),
            ag.Out(4, np.float32),
            np.float32(1),
            np.int32(4),
            grid=1,
            block=2048,
        )
    assert gpu._engine.limits.max_shared_mem > 48 * 1024


def test_demo_and_info_on_the_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "auto picks     cuda:0" in out
    assert main(["demo", "--dispatches", "1200"]) == 0
    out = capsys.readouterr().out
    assert "backend        cuda:0" in out
    assert "OK: all 1200 results match numpy" in out
    gc.collect()


async def test_pinned_inputs_go_up_directly_and_big_results_live_in_pinned_memory(
    gpu: Any, rng: np.random.Generator
) -> None:
    from asyncgraph.pool._pinned import pinned_memory_of

    await gpu.compile(SCALE)
    n = 1 << 20  # 4 MiB of float32: results of this size come back in pinned memory
    source = rng.standard_normal(n, dtype=np.float32)
    before = gpu.pinned_pool.statistics()
    x = gpu.pinned_empty(n, np.float32)
    x[:] = source
    args = (np.float32(2), np.int32(n))
    acquired = gpu.pinned_pool.statistics()
    (y,) = await gpu.dispatch(SCALE, x, ag.Out(n, np.float32), *args, grid=n // 256, block=256)
    after = gpu.pinned_pool.statistics()
    np.testing.assert_array_equal(y, 2 * source)
    assert pinned_memory_of(y) is not None
    # One block for the result, none for staging: the input went up from its own memory.
    taken = (after.hits + after.misses) - (acquired.hits + acquired.misses)
    assert taken == 1, (acquired, after)
    # A result feeds the next dispatch the same way; a view of a pinned array counts too.
    (z,) = await gpu.dispatch(
        SCALE,
        y[: n // 2],
        ag.Out(n // 2, np.float32),
        np.float32(0.5),
        np.int32(n // 2),
        grid=n // 512,
        block=256,
    )
    np.testing.assert_array_equal(z, source[: n // 2])
    # Mixed with a pageable input, everything is staged, and the answer is the same.
    (w,) = await gpu.dispatch(
        SAXPY,
        x,
        source.copy(),
        ag.Out(n, np.float32),
        np.float32(-1),
        np.int32(n),
        grid=n // 256,
        block=256,
    )
    np.testing.assert_allclose(w, saxpy_reference(source, source, -1.0), atol=1e-6)
    del x, y, z, w
    gc.collect()
    # Blocks come back through the loop; give it up to 2 s (slow under a sanitizer).
    for _ in range(200):
        if gpu.pinned_pool.statistics().bytes_in_use == before.bytes_in_use:
            break
        await asyncio.sleep(0.01)
    final = gpu.pinned_pool.statistics()
    assert final.bytes_in_use == before.bytes_in_use, final
    assert gpu._cuda.small.lent == 0


async def test_a_lone_awaited_dispatch_completes_without_yielding(
    gpu: Any, rng: np.random.Generator
) -> None:
    await gpu.compile(SCALE)
    x = rng.standard_normal(1024, dtype=np.float32)
    spins = gpu._cuda.device.reactor.spins
    for _ in range(50):
        (y,) = await gpu.dispatch(
            SCALE, x, ag.Out(1024, np.float32), np.float32(3), np.int32(1024), grid=4, block=256
        )
        np.testing.assert_allclose(y, 3 * x, rtol=1e-6)
    assert gpu._cuda.device.reactor.spins > spins


async def test_inline_completions_do_not_starve_the_loop(gpu: Any) -> None:
    await gpu.compile(SCALE)
    x = np.ones(256, np.float32)
    ticks = 0
    stop = False

    async def ticker() -> None:
        nonlocal ticks
        while not stop:
            await asyncio.sleep(0)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    start = ticks
    for _ in range(3000):  # a tight loop of awaits, each of which may complete inline
        await gpu.dispatch(
            SCALE, x, ag.Out(256, np.float32), np.float32(1), np.int32(256), grid=1, block=256
        )
    during = ticks - start
    stop = True
    await task
    assert during >= 10, during


async def test_spin_window_zero_turns_inline_completion_off(rng: np.random.Generator) -> None:
    async with ag.open_backend("cuda", spin_window=0.0) as backend:
        gpu = cast(Any, backend)
        x = rng.standard_normal(1024, dtype=np.float32)
        for _ in range(20):
            (y,) = await gpu.dispatch(
                SCALE,
                x,
                ag.Out(1024, np.float32),
                np.float32(3),
                np.int32(1024),
                grid=4,
                block=256,
            )
            np.testing.assert_allclose(y, 3 * x, rtol=1e-6)
        assert gpu._cuda.device.reactor.spins == 0
