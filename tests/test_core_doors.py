"""The compiled core's C copies of the front's doors (``cuda/core/_doors.pxi``) against their
Python originals: the scheduler's ``FastDoor`` (``admit_launched``, ``withdraw``,
``complete_launched``), the resident store's ``track_uses`` and ``untrack`` (and the readers
``is_live``, ``writer_of``, ``readers_of``, ``storage_of``), and the pending result's
``PendingDispatch.__init__`` (``new_pending``) and ``set_outcome``.

The C copies are ``cdef inline`` functions; the compiled core lends them to these tests alone as
Python functions of their originals' parameters (``_doors_for_tests``). Each test runs one
sequence of operations twice, on fresh objects, through the originals and through the copies,
and compares the state they leave after every step, read through the owners' public predicates
(``in_use``, ``writer_of``, ``readers_of``, ``is_live``, the buffer's ``repr``, what the store
freed; ``done()``, ``result()``, ``exception()`` of a pending result, and its slots).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, cast

import numpy as np
import pytest

from asyncgraph.buffers import _resident
from asyncgraph.buffers._resident import ResidentBuffer, ResidentStore, discard
from asyncgraph.jobs import _pending
from asyncgraph.jobs._pending import PendingDispatch
from asyncgraph.jobs._scheduler import FastDoor, JobState

from .needs import compiled_core

Doors = dict[str, Callable[..., Any]]


class _Job:
    """A job of the general path, as the Python doors see one: what they read and write."""

    def __init__(self, job_id: int, state: JobState) -> None:
        self.id = job_id
        self.state = state


def _python_fast_job(job_id: int, state: JobState) -> _Job:
    return _Job(job_id, state)


PYTHON: Doors = {
    "FastJob": _python_fast_job,
    "admit_launched": lambda door, job: door.admit_launched(job),
    "withdraw": lambda door, job: door.withdraw(job),
    "complete_launched": lambda door, job, outcome: door.complete_launched(job, outcome),
    "track_uses": _resident.track_uses,
    "untrack": _resident.untrack,
    "is_live": lambda store, buffer: store.is_live(buffer),
    "writer_of": _resident.writer_of,
    "readers_of": _resident.readers_of,
    "storage_of": _resident.storage_of,
    "PendingDispatch": PendingDispatch,
    "set_outcome": _pending.set_outcome,
}


@pytest.fixture(scope="module")
def compiled() -> Doors:
    core: ModuleType = compiled_core()
    doors: Doors = core._doors_for_tests()
    assert doors.keys() == PYTHON.keys()
    return doors


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
        """Everything the owner lets one see of the buffers, read by the Python originals."""
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

    def read_by(self, doors: Doors) -> list[Any]:
        """What *doors*' readers say of each buffer."""
        return [
            [
                doors["is_live"](self.store, buffer),
                repr(doors["writer_of"](buffer)),
                repr(doors["readers_of"](buffer)),
                doors["storage_of"](buffer),
            ]
            for buffer in self.buffers
        ]


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


def _run(doors: Doors) -> Iterator[tuple[list[Any], list[Any]]]:
    """Each step of :data:`STEPS` through *doors*: the state after it, and what the readers of
    *doors* said of it."""
    made = Buffers()
    for operation, indices, writes, name in STEPS:
        chosen = [made.buffers[i] for i in indices]
        if operation == "track":
            doors["track_uses"](chosen, writes, made.use(name))
        elif operation == "untrack":
            doors["untrack"](chosen[0], made.use(name))
        else:
            discard(chosen[0])
        yield made.state(), made.read_by(doors)


def test_track_uses_and_untrack_leave_the_same_state_as_the_originals(compiled: Doors) -> None:
    python, copies = list(_run(PYTHON)), list(_run(compiled))
    assert len(python) == len(copies) == len(STEPS)
    for step, (ours, theirs) in enumerate(zip(python, copies, strict=True)):
        assert ours[0] == theirs[0], f"after step {step}: {STEPS[step]}"
        # The copies' readers say what the originals' say, on the copies' objects.
        assert theirs[1] == [[row[4], row[2], row[3], row[5]] for row in theirs[0][2:]]
    assert python[-1][0][0] == ["storage 1", "storage 0"]  # the check is not vacuous
    assert python[8][0][3][0].endswith("closed>")


def test_a_copy_that_differs_is_caught() -> None:
    def forgets_the_reader(buffer: ResidentBuffer, use: Use) -> None:
        if _resident.writer_of(buffer) is use:
            _resident.untrack(buffer, use)  # a reader stays recorded, and counted in use

    wrong = PYTHON | {"untrack": forgets_the_reader}
    differ = [
        step
        for step, (ours, theirs) in enumerate(zip(_run(PYTHON), _run(wrong), strict=True))
        if ours[0] != theirs[0]
    ]
    assert differ[0] == 3  # the first reader untracked


def _failing_track(doors: Doors) -> tuple[list[Any], str]:
    """A write on buffer 0 (read by r1) and a read of a buffer whose readers are broken: the
    second fails, and the first must be taken back."""
    made = Buffers()
    doors["track_uses"]([made.buffers[0]], (False,), made.use("r1"))
    broken: ResidentBuffer = made.buffers[1]
    broken._readers = ()  # type: ignore[assignment]  # no list: appending to it fails
    with pytest.raises((AttributeError, TypeError)) as raised:
        doors["track_uses"]([made.buffers[0], broken], (True, False), made.use("w"))
    return made.state(), raised.type.__name__


