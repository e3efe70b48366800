"""Host memory running out: AllocationError, as on the GPU, never numpy's bare MemoryError.

8 TiB (2**40 float64) is refused by the kernel at once, without touching memory, under Linux's
heuristic overcommit (the default); tests that need a copy to fail make host_copy ask for that much.
Where the host always overcommits (``vm.overcommit_memory=1``, common in containers) such a
request succeeds lazily, and zero-filling it would exhaust the machine's memory: those tests are
skipped there, with that reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
import asyncgraph._args._bound_args
import asyncgraph._host._host_backend

from .kernels import SCALE

Array = np.ndarray[Any, Any]

HUGE = 2**40  # float64 elements: 8 TiB
HUGE_BYTES = 8 * HUGE
X = np.arange(8, dtype=np.float32)
TAIL = r"needs {} bytes, more than the host could allocate; free memory or ask for less$"


def _always_overcommits() -> bool:
    try:
        return Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1"
    except OSError:
        return False


refused_at_once = pytest.mark.skipif(
    _always_overcommits(),
    reason="vm.overcommit_memory=1: this host grants 8 TiB lazily instead of refusing it, and "
    "zero-filling it would exhaust memory",
)


def _tail(nbytes: int) -> str:
    return TAIL.format(nbytes)


async def _still_usable(backend: ag.Backend) -> None:
    (out,) = await backend.dispatch(
        SCALE, X, ag.Out(8, np.float32), np.float32(2), np.int32(8), grid=1, block=8
    )
    np.testing.assert_array_equal(out, 2 * X)
    buf = await backend.upload(X)
    np.testing.assert_array_equal(await backend.download(buf), X)
    await buf.aclose()


@refused_at_once
def test_the_huge_size_really_fails_at_once() -> None:
    with pytest.raises(MemoryError):
        np.empty(HUGE, np.float64)


def _copy_too_much(array: Array) -> Array:
    return np.empty(HUGE, np.float64)  # numpy's own error, as a failing copy raises it


def _expect(error: pytest.ExceptionInfo[ag.AllocationError]) -> None:
    assert isinstance(error.value, ag.AsyncGraphError)
    assert isinstance(error.value, MemoryError)
    assert type(error.value.__cause__) is not ag.AllocationError
    assert isinstance(error.value.__cause__, MemoryError)


@refused_at_once
async def test_empty_raises_allocation_error(host: ag.Backend) -> None:
    with pytest.raises(
        ag.AllocationError,
        match=rf"^a resident buffer of shape \({HUGE},\) and dtype float64 {_tail(HUGE_BYTES)}",
    ) as caught:
        host.empty(HUGE, np.float64)
    _expect(caught)
    await _still_usable(host)


async def test_empty_beyond_numpy_raises_allocation_error(host: ag.Backend) -> None:
    with pytest.raises(
        ag.AllocationError,
        match=rf"^a resident buffer of shape \({2**62},\) and dtype float64 {_tail(2**65)}",
    ):
        host.empty(2**62, np.float64)  # numpy's ValueError "array is too big"
    await _still_usable(host)


@refused_at_once
async def test_pinned_empty_raises_allocation_error(host: ag.Backend) -> None:
    with pytest.raises(
        ag.AllocationError,
        match=rf"^a host array of shape \({HUGE},\) and dtype float64 {_tail(HUGE_BYTES)}",
    ) as caught:
        host.pinned_empty(HUGE, np.float64)
    _expect(caught)
    await _still_usable(host)


@refused_at_once
async def test_a_resident_result_raises_allocation_error(host: ag.Backend) -> None:
    with pytest.raises(
        ag.AllocationError,
        match=rf"^a resident buffer of shape \({2 * HUGE},\) and dtype float32 "
        rf"{_tail(HUGE_BYTES)}",
    ):
        host.dispatch(
            SCALE,
            X,
            ag.Out(2 * HUGE, np.float32, resident=True),
            np.float32(2),
            np.int32(8),
            grid=1,
            block=8,
        )
    await _still_usable(host)


@pytest.mark.parametrize("size", [8, 1 << 20], ids=["inline copy", "copy in a thread"])
@refused_at_once
async def test_upload_raises_allocation_error(
    host: ag.Backend, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    monkeypatch.setattr(asyncgraph._host._host_backend, "host_copy", _copy_too_much)
    array = np.ones(size, np.float32)
    with pytest.raises(
        ag.AllocationError,
        match=rf"^a resident copy of a float32 array of shape \({size},\) {_tail(4 * size)}",
    ) as caught:
        await host.upload(array)
    _expect(caught)
    monkeypatch.undo()
    await _still_usable(host)


@refused_at_once
async def test_an_output_too_large_fails_its_dispatch(host: ag.Backend) -> None:
    pending = host.dispatch(
        SCALE, X, ag.Out(2 * HUGE, np.float32), np.float32(2), np.int32(8), grid=1, block=8
    )
    with pytest.raises(
        ag.AllocationError,
        match=rf"^args\[1\] of 'scale' \(float\* out\), Out\(\({2 * HUGE},\), float32\), "
        rf"{_tail(HUGE_BYTES)}",
    ) as caught:
        await pending
    _expect(caught)
    await _still_usable(host)


@refused_at_once
async def test_an_in_out_copy_that_fails_fails_its_dispatch(
    host: ag.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asyncgraph._args._bound_args, "host_copy", _copy_too_much)
    pending = host.dispatch(
        SCALE, X, ag.InOut(np.zeros(8, np.float32)), np.float32(2), np.int32(8), grid=1, block=8
    )
    with pytest.raises(
        ag.AllocationError,
        match=r"^args\[1\] of 'scale' \(float\* out\), InOut\(<float32 array \(8,\)>\), "
        rf"{_tail(32)}",
    ) as caught:
        await pending
    _expect(caught)
    monkeypatch.undo()
    await _still_usable(host)


def _raises_memory_error(x: Array, out: Array, a: np.float32, n: np.int32) -> None:
    raise MemoryError("the host function's own")


@refused_at_once
async def test_a_host_function_memory_error_arrives_unchanged(host: ag.Backend) -> None:
    kernel = ag.Kernel(SCALE.source, "scale", host=_raises_memory_error)
    with pytest.raises(MemoryError, match=r"^the host function's own$") as caught:
        await host.dispatch(
            kernel, X, ag.Out(8, np.float32), np.float32(2), np.int32(8), grid=1, block=8
        )
    assert type(caught.value) is MemoryError
    await _still_usable(host)
