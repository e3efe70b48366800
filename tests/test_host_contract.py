"""The host function contract: write into the outputs, return None, and fail loudly otherwise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag

from .kernels import SCALE

Array = np.ndarray[Any, Any]

SRC = 'extern "C" __global__ void twice(const float* x, float* out, float* out2) {}'
X = np.arange(4, dtype=np.float32)


def twice(host: Callable[..., object]) -> ag.Kernel:
    return ag.Kernel(SRC, "twice", host=host)


async def _dispatch(backend: ag.Backend, kernel: ag.Kernel) -> tuple[Any, ...]:
    return await backend.dispatch(
        kernel, X, ag.Out(4, np.float32), ag.InOut(np.zeros(4, np.float32)), grid=1, block=4
    )


async def _still_usable(backend: ag.Backend) -> None:
    (out,) = await backend.dispatch(
        SCALE, X, ag.Out(4, np.float32), np.float32(2), np.int32(4), grid=1, block=4
    )
    np.testing.assert_array_equal(out, 2 * X)


async def _coroutine() -> None:
    pass


@pytest.mark.parametrize(
    ("host_fn", "what"),
    [
        (lambda x, out, out2: 2 * x, "a float32 array of shape \\(4,\\)"),
        (lambda x, out, out2: 3, "a builtins.int"),
        (lambda x, out, out2: x, "a float32 array of shape \\(4,\\)"),
        (lambda x, out, out2: (out, 2 * x), "a builtins.tuple"),
        (lambda x, out, out2: _coroutine(), "a builtins.coroutine"),
    ],
    ids=["a new array", "an int", "an input", "a tuple with a new array", "a coroutine"],
)
async def test_a_returned_value_fails_the_dispatch(
    host: ag.Backend, host_fn: Callable[..., object], what: str
) -> None:
    with pytest.raises(
        ag.HostFunctionError,
        match=rf"^the host= function of kernel 'twice' returned {what}, which the dispatch "
        r"cannot use; write the results into the output arguments \(e.g. out\[:\] = 2 \* x\) "
        r"and return None$",
    ):
        await _dispatch(host, twice(host_fn))
    assert host.telemetry.snapshot().dispatches_failed == 1
    await _still_usable(host)


def _write_and_return_out(x: Array, out: Array, out2: Array) -> Array:
    out[:] = 2 * x
    return out


def _write_and_return_both(x: Array, out: Array, out2: Array) -> list[Array]:
    out[:] = 2 * x
    out2[:] = 3 * x
    return [out, out2]


@pytest.mark.parametrize(
    "host_fn",
    [
        _write_and_return_out,
        _write_and_return_both,
        lambda x, out, out2: (np.multiply(x, 2, out=out), np.multiply(x, 3, out=out2)),
    ],
    ids=["its output", "a list of its outputs", "a tuple from numpy's out="],
)
async def test_returning_its_own_outputs_is_allowed(
    host: ag.Backend, host_fn: Callable[..., object]
) -> None:
    out, out2 = await _dispatch(host, twice(host_fn))
    np.testing.assert_array_equal(out, 2 * X)
    if host_fn is not _write_and_return_out:
        np.testing.assert_array_equal(out2, 3 * X)


def _exhausted(x: Array, out: Array, out2: Array) -> None:
    next(iter(()))


async def test_stop_iteration_fails_the_dispatch_with_host_function_error(
    host: ag.Backend,
) -> None:
    with pytest.raises(
        ag.HostFunctionError,
        match=r"^the host= function of kernel 'twice' raised StopIteration, which Python cannot "
        r"raise through await; it is this error's __cause__ — catch it in the host function, or "
        r"use next\(it, default\)$",
    ) as caught:
        await _dispatch(host, twice(_exhausted))
    assert type(caught.value.__cause__) is StopIteration
    await _still_usable(host)


class _Broken(Exception):
    pass


def _raises(x: Array, out: Array, out2: Array) -> None:
    raise _Broken("host code failed")


async def test_other_exceptions_arrive_unchanged(host: ag.Backend) -> None:
    with pytest.raises(_Broken, match=r"^host code failed$"):
        await _dispatch(host, twice(_raises))
    await _still_usable(host)
