"""Bound arguments: each argument of a dispatch once ``bind()`` has validated it.

Every kind knows its bytes, its launch value and its result, so the backends read an argument
through these attributes and methods and never test what kind it is:

=================  ==========  ===========================  =================================
kind               staged in   launch value (on a device)   result
=================  ==========  ===========================  =================================
:class:`InArg`     inputs      its staged copy              —
:class:`InOutArg`  in-outs     its staged copy              a new array with the kernel's writes
:class:`OutArg`    outputs     its staged, zeroed memory    a new array
:class:`ScalarArg` —           the scalar itself            —
:class:`ResidentArg`  —        the buffer's pointer         —
:class:`ResidentOutArg`  —     the buffer's pointer, zeroed the buffer
:class:`DeviceArg`  —          the foreign array's pointer  —
=================  ==========  ===========================  =================================

:meth:`Arg.enqueue_value` is the launch value as a launch on a stream takes it: a resident output
has its buffer zeroed there first, a device array has the stream wait for its producer (through
the operations the launch hands it: :data:`ZeroOn`, :data:`AfterProducer`). Which kind a value
is, and so which of these it becomes, is decided in one place, its kind (``_arg_kinds``, found
in ``_arguments.KINDS``).

The staged kinds share one layout per dispatch, ``[inputs | in-outs | outputs]`` with each
argument 256-byte aligned, computed once when the call is bound (:func:`lay_out`) and kept in
each argument's ``offset``. :meth:`BoundCall.results` is the one place a result tuple is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import attrs
import numpy as np

from asyncgraph._buffers._resident import identity, storage_of
from asyncgraph._runtime._exceptions import ArgumentTypeError, DispatchError

from ._checks import check_pointer_dtype

if TYPE_CHECKING:
    from asyncgraph._buffers._resident import ResidentBuffer

    from ._kernel import Kernel, Param

__all__ = (
    "ALIGN",
    "ZEROS_BY_COPY",
    "AfterProducer",
    "Arg",
    "BoundCall",
    "DeviceArg",
    "InArg",
    "InOutArg",
    "OutArg",
    "ResidentArg",
    "ResidentOut",
    "ResidentOutArg",
    "ScalarArg",
    "StagedArg",
    "ZeroOn",
    "as_bytes",
    "foreign_array",
    "host_copy",
    "lay_out",
    "upload_bytes",
)


class ResidentOut(Protocol):
    """What a resident output's argument reads of its ``Out`` (``_arguments.Out``)."""

    @property
    def into(self) -> ResidentBuffer | None:
        """The buffer written in place, or ``None`` for a new one (``resident=True``)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes of the output."""
        ...


# What a launch on a stream does before the kernel, for the arguments that ask it (the engine's
# launcher hands them to ``Arg.enqueue_value``): ``zero(pointer, nbytes, stream)`` zeroes
# *nbytes* of device memory at *pointer* in order on *stream*; ``after_producer(producer,
# stream)`` orders *stream* after the work a foreign *producer* stream enqueued so far.
ZeroOn = Callable[[int, int, Any], None]
AfterProducer = Callable[[int, Any], None]


ALIGN = 256  # bytes each staged argument is aligned to
_ROUND = ALIGN - 1
_MASK = ~_ROUND
NOT_STAGED = -1
INPUTS, IN_OUTS, OUTPUTS = 0, 1, 2  # the regions of the staging layout, in order

Array = np.ndarray[Any, Any]


def as_bytes(array: Array) -> Array:
    """*array*'s bytes as a flat uint8 view."""
    return array.reshape(-1).view(np.uint8)


def host_copy(array: Array) -> Array:
    """A C-contiguous copy of *array* (what a host function gets for an ``InOut``)."""
    return np.array(array, copy=True, order="C")


