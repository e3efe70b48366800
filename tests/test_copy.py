"""``backend.copy``: a resident buffer copied within a backend or to another one.

On host backends here; between CUDA backends on the stand-in driver with two devices
(``fake_driver/copy_scenario.py``: within a context ``cuMemcpyDtoDAsync``, between the two
devices ``cuMemcpyPeerAsync`` with peer access enabled once per pair). ``test_cuda_group.py``
copies on a GPU, with writers in flight.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from tests.fake_driver import run_scenario

from .kernels import INC
from .needs import CORES

N = 4096


@pytest.fixture
async def hosts() -> AsyncIterator[tuple[Any, Any]]:
    async with ag.open_backend("host") as a, ag.open_backend("host") as b:
        yield a, b


def _inc(backend: Any, buffer: ag.ResidentBuffer) -> ag.PendingDispatch:
    pending: ag.PendingDispatch = backend.dispatch(
        INC, buffer, np.float32(1), np.int32(N), grid=N // 256, block=256
    )
    return pending


async def test_a_copy_reads_the_writers_before_it_and_is_its_own(
    hosts: tuple[Any, Any], rng: np.random.Generator
) -> None:
    a, b = hosts
    x = rng.standard_normal(N, dtype=np.float32)
    source = await a.upload(x)
    writes = [_inc(a, source) for _ in range(3)]  # in flight when the copy starts
    copied = await a.copy(source, to=b)
    twin = await a.copy(source)
    expected = x + np.float32(1) + np.float32(1) + np.float32(1)
    for pending in writes:
        await pending
    await _inc(b, copied)
    assert np.array_equal(await b.download(copied), expected + np.float32(1))
    assert np.array_equal(await a.download(twin), expected)
    assert np.array_equal(await a.download(source), expected)
    assert b.telemetry.snapshot().buffer_copies == 1
    assert b.telemetry.snapshot().buffer_copy_bytes == x.nbytes
    assert a.telemetry.snapshot().buffer_copies == 1


async def test_bad_copies_are_refused_and_the_backend_goes_on(hosts: tuple[Any, Any]) -> None:
    a, b = hosts
    source = await a.upload(np.ones(N, np.float32))
    with pytest.raises(ag.ArgumentTypeError, match=r"^copy\(\.\.\., to='host'\): pass a backend"):
        await a.copy(source, to="host")
    with pytest.raises(ag.ArgumentTypeError, match=r"^copy\(\) takes a resident buffer, got"):
        await a.copy(np.ones(N, np.float32), to=b)
    with pytest.raises(ag.StaleBufferError):
        await b.copy(source)  # it lives on a
    await source.aclose()
    with pytest.raises(ag.StaleBufferError):
        await a.copy(source, to=b)
    fresh = await a.upload(np.ones(N, np.float32))
    assert np.array_equal(await b.download(await a.copy(fresh, to=b)), np.ones(N, np.float32))


async def test_a_copy_to_a_closed_backend_is_refused(hosts: tuple[Any, Any]) -> None:
    a, b = hosts
    source = await a.upload(np.ones(N, np.float32))
    await b.aclose()
    with pytest.raises(ag.BackendClosedError):
        await a.copy(source, to=b)
    assert np.array_equal(await a.download(await a.copy(source)), np.ones(N, np.float32))


@pytest.mark.stand_in
@pytest.mark.nvrtc
@pytest.mark.parametrize("core", CORES)
def test_copies_between_cuda_backends_on_the_stand_in(core: str) -> None:
    seen = run_scenario("tests.fake_driver.copy_scenario", core)
    # Within a backend, to a backend of the same device, to the other device twice, to the
    # host, and from the host back to the other device: each right.
    assert seen["right"] == [True] * 6
    assert seen["peer_copies"] == 2  # the two copies between the devices
    assert seen["peer_enables"] == 1  # once for the pair
    assert seen["copies_on_b"] == 2
    assert "closed" in seen["stale"]
    assert seen["not_a_backend"] == "copy(..., to='cuda:1'): pass a backend, or nothing"
    assert seen["group_copy"] is True
    assert seen["spare_reused"] == [True, True]  # the closed copy's storage, right bytes
    assert seen["replicated"] == [True, True]
    assert seen["replicate_uploads"] == [4096 * 4, 0]  # uploaded once, copied on the devices
    assert seen["after_queued_writers"] == [2, True]  # two writers queued, both in the copy
    assert seen["wrong_context_calls"] == 0
