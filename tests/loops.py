"""The event loops a test body runs on: asyncio, asyncio with uvloop, and trio (through anyio).

``LOOPS`` parametrizes a module's ``loop`` fixture; :func:`run` runs a test's body on one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest


def _loops() -> list[Any]:
    loops: list[Any] = ["asyncio"]
    try:
        import uvloop  # noqa: F401
    except ImportError:
        skip = pytest.mark.skip(reason="uvloop is not installed")
        loops.append(pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop", marks=skip))
    else:
        loops.append(pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"))
    loops.append("trio")
    return loops


LOOPS = _loops()


def run(loop: Any, fn: Callable[[], Awaitable[None]]) -> None:
    """Run *fn* with ``anyio.run`` on *loop* (the tests are sync functions: pytest-asyncio,
    in auto mode for the rest of the suite, would otherwise run them on its own loop)."""
    name, options = (loop, {}) if isinstance(loop, str) else loop
    anyio.run(fn, backend=name, backend_options=options)
