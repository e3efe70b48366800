"""asyncgraph.ray over a Ray cluster of several nodes (``ray.cluster_utils.Cluster``, on this
machine): the pool says which node each actor runs on, and a node that leaves is told as one.

Host backends, a fake GPU on each node. Each test adds the nodes it needs beside the head
node, which has one GPU, and removes them when it ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

import asyncgraph as ag

from .test_ray_heal import _who

pytestmark = pytest.mark.ray

# For the first actors as for the replacement, which waits it out: long enough for an actor's
# process to start on a busy machine.
START = 15


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A Ray cluster of a head node with one fake GPU; the driver connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "num_gpus": 1, "include_dashboard": False},
    )
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]  # Ray's own, unannotated


def _alive() -> set[str]:
    import ray

    api: Any = ray  # nodes() is unannotated
    return {node["NodeID"] for node in api.nodes() if node["Alive"]}


async def test_a_pool_says_its_nodes_and_that_one_left(cluster: Any) -> None:
    from asyncgraph.ray import open_actor_pool

    node = cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    try:
        async with open_actor_pool(
            2, device="host", start_timeout=START, max_replacements=1, health_check_period=0.5
        ) as pool:
            # One GPU a node: one actor on each.
            assert {info.node_id for info in pool.infos} == _alive()
            assert [s.node_id for s in pool.snapshot().slots] == [i.node_id for i in pool.infos]
            (lost,) = [info.index for info in pool.infos if info.node_id == node.node_id]
            cluster.remove_node(node)
            node = None
            started = time.monotonic()
            while pool.snapshot().gone == 0:  # the pool has no event to wait on
                assert time.monotonic() - started < 60 + START
                await asyncio.sleep(0.05)
            first, second = pool.snapshot().replacements
            assert first.slot == lost
            assert first.reason.startswith("its process ")
            assert first.outcome == "start failed"
            assert first.error is not None
            assert first.error.startswith(
                f"StartTimeoutError: 1 of 1 actors of the pool did not start within {START} s "
                "(start_timeout): the cluster can no longer hold the pool (a node left, say), "
                "of 2 actors of 1 GPU each: its live nodes have 1 GPU on 1 node, room for 1 "
                "of them; the actors that did not start were stopped. Add nodes, or open a "
                "smaller pool"
            ), first.error
            assert second.outcome == "not replaced"
            # The actor left serves every run.
            (kept,) = pool.infos
            assert [await pool.run(_who) for _ in range(5)] == [(kept.index, 0, None)] * 5
            with pytest.raises(ag.GroupError, match=rf"^actor {lost} of the pool is gone "):
                await pool.run_on(lost, _who)
    finally:
        if node is not None:
            cluster.remove_node(node)
