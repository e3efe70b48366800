"""The kinds of the arguments that return a result: ``Out`` and ``InOut`` (see ``_arg_kinds``
for what a kind owns). ``_arguments`` makes one of each for its ``Out`` and ``InOut`` classes and
puts them in its table of kinds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import numpy as np

from asyncgraph._exceptions import ArgumentTypeError, DispatchError, UnsupportedError

from ._arg_kind_base import (
    FAST_IN_OUT,
    FAST_INTO,
    FAST_OUT,
    ArgKind,
    Binding,
    FastArg,
    Maker,
    restager,
    staged_fast,
)
from ._bound_args import Arg, InOutArg, OutArg, ResidentOutArg
from ._checks import CONST, array_ok, article, describe, describe_value, is_masked, refuse_array

if TYPE_CHECKING:
    from asyncgraph.buffers._resident import ResidentStore

    from ._kernel import Kernel, Param

__all__ = ("InOutKind", "OutKind")


def _refuse_out(out: Any, where: str, param: Param) -> NoReturn:
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


class OutKind(ArgKind):
    """``Out``: a new array (:class:`~asyncgraph.args._bound_args.OutArg`, staged), a new resident
    buffer (``resident=True``) or a resident buffer written in place (``into=``), both
    :class:`~asyncgraph.args._bound_args.ResidentOutArg`. New resident buffers are never planned."""

    __slots__ = ("_type",)
    name = "Out"
    codes: ClassVar[dict[str, int]] = {"out": FAST_OUT, "into": FAST_INTO}
    bound = (OutArg, ResidentOutArg)

    def __init__(self, out_type: type) -> None:
        self._type: Any = out_type  # the exact type a plan rebinds (``_arguments.Out``)

    def bind(self, value: Any, index: int, param: Param | None, binding: Binding) -> Arg:
        """The output: staged in the outputs' region, or a resident buffer; returned."""
        call = binding.call
        if param is not None and (
            param.const
            or not param.pointer
            or (param.dtype is not None and value.dtype != param.dtype)
        ):
            _refuse_out(value, binding.where(index, param), param)
        arg: Arg
        if value.into is not None:
            binding.store.check(value.into, binding.where(index, param))
            arg = ResidentOutArg(index, value, param)
            call.resident = True
        elif value.resident:
            if not binding.resident_results:
                raise UnsupportedError(
                    f"{binding.where(index, param)} is an Out(..., resident=True); a "
                    "graph cannot make new buffers — pass Out(into=buffer) with a buffer "
                    "from backend.empty()"
                )
            made = ResidentOutArg(index, value, param)
            if call.fresh is None:
                call.fresh = []
            call.fresh.append(made)
            call.resident = True
            arg = made
        else:
            staged = OutArg(index, value, param)
            binding.outputs.append(staged)
            binding.bytes_out += value.nbytes
            arg = staged
        call.returned.append(arg)
        return arg

    def holds(self, value: Any) -> Any:
        """The buffer of ``Out(into=)``; ``None`` for a new output."""
        return value.into

    def rebinder(self, arg: Any, value: Any, kernel: Kernel, store: ResidentStore) -> Maker | None:
        """A later ``Out`` of the same shape and dtype at the same offset, or an ``Out(into=)``
        of a live buffer of the same dtype."""
        if type(value) is not self._type:
            return None
        index, param, dtype = arg.index, arg.param, value.dtype
        if type(arg) is OutArg:
            shape, offset = value.shape, arg.offset

            def make_out(v: Any) -> Arg | None:
                if v.into is not None or v.resident or v.shape != shape or v.dtype is not dtype:
                    return None
                made = OutArg(index, v, param)
                made.offset = offset
                return made

            return make_out
        if value.into is None:
            return None  # a new resident buffer each time
        where = describe(index, kernel, param)

        def make_into(v: Any) -> Arg | None:
            into = v.into
            if into is None or v.dtype is not dtype:
                return None
            store.check(into, where)
            return ResidentOutArg(index, v, param)

        return make_into

    def fast(self, arg: Any) -> FastArg:
        """``out`` with its shape, dtype and offset; ``into`` with the buffer's dtype."""
        if type(arg) is OutArg:
            return FAST_OUT, arg.value.shape, arg.value.dtype, None, arg.offset
        return FAST_INTO, None, arg.value.dtype, None, 0


class InOutKind(ArgKind):
    """``InOut(array)``: uploaded, and returned as a new array
    (:class:`~asyncgraph.args._bound_args.InOutArg`)."""

    __slots__ = ("_type",)
    name = "InOut"
    codes: ClassVar[dict[str, int]] = {"in_out": FAST_IN_OUT}
    bound = (InOutArg,)

    def __init__(self, in_out_type: type) -> None:
        self._type: Any = in_out_type  # the exact type a plan rebinds (``_arguments.InOut``)

    def bind(self, value: Any, index: int, param: Param | None, binding: Binding) -> Arg:
        """Its array, staged in the in-outs' region; returned."""
        array = value.array
        if not isinstance(array, np.ndarray):
            raise ArgumentTypeError(
                f"{binding.where(index, param)} is an InOut of "
                f"{describe_value(array)}; InOut takes a numpy array"
            )
        if not array_ok(array, param) or is_masked(array):
            refuse_array(array, binding.where(index, param), param)
        if param is not None and param.const:
            raise DispatchError(
                CONST.format(
                    binding.where(index, param),
                    "an InOut",
                    "pass the array itself, or drop const from the parameter",
                )
            )
        arg = InOutArg(index, array, param)
        binding.in_outs.append(arg)
        binding.call.returned.append(arg)
        binding.bytes_in += array.nbytes
        binding.bytes_out += array.nbytes
        return arg

    def rebinder(self, arg: Any, value: Any, kernel: Kernel, store: ResidentStore) -> Maker | None:
        """A later ``InOut`` of an array of the same shape, dtype and strides."""
        if type(value) is not self._type or type(value.array) is not np.ndarray:
            return None
        return restager(arg, value.array, wrapped=True)

    def fast(self, arg: Any) -> FastArg:
        """``in_out``, with the array's shape, dtype and strides, and its offset."""
        return staged_fast(FAST_IN_OUT, arg)
