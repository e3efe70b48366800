"""DLPack export of resident buffers: a ``dltensor`` capsule built with ctypes.

The capsule carries a ``DLManagedTensor`` whose shape and dtype are the buffer's. While a consumer
(``torch.from_dlpack``, ``cupy.from_dlpack``, ``np.from_dlpack``) holds the tensor, the buffer's
memory is kept: closing the buffer waits for the consumer's deleter. The deleter may run on any
thread; it only hands the release to *release*, which the backend makes thread-safe.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ("KDL_CPU", "KDL_CUDA", "dtype_of", "live_exports", "make_capsule")

KDL_CPU = 1
KDL_CUDA = 2

# DLDataTypeCode by numpy kind.
_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


class _DLDevice(ctypes.Structure):
    _fields_ = (("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32))


class _DLDataType(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class _DLTensor(ctypes.Structure):
    _fields_ = (
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    )


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = (
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
)

_NAME = b"dltensor"
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = (ctypes.c_void_p, ctypes.c_char_p)
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = (ctypes.c_void_p, ctypes.c_char_p)

# Exported tensors still held by a consumer: address -> (struct, shape, release).
_live: dict[int, tuple[_DLManagedTensor, Any, Callable[[], None]]] = {}
_live_lock = threading.Lock()


def _delete(managed: Any) -> None:
    address = ctypes.addressof(managed.contents)
    with _live_lock:
        entry = _live.pop(address, None)
    if entry is not None:
        entry[2]()


_deleter = _Deleter(_delete)


def _destroy_capsule(capsule: int) -> None:
    # A capsule nobody consumed (still named "dltensor") owns its tensor: delete it here. A
    # consumer renames the capsule "used_dltensor" and calls the deleter itself.
    if _api.PyCapsule_IsValid(capsule, _NAME):
        pointer = _api.PyCapsule_GetPointer(capsule, _NAME)
        _delete(ctypes.cast(pointer, ctypes.POINTER(_DLManagedTensor)))


_capsule_destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_destroy_capsule)


def dtype_of(dtype: np.dtype[Any]) -> tuple[int, int] | None:
    """The DLPack (code, bits) of a numpy dtype, or ``None`` when DLPack has none."""
    code = _CODES.get(dtype.kind)
    return None if code is None else (code, dtype.itemsize * 8)


def make_capsule(
    pointer: int,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    device: tuple[int, int],
    release: Callable[[], None],
) -> Any:
    """A ``dltensor`` capsule over *pointer*; *release* runs once the consumer is done.

    Raises:
        BufferError: *dtype* has no DLPack type.
    """
    code_bits = dtype_of(dtype)
    if code_bits is None:
        raise BufferError(f"DLPack has no type for {dtype}")
    managed = _DLManagedTensor()
    shape_array = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    tensor = managed.dl_tensor
    tensor.data = pointer
    tensor.device = _DLDevice(*device)
    tensor.ndim = len(shape)
    tensor.dtype = _DLDataType(code_bits[0], code_bits[1], 1)
    tensor.shape = ctypes.cast(shape_array, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = ctypes.POINTER(ctypes.c_int64)()  # NULL: C-contiguous
    tensor.byte_offset = 0
    managed.deleter = _deleter
    address = ctypes.addressof(managed)
    with _live_lock:
        _live[address] = (managed, shape_array, release)
    destructor = ctypes.cast(_capsule_destructor, ctypes.c_void_p)
    return _api.PyCapsule_New(address, _NAME, destructor)


def live_exports() -> int:
    """How many exported tensors consumers still hold (for tests)."""
    with _live_lock:
        return len(_live)
