"""The checks behind argument validation, and the words of their messages.

Used by :func:`asyncgraph._args._arguments.bind` for dispatch arguments, and by the backends for the
arrays, shapes and dtypes given to ``upload()``, ``empty()`` and ``pinned_empty()``. Each check
raises a :class:`DispatchError` (or a subclass) whose message names what was wrong and says
what to pass instead; the ``*_ok`` predicates are the cheap fast path the checks explain.
"""

from __future__ import annotations

import contextlib
import operator
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from asyncgraph._runtime._exceptions import ArgumentTypeError, DispatchError, ShapeMismatchError

if TYPE_CHECKING:
    from ._kernel import Kernel, Param


__all__ = (
    "CONST",
    "MAX_BYTES",
    "NUMERIC_KINDS",
    "array_ok",
    "article",
    "check_array",
    "check_pointer_dtype",
    "check_scalar",
    "check_upload",
    "describe",
    "describe_value",
    "is_int",
    "is_masked",
    "launch_shape",
    "numeric_dtype",
    "refuse_array",
    "shape_tuple",
)

NUMERIC_KINDS = frozenset("biufc")
_INTS = (int, np.integer)
_DTYPES: dict[object, np.dtype[Any]] = {}  # dtype-likes already converted (hot path)


def is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    """An int-like value, not a bool (cheap: no runtime Protocol check on the hot path)."""
    return isinstance(value, _INTS) and not isinstance(value, bool | np.bool_)


MAX_BYTES = 1 << 46  # 64 TiB: larger than any device, small enough to catch overflowed shapes


def shape_tuple(shape: object, what: str, *, argument: bool = False) -> tuple[int, ...]:
    """Check a shape given to *what*: a kernel argument (``Out``) or else a call (``empty()``)."""
    has = "has" if argument else "got"
    if is_int(shape):
        dims: Sequence[object] = (shape,)
    elif isinstance(shape, tuple | list):
        dims = shape
    else:
        raise ShapeMismatchError(
            f"{what} {has} shape {shape!r}; a shape is an int or a tuple of ints, e.g. (1024,)"
        )
    out: list[int] = []
    for dim in dims:
        if not is_int(dim):
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


def numeric_dtype(dtype: object, what: str, *, argument: bool = False) -> np.dtype[Any]:
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
    if dt.kind not in NUMERIC_KINDS or dt.fields is not None:
        takes = "GPU kernels take numeric dtypes" if argument else f"{what} takes a numeric dtype"
        raise ArgumentTypeError(
            f"{what} {has} dtype {dt}; {takes} (bool, int, uint, float, complex)"
        )
    with contextlib.suppress(TypeError):
        _DTYPES[dtype] = dt
    return dt


def article(word: object) -> str:
    """``"a float32"`` / ``"an int32"``: the article English wants before a dtype name."""
    text = str(word)
    return f"an {text}" if text[:1] in "aeio" else f"a {text}"


def describe(index: int, kernel: Kernel, param: Param | None) -> str:
    where = f"args[{index}] of {kernel.name!r}"
    return f"{where} ({param.ctype} {param.name})" if param is not None else where


