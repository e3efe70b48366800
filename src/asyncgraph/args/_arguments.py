"""Argument kinds of a dispatch and their validation.

``bind()`` turns the positional arguments of ``dispatch()`` into a ``BoundCall`` of bound
arguments (``_bound_args``), which every backend reads the same way. It checks everything that can
be checked before any work starts — kinds, dtypes against the kernel's parameters, contiguity,
sizes, launch shape — and raises a :class:`DispatchError` whose message names the argument and
says what to pass instead.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import attrs
import numpy as np

from asyncgraph._exceptions import (
    ArgumentTypeError,
    DispatchError,
    ShapeMismatchError,
    UnsupportedError,
)
from asyncgraph.buffers._resident import ResidentBuffer

from ._bound_args import (
    Arg,
    BoundCall,
    DeviceArg,
    InArg,
    InOutArg,
    OutArg,
    ResidentArg,
    ResidentOutArg,
    ScalarArg,
    StagedArg,
    lay_out,
)
from ._checks import (
    CONST,
    MAX_BYTES,
    array_ok,
    article,
    check_pointer_dtype,
    check_scalar,
    describe,
    describe_value,
    is_int,
    is_masked,
    launch_shape,
    numeric_dtype,
    refuse_array,
    shape_tuple,
)
from ._kernel import Kernel, Param

if TYPE_CHECKING:
    from asyncgraph.buffers._resident import ResidentStore

__all__ = ("InOut", "LaunchLimits", "Out")


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


@attrs.frozen(kw_only=True)
class LaunchLimits:
    """The launch limits a backend checks grid, block and shared memory against."""

    max_threads_per_block: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_shared_mem: int = 48 * 1024


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
            what = f"an Out(into=) {article(out.dtype)} buffer"
            fix = (
                f"Out(into=) {article(param.dtype)} buffer, e.g. backend.empty({out.shape}, {want})"
            )
        else:
            what = f"an Out of dtype {out.dtype}"
            fix = f"Out({out.shape}, {want}{', resident=True' if out.resident else ''})"
        raise ArgumentTypeError(f"{where} is {what}; the kernel takes {param.dtype} — pass {fix}")
    raise DispatchError(CONST.format(where, "an Out", "drop const from the parameter"))


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
    bound = call.args
    returned = call.returned
    inputs: list[StagedArg] = []
    in_outs: list[StagedArg] = []
    outputs: list[StagedArg] = []
    bytes_in = bytes_out = 0
    for index, value in enumerate(args):
        param = params[index] if params is not None else None
        kind = type(value)
        arg: Arg
        if kind is np.ndarray:
            if not array_ok(value, param):  # type: ignore[arg-type]  # checked by type
                refuse_array(value, describe(index, kernel, param), param)  # type: ignore[arg-type]  # likewise
            arg = InArg(index, value, param)
            inputs.append(arg)
            bytes_in += value.nbytes  # type: ignore[attr-defined]  # an ndarray
        elif isinstance(value, np.generic):
            if param is None or value.dtype != param.dtype or param.pointer:
                check_scalar(value, describe(index, kernel, param), param)
            arg = ScalarArg(index, value, param)
        elif kind is Out:
            out: Out = value  # type: ignore[assignment]  # checked by type
            if param is not None and (
                param.const
                or not param.pointer
                or (param.dtype is not None and out.dtype != param.dtype)
            ):
                _refuse_out(out, describe(index, kernel, param), param)
            if out.into is not None:
                store.check(out.into, describe(index, kernel, param))
                arg = ResidentOutArg(index, out, param)
                call.resident = True
            elif out.resident:
                if not resident_results:
                    raise UnsupportedError(
                        f"{describe(index, kernel, param)} is an Out(..., resident=True); a "
                        "graph cannot make new buffers — pass Out(into=buffer) with a buffer "
                        "from backend.empty()"
                    )
                arg = ResidentOutArg(index, out, param)
                if call.fresh is None:
                    call.fresh = []
                call.fresh.append(arg)
                call.resident = True
            else:
                arg = OutArg(index, out, param)
                outputs.append(arg)
                bytes_out += out.nbytes
            returned.append(arg)
        elif isinstance(value, np.ndarray):  # an ndarray subclass
            if not array_ok(value, param) or is_masked(value):
                refuse_array(value, describe(index, kernel, param), param)
            arg = InArg(index, value, param)
            inputs.append(arg)
            bytes_in += value.nbytes
        elif isinstance(value, InOut):
            array = value.array
            if not isinstance(array, np.ndarray):
                raise ArgumentTypeError(
                    f"{describe(index, kernel, param)} is an InOut of "
                    f"{describe_value(array)}; InOut takes a numpy array"
                )
            if not array_ok(array, param) or is_masked(array):
                refuse_array(array, describe(index, kernel, param), param)
            if param is not None and param.const:
                raise DispatchError(
                    CONST.format(
                        describe(index, kernel, param),
                        "an InOut",
                        "pass the array itself, or drop const from the parameter",
                    )
                )
            arg = InOutArg(index, array, param)
            in_outs.append(arg)
            returned.append(arg)
            bytes_in += array.nbytes
            bytes_out += array.nbytes
        elif store.owns_type(value):
            where = describe(index, kernel, param)
            buffer: ResidentBuffer = value  # type: ignore[assignment]  # owns_type checked it
            store.check(buffer, where)
            check_pointer_dtype(buffer.dtype, where, param)
            arg = ResidentArg(index, buffer, param)
            call.resident = True
        elif isinstance(value, bool | int | float | complex):
            where = describe(index, kernel, param)
            if param is not None and param.dtype is not None and not param.pointer:
                hint = f"pass np.{param.dtype}({value!r})"
            else:
                hint = f"pass a numpy scalar of the parameter's width, e.g. np.int32({value!r})"
            raise ArgumentTypeError(
                f"{where} is a Python {type(value).__name__}; its width on the GPU would be a "
                f"guess — {hint}"
            )
        elif hasattr(value, "__cuda_array_interface__") or hasattr(value, "__dlpack__"):
            where = describe(index, kernel, param)
            if not device_arrays:
                raise UnsupportedError(
                    f"{where} is {describe_value(value)}, a device array; the host backend "
                    "cannot read device memory — copy it to a numpy array first (for CuPy, "
                    "x.get(); for PyTorch, x.cpu().numpy()) or open a CUDA backend"
                )
            arg = DeviceArg(index, value, param, where)
            call.foreign = True
        else:
            where = describe(index, kernel, param)
            raise ArgumentTypeError(
                f"{where} is {describe_value(value)}; pass a numpy array, a numpy scalar, "
                "Out, InOut, a resident buffer or a device array"
            )
        bound.append(arg)
    call.n_results = len(returned)
    if bytes_in or bytes_out:
        call.bytes_in = bytes_in
        call.bytes_out = bytes_out
        call.in_end, call.up_end, call.total = lay_out(inputs, in_outs, outputs)
    return call
