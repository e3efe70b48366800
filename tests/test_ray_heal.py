"""asyncgraph.ray heals: a failed actor is taken out, replaced, set up, and the runs go on.

On a local Ray with two fake GPUs, as in ``test_ray.py``. Two failures are planted: a pipeline
that ends its actor's process (``os._exit``), and a real device fault on the stand-in CUDA
driver (``tests/fake_driver``), loaded into the actors' processes through Ray's
``runtime_env``. The pipelines are defined in this module or inside the tests; Ray ships them
to the actors.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import MutableMapping
from typing import Any

import numpy as np
import pytest
import structlog

import asyncgraph as ag

from .fake_driver import build, environment
from .test_ray import _scale
from .test_ray import local_ray as local_ray  # the same local Ray, started per module

pytestmark = pytest.mark.ray

DIED = "its process died: ActorDiedError: The actor died unexpectedly before finishing this task."


@pytest.fixture(scope="module")
def stand_in_env() -> dict[str, str]:
    """The environment variables that make an actor's process load the stand-in driver."""
    try:
        directory = build()
    except RuntimeError as exc:  # no C compiler
        pytest.skip(str(exc))
    env = environment(directory, os.environ.get("ASYNCGRAPH_CORE") or "compiled")
    return {
        name: env[name] for name in ("LD_LIBRARY_PATH", "ASYNCGRAPH_CORE", "FAKE_CUDA_COMPLETE")
    }


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


async def _setup(worker: Any) -> None:
    """The pool's setup: notes the generation it ran on in the actor's state."""
    worker.state["set up as"] = worker.generation


async def _who(worker: Any) -> tuple[int, int, Any]:
    """The actor's slot, its generation, and the generation its setup ran on."""
    return worker.index, worker.generation, worker.state.get("set up as")


async def _die(worker: Any) -> None:
    """Ends the actor's process."""
    os._exit(1)


async def _slow(worker: Any) -> None:
    await asyncio.sleep(0.5)


async def _fault(worker: Any, hide: bool = False) -> None:
    """A device fault on the stand-in (an illegal address on the next event), raised as it
    comes, or (*hide*) behind a ValueError."""
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    lib.fake_fail_next_events.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.fake_fail_next_events(1, 700)
    x = np.ones(256, np.float32)
    try:
        await _scale(worker, x, 2.0)
    except ag.DeviceFaultError as exc:
        if hide:
            raise ValueError("the pipeline's own words for it") from exc
        raise


async def _slow_scale(worker: Any) -> Any:
    """A run in flight on the actor when it faults: it dispatches after the fault."""
    await asyncio.sleep(0.5)
    return await _scale(worker, np.ones(256, np.float32), 2.0)


def _events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


async def _forty_runs(pool: Any, x: np.ndarray[Any, Any]) -> list[int]:
    """40 runs at once, each computing right; the slot each ran on."""
    results = await asyncio.gather(*(pool.run(_scale, x, 3.0) for _ in range(40)))
    for _, out in results:
        np.testing.assert_allclose(out, 3 * x, rtol=1e-6)
    return [index for index, _ in results]


