"""The transitions the compiled fast path takes through their owners, on both builds of them.

The compiled core changes the front's objects only through their owners' operations: the
scheduler's ``FastDoor`` (``admit_launched``, ``withdraw``, ``complete_launched``), the resident
store's ``track_uses`` and ``untrack`` (and the readers ``is_live``, ``writer_of``,
``readers_of``, ``storage_of``), and the pending result's ``new_pending`` and ``set_outcome``.
Each is written once, in Python (``_jobs/_fast_door.py``, ``_buffers/_resident.py``,
``_jobs/_pending.py``), and compiled where the core is built (each module's ``.pxd`` declares its
types), so each has two builds of one source.

These tests run on the build this process loaded; :func:`test_the_python_build_of_the_owners
_behaves_as_the_loaded_one` runs the same scenarios in a child process on the Python source
(a copy of the package without the built modules) and compares every observation, and runs
this file and the owners' other tests there, so the compiled build cannot hide the Python one.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from asyncgraph._buffers import _resident
from asyncgraph._buffers._resident import ResidentStore, discard, track_uses, untrack
from asyncgraph._jobs._fast_door import FastDoor
from asyncgraph._jobs._job_state import JobState
from asyncgraph._jobs._pending import PendingDispatch, new_pending, set_outcome

from .needs import child_environment, owners_compiled, source_copy

ROOT = Path(__file__).resolve().parent.parent


class Use:
    """A dispatch in flight, known by its name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Buffers:
    """A fresh store of three buffers, the uses made so far, and what the store freed."""

    def __init__(self) -> None:
        self.freed: list[str] = []
        self.store = ResidentStore("test", self.freed.append)
        dtype = np.dtype(np.float32)
        self.buffers = [self.store.add(f"storage {i}", (4,), dtype) for i in range(3)]
        self.uses: dict[str, Use] = {}

    def use(self, name: str) -> Use:
        return self.uses.setdefault(name, Use(name))

    def state(self) -> list[Any]:
        """Everything the owner lets one see of the buffers."""
        seen: list[Any] = [list(self.freed), self.store.bytes_live]
        for buffer in self.buffers:
            seen.append(
                [
                    repr(buffer),  # its uses in flight counted, live or closed
                    _resident.in_use(buffer),
                    repr(_resident.writer_of(buffer)),
                    repr(_resident.readers_of(buffer)),
                    self.store.is_live(buffer),
                    _resident.storage_of(buffer),
                ]
            )
        return seen


# (operation, buffer indices, whether each is written, the use): reads, a write replacing the
# readers, uses finishing out of order, a closed buffer's last use freeing it, an idle close.
STEPS: list[tuple[str, tuple[int, ...], tuple[bool, ...], str]] = [
    ("track", (0,), (False,), "r1"),
    ("track", (0,), (False,), "r2"),
    ("track", (0, 1), (True, False), "w1"),
    ("untrack", (0,), (), "r2"),
    ("track", (1, 2), (False, True), "w2"),
    ("untrack", (0,), (), "r1"),
    ("untrack", (1,), (), "w1"),
    ("track", (2, 0, 1), (False, False, True), "w3"),
    ("close", (1,), (), ""),
    ("untrack", (0,), (), "w1"),
    ("untrack", (1,), (), "w2"),
    ("untrack", (2,), (), "w2"),
    ("untrack", (1,), (), "w3"),  # buffer 1's last use: its memory is freed now
    ("untrack", (0,), (), "w3"),
    ("untrack", (2,), (), "w3"),
    ("close", (0,), (), ""),  # idle: freed at once
]


def buffer_steps() -> list[list[Any]]:
    """The state after each of :data:`STEPS`."""
    made = Buffers()
    seen = []
    for operation, indices, writes, name in STEPS:
        chosen = [made.buffers[i] for i in indices]
        if operation == "track":
            track_uses(chosen, writes, made.use(name))
        elif operation == "untrack":
            untrack(chosen[0], made.use(name))
        else:
            discard(chosen[0])
        seen.append(made.state())
    return seen


