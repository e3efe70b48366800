"""Sharing resident buffers with other libraries on the host backend (DLPack), and what the
host backend refuses (CUDA array interface, stream leases)."""

from __future__ import annotations

import asyncio
import gc

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._buffers._dlpack import live_exports

from .kernels import Recorder, probe_kernel


async def test_numpy_reads_a_resident_buffer_in_place(
    host: ag.Backend, rng: np.random.Generator
) -> None:
    data = rng.standard_normal((3, 5)).astype(np.float32)
    buf = await host.upload(data)
    assert buf.__dlpack_device__() == (1, 0)
    view = np.from_dlpack(buf)
    assert view.shape == (3, 5)
    assert view.dtype == np.float32
    np.testing.assert_array_equal(view, data)
    assert view.ctypes.data == buf._storage.ctypes.data  # the same memory, not a copy
    del view


async def test_an_exported_buffer_keeps_its_memory_until_the_consumer_lets_go(
    host: ag.Backend,
) -> None:
    gc.collect()
    await asyncio.sleep(0)
    before = live_exports()
    buf = await host.upload(np.arange(8, dtype=np.int64))
    view = np.from_dlpack(buf)
    assert live_exports() == before + 1
    await buf.aclose()
    assert buf.is_closed
    assert host._store.bytes_live == 64  # closed, but the consumer still holds the memory
    np.testing.assert_array_equal(view, np.arange(8))
    del view
    gc.collect()
    await asyncio.sleep(0)  # the release comes back through the loop
    assert host._store.bytes_live == 0
    assert live_exports() == before


async def test_a_capsule_nobody_consumed_releases_the_buffer(host: ag.Backend) -> None:
    gc.collect()
    await asyncio.sleep(0)
    before = live_exports()
    buf = await host.upload(np.ones(4, np.float32))
    capsule = buf.__dlpack__()
    assert live_exports() == before + 1
    del capsule
    await asyncio.sleep(0)
    assert live_exports() == before
    assert buf._exports == 0


async def test_dlpack_refusals(host: ag.Backend) -> None:
    buf = await host.upload(np.ones(4, np.float32))
    with pytest.raises(BufferError, match=r"copy=True\): a resident buffer is only shared"):
        buf.__dlpack__(copy=True)
    with pytest.raises(BufferError, match=r"dl_device=\(2, 0\)\): the buffer lives on \(1, 0\)"):
        buf.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match=r"stream=7\): host memory has no streams"):
        buf.__dlpack__(stream=7)
    # A dispatch in flight that uses the buffer: nothing to wait on in host memory.
    rec = Recorder()
    rec.release.clear()
    out = await host.upload(np.zeros(4, np.float32))
    pending = host.dispatch(probe_kernel(rec), buf, ag.Out(into=out), np.int32(4), grid=1, block=4)
    await asyncio.sleep(0.01)
    with pytest.raises(BufferError, match=r"used by a dispatch in flight; await it"):
        np.from_dlpack(out)
    rec.release.set()
    await pending
    np.testing.assert_array_equal(np.from_dlpack(out), np.full(4, 2.0))
    await buf.aclose()
    with pytest.raises(ag.StaleBufferError, match=r"^__dlpack__ is a resident buffer that was"):
        buf.__dlpack__()


async def test_the_host_backend_has_no_device_memory_or_streams(host: ag.Backend) -> None:
    buf = await host.upload(np.ones(4, np.float32))
    assert not hasattr(buf, "__cuda_array_interface__")
    with pytest.raises(
        ag.UnsupportedError,
        match=r"^backend host has no CUDA streams; stream\(\) needs the CUDA backend$",
    ):
        host.stream()