async def test_a_dead_process_is_replaced_and_the_runs_go_on(
    local_ray: Any, rng: np.random.Generator
) -> None:
    from ray.exceptions import ActorDiedError

    from asyncgraph.ray import open_actor_pool

    x = rng.standard_normal(1000).astype(np.float32)

    async def broken(worker: Any) -> None:
        raise ValueError("no such weights")

    with structlog.testing.capture_logs() as logs:
        async with open_actor_pool(2, device="host", setup=_setup) as pool:
            assert await pool.broadcast(_who) == [(0, 0, 0), (1, 0, 0)]
            with pytest.raises(ValueError, match="no such weights"):
                await pool.run_on(1, broken)
            assert pool.snapshot().replacements == ()  # a run's own failure is its own
            old_pid = pool.infos[1].pid
            in_flight = [asyncio.ensure_future(pool.run_on(1, _slow)) for _ in range(3)]
            await asyncio.sleep(0.1)
            with pytest.raises(ActorDiedError):
                await pool.run_on(1, _die)
            # The runs in flight on the actor fail with its error; from now on, none goes there.
            for run in in_flight:
                with pytest.raises(ActorDiedError):
                    await run
            snap = pool.snapshot()
            assert [s.state for s in snap.slots] == ["live", "replacing"]
            assert snap.slots[1].why == DIED
            assert [info.index for info in pool.infos] == [0]
            assert "1 live, 1 replacing, 0 gone" in repr(pool)
            await _forty_runs(pool, x)  # none fails: none goes to the failed actor
            snap = await asyncio.wait_for(pool.wait_healed(), 60)
            assert (snap.live, snap.replacing, snap.gone) == (2, 0, 0)
            (replacement,) = snap.replacements
            assert replacement.slot == 1
            assert replacement.generation == 1
            assert replacement.reason == DIED
            assert replacement.outcome == "replaced"
            assert replacement.runs_lost == 4  # _die and the three in flight beside it
            assert replacement.detected_after is not None
            assert replacement.seconds is not None
            assert 0 < replacement.seconds < 60
            assert replacement.error is None
            assert snap.runs_failed == 5  # those four and broken's
            assert snap.replacements_left == 7
            info = pool.infos[1]
            assert (info.index, info.generation, info.replaced) == (1, 1, DIED)
            assert info.pid != old_pid
            assert str(info.gpu_ids[0]) in ("0", "1")
            # The setup ran on the replacement before any run.
            assert await pool.run_on(1, _who) == (1, 1, 1)
            assert sorted(set(await _forty_runs(pool, x))) == [0, 1]
            assert "2 live, 0 replacing, 0 gone" in repr(pool)
    (event,) = _events(logs, "pool.actor_replaced")
    assert event["log_level"] == "info"
    assert (event["slot"], event["generation"], event["reason"]) == (1, 1, DIED)
    assert event["seconds"] == replacement.seconds
    assert _events(logs, "pool.actor_lost") == []


@pytest.mark.parametrize("hide", [False, True], ids=["raised", "hidden"])
async def test_a_failed_backend_is_replaced(
    local_ray: Any, stand_in_env: dict[str, str], rng: np.random.Generator, hide: bool
) -> None:
    """A real DeviceFaultError, on the stand-in driver in the actor's process: raised by the
    pipeline, or hidden behind another error (the actor tells from its backend)."""
    from asyncgraph.ray import open_actor_pool

    x = rng.standard_normal(1000).astype(np.float32)
    options = {"runtime_env": {"env_vars": stand_in_env}}
    with structlog.testing.capture_logs() as logs:
        async with open_actor_pool(2, device="cuda", setup=_setup, actor_options=options) as pool:
            assert [info.backend for info in pool.infos] == ["cuda:0", "cuda:0"]
            assert all(info.pci_bus_id for info in pool.infos)
            in_flight = asyncio.ensure_future(pool.run_on(1, _slow_scale))
            await asyncio.sleep(0.1)
            with pytest.raises(ag.DeviceFaultError) as caught:
                await pool.run_on(1, _fault, hide)
            assert not isinstance(caught.value, ValueError)
            if hide:
                assert "the pipeline raised ValueError: the pipeline's own words" in str(
                    caught.value
                )
            with pytest.raises(ag.DeviceFaultError):
                await in_flight  # in flight on the failed backend: it fails with its error
            await _forty_runs(pool, x)
            snap = await asyncio.wait_for(pool.wait_healed(), 60)
            (replacement,) = snap.replacements
            assert replacement.slot == 1
            assert replacement.reason.startswith("its backend failed: DeviceFaultError: ")
            assert "CUDA_ERROR_ILLEGAL_ADDRESS" in replacement.reason
            assert replacement.outcome == "replaced"
            assert replacement.runs_lost == 2
            assert snap.runs_failed == 2
            assert pool.infos[1].generation == 1
            assert pool.infos[1].replaced == replacement.reason
            assert await pool.run_on(1, _who) == (1, 1, 1)
            assert sorted(set(await _forty_runs(pool, x))) == [0, 1]
    assert len(_events(logs, "pool.actor_replaced")) == 1


