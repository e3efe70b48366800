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
        slots = pool.snapshot().slots
    assert [i.index for i in infos] == [0, 1]
    (node,) = [n["NodeID"] for n in local_ray.nodes() if n["Alive"]]
    assert [i.node_id for i in infos] == [node, node]
    assert [s.node_id for s in slots] == [node, node]
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
    for bad in (0, -1.0, float("nan"), "60", True):
        with pytest.raises(
            ag.GroupError,
            match=r"^open_actor_pool\(start_timeout=.*\): pass a positive number of seconds, "
            r"or None to wait as long as it takes$",
        ):
            open_actor_pool(1, start_timeout=bad)  # type: ignore[arg-type]  # on purpose
    pool = open_actor_pool(1, device="host")
    with pytest.raises(ag.GroupError, match="the pool is not open"):
        await pool.run(_scale, np.ones(4, np.float32), 1.0)
    async with pool:
        with pytest.raises(ag.GroupError, match="actor 3 of a pool of 1"):
            await pool.run_on(3, _scale, np.ones(4, np.float32), 1.0)
        with pytest.raises(ag.GroupError, match="a pool opens once"):
            await pool.open()


async def test_a_resident_buffer_in_a_result_says_to_download_it(local_ray: Any) -> None:
    from asyncgraph.ray import open_actor_pool

    async def make(worker: Any) -> Any:
        return await worker.backend.upload(np.ones(4, np.float32))

    async def nested(worker: Any) -> Any:
        return {"out": [await worker.backend.upload(np.ones(4, np.float32))]}

    async def fine(worker: Any) -> Any:
        buffer = await worker.backend.upload(np.ones(4, np.float32))
        return await worker.backend.download(buffer)

    async with open_actor_pool(1, device="host") as pool:
        for pipeline in (make, nested):
            with pytest.raises(
                ag.NotPicklableError,
                match=r"^pipeline test_a_resident_buffer_in_a_result_says_to_download_it\.<locals>"
                r"\.(make|nested) on actor 0 sent a resident buffer out of the actor \(in its "
                r"result, say\); a resident buffer lives on its actor's backend: return 'await "
                r"worker\.backend\.download\(buffer\)' from the pipeline instead, or keep the "
                r"buffer in worker\.state$",
            ) as caught:
                await pool.run(pipeline)
            assert isinstance(caught.value, TypeError)  # what pickling raises for such objects
            cause = caught.value.__cause__
            assert isinstance(cause, ag.NotPicklableError)
            assert str(cause).startswith("a resident buffer (float32 (4,) on host) cannot be ")
        assert pool.in_flight == (0,)
        np.testing.assert_array_equal(await pool.run(fine), np.ones(4, np.float32))


async def test_a_resident_buffer_as_an_argument_is_refused(local_ray: Any) -> None:
    from asyncgraph.ray import open_actor_pool

    async with open_actor_pool(1, device="host") as pool, ag.open_backend("host") as local:
        buffer = await local.upload(np.ones(4, np.float32))
        with pytest.raises(
            ag.NotPicklableError,
            match=r"^pool\.run\(_scale, \.\.\.\) got a resident buffer among its arguments; it "
            r"lives on a backend of this process, not on the actors': pass its contents \('await "
            r"backend\.download\(buffer\)'\), and upload them inside the pipeline if need be$",
        ):
            await pool.run(_scale, buffer, 2.0)
        assert pool.in_flight == (0,)
        _, out = await pool.run(_scale, await local.download(buffer), 2.0)
        np.testing.assert_array_equal(out, np.full(4, 2, np.float32))


@pytest.mark.parametrize(
    ("size", "num_gpus", "actor_options", "message"),
    [
        (
            3, 1, {},
            r"^open_actor_pool\(3\) asks Ray for 3 actors of 1 GPU each, but its cluster has 2 "
            r"GPU on 1 node, room for 2 of them; open at most 2, ask less of each, or add nodes$",
        ),
        (
            2, 0.5, {"num_cpus": 3},
            r"^open_actor_pool\(2\) asks Ray for 2 actors of 0\.5 GPU, 3 CPU each, but its "
            r"cluster has 2 GPU, 4 CPU on 1 node, room for 1 of them; open at most 1, ask less "
            r"of each, or add nodes$",
        ),
        (
            1, 0, {"resources": {"TPU": 1}},
            r"^open_actor_pool\(1\) asks Ray for 1 actor of 1 TPU each, but its cluster has 0 "
            r"TPU on 1 node, room for none of them; ask less of each, or add nodes$",
        ),
    ],
)  # fmt: skip
async def test_a_pool_the_cluster_can_never_hold_is_refused_at_once(
    local_ray: Any, size: int, num_gpus: float, actor_options: dict[str, Any], message: str
) -> None:
    from asyncgraph.ray import open_actor_pool

    pool = open_actor_pool(size, device="host", num_gpus=num_gpus, actor_options=actor_options)
    with pytest.raises(ag.GroupError, match=message):
        await asyncio.wait_for(pool.open(), 30)  # before the check it waited forever
    assert len(pool) == 0