def test_a_failing_track_uses_takes_back_what_it_did_like_the_original(compiled: Doors) -> None:
    ours, raised_here = _failing_track(PYTHON)
    theirs, raised_there = _failing_track(compiled)
    assert ours == theirs
    assert ours[2][1:4] == [True, "None", "[r1]"]  # buffer 0 as it was: read by r1 alone
    # The error differs by type (the original appends, the copy asks for a list first).
    assert (raised_here, raised_there) == ("AttributeError", "TypeError")


# -- the pending result ---------------------------------------------------------------------------

_SLOTS = [name for name in PendingDispatch.__slots__ if name != "__weakref__"]
_UNSET = "<unset>"


def _slots(pending: PendingDispatch) -> dict[str, Any]:
    """Every slot of *pending* (read by a test on purpose), errors as their type and message."""
    seen: dict[str, Any] = {}
    for name in _SLOTS:
        value = getattr(pending, name, _UNSET)
        if isinstance(value, BaseException):
            value = (type(value).__name__, str(value))
        elif name == "_traceback" and value is not _UNSET:
            value = "a traceback" if value is not None else None
        seen[name] = value
    return seen


def _outcome(pending: PendingDispatch) -> list[Any]:
    error = pending.exception()
    if error is not None:
        with pytest.raises(type(error)) as raised:
            pending.result()
        return [pending.done(), type(error).__name__, str(error), raised.value is error]
    return [pending.done(), pending.result(), pending.device_time]


def _resolve(doors: Doors, outcome: Callable[[], Any]) -> list[Any]:
    """A pending result made and resolved with nobody waiting: its slots made, then after."""
    loop = asyncio.new_event_loop()
    try:
        spin = loop.stop  # any callable: set on the pending result, cleared when resolved
        pending = doors["PendingDispatch"](loop, 7, "scale", spin)
        assert type(pending) is PendingDispatch
        made = _slots(pending)
        assert made["_loop"] is loop
        assert made["_spin"] == spin
        made = made | {"_loop": "loop", "_spin": "spin"}
        doors["set_outcome"](pending, outcome(), None)
        return [made, repr(pending), _slots(pending) | {"_loop": "loop"}, _outcome(pending)]
    finally:
        loop.close()


@pytest.mark.parametrize(
    "outcome",
    [lambda: (), lambda: ("result",), lambda: RuntimeError("cuLaunchKernel failed")],
    ids=["no results", "results", "an error"],
)
def test_new_pending_and_set_outcome_leave_the_same_state_as_the_originals(
    compiled: Doors, outcome: Callable[[], Any]
) -> None:
    ours, theirs = _resolve(PYTHON, outcome), _resolve(compiled, outcome)
    assert ours == theirs
    made, _repr, after, _result = ours
    assert (made["_state"], made["_traceback"], made["dispatch_id"]) == (0, _UNSET, 7)
    assert after["_state"] in (1, 2)
    assert after["_spin"] is None


def _awaited(doors: Doors) -> list[Any]:
    """A pending result that a task awaits and a callback waits on: the copy calls the
    original then, which wakes them."""
    loop = asyncio.new_event_loop()
    seen: list[Any] = []
    try:
        pending = doors["PendingDispatch"](loop, 8, "scale")
        pending.add_done_callback(lambda p: seen.append(("callback", p.done())))

        async def wait() -> None:
            seen.append(("awaited", await pending))

        async def main() -> None:
            task = loop.create_task(wait())
            await asyncio.sleep(0)  # the task waits now
            doors["set_outcome"](pending, ("done",), None)
            await task
            await asyncio.sleep(0)

        loop.run_until_complete(main())
        return [seen, _slots(pending) | {"_loop": "loop"}]
    finally:
        loop.close()


def test_set_outcome_wakes_whoever_waits_like_the_original(compiled: Doors) -> None:
    ours, theirs = _awaited(PYTHON), _awaited(compiled)
    assert ours == theirs
    assert sorted(ours[0]) == [("awaited", ("done",)), ("callback", True)]


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


def _doors_run(doors: Doors) -> list[Any]:
    """Each of :data:`DOOR_STEPS` through *doors* on a fresh ``FastDoor``: what it returned,
    the jobs in flight, and each job's state and outcome after it."""
    door = FastDoor({}, {}, [], 4)
    jobs = {i: doors["FastJob"](i, JobState.QUEUED) for i in (1, 2, 3, 4)}
    error = ValueError("failed")
    seen: list[Any] = []
    for operation, i, waiting in DOOR_STEPS:
        door.queue.clear()
        door.parked.clear()
        if waiting == "queued":
            door.queue[0] = cast(Any, "a queued job")
        elif waiting == "parked":
            door.parked.append(cast(Any, "a parked job"))
        if operation == "admit":
            returned = doors["admit_launched"](door, jobs[i])
        elif operation == "withdraw":
            returned = doors["withdraw"](door, jobs[i])
        else:
            returned = doors["complete_launched"](door, jobs[i], error if i == 3 else (i,))
        seen.append(
            [
                returned,
                list(door.in_flight),
                [(job.state, repr(getattr(job, "outcome", None))) for job in jobs.values()],
            ]
        )
    return seen


def test_the_fast_doors_leave_the_same_state_as_the_originals(compiled: Doors) -> None:
    ours, theirs = _doors_run(PYTHON), _doors_run(compiled)
    assert ours == theirs
    assert [returned for returned, _, _ in ours] == [
        None,
        None,
        None,
        True,
        None,
        False,
        False,
        True,
        None,
    ]
    in_flight_after = [flying for _, flying, _ in ours]
    assert in_flight_after == [[1], [1, 2], [1], [], [3], [3], [3], [], []]
    assert ours[-1][2][0] == (JobState.DONE, "(1,)")
    assert ours[-1][2][2] == (JobState.DONE, "ValueError('failed')")
