"""Resident buffers on the host backend: lifetimes, staleness, ordering."""

from __future__ import annotations

import asyncio
import copy
import pickle

import numpy as np
import pytest

import asyncgraph as ag

from .kernels import INC, SCALE, Recorder, probe_kernel


async def test_upload_download_round_trip(host: ag.Backend, rng: np.random.Generator) -> None:
    data = rng.standard_normal((3, 5))
    buf = await host.upload(data)
    assert buf.shape == (3, 5)
    assert buf.dtype == np.float64
    assert buf.nbytes == 120
    back = await host.download(buf)
    np.testing.assert_array_equal(back, data)
    data[0, 0] = 99  # the buffer holds a copy
    assert (await host.download(buf))[0, 0] != 99
    snap = host.telemetry.snapshot()
    assert (snap.bytes_up, snap.bytes_down, snap.copies_up, snap.copies_down) == (120, 240, 1, 2)


async def test_large_buffers_copy_off_the_loop(host: ag.Backend) -> None:
    data = np.arange(1 << 19, dtype=np.float32)  # 2 MiB
    buf = await host.upload(data)
    np.testing.assert_array_equal(await host.download(buf), data)


async def test_dispatch_on_resident_buffers_moves_no_bytes(host: ag.Backend) -> None:
    x = await host.upload(np.arange(8, dtype=np.float32))
    out = host.empty(8, np.float32)
    before = host.telemetry.snapshot()
    (res,) = await host.dispatch(
        SCALE, x, ag.Out(into=out), np.float32(3), np.int32(8), grid=1, block=8
    )
    assert res is out
    after = host.telemetry.snapshot()
    assert (after.bytes_up, after.bytes_down) == (before.bytes_up, before.bytes_down)
    np.testing.assert_array_equal(await host.download(out), np.arange(8) * 3)


async def test_out_into_is_zero_filled(host: ag.Backend) -> None:
    out = await host.upload(np.full(8, 7.0, np.float32))
    await host.dispatch(
        SCALE, np.ones(8, np.float32), ag.Out(into=out), np.float32(1), np.int32(2), grid=1, block=8
    )
    np.testing.assert_array_equal(await host.download(out), [1, 1, 0, 0, 0, 0, 0, 0])


async def test_dispatches_on_one_buffer_run_in_call_order() -> None:
    async with ag.open_backend("host", host_workers=8) as backend:
        buf = await backend.upload(np.zeros(1000, np.float32))
        doubled = await backend.upload(np.zeros(1000, np.float32))
        # inc, inc, ..., then scale reading buf: every increment must land before the scale.
        for _ in range(50):
            backend.dispatch(INC, buf, np.float32(1), np.int32(1000), grid=4, block=256)
        last = backend.dispatch(
            SCALE, buf, ag.Out(into=doubled), np.float32(2), np.int32(1000), grid=4, block=256
        )
        await last
        np.testing.assert_array_equal(await backend.download(doubled), np.full(1000, 100.0))
        np.testing.assert_array_equal(await backend.download(buf), np.full(1000, 50.0))


async def test_close_is_deferred_until_uses_complete(host: ag.Backend) -> None:
    rec = Recorder()
    rec.release.clear()
    x = await host.upload(np.arange(4, dtype=np.float32))
    pending = host.dispatch(
        probe_kernel(rec), x, ag.Out(4, np.float32), np.int32(4), grid=1, block=4
    )
    await x.aclose()
    assert x.is_closed
    assert x._storage is not None  # still in use: not freed yet
    with pytest.raises(
        ag.StaleBufferError,
        match=r"^download\(\) is a resident buffer that was "
        r"closed \(slot 0, generation 0\); upload the data again$",
    ):
        await host.download(x)
    rec.release.set()
    (out,) = await pending
    np.testing.assert_array_equal(out, np.arange(4) * 2)
    assert x._storage is None
    assert host._store.bytes_live == 0
    await x.aclose()  # harmless twice


async def test_stale_and_foreign_handles_are_refused(host: ag.Backend) -> None:
    old = await host.upload(np.ones(4, np.float32))
    await old.aclose()
    new = await host.upload(np.ones(4, np.float32))
    assert (new._slot, new._generation) == (old._slot, old._generation + 1)  # slot reused
    with pytest.raises(
        ag.StaleBufferError,
        match=r"^args\[0\] of 'inc' \(float\* buf\) is a resident buffer that was closed "
        r"\(slot 0, generation 0\); upload the data again$",
    ):
        host.dispatch(INC, old, np.float32(1), np.int32(4), grid=1, block=4)
    async with ag.open_backend("host") as other:
        foreign = await other.upload(np.ones(4, np.float32))
        with pytest.raises(
            ag.StaleBufferError,
            match=r"^args\[0\] of 'inc' \(float\* buf\) is a resident buffer of another backend "
            r"\(also named host\); upload the data to this backend \(host\) with "
            r"backend.upload\(\)$",
        ):
            host.dispatch(INC, foreign, np.float32(1), np.int32(4), grid=1, block=4)
        with pytest.raises(ag.StaleBufferError, match="another backend"):
            host.dispatch(
                SCALE,
                np.ones(4, np.float32),
                ag.Out(into=foreign),
                np.float32(1),
                np.int32(4),
                grid=1,
                block=4,
            )
    # The backend still works, and the refused dispatches left no trace.
    await host.dispatch(INC, new, np.float32(1), np.int32(4), grid=1, block=4)
    np.testing.assert_array_equal(await host.download(new), np.full(4, 2.0))
    assert host.telemetry.snapshot().dispatches == 1


