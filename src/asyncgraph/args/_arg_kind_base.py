"""What every argument kind is made of (``_arg_kinds``, ``_arg_outputs``): the base
:class:`ArgKind`, a ``bind()`` in progress (:class:`Binding`), the fast path's codes and
descriptor, and the guard of an array's layout. It needs nothing of the bound arguments at
load, so the kinds of both modules stand one level above it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ._checks import describe

if TYPE_CHECKING:
    from asyncgraph.buffers._resident import ResidentStore

    from ._bound_args import Arg, BoundCall, StagedArg
    from ._kernel import Kernel, Param

__all__ = (
    "FAST_IN",
    "FAST_INTO",
    "FAST_IN_OUT",
    "FAST_OUT",
    "FAST_RESIDENT",
    "FAST_SCALAR",
    "ArgKind",
    "Binding",
    "FastArg",
    "Maker",
    "restager",
    "staged_fast",
)

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
