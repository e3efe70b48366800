"""``open_backend``: pick a device and open the backend for it; the device list of a group.

The only module that knows every implementation: the front (``_backend``) knows none.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from asyncgraph._runtime._exceptions import ArgumentTypeError, DeviceUnavailableError, GroupError
from asyncgraph._runtime._telemetry import logger

from .._front._options import resolve_options
from ._detect import probe_cuda

if TYPE_CHECKING:
    from .._front._backend import Backend
    from .._front._options import BackendOptions

__all__ = ("group_devices", "open_backend")


def _parse_device(device: object) -> tuple[str, int]:
    """``"auto"``, ``"host"``, ``"cuda"``, ``"cuda:N"`` or ``N`` -> (kind, ordinal)."""
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return ("cuda", device)
    if isinstance(device, str):
        text = device.strip().lower()
        if text in ("auto", "host", "cuda"):
            return (text, 0)
        if text.startswith("cuda:") and text[5:].isdigit():
            return ("cuda", int(text[5:]))
    raise DeviceUnavailableError(
        f"device={device!r} is not a device asyncgraph knows; pass 'auto', 'host', 'cuda', "
        "'cuda:N' or an int N >= 0"
    )


_GROUP_FORMS = "pass 'cuda:*' or a list of devices such as ['cuda:0', 'cuda:1']"


def group_devices(devices: object) -> list[str | int]:
    """The devices of ``open_group(devices)``, each checked as ``open_backend`` takes it.

    Raises:
        ArgumentTypeError: *devices* is neither ``"cuda:*"`` nor a list.
        GroupError: another string, or an empty list.
        DeviceUnavailableError: ``"cuda:*"`` and no CUDA device, or a device of an unknown form.
    """
    if isinstance(devices, str):
        if devices != "cuda:*":
            raise GroupError(f"open_group({devices!r}): {_GROUP_FORMS}")
        probe = probe_cuda()
        if not probe.available or not probe.devices:
            raise DeviceUnavailableError(
                f"open_group('cuda:*') found no CUDA device: {probe.reason}; "
                "open_group(['host', 'host']) groups host backends instead"
            )
        return [f"cuda:{dev.ordinal}" for dev in probe.devices]
    if not isinstance(devices, Iterable) or isinstance(devices, bytes | bytearray):
        raise ArgumentTypeError(
            f"open_group({devices!r}): {_GROUP_FORMS} (['host', 'host'] for host backends)"
        )
    listed: list[str | int] = list(devices)
    if not listed:
        raise GroupError("open_group([]): a group needs at least one device")
    for device in listed:
        _parse_device(device)
    return listed


def open_backend(
    device: str | int = "auto", *, options: BackendOptions | None = None, **option_kwargs: Any
) -> Backend:
    """Open a backend: a CUDA device, or the host.

    Args:
        device: ``"auto"`` (the first CUDA device if a driver and a device are present, else
            the host backend, saying why in a ``backend.selected`` debug event), ``"cuda"``,
            ``"cuda:N"`` or ``N`` (that CUDA device), or ``"host"``.
        options: a :class:`BackendOptions`.
        **option_kwargs: or its fields as keywords (``streams=8``); not both.

    Returns:
        The backend. Use it with ``async with`` or close it with ``await backend.aclose()``.

    Raises:
        DeviceUnavailableError: CUDA was asked for and no driver or device (or not that one)
            was found, or *device* is not a known form.
        ArgumentTypeError: both *options* and keywords were given, *options* is not a
            :class:`BackendOptions`, or a keyword is no field of it.
        DispatchError: an option's value is wrong (``host_workers=0``).
    """
    opts = resolve_options("open_backend", options, option_kwargs)
    kind, ordinal = _parse_device(device)
    if kind in ("auto", "cuda"):
        probe = probe_cuda()
        if not probe.available:
            if kind == "cuda":
                raise DeviceUnavailableError(
                    f"device={device!r} needs CUDA, but {probe.reason}; "
                    "use device='auto' or 'host' to run on the host backend"
                )
            logger.debug("backend.selected", device="host", reason=probe.reason)
            kind = "host"
        elif ordinal >= len(probe.devices):
            raise DeviceUnavailableError(
                f"device={device!r}: there is no CUDA device {ordinal}; {len(probe.devices)} found"
            )
        else:
            from asyncgraph._cuda._cuda_backend import (
                CudaBackend,  # cuda-python loads only with a device
            )

            return CudaBackend(ordinal, opts)
    from asyncgraph._host._host_backend import HostBackend

    return HostBackend(opts)
