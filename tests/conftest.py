"""Shared fixtures: a host backend per test.

The ``cuda`` marker, its skip where no GPU is found, and the ``backend`` fixtures come from
asyncgraph's own pytest plugin (``asyncgraph.testing``), as in users' suites.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import asyncgraph as ag

pytest_plugins = ("pytester",)


@pytest.fixture
async def host() -> AsyncIterator[ag.Backend]:
    """A host backend, closed after the test."""
    async with ag.open_backend("host") as backend:
        yield backend
