"""Cached argument plans: the same bound calls and the same refusals as ``bind()``, cheaper."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._args._arguments import LaunchLimits, bind
from asyncgraph._args._bound_args import BoundCall
from asyncgraph._args._plan_cache import MAX_PLANS, Plans

from .kernels import SCALE

KERNEL = ag.Kernel(
    r"""
extern "C" __global__ void k(const float* a, float* io, float* out, const double* b, int n) {}
""",
    "k",
)
RESIDENT = ag.Kernel(
    r"""
extern "C" __global__ void r(const float* x, float* y, float a) {}
""",
    "r",
)

Args = tuple[object, ...]


def _plans(backend: ag.Backend) -> Plans:
    return Plans(LaunchLimits(), backend._store, True)


def _bind(backend: ag.Backend, kernel: ag.Kernel, args: Args, **launch: Any) -> BoundCall:
    launch = {"grid": 1, "block": 1, "shared_mem": 0, **launch}
    return bind(
        kernel,
        args,
        limits=LaunchLimits(),
        store=backend._store,
        device_arrays=True,
        resident_results=True,
        **launch,
    )


def _via(plans: Plans, kernel: object, args: Args, **launch: Any) -> BoundCall:
    launch = {"grid": 1, "block": 1, "shared_mem": 0, **launch}
    return plans.bind(kernel, args, resident_results=True, **launch)


def _summary(call: BoundCall) -> tuple[Any, ...]:
    """Everything a backend reads of a bound call (values by identity)."""
    return (
        call.kernel,
        [(type(a), a.index, id(a.value), a.param, a.offset, a.nbytes) for a in call.args],
        call.grid,
        call.block,
        call.shared_mem,
        [a.index for a in call.returned],
        call.bytes_in,
        call.bytes_out,
        call.resident,
        (call.in_end, call.up_end, call.total),
        [(type(a), a.index, id(a.value)) for a in call.fresh or ()],
        call.foreign,
        call.n_results,
    )


def _staged_args(rng: np.random.Generator) -> Args:
    return (
        rng.standard_normal(25).astype(np.float32),
        ag.InOut(rng.standard_normal(2).astype(np.float32)),
        ag.Out(75, np.float32),
        rng.standard_normal(40),
        np.int32(7),
    )


async def test_a_planned_call_is_the_call_bind_makes(
    host: ag.Backend, rng: np.random.Generator
) -> None:
    plans = _plans(host)
    _via(plans, KERNEL, _staged_args(rng))  # plans it
    assert (plans.hits, len(plans)) == (0, 1)
    for _ in range(3):
        args = _staged_args(rng)  # new arrays, the same signature
        planned = _via(plans, KERNEL, args)
        assert _summary(planned) == _summary(_bind(host, KERNEL, args))
    assert (plans.hits, plans.misses, len(plans)) == (3, 0, 1)


def _swap(position: int, value: object) -> Callable[[Args], Args]:
    def swap(args: Args) -> Args:
        return (*args[:position], value, *args[position + 1 :])

    return swap


_RNG = np.random.default_rng(7)
_BIG = _RNG.standard_normal(50).astype(np.float32)
# Each variant keeps the planned types where it can, so only the guards can tell it apart.
VARIANTS: dict[str, tuple[Callable[[Args], Args], dict[str, Any]]] = {
    "a float64 input": (_swap(0, _RNG.standard_normal(25)), {}),
    "a strided input": (_swap(0, _BIG[::2][:25]), {}),
    "a big-endian input": (_swap(0, _RNG.standard_normal(25).astype(">f4")), {}),
    "a masked input": (_swap(0, np.ma.masked_array(_RNG.standard_normal(25).astype("f4"))), {}),
    "an empty input": (_swap(0, np.zeros(0, np.float32)), {}),
    "a 2-d input": (_swap(0, _RNG.standard_normal((5, 5)).astype(np.float32)), {}),
    "an InOut of float64": (_swap(1, ag.InOut(_RNG.standard_normal(2))), {}),
    "an InOut of a list": (_swap(1, ag.InOut([1.0, 2.0])), {}),  # type: ignore[arg-type]  # on purpose
    "an Out of float64": (_swap(2, ag.Out(75, np.float64)), {}),
    "an Out(resident=True)": (_swap(2, ag.Out(75, np.float32, resident=True)), {}),
    "a Python int": (_swap(4, 7), {}),
    "an int64 scalar": (_swap(4, np.int64(7)), {}),
    "a missing argument": (lambda args: args[:-1], {}),
    "grid=True": (lambda args: args, {"grid": True}),
    "block=(1, True)": (lambda args: args, {"block": (1, True)}),
    "grid=0": (lambda args: args, {"grid": 0}),
    "shared_mem=True": (lambda args: args, {"shared_mem": True}),
    "too much shared memory": (lambda args: args, {"shared_mem": 1 << 30}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
async def test_a_plan_refuses_what_bind_refuses_with_the_same_error(
    host: ag.Backend, variant: str, rng: np.random.Generator
) -> None:
    change, launch = VARIANTS[variant]
    plans = _plans(host)
    _via(plans, KERNEL, _staged_args(rng))
    args = change(_staged_args(rng))
    try:
        expected: BaseException | BoundCall = _bind(host, KERNEL, args, **launch)
    except ag.AsyncGraphError as exc:
        expected = exc
    if isinstance(expected, BoundCall):  # accepted: then planned the same (a new plan)
        assert _summary(_via(plans, KERNEL, args, **launch)) == _summary(expected)
        assert variant in {"an Out(resident=True)", "a 2-d input"}
        return
    with pytest.raises(type(expected)) as got:
        _via(plans, KERNEL, args, **launch)
    assert str(got.value) == str(expected)


async def test_resident_buffers_are_checked_on_every_call(host: ag.Backend) -> None:
    plans = _plans(host)
    x = await host.upload(np.ones(8, np.float32))
    y = host.empty((8,), np.float32)
    _via(plans, RESIDENT, (x, ag.Out(into=y), np.float32(2)))
    again = _via(plans, RESIDENT, (x, ag.Out(into=y), np.float32(3)))
    assert plans.hits == 1
    assert again.resident
    assert [arg.buffer for arg in again.args[:2]] == [x, y]

    closed = await host.upload(np.ones(8, np.float32))
    await closed.aclose()
    for args in ((closed, ag.Out(into=y), np.float32(2)), (x, ag.Out(into=closed), np.float32(2))):
        with pytest.raises(ag.StaleBufferError) as fresh:
            _bind(host, RESIDENT, args)
        with pytest.raises(ag.StaleBufferError) as planned:
            _via(plans, RESIDENT, args)
        assert str(planned.value) == str(fresh.value)
    async with ag.open_backend("host") as other:
        foreign = await other.upload(np.ones(8, np.float32))
        with pytest.raises(ag.StaleBufferError, match="of another backend"):
            _via(plans, RESIDENT, (foreign, ag.Out(into=y), np.float32(2)))
    # A buffer of another dtype fits no plan, and bind() says why.
    halves = await host.upload(np.ones(8, np.float16))
    with pytest.raises(ag.ArgumentTypeError, match="float16"):
        _via(plans, RESIDENT, (halves, ag.Out(into=y), np.float32(2)))


async def test_device_arrays_and_new_resident_outputs_are_never_planned(host: ag.Backend) -> None:
    plans = _plans(host)
    x = await host.upload(np.ones(8, np.float32))
    call = _via(plans, RESIDENT, (x, ag.Out(8, np.float32, resident=True), np.float32(2)))
    assert call.fresh is not None
    assert len(plans) == 0


async def test_a_few_plans_per_kernel_most_recently_used_first(host: ag.Backend) -> None:
    plans = _plans(host)
    sizes = [16 * (i + 1) for i in range(MAX_PLANS + 1)]

    def args(n: int) -> Args:
        return (np.ones(n, np.float32), ag.Out(n, np.float32), np.float32(2), np.int32(n))

    for n in sizes:
        _via(plans, SCALE, args(n))
    assert (plans.hits, plans.misses, len(plans)) == (0, MAX_PLANS, MAX_PLANS)
    for n in sizes[1:]:  # every one but the oldest is still planned
        _via(plans, SCALE, args(n))
    assert (plans.hits, plans.misses) == (MAX_PLANS, MAX_PLANS)
    _via(plans, SCALE, args(sizes[0]))  # dropped: bound from scratch and planned again
    assert (plans.hits, plans.misses, len(plans)) == (MAX_PLANS, MAX_PLANS + 1, MAX_PLANS)


async def test_planned_dispatches_compute_the_right_results(
    host: ag.Backend, rng: np.random.Generator
) -> None:
    for n in [1024, 1000, 1024, 1000, 1024]:  # two signatures, alternating
        x = rng.standard_normal(n).astype(np.float32)
        a = np.float32(rng.standard_normal())
        (out,) = await host.dispatch(
            SCALE, x, ag.Out(n, np.float32), a, np.int32(n), grid=(n + 255) // 256, block=256
        )
        np.testing.assert_array_equal(out, a * x)
    assert host._plans.hits == 3


async def test_a_plan_keeps_no_array_alive(host: ag.Backend) -> None:
    x = np.ones(256, np.float32)
    await host.dispatch(
        SCALE, x, ag.Out(256, np.float32), np.float32(2), np.int32(256), grid=1, block=256
    )
    y = np.ones(256, np.float32)
    (out,) = await host.dispatch(
        SCALE, y, ag.Out(256, np.float32), np.float32(2), np.int32(256), grid=1, block=256
    )
    assert host._plans.hits == 1
    refs = [weakref.ref(x), weakref.ref(y), weakref.ref(out)]
    del x, y, out
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]
