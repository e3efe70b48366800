"""The process's CUDA fate: one sticky fault fails every CUDA backend of the process.

A sticky CUDA error (an illegal address, a launch failure, a hardware exception, an
uncorrectable ECC error) is not its context's alone. On two NVIDIA H100 80GB HBM3 with driver
580.159.04, after an illegal address on ``cuda:1``, ``cuMemAlloc`` in ``cuda:0``'s primary
context failed with ``CUDA_ERROR_ILLEGAL_ADDRESS``: the driver keeps the whole process failed.

So the first sticky error seen anywhere in the process (by any driver call that goes through
``_cuda.driver._driver.error_for``, the reactor's queries included) is recorded here once, as the
process's :class:`ProcessFault`, and every CUDA backend of the process is failed at that moment:
each registers its device here (:func:`join`) and is told through its ``fail()``. A backend
opened afterwards is refused at once. Isolation is one process per GPU (``asyncgraph.ray``).

This module knows no implementation and imports nothing of CUDA: the pinned pool and the
device memory adapter ask it too, so that a driver failure in a poisoned process is reported as
the :class:`DeviceFaultError` it is, never as an out-of-memory error.
"""

from __future__ import annotations

import re
import threading
import time
import weakref
from typing import Final, Protocol

import attrs

from asyncgraph._runtime._exceptions import DeviceFaultError

__all__ = (
    "POISONING_CODES",
    "STICKY_CODES",
    "ProcessFault",
    "check",
    "clear",
    "fault_from",
    "join",
    "process_fault",
    "record",
)

# The errors after which a context cannot be used again (CUDA calls them sticky), by name and
# ``CUresult`` value. ``tests/test_poison.py`` checks them against cuda.bindings' enum.
STICKY_CODES: Final = {
    "CUDA_ERROR_ECC_UNCORRECTABLE": 214,
    "CUDA_ERROR_ILLEGAL_ADDRESS": 700,
    "CUDA_ERROR_LAUNCH_TIMEOUT": 702,
    "CUDA_ERROR_CONTEXT_IS_DESTROYED": 709,
    "CUDA_ERROR_ASSERT": 710,
    "CUDA_ERROR_HARDWARE_STACK_ERROR": 714,
    "CUDA_ERROR_ILLEGAL_INSTRUCTION": 715,
    "CUDA_ERROR_MISALIGNED_ADDRESS": 716,
    "CUDA_ERROR_INVALID_ADDRESS_SPACE": 717,
    "CUDA_ERROR_INVALID_PC": 718,
    "CUDA_ERROR_LAUNCH_FAILED": 719,
}
# Those that poison the whole process: every sticky error but a context destroyed by its owner
# (``reset_device``, or another library), which is no fault of the device's.
POISONING_CODES: Final = frozenset(
    code for name, code in STICKY_CODES.items() if name != "CUDA_ERROR_CONTEXT_IS_DESTROYED"
)
_NAME = re.compile(r"\b(CUDA_ERROR_[A-Z_]+)\b")


@attrs.frozen(kw_only=True)
class ProcessFault:
    """The first sticky CUDA fault of this process, which failed every CUDA backend in it.

    Attributes:
        error: the driver's error, as first seen.
        device: the device it was first seen on (``"cuda:1"``), or ``None`` if the call that
            saw it named none.
        time: when it was seen (seconds since the epoch, ``time.time()``).
    """

    error: DeviceFaultError
    device: str | None
    time: float

    def describe(self) -> str:
        """``"CUDA_ERROR_ILLEGAL_ADDRESS in cuEventQuery, first seen on cuda:1 at 12:51:40.123
        UTC"``."""
        stamp = time.strftime("%H:%M:%S", time.gmtime(self.time))
        millis = int(self.time * 1e3) % 1000
        where = f" on {self.device}" if self.device is not None else ""
        error = self.error
        return f"{error.name} in {error.call}, first seen{where} at {stamp}.{millis:03d} UTC"

    def refusal(self, subject: str, call: str | None = None) -> DeviceFaultError:
        """The error for what the poison refuses: *subject* says what (``"backend cuda:0
        failed and takes no new work"``), *call* the call refused (the fault's own by
        default)."""
        error = self.error
        return DeviceFaultError(
            error.code,
            error.name,
            call or error.call,
            f"{subject}: a sticky CUDA fault ({self.describe()}) fails every CUDA backend of "
            "this process; restart the process to use the GPU again (one process per GPU, as "
            "asyncgraph.ray's actor pools run, keeps a fault to its own GPU; see docs/errors.md)",
        )


class Failable(Protocol):
    """What the poison tells: a CUDA device of a backend (``_cuda.device._cuda_device.Device``)."""

    def fail(self, error: DeviceFaultError) -> None:
        """Fail at once with *error*: take no more work."""
        ...


_lock = threading.Lock()
_first: ProcessFault | None = None
_members: weakref.WeakSet[Failable] = weakref.WeakSet()


def process_fault() -> ProcessFault | None:
    """The sticky CUDA fault that poisoned this process, or ``None`` while none has.

    Once set it stays set until :func:`asyncgraph.reset_device` brings a device back (which the
    drivers measured so far never do after an illegal address: restart the process).
    """
    return _first


def check(subject: str, call: str) -> None:
    """Raise the poison's :class:`DeviceFaultError` for *subject* and *call* (see
    :meth:`ProcessFault.refusal`) if the process is poisoned."""
    first = _first
    if first is not None:
        raise first.refusal(subject, call)


def join(member: Failable) -> None:
    """Register *member* (a CUDA backend's device) to be failed when the process is poisoned;
    it stays registered as long as it lives.

    Raises:
        DeviceFaultError: the process is poisoned already (nothing was registered).
    """
    with _lock:
        first = _first
        if first is None:
            _members.add(member)
            return
    raise first.refusal("no CUDA backend opens in this process any more", "open_backend")


def record(error: DeviceFaultError, device: str | None = None) -> ProcessFault:
    """Note a sticky error; the first one poisons the process and fails every registered
    member at once. Safe from any thread. Returns the process's fault (the first one).

    A later call that knows the device of a first fault recorded without one fills it in.
    """
    global _first
    with _lock:
        first = _first
        if first is not None:
            if first.device is None and device is not None:
                first = _first = attrs.evolve(first, device=device)
            return first
        first = _first = ProcessFault(error=error, device=device, time=time.time())
        members = list(_members)
    for member in members:
        member.fail(error)
    return first


def clear() -> None:
    """Forget the process's fault (a device reset brought the GPU back). Backends that failed
    stay failed; new ones may open."""
    global _first
    with _lock:
        _first = None


def fault_from(exc: BaseException, call: str) -> DeviceFaultError | None:
    """The :class:`DeviceFaultError` behind *exc*, raised by a driver call (through
    ``cuda.core``, say) in *call*: its text names a sticky error, or the process is poisoned
    already (then any failure is the poison's). ``None`` for an ordinary failure.

    A sticky error named here is recorded (:func:`record`).
    """
    if isinstance(exc, DeviceFaultError):
        record(exc)
        return exc
    match = _NAME.search(str(exc))
    code = STICKY_CODES.get(match.group(1)) if match is not None else None
    if code is not None and match is not None:
        error = DeviceFaultError(code, match.group(1), call, str(exc))
        if code in POISONING_CODES:
            record(error)
        return error
    first = _first
    return first.refusal(f"{call} failed", call) if first is not None else None