def test_track_uses_and_untrack_order_the_uses_and_free_a_closed_buffer_at_its_last() -> None:
    seen = buffer_steps()
    # After the write w1 on buffer 0 (read by r1 and r2) and the read w1 of buffer 1:
    assert seen[2][2][1:4] == [True, "w1", "[]"]
    assert seen[2][3][1:4] == [True, "None", "[w1]"]
    # Written after two reads: all three counted in flight; the readers finish out of order,
    # and the writer is left.
    assert seen[2][2][0].endswith("3 in use>")
    assert seen[5][2][0].endswith("1 in use>")
    assert seen[5][2][2:4] == ["w1", "[]"]
    # Buffer 1 closed with uses in flight: stale at once, its memory kept until the last use.
    assert seen[8][3][0].endswith("closed>")
    assert seen[8][3][4:] == [False, "storage 1"]
    assert seen[11][0] == []
    assert seen[12][0] == ["storage 1"]
    assert seen[12][3][1:] == [False, "None", "[]", False, None]
    # Nothing left in flight; buffer 0 closed idle and freed at once.
    assert seen[-1][0] == ["storage 1", "storage 0"]
    assert [row[1] for row in seen[-1][2:]] == [False, False, False]
    assert seen[-1][4][4] is True


def failing_track() -> list[Any]:
    """A read of buffer 0, then a write of it with something that is no buffer after it: the
    second call fails, and its write on buffer 0 is taken back."""
    made = Buffers()
    track_uses([made.buffers[0]], (False,), made.use("r1"))
    stranger = cast(Any, object())
    with pytest.raises((AttributeError, TypeError)):
        track_uses([made.buffers[0], stranger], (True, False), made.use("w"))
    return made.state()


def test_a_failing_track_uses_takes_back_what_it_did() -> None:
    state = failing_track()
    assert state[2][1:4] == [True, "None", "[r1]"]  # buffer 0 as it was: read by r1 alone
    assert state[2][0].endswith("1 in use>")


# -- the pending result ---------------------------------------------------------------------------


def _outcome(pending: PendingDispatch) -> list[Any]:
    error = pending.exception()
    if error is not None:
        with pytest.raises(type(error)) as raised:
            pending.result()
        return [pending.done(), type(error).__name__, str(error), raised.value is error]
    return [pending.done(), list(pending.result()), pending.device_time]


def _fields(pending: PendingDispatch) -> dict[str, Any]:
    """Every field of *pending* (read by a test on purpose), as a string; one never set reads
    as ``None`` (the compiled build's fields start as ``None``, the Python build's slots
    unset)."""
    return {
        name: repr(getattr(pending, name, None)) if name not in ("_loop", "_traceback") else None
        for name in PendingDispatch.__slots__
        if name != "__weakref__"
    }


OUTCOMES: dict[str, Callable[[], Any]] = {
    "no results": lambda: (),
    "results": lambda: ("result",),
    "an error": lambda: ValueError("cuLaunchKernel failed"),
}


def resolved(outcome: str) -> list[Any]:
    """A pending result made by ``new_pending`` and resolved with nobody waiting."""
    loop = asyncio.new_event_loop()
    try:
        pending = new_pending(loop, 7, "scale", loop.stop)
        made = [type(pending).__name__, pending.done(), repr(pending), _fields(pending)]
        set_outcome(pending, OUTCOMES[outcome](), None)
        return [made, repr(pending), _fields(pending), _outcome(pending)]
    finally:
        loop.close()


@pytest.mark.parametrize("outcome", list(OUTCOMES))
def test_new_pending_makes_what_the_constructor_makes_and_set_outcome_resolves_it(
    outcome: str,
) -> None:
    made, after_repr, after, result = resolved(outcome)
    loop = asyncio.new_event_loop()
    try:
        constructed = PendingDispatch(loop, 7, "scale", loop.stop)
        assert made == ["PendingDispatch", False, repr(constructed), _fields(constructed)]
    finally:
        loop.close()
    assert made[3]["_spin"] != "None"
    assert after["_spin"] == "None"  # resolved: no more spinning
    failed = outcome == "an error"
    assert after_repr == f"<PendingDispatch #7 scale {'failed' if failed else 'done'}>"
    if failed:
        assert result == [True, "ValueError", "cuLaunchKernel failed", True]
    else:
        assert result == [True, list(OUTCOMES[outcome]()), None]


def awaited() -> list[Any]:
    """A pending result that a task awaits and a callback waits on, then resolved."""
    loop = asyncio.new_event_loop()
    seen: list[Any] = []
    try:
        pending = new_pending(loop, 8, "scale")
        pending.add_done_callback(lambda p: seen.append(["callback", p.done()]))

        async def wait() -> None:
            seen.append(["awaited", list(await pending)])

        async def main() -> None:
            task = loop.create_task(wait())
            await asyncio.sleep(0)  # the task waits now
            set_outcome(pending, ("done",), 0.5)
            await task
            await asyncio.sleep(0)

        loop.run_until_complete(main())
        return [sorted(seen), pending.device_time, _fields(pending)]
    finally:
        loop.close()


