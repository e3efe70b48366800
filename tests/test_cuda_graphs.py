"""CUDA graphs on a GPU: recorded dispatches, captured pipelines, the graph cache."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as drv

import asyncgraph as ag
from asyncgraph._cuda.core._choose import core
from asyncgraph.capture import CaptureMode, CaptureStatus, capture_status

from .kernels import INC, SCALE, SPIN

pytestmark = pytest.mark.cuda

N = 1000


@pytest.fixture
async def gpu() -> AsyncIterator[Any]:
    async with ag.open_backend("cuda") as backend:
        yield backend


def _rand(rng: np.random.Generator, n: int = N) -> np.ndarray[Any, Any]:
    return rng.standard_normal(n).astype(np.float32)


def _clean(gpu: Any) -> None:
    """Nothing held: no pinned block in use, no capture, no lease."""
    assert gpu.pinned_pool.statistics().bytes_in_use == 0
    assert not gpu.capture_lock.locked()
    assert gpu.stream_pool.statistics().leased == 0
    assert capture_status(gpu._cuda.graphs.capture_handle) is CaptureStatus.NONE


async def test_a_recorded_dispatch_replays_new_inputs(gpu: Any, rng: np.random.Generator) -> None:
    x = _rand(rng)
    graph = await gpu.record(
        SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
    )
    graph.upload()
    before = gpu.telemetry.snapshot()
    for _ in range(3):
        fresh = _rand(rng)
        (y,) = await graph.replay(fresh, ag.Out(N, np.float32), np.float32(2), np.int32(N))
        np.testing.assert_array_equal(y, fresh * np.float32(2))
    # Byte-identical inputs take the resident-input graph: nothing goes up.
    up = gpu.telemetry.snapshot().bytes_up
    (y,) = await graph.replay(fresh.copy(), ag.Out(N, np.float32), np.float32(2), np.int32(N))
    np.testing.assert_array_equal(y, fresh * np.float32(2))
    assert graph.resident_replays == 1
    assert gpu.telemetry.snapshot().bytes_up == up
    # Changing the source array in place is seen: its bytes differ from the last replay.
    fresh *= 3
    (y,) = await graph.replay(fresh, ag.Out(N, np.float32), np.float32(2), np.int32(N))
    np.testing.assert_array_equal(y, fresh * np.float32(2))
    # A new scalar updates the kernel node in place, in both variants.
    (y,) = await graph.replay(fresh, ag.Out(N, np.float32), np.float32(-5), np.int32(N))
    np.testing.assert_array_equal(y, fresh * np.float32(-5))
    after = gpu.telemetry.snapshot()
    assert after.graph_replays - before.graph_replays == graph.replays == 6
    assert after.graph_updates - before.graph_updates == 2
    assert after.graph_captures == 2  # full and resident-input
    graph.close()
    _clean(gpu)


async def test_replay_refuses_other_shapes_and_stays_usable(
    gpu: Any, rng: np.random.Generator
) -> None:
    x = _rand(rng)
    graph = await gpu.record(
        SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
    )
    with pytest.raises(ag.ShapeMismatchError, match=r"recorded with float32 of shape \(1000,\)"):
        await graph.replay(_rand(rng, N + 1), ag.Out(N, np.float32), np.float32(2), np.int32(N))
    with pytest.raises(ag.ShapeMismatchError, match=r"args\[1\] of 'scale' is float32 of shape"):
        await graph.replay(x, ag.Out(N - 1, np.float32), np.float32(2), np.int32(N))
    with pytest.raises(ag.ArgumentTypeError, match=r"float64"):
        await graph.replay(x.astype(np.float64), ag.Out(N, np.float32), np.float32(2), np.int32(N))
    (y,) = await graph.replay(x, ag.Out(N, np.float32), np.float32(2), np.int32(N))
    np.testing.assert_array_equal(y, x * 2)
    graph.close()
    with pytest.raises(ag.BackendClosedError, match=r"graph is closed"):
        await graph.replay(x, ag.Out(N, np.float32), np.float32(2), np.int32(N))
    _clean(gpu)


async def test_an_in_out_graph_and_concurrent_replays_in_call_order(gpu: Any) -> None:
    graph = await gpu.record(
        INC, ag.InOut(np.zeros(N, np.float32)), np.float32(1), np.int32(N), grid=4, block=256
    )
    inputs = [np.full(N, k, np.float32) for k in range(20)]
    results = await asyncio.gather(
        *(graph.replay(ag.InOut(a), np.float32(1), np.int32(N)) for a in inputs)
    )
    for k, (out,) in enumerate(results):
        np.testing.assert_array_equal(out, np.full(N, k + 1, np.float32))
    assert graph.resident_replays == 0  # an input that is also an output always goes up
    graph.close()
    _clean(gpu)


async def test_a_graph_keeps_its_resident_buffers(gpu: Any, rng: np.random.Generator) -> None:
    data = _rand(rng)
    buf = await gpu.upload(data)
    live = gpu._store.bytes_live
    graph = await gpu.record(
        SCALE, buf, ag.Out(N, np.float32), np.float32(3), np.int32(N), grid=4, block=256
    )
    (y,) = await graph.replay(buf, ag.Out(N, np.float32), np.float32(3), np.int32(N))
    np.testing.assert_array_equal(y, data * 3)
    await buf.aclose()
    assert gpu._store.bytes_live == live  # the graph holds the memory
    graph.close()
    assert gpu._store.bytes_live == live - buf.nbytes


async def _spinning(gpu: Any, count: int, ms: float) -> list[Any]:
    cycles = np.int64(gpu._cuda.device.device.properties.clock_rate * ms)
    flags = [gpu.empty(1, np.int32) for _ in range(count)]
    return [gpu.dispatch(SPIN, cycles, ag.Out(into=f), grid=1, block=1) for f in flags]


@pytest.mark.parametrize("mode", ["relaxed", "thread_local", "global"])
async def test_capture_while_dispatches_run(gpu: Any, mode: str, rng: np.random.Generator) -> None:
    await gpu.compile(INC)
    await gpu.compile(SPIN)
    # Long kernels in flight: the reactor polls and its waiter threads wait meanwhile.
    spinning = await _spinning(gpu, 6, 30)
    quick = [
        gpu.dispatch(SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256)
        for x in [_rand(rng) for _ in range(8)]
    ]
    buf = await gpu.upload(np.zeros(N, np.float32))
    async with gpu.capture(mode=mode) as cap:
        assert cap.status is CaptureStatus.ACTIVE
        await asyncio.sleep(0.002)  # the loop runs (and the reactor with it) during the capture
        for step in (1.0, 2.0, 3.0):
            await cap.dispatch(INC, buf, np.float32(step), np.int32(N), grid=4, block=256)
    graph = cap.graph
    assert len(graph.dispatches) == 3
    for _ in range(5):
        await graph.replay()
    np.testing.assert_array_equal(await gpu.download(buf), np.full(N, 30, np.float32))
    for pending in [*spinning, *quick]:
        await pending
    graph.close()
    _clean(gpu)


async def test_an_error_inside_a_capture_leaves_everything_usable(gpu: Any) -> None:
    await gpu.compile(INC)
    buf = await gpu.upload(np.zeros(N, np.float32))
    captures: list[Any] = []

    async def failing() -> None:
        async with gpu.capture() as cap:
            captures.append(cap)
            await cap.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
            _ = 1 / 0

    with pytest.raises(ZeroDivisionError):
        await failing()
    cap = captures[0]
    _clean(gpu)
    with pytest.raises(ag.CaptureError, match=r"once the 'async with backend.capture\(\)' ended"):
        _ = cap.graph
    # A bad argument inside a capture is refused; the capture goes on.
    async with gpu.capture() as cap:
        with pytest.raises(
            ag.DispatchError, match=r"resident buffers, Out\(into=buffer\) and scalars"
        ):
            await cap.dispatch(
                INC, np.zeros(N, np.float32), np.float32(1), np.int32(N), grid=4, block=256
            )
        await cap.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
    await cap.graph.replay()
    np.testing.assert_array_equal(await gpu.download(buf), np.ones(N, np.float32))
    # The captured dispatch did not run during the capture: only the replay did.
    (y,) = await gpu.dispatch(
        SCALE, buf, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
    )
    np.testing.assert_array_equal(y, np.full(N, 2, np.float32))
    cap.graph.close()
    _clean(gpu)


async def test_an_invalidated_capture_raises_and_the_stream_recovers(gpu: Any) -> None:
    await gpu.compile(INC)
    buf = await gpu.upload(np.zeros(N, np.float32))
    # An event of the device's primary context (the backend's), whatever this thread had
    # current: run alone, this test's thread has none.
    code, context = drv.cuDevicePrimaryCtxRetain(drv.CUdevice(0))
    assert code == drv.CUresult.CUDA_SUCCESS
    drv.cuCtxPushCurrent(context)
    try:
        code, event = drv.cuEventCreate(0)
        assert code == drv.CUresult.CUDA_SUCCESS

        async def illegal() -> None:
            async with gpu.capture(mode="global") as cap:
                await cap.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
                drv.cuEventQuery(event)  # not allowed while a global capture runs

        with pytest.raises(ag.CaptureError, match=r"the capture was invalidated"):
            await illegal()
        drv.cuEventDestroy(event)
    finally:
        drv.cuCtxPopCurrent()
        drv.cuDevicePrimaryCtxRelease(drv.CUdevice(0))
    _clean(gpu)
    (out,) = await gpu.dispatch(
        INC, ag.InOut(np.zeros(N, np.float32)), np.float32(1), np.int32(N), grid=4, block=256
    )
    np.testing.assert_array_equal(out, np.ones(N, np.float32))
    with pytest.raises(ag.CaptureError, match=r"^mode='eager'; pass one of"):
        gpu.capture(mode="eager")
    assert CaptureMode.parse("relaxed") is CaptureMode.RELAXED


async def test_update_changes_scalars_in_place(gpu: Any) -> None:
    await gpu.compile(INC)
    buf = await gpu.upload(np.zeros(N, np.float32))
    async with gpu.capture() as cap:
        first = await cap.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
        await cap.dispatch(INC, buf, np.float32(10), np.int32(N), grid=4, block=256)
    graph = cap.graph
    await graph.replay()
    graph.update(first, buf, np.float32(100), np.int32(N))
    await graph.replay()
    # (1 + 10) from the first replay, (100 + 10) from the second.
    np.testing.assert_array_equal(await gpu.download(buf), np.full(N, 121, np.float32))
    assert graph.updates == 1
    other = await gpu.upload(np.zeros(N, np.float32))
    with pytest.raises(ag.DispatchError, match=r"update\(\) changes scalar arguments only"):
        graph.update(first, other, np.float32(1), np.int32(N))
    graph.close()


async def test_a_capture_into_a_graph_updates_it_in_place(gpu: Any) -> None:
    await gpu.compile(INC)
    buf = await gpu.upload(np.zeros(N, np.float32))
    other = await gpu.upload(np.zeros(N, np.float32))
    async with gpu.capture() as cap:
        for step in (1, 2):
            await cap.dispatch(INC, buf, np.float32(step), np.int32(N), grid=4, block=256)
    graph = cap.graph
    await graph.replay()
    # Another buffer, other scalars: the same nodes, so the executable graph is updated.
    async with gpu.capture(into=graph) as again:
        for step in (10, 20):
            await again.dispatch(INC, other, np.float32(step), np.int32(N), grid=4, block=256)
    assert again.graph is graph
    assert (graph.recaptures, graph.updated_in_place) == (1, 1)
    await graph.replay()
    # The same again but for scalars: recorded from the last capture; then updated.
    async with gpu.capture(into=graph) as repeat:
        second = None
        for step in (100, 200):
            second = await repeat.dispatch(
                INC, other, np.float32(step), np.int32(N), grid=4, block=256
            )
    graph.update(second, other, np.float32(1000), np.int32(N))
    await graph.replay()
    assert (graph.recaptures, graph.updated_in_place) == (2, 2)
    np.testing.assert_array_equal(await gpu.download(buf), np.full(N, 3, np.float32))
    np.testing.assert_array_equal(await gpu.download(other), np.full(N, 1130, np.float32))
    # Other nodes: a new executable graph.
    async with gpu.capture(into=graph) as third:
        await third.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
    await graph.replay()
    assert (graph.recaptures, graph.updated_in_place) == (3, 2)
    np.testing.assert_array_equal(await gpu.download(buf), np.full(N, 4, np.float32))
    graph.close()
    _clean(gpu)


async def test_foreign_work_on_the_capture_stream(gpu: Any) -> None:
    cp = pytest.importorskip("cupy")
    await gpu.compile(INC)
    x = cp.zeros(N, dtype=cp.float32)
    buf = await gpu.upload(np.zeros(N, np.float32))
    async with gpu.capture() as cap:
        with cp.cuda.Stream.from_external(cap.stream):
            x += 1  # CuPy's kernel, recorded
        await cap.dispatch(INC, buf, np.float32(2), np.int32(N), grid=4, block=256)
    for _ in range(3):
        await cap.graph.replay()
    np.testing.assert_array_equal(cp.asnumpy(x), np.full(N, 3, np.float32))
    np.testing.assert_array_equal(await gpu.download(buf), np.full(N, 6, np.float32))
    cap.graph.close()


async def test_the_cache_serves_64_concurrent_tasks(rng: np.random.Generator) -> None:
    async with ag.open_backend("cuda", graph_cache_bytes=64 << 20) as opened:
        gpu: Any = opened
        inputs = [_rand(rng) for _ in range(64)]

        async def task(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
            out = None
            for _ in range(5):
                (out,) = await gpu.dispatch(
                    SCALE,
                    x,
                    ag.Out(N, np.float32),
                    np.float32(4),
                    np.int32(N),
                    grid=4,
                    block=256,
                    graph="always",
                )
            return out  # type: ignore[return-value]

        results = await asyncio.gather(*(task(x) for x in inputs))
        for x, y in zip(inputs, results, strict=True):
            np.testing.assert_array_equal(y, x * 4)
        stats = gpu.graph_cache.statistics()
        assert stats.hits > 0
        assert 1 <= stats.instances <= gpu.options.streams
        assert stats.signatures == 1
        # A new scalar is an update, not a capture.
        captures = stats.captures
        (y,) = await gpu.dispatch(
            SCALE,
            inputs[0],
            ag.Out(N, np.float32),
            np.float32(7),
            np.int32(N),
            grid=4,
            block=256,
            graph="always",
        )
        np.testing.assert_array_equal(y, inputs[0] * 7)
        stats = gpu.graph_cache.statistics()
        assert stats.captures == captures
        assert stats.updates >= 1
    assert gpu.pinned_pool.statistics().bytes_in_use == 0


@pytest.mark.parametrize("fast", [True, False])
async def test_replays_on_the_fast_path_compute_what_the_general_path_does(
    fast: bool, rng: np.random.Generator
) -> None:
    async with ag.open_backend("cuda", fast_path_enabled=fast) as opened:
        gpu: Any = opened
        await gpu.compile(INC)
        await gpu.compile(SCALE)  # so the first graph="always" dispatch records its graph
        start = _rand(rng)
        buf = await gpu.upload(start)
        async with gpu.capture() as cap:
            await cap.dispatch(INC, buf, np.float32(1.5), np.int32(N), grid=4, block=256)
        before = gpu.telemetry.snapshot().fast_path_dispatches
        for _ in range(4):
            await cap.graph.replay()
        np.testing.assert_allclose(await gpu.download(buf), start + np.float32(6), rtol=1e-6)
        for scale in (3, 3, 3, -2):
            x = _rand(rng)
            (y,) = await gpu.dispatch(
                SCALE, x, ag.Out(N, np.float32), np.float32(scale), np.int32(N), grid=4,
                block=256, graph="always",
            )  # fmt: skip
            np.testing.assert_array_equal(y, x * np.float32(scale))
        # The fast path is the compiled core's; the Python core runs every replay on the general
        # path, enabled or not.
        on_fast_path = fast and core.COMPILED
        replays = gpu.telemetry.snapshot().fast_path_dispatches - before
        assert replays == (8 if on_fast_path else 0)
        assert cap.graph.expected > 0.0 if on_fast_path else cap.graph.expected == 0.0
        cap.graph.close()
        gpu.graph_cache.clear()
        await buf.aclose()
        _clean(gpu)


async def test_auto_measures_both_ways_and_keeps_to_one(rng: np.random.Generator) -> None:
    async with ag.open_backend("cuda") as opened:
        gpu: Any = opened
        x = _rand(rng)
        for k in range(40):
            (y,) = await gpu.dispatch(
                SCALE, x, ag.Out(N, np.float32), np.float32(k), np.int32(N), grid=4, block=256,
                graph="auto",
            )  # fmt: skip
            np.testing.assert_array_equal(y, x * np.float32(k))
        stats = gpu.graph_cache.statistics()
        (choice,) = stats.choices
        assert choice.choice in ("eager", "graph"), choice
        assert choice.eager_samples == choice.graph_samples > 0
        assert choice.reason.startswith(f"{choice.choice}: a replay took ")
        assert choice.signature == (
            "scale(float32[1000], Out float32[1000], float32, int32) grid (4, 1, 1) block "
            "(256, 1, 1)"
        )
        assert (stats.chose_eager, stats.chose_graph) == (
            (1, 0) if choice.choice == "eager" else (0, 1)
        )
        if choice.choice == "eager":
            assert stats.instances == stats.bytes == 0  # its graph was freed
    assert gpu.pinned_pool.statistics().bytes_in_use == 0


async def test_the_cache_evicts_under_a_tight_byte_bound(rng: np.random.Generator) -> None:
    async with ag.open_backend("cuda", graph_cache_bytes=200_000) as opened:
        gpu: Any = opened
        sizes = [1000 * k for k in range(1, 9)]  # 8 signatures, 8 to 64 kB each
        for _ in range(3):
            for n in sizes:
                x = _rand(rng, n)
                (y,) = await gpu.dispatch(
                    SCALE,
                    x,
                    ag.Out(n, np.float32),
                    np.float32(2),
                    np.int32(n),
                    grid=-(-n // 256),
                    block=256,
                    graph="always",
                )
                np.testing.assert_array_equal(y, x * 2)
        stats = gpu.graph_cache.statistics()
        assert stats.evictions > 0
        assert stats.bytes <= 200_000 or stats.instances == 1
        assert stats.bytes == sum(
            g.nbytes for e in gpu.graph_cache._entries.values() for g in e.instances
        )
        gpu.graph_cache.clear()
        assert gpu.graph_cache.statistics().bytes == 0
        assert gpu.pinned_pool.statistics().bytes_in_use == 0