class Arg:
    """One bound argument: the value passed at position ``index``, and the kernel parameter it
    fills (``None`` when the kernel declares no parameters)."""

    __slots__ = ("index", "param", "value")

    # Staged kinds set both per argument: its byte offset in the staging layout, its size.
    offset: int = NOT_STAGED
    nbytes: int = 0

    region: ClassVar[int] = NOT_STAGED  # where it lies in the staging layout
    uploads: ClassVar[bool] = False  # copied to the device before the kernel (In, InOut)
    by_value: ClassVar[bool] = False  # passed as its value, not as a pointer
    zeroed: ClassVar[bool] = False  # a resident output: zeroed before the kernel
    foreign: ClassVar[bool] = False  # another library's device array
    output: ClassVar[bool] = False  # a host function may write what it gets for it
    buffer: ResidentBuffer | None = None  # the resident buffer it uses, if any
    writes: bool = False  # whether the kernel may write that buffer (for ordering later uses)

    def __init__(self, index: int, value: Any, param: Param | None) -> None:
        self.index = index
        self.value = value
        self.param = param

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.index}, {self.value!r})"

    def launch_value(self, base: int) -> Any:
        """Its kernel argument on a device whose staging memory starts at *base*."""
        return base + self.offset

    def enqueue_value(
        self, base: int, stream: Any, zero: ZeroOn, after_producer: AfterProducer
    ) -> Any:
        """Its kernel argument for a launch on *stream* (:meth:`launch_value`), with what must
        precede the launch there done through *zero* and *after_producer*."""
        return base + self.offset

    def host_value(self) -> Any:
        """What a host function gets for it."""
        return self.value

    def signature(self) -> tuple[Any, ...] | None:
        """What a graph recorded for it must match (``None``: it cannot be recorded)."""
        return None


class StagedArg(Arg):
    """An array staged through the dispatch's staging memory; ``nbytes`` is its size."""

    __slots__ = ("nbytes", "offset")

    def __init__(self, index: int, value: Any, param: Param | None) -> None:
        self.index = index
        self.value = value
        self.param = param
        self.offset: int = NOT_STAGED  # set by lay_out
        self.nbytes: int = value.nbytes

    def signature(self) -> tuple[Any, ...]:
        """Its kind, shape and dtype."""
        return (type(self), self.value.shape, self.value.dtype.str)

    def empty(self) -> Array:
        """A new array for its result."""
        return np.empty(self.value.shape, self.value.dtype)

    def view_of(self, data: Array) -> Array:
        """Its result as a view of *data*, the bytes downloaded for it."""
        view: Array = data.view(self.value.dtype).reshape(self.value.shape)
        return view


class InArg(StagedArg):
    """A numpy array: uploaded, read by the kernel."""

    __slots__ = ()
    region = INPUTS
    uploads = True

    def host_value(self) -> Array:
        """A read-only view: a host function must not change the caller's input."""
        view: Array = self.value.view()
        view.flags.writeable = False
        return view


class InOutArg(StagedArg):
    """``InOut(array)``: uploaded, and returned as a new array with the kernel's writes."""

    __slots__ = ()
    region = IN_OUTS
    uploads = True
    output = True

    def __repr__(self) -> str:
        return f"InOutArg({self.index}, <{self.value.dtype} array {self.value.shape}>)"

    def host_value(self) -> Array:
        """A copy of the array, which the host function writes and the dispatch returns."""
        return host_copy(self.value)


class OutArg(StagedArg):
    """``Out(shape, dtype)``: zero-filled memory for the kernel, returned as a new array."""

    __slots__ = ()
    region = OUTPUTS
    output = True

    def host_value(self) -> Array:
        """A zero-filled array, which the host function writes and the dispatch returns."""
        return np.zeros(self.value.shape, self.value.dtype)


class ScalarArg(Arg):
    """A numpy scalar, passed by value."""

    __slots__ = ()
    by_value = True

    def launch_value(self, base: int) -> Any:
        """The scalar itself."""
        return self.value

    def enqueue_value(
        self, base: int, stream: Any, zero: ZeroOn, after_producer: AfterProducer
    ) -> Any:
        """The scalar itself."""
        return self.value

    def signature(self) -> tuple[Any, ...]:
        """Its kind and dtype (its value may change between replays)."""
        return (ScalarArg, self.value.dtype.str)


