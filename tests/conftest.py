"""Shared fixtures: a host backend per test.

The ``cuda`` marker, its skip where no GPU is found, and the ``backend`` fixtures come from
asyncgraph's own pytest plugin (``asyncgraph.testing``), as in users' suites.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

import asyncgraph as ag

pytest_plugins = ("pytester",)


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
