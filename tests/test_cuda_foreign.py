"""Other libraries' CUDA work: ``backend.wait``, ``dispatch(after=)``, ``backend.order``.

The foreign work here is ``cuda.core``'s: a stream of the same device and context, and the
long ``spin`` kernel launched on it through ``cuda.core``. PyTorch's and CuPy's own streams
and events are in ``test_cuda_torch_cupy.py``. Every test carries the ``cuda`` marker.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as drv

import asyncgraph as ag
from asyncgraph._buffers._resident import storage_of
from asyncgraph._demo._spin_kernel import SPIN_SOURCE

from .kernels import INC

pytestmark = pytest.mark.cuda

N = 1024


@pytest.fixture
async def gpu() -> AsyncIterator[Any]:
    async with ag.open_backend("cuda") as backend:
        yield backend


class Foreign:
    """A stream of another library (``cuda.core``) with the spin kernel to keep it busy."""

    def __init__(self, backend: Any) -> None:
        from cuda.core import Device, LaunchConfig, Program, ProgramOptions

        self.device = Device(backend._cuda.device.device.device_id)
        self.device.set_current()
        self.stream = self.device.create_stream()
        arch = "sm_" + "".join(map(str, self.device.compute_capability))
        program = Program(SPIN_SOURCE, code_type="c++", options=ProgramOptions(arch=arch))
        self.kernel = program.compile("cubin").get_kernel("spin")
        self.config = LaunchConfig(grid=1, block=1)
        self.done = self.device.allocate(4, stream=self.stream)
        self.khz = self.device.properties.clock_rate

    @property
    def handle(self) -> int:
        return int(self.stream.handle)

    def spin(self, ms: float) -> None:
        """Keep the stream busy for about *ms* milliseconds."""
        from cuda.core import launch

        launch(self.stream, self.config, self.kernel, np.int64(self.khz * ms), self.done)

    def idle(self) -> bool:
        """Whether everything enqueued on the stream completed (a query, no wait)."""
        code = drv.cuStreamQuery(drv.CUstream(self.handle))[0]
        assert code in (drv.CUresult.CUDA_SUCCESS, drv.CUresult.CUDA_ERROR_NOT_READY), code
        return bool(code == drv.CUresult.CUDA_SUCCESS)

    def close(self) -> None:
        self.stream.sync()
        self.done.close()
        self.stream.close()


@pytest.fixture
def foreign(gpu: Any) -> Iterator[Foreign]:
    work = Foreign(gpu)
    yield work
    work.close()


async def test_wait_returns_once_the_streams_work_completed(gpu: Any, foreign: Foreign) -> None:
    foreign.spin(50)
    waiting = asyncio.ensure_future(gpu.wait(foreign.stream))
    # The loop turns while wait() waits for the 50 ms kernel: counted in turns, not in time
    # (a wait that blocked the loop would be done before the first turn).
    turns = 0
    while not waiting.done() and turns < 20:
        await asyncio.sleep(0)
        turns += 1
    assert turns == 20, f"wait() was done after {turns} turns of the loop"
    await waiting
    assert foreign.idle(), "wait() returned before the stream's work completed"


@pytest.mark.parametrize("form", ["cuda.core Stream", "__cuda_stream__", "CUstream", "int"])
async def test_every_form_of_a_stream_is_accepted(gpu: Any, foreign: Foreign, form: str) -> None:
    class Protocol:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, foreign.handle)

    work: object = {
        "cuda.core Stream": foreign.stream,
        "__cuda_stream__": Protocol(),
        "CUstream": drv.CUstream(foreign.handle),
        "int": foreign.handle,
    }[form]
    foreign.spin(5)
    await gpu.wait(work)
    assert foreign.idle()


async def test_waits_on_two_streams_do_not_wait_for_each_other(gpu: Any, foreign: Foreign) -> None:
    """One stream's waits are watched as they are, another's meanwhile are relayed: a short
    wait on the second completes while the first stream still runs."""
    other = Foreign(gpu)
    try:
        # Loaded first: the first launch of a module loads it, waiting for the whole device.
        other.spin(1)
        other.stream.sync()
        foreign.spin(200)
        slow = gpu.wait(foreign.stream)  # takes the direct lane
        other.spin(1)
        await gpu.wait(other.stream)  # relayed; done long before the first
        assert other.idle()
        assert not slow.done()
        assert not foreign.idle()
        await slow
        assert foreign.idle()
        other.spin(1)
        await gpu.wait(other.stream)  # the direct lane is free again: now it takes this one
    finally:
        other.close()
    stats = gpu.event_statistics()
    assert stats.idle == stats.created


async def test_one_stream_at_a_time_is_watched_directly(gpu: Any, foreign: Foreign) -> None:
    """Where the waits go (the reactor's two foreign lanes), read from its lanes."""
    device = gpu._cuda.device
    relay, direct = (device.watches.lanes[lane.index] for lane in device.wait_lanes)
    other = Foreign(gpu)
    try:
        first = [gpu.wait(foreign.stream) for _ in range(3)]
        meanwhile = [gpu.wait(other.stream), gpu.wait(other.stream.record())]
        assert (len(direct.pending), len(relay.pending)) == (3, 2)
        await asyncio.gather(*first, *meanwhile)
        assert (len(direct.pending), len(relay.pending)) == (0, 0)
        later = gpu.wait(other.stream)  # the direct lane was free: it takes this stream now
        assert (len(direct.pending), len(relay.pending)) == (1, 0)
        await later
    finally:
        other.close()


async def test_a_recorded_event_is_awaited(gpu: Any, foreign: Foreign) -> None:
    foreign.spin(30)
    event = foreign.stream.record()  # a cuda.core Event, after the spin: waited for
    foreign.spin(30)  # after the event: not waited for
    handle = drv.CUevent(int(event.handle))
    await gpu.wait(event)
    assert drv.cuEventQuery(handle)[0] == drv.CUresult.CUDA_SUCCESS, "returned before the event"
    await gpu.wait(handle)  # the driver's form of the same event
    assert drv.cuEventQuery(handle)[0] == drv.CUresult.CUDA_SUCCESS
    foreign.stream.sync()
    event.close()


async def test_a_lease_is_a_stream_too(gpu: Any, foreign: Foreign) -> None:
    """wait(lease) returns once the lease's stream did its work: a copy queued on it behind a
    long kernel of another stream arrived."""
    buf = await gpu.upload(np.full(N, 7, np.float32))
    staged = gpu.pinned_empty(N, np.float32)
    staged[:] = 0
    pointer = drv.CUdeviceptr(gpu._cuda.storage_pointer(storage_of(buf)))
    foreign.spin(30)
    event = foreign.stream.record()
    async with gpu.stream() as lease:
        stream = drv.CUstream(lease.handle)
        (err,) = drv.cuStreamWaitEvent(stream, drv.CUevent(int(event.handle)), 0)
        assert err == drv.CUresult.CUDA_SUCCESS
        (err,) = drv.cuMemcpyDtoHAsync(staged.ctypes.data, pointer, staged.nbytes, stream)
        assert err == drv.CUresult.CUDA_SUCCESS
        await gpu.wait(lease)
        assert (staged == 7).all(), "wait(lease) returned before the lease's copy completed"
    event.close()


async def test_many_waits_at_once_complete_and_leak_nothing(gpu: Any, foreign: Foreign) -> None:
    threads = threading.active_count()
    before = gpu.event_statistics()
    foreign.spin(20)
    waits = [gpu.wait(foreign.stream) for _ in range(10_000)]
    await asyncio.gather(*waits)
    assert foreign.idle()
    stats = gpu.event_statistics()
    assert stats.idle == stats.created, "an event did not go back to its pool"
    assert stats.created - before.created < 10_000 + 64  # recycled, not one per wait forever
    await gpu.aclose()
    # The waiter threads a wait may hand its event to are joined at close.
    assert threading.active_count() <= threads


async def test_cancelling_the_awaiter_leaves_the_work_and_returns_the_event(
    gpu: Any, foreign: Foreign
) -> None:
    foreign.spin(100)
    task = asyncio.ensure_future(gpu.wait(foreign.stream))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not foreign.idle(), "the foreign work should still run"
    await gpu.wait(foreign.stream)  # the backend still works, and waits for it
    await asyncio.sleep(0.01)  # the cancelled wait's event comes back on the next poll
    stats = gpu.event_statistics()
    assert stats.idle == stats.created


async def test_close_waits_for_foreign_waits_in_flight(gpu: Any, foreign: Foreign) -> None:
    foreign.spin(50)
    wait = gpu.wait(foreign.stream)
    await gpu.aclose()
    assert wait.done()
    assert wait.exception() is None
    assert foreign.idle()
    with pytest.raises(ag.BackendClosedError):
        gpu.wait(foreign.stream)


async def test_a_stream_of_another_context_is_refused_before_anything(gpu: Any) -> None:
    device = gpu._cuda.device
    code, other = drv.cuCtxCreate(None, 0, int(device.device.device_id))
    assert code == drv.CUresult.CUDA_SUCCESS, code
    try:
        code, stream = drv.cuStreamCreate(0)
        assert code == drv.CUresult.CUDA_SUCCESS, code
        drv.cuCtxPopCurrent()
        created = gpu.event_statistics().created
        with pytest.raises(ag.DispatchError, match="another CUDA context"):
            gpu.wait(stream)
        with pytest.raises(ag.DispatchError, match="another CUDA context"):
            gpu.dispatch(INC, gpu.empty(N, np.float32), np.float32(1), np.int32(N), grid=4,
                         block=256, after=stream)  # fmt: skip
        assert gpu.event_statistics().created == created
        drv.cuCtxPushCurrent(other)
        drv.cuStreamDestroy(stream)
    finally:
        drv.cuCtxDestroy(other)
        device.device.set_current()
    await gpu.wait(0)  # the backend is still usable (its context current again)


@pytest.mark.parametrize(
    ("work", "message"),
    [
        ("stream", "not a CUDA stream or event"),
        (1.5, "not a CUDA stream or event"),
        (True, "not a CUDA stream or event"),
        (-3, "negative"),
    ],
)
async def test_what_is_not_a_stream_is_refused(gpu: Any, work: object, message: str) -> None:
    with pytest.raises(ag.ArgumentTypeError, match=message):
        gpu.wait(work)
    await gpu.wait(0)


async def test_dispatch_after_a_stream_runs_after_its_work(
    gpu: Any, foreign: Foreign, rng: np.random.Generator
) -> None:
    """The dispatch reads a buffer the foreign stream writes late: ordered, it sees the write."""
    x = rng.standard_normal(N, dtype=np.float32)
    buf = await gpu.upload(np.zeros(N, np.float32))
    foreign.spin(30)  # then write x into the buffer, on the foreign stream
    staged = gpu.pinned_empty(N, np.float32)
    staged[:] = x
    pointer = drv.CUdeviceptr(gpu._cuda.storage_pointer(storage_of(buf)))
    drv.cuMemcpyHtoDAsync(pointer, staged.ctypes.data, x.nbytes, drv.CUstream(foreign.handle))
    await gpu.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256,
                       after=foreign.stream)  # fmt: skip
    np.testing.assert_array_equal(await gpu.download(buf), x + np.float32(1))


