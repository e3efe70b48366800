"""The boundary to the CUDA driver: result checking and error translation.

Every driver call's result goes through :func:`check`, which raises :class:`CudaError` (or
:class:`DeviceFaultError` for the sticky errors that ruin a context) with the code, its name and
the call kept as data. Errors from ``cuda.core`` are translated by :func:`translate`.
"""

from __future__ import annotations

import re
from typing import Any, Final

from cuda.bindings import driver as drv

from asyncgraph._runtime import _poison
from asyncgraph._runtime._exceptions import AllocationError, CudaError, DeviceFaultError
from asyncgraph._runtime._poison import POISONING_CODES, STICKY_CODES

__all__ = ("NOT_READY", "SUCCESS", "check", "error_for", "translate")

SUCCESS: Final = drv.CUresult.CUDA_SUCCESS
NOT_READY: Final = drv.CUresult.CUDA_ERROR_NOT_READY

# Errors after which the context cannot be used again (CUDA calls them sticky); all but a
# destroyed context also poison the process (``_poison``).
_STICKY: Final = frozenset(
    getattr(drv.CUresult, name) for name in STICKY_CODES if hasattr(drv.CUresult, name)
)


def is_sticky(code: Any) -> bool:
    """Whether *code* is an error that leaves the context unusable."""
    return code in _STICKY


def error_for(code: Any, call: str, detail: str = "") -> CudaError:
    """The exception for a failed driver call (not raised); *code* is a ``CUresult`` or the
    int a compiled call returned.

    A sticky error that poisons the process is recorded (``_poison``) the moment it is seen,
    which fails every CUDA backend of the process.
    """
    try:
        name = drv.CUresult(int(code)).name
    except ValueError:
        name = f"CUresult {int(code)}"
    if code not in _STICKY:
        return CudaError(int(code), name, call, detail)
    error = DeviceFaultError(int(code), name, call, detail)
    if int(code) in POISONING_CODES:
        _poison.record(error, _current_device())
    return error


def _current_device() -> str | None:
    """``"cuda:N"`` of the calling thread's current context, or ``None`` (none is current, or
    no driver could be asked)."""
    try:
        code, device = drv.cuCtxGetDevice()
    except Exception:  # no driver library loaded: the error came from a test
        return None
    return f"cuda:{int(device)}" if code == SUCCESS else None


def check(result: Any, call: str) -> Any:
    """Raise for a failed driver result tuple; return its value(s).

    Args:
        result: what a ``cuda.bindings.driver`` function returned: ``(CUresult, *values)``.
        call: the driver function's name, for the error.
    """
    code = result[0]
    if code != SUCCESS:
        if code == drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise AllocationError(f"{call} failed: device out of memory")
        raise error_for(code, call)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


_NAME = re.compile(r"\b(CUDA_ERROR_[A-Z_]+)\b")


def translate(exc: BaseException, call: str) -> CudaError | AllocationError:
    """An asyncgraph error for an exception ``cuda.core`` raised during *call*."""
    match = _NAME.search(str(exc))
    if match is None:
        return CudaError(-1, type(exc).__name__, call, str(exc))
    name = match.group(1)
    code = getattr(drv.CUresult, name, None)
    if name == "CUDA_ERROR_OUT_OF_MEMORY":
        return AllocationError(f"{call} failed: device out of memory")
    if code is None:
        return CudaError(-1, name, call, str(exc))
    return error_for(code, call, str(exc))
