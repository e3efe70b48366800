"""Other libraries' streams and events without a GPU: what is recognised as which, and the host
backend's refusals. The CUDA side is in ``test_cuda_foreign.py`` and
``test_cuda_torch_cupy.py``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as drv

import asyncgraph as ag
from asyncgraph._cuda.completion._foreign_work import resolve

from .kernels import INC


class TorchLikeStream:
    """What ``resolve`` reads of a PyTorch stream."""

    __module__ = "torch.cuda.streams"

    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle


class TorchLikeEvent:
    __module__ = "torch.cuda.streams"

    def __init__(self, handle: int) -> None:
        self.cuda_event = handle


TorchLikeEvent.__name__ = "Event"


class CupyLikeStream:
    __module__ = "cupy.cuda.stream"

    def __init__(self, handle: int) -> None:
        self.ptr = handle


class CupyLikeEvent:
    __module__ = "cupy.cuda.stream"

    def __init__(self, handle: int) -> None:
        self.ptr = handle


CupyLikeEvent.__name__ = "Event"


class WithProtocol:
    def __init__(self, version: int, handle: int) -> None:
        self.version, self.handle = version, handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (self.version, self.handle)


@pytest.mark.parametrize(
    ("work", "expected"),
    [
        (0, ("stream", 0)),
        (0x7F00, ("stream", 0x7F00)),
        (drv.CUstream(0x1234), ("stream", 0x1234)),
        (drv.CUevent(0x5678), ("event", 0x5678)),
        (WithProtocol(0, 0xBEEF), ("stream", 0xBEEF)),
        (TorchLikeStream(0xAB00), ("stream", 0xAB00)),
        (TorchLikeEvent(0xAC00), ("event", 0xAC00)),
        (CupyLikeStream(0xAD00), ("stream", 0xAD00)),
        (CupyLikeEvent(0xAE00), ("event", 0xAE00)),
    ],
)
def test_streams_and_events_are_told_apart(work: object, expected: tuple[str, int]) -> None:
    assert resolve(work) == expected


@pytest.mark.parametrize(
    ("work", "message"),
    [
        ("stream", "not a CUDA stream or event"),
        (None, "not a CUDA stream or event"),
        (2.0, "not a CUDA stream or event"),
        (True, "not a CUDA stream or event"),
        (-1, "negative"),
        (WithProtocol(1, 0xBEEF), "version 1"),
        (TorchLikeEvent(0), "never recorded"),
    ],
)
def test_what_is_neither_is_refused_with_what_to_pass(work: object, message: str) -> None:
    with pytest.raises(ag.ArgumentTypeError, match=message):
        resolve(work)


async def test_the_host_backend_refuses_waits_and_says_what_to_do(host: ag.Backend) -> None:
    with pytest.raises(ag.UnsupportedError, match=r"wait\(\).*open_backend\('cuda'\)"):
        host.wait(0)
    pending = host.dispatch(
        INC, ag.InOut(np.zeros(4, np.float32)), np.float32(1), np.int32(4), grid=1, block=4
    )
    with pytest.raises(ag.UnsupportedError, match="to_thread"):
        await host.order(0, after=pending)
    await pending
    before = host.telemetry.snapshot().dispatches
    with pytest.raises(ag.UnsupportedError, match=r"dispatch\(after=...\)"):
        host.dispatch(INC, ag.InOut(np.zeros(4, np.float32)), np.float32(1), np.int32(4),
                      grid=1, block=4, after=0)  # fmt: skip
    assert host.telemetry.snapshot().dispatches == before  # nothing started
    (out,) = await host.dispatch(
        INC, ag.InOut(np.zeros(4, np.float32)), np.float32(1), np.int32(4), grid=1, block=4
    )
    assert (out == 1).all()  # and the backend is still usable


async def test_submit_passes_after_on(host: ag.Backend) -> None:
    with pytest.raises(ag.UnsupportedError, match=r"after="):
        await host.submit(INC, ag.InOut(np.zeros(4, np.float32)), np.float32(1), np.int32(4),
                          grid=1, block=4, after=[0])  # fmt: skip


async def test_order_takes_only_a_pending_dispatch(host: ag.Backend) -> None:
    pending: Any = "a dispatch"
    with pytest.raises(ag.ArgumentTypeError, match="PendingDispatch"):
        await host.order(0, after=pending)