class ResidentArg(Arg):
    """A resident buffer, passed as its device pointer (nothing is copied).

    ``buffer`` is the buffer; ``writes`` holds unless the parameter is ``const``.
    """

    __slots__ = ("buffer", "writes")
    output = True

    def __init__(self, index: int, value: ResidentBuffer, param: Param | None) -> None:
        self.index = index
        self.value = value
        self.param = param
        self.buffer: ResidentBuffer = value
        # Without a const parameter the kernel may write through the pointer.
        self.writes: bool = param is None or not param.const

    def launch_value(self, base: int) -> int:
        """The buffer's device pointer."""
        return int(storage_of(self.value).handle)

    def enqueue_value(
        self, base: int, stream: Any, zero: ZeroOn, after_producer: AfterProducer
    ) -> int:
        """The buffer's device pointer."""
        return int(storage_of(self.value).handle)

    def host_value(self) -> Any:
        """The buffer's host storage."""
        return storage_of(self.value)

    def signature(self) -> tuple[Any, ...]:
        """Its kind and the buffer's identity (a graph replays the buffers it recorded)."""
        return (ResidentArg, *identity(self.value))


class ResidentOutArg(Arg):
    """``Out(into=buffer)`` or ``Out(shape, dtype, resident=True)``: a resident buffer zeroed
    before the kernel and returned by the dispatch.

    ``value`` is the ``Out``. ``buffer`` is its ``into=`` buffer; for ``resident=True`` it is
    ``None`` until :meth:`BoundCall.make_buffers` allocates it (``bind()`` allocates nothing).
    """

    __slots__ = ("buffer",)
    zeroed = True
    output = True
    writes = True  # the kernel writes its output

    def __init__(self, index: int, value: ResidentOut, param: Param | None) -> None:
        super().__init__(index, value, param)
        self.buffer: ResidentBuffer | None = value.into

    def launch_value(self, base: int) -> int:
        """The buffer's device pointer."""
        return int(storage_of(self._made()).handle)

    def enqueue_value(
        self, base: int, stream: Any, zero: ZeroOn, after_producer: AfterProducer
    ) -> int:
        """The buffer's device pointer, the buffer zeroed on *stream* first."""
        pointer = int(storage_of(self._made()).handle)
        zero(pointer, self.value.nbytes, stream)
        return pointer

    def host_value(self) -> Any:
        """The buffer's host storage, zero-filled."""
        storage = storage_of(self._made())
        storage.fill(0)
        return storage

    def signature(self) -> tuple[Any, ...]:
        """Its kind and the buffer's identity."""
        return (ResidentOutArg, *identity(self._made()))

    def _made(self) -> ResidentBuffer:
        if self.buffer is None:
            raise RuntimeError("the resident output was not allocated (BoundCall.make_buffers)")
        return self.buffer


class DeviceArg(Arg):
    """A device array of another library (CuPy, PyTorch, …), passed as its pointer.

    ``pointer`` and ``producer`` (the stream it was last written on, if it says) are read from
    its ``__cuda_array_interface__`` when the call is bound.
    """

    __slots__ = ("pointer", "producer")
    foreign = True

    def __init__(self, index: int, value: Any, param: Param | None, where: str) -> None:
        super().__init__(index, value, param)
        self.pointer, self.producer = foreign_array(value, where, param)

    def launch_value(self, base: int) -> int:
        """The array's device pointer."""
        return self.pointer

    def enqueue_value(
        self, base: int, stream: Any, zero: ZeroOn, after_producer: AfterProducer
    ) -> int:
        """The array's device pointer, *stream* ordered after its producer (if it said)."""
        if self.producer is not None:
            after_producer(self.producer, stream)
        return self.pointer


