"""asyncgraph.ray: a pool of Ray actors with a backend each, on a local Ray with two fake GPUs.

The actors open host backends here (no GPU needed); Ray still gives each a GPU id of its own and
sets its ``CUDA_VISIBLE_DEVICES``, which is what places them on real GPUs. The pipelines are
defined inside the tests, so Ray ships them by value to the actors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag

pytestmark = pytest.mark.ray

SCALE_SOURCE = r"""
extern "C" __global__ void scale(const float* x, float* out, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i];
}
"""


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """A local Ray instance that pretends to have two GPUs."""
    import ray

    ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


async def _scale(worker: Any, x: Any, factor: float) -> tuple[int, Any]:
    """A pipeline: one dispatch on the actor's backend; the actor's index and the result."""
    import numpy as np

    import asyncgraph as ag

    def host(x: Any, out: Any, a: Any, n: Any) -> None:
        out[:] = a * x

    kernel = worker.state.get("scale")
    if kernel is None:
        kernel = worker.state["scale"] = ag.Kernel(SCALE_SOURCE, "scale", host=host)
    n = int(np.prod(x.shape))  # x: a numpy array or a resident buffer
    (out,) = await worker.backend.dispatch(
        kernel, x, ag.Out(x.shape, x.dtype), np.float32(factor), np.int32(n),
        grid=(n + 255) // 256, block=256,
    )  # fmt: skip
    return worker.index, out


async def test_each_actor_gets_its_own_gpu(local_ray: Any) -> None:
    from asyncgraph.ray import open_actor_pool

    async with open_actor_pool(2, device="host") as pool:
        infos = pool.infos
    assert [i.index for i in infos] == [0, 1]
    assert len({i.pid for i in infos}) == 2
    assert sorted(str(i.gpu_ids[0]) for i in infos) == ["0", "1"]
    assert sorted(str(i.cuda_visible_devices) for i in infos) == ["0", "1"]
    assert all(i.backend == "host" for i in infos)
    assert all(i.pci_bus_id is None for i in infos)


async def test_runs_spread_over_the_actors_and_compute_right(
    local_ray: Any, rng: np.random.Generator
) -> None:
    from asyncgraph.ray import open_actor_pool

    x = rng.standard_normal(1000).astype(np.float32)
    async with open_actor_pool(2, device="host") as pool:
        results = await asyncio.gather(*(pool.run(_scale, x, 3.0) for _ in range(8)))
        assert pool.in_flight == (0, 0)
    for _, out in results:
        np.testing.assert_allclose(out, 3 * x, rtol=1e-6)
    assert sorted(index for index, _ in results) == [0, 0, 0, 0, 1, 1, 1, 1]


async def test_each_actor_keeps_its_own_resident_state(
    local_ray: Any, rng: np.random.Generator
) -> None:
    from asyncgraph.ray import open_actor_pool

    weights = rng.standard_normal(256).astype(np.float32)

    async def load(worker: Any, w: Any) -> str:
        worker.state["w"] = await worker.backend.upload(w * (worker.index + 1))
        return str(worker.backend.name)

    async def use(worker: Any, factor: float) -> Any:
        _, out = await _scale(worker, worker.state["w"], factor)
        return out

    async with open_actor_pool(2, device="host") as pool:
        assert await pool.broadcast(load, weights) == ["host", "host"]
        for index in (0, 1):
            out = await pool.run_on(index, use, 2.0)
            np.testing.assert_allclose(out, 2 * (index + 1) * weights, rtol=1e-6)


async def test_a_failing_pipeline_fails_its_run_only(local_ray: Any) -> None:
    from asyncgraph.ray import open_actor_pool

    async def broken(worker: Any) -> None:
        raise ValueError("no such weights")

    async def fine(worker: Any) -> int:
        return int(worker.index)

    async with open_actor_pool(1, device="host") as pool:
        with pytest.raises(ValueError, match="no such weights"):
            await pool.run(broken)
        assert await pool.run(fine) == 0


async def test_a_cancelled_caller_leaves_its_run_going(local_ray: Any) -> None:
    from asyncgraph.ray import open_actor_pool

    async def slow(worker: Any) -> None:
        await asyncio.sleep(0.3)
        worker.state["done"] = worker.state.get("done", 0) + 1

    async def count(worker: Any) -> int:
        return int(worker.state.get("done", 0))

    async with open_actor_pool(1, device="host") as pool:
        caller = asyncio.ensure_future(pool.run(slow))
        await asyncio.sleep(0.1)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert pool.in_flight == (1,)  # still counted: the run goes on
        while pool.in_flight != (0,):  # noqa: ASYNC110  # the pool's counter has no event to wait on
            await asyncio.sleep(0.02)
        assert await pool.run(count) == 1


async def test_closing_lets_the_runs_in_flight_finish(
    local_ray: Any, rng: np.random.Generator
) -> None:
    from asyncgraph.ray import open_actor_pool

    x = rng.standard_normal(64).astype(np.float32)
    pool = await open_actor_pool(2, device="host").open()
    runs = [asyncio.ensure_future(pool.run(_scale, x, 2.0)) for _ in range(6)]
    await asyncio.sleep(0)  # the runs are sent
    await pool.aclose()
    for run in runs:
        _, out = await run
        np.testing.assert_allclose(out, 2 * x, rtol=1e-6)
    with pytest.raises(ag.BackendClosedError, match="closing"):
        await pool.run(_scale, x, 2.0)
    await pool.aclose()  # idempotent


async def test_bad_use_of_a_pool_is_refused(local_ray: Any) -> None:
    from asyncgraph.ray import open_actor_pool

    with pytest.raises(ag.GroupError, match="a positive number of actors"):
        open_actor_pool(0)
    pool = open_actor_pool(1, device="host")
    with pytest.raises(ag.GroupError, match="the pool is not open"):
        await pool.run(_scale, np.ones(4, np.float32), 1.0)
    async with pool:
        with pytest.raises(ag.GroupError, match="actor 3 of a pool of 1"):
            await pool.run_on(3, _scale, np.ones(4, np.float32), 1.0)
        with pytest.raises(ag.GroupError, match="a pool opens once"):
            await pool.open()
