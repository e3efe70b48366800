"""Every validation error: the documented class, an anchored message, a usable backend after."""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag

from .kernels import INC, SCALE

X = np.arange(8, dtype=np.float32)
OUT = ag.Out(8, np.float32)
A = np.float32(2)
N = np.int32(8)
MASKED = np.ma.masked_array(X, mask=X > 4)
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
        rf"^{where(1)} is an Out of dtype int32; the kernel takes float32 — "
        r"pass Out\(\(8,\), np.float32\)$",
    ),
    (
        "Out of float64 for a float pointer",
        call(X, ag.Out((2, 4), np.float64), A, N),
        ag.ArgumentTypeError,
        rf"^{where(1)} is an Out of dtype float64; the kernel takes float32 — "
        r"pass Out\(\(2, 4\), np.float32\)$",
    ),
    (
        "resident Out of the wrong dtype",
        call(X, ag.Out(8, np.float64, resident=True), A, N),
        ag.ArgumentTypeError,
        rf"^{where(1)} is an Out of dtype float64; the kernel takes float32 — "
        r"pass Out\(\(8,\), np.float32, resident=True\)$",
    ),
    (
        "Out for a value parameter",
        call(X, OUT, ag.Out(1, np.float32), N),
        ag.ArgumentTypeError,
        rf"^{where(2)} is an Out; that parameter is a value — pass a numpy scalar, "
        r"e.g. np.float32\(...\)$",
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
        rf"^{where(0)} is an Out, but the kernel's parameter is const and cannot write it — "
        r"drop const from the parameter in the source$",
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
        r"^shared_mem=-1 bytes; this device allows between 0 and \d+ bytes of dynamic shared "
        r"memory per block$",
    ),
    (
        "shared memory over the limit",
        call(X, OUT, A, N, shared_mem=1 << 30),
        ag.DispatchError,
        r"^shared_mem=1073741824 bytes; .*$",
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


async def _freed_buffer(b: ag.Backend) -> Any:
    buf = await b.upload(np.ones(8, np.float32))
    await buf.aclose()
    return b.dispatch(INC, buf, np.float32(1), np.int32(8), grid=1, block=8)


async def _freed_out_into(b: ag.Backend) -> Any:
    buf = await b.upload(np.ones(8, np.float32))
    await buf.aclose()
    return b.dispatch(SCALE, X, ag.Out(into=buf), A, N, grid=1, block=8)


async def _foreign_buffer(b: ag.Backend) -> Any:
    async with ag.open_backend(b.name) as other:
        buf = await other.upload(np.ones(8, np.float32))
        return b.dispatch(INC, buf, np.float32(1), np.int32(8), grid=1, block=8)


async def _wrong_dtype_buffer(b: ag.Backend) -> Any:
    buf = await b.upload(np.ones(8, np.float64))
    try:
        return b.dispatch(INC, buf, np.float32(1), np.int32(8), grid=1, block=8)
    finally:
        await buf.aclose()


async def _closed_backend(b: ag.Backend) -> Any:
    other = ag.open_backend(b.name)
    await other.aclose()
    return other.dispatch(SCALE, X, OUT, A, N, grid=1, block=8)


async def _other_loop(b: ag.Backend) -> Any:
    def run() -> None:
        async def use() -> None:
            b.dispatch(SCALE, X, OUT, A, N, grid=1, block=8)

        asyncio.run(use())

    return await asyncio.to_thread(run)


async def _empty_of_zero(b: ag.Backend) -> Any:
    return b.empty((4, 0), np.float32)


async def _upload_of_object_array(b: ag.Backend) -> Any:
    return await b.upload(np.array([None, 1], dtype=object))


async def _out_into_wrong_dtype(b: ag.Backend) -> Any:
    buf = b.empty(8, np.float64)
    return b.dispatch(SCALE, X, ag.Out(into=buf), A, N, grid=1, block=8)


def _upload(array: Any) -> Callable[[ag.Backend], Any]:
    return lambda b: b.upload(array)


async def _download_of_freed(b: ag.Backend) -> Any:
    buf = await b.upload(np.ones(2, np.float32))
    await buf.aclose()
    return await b.download(buf)


MORE_CASES: list[tuple[str, Callable[[ag.Backend], Any], type[Exception], str]] = [
    (
        "a freed resident buffer",
        _freed_buffer,
        ag.StaleBufferError,
        r"^args\[0\] of 'inc' \(float\* buf\) is a resident buffer that was closed "
        r"\(slot \d+, generation \d+\); upload the data again$",
    ),
    (
        "Out(into=) a freed buffer",
        _freed_out_into,
        ag.StaleBufferError,
        rf"^{where(1)} is a resident buffer that was closed .*$",
    ),
    (
        "a resident buffer of another backend",
        _foreign_buffer,
        ag.StaleBufferError,
        r"^args\[0\] of 'inc' \(float\* buf\) is a resident buffer of another backend .*$",
    ),
    (
        "a resident buffer of the wrong dtype",
        _wrong_dtype_buffer,
        ag.ArgumentTypeError,
        r"^args\[0\] of 'inc' \(float\* buf\) is a float64 array; the kernel takes float32 .*$",
    ),
    (
        "dispatch on a closed backend",
        _closed_backend,
        ag.BackendClosedError,
        r"^backend \S+ is closed; open a new one with asyncgraph.open_backend\(\)$",
    ),
    (
        "use from another event loop",
        _other_loop,
        ag.UnsupportedError,
        r"^backend \S+ belongs to another event loop; open one backend per event loop$",
    ),
    (
        "empty() of a zero-size shape",
        _empty_of_zero,
        ag.ShapeMismatchError,
        r"^empty\(\) got shape \(4, 0\); every dimension must be at least 1 "
        r"\(no zero-size arrays\)$",
    ),
    (
        "upload of an object array",
        _upload_of_object_array,
        ag.ArgumentTypeError,
        r"^upload\(\) got an object array; a resident buffer holds numbers — convert it, "
        r"e.g. x.astype\(np.float32\)$",
    ),
    (
        "Out(into=) a buffer of the wrong dtype",
        _out_into_wrong_dtype,
        ag.ArgumentTypeError,
        rf"^{where(1)} is an Out\(into=\) a float64 buffer; the kernel takes float32 — "
        r"pass Out\(into=\) a float32 buffer, e.g. backend.empty\(\(8,\), np.float32\)$",
    ),
    (
        "upload of a non-contiguous array",
        _upload(np.arange(16, dtype=np.float32)[::2]),
        ag.DispatchError,
        r"^upload\(\) got a float32 array of 1 dimensions that is not C-contiguous; upload\(\) "
        r"takes a C-contiguous array — pass np.ascontiguousarray\(x\)$",
    ),
    (
        "upload of an empty array",
        _upload(np.zeros((0, 3), np.float32)),
        ag.DispatchError,
        r"^upload\(\) got an empty array of shape \(0, 3\); a resident buffer holds at least one "
        r"element — skip the upload for empty input$",
    ),
    (
        "upload of a byte-swapped array",
        _upload(X.astype(">f4")),
        ag.DispatchError,
        r"^upload\(\) got a >f4 array in non-native byte order; "
        r"pass x.astype\(x.dtype.newbyteorder\('='\)\)$",
    ),
    (
        "upload of a structured array",
        _upload(np.ones(2, dtype=[("a", "f4")])),
        ag.ArgumentTypeError,
        r"^upload\(\) got a \[\('a', '<f4'\)\] array; a resident buffer holds numbers — "
        r"convert it, e.g. x.astype\(np.float32\)$",
    ),
    (
        "pinned_empty() of a zero-size shape",
        lambda b: b.pinned_empty(0, np.float32),
        ag.ShapeMismatchError,
        r"^pinned_empty\(\) got shape \(0,\); every dimension must be at least 1 "
        r"\(no zero-size arrays\)$",
    ),
    (
        "pinned_empty() of an object dtype",
        lambda b: b.pinned_empty(3, object),
        ag.ArgumentTypeError,
        r"^pinned_empty\(\) got dtype object; pinned_empty\(\) takes a numeric dtype "
        r"\(bool, int, uint, float, complex\)$",
    ),
    (
        "InOut for a const parameter",
        call(ag.InOut(X), OUT, A, N),
        ag.DispatchError,
        rf"^{where(0)} is an InOut, but the kernel's parameter is const and cannot write it — "
        r"pass the array itself, or drop const from the parameter in the source$",
    ),
    (
        "a masked array",
        call(MASKED, OUT, A, N),
        ag.ArgumentTypeError,
        rf"^{where(0)} is a masked float32 array; its mask would be dropped — pass "
        r"arr.filled\(value\) or np.ma.getdata\(arr\) explicitly$",
    ),
    (
        "InOut of a masked array",
        call(X, ag.InOut(MASKED), A, N),
        ag.ArgumentTypeError,
        rf"^{where(1)} is a masked float32 array; its mask would be dropped — .*$",
    ),
    (
        "upload of a masked array",
        _upload(MASKED),
        ag.ArgumentTypeError,
        r"^upload\(\) got a masked float32 array; its mask would be dropped — pass "
        r"arr.filled\(value\) or np.ma.getdata\(arr\) explicitly$",
    ),
    (
        "download of a freed buffer",
        _download_of_freed,
        ag.StaleBufferError,
        r"^download\(\) is a resident buffer that was closed .*$",
    ),
    (
        "Out(into=) a numpy array",
        lambda b: b.dispatch(
            SCALE,
            X,
            ag.Out(into=np.zeros(8, np.float32)),  # type: ignore[arg-type]  # on purpose
            A,
            N,
            grid=1,
            block=8,
        ),
        ag.ArgumentTypeError,
        r"^Out\(into=\) takes a resident buffer from backend.empty\(\) or backend.upload\(\), "
        r"got a float32 array of shape \(8,\); .*$",
    ),
    (
        "InOut of an empty array",
        call(ag.InOut(np.zeros(0, np.float32)), OUT, A, N),
        ag.DispatchError,
        rf"^{where(0)} is an empty array of shape \(0,\); .*$",
    ),
    (
        "InOut of a non-contiguous array",
        call(ag.InOut(np.ones(16, np.float32)[::2]), OUT, A, N),
        ag.DispatchError,
        rf"^{where(0)} is a float32 array of 1 dimensions that is not C-contiguous; .*$",
    ),
    (
        "a Python complex",
        call(X, OUT, 1j, N),
        ag.ArgumentTypeError,
        rf"^{where(2)} is a Python complex; .*$",
    ),
    (
        "a numpy bool for an int parameter",
        call(X, OUT, A, np.bool_(True)),
        ag.ArgumentTypeError,
        rf"^{where(3)} is a bool scalar; the kernel takes int32 — pass np.int32\(True\)$",
    ),
    (
        "a numpy string scalar",
        call(X, OUT, np.str_("a"), N),
        ag.ArgumentTypeError,
        rf"^{where(2)} is a <U1 scalar; pass a numeric one$",
    ),
    (
        "grid given as a bool",
        call(X, OUT, A, N, grid=True),
        ag.DispatchError,
        r"^grid=True; pass an int or a tuple of 1 to 3 positive ints$",
    ),
    (
        "shared_mem given as a bool",
        call(X, OUT, A, N, shared_mem=True),
        ag.DispatchError,
        r"^shared_mem=True; pass a number of bytes as an int$",
    ),
    (
        "a block of zero threads",
        call(X, OUT, A, N, block=(8, 0)),
        ag.DispatchError,
        r"^block=\(8, 0\); dimension y must be between 1 and 1024 on this device$",
    ),
]

ALL_CASES = CASES + MORE_CASES
HOST_ONLY = {"a device array on the host backend"}
BACKENDS = ["host", pytest.param("cuda", marks=pytest.mark.cuda)]


async def _attempt(make: Callable[[ag.Backend], Any], backend: ag.Backend) -> None:
    result = make(backend)
    if inspect.iscoroutine(result):
        await result


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[ag.Backend]:
    """Each case runs on the host backend, and on CUDA where a GPU is found."""
    async with ag.open_backend(request.param) as b:
        yield b


def test_the_table_has_at_least_40_cases() -> None:
    assert len(ALL_CASES) >= 40
    assert len({case[0] for case in ALL_CASES}) == len(ALL_CASES)


@pytest.mark.parametrize(
    ("case", "make", "error", "message"), ALL_CASES, ids=[c[0] for c in ALL_CASES]
)
async def test_bad_input_is_refused_and_the_backend_keeps_working(
    backend: ag.Backend,
    case: str,
    make: Callable[[ag.Backend], Any],
    error: type[Exception],
    message: str,
) -> None:
    if case in HOST_ONLY and backend.name != "host":
        pytest.skip("the host backend's refusal of device arrays")
    with pytest.raises(error, match=message):
        await _attempt(make, backend)
    snap = backend.telemetry.snapshot()
    assert snap.dispatches == 0
    assert snap.in_flight == 0
    (out,) = await backend.dispatch(SCALE, X, OUT, A, N, grid=1, block=8)
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
        (
            lambda: ag.Out(into=np.zeros(4, np.float32)),  # type: ignore[arg-type]  # on purpose
            ag.ArgumentTypeError,
            r"^Out\(into=\) takes a resident buffer from backend.empty\(\) or backend.upload\(\), "
            r"got a float32 array of shape \(4,\); for a numpy array pass Out\(shape, dtype\) "
            r"or InOut\(array\)$",
        ),
        (
            lambda: ag.Out(into=[1.0]),  # type: ignore[arg-type]  # on purpose
            ag.ArgumentTypeError,
            r"^Out\(into=\) takes a resident buffer from backend.empty\(\) or backend.upload\(\), "
            r"got a builtins.list; .*$",
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
    with pytest.raises(ag.DispatchError, match=r"^upload\(\) got an empty array"):
        await host.upload(np.zeros(0))
    with pytest.raises(ag.ShapeMismatchError, match=r"^empty\(\) got shape \(0,\)"):
        host.empty(0, np.float32)
    with pytest.raises(
        ag.ArgumentTypeError,
        match=r"^empty\(\) got dtype object; empty\(\) takes a numeric dtype \(bool, int, uint, "
        r"float, complex\)$",
    ):
        host.empty(3, object)
    with pytest.raises(
        ag.ShapeMismatchError,
        match=r"^empty\(\) got shape 'x'; a shape is an int or a tuple of ints, e.g. \(1024,\)$",
    ):
        host.empty("x", np.float32)  # type: ignore[arg-type]  # deliberately wrong
    with pytest.raises(
        ag.ArgumentTypeError, match=r"^empty\(\) got dtype 'nonsense', which numpy does not know$"
    ):
        host.empty(3, "nonsense")
