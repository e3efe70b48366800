"""One place per argument kind: what ``bind()``, a cached plan, a launch and the fast path do
with each kind of dispatch argument.

An :class:`ArgKind` owns everything about its kind, so nothing else tests what kind an argument
is:

- **validation**, :meth:`ArgKind.bind`: the checks ``bind()`` makes of a value (with the same
  messages) and the bound argument (``_bound_args``) it makes of it, counted into the call;
- **rebinding**, :meth:`ArgKind.rebinder`: what a cached plan (``_plan_cache``) runs for a later
  value of the same signature: a guard and the bound argument, or ``None`` where the kind is
  bound from scratch each time;
- **launch values**: its bound arguments' ``launch_value`` and ``enqueue_value`` (``_bound_args``,
  the classes in :attr:`ArgKind.bound`); the latter also orders what must precede the launch on
  the stream (a resident output's zeroing, a foreign producer);
- **the fast path's descriptor**, :meth:`ArgKind.fast` with its :attr:`ArgKind.codes`: the code
  and guard (shape, dtype, strides, offset) a flattened plan keeps per argument
  (``cuda.core._fast_plan``), or ``None`` where the kind never takes the fast path.

The kinds' base, :class:`ArgKind`, and a bind in progress, :class:`Binding`, are in
``_arg_kind_base``; the kinds with a result, ``Out`` and ``InOut``, are in ``_arg_outputs``.
``_arguments.KINDS`` is the one table from a value's type to its kind;
``_arguments.FAST_CODES`` gathers the codes of the kinds in it, which both dispatch cores read
(the compiled one at import).
The fast paths take the staged codes (``in``, ``in_out``, ``out``) to lie right above
``scalar``: ``code <= FAST_CODES["out"]`` means "staged" there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import numpy as np

from asyncgraph._exceptions import ArgumentTypeError, UnsupportedError

from ._arg_kind_base import (
    FAST_IN,
    FAST_RESIDENT,
    FAST_SCALAR,
    ArgKind,
    Binding,
    FastArg,
    Maker,
    restager,
    staged_fast,
)
from ._bound_args import (
    Arg,
    DeviceArg,
    InArg,
    ResidentArg,
    ScalarArg,
)
from ._checks import (
    array_ok,
    check_pointer_dtype,
    check_scalar,
    describe,
    describe_value,
    is_masked,
    refuse_array,
)

if TYPE_CHECKING:
    from asyncgraph.buffers._resident import ResidentStore

    from ._kernel import Kernel, Param

__all__ = (
    "ARRAY",
    "DEVICE_ARRAY",
    "PYTHON_NUMBER",
    "REPLICATED",
    "RESIDENT",
    "SCALAR",
    "UNKNOWN",
)


class ArrayKind(ArgKind):
    """A numpy array: uploaded and read by the kernel (:class:`~asyncgraph.args._bound_args.InArg`).
    Only an exact ``np.ndarray`` is planned; a subclass (a masked array is refused) is bound
    from scratch each time."""

    __slots__ = ()
    name = "array"
    codes: ClassVar[dict[str, int]] = {"in": FAST_IN}
    bound = (InArg,)

    def bind(self, value: Any, index: int, param: Param | None, binding: Binding) -> Arg:
        """The array as an input, staged in the inputs' region."""
        if not array_ok(value, param) or (type(value) is not np.ndarray and is_masked(value)):
            refuse_array(value, binding.where(index, param), param)
        arg = InArg(index, value, param)
        binding.inputs.append(arg)
        binding.bytes_in += value.nbytes
        return arg

    def rebinder(self, arg: Any, value: Any, kernel: Kernel, store: ResidentStore) -> Maker | None:
        """A later array of the same shape, dtype and strides, at the same offset."""
        if type(value) is not np.ndarray:
            return None
        return restager(arg, value, wrapped=False)

    def fast(self, arg: Any) -> FastArg:
        """``in``, with the array's shape, dtype and strides, and its offset."""
        return staged_fast(FAST_IN, arg)


class ScalarKind(ArgKind):
    """A numpy scalar, passed by value (its exact type fixes its dtype)."""

    __slots__ = ()
    name = "scalar"
    codes: ClassVar[dict[str, int]] = {"scalar": FAST_SCALAR}
    bound = (ScalarArg,)

    def bind(self, value: Any, index: int, param: Param | None, binding: Binding) -> Arg:
        """The scalar, checked against a value parameter of its dtype."""
        if param is None or value.dtype != param.dtype or param.pointer:
            check_scalar(value, binding.where(index, param), param)
        return ScalarArg(index, value, param)

    def rebinder(self, arg: Any, value: Any, kernel: Kernel, store: ResidentStore) -> Maker:
        """Any later scalar of the same type: nothing else to check."""
        index, param = arg.index, arg.param
        return lambda v: ScalarArg(index, v, param)

    def fast(self, arg: Any) -> FastArg:
        """``scalar``, with no guard beyond its type."""
        return FAST_SCALAR, None, None, None, 0


