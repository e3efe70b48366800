"""The part of the backend's front that deals in resident buffers and pinned host arrays.

:class:`ResidentBuffers` is the part of :class:`~asyncgraph.Backend`'s public API that makes,
fills and reads resident buffers without a dispatch (``upload``, ``empty``, ``download``) and
hands out pinned host arrays (``pinned_empty``). Like the rest of the front it validates what
it can, then hands over (to the backend's transfers and engine).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncgraph._args._checks import numeric_dtype, shape_tuple

if TYPE_CHECKING:
    from asyncgraph._buffers._resident import ResidentBuffer
    from asyncgraph._front._buffer_transfers import Transfers

__all__ = ("ResidentBuffers",)


class ResidentBuffers:
    """Resident buffers and pinned host arrays: a part of ``Backend``'s API. ``Backend`` is
    made on it, first thing in its constructor; what it holds is its own.

    Args:
        buffer_io: the backend's uploads and downloads of resident buffers.
        make: makes a resident buffer of a shape and dtype (``Backend._new_resident``).
        host_array: the engine's pinned host array of a shape and dtype.
        for_use: the backend's check on every call of the API: the loop it belongs to, or the
            error of a closed or failed backend.
    """

    def __init__(
        self,
        buffer_io: Transfers,
        make: Callable[[tuple[int, ...], np.dtype[Any]], ResidentBuffer],
        host_array: Callable[[tuple[int, ...], np.dtype[Any]], np.ndarray[Any, Any]],
        for_use: Callable[[], asyncio.AbstractEventLoop],
    ) -> None:
        self._buffer_io = buffer_io
        self._make = make
        self._host_array = host_array
        self._for_use = for_use

    async def upload(self, array: np.ndarray[Any, Any]) -> ResidentBuffer:
        """Copy *array* into a new resident buffer on this backend.

        Raises:
            DispatchError: *array* is not a non-empty, C-contiguous numeric numpy array.
            BackendClosedError: the backend is closed, or was closed while the array was copied
                (the copy is freed).
        """
        self._for_use()
        return await self._buffer_io.upload(array)

    def empty(self, shape: int | tuple[int, ...], dtype: object) -> ResidentBuffer:
        """Allocate a resident buffer; its contents are undefined until written.

        Raises:
            ShapeMismatchError: the shape is not a tuple of positive ints.
            ArgumentTypeError: the dtype is not numeric.
            AllocationError: the device is out of memory even after the caches were trimmed.
            BackendClosedError: the backend is closed.
        """
        self._for_use()
        shape_t = shape_tuple(shape, "empty()")
        dt = numeric_dtype(dtype, "empty()")
        return self._make(shape_t, dt)

    def pinned_empty(self, shape: int | tuple[int, ...], dtype: object) -> np.ndarray[Any, Any]:
        """A numpy array in page-locked host memory, for inputs that go up without a copy.

        Dispatching a pinned array (or a view of one) uploads it straight from its memory,
        skipping the copy into staging; results of 1 MiB or more come back in pinned memory
        too, so a pipeline of dispatches copies nothing on the host. The memory comes from the
        backend's pinned pool and returns there when the array is garbage-collected. Its
        contents are undefined until written. The host backend returns an ordinary array.

        Raises:
            ShapeMismatchError: the shape is not a tuple of positive ints.
            ArgumentTypeError: the dtype is not numeric.
            AllocationError: pinned memory is exhausted.
            BackendClosedError: the backend is closed.
        """
        self._for_use()
        shape_t = shape_tuple(shape, "pinned_empty()")
        dt = numeric_dtype(dtype, "pinned_empty()")
        return self._host_array(shape_t, dt)

    async def download(
        self, buffer: ResidentBuffer, out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        """Copy a resident buffer back into a new numpy array, or into *out*.

        Waits for dispatches in flight that write the buffer, so it reads what they wrote.
        Reusing an *out* array whose pages were touched before saves the page faults of a new
        array, which bound large downloads.

        Raises:
            StaleBufferError: the buffer is closed or from another backend.
            ArgumentTypeError: *out* is not a writable, C-contiguous numpy array.
            ShapeMismatchError: *out* has another shape or dtype than the buffer.
            BackendClosedError: the backend is closed.
        """
        self._for_use()
        return await self._buffer_io.download(buffer, out)
