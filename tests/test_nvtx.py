"""NVTX ranges around dispatches: balanced, named after the kernel, ended on failure too."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag

from .kernels import SCALE


class FakeDomain:
    """Records the calls the real nvtx domain would get."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.ids = 0

    def get_event_attributes(self, message: str, color: str) -> str:
        return message

    def push_range(self, attributes: str) -> None:
        self.calls.append(("push", attributes))

    def pop_range(self) -> None:
        self.calls.append(("pop", None))

    def start_range(self, attributes: str) -> int:
        self.ids += 1
        self.calls.append(("start", (attributes, self.ids)))
        return self.ids

    def end_range(self, range_id: int) -> None:
        self.calls.append(("end", range_id))


@pytest.fixture
def domain(monkeypatch: pytest.MonkeyPatch) -> FakeDomain:
    fake = FakeDomain()
    module = types.ModuleType("nvtx")
    module.get_domain = lambda name: fake  # type: ignore[attr-defined]  # a stand-in module
    monkeypatch.setitem(sys.modules, "nvtx", module)
    return fake


def _boom(*args: object) -> None:
    raise ZeroDivisionError("host kernel failed")


BOOM = ag.Kernel(SCALE.source, "scale", host=_boom)


async def test_each_dispatch_gets_a_submit_and_a_life_range(
    domain: FakeDomain, rng: np.random.Generator
) -> None:
    x = rng.random(256, dtype=np.float32)
    async with ag.open_backend("host", nvtx_enabled=True) as backend:
        for _ in range(3):
            (out,) = await backend.dispatch(
                SCALE, x, ag.Out(x.shape, x.dtype), np.float32(2), np.int32(256), grid=1, block=256
            )
            np.testing.assert_allclose(out, 2 * x, rtol=1e-6)
        with pytest.raises(ZeroDivisionError):
            await backend.dispatch(
                BOOM, x, ag.Out(x.shape, x.dtype), np.float32(2), np.int32(256), grid=1, block=256
            )
    kinds = [kind for kind, _ in domain.calls]
    assert kinds.count("push") == kinds.count("pop") == 4
    started = [value for kind, value in domain.calls if kind == "start"]
    assert [message for message, _ in started] == ["dispatch scale"] * 4
    ended = sorted(value for kind, value in domain.calls if kind == "end")
    assert ended == [range_id for _, range_id in started]
    assert ("push", "submit scale") in domain.calls


def test_missing_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvtx", None)
    with pytest.raises(ag.UnsupportedError, match=r"pip install 'asyncgraph\[nvtx\]'$"):
        ag.open_backend("host", nvtx_enabled=True)


async def test_with_the_real_package(rng: np.random.Generator) -> None:
    pytest.importorskip(
        "nvtx", reason="the nvtx package is not installed: pip install 'asyncgraph[nvtx]'"
    )
    x = rng.random(256, dtype=np.float32)
    async with ag.open_backend("auto", nvtx_enabled=True) as backend:
        (out,) = await backend.dispatch(
            SCALE, x, ag.Out(x.shape, x.dtype), np.float32(3), np.int32(256), grid=1, block=256
        )
    np.testing.assert_allclose(out, 3 * x, rtol=1e-6)
