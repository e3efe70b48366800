"""asyncgraph.ray's health check: an actor alive but useless is taken out and replaced.

On a local Ray with two fake GPUs and host backends, as in ``test_ray.py``. A pipeline that
blocks its actor's event loop (a synchronous ``time.sleep`` in an async function) stands for a
kernel that never ends or a deadlock: the actor's process lives, and no run's error says
anything. Short health-check periods keep the tests fast.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
import structlog

import asyncgraph as ag

from .test_ray import local_ray as local_ray  # the same local Ray, started per module
from .test_ray_heal import _events, _fault, _setup, _who
from .test_ray_heal import stand_in_env as stand_in_env

pytestmark = pytest.mark.ray

# A short period keeps the tests fast; the timeout is long enough that a healthy actor on a
# busy machine (2 shared cores) answers within it: 3 s was once too short there.
PERIOD = 0.5
TIMEOUT = 10.0
HUNG = "it did not answer a health check in 10 s"


async def _block(worker: Any, seconds: float) -> None:
    """Blocks the actor's event loop (the hung kernel, the deadlock)."""
    time.sleep(seconds)  # noqa: ASYNC251  # on purpose: the loop must not turn


async def _wait(worker: Any, seconds: float) -> str:
    """A slow run that leaves the actor's loop free."""
    await asyncio.sleep(seconds)
    return "done"