async def test_past_max_replacements_the_pool_stays_smaller(
    local_ray: Any, rng: np.random.Generator
) -> None:
    from ray.exceptions import ActorDiedError

    from asyncgraph.ray import open_actor_pool

    x = rng.standard_normal(100).astype(np.float32)
    with structlog.testing.capture_logs() as logs:
        async with open_actor_pool(2, device="host", max_replacements=0) as pool:
            with pytest.raises(ActorDiedError):
                await pool.run_on(1, _die)
            snap = await pool.wait_healed()
            assert (snap.live, snap.replacing, snap.gone) == (1, 0, 1)
            assert snap.replacements_left == 0
            assert snap.max_replacements == 0
            (replacement,) = snap.replacements
            assert (replacement.slot, replacement.outcome, replacement.reason) == (
                1, "not replaced", DIED,
            )  # fmt: skip
            assert replacement.seconds is None
            assert [s.state for s in snap.slots] == ["live", "gone"]
            assert len(pool) == 1
            assert [info.index for info in pool.infos] == [0]
            assert "1 live, 0 replacing, 1 gone" in repr(pool)
            assert set(await _forty_runs(pool, x)) == {0}  # the survivor takes every run
            assert await pool.broadcast(_who) == [(0, 0, None)]
            with pytest.raises(
                ag.GroupError,
                match=r"^actor 1 of the pool is gone \(its process died: ActorDiedError: .*\), "
                r"and max_replacements \(0\) is spent; run on another actor \(pool\.run\), or "
                r"open a new pool with a larger max_replacements$",
            ):
                await pool.run_on(1, _who)
            with pytest.raises(ActorDiedError):
                await pool.run_on(0, _die)
            with pytest.raises(
                ag.GroupError,
                match=r"^the pool has no live actor left, and max_replacements \(0\) is spent "
                r"\(actor 0: its process died: .*; actor 1: its process died: .*\); open a new "
                r"pool, with a larger max_replacements if need be$",
            ):
                await pool.run(_who)
            with pytest.raises(ag.GroupError, match="no live actor left"):
                await pool.broadcast(_who)
            assert len(pool) == 0
    lost = _events(logs, "pool.actor_lost")
    assert [(e["slot"], e["log_level"], e["max_replacements"]) for e in lost] == [
        (1, "warning", 0),
        (0, "warning", 0),
    ]
    assert [e["live"] for e in lost] == [1, 0]
    assert _events(logs, "pool.actor_replaced") == []


async def test_a_replacement_that_fails_to_start_counts_and_runs_wait(local_ray: Any) -> None:
    """A pool of one: while its actor is replaced, runs wait; the first replacement's setup
    fails (it counts against max_replacements), the second serves them."""
    from ray.exceptions import ActorDiedError

    from asyncgraph.ray import open_actor_pool

    async def setup(worker: Any) -> None:
        if worker.generation == 1:
            raise ValueError("no weights for generation 1")
        worker.state["set up as"] = worker.generation

    with structlog.testing.capture_logs() as logs:
        async with open_actor_pool(1, device="host", setup=setup, max_replacements=2) as pool:
            with pytest.raises(ActorDiedError):
                await pool.run(_die)
            waiting = [asyncio.ensure_future(pool.run(_who)) for _ in range(5)]
            results = await asyncio.wait_for(asyncio.gather(*waiting), 60)
            assert results == [(0, 2, 2)] * 5
            snap = pool.snapshot()
            assert snap.waiting == 0
            assert snap.replacements_left == 0
            first, second = snap.replacements
            assert (first.generation, first.outcome, first.reason) == (1, "start failed", DIED)
            assert first.error is not None
            assert first.error.startswith("ValueError: no weights for generation 1")
            assert (second.generation, second.outcome) == (2, "replaced")
            assert second.reason == f"its replacement did not start: {first.error}"
            assert second.detected_after is None
            assert second.seconds is not None
            assert pool.infos[0].generation == 2
    assert [e["generation"] for e in _events(logs, "pool.replacement_failed")] == [1]
    assert [e["generation"] for e in _events(logs, "pool.actor_replaced")] == [2]


