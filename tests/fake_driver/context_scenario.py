"""A CUDA backend on the stand-in driver while other contexts are current.

``python -m tests.fake_driver.context_scenario`` runs ``tests/context_work.py`` with another
context current on the loop's thread, then with none current (a fresh thread), then with
another current on a worker thread, then two backends of one device interleaving on one loop,
and prints what it observed as one JSON line, with the stand-in's count of driver calls made
outside the backend's context (``tests/test_cuda_context.py`` checks it).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import threading
from typing import Any

import numpy as np

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE
from tests.context_work import current, destroy, every_kind_of_work, push_foreign
from tests.fake_driver import reset

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_wrong_context_calls.restype = ctypes.c_long
_lib.fake_first_wrong_context_call.restype = ctypes.c_char_p
N = 1024


def _counted(seen: dict[str, Any]) -> dict[str, Any]:
    seen["wrong_context_calls"] = _lib.fake_wrong_context_calls()
    seen["first_wrong_call"] = _lib.fake_first_wrong_context_call().decode()
    return seen


def _with_foreign() -> dict[str, Any]:
    foreign = push_foreign()
    try:
        seen = asyncio.run(every_kind_of_work())
        seen["still_foreign"] = current() == int(foreign)
    finally:
        destroy(foreign)
    return _counted(seen)


def _in_thread(body: Any) -> dict[str, Any]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box.update(body())
        except BaseException as exc:  # reported, not lost in the thread
            box["error"] = repr(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return box


def _with_none() -> dict[str, Any]:
    seen = asyncio.run(every_kind_of_work())
    seen["still_none"] = current() == 0
    return _counted(seen)


async def _two_backends() -> dict[str, Any]:
    """Two backends of one device on one loop, their dispatches interleaved."""
    rng = np.random.default_rng()
    x = rng.standard_normal(N, dtype=np.float32)
    async with ag.open_backend("cuda") as a, ag.open_backend("cuda") as b:
        pending = [
            backend.dispatch(
                SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
            )
            for _ in range(50)
            for backend in (a, b)
        ]
        results = await asyncio.gather(*pending)
    return {"right": sum(bool(np.array_equal(r[0], 2 * x)) for r in results)}


def main() -> dict[str, Any]:
    reset(_lib)
    _lib.fake_set_complete_mode(b"queries:3")  # the reactor polls, then its waiters wait
    return {
        "foreign_on_main": _with_foreign(),
        "none_on_thread": _in_thread(_with_none),
        "foreign_on_thread": _in_thread(_with_foreign),
        "two_backends": _counted(asyncio.run(_two_backends())),
    }


if __name__ == "__main__":
    print(json.dumps(main()))
