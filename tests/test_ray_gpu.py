"""asyncgraph.ray on a machine with two GPUs and Ray: an actor per GPU, both busy at once."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from .test_ray import _scale

pytestmark = [pytest.mark.ray, pytest.mark.cuda]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


async def test_actors_on_two_gpus_work_at_once(rng: np.random.Generator) -> None:
    import ray

    from asyncgraph._detect import probe_cuda
    from asyncgraph.ray import open_actor_pool

    gpus = len(probe_cuda().devices)
    if gpus < 2:
        pytest.skip(f"needs two GPUs, found {gpus}")
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
