"""Captures that end early, on the CUDA backend over the stand-in driver: ``python -m
tests.fake_driver.capture_scenario`` prints what the stand-in counted as one JSON line
(``tests/test_capture_abort.py`` checks it)."""

from __future__ import annotations

import asyncio
import ctypes
import json
from typing import Any

import numpy as np
from cuda.bindings import driver as drv

import asyncgraph as ag
from tests.fake_driver import reset
from tests.kernels import INC

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_live_graphs.restype = ctypes.c_long
_lib.fake_refused_graph_destroys.restype = ctypes.c_long
N = 1024


async def main() -> dict[str, Any]:
    seen: dict[str, Any] = {}
    async with ag.open_backend("cuda") as gpu:
        await gpu.compile(INC)
        buf = await gpu.upload(np.zeros(N, np.float32))
        base = _lib.fake_live_graphs()
        # An error inside an active capture: the capture is aborted.
        try:
            async with gpu.capture() as cap:
                await cap.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
                raise ZeroDivisionError
        except ZeroDivisionError:
            seen["active_aborted"] = True
        seen["active_refused_destroys"] = _lib.fake_refused_graph_destroys()
        # A capture invalidated by a call it cannot take.
        event = drv.cuEventCreate(0)[1]
        try:
            async with gpu.capture(mode="global") as cap:
                await cap.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
                drv.cuEventQuery(event)
        except ag.CaptureError as exc:
            seen["invalidated"] = "invalidated" in str(exc)
        drv.cuEventDestroy(event)
        seen["live_graphs"] = _lib.fake_live_graphs() - base
        # cuda.core's own close() of an invalidated build destroys its graph twice on the
        # stand-in, whoever ends the capture: counted, not asserted (it is not asyncgraph's).
        seen["invalidated_refused_destroys"] = (
            _lib.fake_refused_graph_destroys() - seen["active_refused_destroys"]
        )
        (out,) = await gpu.dispatch(
            INC, ag.InOut(np.zeros(N, np.float32)), np.float32(1), np.int32(N), grid=4, block=256
        )
        seen["usable"] = bool((out == 1).all())
    return seen


if __name__ == "__main__":
    reset(_lib)
    _lib.fake_set_complete_mode(b"instant")
    print(json.dumps(asyncio.run(main())))
