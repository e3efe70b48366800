"""Kernel declarations and the parameter lists read from CUDA source."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._args._kernel import parse_signature

SRC = 'extern "C" __global__ void twice(const float* x, float* out) {}'


def test_parameters_are_read_from_the_source() -> None:
    src = """
    // a comment mentioning __global__ void other(int x)
    extern "C" __global__ void __launch_bounds__(256)
    k(const float* __restrict__ x, double *y, unsigned int n, const __half* h, void* raw,
      float* const fixed, long long big)
    { }
    """
    params = parse_signature(src, "k")
    assert params is not None
    assert [(p.name, p.ctype, p.pointer, p.const) for p in params] == [
        ("x", "const float*", True, True),
        ("y", "double*", True, False),
        ("n", "unsigned int", False, False),
        ("h", "const __half*", True, True),
        ("raw", "void*", True, False),
        ("fixed", "float*", True, False),
        ("big", "long long", False, False),
    ]
    assert [p.dtype for p in params] == [
        np.dtype("float32"),
        np.dtype("float64"),
        np.dtype("uint32"),
        np.dtype("float16"),
        None,
        np.dtype("float32"),
        np.dtype("int64"),
    ]


def test_templates_and_references_are_left_unchecked() -> None:
    src = "template <typename T> __global__ void t(T* x, const int& n) {}"
    assert parse_signature(src, "t") is None


def test_empty_parameter_list() -> None:
    assert parse_signature('extern "C" __global__ void e() {}', "e") == ()
    assert parse_signature('extern "C" __global__ void e(void) {}', "e") == ()


def test_unknown_kernel_name_is_a_compile_error() -> None:
    with pytest.raises(
        ag.CompileError,
        match=r"^kernel 'sapxy' failed to compile:\n"
        r"the source declares no __global__ function named 'sapxy' \(found: saxpy\); "
        r"pass the kernel's function name$",
    ):
        ag.Kernel('extern "C" __global__ void saxpy(float* x) {}', "sapxy")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"source": "", "name": "k"},
            r"^Kernel source must be a non-empty str of CUDA C\+\+, got ''$",
        ),
        (
            {"source": None, "name": "k"},
            r"^Kernel source must be a non-empty str of CUDA C\+\+, got NoneType$",
        ),
        ({"source": "k", "name": "1k"}, r"^Kernel name must be a C identifier, got '1k'$"),
        ({"source": "k", "name": None}, r"^Kernel name must be a C identifier, got None$"),
        (
            {"source": "k", "name": "k", "host": 42},
            r"^Kernel host= must be callable, got int; pass the function the host backend runs, "
            r"or None$",
        ),
        (
            {"source": "k", "name": "k", "options": ["-O3"]},
            r"^Kernel options= must be a mapping of cuda.core ProgramOptions keywords, got list$",
        ),
    ],
)
def test_bad_declarations(kwargs: dict[str, object], message: str) -> None:
    # An error of the tree (it was a bare TypeError), still a TypeError.
    with pytest.raises(ag.ArgumentTypeError, match=message) as raised:
        ag.Kernel(**kwargs)  # type: ignore[arg-type]  # deliberately wrong types
    assert isinstance(raised.value, TypeError)


def test_repr_shows_the_signature() -> None:
    k = ag.Kernel('extern "C" __global__ void k(const float* x, int n) {}', "k", host=print)
    assert repr(k) == "<Kernel k(const float*, int), host>"
    assert k.options == {}


async def _async_host(x: object, out: object) -> None:
    pass


def _generator_host(x: object, out: object) -> Iterator[None]:
    yield None


async def _async_generator_host(x: object, out: object) -> AsyncIterator[None]:
    yield None


class _AsyncCallable:
    async def __call__(self, x: object, out: object) -> None:
        pass


@pytest.mark.parametrize(
    ("host", "what"),
    [
        (_async_host, "the coroutine function '_async_host' \\(async def\\)"),
        (_generator_host, "the generator function '_generator_host'"),
        (_async_generator_host, "the async generator function '_async_generator_host'"),
        (functools.partial(_async_host, 1), "the coroutine function '_async_host' \\(async def\\)"),
        (_AsyncCallable(), "the coroutine function '_AsyncCallable.__call__' \\(async def\\)"),
    ],
    ids=["async def", "generator", "async generator", "partial", "async __call__"],
)
def test_host_functions_that_would_never_run_are_refused(host: object, what: str) -> None:
    with pytest.raises(
        ag.ArgumentTypeError,
        match=rf"^Kernel host= must be a plain function, got {what}, whose body the host backend "
        r"would never run — write a plain def that writes into its output arguments and returns "
        r"None$",
    ):
        ag.Kernel(SRC, "twice", host=host)  # type: ignore[arg-type]  # deliberately wrong


def test_plain_host_functions_are_accepted() -> None:
    assert ag.Kernel(SRC, "twice", host=print).host is print
    assert ag.Kernel(SRC, "twice", host=functools.partial(print, 1)).host is not None


SCALE_SRC = """
__device__ float twice(float v) { return 2 * v; }
extern "C" __global__ void scale(const float* x, float* out, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * twice(x[i]);
}
"""


@pytest.mark.parametrize("name", ["out", "n", "x", "twice", "blockIdx"])
def test_a_name_that_is_no_kernel_is_a_compile_error(name: str) -> None:
    with pytest.raises(
        ag.CompileError,
        match=rf"^kernel '{name}' failed to compile:\n"
        rf"the source declares no __global__ function named '{name}' \(found: scale\); "
        r"pass the kernel's function name$",
    ):
        ag.Kernel(SCALE_SRC, name)


@pytest.mark.parametrize(
    "source",
    [
        # Declared through a macro the reader cannot expand.
        '#define KERNEL(ret) extern "C" __global__ ret\nKERNEL(void) k(float* out) { out[0] = 1; }',
        # An attribute list the reader takes for the name.
        'extern "C" __global__ void __attribute__((noinline)) k(float* out) { out[0] = 1; }',
        # An explicit instantiation of a template defined in a header.
        '#include "k.cuh"\ntemplate __global__ void k<float>(float* out);',
        # A template whose parameters the reader leaves unchecked.
        "template <typename T> __global__ void k(T* out, const int& n) { out[0] = n; }",
    ],
    ids=["macro", "attribute", "explicit instantiation", "template"],
)
def test_kernels_beyond_the_reader_are_accepted_unchecked(source: str) -> None:
    kernel = ag.Kernel(source, "k")
    assert kernel.name == "k"
    assert kernel.params is None
