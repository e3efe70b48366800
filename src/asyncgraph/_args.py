"""Argument kinds of a dispatch and their validation.

``bind()`` turns the positional arguments of ``dispatch()`` into a :class:`BoundCall`: a list of
``(kind, value, param)`` entries every backend reads the same way. It checks everything that can
be checked before any work starts — kinds, dtypes against the kernel's parameters, contiguity,
sizes, launch shape — and raises a :class:`DispatchError` whose message names the argument and
says what to pass instead.
"""

from __future__ import annotations

import contextlib
import math
import operator
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeGuard

import attrs
import numpy as np

from ._exceptions import ArgumentTypeError, DispatchError, ShapeMismatchError, UnsupportedError
from ._kernel import Kernel, Param
from ._resident import ResidentBuffer

if TYPE_CHECKING:
    from ._resident import ResidentStore

__all__ = ("InOut", "LaunchLimits", "Out")

# Kinds of bound argument.
IN: Final = 0  # numpy array, uploaded
OUT: Final = 1  # Out(shape, dtype): zero-filled, returned
INOUT: Final = 2  # InOut(array): uploaded, returned as a new array
SCALAR: Final = 3  # numpy scalar, by value
RESIDENT: Final = 4  # ResidentBuffer: its device pointer, no copy
RESIDENT_OUT: Final = 5  # Out(into=buffer): zero-filled in place
DEVICE: Final = 6  # foreign device array (__cuda_array_interface__ / __dlpack__)

_NUMERIC_KINDS = frozenset("biufc")
_INTS = (int, np.integer)
_DTYPES: dict[object, np.dtype[Any]] = {}  # dtype-likes already converted (hot path)


def _is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    """An int-like value, not a bool (cheap: no runtime Protocol check on the hot path)."""
    return isinstance(value, _INTS) and not isinstance(value, bool | np.bool_)


_MAX_BYTES = 1 << 46  # 64 TiB: larger than any device, small enough to catch overflowed shapes


def _shape_tuple(shape: object, what: str, *, argument: bool = False) -> tuple[int, ...]:
    """Check a shape given to *what*: a kernel argument (``Out``) or else a call (``empty()``)."""
    has = "has" if argument else "got"
    if _is_int(shape):
        dims: Sequence[object] = (shape,)
    elif isinstance(shape, tuple | list):
        dims = shape
    else:
        raise ShapeMismatchError(
            f"{what} {has} shape {shape!r}; a shape is an int or a tuple of ints, e.g. (1024,)"
        )
    out: list[int] = []
    for dim in dims:
        if not _is_int(dim):
            raise ShapeMismatchError(
                f"{what} {has} shape {shape!r}; every dimension must be an int, got {dim!r}"
            )
        out.append(operator.index(dim))
    if any(d < 1 for d in out) or not out:
        why = "a kernel cannot write a zero-size output" if argument else "no zero-size arrays"
        raise ShapeMismatchError(
            f"{what} {has} shape {tuple(out)!r}; every dimension must be at least 1 ({why})"
        )
    return tuple(out)


def _numeric_dtype(dtype: object, what: str, *, argument: bool = False) -> np.dtype[Any]:
    """Check a dtype given to *what*: a kernel argument (``Out``) or else a call (``empty()``)."""
    has = "has" if argument else "got"
    try:
        cached = _DTYPES.get(dtype)
    except TypeError:  # unhashable dtype-like
        cached = None
    if cached is not None:
        return cached
    try:
        dt: np.dtype[Any] = np.dtype(dtype)  # type: ignore[call-overload]  # any dtype-like
    except TypeError as exc:
        raise ArgumentTypeError(f"{what} {has} dtype {dtype!r}, which numpy does not know") from exc
    if dt.kind not in _NUMERIC_KINDS or dt.fields is not None:
        takes = "GPU kernels take numeric dtypes" if argument else f"{what} takes a numeric dtype"
        raise ArgumentTypeError(
            f"{what} {has} dtype {dt}; {takes} (bool, int, uint, float, complex)"
        )
    with contextlib.suppress(TypeError):
        _DTYPES[dtype] = dt
    return dt


