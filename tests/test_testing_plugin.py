"""asyncgraph.testing: the pytest plugin users' suites get, run in pytester's inner sessions."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph.testing import assert_matches_host, reference

from .kernels import SCALE

INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
filterwarnings = error
"""

KERNELS = '''
import numpy as np
import asyncgraph as ag

SRC = r"""
extern "C" __global__ void twice(const float* x, float* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * x[i];
}
"""


def _twice(x, out, n):
    out[: int(n)] = 2.0 * x[: int(n)]


TWICE = ag.Kernel(SRC, "twice", host=_twice)
'''


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """An inner project with an ini file and a kernel module."""
    pytester.makeini(INI)
    pytester.makepyfile(user_kernels=KERNELS)
    return pytester


def test_registered_as_entry_point() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert plugins.get("asyncgraph") == "asyncgraph.testing"


def test_cuda_marker_registered(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.cuda: needs an NVIDIA GPU*"])


def test_backend_fixture_and_result_check(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_user="""
        import numpy as np
        import asyncgraph as ag
        from asyncgraph.testing import assert_matches_host
        from user_kernels import TWICE

        async def test_twice(backend):
            assert backend.name == "host"
            x = np.random.default_rng().random(1000, dtype=np.float32)
            out, = await assert_matches_host(
                backend, TWICE, x, ag.Out(x.shape, x.dtype), np.int32(x.size),
                grid=4, block=256, allow_host=True,
            )
            np.testing.assert_array_equal(out, 2 * x)

        async def test_fresh_backend_per_test(backend):
            assert backend.telemetry.snapshot().dispatches == 0
        """
    )
    result = suite.runpytest("--asyncgraph-device", "host")
    result.assert_outcomes(passed=2)


def test_device_from_environment(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCGRAPH_TEST_DEVICE", "host")
    suite.makepyfile(
        test_user="""
        def test_device(asyncgraph_device):
            assert asyncgraph_device == "host"

        async def test_backend(backend):
            assert backend.kind == "host"
        """
    )
    suite.runpytest().assert_outcomes(passed=2)


def test_session_backend_shared_and_closed(suite: pytest.Pytester, tmp_path: Any) -> None:
    marker = tmp_path / "closed.txt"
    suite.makeconftest(
        f"""
        seen = []

        def pytest_sessionfinish(session):
            with open({str(marker)!r}, "w") as f:
                f.write(" ".join(str(b.is_closed) for b in seen))
        """
    )
    suite.makepyfile(
        test_user="""
        import pytest
        import conftest

        pytestmark = pytest.mark.asyncio(loop_scope="session")

        async def test_first(session_backend):
            conftest.seen.append(session_backend)

        async def test_second(session_backend):
            assert session_backend is conftest.seen[0]
            assert not session_backend.is_closed
            conftest.seen.append(session_backend)
        """
    )
    suite.runpytest("--asyncgraph-device", "host").assert_outcomes(passed=2)
    assert marker.read_text() == "True True"


@pytest.mark.parametrize("required", [False, True])
def test_the_cuda_marker_skips_with_the_reason_or_fails_where_required(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, required: bool
) -> None:
    """Without a GPU a cuda test skips, saying why; a GPU run sets ASYNCGRAPH_REQUIRE_CUDA, and
    then a driver that does not load fails it instead."""
    suite.makepyfile(
        test_user="""
        import pytest

        @pytest.mark.cuda
        def test_gpu():
            raise AssertionError("ran without a GPU")

        def test_plain():
            pass
        """
    )
    # A child process, so CUDA is probed afresh with the switch that hides it.
    monkeypatch.setenv("ASYNCGRAPH_DISABLE_CUDA", "1")
    if required:
        monkeypatch.setenv("ASYNCGRAPH_REQUIRE_CUDA", "1")
    result = suite.runpytest_subprocess("-rs")
    why = "needs a CUDA GPU: ASYNCGRAPH_DISABLE_CUDA is set"
    if required:
        result.assert_outcomes(passed=1, errors=1)
        result.stdout.fnmatch_lines([f"*{why} (ASYNCGRAPH_REQUIRE_CUDA is set: a failure)*"])
    else:
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines([f"*{why}*"])
    assert "ran without a GPU" not in result.stdout.str()


def test_mismatch_fails_with_the_kernel_named(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_user="""
        import itertools
        import numpy as np
        import asyncgraph as ag
        from asyncgraph.testing import assert_matches_host

        calls = itertools.count(1)

        def _stamp(out):
            out[:] = next(calls)  # differs between the reference run and the dispatch

        STAMP = ag.Kernel("extern \\"C\\" __global__ void stamp(int* out) {}", "stamp",
                          host=_stamp)

        async def test_stamp(backend):
            await assert_matches_host(backend, STAMP, ag.Out(4, np.int32), grid=1, block=4,
                                      allow_host=True)
        """
    )
    result = suite.runpytest("--asyncgraph-device", "host")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*result 0 of 'stamp' on host*"])


def test_without_pytest_asyncio_the_fixture_says_what_is_missing(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pytest_asyncio that cannot be imported, and its plugin switched off.
    suite.mkpydir("pytest_asyncio").joinpath("__init__.py").write_text(
        "raise ImportError('hidden for this test')\n"
    )
    suite.makeini("[pytest]\n")
    suite.makepyfile(
        test_user="""
        def test_uses_backend(backend):
            pass
        """
    )
    monkeypatch.setenv("PYTHONPATH", str(suite.path), prepend=":")
    result = suite.runpytest_subprocess("-p", "no:asyncio")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*pip install pytest-asyncio*"])


# -- the helpers on their own ---------------------------------------------------------------------


def test_reference_follows_dispatch_rules(rng: np.random.Generator) -> None:
    x = rng.random(64, dtype=np.float32)
    before = x.copy()
    inout = rng.random(64, dtype=np.float32)

    def host(x: Any, out: Any, io: Any, n: Any) -> None:
        out[:] = x + 1
        io *= 2

    out_ref, inout_ref = reference(
        ag.Kernel(
            'extern "C" __global__ void k(const float* x, float* out, float* io, int n) {}',
            "k",
            host=host,
        ),
        x,
        ag.Out(x.shape, x.dtype),
        ag.InOut(inout),
        np.int32(64),
    )
    np.testing.assert_array_equal(out_ref, x + 1)
    np.testing.assert_array_equal(inout_ref, inout * 2)
    np.testing.assert_array_equal(x, before)
    assert inout_ref is not inout


def test_reference_holds_the_host_contract_as_a_dispatch_does() -> None:
    # A host function that returns its result wrote nothing: the reference would be all zeros.
    returns = ag.Kernel(
        'extern "C" __global__ void k(const float* x, float* out) {}',
        "k",
        host=lambda x, out: 2 * x,
    )
    x = np.ones(4, np.float32)
    with pytest.raises(
        ag.HostFunctionError,
        match=r"^the host= function of kernel 'k' returned a float32 array of shape \(4,\), "
        r"which the dispatch cannot use; write the results into the output arguments",
    ):
        reference(returns, x, ag.Out(4, np.float32))
    # Returning its own output is harmless.
    gives_out = ag.Kernel(
        'extern "C" __global__ void k(const float* x, float* out) {}',
        "k",
        host=lambda x, out: np.multiply(x, 2, out=out),
    )
    (out,) = reference(gives_out, x, ag.Out(4, np.float32))
    np.testing.assert_array_equal(out, 2 * x)


def test_reference_refuses_inputs_without_host_values() -> None:
    with pytest.raises(ag.ArgumentTypeError, match=r"^argument 0 of 'scale' is str"):
        reference(SCALE, "x", ag.Out(4, np.float32), np.float32(1), np.int32(4))
    with pytest.raises(ag.UnsupportedError, match=r"has no host= implementation"):
        reference(ag.Kernel('extern "C" __global__ void k() {}', "k"))


async def test_resident_results_are_downloaded_and_closed(
    host: ag.Backend, rng: np.random.Generator
) -> None:
    x = rng.random(256, dtype=np.float32)
    (out,) = await assert_matches_host(
        host,
        SCALE,
        x,
        ag.Out(x.shape, x.dtype, resident=True),
        np.float32(3),
        np.int32(x.size),
        grid=1,
        block=256,
        allow_host=True,
    )
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, 3 * x, rtol=1e-6)
    assert len(host._store) == 0


def test_on_the_host_backend_the_result_check_skips_and_says_why(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_user="""
        import numpy as np
        import asyncgraph as ag
        from asyncgraph.testing import assert_matches_host
        from user_kernels import TWICE

        async def test_twice(backend):
            x = np.ones(8, np.float32)
            await assert_matches_host(
                backend, TWICE, x, ag.Out(x.shape, x.dtype), np.int32(x.size), grid=1, block=8
            )
            raise AssertionError("not reached: the check skips on the host backend")
        """
    )
    result = suite.runpytest("--asyncgraph-device", "host", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["*assert_matches_host('twice') on the host backend would compare the host function with*"]
    )


def test_session_backend_on_a_test_loop_names_loop_scope(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_user="""
        import numpy as np
        import asyncgraph as ag
        from user_kernels import TWICE

        async def test_on_its_own_loop(session_backend):
            x = np.ones(8, np.float32)
            await session_backend.dispatch(
                TWICE, x, ag.Out(x.shape, x.dtype), np.int32(8), grid=1, block=8
            )
        """
    )
    result = suite.runpytest("--asyncgraph-device", "host")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*belongs to another event loop*",
            "*session_backend lives on the session's event loop: mark the test "
            '@pytest.mark.asyncio(loop_scope="session")*',
        ]
    )
