"""Argument kinds of a dispatch, the table of them, and their validation.

``bind()`` turns the positional arguments of ``dispatch()`` into a ``BoundCall`` of bound
arguments (``_bound_args``), which every backend reads the same way. It checks everything that can
be checked before any work starts — kinds, dtypes against the kernel's parameters, contiguity,
sizes, launch shape — and raises a :class:`DispatchError` whose message names the argument and
says what to pass instead.

Each argument is checked and bound by its kind (``_arg_kinds``), found in one table,
:data:`KINDS`, by the value's exact type (:func:`kind_of` for the others). The same kinds say
what a cached plan does for a later value (``_plan_cache``) and what the fast path keeps of an
argument (:func:`fast_arg`, with :data:`FAST_CODES`, the codes both dispatch cores use).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from asyncgraph._buffers._resident import ResidentBuffer
from asyncgraph._runtime._exceptions import ArgumentTypeError, DispatchError, ShapeMismatchError

from ._arg_kinds import (
    ARRAY,
    DEVICE_ARRAY,
    PYTHON_NUMBER,
    RESIDENT,
    SCALAR,
    UNKNOWN,
    ArgKind,
    Binding,
    FastArg,
    InOutKind,
    OutKind,
)
from ._bound_args import Arg, BoundCall, lay_out
from ._checks import (
    MAX_BYTES,
    describe_value,
    is_int,
    launch_shape,
    numeric_dtype,
    shape_tuple,
)
from ._kernel import Kernel

if TYPE_CHECKING:
    from asyncgraph._buffers._resident import ResidentStore

__all__ = (
    "BOUND_KINDS",
    "FAST_CODES",
    "IN_OUT",
    "KINDS",
    "OUT",
    "InOut",
    "LaunchLimits",
    "Out",
    "bind",
    "fast_arg",
    "kind_for",
    "kind_of",
    "register_kind",
)


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
                    f"got {describe_value(into)}; for a numpy array pass Out(shape, dtype) or "
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
            self.shape = shape_tuple(shape, "Out", argument=True)
            self.dtype = numeric_dtype(dtype, "Out", argument=True)
            self.into = None
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        if self.nbytes > MAX_BYTES or self.nbytes < 0:
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


OUT = OutKind(Out)
IN_OUT = InOutKind(InOut)


@attrs.frozen(kw_only=True)
class LaunchLimits:
    """The launch limits a backend checks grid, block and shared memory against."""

    max_threads_per_block: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_shared_mem: int = 48 * 1024


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
    resident_results: bool = True,
) -> BoundCall:
    """Validate a dispatch's arguments against *kernel* and the backend's *limits*.

    It allocates nothing: the buffers of ``Out(..., resident=True)`` are made afterwards by
    :meth:`BoundCall.make_buffers`.

    Args:
        kernel: the kernel to launch.
        args: the positional arguments, in kernel order.
        grid: blocks in the grid (int or 1-3 tuple).
        block: threads in a block (int or 1-3 tuple).
        shared_mem: dynamic shared memory in bytes.
        limits: the backend's launch limits.
        store: the backend's resident store, which checks resident buffers.
        device_arrays: whether the backend takes foreign device arrays.
        resident_results: whether ``Out(..., resident=True)`` may be passed (not to a graph).

    Returns:
        The bound call, its staged arguments laid out.

    Raises:
        DispatchError: an argument or the launch shape is invalid (the message says which).
        StaleBufferError: a resident buffer is closed or belongs to another backend.
        UnsupportedError: a device array given to a backend that cannot read device memory.
    """
    if not isinstance(kernel, Kernel):
        raise ArgumentTypeError(
            f"dispatch() takes an asyncgraph.Kernel first, got {describe_value(kernel)}"
        )
    params = kernel.params
    if params is not None and len(args) != len(params):
        signature = ", ".join(f"{p.ctype} {p.name}" for p in params)
        raise DispatchError(
            f"{kernel.name!r} takes {len(params)} arguments ({signature}), got {len(args)}"
        )
    g = launch_shape(grid, "grid", limits.max_grid)
    b = launch_shape(block, "block", limits.max_block)
    if b[0] * b[1] * b[2] > limits.max_threads_per_block:
        raise DispatchError(
            f"block={block!r} has {b[0] * b[1] * b[2]} threads; a block holds at most "
            f"{limits.max_threads_per_block} on this device"
        )
    if not is_int(shared_mem):
        raise DispatchError(f"shared_mem={shared_mem!r}; pass a number of bytes as an int")
    smem = operator.index(shared_mem)
    if not 0 <= smem <= limits.max_shared_mem:
        raise DispatchError(
            f"shared_mem={smem} bytes; this device allows between 0 and "
            f"{limits.max_shared_mem} bytes of dynamic shared memory per block"
        )

    call = BoundCall(kernel, [], g, b, smem)
    binding = Binding(call, store, device_arrays, resident_results)
    bound = call.args
    kinds = KINDS
    for index, value in enumerate(args):
        param = params[index] if params is not None else None
        kind = kinds.get(type(value)) or kind_of(value)
        bound.append(kind.bind(value, index, param, binding))
    call.n_results = len(call.returned)
    if binding.bytes_in or binding.bytes_out:
        call.bytes_in = binding.bytes_in
        call.bytes_out = binding.bytes_out
        call.in_end, call.up_end, call.total = lay_out(
            binding.inputs, binding.in_outs, binding.outputs
        )
    return call


# The one table of argument kinds, by the exact type of a value (``kind_of`` sorts the types
# not in it: subclasses, Python numbers, device arrays, anything else). ``_replicated`` adds
# ``Replicated`` (``register_kind``).
KINDS: dict[type, ArgKind] = {np.ndarray: ARRAY}
KINDS.update(
    (scalar, SCALAR)
    for scalar in set(np.sctypeDict.values())
    if isinstance(scalar, type) and issubclass(scalar, np.generic)
)
KINDS.update({Out: OUT, InOut: IN_OUT, ResidentBuffer: RESIDENT})


def kind_of(value: object) -> ArgKind:
    """The kind of *value*, whose type is not in :data:`KINDS`: by what it is an instance of,
    in the order ``bind()`` always asked."""
    if isinstance(value, np.generic):
        return SCALAR
    if isinstance(value, np.ndarray):
        return ARRAY  # a subclass: refused if masked, bound from scratch each time
    if isinstance(value, InOut):
        return IN_OUT
    if isinstance(value, ResidentBuffer):
        return RESIDENT
    if isinstance(value, bool | int | float | complex):
        return PYTHON_NUMBER
    if hasattr(value, "__cuda_array_interface__") or hasattr(value, "__dlpack__"):
        return DEVICE_ARRAY
    return UNKNOWN


def kind_for(value: object) -> ArgKind:
    """The kind of *value*: its type's in :data:`KINDS`, else :func:`kind_of`'s."""
    return KINDS.get(type(value)) or kind_of(value)


def register_kind(value_type: type, kind: ArgKind) -> None:
    """Add the values of exactly *value_type* to :data:`KINDS` as *kind*: a kind of a module
    above this one (``Replicated``), which binds no argument and so never takes the fast path
    (whose codes both cores read at import).

    Raises:
        TypeError: *kind* states no fast-path codes of its own (``ArgKind.codes``), or has
            codes or bound arguments, or *value_type* has a kind already.
    """
    if "codes" not in type(kind).__dict__:
        raise TypeError(f"{kind!r} states no fast-path codes (ArgKind.codes, empty if none)")
    if kind.codes or kind.bound:
        raise TypeError(f"{kind!r} has fast-path codes or bound arguments: add it to KINDS here")
    if value_type in KINDS:
        raise TypeError(f"{value_type.__name__} is {KINDS[value_type]!r} already")
    KINDS[value_type] = kind


# The fast path's code of each kind's variants, by name (both dispatch cores read them), and
# the kind of each bound argument class.
FAST_CODES: dict[str, int] = dict(
    sorted(
        (
            (name, code)
            for kind in (*KINDS.values(), DEVICE_ARRAY, PYTHON_NUMBER, UNKNOWN)
            for name, code in kind.codes.items()
        ),
        key=lambda item: item[1],
    )
)
BOUND_KINDS: dict[type[Arg], ArgKind] = {
    bound: kind for kind in (*KINDS.values(), DEVICE_ARRAY) for bound in kind.bound
}


def fast_arg(arg: Arg) -> FastArg | None:
    """The fast path's descriptor of a bound argument (``ArgKind.fast``), ``None`` if its
    kind never takes the fast path."""
    kind = BOUND_KINDS.get(type(arg))
    return kind.fast(arg) if kind is not None else None
