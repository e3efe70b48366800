"""Bound arguments: layout, launch values, results, and a bind() that allocates nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._args._arguments import LaunchLimits, bind
from asyncgraph._args._bound_args import (
    ALIGN,
    BoundCall,
    DeviceArg,
    InArg,
    InOutArg,
    OutArg,
    ResidentOutArg,
    ScalarArg,
)
from asyncgraph._buffers._resident import ResidentBuffer, discard

from .kernels import SCALE

# Four arrays, one of each staged kind and a second input, so each region holds something.
KERNEL = ag.Kernel(
    r"""
extern "C" __global__ void k(const float* a, float* io, float* out, const double* b, int n) {}
""",
    "k",
)


def _bind(backend: ag.Backend, kernel: ag.Kernel, *args: object, **kw: Any) -> BoundCall:
    return bind(
        kernel,
        args,
        grid=1,
        block=1,
        shared_mem=0,
        limits=LaunchLimits(),
        store=backend._store,
        device_arrays=True,
        **kw,
    )


async def test_the_layout_is_computed_once_when_bound(
    host: ag.Backend, rng: np.random.Generator
) -> None:
    a = rng.standard_normal(25).astype(np.float32)  # 100 bytes
    io = rng.standard_normal(2).astype(np.float32)  # 8 bytes
    b = rng.standard_normal(40)  # 320 bytes
    call = _bind(host, KERNEL, a, ag.InOut(io), ag.Out(75, np.float32), b, np.int32(7))
    kinds = [type(arg) for arg in call.args]
    assert kinds == [InArg, InOutArg, OutArg, InArg, ScalarArg]
    assert [arg.index for arg in call.args] == [0, 1, 2, 3, 4]
    # [inputs | in-outs | outputs], each argument ALIGN-byte aligned, inputs in argument order.
    assert ALIGN == 256
    assert [arg.offset for arg in call.args] == [0, 768, 1024, 256, -1]
    assert (call.in_end, call.up_end, call.total) == (768, 1024, 1024 + 512)
    assert (call.bytes_in, call.bytes_out) == (100 + 8 + 320, 8 + 300)
    assert call.returned == [call.args[1], call.args[2]]
    assert call.n_results == 2
    # Launch values: staged arguments at the staging base plus their offset, scalars by value.
    values = [arg.launch_value(1 << 20) for arg in call.args]
    assert values[:4] == [(1 << 20) + 0, (1 << 20) + 768, (1 << 20) + 1024, (1 << 20) + 256]
    assert values[4] == np.int32(7)
    assert values[4].dtype == np.int32
    assert [arg.by_value for arg in call.args] == [False] * 4 + [True]


async def test_a_call_without_arrays_has_no_layout(host: ag.Backend) -> None:
    buf = host.empty(4, np.float32)
    call = _bind(host, SCALE, buf, ag.Out(into=buf), np.float32(2), np.int32(4))
    assert (call.in_end, call.up_end, call.total, call.bytes_in, call.bytes_out) == (0,) * 5
    assert call.resident
    assert [arg.offset for arg in call.args] == [-1] * 4
    assert [arg.buffer for arg in call.args] == [buf, buf, None, None]
    assert [arg.writes for arg in call.args] == [False, True, False, False]  # const float* x


async def test_results_are_built_in_argument_order(host: ag.Backend) -> None:
    buf = host.empty(8, np.float32)
    doubles = host.empty(2, np.float64)
    call = _bind(host, KERNEL, buf, ag.Out(into=buf), ag.Out(3, np.float32), doubles, np.int32(1))
    made: list[Any] = []

    def array_of(arg: Any) -> Any:
        made.append(arg)
        data = np.arange(arg.nbytes, dtype=np.uint8)
        return arg.view_of(data)

    results = call.results(array_of)
    assert made == [call.args[2]]
    assert results[0] is buf
    assert results[1].shape == (3,)
    assert results[1].dtype == np.float32
    np.testing.assert_array_equal(results[1].view(np.uint8), np.arange(12, dtype=np.uint8))


async def test_bind_allocates_nothing(host: ag.Backend) -> None:
    x = np.ones(4, np.float32)
    call = _bind(host, SCALE, x, ag.Out(4, np.float32, resident=True), np.float32(2), np.int32(4))
    assert len(host._store) == 0
    assert host._store.bytes_live == 0
    (fresh,) = call.fresh or []
    assert isinstance(fresh, ResidentOutArg)
    assert fresh.buffer is None
    made: Any = fresh  # its buffer changes below, which mypy cannot see
    assert call.returned == [fresh]
    assert call.resident
    call.make_buffers(host.empty, discard)
    assert isinstance(made.buffer, ResidentBuffer)
    assert made.buffer.shape == (4,)
    assert len(host._store) == 1
    call.discard_buffers(discard)
    assert fresh.buffer is None
    assert len(host._store) == 0
    assert host._store.bytes_live == 0


async def test_make_buffers_closes_what_it_made_when_one_fails(host: ag.Backend) -> None:
    outs = [ag.Out(4, np.float32, resident=True), ag.Out(2, np.float32, resident=True)]
    call = _bind(host, KERNEL, np.ones(1, np.float32), *outs, np.ones(1), np.int32(1))
    calls = []

    def new(shape: tuple[int, ...], dtype: np.dtype[Any]) -> ResidentBuffer:
        calls.append(shape)
        if len(calls) == 2:
            raise ag.AllocationError("no room for the second")
        return host.empty(shape, dtype)

    with pytest.raises(ag.AllocationError, match="second"):
        call.make_buffers(new, discard)
    assert calls == [(4,), (2,)]
    assert len(host._store) == 0
    assert host._store.bytes_live == 0


async def test_graphs_and_captures_cannot_make_resident_results(host: ag.Backend) -> None:
    with pytest.raises(ag.UnsupportedError, match=r"args\[1\] .* Out\(into=buffer\)"):
        _bind(
            host,
            SCALE,
            np.ones(4, np.float32),
            ag.Out(4, np.float32, resident=True),
            np.float32(2),
            np.int32(4),
            resident_results=False,
        )


def _fails(x: Any, out: Any, a: Any, n: Any) -> None:
    raise ValueError("the host function failed")


async def test_a_failed_dispatch_closes_the_resident_result_it_made(host: ag.Backend) -> None:
    failing = ag.Kernel(SCALE.source, "scale", host=_fails)
    pending = host.dispatch(
        failing,
        np.ones(4, np.float32),
        ag.Out(4, np.float32, resident=True),
        np.float32(2),
        np.int32(4),
        grid=1,
        block=4,
    )
    assert len(host._store) == 1  # made before it started
    with pytest.raises(ValueError, match="the host function failed"):
        await pending
    assert len(host._store) == 0
    assert host._store.bytes_live == 0
    # and one that succeeds keeps it
    (buf,) = await host.dispatch(
        SCALE,
        np.arange(4, dtype=np.float32),
        ag.Out(4, np.float32, resident=True),
        np.float32(2),
        np.int32(4),
        grid=1,
        block=4,
    )
    np.testing.assert_array_equal(await host.download(buf), np.arange(4, dtype=np.float32) * 2)


class _Foreign:
    def __init__(self, **cai: Any) -> None:
        self.__cuda_array_interface__ = {"version": 3, **cai}


def test_a_device_array_is_read_once_when_bound() -> None:
    kernel = ag.Kernel(r'extern "C" __global__ void k(float* x, int n) {}', "k")
    foreign = _Foreign(shape=(4,), typestr="<f4", data=(0x7000, False), stream=9)
    limits = LaunchLimits()

    class Store:
        def owns_type(self, value: object) -> bool:
            return False

    call = bind(
        kernel,
        (foreign, np.int32(4)),
        grid=1,
        block=1,
        shared_mem=0,
        limits=limits,
        store=Store(),  # type: ignore[arg-type]  # only owns_type is asked
        device_arrays=True,
    )
    arg = call.args[0]
    assert isinstance(arg, DeviceArg)
    assert call.foreign
    assert not call.resident
    assert (arg.pointer, arg.producer, arg.launch_value(0)) == (0x7000, 9, 0x7000)
    assert arg.signature() is None  # never recorded in a graph
    assert call.total == 0
