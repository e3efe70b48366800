"""Interop on a GPU: resident buffers shared with CuPy and PyTorch without copies, and stream
leases for their work."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._buffers._dlpack import live_exports

from .kernels import SCALE, SPIN

pytestmark = pytest.mark.cuda


@pytest.fixture
async def gpu() -> AsyncIterator[Any]:
    async with ag.open_backend("cuda") as backend:
        yield backend


def _pointer(buffer: ag.ResidentBuffer) -> int:
    return int(buffer._storage.handle)


def _slow_write(gpu: Any, flag: ag.ResidentBuffer, ms: float) -> ag.PendingDispatch:
    cycles = np.int64(gpu._cuda.device.device.properties.clock_rate * ms)
    return gpu.dispatch(SPIN, cycles, ag.Out(into=flag), grid=1, block=1)  # type: ignore[no-any-return]


async def test_cupy_and_torch_view_a_buffer_through_the_cuda_array_interface(
    gpu: Any, rng: np.random.Generator
) -> None:
    cp = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    data = rng.standard_normal(1000).astype(np.float32)
    buf = await gpu.upload(data)
    cai = buf.__cuda_array_interface__
    assert (cai["version"], cai["shape"], cai["typestr"], cai["stream"]) == (
        3,
        (1000,),
        "<f4",
        None,
    )
    c = cp.asarray(buf)
    assert c.data.ptr == _pointer(buf)
    np.testing.assert_array_equal(cp.asnumpy(c), data)
    t = torch.as_tensor(buf, device="cuda")
    assert t.data_ptr() == _pointer(buf)
    np.testing.assert_array_equal(t.cpu().numpy(), data)


async def test_a_write_in_flight_names_the_stream_to_wait_on(gpu: Any) -> None:
    cp = pytest.importorskip("cupy")
    await gpu.compile(SPIN)
    flag = gpu.empty(1, np.int32)
    pending = _slow_write(gpu, flag, 50)
    stream = flag.__cuda_array_interface__["stream"]
    assert isinstance(stream, int)
    assert stream > 2
    # CuPy waits on that stream, so it reads what the kernel wrote, 50 ms later.
    assert int(cp.asnumpy(cp.asarray(flag))[0]) == 1
    await pending
    assert flag.__cuda_array_interface__["stream"] is None


async def test_torch_from_dlpack_waits_for_the_writer_and_keeps_the_memory(gpu: Any) -> None:
    torch = pytest.importorskip("torch")
    await gpu.compile(SPIN)
    gc.collect()
    exports = live_exports()
    flag = gpu.empty(1, np.int32)
    assert flag.__dlpack_device__() == (2, 0)
    pending = _slow_write(gpu, flag, 50)
    t = torch.from_dlpack(flag)  # torch's stream is made to wait for the kernel
    assert t.data_ptr() == _pointer(flag)
    assert int(t.item()) == 1
    await pending
    live = gpu._store.bytes_live
    await flag.aclose()
    assert gpu._store.bytes_live == live  # closed, but torch still holds the memory
    assert int(t.item()) == 1
    del t
    gc.collect()
    await asyncio.sleep(0)
    assert gpu._store.bytes_live == live - 4
    assert live_exports() == exports
    with pytest.raises(ag.StaleBufferError, match=r"^__dlpack__ is a resident buffer that was"):
        flag.__dlpack__()


async def test_cupy_to_asyncgraph_to_torch_without_a_host_copy(gpu: Any) -> None:
    cp = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    n = 1 << 16
    x = cp.random.standard_normal(n, dtype=cp.float32)
    out = gpu.empty(n, np.float32)
    before = gpu.telemetry.snapshot()
    await gpu.dispatch(
        SCALE, x, ag.Out(into=out), np.float32(3), np.int32(n), grid=n // 256, block=256
    )
    t = torch.from_dlpack(out)
    y = t * 2  # PyTorch works on the result in place
    after = gpu.telemetry.snapshot()
    assert (after.bytes_up, after.bytes_down) == (before.bytes_up, before.bytes_down)
    np.testing.assert_allclose(y.cpu().numpy(), cp.asnumpy(x) * 6, rtol=1e-6)


async def test_a_result_requested_resident_goes_to_torch_without_a_host_copy(gpu: Any) -> None:
    cp = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    n = 1 << 16
    x = cp.random.standard_normal(n, dtype=cp.float32)
    live = gpu._store.bytes_live
    before = gpu.telemetry.snapshot()
    (buf,) = await gpu.dispatch(
        SCALE,
        x,
        ag.Out(n, np.float32, resident=True),
        np.float32(3),
        np.int32(n),
        grid=n // 256,
        block=256,
    )
    assert isinstance(buf, ag.ResidentBuffer)
    assert gpu._store.bytes_live == live + 4 * n
    t = torch.from_dlpack(buf)
    after = gpu.telemetry.snapshot()
    assert (after.bytes_up, after.bytes_down) == (before.bytes_up, before.bytes_down)
    np.testing.assert_allclose(t.cpu().numpy(), cp.asnumpy(x) * 3, rtol=1e-6)
    # It also feeds the next dispatch in place.
    (again,) = await gpu.dispatch(
        SCALE, buf, ag.Out(n, np.float32), np.float32(2), np.int32(n), grid=n // 256, block=256
    )
    np.testing.assert_allclose(again, cp.asnumpy(x) * 6, rtol=1e-6)
    del t
    await buf.aclose()
    assert gpu._store.bytes_live == live


async def test_torch_work_on_a_leased_stream(gpu: Any) -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(1 << 20, device="cuda")
    async with gpu.stream() as lease:
        assert gpu.stream_pool.statistics().leased == 1
        side = torch.cuda.ExternalStream(lease.handle)
        side.wait_stream(torch.cuda.current_stream())  # x was made on the default stream
        with torch.cuda.stream(side):
            y = x * 2
        # Dispatches meanwhile go to the other streams.
        data = np.ones(1000, np.float32)
        pendings = [
            gpu.dispatch(
                SCALE,
                data,
                ag.Out(1000, np.float32),
                np.float32(2),
                np.int32(1000),
                grid=4,
                block=256,
            )
            for _ in range(8)
        ]
        assert gpu.stream_pool.lanes[lease.index].outstanding == 0
        await lease.synchronize()
        assert torch.equal(y, x * 2)
        for pending in pendings:
            (out,) = await pending
            np.testing.assert_array_equal(out, data * 2)
    assert gpu.stream_pool.statistics().leased == 0
    with pytest.raises(ag.UnsupportedError, match=r"^synchronize\(\) of a stream lease that ended"):
        await lease.synchronize()


async def test_cupy_and_cuda_core_work_on_a_leased_stream(gpu: Any) -> None:
    cp = pytest.importorskip("cupy")
    from cuda.core import Device

    async with gpu.stream() as lease:
        assert int(Device().create_stream(lease).handle) == lease.handle  # __cuda_stream__
        # CuPy 14 takes the lease itself (its __cuda_stream__); older CuPy takes the handle.
        from_external = getattr(cp.cuda.Stream, "from_external", None)
        side = from_external(lease) if from_external else cp.cuda.ExternalStream(lease.handle)
        assert side.ptr == lease.handle
        with side:
            z = cp.arange(1 << 20, dtype=cp.float32) * 3
        await lease.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(z), np.arange(1 << 20, dtype=np.float32) * 3)


async def test_close_waits_for_a_lease_to_end() -> None:
    backend: Any = ag.open_backend("cuda")
    ended = asyncio.Event()

    async def hold() -> None:
        async with backend.stream() as lease:
            await asyncio.sleep(0.05)
            await lease.synchronize()
        ended.set()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0.01)
    await backend.aclose()
    assert ended.is_set()  # the streams were destroyed only after the lease ended
    await holder


async def test_a_tensor_may_outlive_its_backend() -> None:
    torch = pytest.importorskip("torch")
    data = np.arange(1000, dtype=np.float32)
    async with ag.open_backend("cuda") as backend:
        buf = await backend.upload(data)
        t = torch.from_dlpack(buf)
    # The backend closed; the memory stays until PyTorch lets go of it.
    np.testing.assert_array_equal(t.cpu().numpy(), data)
    del t
    gc.collect()
    await asyncio.sleep(0)  # the release comes back through the loop
    assert backend._store.bytes_live == 0