class ResidentKind(ArgKind):
    """A resident buffer, passed as its pointer (:class:`~asyncgraph.args._bound_args.ResidentArg`);
    its liveness is checked on every call, planned or not."""

    __slots__ = ()
    name = "resident buffer"
    codes: ClassVar[dict[str, int]] = {"resident": FAST_RESIDENT}
    bound = (ResidentArg,)

    def bind(self, value: Any, index: int, param: Param | None, binding: Binding) -> Arg:
        """The buffer, live in this backend's store, of the parameter's dtype."""
        where = binding.where(index, param)
        binding.store.check(value, where)
        check_pointer_dtype(value.dtype, where, param)
        binding.call.resident = True
        return ResidentArg(index, value, param)

    def holds(self, value: Any) -> Any:
        """The buffer itself."""
        return value

    def rebinder(self, arg: Any, value: Any, kernel: Kernel, store: ResidentStore) -> Maker:
        """A later live buffer of the same dtype."""
        index, param, dtype = arg.index, arg.param, value.dtype
        where = describe(index, kernel, param)

        def make_resident(v: Any) -> Arg | None:
            if v.dtype is not dtype:
                return None
            store.check(v, where)
            return ResidentArg(index, v, param)

        return make_resident

    def fast(self, arg: Any) -> FastArg:
        """``resident``, with the buffer's dtype."""
        return FAST_RESIDENT, None, arg.value.dtype, None, 0


class DeviceArrayKind(ArgKind):
    """Another library's device array (``__cuda_array_interface__`` or DLPack), passed as its
    pointer (:class:`~asyncgraph.args._bound_args.DeviceArg`); never planned (its pointer is new
    each time), never on the fast path."""

    __slots__ = ()
    name = "device array"
    codes: ClassVar[dict[str, int]] = {}
    bound = (DeviceArg,)

    def bind(self, value: Any, index: int, param: Param | None, binding: Binding) -> Arg:
        """The array's pointer and producer stream, read once; refused by the host backend."""
        where = binding.where(index, param)
        if not binding.device_arrays:
            raise UnsupportedError(
                f"{where} is {describe_value(value)}, a device array; the host backend "
                "cannot read device memory — copy it to a numpy array first (for CuPy, "
                "x.get(); for PyTorch, x.cpu().numpy()) or open a CUDA backend"
            )
        binding.call.foreign = True
        return DeviceArg(index, value, param, where)


class PythonNumberKind(ArgKind):
    """A Python ``bool``, ``int``, ``float`` or ``complex``: refused, its width on the GPU
    would be a guess."""

    __slots__ = ()
    name = "Python number"
    codes: ClassVar[dict[str, int]] = {}

    def bind(self, value: Any, index: int, param: Param | None, binding: Binding) -> NoReturn:
        """Refuse it, naming the numpy scalar to pass."""
        if param is not None and param.dtype is not None and not param.pointer:
            hint = f"pass np.{param.dtype}({value!r})"
        else:
            hint = f"pass a numpy scalar of the parameter's width, e.g. np.int32({value!r})"
        raise ArgumentTypeError(
            f"{binding.where(index, param)} is a Python {type(value).__name__}; its width on "
            f"the GPU would be a guess — {hint}"
        )


def _refuse(value: Any, where: str) -> NoReturn:
    raise ArgumentTypeError(
        f"{where} is {describe_value(value)}; pass a numpy array, a numpy scalar, Out, InOut, "
        "a resident buffer or a device array"
    )


class ReplicatedKind(ArgKind):
    """A group's :class:`~asyncgraph.Replicated` array: refused by a backend as anything else
    it does not take is; a group's dispatch passes each member its copy (``Replicated.on``)."""

    __slots__ = ()
    name = "Replicated"
    codes: ClassVar[dict[str, int]] = {}

    def bind(self, value: Any, index: int, param: Param | None, binding: Binding) -> NoReturn:
        """Refuse it, listing what a dispatch takes."""
        _refuse(value, binding.where(index, param))

    def on_member(self, value: Any, member: Any) -> Any:
        """The member's copy (``Replicated.on``)."""
        return value.on(member)


class UnknownKind(ArgKind):
    """Anything else: refused, naming what a dispatch takes."""

    __slots__ = ()
    name = "unknown"
    codes: ClassVar[dict[str, int]] = {}

    def bind(self, value: Any, index: int, param: Param | None, binding: Binding) -> NoReturn:
        """Refuse it, listing what a dispatch takes."""
        _refuse(value, binding.where(index, param))


ARRAY = ArrayKind()
SCALAR = ScalarKind()
RESIDENT = ResidentKind()
DEVICE_ARRAY = DeviceArrayKind()
PYTHON_NUMBER = PythonNumberKind()
REPLICATED = ReplicatedKind()
UNKNOWN = UnknownKind()
