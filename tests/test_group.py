"""Device groups over host backends: placement, affinity, replication, moving buffers,
cancellation, closing with work in flight, telemetry and bad input (no GPU needed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio
import numpy as np
import pytest

import asyncgraph as ag

from .kernels import HOST_CLOCK_HZ, SCALE, SPIN

Array = np.ndarray[Any, Any]


@pytest.fixture
async def group() -> AsyncIterator[ag.DeviceGroup]:
    async with ag.open_group(["host", "host", "host"]) as opened:
        yield opened


def _scale(target: Any, x: Any, n: int, factor: float = 2.0) -> ag.PendingDispatch:
    return target.dispatch(  # type: ignore[no-any-return]  # a Backend or a DeviceGroup
        SCALE,
        x,
        ag.Out(n, np.float32),
        np.float32(factor),
        np.int32(n),
        grid=(n + 255) // 256,  # a CUDA block holds at most 1,024 threads
        block=min(n, 256),
    )


def _slow(target: Any, seconds: float) -> ag.PendingDispatch:
    cycles = np.int64(seconds * HOST_CLOCK_HZ)
    return target.dispatch(SPIN, cycles, ag.Out(1, np.int32), grid=1, block=1)  # type: ignore[no-any-return]  # likewise


def _counts(group: ag.DeviceGroup) -> list[int]:
    return [s.dispatches for _, s in group.snapshot().members]


async def test_a_group_has_a_backend_per_device(group: ag.DeviceGroup) -> None:
    assert len(group) == 3
    assert len({id(m) for m in group}) == 3
    assert [group.index(m) for m in group.members] == [0, 1, 2]
    assert group[1] is group.members[1]
    assert "host" in repr(group)


async def test_dispatches_without_buffers_take_turns_on_idle_members(
    group: ag.DeviceGroup, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(64).astype(np.float32)
    pending = [_scale(group, x, 64) for _ in range(9)]
    for p in pending:
        (out,) = await p
        np.testing.assert_allclose(out, 2 * x, rtol=1e-6)
    assert _counts(group) == [3, 3, 3]


async def test_a_dispatch_goes_to_the_least_busy_member(
    group: ag.DeviceGroup, rng: np.random.Generator
) -> None:
    busy = [_slow(group[0], 0.2), _slow(group[0], 0.2), _slow(group[2], 0.2)]
    assert group.place() is group[1]
    x = rng.standard_normal(32).astype(np.float32)
    (out,) = await _scale(group, x, 32)
    np.testing.assert_allclose(out, 2 * x, rtol=1e-6)
    assert _counts(group) == [2, 1, 1]
    for p in busy:
        (flag,) = await p
        assert flag[0] == 1


async def test_a_dispatch_follows_its_resident_buffers(
    group: ag.DeviceGroup, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(128).astype(np.float32)
    buffer = await group.upload(x, group[2])
    assert group.member_of(buffer) is group[2]
    for _ in range(4):
        (out,) = await _scale(group, buffer, 128, 3.0)
        np.testing.assert_allclose(out, 3 * x, rtol=1e-6)
    out_buffer = group.empty(128, np.float32, group[1])
    (written,) = await group.dispatch(
        SCALE, x, ag.Out(into=out_buffer), np.float32(5), np.int32(128), grid=1, block=128
    )
    assert written is out_buffer
    np.testing.assert_allclose(await group.download(out_buffer), 5 * x, rtol=1e-6)
    assert _counts(group) == [0, 1, 4]


async def test_a_replicated_array_is_used_where_the_dispatch_runs(
    group: ag.DeviceGroup, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(256).astype(np.float32)
    replicated = await group.replicate(x)
    assert (replicated.shape, replicated.dtype, replicated.nbytes) == (x.shape, x.dtype, x.nbytes)
    for member in group:
        copy = replicated.on(member)
        assert group.member_of(copy) is member
        np.testing.assert_array_equal(await member.download(copy), x)
    results = await asyncio.gather(*(_scale(group, replicated, 256, 4.0) for _ in range(6)))
    for (out,) in results:
        np.testing.assert_allclose(out, 4 * x, rtol=1e-6)
    assert _counts(group) == [2, 2, 2]
    await replicated.aclose()
    assert all(b is not None and b.is_closed for b in replicated.buffers)


async def test_buffers_on_two_members_are_refused_and_nothing_starts(
    group: ag.DeviceGroup, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(16).astype(np.float32)
    a = await group.upload(x, group[0])
    b = group.empty(16, np.float32, group[1])
    with pytest.raises(ag.GroupError, match=r"move one first: 'buffer = await group\.copy_to"):
        group.dispatch(SCALE, a, ag.Out(into=b), np.float32(2), np.int32(16), grid=1, block=16)
    assert _counts(group) == [0, 0, 0]
    moved = await group.copy_to(a, group[1])
    assert group.member_of(moved) is group[1]
    assert await group.copy_to(moved, group[1]) is moved
    (written,) = await group.dispatch(
        SCALE, moved, ag.Out(into=b), np.float32(2), np.int32(16), grid=1, block=16
    )
    np.testing.assert_allclose(await group.download(written), 2 * x, rtol=1e-6)


async def test_a_buffer_of_another_backend_is_stale_here(group: ag.DeviceGroup) -> None:
    async with ag.open_backend("host") as other:
        stranger = await other.upload(np.ones(8, np.float32))
        with pytest.raises(ag.StaleBufferError, match="lives on no member of this group"):
            _scale(group, stranger, 8)
        with pytest.raises(ag.GroupError, match="is not a member of this group"):
            await group.upload(np.ones(8, np.float32), other)


async def test_a_member_is_named_by_its_backend_or_its_index(
    group: ag.DeviceGroup, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(16).astype(np.float32)
    assert [group.index(i) for i in range(3)] == [0, 1, 2]
    assert group.index(np.int64(2)) == 2  # type: ignore[arg-type]  # numpy ints are taken too
    buffer = await group.upload(x, member=2)
    assert group.member_of(buffer) is group[2]
    assert group.member_of(group.empty(16, np.float32, member=1)) is group[1]
    moved = await group.copy_to(buffer, 1)
    assert group.member_of(moved) is group[1]
    np.testing.assert_array_equal(await group.download(moved), x)
    assert await group.copy_to(moved, 1) is moved
    replicated = await group.replicate(x)
    assert replicated.on(0) is replicated.on(group[0])
    await replicated.aclose()


@pytest.mark.parametrize("index", [3, -1, 5])
async def test_an_index_out_of_range_names_the_members(group: ag.DeviceGroup, index: int) -> None:
    message = rf"^member {index} is not in this group of 3 members \(0 to 2\)$"
    x = np.ones(8, np.float32)
    with pytest.raises(ag.GroupError, match=message):
        group.index(index)
    with pytest.raises(ag.GroupError, match=message):
        await group.upload(x, member=index)
    with pytest.raises(ag.GroupError, match=message):
        group.empty(8, np.float32, member=index)
    with pytest.raises(ag.GroupError, match=message):
        await group.copy_to(await group.upload(x, member=0), index)
    replicated = await group.replicate(x)
    with pytest.raises(ag.GroupError, match=message):
        replicated.on(index)
    await replicated.aclose()


async def test_what_is_not_a_member_is_refused(group: ag.DeviceGroup) -> None:
    x = np.ones(8, np.float32)
    buffer = await group.upload(x, member=0)
    with pytest.raises(
        ag.ArgumentTypeError,
        match=r"^member=True: pass a member backend \(one of group\.members\) or its index in "
        r"this group of 3 members \(0 to 2\); a bool is not an index$",
    ):
        await group.copy_to(buffer, True)
    with pytest.raises(
        ag.ArgumentTypeError,
        match=r"^member='host': pass a member backend \(one of group\.members\) or its index in "
        r"this group of 3 members \(0 to 2\)$",
    ):
        group.index("host")  # type: ignore[arg-type]  # on purpose
    async with ag.open_group(["host"]) as small:
        with pytest.raises(
            ag.GroupError, match=r"^member 1 is not in this group of 1 member \(0\)$"
        ):
            await small.upload(x, member=1)
        with pytest.raises(
            ag.GroupError,
            match=r"^<HostBackend host open .*> is not a member of this group of 1 member \(0\); "
            r"pass one of group\.members, or its index$",
        ):
            await small.copy_to(await small.upload(x), group[0])


async def test_what_is_not_a_resident_buffer_is_refused_as_download_refuses_it(
    group: ag.DeviceGroup,
) -> None:
    array = np.ones(8, np.float32)
    hint = (
        r"takes a resident buffer, got ndarray; pass one that upload\(\), empty\(\) or a "
        r"dispatch's Out\(\.\.\., resident=True\) returned"
    )
    with pytest.raises(ag.ArgumentTypeError, match=rf"^group\.download\(\) {hint}$"):
        await group.download(array)  # type: ignore[arg-type]  # on purpose
    with pytest.raises(ag.ArgumentTypeError, match=rf"^group\.member_of\(\) {hint}$"):
        group.member_of(array)  # type: ignore[arg-type]  # on purpose
    with pytest.raises(ag.ArgumentTypeError, match=rf"^group\.copy_to\(\) {hint}$"):
        await group.copy_to(array, 1)  # type: ignore[arg-type]  # on purpose
    with pytest.raises(ag.ArgumentTypeError, match=rf"^holds\(\) {hint}$"):
        group[0].holds(array)  # type: ignore[arg-type]  # on purpose
    replicated = await group.replicate(array)
    with pytest.raises(
        ag.ArgumentTypeError,
        match=r"^group\.download\(\) takes a resident buffer, got a Replicated: pass the copy "
        r"of one member, replicated\.on\(member\)$",
    ):
        await group.download(replicated)  # type: ignore[arg-type]  # on purpose
    await replicated.aclose()


async def test_cancelling_a_waiter_loses_no_dispatch(group: ag.DeviceGroup) -> None:
    pending = _slow(group, 0.05)

    async def wait() -> None:
        await pending

    task = asyncio.ensure_future(wait())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (flag,) = await pending  # the dispatch itself went on
    assert flag[0] == 1


async def test_closing_the_group_finishes_the_work_in_flight(rng: np.random.Generator) -> None:
    x = rng.standard_normal(64).astype(np.float32)
    async with ag.open_group(["host", "host"]) as group:
        pending = [_scale(group, x, 64) for _ in range(20)] + [_slow(group, 0.05)]
        members = group.members
    assert all(m.is_closed for m in members)
    for p in pending[:-1]:
        (out,) = await p
        np.testing.assert_allclose(out, 2 * x, rtol=1e-6)
    snap = [m.telemetry.snapshot() for m in members]
    assert sum(s.dispatches_completed for s in snap) == 21
    assert sum(s.dispatches_failed for s in snap) == 0
    with pytest.raises(ag.BackendClosedError):
        _scale(group, x, 64)


async def test_the_group_snapshot_adds_up_its_members(
    group: ag.DeviceGroup, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(32).astype(np.float32)
    for _ in range(5):
        await _scale(group, x, 32)
    snap = group.snapshot()
    assert [name for name, _ in snap.members] == ["host", "host", "host"]
    assert snap.dispatches == snap.dispatches_completed == 5
    assert snap.dispatches_failed == 0
    assert snap.bytes_up == sum(s.bytes_up for _, s in snap.members)
    assert (snap.in_flight, snap.queued) == (0, 0)


async def test_a_failing_dispatch_fails_on_its_member_only(group: ag.DeviceGroup) -> None:
    bad = ag.Kernel(SCALE.source, "scale", host=lambda *_: 1)  # breaks the host contract
    with pytest.raises(ag.HostFunctionError):
        await group.dispatch(
            bad,
            np.ones(4, np.float32),
            ag.Out(4, np.float32),
            np.float32(2),
            np.int32(4),
            grid=1,
            block=4,
        )
    (out,) = await _scale(group, np.ones(4, np.float32), 4)
    np.testing.assert_array_equal(out, np.full(4, 2, np.float32))
    assert group.snapshot().dispatches_failed == 1


async def test_compile_reaches_every_member(
    group: ag.DeviceGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    reached: list[int] = []
    for i, member in enumerate(group):

        async def counting(kernel: ag.Kernel, i: int = i, member: ag.Backend = member) -> None:
            reached.append(i)
            await type(member).compile(member, kernel)

        monkeypatch.setattr(member, "compile", counting)
    await group.compile(SCALE)  # the host backend has nothing to compile: it must not fail
    assert sorted(reached) == [0, 1, 2]


_PASS = r"pass 'cuda:\*' or a list of devices such as \['cuda:0', 'cuda:1'\]"


@pytest.mark.parametrize(
    ("devices", "error", "message"),
    [
        ([], ag.GroupError, r"^open_group\(\[\]\): a group needs at least one device$"),
        ("cuda", ag.GroupError, rf"^open_group\('cuda'\): {_PASS}$"),
        (None, ag.ArgumentTypeError, rf"^open_group\(None\): {_PASS} \(\['host', 'host'\] for "
         r"host backends\)$"),
        (5, ag.ArgumentTypeError, rf"^open_group\(5\): {_PASS} \(\['host', 'host'\] for host "
         r"backends\)$"),
        (b"cuda:*", ag.ArgumentTypeError, rf"^open_group\(b'cuda:\*'\): {_PASS} \(\['host', "
         r"'host'\] for host backends\)$"),
        (["host", None], ag.DeviceUnavailableError, r"^device=None is not a device asyncgraph "
         r"knows; pass 'auto', 'host', 'cuda', 'cuda:N' or an int N >= 0$"),
    ],
)  # fmt: skip
def test_bad_device_lists_are_refused(devices: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        ag.open_group(devices)


@pytest.mark.parametrize("devices", [["cuda:0", "cuda:1"], ["cuda:0", 0], [0, "host", 1]])
def test_several_cuda_backends_may_share_a_group(devices: Any) -> None:
    # Each CUDA backend makes its own context current around its driver calls, so a group
    # takes several GPUs, and one GPU twice; nothing is opened before ``async with``.
    group = ag.open_group(devices)
    assert repr(group) == "<DeviceGroup not open>"


async def test_a_group_is_used_open_and_opens_once() -> None:
    group = ag.open_group(["host"])
    with pytest.raises(ag.GroupError, match="the group is not open; use 'async with"):
        _scale(group, np.ones(4, np.float32), 4)
    async with group:
        with pytest.raises(ag.GroupError, match="a group opens once"):
            await group.open()
    with pytest.raises(ag.GroupError, match="a group opens once"):
        await group.open()


async def test_a_device_that_cannot_open_leaves_nothing_open() -> None:
    with pytest.raises(ag.DeviceUnavailableError):
        async with ag.open_group(["host", "tpu:0"]):
            pass  # never reached


def test_a_group_runs_under_trio(rng: np.random.Generator) -> None:
    pytest.importorskip("trio")
    x = rng.standard_normal(64).astype(np.float32)
    seen: list[Array] = []

    async def main() -> None:
        async with ag.open_group(["host", "host"]) as group:
            replicated = await group.replicate(x)
            async with anyio.create_task_group() as tasks:
                for _ in range(4):

                    async def one() -> None:
                        (out,) = await _scale(group, replicated, 64, 3.0)
                        seen.append(out)

                    tasks.start_soon(one)
            assert _counts(group) == [2, 2]

    anyio.run(main, backend="trio")
    assert len(seen) == 4
    for out in seen:
        np.testing.assert_allclose(out, 3 * x, rtol=1e-6)


@pytest.mark.cuda
async def test_a_gpu_and_a_host_backend_share_the_work(rng: np.random.Generator) -> None:
    x = rng.standard_normal(4096).astype(np.float32)
    async with ag.open_group(["cuda", "host"]) as group:
        replicated = await group.replicate(x)
        assert [b and b.backend_name for b in replicated.buffers] == ["cuda:0", "host"]
        results = await asyncio.gather(*(_scale(group, replicated, 4096, 1.5) for _ in range(6)))
        for (out,) in results:
            np.testing.assert_allclose(out, 1.5 * x, rtol=1e-6)
        assert sum(_counts(group)) == 6
        assert min(_counts(group)) >= 1
        moved = await group.copy_to(replicated.on(group[1]), group[0])
        np.testing.assert_array_equal(await group.download(moved), x)
