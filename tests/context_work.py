"""Every kind of work a CUDA backend does, run while another CUDA context is current.

:func:`every_kind_of_work` opens a CUDA backend, uses it every way a user can (compile,
dispatches small and large, many at once, resident buffers, a recorded graph, a capture, a
stream lease, ``wait``, close), checks each result against numpy, and after each step notes
whether the thread's current context is still the one it found. ``tests/test_cuda_context.py``
runs it on a GPU; ``tests/fake_driver/context_scenario.py`` on the stand-in driver, which also
counts driver calls made outside the backend's context.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from cuda.bindings import driver as drv

import asyncgraph as ag
from asyncgraph._bench._bench_run import SCALE

from .kernels import INC

N = 1024
BIG = 3 << 20  # float32 elements: 12 MiB, staged in threads


def current() -> int:
    """The calling thread's current context, as an address (0: none)."""
    code, context = drv.cuCtxGetCurrent()
    return int(context) if code == drv.CUresult.CUDA_SUCCESS and context is not None else 0


def push_foreign() -> Any:
    """A context of our own on device 0 (as another library would make), made current."""
    code, device = drv.cuDeviceGet(0)
    assert code == drv.CUresult.CUDA_SUCCESS, code
    code, context = drv.cuCtxCreate(None, 0, device)
    assert code == drv.CUresult.CUDA_SUCCESS, code
    return context


def destroy(context: Any) -> None:
    """Destroy a context of :func:`push_foreign` (popped if current)."""
    assert drv.cuCtxDestroy(context)[0] == drv.CUresult.CUDA_SUCCESS


def _scale(backend: Any, x: np.ndarray[Any, Any]) -> ag.PendingDispatch:
    n = x.size
    pending: ag.PendingDispatch = backend.dispatch(
        SCALE, x, ag.Out(n, np.float32), np.float32(2), np.int32(n),
        grid=(n + 255) // 256, block=256,
    )  # fmt: skip
    return pending


async def every_kind_of_work(options: ag.BackendOptions | None = None) -> dict[str, Any]:
    """Use a CUDA backend every way; returns ``{"wrong": [...], "moved": [...]}``: the steps
    whose results differed from numpy's, and those after which the current context was no
    longer the one found at the start."""
    rng = np.random.default_rng()
    found = current()
    wrong: list[str] = []
    moved: list[str] = []

    def step(name: str, ok: bool) -> None:
        if not ok:
            wrong.append(name)
        if current() != found:
            moved.append(name)

    x = rng.standard_normal(N, dtype=np.float32)
    backend = ag.open_backend("cuda", options=options)
    step("open", True)
    async with backend:
        await backend.compile(SCALE)
        await backend.compile(INC)
        step("compile", True)
        (out,) = await _scale(backend, x)  # the general path, then the fast path
        step("first dispatch", np.array_equal(out, 2 * x))
        outs = [(await _scale(backend, x))[0] for _ in range(20)]
        step("dispatches", all(np.array_equal(o, 2 * x) for o in outs))
        many = await asyncio.gather(*(_scale(backend, x) for _ in range(64)))
        step("64 at once", all(np.array_equal(r[0], 2 * x) for r in many))
        big = rng.standard_normal(BIG, dtype=np.float32)
        (big_out,) = await _scale(backend, big)
        step("12 MiB", np.array_equal(big_out, 2 * big))
        buf = await backend.upload(x)
        step("upload", True)
        for _ in range(5):
            await backend.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
        step("resident", np.allclose(await backend.download(buf), x + 5))
        graph = await backend.record(
            SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=4, block=256
        )
        (replayed,) = await graph.replay(2 * x, ag.Out(N, np.float32), np.float32(3), np.int32(N))
        step("record and replay", np.array_equal(replayed, 6 * x))
        graph.close()
        async with backend.capture() as cap:
            await cap.dispatch(INC, buf, np.float32(1), np.int32(N), grid=4, block=256)
        step("capture", True)
        captured = cap.graph
        captured.upload()
        await captured.replay()
        await captured.replay()
        step("captured replays", np.allclose(await backend.download(buf), x + 7))
        captured.close()
        async with backend.stream() as lease:
            step("lease", True)
            await lease.synchronize()
            await backend.wait(lease)
        step("lease synchronize and wait", True)
        await buf.aclose()
        step("free", True)
    step("close", True)
    return {"wrong": wrong, "moved": moved, "found": found}