async def test_a_buffer_of_a_closed_backend_says_its_backend_was_closed(
    host: ag.Backend,
) -> None:
    other = ag.open_backend("host")
    buffer = await other.upload(np.ones(4, np.float32))
    await other.aclose()
    with pytest.raises(
        ag.StaleBufferError,
        match=r"^args\[0\] of 'inc' \(float\* buf\) is a resident buffer of backend host, which "
        r"was closed; upload the data to this backend \(host\) with backend.upload\(\)$",
    ):
        host.dispatch(INC, buffer, np.float32(1), np.int32(4), grid=1, block=4)
    # Its own store says the same when the buffer is shared after the close.
    with pytest.raises(
        ag.StaleBufferError,
        match=r"^__dlpack__ is a resident buffer of backend host, which was closed; open a new "
        r"backend and upload the data to it$",
    ):
        buffer.__dlpack__()
    assert repr(host) == "<HostBackend host open in_flight=0 queued=0 buffers=0>"


async def test_download_waits_for_writers(host: ag.Backend) -> None:
    buf = await host.upload(np.zeros(4, np.float32))
    for _ in range(10):
        host.dispatch(INC, buf, np.float32(1), np.int32(4), grid=1, block=4)
    np.testing.assert_array_equal(await host.download(buf), np.full(4, 10.0))


async def test_out_into_rejects_shape_with_buffer(host: ag.Backend) -> None:
    buf = host.empty((2, 2), np.int32)
    with pytest.raises(ag.DispatchError, match=r"^Out\(into=buffer\) takes its shape and dtype "):
        ag.Out(4, np.int32, into=buf)
    assert repr(ag.Out(into=buf)).startswith("Out(into=<ResidentBuffer int32 (2, 2) on host")
    await asyncio.sleep(0)


async def test_download_into_an_array_of_yours(host: ag.Backend) -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = await host.upload(data)
    out = np.zeros((3, 4), np.float32)
    result = await host.download(buf, out=out)
    assert result is out
    np.testing.assert_array_equal(out, data)
    with pytest.raises(
        ag.ShapeMismatchError,
        match=r"^download\(out=\.\.\.\) got a float32 array of shape \(4, 3\)",
    ):
        await host.download(buf, out=np.zeros((4, 3), np.float32))
    with pytest.raises(ag.ShapeMismatchError, match=r"^download\(out=\.\.\.\) got a float64 array"):
        await host.download(buf, out=np.zeros((3, 4), np.float64))
    with pytest.raises(
        ag.ArgumentTypeError, match=r"^download\(out=\.\.\.\) needs a writable, C-contiguous"
    ):
        await host.download(buf, out=np.zeros((4, 3), np.float32).T)
    frozen = np.zeros((3, 4), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ag.ArgumentTypeError, match=r"needs a writable, C-contiguous array"):
        await host.download(buf, out=frozen)
    with pytest.raises(
        ag.ArgumentTypeError, match=r"^download\(out=\.\.\.\) takes a numpy array, got list"
    ):
        await host.download(buf, out=[0.0] * 12)  # type: ignore[arg-type]


async def test_a_result_can_stay_resident(host: ag.Backend) -> None:
    x = np.arange(6, dtype=np.float32)
    (buf,) = await host.dispatch(
        SCALE,
        x,
        ag.Out(6, np.float32, resident=True),
        np.float32(2),
        np.int32(6),
        grid=1,
        block=6,
    )
    assert isinstance(buf, ag.ResidentBuffer)
    assert buf.shape == (6,)
    assert buf.dtype == np.dtype(np.float32)
    np.testing.assert_array_equal(await host.download(buf), x * 2)
    # It feeds the next dispatch in place.
    (again,) = await host.dispatch(
        SCALE, buf, ag.Out(6, np.float32), np.float32(3), np.int32(6), grid=1, block=6
    )
    np.testing.assert_array_equal(again, x * 6)
    assert repr(ag.Out(6, np.float32, resident=True)) == "Out((6,), float32, resident=True)"


async def test_a_refused_dispatch_gives_its_resident_results_back(host: ag.Backend) -> None:
    live = host._store.bytes_live
    with pytest.raises(ag.ArgumentTypeError, match=r"is a Python int"):
        host.dispatch(
            SCALE,
            np.ones(6, np.float32),
            ag.Out(6, np.float32, resident=True),
            np.float32(2),
            6,  # a bare int: refused before the resident result is made
            grid=1,
            block=6,
        )
    assert host._store.bytes_live == live
    assert len(host._store) == 0


async def test_out_resident_refusals(host: ag.Backend) -> None:
    with pytest.raises(ag.ArgumentTypeError, match=r"^Out\(resident='yes'\); pass True or False$"):
        ag.Out(4, np.float32, resident="yes")  # type: ignore[arg-type]
    buf = host.empty(4, np.float32)
    with pytest.raises(ag.DispatchError, match=r"^Out\(into=buffer\) already writes a resident"):
        ag.Out(into=buf, resident=True)


async def test_a_resident_buffer_cannot_be_pickled_or_copied(host: ag.Backend) -> None:
    buffer = await host.upload(np.ones((2, 3), np.float32))
    message = (
        r"^a resident buffer \(float32 \(2, 3\) on host\) cannot be pickled: it lives on its "
        r"backend, in the process that made it; download it first \('array = await "
        r"backend\.download\(buffer\)'\) and send the array$"
    )
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        with pytest.raises(ag.NotPicklableError, match=message):
            pickle.dumps({"weights": [buffer]}, protocol=protocol)
    with pytest.raises(TypeError, match=message):  # what pickle raises for such objects
        copy.deepcopy(buffer)
    with pytest.raises(ag.UnsupportedError, match=message):
        copy.copy(buffer)
    np.testing.assert_array_equal(await host.download(buffer), np.ones((2, 3), np.float32))
