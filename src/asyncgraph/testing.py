"""pytest plugin and helpers for testing code that uses asyncgraph.

Installing asyncgraph registers this module as a pytest plugin (entry point ``pytest11``), so a
project's own suite gets, with nothing to configure:

- the ``cuda`` marker, registered: tests carrying it are skipped, with the driver's reason,
  where no CUDA GPU can be used, or fail with that reason where ``ASYNCGRAPH_REQUIRE_CUDA=1``
  is set (a GPU machine's run, where a broken driver must not pass as skips); and the ``ray``
  marker, whose tests are skipped where Ray is not installed (``asyncgraph.ray``);
- ``backend``: a backend opened for one test and closed after it (CUDA where a GPU is present,
  else the host backend), and ``session_backend``: one backend for the whole session, which
  needs the session's event loop (``@pytest.mark.asyncio(loop_scope="session")``);
- ``asyncgraph_device``: the device those fixtures open, from ``--asyncgraph-device`` (or the
  ``ASYNCGRAPH_TEST_DEVICE`` environment variable), ``"auto"`` by default;
- :func:`reference` and :func:`assert_matches_host`, which check a kernel's results against its
  ``host=`` implementation.

The async fixtures run under pytest-asyncio. See ``docs/testing.md``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import pytest

from ._runtime._exceptions import ArgumentTypeError, UnsupportedError

if TYPE_CHECKING:
    import numpy as np

    from asyncgraph._args._kernel import Kernel
    from asyncgraph._front._backend import Backend

    Array = np.ndarray[Any, Any]

# Installing asyncgraph loads this plugin into every pytest run of the environment, most of
# which never use it: loading it imports pytest and the error tree alone. numpy and the rest of
# asyncgraph are imported by the helpers and fixtures, when a test uses one.

__all__ = ("assert_matches_host", "reference")

_DEVICE_ENV = "ASYNCGRAPH_TEST_DEVICE"
_REQUIRE_CUDA_ENV = "ASYNCGRAPH_REQUIRE_CUDA"
_MARKER = (
    "cuda: needs an NVIDIA GPU with a working driver (skipped, with the reason, where none is "
    "found)"
)
_RAY_MARKER = "ray: needs Ray (skipped, with the reason, where it is not installed)"


# -- helpers --------------------------------------------------------------------------------------


def reference(kernel: Kernel, *args: object) -> tuple[Array, ...]:
    """Run *kernel*'s ``host=`` implementation on host copies of *args*, as a dispatch would.

    Arguments follow the dispatch rules: numpy arrays are read-only inputs, ``Out(shape,
    dtype)`` (also with ``resident=True``) becomes a zero-filled array, ``InOut(array)`` a copy
    of the array, and numpy scalars pass by value. The caller's arrays are never changed.

    Args:
        kernel: a kernel declared with ``host=``.
        *args: its arguments in kernel order, as host values.

    Returns:
        One array per ``Out``/``InOut`` argument, in argument order, like ``await dispatch``.

    Raises:
        UnsupportedError: the kernel has no ``host=`` implementation.
        ArgumentTypeError: an argument has no host value (a resident buffer, ``Out(into=)``, a
            device array): pass the numpy array it was made from instead.
        HostFunctionError: the host function returned something other than ``None`` (or its
            own output arrays), as a dispatch on the host backend would fail.
    """
    import numpy as np

    from asyncgraph._args._arguments import InOut, Out
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._host._host_backend import host_return_error

    if not isinstance(kernel, Kernel):
        raise ArgumentTypeError(f"reference() takes an asyncgraph.Kernel first, got {kernel!r}")
    if kernel.host is None:
        raise UnsupportedError(
            f"kernel {kernel.name!r} has no host= implementation to compare against; declare "
            "Kernel(..., host=fn)"
        )
    host_args: list[object] = []
    results: list[Array] = []
    for index, value in enumerate(args):
        if isinstance(value, np.ndarray):
            view = np.array(value, copy=True, order="C")
            view.flags.writeable = False
            host_args.append(view)
        elif isinstance(value, np.generic):
            host_args.append(value)
        elif isinstance(value, Out) and value.into is None:
            out = np.zeros(value.shape, value.dtype)
            host_args.append(out)
            results.append(out)
        elif isinstance(value, InOut):
            copy = np.array(value.array, copy=True, order="C")
            host_args.append(copy)
            results.append(copy)
        else:
            raise ArgumentTypeError(
                f"argument {index} of {kernel.name!r} is {type(value).__name__}, which has no "
                "host value for reference(); pass the numpy array it holds (or was made from), "
                "Out(shape, dtype), InOut(array) or a numpy scalar"
            )
    error = host_return_error(kernel.name, results, kernel.host(*host_args))
    if error is not None:
        raise error
    return tuple(results)


async def assert_matches_host(
    backend: Backend,
    kernel: Kernel,
    *args: object,
    grid: int | tuple[int, ...],
    block: int | tuple[int, ...],
    shared_mem: int = 0,
    rtol: float = 1e-6,
    atol: float = 0.0,
    allow_host: bool = False,
) -> tuple[Array, ...]:
    """Dispatch *kernel* on *backend* and assert each result matches its host reference.

    Floating-point results are compared with ``numpy.testing.assert_allclose(rtol, atol)``,
    every other dtype exactly. Results of ``Out(..., resident=True)`` are downloaded first (and
    closed).

    On the host backend the dispatch runs the very function the reference runs, so the
    comparison could only catch a host function that is not deterministic. There the test is
    skipped, with that reason, unless *allow_host* is true (then the dispatch runs and is
    compared all the same: a check of the dispatch's arguments and of the host contract).

    Args:
        backend: the backend under test.
        kernel: a kernel declared with ``host=``.
        *args: its arguments in kernel order, as host values (see :func:`reference`).
        grid: blocks in the grid.
        block: threads per block.
        shared_mem: bytes of dynamic shared memory per block.
        rtol: relative tolerance for floating-point results.
        atol: absolute tolerance for floating-point results.
        allow_host: on the host backend, run and compare instead of skipping.

    Returns:
        The backend's results, as numpy arrays in argument order.

    Raises:
        AssertionError: a result differs from the reference (the message names the kernel, the
            result's index and the mismatching elements).
        pytest.skip.Exception: *backend* is the host backend and *allow_host* is false.
    """
    if backend.kind == "host" and not allow_host:
        pytest.skip(
            f"assert_matches_host({kernel.name!r}) on the host backend would compare the host "
            "function with itself; run on a CUDA backend (--asyncgraph-device cuda), or pass "
            "allow_host=True to run the dispatch anyway"
        )
    import numpy as np

    from asyncgraph._buffers._resident import ResidentBuffer

    expected = reference(kernel, *args)
    got = await backend.dispatch(kernel, *args, grid=grid, block=block, shared_mem=shared_mem)
    arrays: list[Array] = []
    for result in got:
        if isinstance(result, ResidentBuffer):
            try:
                arrays.append(await backend.download(result))
            finally:
                await result.aclose()
        else:
            arrays.append(result)
    for index, (actual, want) in enumerate(zip(arrays, expected, strict=True)):
        message = f"result {index} of {kernel.name!r} on {backend.name}"
        if actual.shape != want.shape or actual.dtype != want.dtype:
            raise AssertionError(
                f"{message}: got a {actual.dtype} array of shape {actual.shape}, the host "
                f"reference is {want.dtype} of shape {want.shape}"
            )
        if np.issubdtype(want.dtype, np.inexact):
            np.testing.assert_allclose(actual, want, rtol=rtol, atol=atol, err_msg=message)
        else:
            np.testing.assert_array_equal(actual, want, err_msg=message)
    return tuple(arrays)


# -- pytest hooks ---------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("asyncgraph")
    group.addoption(
        "--asyncgraph-device",
        default=None,
        help=(
            "device the asyncgraph backend fixtures open: auto (default), host, cuda or cuda:N; "
            f"also read from ${_DEVICE_ENV}"
        ),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER)
    config.addinivalue_line("markers", _RAY_MARKER)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _skip_without_ray(items)
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    from asyncgraph._opening._detect import probe_cuda

    probe = probe_cuda()
    if probe.available:
        return
    reason = f"needs a CUDA GPU: {probe.reason}"
    if os.environ.get(_REQUIRE_CUDA_ENV, "").strip() not in ("", "0"):
        for item in marked:
            item.stash[_CUDA_MISSING] = f"{reason} ({_REQUIRE_CUDA_ENV} is set: a failure)"
        return
    skip = pytest.mark.skip(reason=reason)
    for item in marked:
        item.add_marker(skip)


_CUDA_MISSING = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # With ASYNCGRAPH_REQUIRE_CUDA set, a cuda-marked test fails, with the probe's reason,
    # where no GPU can be used (before its fixtures run, as the skip would).
    missing = item.stash.get(_CUDA_MISSING, None)
    if missing is not None:
        pytest.fail(missing, pytrace=False)


def _skip_without_ray(items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("ray") is not None]
    if not marked:
        return
    import importlib.util

    if importlib.util.find_spec("ray") is not None:
        return
    skip = pytest.mark.skip(reason="needs Ray: pip install 'asyncgraph[ray]'")
    for item in marked:
        item.add_marker(skip)


_OTHER_LOOP = "belongs to another event loop"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    # A test that uses session_backend from a loop of its own fails inside asyncgraph with
    # "belongs to another event loop"; name the pytest-asyncio setting that fixes it.
    try:
        return (yield)
    except UnsupportedError as exc:
        if _OTHER_LOOP in str(exc) and "session_backend" in getattr(item, "fixturenames", ()):
            exc.add_note(
                "session_backend lives on the session's event loop: mark the test "
                '@pytest.mark.asyncio(loop_scope="session") (or set '
                "asyncio_default_test_loop_scope = session in the pytest ini file)"
            )
        raise


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def asyncgraph_device(pytestconfig: pytest.Config) -> str:
    """The device the backend fixtures open: ``--asyncgraph-device``, else
    ``$ASYNCGRAPH_TEST_DEVICE``, else ``"auto"`` (CUDA where a GPU is present, else the host)."""
    option: str | None = pytestconfig.getoption("asyncgraph_device")
    return option or os.environ.get(_DEVICE_ENV) or "auto"


def _async_fixture(**kwargs: Any) -> Callable[[Any], Any]:
    try:
        import pytest_asyncio
    except ImportError:
        # Without pytest-asyncio the fixtures say what they need instead of never running.
        def sync_fixture(fn: Any) -> Any:
            def missing(asyncgraph_device: str) -> Backend:
                raise pytest.UsageError(
                    "asyncgraph's backend fixtures are async and run under pytest-asyncio; "
                    "pip install pytest-asyncio"
                )

            missing.__name__ = fn.__name__
            missing.__doc__ = fn.__doc__
            return pytest.fixture(scope=kwargs.get("scope", "function"))(missing)

        return sync_fixture
    return pytest_asyncio.fixture(**kwargs)


@_async_fixture()
async def backend(asyncgraph_device: str) -> AsyncIterator[Backend]:
    """A backend opened for one test and closed after it (waiting for its work)."""
    from asyncgraph._opening._open import open_backend

    async with open_backend(asyncgraph_device) as opened:
        yield opened


@_async_fixture(scope="session", loop_scope="session")
async def session_backend(asyncgraph_device: str) -> AsyncIterator[Backend]:
    """One backend for the whole session, closed at its end.

    A backend belongs to the event loop it is first used on, so tests using this fixture run in
    the session's loop: mark them ``@pytest.mark.asyncio(loop_scope="session")``.
    """
    from asyncgraph._opening._open import open_backend

    async with open_backend(asyncgraph_device) as opened:
        yield opened