async def test_actors_that_do_not_start_in_time_are_stopped(local_ray: Any) -> None:
    """Another actor holds both GPUs: the pool fits the cluster, but its actor cannot start."""
    from asyncgraph.ray import open_actor_pool

    @local_ray.remote(num_gpus=2)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.remote()  # type: ignore[attr-defined]  # made by ray.remote
    assert await holder.ready.remote()
    try:
        pool = open_actor_pool(1, device="host", start_timeout=0.5)
        with pytest.raises(
            ag.StartTimeoutError,
            match=r"^1 of 1 actors of the pool did not start within 0\.5 s \(start_timeout\); "
            r"each asks for 1 GPU, and Ray reports free now: [0-9.]+ of 2 GPU\. Other actors or "
            r"tasks hold what they need, or they are slow to start; the pool's actors were "
            r"stopped\. Free the resources, open fewer actors, or give a longer start_timeout$",
        ) as caught:
            await pool.open()
        assert isinstance(caught.value, TimeoutError)
        assert len(pool) == 0
    finally:
        local_ray.kill(holder)
    # The actor that waited was stopped: were it still waiting, it would take a GPU now.
    async with open_actor_pool(2, device="host", start_timeout=20) as pool:
        assert sorted(str(i.gpu_ids[0]) for i in pool.infos) == ["0", "1"]


async def test_actors_hold_no_cpu_unless_asked(local_ray: Any) -> None:
    """An actor naming a resource (num_gpus, even 0) kept one CPU for life: five actors on the
    fixture's 4 CPUs waited the whole start_timeout. Now they ask for none unless told."""
    from asyncgraph.ray import open_actor_pool

    x = np.arange(8, dtype=np.float32)
    async with open_actor_pool(5, device="host", num_gpus=0, start_timeout=30) as pool:
        assert len(pool) == 5
        assert local_ray.available_resources().get("CPU") == 4
        results = await asyncio.gather(*(pool.run(_scale, x, 2.0) for _ in range(10)))
    assert all(np.array_equal(out, 2 * x) for _, out in results)
    # Asked for, a CPU each is counted by the fit check, and refused at once when it can't fit.
    with pytest.raises(
        ag.GroupError,
        match=r"^open_actor_pool\(5\) asks Ray for 5 actors of 1 CPU each, but its cluster has 4 "
        r"CPU on 1 node, room for 4 of them; open at most 4, ask less of each, or add nodes$",
    ):
        await open_actor_pool(5, device="host", num_gpus=0, actor_options={"num_cpus": 1}).open()


@pytest.mark.parametrize("num_gpus", [-1, True, "1", float("nan")])
def test_a_number_of_gpus_that_is_none_is_refused(num_gpus: Any) -> None:
    from asyncgraph.ray import open_actor_pool

    with pytest.raises(
        ag.GroupError,
        match=r"^open_actor_pool\(num_gpus=.+\): pass the GPUs each actor asks Ray for, a number "
        r"of 0 or more \(a fraction shares a GPU\)$",
    ):
        open_actor_pool(1, num_gpus=num_gpus)


def _plain(worker: Any, x: Any) -> Any:
    return x


async def test_a_pipeline_that_is_not_async_is_refused_before_anything_is_sent(
    local_ray: Any,
) -> None:
    from asyncgraph.ray import open_actor_pool

    with pytest.raises(ag.GroupError, match=r"^open_actor_pool\(setup=.*\): pass an async"):
        open_actor_pool(1, device="host", setup=_plain)
    async with open_actor_pool(1, device="host") as pool:
        for bad in (_plain, 5):
            with pytest.raises(
                ag.ArgumentTypeError,
                match=r"^pool\.run\(.+, \.\.\.\): a pipeline is an async function, 'async def "
                r"pipeline\(worker, \.\.\.\)', awaited on the actor's event loop; got .+$",
            ):
                await pool.run(bad, 1)  # type: ignore[arg-type]
        snap = pool.snapshot()
        assert (snap.runs_ok, snap.runs_failed, snap.in_flight) == (0, 0, 0)
        (_, out) = await pool.run(_scale, np.ones(4, np.float32), 3.0)
        assert np.array_equal(out, np.full(4, 3, np.float32))
