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
  (``_cuda.core._fast_plan``), or ``None`` where the kind never takes the fast path.

The module holds them all, in order: the kinds' base, :class:`ArgKind`, a bind in progress,
:class:`Binding`, and the fast path's codes; the kinds of values (arrays, scalars, resident
buffers, device arrays); the kinds with a result, ``Out`` and ``InOut``.
``_arguments.KINDS`` is the one table from a value's type to its kind;
``_arguments.FAST_CODES`` gathers the codes of the kinds in it, which both dispatch cores read
(the compiled one at import).
The fast paths take the staged codes (``in``, ``in_out``, ``out``) to lie right above
``scalar``: ``code <= FAST_CODES["out"]`` means "staged" there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import numpy as np

from asyncgraph._runtime._exceptions import ArgumentTypeError, DispatchError, UnsupportedError

from ._bound_args import (
    Arg,
    DeviceArg,
    InArg,
    InOutArg,
    OutArg,
    ResidentArg,
    ResidentOutArg,
    ScalarArg,
)
from ._checks import (
    CONST,
    array_ok,
    article,
    check_pointer_dtype,
    check_scalar,
    describe,
    describe_value,
    is_masked,
    refuse_array,
)

if TYPE_CHECKING:
    from asyncgraph._buffers._resident import ResidentStore

    from ._bound_args import BoundCall, StagedArg
    from ._kernel import Kernel, Param

__all__ = (
    "ARRAY",
    "DEVICE_ARRAY",
    "FAST_IN",
    "FAST_INTO",
    "FAST_IN_OUT",
    "FAST_OUT",
    "FAST_RESIDENT",
    "FAST_SCALAR",
    "PYTHON_NUMBER",
    "REPLICATED",
    "RESIDENT",
    "SCALAR",
    "UNKNOWN",
    "ArgKind",
    "Binding",
    "FastArg",
    "InOutKind",
    "Maker",
    "OutKind",
    "restager",
    "staged_fast",
)


# -- the base: what every kind is made of -------------------------------------------------------

# Builds one bound argument from a value of the planned type, or returns None when the value is
# not laid out as planned (then the call is bound from scratch).
Maker = Callable[[Any], "Arg | None"]

# What the fast path keeps of one argument: (code, shape, dtype, strides, offset), ``None``
# where the kind has no such guard.
FastArg = tuple[int, Any, Any, Any, int]

# The fast path's codes, stated by the kinds (their ``codes``); the staged ones (in, in-out, out)
# lie right above the scalar's.
FAST_SCALAR, FAST_IN, FAST_IN_OUT, FAST_OUT, FAST_RESIDENT, FAST_INTO = range(6)


class Binding:
    """One ``bind()`` in progress: the call it builds, the staged arguments in their regions,
    the bytes they move, and what the backend allows.

    Attributes:
        call: the bound call; a kind appends to ``call.returned`` and sets ``call.resident``,
            ``call.fresh`` and ``call.foreign`` (``bind()`` appends each bound argument).
        inputs, in_outs, outputs: the staged arguments of each region, in order.
        bytes_in, bytes_out: bytes the staged arguments copy in and out.
        store: the backend's resident store, which checks resident buffers.
        device_arrays: whether the backend takes foreign device arrays.
        resident_results: whether ``Out(..., resident=True)`` may be passed.
    """

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "call",
        "device_arrays",
        "in_outs",
        "inputs",
        "outputs",
        "resident_results",
        "store",
    )

    def __init__(
        self, call: BoundCall, store: ResidentStore, device_arrays: bool, resident_results: bool
    ) -> None:
        self.call = call
        self.store = store
        self.device_arrays = device_arrays
        self.resident_results = resident_results
        self.inputs: list[StagedArg] = []
        self.in_outs: list[StagedArg] = []
        self.outputs: list[StagedArg] = []
        self.bytes_in = 0
        self.bytes_out = 0

    @property
    def kernel(self) -> Kernel:
        """The kernel the call launches."""
        return self.call.kernel

    def where(self, index: int, param: Param | None) -> str:
        """The words that name the argument at *index* in a message."""
        return describe(index, self.call.kernel, param)


