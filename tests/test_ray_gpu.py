"""asyncgraph.ray on a machine with two GPUs and Ray: an actor per GPU, both busy at once; a
real device fault on one GPU, healed while the other GPU goes on."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._demo._fault_kernel import POKE_SOURCE

from .test_ray import _scale

pytestmark = [pytest.mark.ray, pytest.mark.cuda]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


def _two_gpus() -> None:
    from asyncgraph._opening._detect import probe_cuda

    gpus = len(probe_cuda().devices)
    if gpus < 2:
        pytest.skip(f"needs two GPUs, found {gpus}")


async def _setup(worker: Any) -> None:
    """The pool's setup: the scale kernel compiled, and the generation it ran on noted."""
    await _scale(worker, np.ones(256, np.float32), 1.0)
    worker.state["set up as"] = worker.generation


async def _who(worker: Any) -> tuple[int, int, Any]:
    return worker.index, worker.generation, worker.state.get("set up as")


async def _poke(worker: Any) -> None:
    """Faults the actor's GPU: a kernel that writes to an illegal address."""
    kernel = ag.Kernel(POKE_SOURCE, "poke")
    await worker.backend.dispatch(kernel, ag.Out(1, np.float32), np.int64(1 << 40), grid=1, block=1)


async def test_actors_on_two_gpus_work_at_once(rng: np.random.Generator) -> None:
    import ray

    from asyncgraph.ray import open_actor_pool

    _two_gpus()
    ray.init(num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        x = rng.standard_normal(1 << 20).astype(np.float32)
        async with open_actor_pool(2, device="cuda") as pool:
            infos = pool.infos
            results = await asyncio.gather(*(pool.run(_scale, x, 2.0) for _ in range(8)))
        assert all(i.backend == "cuda:0" for i in infos)  # each sees only its own GPU
        assert len({i.pci_bus_id for i in infos}) == 2
        assert sorted(index for index, _ in results) == [0, 0, 0, 0, 1, 1, 1, 1]
        for _, out in results:
            np.testing.assert_allclose(out, 2 * x, rtol=1e-6)
    finally:
        ray.shutdown()


async def test_a_fault_on_one_gpu_is_healed(rng: np.random.Generator) -> None:
    """Actor 1's GPU faults (an illegal address): its run fails with DeviceFaultError, the
    40 runs sent after it all succeed and compute right, and a new actor serves on that GPU
    within 60 s, set up first."""
    import ray

    from asyncgraph.ray import open_actor_pool

    _two_gpus()
    ray.init(num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        x = rng.standard_normal(1 << 16).astype(np.float32)
        async with open_actor_pool(2, device="cuda", setup=_setup) as pool:
            before = pool.infos
            assert await pool.broadcast(_who) == [(0, 0, 0), (1, 0, 0)]
            with pytest.raises(ag.DeviceFaultError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
                await pool.run_on(1, _poke)
            seen = time.monotonic()
            results = await asyncio.gather(
                *(pool.run(_scale, x, 2.0) for _ in range(40)), return_exceptions=True
            )
            assert [r for r in results if isinstance(r, BaseException)] == []
            for result in results:
                assert not isinstance(result, BaseException)
                np.testing.assert_allclose(result[1], 2 * x, rtol=1e-6)
            snap = await asyncio.wait_for(pool.wait_healed(), 60)
            assert time.monotonic() - seen < 60
            (replacement,) = snap.replacements
            assert replacement.slot == 1
            assert replacement.outcome == "replaced"
            assert replacement.reason.startswith("its backend failed: DeviceFaultError: ")
            assert replacement.seconds is not None
            assert replacement.seconds < 60
            after = pool.infos
            assert after[0] == before[0]
            assert (after[1].generation, after[1].replaced) == (1, replacement.reason)
            assert after[1].pid != before[1].pid
            assert after[1].pci_bus_id == before[1].pci_bus_id  # the GPU it left
            assert await pool.run_on(1, _who) == (1, 1, 1)
            results = await asyncio.gather(*(pool.run(_scale, x, 3.0) for _ in range(8)))
            assert sorted(index for index, _ in results) == [0, 0, 0, 0, 1, 1, 1, 1]
            for _, out in results:
                np.testing.assert_allclose(out, 3 * x, rtol=1e-6)
    finally:
        ray.shutdown()