async def _until(condition: Callable[[], bool], seconds: float = 60.0) -> float:
    """Poll *condition* until it holds; the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > seconds:
            raise AssertionError(f"not so after {seconds} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_a_hung_actor_is_taken_out_and_replaced(local_ray: Any) -> None:
    from ray.exceptions import ActorDiedError

    from asyncgraph.ray import open_actor_pool

    with structlog.testing.capture_logs() as logs:
        async with open_actor_pool(
            2,
            device="host",
            setup=_setup,
            health_check_period=PERIOD,
            health_check_timeout=TIMEOUT,
        ) as pool:
            assert await pool.broadcast(_who) == [(0, 0, 0), (1, 0, 0)]
            old_pid = pool.infos[1].pid
            sent = time.monotonic()
            hung = asyncio.ensure_future(pool.run_on(1, _block, 600))
            behind = asyncio.ensure_future(pool.run_on(1, _wait, 0.1))  # queued on its loop
            await _until(lambda: pool.snapshot().slots[1].state != "live")
            out_after = time.monotonic() - sent
            assert out_after <= PERIOD + TIMEOUT + 1, out_after
            # From that moment no run goes to the hung actor: all of these succeed.
            results = await asyncio.gather(*(pool.run(_who) for _ in range(40)))
            assert (1, 0, 0) not in results
            assert set(results) <= {(0, 0, 0), (1, 1, 1)}
            # The runs in flight on it fail once it is stopped, saying why it was.
            for run in (hung, behind):
                with pytest.raises(ActorDiedError) as caught:
                    await asyncio.wait_for(run, 30)
                assert caught.value.__notes__ == [
                    f"actor 1 of the pool was taken out and stopped: {HUNG}"
                ]
            snap = await asyncio.wait_for(pool.wait_healed(), 60)
            assert (snap.live, snap.replacing, snap.gone) == (2, 0, 0)
            (replacement,) = snap.replacements
            assert (replacement.slot, replacement.generation) == (1, 1)
            assert (replacement.reason, replacement.outcome) == (HUNG, "replaced")
            assert replacement.runs_lost == 2
            assert replacement.detected_after is not None
            # At least the timeout (uvloop's timers may fire a millisecond early), at most the
            # bound.
            assert TIMEOUT - 0.01 <= replacement.detected_after <= PERIOD + TIMEOUT + 1
            info = pool.infos[1]
            assert (info.index, info.generation, info.replaced) == (1, 1, HUNG)
            assert info.pid != old_pid
            assert await pool.run_on(1, _who) == (1, 1, 1)  # the setup ran again
            after = await asyncio.gather(*(pool.run(_who) for _ in range(40)))
            assert sorted(set(after)) == [(0, 0, 0), (1, 1, 1)]
    (event,) = _events(logs, "pool.actor_replaced")
    assert (event["slot"], event["generation"], event["reason"]) == (1, 1, HUNG)


async def test_a_slow_run_that_leaves_the_loop_free_is_not_hung(local_ray: Any) -> None:
    """The probe asks the actor's loop, not its runs: a run awaiting longer than the timeout
    answers for its actor."""
    from asyncgraph.ray import open_actor_pool

    async with open_actor_pool(
        1, device="host", health_check_period=0.2, health_check_timeout=2.0
    ) as pool:
        assert await pool.run(_wait, 5.0) == "done"
        snap = pool.snapshot()
        assert (snap.replacements, snap.runs_ok) == ((), 1)


async def test_with_no_health_check_a_blocked_loop_is_waited_for(local_ray: Any) -> None:
    from asyncgraph.ray import open_actor_pool

    async with open_actor_pool(1, device="host", health_check_period=None) as pool:
        await pool.run(_block, 1.5)
        assert pool.snapshot().replacements == ()
    async with open_actor_pool(1, device="host", health_check_timeout=None) as pool:
        await pool.run(_block, 1.5)
        assert pool.snapshot().replacements == ()


async def test_a_dead_actor_is_seen_with_no_run(local_ray: Any) -> None:
    """Its process killed from outside, the actor is replaced before any run is sent."""
    from asyncgraph.ray import open_actor_pool

    async with open_actor_pool(2, device="host", health_check_period=PERIOD) as pool:
        os.kill(pool.infos[1].pid, signal.SIGKILL)
        await _until(lambda: pool.snapshot().replacements != ())
        snap = await asyncio.wait_for(pool.wait_healed(), 60)
        (replacement,) = snap.replacements
        assert replacement.reason.startswith("its process ")
        assert (replacement.outcome, replacement.runs_lost) == ("replaced", 0)
        assert snap.runs_failed == 0
        assert await pool.run_on(1, _who) == (1, 1, None)


async def test_a_fault_a_pipeline_hid_is_seen_with_no_run(
    local_ray: Any, stand_in_env: dict[str, str]
) -> None:
    """A pipeline catches its backend's fault and returns: the health check finds it."""
    from asyncgraph.ray import open_actor_pool

    async def hide(worker: Any) -> str:
        try:
            await _fault(worker)
        except ag.DeviceFaultError:
            return "hidden"
        return "no fault"

    options = {"runtime_env": {"env_vars": stand_in_env}}
    async with open_actor_pool(
        2, device="cuda", actor_options=options, health_check_period=PERIOD
    ) as pool:
        assert await pool.run_on(1, hide) == "hidden"
        await _until(lambda: pool.snapshot().replacements != ())
        snap = await asyncio.wait_for(pool.wait_healed(), 60)
        (replacement,) = snap.replacements
        assert replacement.reason.startswith("its backend failed: DeviceFaultError: ")
        assert "CUDA_ERROR_ILLEGAL_ADDRESS" in replacement.reason
        assert (replacement.outcome, replacement.runs_lost) == ("replaced", 0)
        assert snap.runs_ok == 1
        assert await pool.run_on(1, _who) == (1, 1, None)


@pytest.mark.parametrize("name", ["health_check_period", "health_check_timeout"])
def test_bad_health_check_arguments_are_refused(name: str) -> None:
    from asyncgraph.ray import open_actor_pool

    def pool(seconds: Any) -> Any:
        return open_actor_pool(1, **{name: seconds})

    for bad in ("10", True, [1.0]):
        with pytest.raises(
            ag.ArgumentTypeError,
            match=rf"^open_actor_pool\({name}=.+\): pass a number of seconds \(a float or an "
            r"int\), or None to turn the health check off; got (str|bool|list)$",
        ) as wrong_type:
            pool(bad)
        assert isinstance(wrong_type.value, TypeError)
    for value in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(
            ag.GroupError,
            match=rf"^open_actor_pool\({name}=.+\): pass a positive, finite number of seconds, "
            r"or None to turn the health check off$",
        ) as wrong_value:
            pool(value)
        assert isinstance(wrong_value.value, ValueError)
    pool(None)
    pool(1)
