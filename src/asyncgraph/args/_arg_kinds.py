"""One place per argument kind: what ``bind()``, a cached plan, a launch and the fast path do
with each kind of dispatch argument.

An :class:`ArgKind` owns everything about its kind, so nothing else tests what kind an argument
is:

- **validation**, :meth:`ArgKind.bind`: the checks ``bind()`` makes of a value (with the same
  messages) and the bound argument (``_bound``) it makes of it, counted into the call;
- **rebinding**, :meth:`ArgKind.rebinder`: what a cached plan (``_plans``) runs for a later
  value of the same signature: a guard and the bound argument, or ``None`` where the kind is
  bound from scratch each time;
- **launch values**: its bound arguments' ``launch_value`` and ``enqueue_value`` (``_bound``,
  the classes in :attr:`ArgKind.bound`); the latter also orders what must precede the launch on
  the stream (a resident output's zeroing, a foreign producer);
- **the fast path's descriptor**, :meth:`ArgKind.fast` with its :attr:`ArgKind.codes`: the code
  and guard (shape, dtype, strides, offset) a flattened plan keeps per argument
  (``cuda._fast_plan``), or ``None`` where the kind never takes the fast path.

The kinds with a result, ``Out`` and ``InOut``, are in ``_arg_outputs``. ``_args.KINDS`` is the
one table from a value's type to its kind; ``_args.FAST_CODES`` gathers
the codes of the kinds in it, which both dispatch cores read (the compiled one at import).
The fast paths take the staged codes (``in``, ``in_out``, ``out``) to lie right above
``scalar``: ``code <= FAST_CODES["out"]`` means "staged" there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import numpy as np

from asyncgraph._exceptions import ArgumentTypeError, UnsupportedError

from ._bound_args import (
    Arg,
    BoundCall,
    DeviceArg,
    InArg,
    ResidentArg,
    ScalarArg,
    StagedArg,
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
    "Maker",
    "same_array",
)

# Builds one bound argument from a value of the planned type, or returns None when the value is
# not laid out as planned (then the call is bound from scratch).
Maker = Callable[[Any], Arg | None]

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


def same_array(array: np.ndarray[Any, Any]) -> Callable[[Any], bool]:
    """Whether a later array has *array*'s shape, dtype and strides (then it passes every check
    ``bind()`` made of *array*: contiguity, size, byte order, the kernel's dtype)."""
    shape, dtype, strides = array.shape, array.dtype, array.strides
    return lambda v: v.shape == shape and v.dtype is dtype and v.strides == strides


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
        index, param, offset = arg.index, arg.param, arg.offset
        same = same_array(value)

        def make_in(v: Any) -> Arg | None:
            if not same(v):
                return None
            made = InArg(index, v, param)
            made.offset = offset
            return made

        return make_in

    def fast(self, arg: Any) -> FastArg:
        """``in``, with the array's shape, dtype and strides, and its offset."""
        value = arg.value
        return FAST_IN, value.shape, value.dtype, value.strides, arg.offset


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