def describe_value(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"{article(value.dtype)} array of shape {value.shape}"
    return f"a {type(value).__module__}.{type(value).__qualname__}"


# How check_array speaks of a kernel argument, and of an array given to upload(): the verb,
# who takes numbers, who needs an element, what to skip (and who takes C-contiguous arrays).
_FOR_KERNEL = ("is", "kernels take numeric arrays", "a kernel needs", "the dispatch", "the kernel")
_FOR_UPLOAD = ("got", "a resident buffer holds numbers", "a resident buffer holds", "the upload")
# An Out or InOut for a const pointer: the argument, its kind, what to do.
CONST = "{} is {}, but the kernel's parameter is const and cannot write it — {} in the source"


def is_masked(array: np.ndarray[Any, Any]) -> bool:
    """Whether *array* is a numpy masked array (none exists before ``numpy.ma`` is imported)."""
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(array, ma.MaskedArray)


def check_array(array: np.ndarray[Any, Any], where: str, *, argument: bool = False) -> None:
    """Refuse an array given to *where*: a kernel argument, or else a call (``upload()``)."""
    verb, numeric, needs, skip, taker = _FOR_KERNEL if argument else (*_FOR_UPLOAD, where)
    what = f"{where} {verb} {article(array.dtype)} array"
    if is_masked(array):
        raise ArgumentTypeError(
            f"{where} {verb} a masked {array.dtype} array; its mask would be dropped — pass "
            "arr.filled(value) or np.ma.getdata(arr) explicitly"
        )
    if array.dtype.kind not in NUMERIC_KINDS or array.dtype.fields is not None:
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
    if array.nbytes > MAX_BYTES:
        raise DispatchError(f"{what} of {array.nbytes} bytes, more than any device has")


def check_upload(array: object, where: str) -> None:
    """Refuse what *where* (``upload()``, or a group's ``replicate()``) cannot copy to a backend:
    anything but a non-empty, C-contiguous, native-order numeric numpy array."""
    if not isinstance(array, np.ndarray):
        raise ArgumentTypeError(
            f"{where} takes a numpy array, got {type(array).__name__}; pass np.asarray(x)"
        )
    check_array(array, where)


def check_pointer_dtype(dtype: np.dtype[Any], where: str, param: Param | None) -> None:
    if param is None:
        return
    if not param.pointer:
        raise ArgumentTypeError(
            f"{where} is an array; that parameter is a value — pass a numpy scalar, "
            f"e.g. np.{param.dtype or 'int32'}(...)"
        )
    if param.dtype is not None and dtype != param.dtype:
        raise ArgumentTypeError(
            f"{where} is {article(dtype)} array; the kernel takes {param.dtype} — "
            f"pass x.astype(np.{param.dtype})"
        )


def array_ok(array: np.ndarray[Any, Any], param: Param | None) -> bool:
    """Whether *array* passes every check of :func:`refuse_array` (the fast path)."""
    dtype = array.dtype
    return (
        array.flags.c_contiguous
        and array.size != 0
        and array.nbytes <= MAX_BYTES
        and dtype.kind in NUMERIC_KINDS
        and dtype.isnative
        and dtype.fields is None
        and (param is None or (param.pointer and (param.dtype is None or dtype == param.dtype)))
    )


def refuse_array(array: np.ndarray[Any, Any], where: str, param: Param | None) -> None:
    """Raise the error for an array argument that failed :func:`array_ok`."""
    check_array(array, where, argument=True)
    check_pointer_dtype(array.dtype, where, param)


def check_scalar(value: np.generic, where: str, param: Param | None) -> None:
    if value.dtype.kind not in NUMERIC_KINDS:
        raise ArgumentTypeError(f"{where} is {article(value.dtype)} scalar; pass a numeric one")
    if param is not None:
        if param.pointer:
            raise ArgumentTypeError(
                f"{where} is a scalar; that parameter is a pointer — pass an array, "
                "Out, InOut or a resident buffer"
            )
        if param.dtype is not None and value.dtype != param.dtype:
            raise ArgumentTypeError(
                f"{where} is {article(value.dtype)} scalar; the kernel takes {param.dtype} — "
                f"pass np.{param.dtype}({value.item()!r})"
            )


def launch_shape(value: object, name: str, limit: tuple[int, int, int]) -> tuple[int, int, int]:
    if type(value) is int and 1 <= value <= limit[0]:
        return value, 1, 1  # the common case, checked in one step
    if is_int(value):
        dims: Sequence[object] = (value,)
    elif isinstance(value, tuple | list) and 1 <= len(value) <= 3:
        dims = value
    else:
        raise DispatchError(f"{name}={value!r}; pass an int or a tuple of 1 to 3 positive ints")
    out = [1, 1, 1]
    for i, dim in enumerate(dims):
        if not is_int(dim):
            raise DispatchError(f"{name}={value!r}; every dimension must be an int")
        out[i] = operator.index(dim)
        if not 1 <= out[i] <= limit[i]:
            raise DispatchError(
                f"{name}={value!r}; dimension {'xyz'[i]} must be between 1 and {limit[i]} "
                "on this device"
            )
    return out[0], out[1], out[2]