@attrs.define(slots=True)
class BoundCall:
    """A validated dispatch: what each backend needs to run it."""

    kernel: Kernel
    args: list[Arg]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    returned: list[Arg] = attrs.Factory(list)  # the arguments with a result, in order
    bytes_in: int = 0  # bytes the dispatch copies into the backend's memory
    bytes_out: int = 0  # bytes it copies back out
    resident: bool = False  # some argument is a resident buffer (or a resident output)
    # The staging layout's bounds: end of the inputs, end of the region copied up, total.
    in_end: int = 0
    up_end: int = 0
    total: int = 0
    fresh: list[ResidentOutArg] | None = None  # the Out(resident=True) ones: made after bind
    foreign: bool = False  # some argument is another library's device array
    n_results: int = 0  # how many values the dispatch returns (len(returned))
    plan: Any = None  # the plan it was bound by or made (``_args._plan_cache.Plan``), if any

    def takes_resident(self) -> None:
        """Note that an argument is a resident buffer (or a resident output)."""
        self.resident = True

    def takes_foreign(self) -> None:
        """Note that an argument is another library's device array."""
        self.foreign = True

    def results(self, array_of: Callable[[StagedArg], Array]) -> tuple[Any, ...]:
        """The dispatch's result tuple: ``array_of(arg)`` for each returned array (``Out``,
        ``InOut``), the buffer for each resident output — in argument order."""
        return tuple(
            [
                array_of(arg) if arg.nbytes else arg.buffer  # type: ignore[arg-type]  # staged kinds
                for arg in self.returned
            ]
        )

    def make_buffers(
        self,
        new: Callable[[tuple[int, ...], np.dtype[Any]], ResidentBuffer],
        discard: Callable[[ResidentBuffer], None],
    ) -> None:
        """Allocate the buffers of ``Out(..., resident=True)`` with *new*; if one fails, those
        made so far are closed with *discard* and the error propagates."""
        try:
            for arg in self.fresh or ():
                out = arg.value
                arg.buffer = new(out.shape, out.dtype)
        except BaseException:
            self.discard_buffers(discard)
            raise

    def discard_buffers(self, discard: Callable[[ResidentBuffer], None]) -> None:
        """Close the buffers :meth:`make_buffers` made (the dispatch did not start, or failed)."""
        for arg in self.fresh or ():
            if arg.buffer is not None:
                discard(arg.buffer)
                arg.buffer = None


def lay_out(
    inputs: list[StagedArg], in_outs: list[StagedArg], outputs: list[StagedArg]
) -> tuple[int, int, int]:
    """Give each staged argument its offset in ``[inputs | in-outs | outputs]`` (each
    ``ALIGN``-byte aligned); returns the bounds: end of the inputs, end of the region copied
    up, total."""
    pos = 0
    for arg in inputs:
        arg.offset = pos
        pos += (arg.nbytes + _ROUND) & _MASK
    in_end = pos
    for arg in in_outs:
        arg.offset = pos
        pos += (arg.nbytes + _ROUND) & _MASK
    up_end = pos
    for arg in outputs:
        arg.offset = pos
        pos += (arg.nbytes + _ROUND) & _MASK
    return in_end, up_end, pos


def foreign_array(value: Any, where: str, param: Param | None) -> tuple[int, int | None]:
    """Pointer and producer stream of a device array with ``__cuda_array_interface__``."""
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is None:
        raise ArgumentTypeError(
            f"{where} is a device array without __cuda_array_interface__; pass a CuPy array or "
            "a PyTorch CUDA tensor"
        )
    try:
        shape = tuple(int(d) for d in cai["shape"])
        dtype = np.dtype(cai["typestr"])
        data = cai["data"]
        strides = cai.get("strides")
        pointer = int(data[0])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ArgumentTypeError(
            f"{where} has a malformed __cuda_array_interface__ ({type(exc).__name__}: {exc}); "
            "it needs 'shape', 'typestr' and 'data' (version 3)"
        ) from None
    if strides is not None:
        expected = []
        step = dtype.itemsize
        for dim in reversed(shape):
            expected.append(step)
            step *= dim
        if tuple(reversed(expected)) != tuple(strides) and int(np.prod(shape)) > 1:
            raise DispatchError(
                f"{where} is a device array that is not C-contiguous; make it contiguous "
                "first (cupy.ascontiguousarray(x) or x.contiguous())"
            )
    if int(np.prod(shape, dtype=np.int64)) == 0:
        raise DispatchError(f"{where} is an empty device array; skip the dispatch")
    check_pointer_dtype(dtype, where, param)
    stream = cai.get("stream")
    return pointer, (int(stream) if stream else None)


# Outputs of at most this many bytes are zeroed in pinned staging and uploaded with the inputs
# (a memset is a driver call of about 2 µs on the loop, measured on an NVIDIA H100 80GB HBM3).
ZEROS_BY_COPY = 16 << 10


def upload_bytes(up_end: int, total: int) -> int:
    """Bytes of the staging layout ``[0, up_end | outputs to total)`` the host-to-device copy
    takes: the inputs, and the outputs too (zeroed on the host first) where they are small and
    the copy happens anyway. The device zeroes ``[upload_bytes, total)`` with a memset."""
    if up_end and total - up_end <= ZEROS_BY_COPY:
        return total
    return up_end
