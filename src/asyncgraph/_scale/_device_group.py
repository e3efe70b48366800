"""Several devices as one: a group of backends on one event loop (``open_group``).

A group opens one backend per device on the caller's loop and places each dispatch itself:

- on the member holding the dispatch's resident buffers (all of them must live on one member;
  :meth:`DeviceGroup.copy_to` moves a buffer to another), a :class:`Replicated` array counting
  as present everywhere;
- else on the member with the fewest dispatches in flight or queued, equal ones taking turns.

The group knows its members only through the public :class:`~asyncgraph.Backend` API, plus two
predicates the backends expose for it (``outstanding`` and ``holds``). A member's failure is its
own: a device fault fails the work of that member; the group places no more work there (nor on
a closed member), a dispatch on buffers that lived there fails with its error, and the others
go on. The group refuses work only when no member is left.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import numpy as np

from asyncgraph._args._arguments import kind_for
from asyncgraph._args._checks import check_upload
from asyncgraph._buffers._resident import ResidentBuffer
from asyncgraph._front._backend import Backend
from asyncgraph._front._options import BackendOptions, resolve_options
from asyncgraph._opening._open import group_devices, open_backend
from asyncgraph._runtime._exceptions import (
    ArgumentTypeError,
    BackendClosedError,
    GroupError,
    StaleBufferError,
)
from asyncgraph._runtime._poison import process_fault
from asyncgraph._runtime._resource import AsyncResource
from asyncgraph.pool import PinnedPool

from ._replicated import GroupSnapshot, Replicated, check_group_buffer, each_member

if TYPE_CHECKING:
    from asyncgraph._args._kernel import Kernel
    from asyncgraph._jobs._pending import PendingDispatch

__all__ = ("DeviceGroup", "GroupSnapshot", "Replicated", "open_group")


def _out_why(member: Backend) -> str | None:
    """Why *member* takes no work (its device fault, or closed), or ``None``."""
    if member.failure is not None:
        return f"failed: {member.failure}"
    if member.is_closed:
        return "closed"
    return None


def open_group(
    devices: str | Sequence[str | int],
    *,
    options: BackendOptions | None = None,
    **option_kwargs: Any,
) -> DeviceGroup:
    """A group of backends, one per device, opened by ``async with``.

    Args:
        devices: ``"cuda:*"`` (every CUDA device), or a list of what ``open_backend`` takes
            (``["cuda:0", "cuda:1"]``; ``["host", "host"]``, for tests).
        options: the :class:`BackendOptions` of every member.
        **option_kwargs: or its fields as keywords; not both.

    Returns:
        The group, not yet open: ``async with asyncgraph.open_group("cuda:*") as group:``.

    A device may be named twice (two backends of one GPU, each with its own streams).

    Raises:
        ArgumentTypeError: *devices* is neither ``"cuda:*"`` nor a list.
        GroupError: no devices, or a string other than ``"cuda:*"``.
        DeviceUnavailableError: no CUDA device for ``"cuda:*"``, or one open_backend refuses.
        ArgumentTypeError: both *options* and keywords were given, *options* is not a
            :class:`BackendOptions`, or a keyword is no field of it.
        DispatchError: an option's value is wrong.
    """
    opts = resolve_options("open_group", options, option_kwargs)
    return DeviceGroup(group_devices(devices), opts)


class DeviceGroup(AsyncResource):
    """Backends on one event loop, one per device, with dispatches placed among them.

    Made by :func:`open_group`; open it with ``async with`` (or :meth:`open`). Indexing and
    iterating give the member backends.
    """

    def __init__(self, devices: list[str | int], options: BackendOptions) -> None:
        self._devices = devices
        self._options = options
        self._members: tuple[Backend, ...] = ()
        self._turn = 0  # where the search for the least busy member starts
        self._routes: tuple[tuple[int, int, str], ...] = ()  # how copies go between members
        self._closed = False
        # One pinned pool for every member, its cap counted once, unless the options give one.
        self._pinned: PinnedPool | None = None

    # -- opening and closing ---------------------------------------------------------------

    async def open(self) -> DeviceGroup:
        """Open a backend per device on the running loop (once).

        Raises:
            GroupError: the group was opened or closed before.
            DeviceUnavailableError: a device cannot be opened; those opened are closed again.
        """
        if self._members or self._closed:
            raise GroupError("a group opens once; make another with open_group()")
        options = self._options
        if options.host_pool is None:
            self._pinned = PinnedPool(options.pinned_pool_bytes)
            options = attrs.evolve(options, host_pool=self._pinned)
        members: list[Backend] = []
        try:
            for device in self._devices:
                members.append(open_backend(device, options=options))
        except BaseException:
            for member in members:
                await member.aclose()
            await self._close_pool(members)
            raise
        self._members = tuple(members)
        # Between GPUs, each member's access to the others' memory is set up now, once per
        # pair (it can take a while; a first copy would pay it otherwise), and kept for the
        # snapshot.
        self._routes = tuple(
            (i, j, a.copy_route(b))
            for i, a in enumerate(members)
            for j, b in enumerate(members)
            if i != j
        )
        return self

    @property
    def pinned_pool(self) -> PinnedPool | None:
        """The pinned host pool the members share (its cap counted once for the group), or
        ``None`` when the options gave the members a pool of their own choosing."""
        return self._pinned

    async def _close_pool(self, members: Sequence[Backend]) -> None:
        pool, self._pinned = self._pinned, None
        if pool is None:
            return
        if any(m.failure is not None for m in members):
            pool.abandon()  # a failed member's frees would fail: ``pool._abandon``
        else:
            pool.close()
        await anyio.to_thread.run_sync(lambda: PinnedPool.wait_freed().result())

    async def aclose(self, timeout: float | None = None) -> None:  # noqa: ASYNC109  # passed on to each member's aclose
        """Close every member at once; each finishes its work in flight first (see
        :meth:`Backend.aclose <asyncgraph.Backend.aclose>`). Idempotent."""
        self._closed = True
        async with anyio.create_task_group() as tasks:
            for member in self._members:
                tasks.start_soon(member.aclose, timeout)
        await self._close_pool(self._members)

    async def __aenter__(self) -> DeviceGroup:
        return await self.open()

    # -- members ---------------------------------------------------------------------------

    @property
    def members(self) -> tuple[Backend, ...]:
        """The member backends, in the order their devices were given."""
        return self._open_members()

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._open_members())

    def __getitem__(self, index: int) -> Backend:
        return self._open_members()[index]

    def index(self, member: Backend | int) -> int:
        """*member*'s position in the group (a member backend, or its index: checked).

        Raises:
            GroupError: it is not a member, or an index out of range.
            ArgumentTypeError: neither a backend nor an int (a bool is not an index).
        """
        target = self._member(member)
        return next(i for i, candidate in enumerate(self._members) if candidate is target)

    def _member(self, member: Backend | int) -> Backend:
        """The member that *member* names: a member backend, or its index in the group."""
        members = self._open_members()
        n = len(members)
        allowed = (
            f"this group of {n} members (0 to {n - 1})" if n > 1 else "this group of 1 member (0)"
        )
        if isinstance(member, Backend):
            if any(candidate is member for candidate in members):
                return member
            raise GroupError(
                f"{member!r} is not a member of {allowed}; pass one of group.members, or its index"
            )
        if isinstance(member, int | np.integer) and not isinstance(member, bool):
            if 0 <= member < n:
                return members[member]
            raise GroupError(f"member {member} is not in {allowed}")
        raise ArgumentTypeError(
            f"member={member!r}: pass a member backend (one of group.members) or its index in "
            f"{allowed}{'; a bool is not an index' if isinstance(member, bool) else ''}"
        )

    def member_of(self, buffer: ResidentBuffer) -> Backend:
        """The member *buffer* lives on.

        Raises:
            StaleBufferError: no member holds it (another backend's, or closed with its member).
            ArgumentTypeError: *buffer* is not a resident buffer.
        """
        return self._holder(buffer, "group.member_of()")

    def _holder(self, buffer: ResidentBuffer, where: str) -> Backend:
        check_group_buffer(buffer, where)
        for member in self._open_members():
            if member.holds(buffer):
                return member
        raise StaleBufferError(
            f"{buffer!r} lives on no member of this group; upload it with group.upload() or "
            "group.replicate()"
        )

    def _open_members(self) -> tuple[Backend, ...]:
        if not self._members:
            if self._closed:
                raise BackendClosedError("the group is closed")
            raise GroupError(
                "the group is not open; use 'async with asyncgraph.open_group(...) as group:'"
            )
        return self._members

    def __repr__(self) -> str:
        names = ", ".join(m.name for m in self._members) or "not open"
        return f"<DeviceGroup {names}{' closed' if self._closed else ''}>"

    # -- placing dispatches ----------------------------------------------------------------

    def place(self, *args: object) -> Backend:
        """The member a dispatch of *args* goes to: the one holding its resident buffers, else
        the one with the fewest dispatches in flight or queued among those that neither
        failed nor were closed.

        Raises:
            GroupError: its resident buffers live on different members, or no member can take
                work (each failed or was closed; the message says which and why).
            StaleBufferError: a resident buffer lives on no member.
            DeviceFaultError: its resident buffers live on a member that failed (its error).
            BackendClosedError: the group is closed.
        """
        members = self._open_members()
        holder: Backend | None = None
        for arg in args:
            buffer = kind_for(arg).holds(arg)
            if buffer is None:
                continue
            owner = self.member_of(buffer)
            if holder is not None and owner is not holder:
                raise GroupError(
                    f"a dispatch's resident buffers live on {holder.name} (member "
                    f"{self.index(holder)}) and {owner.name} (member {self.index(owner)}); "
                    "move one first: 'buffer = await group.copy_to(buffer, member)'"
                )
            holder = owner
        if holder is not None:
            if holder.failure is not None:
                raise holder.failure  # its buffers went with its device
            return holder
        # The least busy of the members that are neither failed nor closed; equal ones take
        # turns. A failed member has nothing in flight: without this it would take everything.
        n = len(members)
        best = -1
        for k in range(n):
            i = (self._turn + k) % n
            if _out_why(members[i]) is None and (
                best < 0 or members[i].outstanding < members[best].outstanding
            ):
                best = i
        if best < 0:
            if self._closed:
                raise BackendClosedError("the group is closed")
            reasons = "; ".join(f"{m.name}: {_out_why(m)}" for m in members)
            raise GroupError(f"no member of the group can take work: {reasons}")
        self._turn = best + 1
        return members[best]

    def _resolve(self, member: Backend, args: tuple[object, ...]) -> tuple[object, ...]:
        return tuple(kind_for(arg).on_member(arg, member) for arg in args)

    def dispatch(
        self,
        kernel: Kernel,
        *args: object,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        shared_mem: int = 0,
        timing: bool = False,
        graph: str = "never",
        priority: str | None = None,
        queue_timeout: float | None = None,
    ) -> PendingDispatch:
        """:meth:`Backend.dispatch <asyncgraph.Backend.dispatch>` (its class and queue deadline
        too) on the member :meth:`place` picks; :class:`Replicated` arguments become its copy.

        Raises:
            GroupError: its resident buffers live on different members.
            Exception: whatever the member's ``dispatch`` raises.
        """
        member = self.place(*args)
        return member.dispatch(
            kernel,
            *self._resolve(member, args),
            grid=grid,
            block=block,
            shared_mem=shared_mem,
            timing=timing,
            graph=graph,
            priority=priority,
            queue_timeout=queue_timeout,
        )

    async def submit(
        self,
        kernel: Kernel,
        *args: object,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        shared_mem: int = 0,
        timing: bool = False,
        graph: str = "never",
        priority: str | None = None,
        queue_timeout: float | None = None,
    ) -> PendingDispatch:
        """:meth:`dispatch`, waiting for room as :meth:`Backend.submit` does."""
        member = self.place(*args)
        return await member.submit(
            kernel,
            *self._resolve(member, args),
            grid=grid,
            block=block,
            shared_mem=shared_mem,
            timing=timing,
            graph=graph,
            priority=priority,
            queue_timeout=queue_timeout,
        )

    async def compile(self, kernel: Kernel) -> None:
        """Compile and load *kernel* at once on every member that neither failed nor was closed
        (the members :meth:`dispatch` may place it on).

        Every member must be able to run it, since a dispatch may go to any of them: a kernel
        without ``host=`` in a group with host members raises their ``UnsupportedError``.

        Raises:
            ArgumentTypeError: *kernel* is not an :class:`asyncgraph.Kernel`.
            GroupError: no member can take work.
            Exception: what a member's ``compile`` raised (``CompileError``,
                ``UnsupportedError``...): the first member's if several did, with notes naming
                each, as :meth:`replicate` raises it.
        """
        members = self._open_members()
        live = [i for i, m in enumerate(members) if _out_why(m) is None]
        if not live:
            self.place()  # raises, saying why each member cannot take work
        await each_member("compile()", members, live, lambda i: members[i].compile(kernel))

    # -- resident buffers ------------------------------------------------------------------

    async def replicate(self, array: np.ndarray[Any, Any]) -> Replicated:
        """Copy *array* to every member that neither failed nor was closed: uploaded once, to
        the first of them, and copied from there on the devices (``Backend.copy``) to the
        members of its kind; members of another kind upload it too.

        Raises:
            DispatchError: *array* is not what ``upload`` takes (checked before any copy).
            GroupError: no member can take work.
            Exception: what a member's ``upload`` or ``copy`` raised (the first member's if
                several did, with notes naming each); the copies made are freed first.
        """
        check_upload(array, "replicate()")
        members = self._open_members()
        live = [i for i, m in enumerate(members) if _out_why(m) is None]
        if not live:
            self.place()  # raises, saying why each member cannot take work
        buffers: list[ResidentBuffer | None] = [None] * len(members)
        origin = members[live[0]]

        async def one(i: int) -> None:
            member = members[i]
            source = buffers[live[0]]
            if source is not None and member.kind == origin.kind:
                buffers[i] = await origin.copy(source, to=member)
            else:
                buffers[i] = await member.upload(array)

        try:
            await each_member("replicate()", members, live[:1], one)
            await each_member("replicate()", members, live[1:], one)
        except BaseException:
            with anyio.CancelScope(shield=True):
                for buffer in buffers:
                    if buffer is not None:
                        await buffer.aclose()
            raise
        return Replicated(self, tuple(buffers))

    async def upload(
        self, array: np.ndarray[Any, Any], member: Backend | int | None = None
    ) -> ResidentBuffer:
        """Upload *array* to *member* (a member backend or its index), or to the least busy one.

        Raises:
            GroupError: *member* is not a member, or an index out of range.
            Exception: what the member's ``upload`` raises.
        """
        target = self.place() if member is None else self._member(member)
        return await target.upload(array)

    def empty(
        self, shape: int | tuple[int, ...], dtype: object, member: Backend | int | None = None
    ) -> ResidentBuffer:
        """An uninitialised buffer on *member* (a member backend or its index), or the least busy.

        Raises:
            GroupError: *member* is not a member, or an index out of range.
            Exception: what the member's ``empty`` raises.
        """
        target = self.place() if member is None else self._member(member)
        return target.empty(shape, dtype)

    async def download(
        self, buffer: ResidentBuffer, out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        """Download *buffer* from the member it lives on.

        Raises:
            StaleBufferError: *buffer* lives on no member.
            ArgumentTypeError: *buffer* is not a resident buffer (of a :class:`Replicated`,
                pass one member's copy: ``replicated.on(member)``).
            Exception: what the member's ``download`` raises.
        """
        return await self._holder(buffer, "group.download()").download(buffer, out)

    async def copy_to(self, buffer: ResidentBuffer, member: Backend | int) -> ResidentBuffer:
        """A copy of *buffer* on *member*, a member backend or its index (the same buffer if it
        lives there already).

        :meth:`Backend.copy <asyncgraph.Backend.copy>` from the member it lives on: it reads
        what the dispatches in flight that write *buffer* wrote, on the devices between CUDA
        members (peer to peer between GPUs that allow it), else through host memory.

        Raises:
            GroupError: *member* is not a member, or an index out of range.
            StaleBufferError: *buffer* lives on no member.
            ArgumentTypeError: *buffer* is not a resident buffer.
        """
        owner = self._holder(buffer, "group.copy_to()")
        target = self._member(member)
        if owner is target:
            return buffer
        return await owner.copy(buffer, to=target)

    # -- telemetry -------------------------------------------------------------------------

    def snapshot(self) -> GroupSnapshot:
        """Each member's telemetry snapshot, and the group's totals."""
        members = self._open_members()
        snaps = [(m.name, m.telemetry.snapshot()) for m in members]
        return GroupSnapshot(
            members=tuple(snaps),
            failed=tuple(
                (i, m.name, why) for i, m in enumerate(members) if (why := _out_why(m)) is not None
            ),
            dispatches=sum(s.dispatches for _, s in snaps),
            dispatches_completed=sum(s.dispatches_completed for _, s in snaps),
            dispatches_failed=sum(s.dispatches_failed for _, s in snaps),
            in_flight=sum(s.in_flight for _, s in snaps),
            queued=sum(s.queued for _, s in snaps),
            bytes_up=sum(s.bytes_up for _, s in snaps),
            bytes_down=sum(s.bytes_down for _, s in snaps),
            copy_routes=self._routes,
            process_fault=process_fault(),
        )
