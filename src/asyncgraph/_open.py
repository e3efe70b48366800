"""``open_backend``: pick a device and open the backend for it.

The only module that knows every implementation: the front (``_backend``) knows none.
"""

from __future__ import annotations

from typing import Any

from ._backend import Backend
from ._detect import probe_cuda
from ._exceptions import DeviceUnavailableError
from ._options import BackendOptions
from ._telemetry import logger

__all__ = ("open_backend",)


def _parse_device(device: object) -> tuple[str, int]:
    """``"auto"``, ``"host"``, ``"cuda"``, ``"cuda:N"`` or ``N`` -> (kind, ordinal)."""
    if isinstance(device, int) and not isinstance(device, bool):
        return ("cuda", device)
    if isinstance(device, str):
        text = device.strip().lower()
        if text in ("auto", "host", "cuda"):
            return (text, 0)
        if text.startswith("cuda:") and text[5:].isdigit():
            return ("cuda", int(text[5:]))
    raise DeviceUnavailableError(
        f"device={device!r} is not a device asyncgraph knows; pass 'auto', 'host', 'cuda', "
        "'cuda:N' or an int N"
    )


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
        TypeError: both *options* and keywords were given, or an unknown keyword.
    """
    if options is not None and option_kwargs:
        raise TypeError("pass either options=BackendOptions(...) or its fields as keywords")
    opts = options if options is not None else BackendOptions(**option_kwargs)
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
            from .cuda._backend import CudaBackend  # cuda-python loads only with a device

            return CudaBackend(ordinal, opts)
    from ._host import HostBackend

    return HostBackend(opts)