class Out:
    """An output argument: zero-filled before the kernel runs, returned by the dispatch.

    ``Out(shape, dtype)`` returns a new numpy array; ``Out(shape, dtype, resident=True)`` returns
    a new resident buffer instead (the result stays on the backend, ready for the next dispatch
    or for ``torch.from_dlpack``); ``Out(into=buffer)`` writes into a resident buffer in place
    (it is zero-filled too) and the dispatch returns that buffer.

    Raises:
        DispatchError: both a shape and ``into=``, or ``into=`` with ``resident=True``.
        ArgumentTypeError: ``into=`` is not a resident buffer (a numpy array, say).
        ShapeMismatchError: the shape is not a tuple of positive ints, or is absurdly large.
        ArgumentTypeError: the dtype is not numeric.
    """

    __slots__ = ("dtype", "into", "nbytes", "resident", "shape")

    def __init__(
        self,
        shape: int | Sequence[int] | None = None,
        dtype: object = None,
        *,
        into: ResidentBuffer | None = None,
        resident: bool = False,
    ) -> None:
        if not isinstance(resident, bool):
            raise ArgumentTypeError(f"Out(resident={resident!r}); pass True or False")
        self.resident = resident
        if into is not None:
            if not isinstance(into, ResidentBuffer):
                raise ArgumentTypeError(
                    "Out(into=) takes a resident buffer from backend.empty() or backend.upload(), "
                    f"got {_describe_value(into)}; for a numpy array pass Out(shape, dtype) or "
                    "InOut(array)"
                )
            if resident:
                raise DispatchError(
                    "Out(into=buffer) already writes a resident buffer; drop resident=True"
                )
            if shape is not None or dtype is not None:
                raise DispatchError(
                    "Out(into=buffer) takes its shape and dtype from the buffer; "
                    "pass either Out(shape, dtype) or Out(into=buffer)"
                )
            self.shape = into.shape
            self.dtype = into.dtype
            self.into: ResidentBuffer | None = into
        else:
            if shape is None or dtype is None:
                raise DispatchError(
                    "Out needs a shape and a dtype, e.g. Out((1024,), np.float32), or into=buffer"
                )
            self.shape = _shape_tuple(shape, "Out", argument=True)
            self.dtype = _numeric_dtype(dtype, "Out", argument=True)
            self.into = None
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        if self.nbytes > _MAX_BYTES or self.nbytes < 0:
            raise ShapeMismatchError(
                f"Out of shape {self.shape} and dtype {self.dtype} would hold {self.nbytes} "
                "bytes, more than any device has"
            )

    def __repr__(self) -> str:
        if self.into is not None:
            return f"Out(into={self.into!r})"
        if self.resident:
            return f"Out({self.shape}, {self.dtype}, resident=True)"
        return f"Out({self.shape}, {self.dtype})"


class InOut:
    """An argument uploaded before the kernel and returned after it, as a new array.

    The caller's array is not changed; the dispatch returns a new array with the kernel's
    writes.
    """

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array

    def __repr__(self) -> str:
        return f"InOut(<{self.array.dtype} array {self.array.shape}>)"


@attrs.frozen(kw_only=True)
class LaunchLimits:
    """The launch limits a backend checks grid, block and shared memory against."""

    max_threads_per_block: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_shared_mem: int = 48 * 1024


@attrs.define(slots=True)
class BoundCall:
    """A validated dispatch: what each backend needs to run it."""

    kernel: Kernel
    args: list[tuple[int, Any, Param | None]]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    n_results: int
    bytes_in: int  # bytes the dispatch copies into the backend's memory
    bytes_out: int  # bytes it copies back out
    resident: bool = False  # some argument is a resident buffer (RESIDENT or RESIDENT_OUT)


def _a(word: object) -> str:
    """``"a float32"`` / ``"an int32"``: the article English wants before a dtype name."""
    text = str(word)
    return f"an {text}" if text[:1] in "aeio" else f"a {text}"


def _describe(index: int, kernel: Kernel, param: Param | None) -> str:
    where = f"args[{index}] of {kernel.name!r}"
    return f"{where} ({param.ctype} {param.name})" if param is not None else where


