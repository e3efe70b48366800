"""Shared fixtures: a host backend per test, random inputs that can be replayed; the markers of
what a test needs beyond the package.

The ``cuda`` marker, its skip where no GPU is found (a failure with
``ASYNCGRAPH_REQUIRE_CUDA=1``), and the ``backend`` fixtures come from asyncgraph's own pytest
plugin (``asyncgraph.testing``), as in users' suites. The markers ``stand_in``, ``nvrtc`` and
``compiled`` skip a test where the stand-in driver, NVRTC or the compiled core is missing, or
fail it where the matching ``ASYNCGRAPH_REQUIRE_*`` switch is set (``tests/needs.py``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest

import asyncgraph as ag

from . import needs

pytest_plugins = ("pytester",)

_MARKERS = {
    "stand_in": "needs the stand-in CUDA driver, built with a C compiler",
    "nvrtc": "compiles kernels with NVRTC (the extra 'nvrtc')",
    "compiled": "needs the compiled dispatch core",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, what in _MARKERS.items():
        switch = needs.SWITCHES[name]
        config.addinivalue_line(
            "markers", f"{name}: {what} (skipped where missing; a failure with {switch}=1)"
        )


def pytest_sessionstart(session: pytest.Session) -> None:
    """With ASYNCGRAPH_REQUIRE_COMPILED set, a compiled core that does not import stops the run
    at once: the Python core would otherwise stand in for it silently."""
    switch = needs.SWITCHES["compiled"]
    if needs.switched_on(switch) and (reason := needs.unmet("compiled")) is not None:
        raise pytest.UsageError(f"{switch} is set, but {reason}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the fixtures: skip (or fail) a test whose markers ask for what is missing."""
    for name in _MARKERS:
        if item.get_closest_marker(name) is None or (reason := needs.unmet(name)) is None:
            continue
        if needs.switched_on(needs.SWITCHES[name]):
            needs.missing(reason, needs.SWITCHES[name])  # fails
        item.add_marker(pytest.mark.skip(reason=reason))  # skipped at the test's own line


SEED_ENV = "ASYNCGRAPH_TEST_SEED"


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """The seed of the test's random inputs: fresh each run, or ``$ASYNCGRAPH_TEST_SEED``.

    It is printed (pytest shows it with a failing test's output, under "Captured stdout
    setup") and kept in the test's report (``user_properties``, in JUnit XML too), so that a
    failure can be replayed: ``ASYNCGRAPH_TEST_SEED=<seed> pytest <test id>``.
    """
    value = int(os.environ.get(SEED_ENV) or secrets.randbits(64))
    print(f"random inputs from seed {value}: replay with {SEED_ENV}={value}")
    request.node.user_properties.append(("seed", value))
    return value


@pytest.fixture
def rng(seed: int) -> np.random.Generator:
    """The test's random generator, from :func:`seed`."""
    return np.random.default_rng(seed)


@pytest.fixture
async def host() -> AsyncIterator[ag.Backend]:
    """A host backend, closed after the test."""
    async with ag.open_backend("host") as backend:
        yield backend


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Every pytest-asyncio test runs on asyncio's own loop and on uvloop's (where installed)."""
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    try:
        import uvloop
    except ImportError:
        return factories
    factories["uvloop"] = uvloop.new_event_loop
    return factories
