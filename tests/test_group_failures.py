"""A member that failed or was closed takes no more of the group's work; the others go on.

On host backends a member is taken out by closing it; a real device fault of a CUDA member
beside a host one runs against the stand-in driver (``tests/fake_driver/group_scenario.py``),
so it runs without a GPU too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import numpy as np
import pytest

import asyncgraph as ag
from tests.fake_driver import run_scenario

from .kernels import SCALE

N = 256


@pytest.fixture
async def group() -> AsyncIterator[ag.DeviceGroup]:
    async with ag.open_group(["host", "host", "host"]) as g:
        yield g


def _scale(group: ag.DeviceGroup, x: object) -> ag.PendingDispatch:
    return group.dispatch(
        SCALE, x, ag.Out(N, np.float32), np.float32(2), np.int32(N), grid=1, block=N
    )


async def test_a_member_that_closed_gets_no_more_work(
    group: ag.DeviceGroup, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(N, dtype=np.float32)
    await group[1].aclose()
    for _ in range(30):
        (out,) = await _scale(group, x)
        np.testing.assert_array_equal(out, 2 * x)
    counts = [m.telemetry.snapshot().dispatches for m in group]
    assert counts[1] == 0
    assert counts[0] + counts[2] == 30
    assert min(counts[0], counts[2]) >= 10  # the others still take turns
    assert group.snapshot().failed == ((1, "host", "closed"),)


async def test_the_group_refuses_work_only_when_no_member_is_left(
    group: ag.DeviceGroup, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(N, dtype=np.float32)
    await group[0].aclose()
    await group[2].aclose()
    (out,) = await _scale(group, x)  # member 1 is left
    np.testing.assert_array_equal(out, 2 * x)
    await group[1].aclose()
    with pytest.raises(ag.GroupError, match=r"no member of the group can take work: host: closed"):
        _scale(group, x)
    with pytest.raises(ag.GroupError, match="no member"):
        await group.replicate(x)
    assert [i for i, _, _ in group.snapshot().failed] == [0, 1, 2]


async def test_a_replicated_array_skips_a_member_that_was_out(
    group: ag.DeviceGroup, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(N, dtype=np.float32)
    await group[2].aclose()
    replicated = await group.replicate(x)
    assert replicated.buffers[2] is None
    assert [b is not None for b in replicated.buffers] == [True, True, False]
    with pytest.raises(
        ag.GroupError,
        match=r"^host \(member 2\) has no copy of this replicated array: it had failed or was "
        r"closed when the array was replicated$",
    ):
        replicated.on(group[2])  # as docs/scale-out.md says
    for _ in range(6):
        (out,) = await _scale(group, replicated)
        np.testing.assert_array_equal(out, 2 * x)
    await replicated.aclose()
    assert all(b is None or b.is_closed for b in replicated.buffers)


@pytest.mark.parametrize(
    ("array", "error", "message"),
    [
        (
            "not an array", ag.ArgumentTypeError,
            r"^replicate\(\) takes a numpy array, got str; pass np\.asarray\(x\)$",
        ),
        (
            np.zeros(0, np.float32), ag.DispatchError,
            r"^replicate\(\) got an empty array of shape \(0,\); a resident buffer holds at least "
            r"one element — skip the upload for empty input$",
        ),
        (
            np.zeros(3, object), ag.ArgumentTypeError,
            r"^replicate\(\) got an object array; a resident buffer holds numbers",
        ),
    ],
)  # fmt: skip
async def test_replicate_refuses_what_upload_refuses_before_any_copy(
    group: ag.DeviceGroup, array: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        await group.replicate(array)  # type: ignore[arg-type]  # on purpose
    assert group.snapshot().bytes_up == 0


def _record(
    monkeypatch: pytest.MonkeyPatch,
    group: ag.DeviceGroup,
    fail: dict[int, Callable[[], Awaitable[None]]],
) -> list[ag.ResidentBuffer]:
    """The buffers ``replicate`` makes: member 0 uploads the array, and the others get a copy
    of its buffer (``group[0].copy(..., to=member)``); a copy to a member in *fail* first
    awaits what *fail* gives for it (which raises, or sleeps)."""
    made: list[ag.ResidentBuffer] = []
    origin = group[0]
    upload, copy = origin.upload, origin.copy

    async def recording_upload(array: np.ndarray[Any, Any]) -> ag.ResidentBuffer:
        buffer = await upload(array)
        made.append(buffer)
        return buffer

    async def recording_copy(
        buffer: ag.ResidentBuffer, to: ag.Backend | None = None
    ) -> ag.ResidentBuffer:
        assert to is not None
        failing = fail.get(group.index(to))
        if failing is not None:
            await failing()
        copied = await copy(buffer, to=to)
        made.append(copied)
        return copied

    monkeypatch.setattr(origin, "upload", recording_upload)
    monkeypatch.setattr(origin, "copy", recording_copy)
    return made


async def test_a_member_that_fails_to_replicate_raises_its_own_error(
    group: ag.DeviceGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One member's copy fails after the others were made: its error comes alone (not an
    ExceptionGroup), saying which member, and the copies made are freed."""

    async def out_of_memory() -> None:
        while len(made) < 2:  # noqa: ASYNC110  # the others copy first
            await anyio.sleep(0.001)
        raise ag.AllocationError("member 1 is out of memory")

    made = _record(monkeypatch, group, {1: out_of_memory})
    with pytest.raises(
        ag.AllocationError,  # pytest matches the notes too, one a line
        match=r"^member 1 is out of memory\nreplicate\(\): raised by member 1 \(host\)$",
    ):
        await group.replicate(np.ones(N, np.float32))
    assert len(made) == 2
    assert all(b.is_closed for b in made)