def _describe_value(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"{_a(value.dtype)} array of shape {value.shape}"
    return f"a {type(value).__module__}.{type(value).__qualname__}"


# How _check_array speaks of a kernel argument, and of an array given to upload(): the verb,
# who takes numbers, who needs an element, what to skip (and who takes C-contiguous arrays).
_FOR_KERNEL = ("is", "kernels take numeric arrays", "a kernel needs", "the dispatch", "the kernel")
_FOR_UPLOAD = ("got", "a resident buffer holds numbers", "a resident buffer holds", "the upload")
# An Out or InOut for a const pointer: the argument, its kind, what to do.
_CONST = "{} is {}, but the kernel's parameter is const and cannot write it — {} in the source"


def _is_masked(array: np.ndarray[Any, Any]) -> bool:
    """Whether *array* is a numpy masked array (none exists before ``numpy.ma`` is imported)."""
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(array, ma.MaskedArray)


def _check_array(array: np.ndarray[Any, Any], where: str, *, argument: bool = False) -> None:
    """Refuse an array given to *where*: a kernel argument, or else a call (``upload()``)."""
    verb, numeric, needs, skip, taker = _FOR_KERNEL if argument else (*_FOR_UPLOAD, where)
    what = f"{where} {verb} {_a(array.dtype)} array"
    if _is_masked(array):
        raise ArgumentTypeError(
            f"{where} {verb} a masked {array.dtype} array; its mask would be dropped — pass "
            "arr.filled(value) or np.ma.getdata(arr) explicitly"
        )
    if array.dtype.kind not in _NUMERIC_KINDS or array.dtype.fields is not None:
        raise ArgumentTypeError(f"{what}; {numeric} — convert it, e.g. x.astype(np.float32)")
    if array.size == 0:
        raise DispatchError(
            f"{where} {verb} an empty array of shape {array.shape}; {needs} at least one "
            f"element — skip {skip} for empty input"
        )
    if not array.flags.c_contiguous:
        raise DispatchError(
            f"{what} of {array.ndim} dimensions that is not C-contiguous; {taker} takes a "
            "C-contiguous array — pass np.ascontiguousarray(x)"
        )
    if not array.dtype.isnative:
        raise DispatchError(
            f"{what} in non-native byte order; pass x.astype(x.dtype.newbyteorder('='))"
        )
    if array.nbytes > _MAX_BYTES:
        raise DispatchError(f"{what} of {array.nbytes} bytes, more than any device has")


def _check_pointer_dtype(dtype: np.dtype[Any], where: str, param: Param | None) -> None:
    if param is None:
        return
    if not param.pointer:
        raise ArgumentTypeError(
            f"{where} is an array; that parameter is a value — pass a numpy scalar, "
            f"e.g. np.{param.dtype or 'int32'}(...)"
        )
    if param.dtype is not None and dtype != param.dtype:
        raise ArgumentTypeError(
            f"{where} is {_a(dtype)} array; the kernel takes {param.dtype} — "
            f"pass x.astype(np.{param.dtype})"
        )


def _array_ok(array: np.ndarray[Any, Any], param: Param | None) -> bool:
    """Whether *array* passes every check of :func:`_refuse_array` (the fast path)."""
    dtype = array.dtype
    return (
        array.flags.c_contiguous
        and array.size != 0
        and array.nbytes <= _MAX_BYTES
        and dtype.kind in _NUMERIC_KINDS
        and dtype.isnative
        and dtype.fields is None
        and (param is None or (param.pointer and (param.dtype is None or dtype == param.dtype)))
    )


def _refuse_array(array: np.ndarray[Any, Any], where: str, param: Param | None) -> None:
    """Raise the error for an array argument that failed :func:`_array_ok`."""
    _check_array(array, where, argument=True)
    _check_pointer_dtype(array.dtype, where, param)


def _refuse_out(out: Out, where: str, param: Param) -> NoReturn:
    """Raise the error for an ``Out`` that *param* cannot take: a value, a dtype, a const."""
    if not param.pointer:
        raise ArgumentTypeError(
            f"{where} is an Out; that parameter is a value — pass a numpy scalar, "
            f"e.g. np.{param.dtype or 'int32'}(...)"
        )
    if param.dtype is not None and out.dtype != param.dtype:
        want = f"np.{param.dtype}"
        if out.into is not None:
            what = f"an Out(into=) {_a(out.dtype)} buffer"
            fix = f"Out(into=) {_a(param.dtype)} buffer, e.g. backend.empty({out.shape}, {want})"
        else:
            what = f"an Out of dtype {out.dtype}"
            fix = f"Out({out.shape}, {want}{', resident=True' if out.resident else ''})"
        raise ArgumentTypeError(f"{where} is {what}; the kernel takes {param.dtype} — pass {fix}")
    raise DispatchError(_CONST.format(where, "an Out", "drop const from the parameter"))


def _check_scalar(value: np.generic, where: str, param: Param | None) -> None:
    if value.dtype.kind not in _NUMERIC_KINDS:
        raise ArgumentTypeError(f"{where} is {_a(value.dtype)} scalar; pass a numeric one")
    if param is not None:
        if param.pointer:
            raise ArgumentTypeError(
                f"{where} is a scalar; that parameter is a pointer — pass an array, "
                "Out, InOut or a resident buffer"
            )
        if param.dtype is not None and value.dtype != param.dtype:
            raise ArgumentTypeError(
                f"{where} is {_a(value.dtype)} scalar; the kernel takes {param.dtype} — "
                f"pass np.{param.dtype}({value.item()!r})"
            )


def _launch_shape(value: object, name: str, limit: tuple[int, int, int]) -> tuple[int, int, int]:
    if type(value) is int and 1 <= value <= limit[0]:
        return value, 1, 1  # the common case, checked in one step
    if _is_int(value):
        dims: Sequence[object] = (value,)
    elif isinstance(value, tuple | list) and 1 <= len(value) <= 3:
        dims = value
    else:
        raise DispatchError(f"{name}={value!r}; pass an int or a tuple of 1 to 3 positive ints")
    out = [1, 1, 1]
    for i, dim in enumerate(dims):
        if not _is_int(dim):
            raise DispatchError(f"{name}={value!r}; every dimension must be an int")
        out[i] = operator.index(dim)
        if not 1 <= out[i] <= limit[i]:
            raise DispatchError(
                f"{name}={value!r}; dimension {'xyz'[i]} must be between 1 and {limit[i]} "
                "on this device"
            )
    return out[0], out[1], out[2]


def bind(
    kernel: Kernel,
    args: tuple[object, ...],
    *,
    grid: object,
    block: object,
    shared_mem: object,
    limits: LaunchLimits,
    store: ResidentStore,
    device_arrays: bool,
    new_resident: Callable[[tuple[int, ...], np.dtype[Any]], ResidentBuffer] | None = None,
) -> BoundCall:
    """Validate a dispatch's arguments against *kernel* and the backend's *limits*.

    Args:
        kernel: the kernel to launch.
        args: the positional arguments, in kernel order.
        grid: blocks in the grid (int or 1-3 tuple).
        block: threads in a block (int or 1-3 tuple).
        shared_mem: dynamic shared memory in bytes.
        limits: the backend's launch limits.
        store: the backend's resident store, which checks resident buffers.
        device_arrays: whether the backend takes foreign device arrays.
        new_resident: allocates the resident buffer of an ``Out(..., resident=True)``.

    Returns:
        The bound call.

    Raises:
        DispatchError: an argument or the launch shape is invalid (the message says which).
        StaleBufferError: a resident buffer is closed or belongs to another backend.
        UnsupportedError: a device array given to a backend that cannot read device memory.
    """
    if not isinstance(kernel, Kernel):
        raise ArgumentTypeError(
            f"dispatch() takes an asyncgraph.Kernel first, got {_describe_value(kernel)}"
        )
    params = kernel.params
    if params is not None and len(args) != len(params):
        signature = ", ".join(f"{p.ctype} {p.name}" for p in params)
        raise DispatchError(
            f"{kernel.name!r} takes {len(params)} arguments ({signature}), got {len(args)}"
        )
    g = _launch_shape(grid, "grid", limits.max_grid)
    b = _launch_shape(block, "block", limits.max_block)
    if b[0] * b[1] * b[2] > limits.max_threads_per_block:
        raise DispatchError(
            f"block={block!r} has {b[0] * b[1] * b[2]} threads; a block holds at most "
            f"{limits.max_threads_per_block} on this device"
        )
    if not _is_int(shared_mem):
        raise DispatchError(f"shared_mem={shared_mem!r}; pass a number of bytes as an int")
    smem = operator.index(shared_mem)
    if not 0 <= smem <= limits.max_shared_mem:
        raise DispatchError(
            f"shared_mem={smem} bytes; this device allows between 0 and "
            f"{limits.max_shared_mem} bytes of dynamic shared memory per block"
        )

    bound: list[tuple[int, Any, Param | None]] = []
    n_results = bytes_in = bytes_out = 0
    resident = False
    made: list[ResidentBuffer] = []  # resident results made for Out(..., resident=True)
    try:
        for index, value in enumerate(args):
            param = params[index] if params is not None else None
            kind = type(value)
            if kind is np.ndarray:
                if not _array_ok(value, param):  # type: ignore[arg-type]  # checked by type
                    _refuse_array(value, _describe(index, kernel, param), param)  # type: ignore[arg-type]  # likewise
                bound.append((IN, value, param))
                bytes_in += value.nbytes  # type: ignore[attr-defined]  # an ndarray
            elif isinstance(value, np.generic):
                if param is None or value.dtype != param.dtype or param.pointer:
                    _check_scalar(value, _describe(index, kernel, param), param)
                bound.append((SCALAR, value, param))
            elif kind is Out:
                out: Out = value  # type: ignore[assignment]  # checked by type
                if param is not None and (
                    param.const
                    or not param.pointer
                    or (param.dtype is not None and out.dtype != param.dtype)
                ):
                    _refuse_out(out, _describe(index, kernel, param), param)
                if out.into is not None:
                    store.check(out.into, _describe(index, kernel, param))
                    bound.append((RESIDENT_OUT, out.into, param))
                    resident = True
                elif out.resident:
                    if new_resident is None:
                        raise UnsupportedError("this backend cannot make resident results")
                    # Made here, so it is closed again below if a later argument is refused.
                    made.append(new_resident(out.shape, out.dtype))
                    bound.append((RESIDENT_OUT, made[-1], param))
                    resident = True
                else:
                    bound.append((OUT, out, param))
                    bytes_out += out.nbytes
                n_results += 1
            elif isinstance(value, np.ndarray):  # an ndarray subclass
                if not _array_ok(value, param) or _is_masked(value):
                    _refuse_array(value, _describe(index, kernel, param), param)
                bound.append((IN, value, param))
                bytes_in += value.nbytes
            elif isinstance(value, InOut):
                array = value.array
                if not isinstance(array, np.ndarray):
                    raise ArgumentTypeError(
                        f"{_describe(index, kernel, param)} is an InOut of "
                        f"{_describe_value(array)}; InOut takes a numpy array"
                    )
                if not _array_ok(array, param) or _is_masked(array):
                    _refuse_array(array, _describe(index, kernel, param), param)
                if param is not None and param.const:
                    raise DispatchError(
                        _CONST.format(
                            _describe(index, kernel, param),
                            "an InOut",
                            "pass the array itself, or drop const from the parameter",
                        )
                    )
                bound.append((INOUT, array, param))
                bytes_in += array.nbytes
                bytes_out += array.nbytes
                n_results += 1
            elif store.owns_type(value):
                where = _describe(index, kernel, param)
                buffer: ResidentBuffer = value  # type: ignore[assignment]  # owns_type checked it
                store.check(buffer, where)
                _check_pointer_dtype(buffer.dtype, where, param)
                bound.append((RESIDENT, buffer, param))
                resident = True
            elif isinstance(value, bool | int | float | complex):
                where = _describe(index, kernel, param)
                if param is not None and param.dtype is not None and not param.pointer:
                    hint = f"pass np.{param.dtype}({value!r})"
                else:
                    hint = f"pass a numpy scalar of the parameter's width, e.g. np.int32({value!r})"
                raise ArgumentTypeError(
                    f"{where} is a Python {type(value).__name__}; its width on the GPU would be a "
                    f"guess — {hint}"
                )
            elif hasattr(value, "__cuda_array_interface__") or hasattr(value, "__dlpack__"):
                where = _describe(index, kernel, param)
                if not device_arrays:
                    raise UnsupportedError(
                        f"{where} is {_describe_value(value)}, a device array; the host backend "
                        "cannot read device memory — copy it to a numpy array first (for CuPy, "
                        "x.get(); for PyTorch, x.cpu().numpy()) or open a CUDA backend"
                    )
                bound.append((DEVICE, value, param))
            else:
                where = _describe(index, kernel, param)
                raise ArgumentTypeError(
                    f"{where} is {_describe_value(value)}; pass a numpy array, a numpy scalar, "
                    "Out, InOut, a resident buffer or a device array"
                )
    except BaseException:
        for buffer in made:  # nothing was started: give them back
            store._close(buffer)
        raise
    return BoundCall(
        kernel=kernel,
        args=bound,
        grid=g,
        block=b,
        shared_mem=smem,
        n_results=n_results,
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        resident=resident,
    )