async def test_dispatch_after_takes_a_list_and_events(gpu: Any, foreign: Foreign) -> None:
    event = foreign.stream.record()
    (out,) = await gpu.dispatch(
        INC, ag.InOut(np.zeros(N, np.float32)), np.float32(2), np.int32(N), grid=4, block=256,
        after=[foreign.stream, event, foreign.handle],
    )  # fmt: skip
    assert (out == 2).all()
    event.close()


async def test_a_refused_after_starts_nothing(gpu: Any) -> None:
    before = gpu.telemetry.snapshot().dispatches
    with pytest.raises(ag.ArgumentTypeError):
        gpu.dispatch(INC, ag.InOut(np.zeros(N, np.float32)), np.float32(1), np.int32(N),
                     grid=4, block=256, after=[0, "nope"])  # fmt: skip
    assert gpu.telemetry.snapshot().dispatches == before
    stats = gpu.event_statistics()
    assert stats.idle == stats.created


async def test_order_makes_a_stream_wait_for_a_dispatch(gpu: Any, foreign: Foreign) -> None:
    """The foreign stream copies the buffer out after ``order``: it sees the dispatch's write,
    though the dispatch waited behind a long kernel first."""
    buf = await gpu.upload(np.zeros(N, np.float32))
    await gpu.compile(INC)
    foreign.spin(0)
    slow = Foreign(gpu)
    try:
        slow.spin(30)
        pending = gpu.dispatch(INC, buf, np.float32(3), np.int32(N), grid=4, block=256,
                               after=slow.stream)  # fmt: skip
        await gpu.order(foreign.stream, after=pending)
        staged = gpu.pinned_empty(N, np.float32)
        pointer = drv.CUdeviceptr(gpu._cuda.storage_pointer(storage_of(buf)))
        drv.cuMemcpyDtoHAsync(staged.ctypes.data, pointer, staged.nbytes,
                              drv.CUstream(foreign.handle))  # fmt: skip
        await gpu.wait(foreign.stream)
        assert (staged == 3).all(), "the stream ran before the dispatch it was ordered after"
        await pending
        await gpu.order(foreign.stream, after=pending)  # completed: nothing to do
    finally:
        slow.close()


async def test_order_refuses_what_is_not_a_pending_dispatch(gpu: Any) -> None:
    with pytest.raises(ag.ArgumentTypeError, match="PendingDispatch"):
        await gpu.order(0, after="dispatch")