async def test_a_cancelled_waiting_run_leaves_the_line(local_ray: Any) -> None:
    from ray.exceptions import ActorDiedError

    from asyncgraph.ray import open_actor_pool

    async def slow_setup(worker: Any) -> None:
        if worker.generation:
            await asyncio.sleep(1.5)

    async with open_actor_pool(1, device="host", setup=slow_setup) as pool:
        with pytest.raises(ActorDiedError):
            await pool.run(_die)
        waiter = asyncio.ensure_future(pool.run(_who))
        await asyncio.sleep(0.2)
        assert pool.snapshot().waiting == 1
        assert "0 live, 1 replacing, 0 gone | runs: 0 in flight, 1 waiting" in repr(pool)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert pool.snapshot().waiting == 0
        assert await asyncio.wait_for(pool.run(_who), 60) == (0, 1, None)
        assert pool.snapshot().runs_ok == 1  # the cancelled run was never sent


async def test_closing_while_a_replacement_starts_stops_it(local_ray: Any) -> None:
    from ray.exceptions import ActorDiedError

    from asyncgraph.ray import open_actor_pool

    async def stuck_setup(worker: Any) -> None:
        if worker.generation:
            await asyncio.sleep(60)

    pool = await open_actor_pool(1, device="host", setup=stuck_setup).open()
    with pytest.raises(ActorDiedError):
        await pool.run(_die)
    waiter = asyncio.ensure_future(pool.run(_who))
    await asyncio.sleep(0.5)
    started = time.monotonic()
    await asyncio.wait_for(pool.aclose(), 30)
    assert time.monotonic() - started < 30
    with pytest.raises(ag.BackendClosedError, match="closing"):
        await waiter
    snap = pool.snapshot()
    assert [r.outcome for r in snap.replacements] == ["cancelled"]
    assert [s.state for s in snap.slots] == ["gone"]
    await pool.aclose()  # idempotent
    # The replacement was stopped: were it still starting, it would hold a GPU now.
    async with open_actor_pool(2, device="host", start_timeout=20) as again:
        assert sorted(str(i.gpu_ids[0]) for i in again.infos) == ["0", "1"]


async def test_bad_healing_arguments_are_refused() -> None:
    from asyncgraph.ray import open_actor_pool

    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(
            ag.GroupError,
            match=r"^open_actor_pool\(max_replacements=.*\): pass a whole number of "
            r"replacements, 0 or more \(0: never replace an actor\), or None for no bound$",
        ):
            open_actor_pool(1, max_replacements=bad)  # type: ignore[arg-type]  # on purpose
    with pytest.raises(
        ag.GroupError,
        match=r"^open_actor_pool\(setup='load'\): pass an async function that takes the "
        r"worker \('async def setup\(worker\)'\), or None$",
    ):
        open_actor_pool(1, setup="load")  # type: ignore[arg-type]  # on purpose
    open_actor_pool(1, max_replacements=None)
    open_actor_pool(1, max_replacements=0)
    snap = open_actor_pool(2, max_replacements=3).snapshot()
    assert (snap.size, snap.live, snap.replacements_left, snap.slots) == (2, 0, 3, ())


def test_the_ray_module_exports_what_it_defines() -> None:
    import asyncgraph.ray as agray

    assert isinstance(agray.__all__, tuple)
    assert list(agray.__all__) == sorted(set(agray.__all__))
    assert [name for name in agray.__all__ if not hasattr(agray, name)] == []
    for name in ("PoolSnapshot", "Replacement", "SlotSnapshot", "ActorInfo", "Worker"):
        assert name in agray.__all__
