"""Every validation error: the documented class, an anchored message, a usable backend after."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag

from .kernels import SCALE

X = np.arange(8, dtype=np.float32)
OUT = ag.Out(8, np.float32)
A = np.float32(2)
N = np.int32(8)
WHERE = "args[{i}] of 'scale' ({p})"
P = ["const float* x", "float* out", "float a", "int n"]


def where(i: int) -> str:
    return re.escape(WHERE.format(i=i, p=P[i]))


def call(*args: object, grid: object = 1, block: object = 8, shared_mem: object = 0) -> Any:
    return lambda b: b.dispatch(SCALE, *args, grid=grid, block=block, shared_mem=shared_mem)


CASES: list[tuple[str, Callable[[ag.Backend], Any], type[Exception], str]] = [
    (
        "too few arguments",
        call(X, OUT, A),
        ag.DispatchError,
        r"^'scale' takes 4 arguments \(const float\* x, float\* out, float a, int n\), got 3$",
    ),
    (
        "too many arguments",
        call(X, OUT, A, N, N),
        ag.DispatchError,
        r"^'scale' takes 4 arguments .*, got 5$",
    ),
    (
        "python float",
        call(X, OUT, 2.0, N),
        ag.ArgumentTypeError,
        rf"^{where(2)} is a Python float; its width on the GPU would be a guess — "
        r"pass np.float32\(2.0\)$",
    ),
    (
        "python int",
        call(X, OUT, A, 8),
        ag.ArgumentTypeError,
        rf"^{where(3)} is a Python int; .* pass np.int32\(8\)$",
    ),
    (
        "python bool",
        call(X, OUT, A, True),
        ag.ArgumentTypeError,
        rf"^{where(3)} is a Python bool; .*$",
    ),
    (
        "scalar of the wrong width",
        call(X, OUT, np.float64(2), N),
        ag.ArgumentTypeError,
        rf"^{where(2)} is a float64 scalar; the kernel takes float32 — pass np.float32\(2.0\)$",
    ),
    (
        "array of the wrong dtype",
        call(X.astype(np.float64), OUT, A, N),
        ag.ArgumentTypeError,
        rf"^{where(0)} is a float64 array; the kernel takes float32 — "
        r"pass x.astype\(np.float32\)$",
    ),
    (
        "Out of the wrong dtype",
        call(X, ag.Out(8, np.int32), A, N),
        ag.ArgumentTypeError,
        rf"^{where(1)} is an int32 array; the kernel takes float32 .*$",
    ),
    (
        "array for a value parameter",
        call(X, OUT, X, N),
        ag.ArgumentTypeError,
        rf"^{where(2)} is an array; that parameter is a value — pass a numpy scalar, "
        r"e.g. np.float32\(...\)$",
    ),
    (
        "scalar for a pointer parameter",
        call(np.float32(1), OUT, A, N),
        ag.ArgumentTypeError,
        rf"^{where(0)} is a scalar; that parameter is a pointer — pass an array, Out, InOut "
        r"or a resident buffer$",
    ),
    (
        "Out for a const parameter",
        call(ag.Out(8, np.float32), OUT, A, N),
        ag.DispatchError,
        rf"^{where(0)} is an Out, but the kernel's parameter is const and cannot write it$",
    ),
    (
        "non-contiguous array",
        call(np.arange(16, dtype=np.float32)[::2], OUT, A, N),
        ag.DispatchError,
        rf"^{where(0)} is a float32 array of 1 dimensions that is not C-contiguous; the kernel "
        r"takes a C-contiguous array — pass np.ascontiguousarray\(x\)$",
    ),
    (
        "Fortran-ordered array",
        call(np.asfortranarray(np.ones((4, 2), np.float32)), OUT, A, N),
        ag.DispatchError,
        rf"^{where(0)} is a float32 array of 2 dimensions that is not C-contiguous; .*$",
    ),
    (
        "zero-size array",
        call(np.zeros(0, np.float32), OUT, A, N),
        ag.DispatchError,
        rf"^{where(0)} is an empty array of shape \(0,\); a kernel needs at least one element "
        r"— skip the dispatch for empty input$",
    ),
    (
        "object array",
        call(np.array([1, "a"], dtype=object), OUT, A, N),
        ag.ArgumentTypeError,
        rf"^{where(0)} is an object array; kernels take numeric arrays — convert it, "
        r"e.g. x.astype\(np.float32\)$",
    ),
    (
        "byte-swapped array",
        call(X.astype(">f4"), OUT, A, N),
        ag.DispatchError,
        rf"^{where(0)} is a >f4 array in non-native byte order; "
        r"pass x.astype\(x.dtype.newbyteorder\('='\)\)$",
    ),
    (
        "a list",
        call([1.0, 2.0], OUT, A, N),
        ag.ArgumentTypeError,
        rf"^{where(0)} is a builtins.list; pass a numpy array, a numpy scalar, Out, InOut, "
        r"a resident buffer or a device array$",
    ),
    (
        "a device array on the host backend",
        call(type("FakeCupy", (), {"__cuda_array_interface__": {}})(), OUT, A, N),
        ag.UnsupportedError,
        rf"^{where(0)} is a .*FakeCupy, a device array; the host backend cannot read device "
        r"memory — copy it to a numpy array first .*$",
    ),
    (
        "InOut of a list",
        call(ag.InOut([1.0]), OUT, A, N),  # type: ignore[arg-type]  # deliberately wrong
        ag.ArgumentTypeError,
        rf"^{where(0)} is an InOut of a builtins.list; InOut takes a numpy array$",
    ),
    (
        "grid of zero",
        call(X, OUT, A, N, grid=0),
        ag.DispatchError,
        r"^grid=0; dimension x must be between 1 and 2147483647 on this device$",
    ),
    (
        "grid y too large",
        call(X, OUT, A, N, grid=(1, 70000)),
        ag.DispatchError,
        r"^grid=\(1, 70000\); dimension y must be between 1 and 65535 on this device$",
    ),
    (
        "grid of four dims",
        call(X, OUT, A, N, grid=(1, 1, 1, 1)),
        ag.DispatchError,
        r"^grid=\(1, 1, 1, 1\); pass an int or a tuple of 1 to 3 positive ints$",
    ),
    (
        "block of floats",
        call(X, OUT, A, N, block=8.0),
        ag.DispatchError,
        r"^block=8.0; pass an int or a tuple of 1 to 3 positive ints$",
    ),
    (
        "block too large",
        call(X, OUT, A, N, block=(32, 64)),
        ag.DispatchError,
        r"^block=\(32, 64\) has 2048 threads; a block holds at most 1024 on this device$",
    ),
    (
        "block z too large",
        call(X, OUT, A, N, block=(1, 1, 65)),
        ag.DispatchError,
        r"^block=\(1, 1, 65\); dimension z must be between 1 and 64 on this device$",
    ),
    (
        "negative shared memory",
        call(X, OUT, A, N, shared_mem=-1),
        ag.DispatchError,
        r"^shared_mem=-1 bytes; this device allows between 0 and 49152 bytes of dynamic shared "
        r"memory per block$",
    ),
    (
        "shared memory over the limit",
        call(X, OUT, A, N, shared_mem=1 << 20),
        ag.DispatchError,
        r"^shared_mem=1048576 bytes; .*$",
    ),
    (
        "shared memory as a float",
        call(X, OUT, A, N, shared_mem=1.5),
        ag.DispatchError,
        r"^shared_mem=1.5; pass a number of bytes as an int$",
    ),
    (
        "not a kernel",
        lambda b: b.dispatch("scale", X, grid=1, block=1),  # type: ignore[arg-type]  # on purpose
        ag.ArgumentTypeError,
        r"^dispatch\(\) takes an asyncgraph.Kernel first, got a builtins.str$",
    ),
    (
        "timing not a bool",
        lambda b: b.dispatch(SCALE, X, OUT, A, N, grid=1, block=8, timing="yes"),  # type: ignore[arg-type]  # on purpose
        ag.ArgumentTypeError,
        r"^timing='yes'; pass True or False$",
    ),
]


@pytest.mark.parametrize(("case", "make", "error", "message"), CASES, ids=[c[0] for c in CASES])
async def test_bad_dispatch_is_refused_and_the_backend_keeps_working(
    host: ag.Backend,
    case: str,
    make: Callable[[ag.Backend], Any],
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message):
        make(host)
    snap = host.telemetry.snapshot()
    assert snap.dispatches == 0
    assert snap.in_flight == 0
    (out,) = await host.dispatch(SCALE, X, OUT, A, N, grid=1, block=8)
    np.testing.assert_array_equal(out, 2 * X)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: ag.Out(-1, np.float32),
            ag.ShapeMismatchError,
            r"^Out has shape \(-1,\); every dimension must be at least 1 \(a kernel cannot write a "
            r"zero-size output\)$",
        ),
        (
            lambda: ag.Out((4, 0), np.float32),
            ag.ShapeMismatchError,
            r"^Out has shape \(4, 0\); every dimension must be at least 1 .*$",
        ),
        (
            lambda: ag.Out((2.5,), np.float32),  # type: ignore[arg-type]  # on purpose
            ag.ShapeMismatchError,
            r"^Out has shape \(2.5,\); every dimension must be an int, got 2.5$",
        ),
        (
            lambda: ag.Out("big", np.float32),  # type: ignore[arg-type]  # on purpose
            ag.ShapeMismatchError,
            r"^Out has shape 'big'; a shape is an int or a tuple of ints, e.g. \(1024,\)$",
        ),
        (
            lambda: ag.Out((1 << 30, 1 << 30), np.float32),
            ag.ShapeMismatchError,
            r"^Out of shape \(1073741824, 1073741824\) and dtype float32 would hold \d+ bytes, "
            r"more than any device has$",
        ),
        (
            lambda: ag.Out(4, object),
            ag.ArgumentTypeError,
            r"^Out has dtype object; GPU kernels take numeric dtypes .*$",
        ),
        (
            lambda: ag.Out(4, "nonsense"),
            ag.ArgumentTypeError,
            r"^Out has dtype 'nonsense', which numpy does not know$",
        ),
        (
            lambda: ag.Out(4),
            ag.DispatchError,
            r"^Out needs a shape and a dtype, e.g. Out\(\(1024,\), np.float32\), or into=buffer$",
        ),
    ],
)
def test_impossible_outputs(
    make: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()


async def test_kernel_without_host_is_unsupported_on_the_host_backend(host: ag.Backend) -> None:
    no_host = ag.Kernel(SCALE.source, "scale")
    with pytest.raises(
        ag.UnsupportedError,
        match=r"^kernel 'scale' has no host= implementation, so the host backend cannot run it; "
        r"declare Kernel\(..., host=fn\) or open a CUDA backend$",
    ):
        host.dispatch(no_host, X, OUT, A, N, grid=1, block=8)
    assert host.telemetry.snapshot().dispatches == 0


async def test_upload_and_empty_validate(host: ag.Backend) -> None:
    with pytest.raises(ag.ArgumentTypeError, match=r"^upload\(\) takes a numpy array, got list"):
        await host.upload([1, 2])  # type: ignore[arg-type]  # deliberately wrong
    with pytest.raises(ag.DispatchError, match=r"^upload\(\) is an empty array"):
        await host.upload(np.zeros(0))
    with pytest.raises(ag.ShapeMismatchError, match=r"^empty\(\) has shape \(0,\)"):
        host.empty(0, np.float32)
    with pytest.raises(ag.ArgumentTypeError, match=r"^empty\(\) has dtype object"):
        host.empty(3, object)
