"""``backend.copy`` between CUDA backends on the stand-in driver with two devices.

``python -m tests.fake_driver.copy_scenario`` copies resident buffers within a backend, between
two backends of one device, between two devices (peer to peer: the stand-in counts
``cuMemcpyPeerAsync`` and ``cuCtxEnablePeerAccess``), to a host backend, and through a group
of the two devices (``copy_to``, ``replicate``), and prints what it saw as one JSON line
(``tests/test_copy.py`` checks it).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
from typing import Any

import numpy as np

os.environ["FAKE_CUDA_DEVICES"] = "2"  # read by the stand-in at each call

import asyncgraph as ag  # after the stand-in is told of two devices
from tests.fake_driver import reset
from tests.kernels import INC

_lib = ctypes.CDLL("libcuda.so.1")
for name in ("fake_peer_copies", "fake_peer_enables", "fake_wrong_context_calls"):
    getattr(_lib, name).restype = ctypes.c_long
N = 4096


async def main() -> dict[str, Any]:
    seen: dict[str, Any] = {}
    rng = np.random.default_rng()
    x = rng.standard_normal(N, dtype=np.float32)
    async with (
        ag.open_backend("cuda:0") as a,
        ag.open_backend("cuda:0") as a2,
        ag.open_backend("cuda:1") as b,
        ag.open_backend("host") as host,
    ):
        await a.compile(INC)
        source = await a.upload(x)
        await a.dispatch(INC, source, np.float32(1), np.int32(N), grid=16, block=256)
        twin = await a.copy(source)
        same_device = await a.copy(source, to=a2)
        other_device = await a.copy(source, to=b)
        again = await a.copy(source, to=b)
        on_host = await a.copy(source, to=host)
        back = await host.copy(on_host, to=b)
        expected = x + np.float32(1)
        seen["right"] = [
            bool(np.array_equal(await backend.download(buffer), expected))
            for backend, buffer in (
                (a, twin), (a2, same_device), (b, other_device), (b, again), (host, on_host),
                (b, back),
            )
        ]  # fmt: skip
        seen["peer_copies"] = _lib.fake_peer_copies()
        seen["peer_enables"] = _lib.fake_peer_enables()
        seen["copies_on_b"] = b.telemetry.snapshot().buffer_copies
        await source.aclose()
        try:
            await a.copy(source, to=b)
        except ag.StaleBufferError as exc:
            seen["stale"] = str(exc)
        try:
            await a.copy(twin, to="cuda:1")  # type: ignore[arg-type]
        except ag.ArgumentTypeError as exc:
            seen["not_a_backend"] = str(exc)
    # Writers queued behind the in-flight bound, not launched yet when the copy starts: the
    # copy waits for them (then enqueues, with the context current) and holds what they wrote.
    async with (
        ag.open_backend("cuda:0", max_in_flight=1) as narrow,
        ag.open_backend("cuda:1") as other,
    ):
        await narrow.compile(INC)
        source = await narrow.upload(x)
        one = np.float32(1)
        writes = [
            narrow.dispatch(INC, source, np.float32(1), np.int32(N), grid=16, block=256)
            for _ in range(3)
        ]
        queued = narrow.telemetry.snapshot().queued
        copied = await narrow.copy(source, to=other)
        await asyncio.gather(*writes)
        seen["after_queued_writers"] = [
            queued,
            bool(np.array_equal(await other.download(copied), x + one + one + one)),
        ]
    async with ag.open_group(["cuda:0", "cuda:1"]) as group:
        on_0 = await group.upload(x, group[0])
        on_1 = await group.copy_to(on_0, group[1])
        seen["group_copy"] = bool(np.array_equal(await group.download(on_1), x))
        # A closed buffer's storage serves the next allocation of its size; what it held is
        # overwritten by the new copy.
        pointer = on_1.__cuda_array_interface__["data"][0]
        await on_1.aclose()
        y = rng.standard_normal(N, dtype=np.float32)
        second = await group.upload(y, group[0])
        reused = await group.copy_to(second, group[1])
        seen["spare_reused"] = [
            reused.__cuda_array_interface__["data"][0] == pointer,
            bool(np.array_equal(await group.download(reused), y)),
        ]
        await reused.aclose()
        await second.aclose()
        up = [m.telemetry.snapshot().bytes_up for m in group]
        replicated = await group.replicate(x)
        seen["replicated"] = [
            bool(np.array_equal(await m.download(replicated.on(m)), x)) for m in group
        ]
        seen["replicate_uploads"] = [
            m.telemetry.snapshot().bytes_up - u for m, u in zip(group, up, strict=True)
        ]
        await replicated.aclose()
    seen["wrong_context_calls"] = _lib.fake_wrong_context_calls()
    return seen


if __name__ == "__main__":
    reset(_lib)
    _lib.fake_set_complete_mode(b"queries:3")
    print(json.dumps(asyncio.run(main())))