class ArgKind:
    """One kind of dispatch argument (see the module's docstring).

    A kind says which fast-path codes it has in its own class body (:attr:`codes`, empty for a
    kind that never takes the fast path; ``tests/test_arg_kinds.py`` checks every kind of the
    table does), and which bound argument classes it makes (:attr:`bound`).
    """

    __slots__ = ()

    name: ClassVar[str]  # the kind, in words
    codes: ClassVar[dict[str, int]]  # its fast-path codes, by name
    bound: ClassVar[tuple[type[Arg], ...]] = ()  # the bound arguments it makes

    def __repr__(self) -> str:
        return f"<argument kind {self.name}>"

    def bind(self, value: Any, index: int, param: Param | None, binding: Binding) -> Arg:
        """Check *value*, passed at *index* for *param*, and return its bound argument.

        Raises:
            DispatchError: the value is invalid there (the message says why and what to pass).
        """
        raise NotImplementedError

    def rebinder(self, arg: Any, value: Any, kernel: Kernel, store: ResidentStore) -> Maker | None:
        """What a plan of a call of *kernel* runs for a later value at *arg*'s position (*value*
        is the one bound): ``None`` where the kind is bound from scratch each time."""
        return None

    def fast(self, arg: Any) -> FastArg | None:
        """The fast path's descriptor of *arg*, one of this kind's bound arguments: its code
        and what the plan's guard compares; ``None`` where the kind never takes the fast path."""
        return None

    def holds(self, value: Any) -> Any:
        """The resident buffer *value* is or writes into, which places a device group's
        dispatch on the member that holds it; ``None`` where it names none."""
        return None

    def on_member(self, value: Any, member: Any) -> Any:
        """What a device group passes its *member* for *value*: the value itself, but for a
        kind that has one copy per member."""
        return value


def restager(arg: Any, array: np.ndarray[Any, Any], wrapped: bool) -> Maker:
    """The maker of a staged argument like *arg* (bound from *array*) for a later value: an
    array (or, *wrapped*, an ``InOut`` of one) of *array*'s shape, dtype and strides, which
    passes every check ``bind()`` made of *array* (contiguity, size, byte order, the kernel's
    dtype), bound at *arg*'s offset; ``None`` for any other."""
    made_as, index, param, offset = type(arg), arg.index, arg.param, arg.offset
    shape, dtype, strides = array.shape, array.dtype, array.strides

    def restage(v: Any) -> Arg | None:
        a = v.array if wrapped else v
        if (
            type(a) is not np.ndarray
            or a.shape != shape
            or a.dtype is not dtype
            or a.strides != strides
        ):
            return None
        made: StagedArg = made_as(index, a, param)
        made.offset = offset
        return made

    return restage


def staged_fast(code: int, arg: Any) -> FastArg:
    """The fast path's descriptor of a staged argument: *code*, its array's shape, dtype and
    strides, and its offset in the staging."""
    value = arg.value
    return code, value.shape, value.dtype, value.strides, arg.offset


# -- the kinds of values ------------------------------------------------------------------------


class ArrayKind(ArgKind):
    """A numpy array: uploaded and read by the kernel
    (:class:`~asyncgraph._args._bound_args.InArg`). Only an exact ``np.ndarray`` is planned; a
    subclass (a masked array is refused) is bound from scratch each time."""

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
    """A resident buffer, passed as its pointer
    (:class:`~asyncgraph._args._bound_args.ResidentArg`); its liveness is checked on every call,
    planned or not."""

    __slots__ = ()
    name = "resident buffer"
    codes: ClassVar[dict[str, int]] = {"resident": FAST_RESIDENT}
    bound = (ResidentArg,)

    def bind(self, value: Any, index: int, param: Param | None, binding: Binding) -> Arg:
        """The buffer, live in this backend's store, of the parameter's dtype."""
        where = binding.where(index, param)
        binding.store.check(value, where)
        check_pointer_dtype(value.dtype, where, param)
        binding.call.takes_resident()
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
    pointer (:class:`~asyncgraph._args._bound_args.DeviceArg`); never planned (its pointer is new
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
        binding.call.takes_foreign()
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


# -- the kinds with a result: Out and InOut -----------------------------------------------------


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
    """``Out``: a new array (:class:`~asyncgraph._args._bound_args.OutArg`, staged), a new resident
    buffer (``resident=True``) or a resident buffer written in place (``into=``), both
    :class:`~asyncgraph._args._bound_args.ResidentOutArg`. New resident buffers are never
    planned."""

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
    (:class:`~asyncgraph._args._bound_args.InOutArg`)."""

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