def test_set_outcome_wakes_whoever_waits() -> None:
    seen, device_time, fields = awaited()
    assert seen == [["awaited", ["done"]], ["callback", True]]
    assert device_time == 0.5
    assert (fields["_waiters"], fields["_callbacks"]) == ("None", "None")


# -- the scheduler's door -------------------------------------------------------------------------


class Job:
    """A job as the door sees one: its number, state and outcome."""

    def __init__(self, job_id: int) -> None:
        self.id = job_id
        self.state = JobState.QUEUED
        self.outcome: tuple[Any, ...] | BaseException | None = None


# (operation, job, what waits in the queue or parked): two admitted, one taken back, one
# completed while nothing waits, one refused while a job is queued and then while one is
# parked, then completed with an error; a withdrawal of a job never admitted.
DOOR_STEPS: list[tuple[str, int, str]] = [
    ("admit", 1, ""),
    ("admit", 2, ""),
    ("withdraw", 2, ""),
    ("complete", 1, ""),
    ("admit", 3, ""),
    ("complete", 3, "queued"),
    ("complete", 3, "parked"),
    ("complete", 3, ""),
    ("withdraw", 4, ""),
]


def door_steps() -> list[list[Any]]:
    """Each of :data:`DOOR_STEPS` on a fresh ``FastDoor``: what it returned, the jobs in
    flight, and each job's state and outcome after it."""
    door = FastDoor({}, {}, [], 4)
    jobs = {i: Job(i) for i in (1, 2, 3, 4)}
    error = ValueError("failed")
    seen: list[Any] = []
    for operation, i, waiting in DOOR_STEPS:
        door.queue.clear()
        door.parked.clear()
        if waiting == "queued":
            door.queue[0] = cast(Any, "a queued job")
        elif waiting == "parked":
            door.parked.append(cast(Any, "a parked job"))
        returned: bool | None = None
        if operation == "admit":
            door.admit_launched(jobs[i])
        elif operation == "withdraw":
            door.withdraw(jobs[i])
        else:
            returned = door.complete_launched(jobs[i], error if i == 3 else (i,))
        seen.append(
            [
                returned,
                list(door.in_flight),
                [[job.state.value, repr(job.outcome)] for job in jobs.values()],
            ]
        )
    return seen


def test_the_fast_door_admits_takes_back_and_completes_unless_something_waits() -> None:
    seen = door_steps()
    returned = [step[0] for step in seen]
    assert returned == [None, None, None, True, None, False, False, True, None]
    assert [step[1] for step in seen] == [[1], [1, 2], [1], [], [3], [3], [3], [], []]
    assert seen[0][2][0] == ["launched", "None"]
    assert seen[6][2][2] == ["launched", "None"]  # refused twice: nothing changed
    assert seen[-1][2][0] == ["done", "(1,)"]
    assert seen[-1][2][2] == ["done", "ValueError('failed')"]
    assert seen[-1][2][3] == ["queued", "None"]  # withdrawn without ever being admitted


# -- the two builds -------------------------------------------------------------------------------


def observe() -> dict[str, Any]:
    """Every scenario above, as JSON: what :func:`test_the_python_build_of_the_owners_behaves_as
    _the_loaded_one` compares between the two builds."""
    return {
        "compiled": owners_compiled(),
        "buffers": buffer_steps(),
        "failing track": failing_track(),
        "resolved": {outcome: resolved(outcome) for outcome in OUTCOMES},
        "awaited": awaited(),
        "door": door_steps(),
    }


CHILD = """
import json
from tests.test_owners import observe
print(json.dumps(observe()))
"""
# The owners' tests, beside this file's (on the Python core: the compiled one is not there).
OWNER_TESTS = (
    "tests/test_owners.py",
    "tests/test_resident.py",
    "tests/test_scheduler.py",
    "tests/test_dispatcher.py",
    "tests/test_jobs.py",
    "tests/test_fast_path.py",
    "tests/test_fast_replays.py",
)


@pytest.mark.skipif(not owners_compiled(), reason="the owners run as Python here already")
def test_the_python_build_of_the_owners_behaves_as_the_loaded_one(tmp_path: Path) -> None:
    source = source_copy(tmp_path)
    env = child_environment(source)
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = json.loads(json.dumps(observe()))
    assert theirs.pop("compiled") is False  # the child ran the Python source
    ours.pop("compiled")
    assert theirs == ours


@pytest.mark.skipif(not owners_compiled(), reason="the owners run as Python here already")
def test_the_owners_tests_pass_on_their_python_build(tmp_path: Path) -> None:
    source = source_copy(tmp_path)
    env = child_environment(source) | {"ASYNCGRAPH_CORE": "python"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *OWNER_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout.splitlines()[-1]
