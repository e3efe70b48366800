"""The scenarios of ``tests/jobs_scenarios.py`` on the CUDA backend over the stand-in.

``python -m tests.fake_driver.jobs_scenario NAME`` runs one and prints what it saw as one JSON
line; ``tests/test_jobs.py`` runs each on each dispatch core. The held slot is a dispatch whose
event the stand-in completes only when told ("manual" mode); once it is released, events
complete when recorded again.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import sys
from typing import Any

from cuda.bindings import driver as drv

import asyncgraph as ag
from asyncgraph._runtime._priority import PRIORITIES
from tests.fake_driver import reset
from tests.jobs_scenarios import SCENARIOS, _inc
from tests.kernels import INC

_lib = ctypes.CDLL("libcuda.so.1")
_lib.fake_event_complete.argtypes = [ctypes.c_void_p, ctypes.c_int]
_lib.fake_launch_count.restype = ctypes.c_ulonglong
_lib.fake_launch_count.argtypes = [ctypes.c_char_p]


def _mode(mode: str) -> None:
    _lib.fake_set_complete_mode(mode.encode())


class StandInHold:
    """The slot held by a dispatch whose event completes when released."""

    def __init__(self) -> None:
        self._job: Any = None

    def take(self, backend: Any, priority: str = "normal") -> ag.PendingDispatch:
        _mode("manual")
        # queue_timeout=inf: no deadline, but on the general path, whose job is in the
        # scheduler to read the event of.
        pending = _inc(backend, backend.empty(4, "float32"), priority=priority, queue_timeout=1e300)
        (self._job,) = backend._scheduler.jobs_in_flight()
        return pending

    def release(self) -> None:
        _mode("instant")
        _lib.fake_event_complete(ctypes.c_void_p(int(self._job.event)), 0)


async def _run(name: str) -> dict[str, Any]:
    async with ag.open_backend("cuda", max_in_flight=1) as gpu:
        await gpu.compile(INC)
        seen = await SCENARIOS[name](gpu, StandInHold())
        seen["inc_launches"] = int(_lib.fake_launch_count(b"inc"))
    return seen


async def _streams() -> dict[str, Any]:
    """The CUDA priority of each class's streams, and the class of the lane each runs on."""
    async with ag.open_backend("cuda", max_in_flight=1) as gpu:
        await gpu.compile(INC)
        device = gpu._engine.device  # type: ignore[attr-defined]  # the CUDA engine's
        least, greatest = drv.cuCtxGetStreamPriorityRange()[1:]
        seen: dict[str, Any] = {"range": [least, greatest], "priorities": {}, "lanes": {}}
        for name, lanes in zip(PRIORITIES, device.class_lanes, strict=True):
            seen["priorities"][name] = sorted(
                {drv.cuStreamGetPriority(lane.handle)[1] for lane in lanes}
            )
        for name in PRIORITIES:
            hold = StandInHold()
            pending = hold.take(gpu, name)
            seen["lanes"][name] = PRIORITIES[hold._job.lane.rank]
            hold.release()
            await pending
    return seen


def main() -> None:
    reset(_lib)
    _mode("instant")
    name = sys.argv[1]
    seen = asyncio.run(_streams() if name == "streams" else _run(name))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