async def test_a_cancelled_replicate_frees_the_copies_made(
    group: ag.DeviceGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled by an anyio scope (which cancels every await in it until it is left) while
    member 1 still copies: the buffers of members 0 and 2 are freed all the same."""

    async def slow() -> None:
        await anyio.sleep(60)
        raise AssertionError("cancelled before")

    made = _record(monkeypatch, group, {1: slow})
    async with anyio.create_task_group() as tasks:
        with anyio.CancelScope() as scope:

            async def cancel_once_copied() -> None:
                while len(made) < 2:  # noqa: ASYNC110  # the copies first
                    await anyio.sleep(0.001)
                scope.cancel()

            tasks.start_soon(cancel_once_copied)
            await group.replicate(np.ones(N, np.float32))
    assert scope.cancelled_caught
    assert len(made) == 2
    assert all(b.is_closed for b in made)


def _failing(message: str) -> Callable[[], Awaitable[None]]:
    async def fail() -> None:
        raise ag.AllocationError(message)

    return fail


async def test_when_several_members_fail_the_first_ones_error_is_raised(
    group: ag.DeviceGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members 1 and 2 fail at once: member 1's error is raised, member 2's is in its notes."""
    fail = {1: _failing("member 1 is out of memory"), 2: _failing("member 2 is out of memory")}
    made = _record(monkeypatch, group, fail)
    with pytest.raises(ag.AllocationError, match=r"^member 1 is out of memory\n") as caught:
        await group.replicate(np.ones(N, np.float32))
    assert caught.value.__notes__ == [
        "replicate(): raised by member 1 (host)",
        "replicate(): member 2 (host) failed too: AllocationError('member 2 is out of memory')",
    ]
    assert len(made) == 1
    assert all(b.is_closed for b in made)  # member 0's upload


@pytest.mark.stand_in
@pytest.mark.nvrtc
def test_a_device_fault_stays_with_its_member() -> None:
    """``open_group(["cuda", "host"])`` on the stand-in driver: a kernel faults on the CUDA
    member; the next 100 dispatches of the group all run, on the host member."""
    seen = run_scenario("tests.fake_driver.group_scenario", "python")
    assert seen["fault"] == "DeviceFaultError"
    assert seen["after"] == {"ok": 100, "right": 100, "on_host": 100}
    assert seen["resident_on_failed"] == "DeviceFaultError"
    assert seen["replicated"] == {"ok": 10, "right": 10}
    assert seen["failed"] == [[0, "cuda:0"]]
    assert "illegal" in seen["why"].lower() or "700" in seen["why"]
    assert seen["closed"] is True
    assert seen["shared_pool"] is True  # the group's one pinned pool, its cap counted once
    assert seen["pool_after_close"] is None
    assert seen["given_pool_idle_after_close"] > 0  # left open, its blocks cached
    assert seen["given_pool_idle_after_its_close"] == 0


@pytest.mark.stand_in
@pytest.mark.nvrtc
def test_a_failed_backend_lets_go_of_its_memory_quietly() -> None:
    """After a device fault every free fails, and cuda.core warned once per buffer (150 lines
    for 150 resident buffers); now the backend logs one event and nothing else is printed."""
    seen = run_scenario("tests.fake_driver.fault_close", "python")
    assert seen["fault"] == "DeviceFaultError"
    assert seen["abandoned_events"] == 1
    assert seen["device_buffers"] >= 150  # the resident buffers, and the lanes' scratch
    assert seen["bytes"] >= 150 * 4096
    assert "Warning" not in seen["stderr"], seen["stderr"][-2000:]
    assert "failed" not in seen["stderr"].lower(), seen["stderr"][-2000:]


async def test_compile_skips_the_members_that_are_out(
    group: ag.DeviceGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As dispatch does: a closed member, and one whose device failed, compile nothing."""
    await group[1].aclose()
    fault = ag.DeviceFaultError(700, "CUDA_ERROR_ILLEGAL_ADDRESS", "cuCtxSynchronize", "fault")
    monkeypatch.setattr(group[2]._engine, "failure", fault)
    compiled: list[int] = []
    compile_on_0 = group[0].compile

    async def counting(kernel: ag.Kernel) -> None:
        compiled.append(0)
        await compile_on_0(kernel)

    monkeypatch.setattr(group[0], "compile", counting)
    await group.compile(SCALE)
    assert compiled == [0]
    await group[0].aclose()
    with pytest.raises(
        ag.GroupError,
        match=r"^no member of the group can take work: host: closed; host: closed; host: failed: ",
    ):
        await group.compile(SCALE)


async def test_a_kernel_the_members_cannot_run_raises_the_first_members_error(
    group: ag.DeviceGroup,
) -> None:
    """Not an ExceptionGroup: the error of member 0 alone, as replicate() raises it, with a note
    for each other member that failed too."""
    no_host = ag.Kernel(SCALE.source, "scale")
    refused = (
        r"kernel 'scale' has no host= implementation, so the host backend cannot run it; "
        r"declare Kernel\(\.\.\., host=fn\) or open a CUDA backend"
    )
    with pytest.raises(
        ag.UnsupportedError, match=rf"^{refused}\ncompile\(\): raised by member 0 \(host\)(\n.+)*$"
    ) as caught:
        await group.compile(no_host)
    others = [note.partition(": UnsupportedError(")[0] for note in caught.value.__notes__[1:]]
    assert others == [f"compile(): member {i} (host) failed too" for i in (1, 2)]
