"""What a device group hands out besides its members (replicated arrays, its snapshot), and
how its calls on every member report a member's error."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import anyio
import attrs

from asyncgraph._args._arg_kinds import REPLICATED
from asyncgraph._args._arguments import register_kind
from asyncgraph._buffers._resident import ResidentBuffer, check_buffer
from asyncgraph._runtime._exceptions import (
    ArgumentTypeError,
    BackendClosedError,
    DeviceFaultError,
    GroupError,
)

if TYPE_CHECKING:
    from asyncgraph._front._backend import Backend
    from asyncgraph._runtime._poison import ProcessFault
    from asyncgraph._runtime._telemetry import TelemetrySnapshot

__all__ = (
    "GroupSnapshot",
    "Members",
    "Replicated",
    "check_group_buffer",
    "each_member",
    "first_failure",
)


class Members(Protocol):
    """What a replicated array asks of its group (a :class:`~asyncgraph.DeviceGroup`)."""

    def index(self, member: Backend | int) -> int:
        """*member*'s position in the group (a member backend, or its index)."""
        ...

    def __getitem__(self, index: int) -> Backend:
        """The member at *index*."""
        ...


@attrs.frozen
class GroupSnapshot:
    """The group's telemetry: each member's snapshot, and the group's totals.

    Attributes:
        members: ``(member name, its TelemetrySnapshot)`` in member order.
        failed: ``(member index, member name, why)`` of each member that failed (its device
            fault) or was closed; the group places no work there.
        dispatches: the members' counter added up, as are ``dispatches_completed``,
            ``dispatches_failed``, ``in_flight``, ``queued``, ``bytes_up`` and ``bytes_down``.
        copy_routes: ``(from index, to index, route)`` for each ordered pair of members, as
            the group found them when it opened (``Backend.copy_route``): ``"device"``,
            ``"peer"`` (between GPUs, directly), ``"staged"`` (between GPUs, through host
            memory: peer access is impossible) or ``"host"``.
        process_fault: the sticky CUDA fault that failed every CUDA member at once
            (:func:`asyncgraph.process_fault`), or ``None``.
    """

    members: tuple[tuple[str, TelemetrySnapshot], ...]
    failed: tuple[tuple[int, str, str], ...]
    dispatches: int
    dispatches_completed: int
    dispatches_failed: int
    in_flight: int
    queued: int
    bytes_up: int
    bytes_down: int
    copy_routes: tuple[tuple[int, int, str], ...] = ()
    process_fault: ProcessFault | None = None


class Replicated:
    """One resident copy of an array on every member of a group (``group.replicate(array)``).

    Pass it to :meth:`DeviceGroup.dispatch` as a read-only argument: each dispatch uses the copy
    on the member it runs on, so a replicated array never decides where a dispatch goes.

    Attributes:
        buffers: the copies, in member order; ``None`` for a member that had failed or was
            closed when the array was replicated (dispatches are not placed there).
        shape, dtype, nbytes: the array's.
    """

    __slots__ = ("_group", "buffers", "dtype", "nbytes", "shape")

    def __init__(self, group: Members, buffers: tuple[ResidentBuffer | None, ...]) -> None:
        self._group = group
        self.buffers = buffers
        first = next(b for b in buffers if b is not None)
        self.shape = first.shape
        self.dtype = first.dtype
        self.nbytes = first.nbytes

    def on(self, member: Backend | int) -> ResidentBuffer:
        """The copy on *member* (a member backend, or its index in the group).

        Raises:
            GroupError: *member* is not a member of the group (or an index out of range), or
                has no copy (it had failed or was closed when the array was replicated).
        """
        index = self._group.index(member)
        buffer = self.buffers[index]
        if buffer is None:
            raise GroupError(
                f"{self._group[index].name} (member {index}) has no copy of this replicated "
                "array: it had failed or was closed when the array was replicated"
            )
        return buffer

    async def aclose(self) -> None:
        """Free every copy (a failed member's copy goes with its member)."""
        for buffer in self.buffers:
            if buffer is not None and not buffer.is_closed:
                with contextlib.suppress(DeviceFaultError, BackendClosedError):
                    await buffer.aclose()

    def __repr__(self) -> str:
        return f"<Replicated {self.dtype} {self.shape} on {len(self.buffers)} members>"


register_kind(Replicated, REPLICATED)  # refused by a backend; a group passes each member its copy


def first_failure(
    where: str, failures: list[tuple[int, Exception]], members: Sequence[Backend]
) -> Exception:
    """Of the members' errors in one call of the group's (*where*), the one to raise: the first
    member's, in member order, with a note saying where it came from and one per other error.
    """
    ordered = sorted(failures, key=lambda failure: failure[0])
    index, first = ordered[0]
    first.add_note(f"{where}: raised by member {index} ({members[index].name})")
    for i, other in ordered[1:]:
        first.add_note(f"{where}: member {i} ({members[i].name}) failed too: {other!r}")
    return first


async def each_member(
    where: str,
    members: Sequence[Backend],
    indices: Sequence[int],
    fn: Callable[[int], Awaitable[object]],
) -> None:
    """Await ``fn(i)`` for each member index in *indices* at once (the group's call *where*).

    The first error cancels the others; it is raised alone, as :func:`first_failure` makes it
    (the first member's, with notes), not inside an ``ExceptionGroup``. A cancellation from
    outside is raised as it came.
    """
    failures: list[tuple[int, Exception]] = []

    async def one(i: int) -> None:
        try:
            await fn(i)
        except Exception as exc:
            failures.append((i, exc))
            raise

    try:
        async with anyio.create_task_group() as tasks:
            for i in indices:
                tasks.start_soon(one, i)
    except BaseExceptionGroup as group:
        if failures and not group.split(Exception)[1]:
            raise first_failure(where, failures, members) from None
        raise


def check_group_buffer(value: object, where: str) -> None:
    """Raise unless *value* is a resident buffer, saying what to pass for a :class:`Replicated`.

    Raises:
        ArgumentTypeError: it is something else.
    """
    if isinstance(value, Replicated):
        raise ArgumentTypeError(
            f"{where} takes a resident buffer, got a Replicated: pass the copy of one member, "
            "replicated.on(member)"
        )
    check_buffer(value, where)
