"""Shared fixtures: a host backend per test, and the cuda marker's skip."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import asyncgraph as ag
from asyncgraph._detect import probe_cuda


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    probe = probe_cuda()
    if probe.available:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {probe.reason}")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture
async def host() -> AsyncIterator[ag.Backend]:
    """A host backend, closed after the test."""
    async with ag.open_backend("host") as backend:
        yield backend
