"""Cached argument plans: what ``bind()`` decided for one signature, reused behind cheap guards.

The first dispatch of a kernel with a given signature — each argument's kind, dtype, shape and
layout, the launch shape and the shared memory — goes through
:func:`~asyncgraph._args._arguments.bind`, which checks everything and lays the staged arguments
out.
:func:`plan_of` then keeps what it decided as a :class:`Plan`: per argument the exact type it had
and a guard that says whether a later value is laid out the same (same shape, dtype and strides;
same kind of ``Out``), with the offsets and byte counts already computed; each argument's kind makes
its guard (``ArgKind.rebinder``, ``_arg_kinds``).

A later dispatch with the same kernel runs the guards of the kernel's plans (a few per kernel,
most recently used first). When one plan's guards all hold, its bound call is built without
any other check; when none does, the call goes through ``bind()`` again, so invalid input gets
exactly the errors it always got. What a guard cannot know is still checked per call: a resident
buffer's liveness (``ResidentStore.check``, with the same message as ``bind()``). Calls with
device arrays of other libraries or ``Out(..., resident=True)`` are never planned (their
pointers and buffers are new each time).

A plan holds no reference to any array or buffer, only types, shapes and dtypes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._arguments import BOUND_KINDS, LaunchLimits, bind
from ._bound_args import Arg, BoundCall
from ._kernel import Kernel

if TYPE_CHECKING:
    from asyncgraph._buffers._resident import ResidentStore

    from ._arg_kinds import Maker

__all__ = ("MAX_PLANS", "Plan", "Plans", "plan_of", "same_dims")

MAX_PLANS = 4  # plans kept per kernel (a service may alternate a few shapes)


class Plan:
    """One signature of one kernel, as ``bind()`` accepted it.

    Attributes:
        grid, block, shared_mem: the launch shape as passed (int or tuple) and the bytes.
        resident_results: whether ``Out(..., resident=True)`` was allowed (the dispatch path).
        types: the exact type of each argument.
        makers: per argument, what checks a new value and builds its bound argument.
        template: the bound call whose layout, launch shape and counts a new call copies
            (its argument lists are empty: each call has its own).
        returned: the positions of the arguments with a result, in order.
    """

    __slots__ = (
        "__weakref__",  # a backend may learn what a plan's work takes (keyed weakly by it)
        "block",
        "grid",
        "makers",
        "resident_results",
        "returned",
        "shared_mem",
        "template",
        "types",
    )

    def __init__(
        self,
        template: BoundCall,
        grid: Any,
        block: Any,
        shared_mem: int,
        resident_results: bool,
        types: tuple[type, ...],
        makers: tuple[Maker, ...],
        returned: tuple[int, ...],
    ) -> None:
        self.template = template
        self.grid = grid
        self.block = block
        self.shared_mem = shared_mem
        self.resident_results = resident_results
        self.types = types
        self.makers = makers
        self.returned = returned

    def bind(
        self,
        args: tuple[object, ...],
        grid: object,
        block: object,
        shared_mem: object,
        resident_results: bool,
    ) -> BoundCall | None:
        """The bound call of *args*, or ``None`` if they do not fit this plan.

        Raises:
            StaleBufferError: a resident buffer is closed or from another backend (the same
                error ``bind()`` raises).
        """
        if (
            len(args) != len(self.types)
            or shared_mem != self.shared_mem
            or type(shared_mem) is not int
            or resident_results is not self.resident_results
            or ((grid != self.grid or type(grid) is not int) and not same_dims(grid, self.grid))
            or (
                (block != self.block or type(block) is not int) and not same_dims(block, self.block)
            )
        ):
            return None
        bound: list[Arg] = []
        for value, kind, make in zip(args, self.types, self.makers, strict=True):
            if type(value) is not kind:
                return None
            arg = make(value)
            if arg is None:
                return None
            bound.append(arg)
        t = self.template
        return BoundCall(
            t.kernel,
            bound,
            t.grid,
            t.block,
            t.shared_mem,
            [bound[i] for i in self.returned],
            t.bytes_in,
            t.bytes_out,
            t.resident,
            t.in_end,
            t.up_end,
            t.total,
            None,
            False,
            t.n_results,
            self,
        )


def same_dims(value: object, planned: object) -> bool:
    """Whether a grid or block given as a tuple equals the planned one, of ints (``True``
    equals 1, but ``bind()`` refuses it)."""
    return type(value) is tuple and value == planned and all(type(dim) is int for dim in value)


class Plans:
    """Binds one backend's calls: from a plan of the kernel when the arguments fit one (a few
    per kernel, most recently used first), else with ``bind()``, planning what it accepted.

    Args:
        limits: the backend's launch limits.
        store: the backend's resident store.
        device_arrays: whether the backend takes other libraries' device arrays.
        learn: told of each plan made for ``dispatch()``, with the call it was made from (the
            engine's fast path launches what fits), if anything is to be.
    """

    def __init__(
        self,
        limits: LaunchLimits,
        store: ResidentStore,
        device_arrays: bool,
        learn: Callable[[Plan, BoundCall], None] | None = None,
    ) -> None:
        self._limits = limits
        self._store = store
        self._device_arrays = device_arrays
        self._learn = learn
        self._by_kernel: dict[Kernel, list[Plan]] = {}
        self.hits = 0  # calls bound from a plan
        self.misses = 0  # calls of a planned kernel that fit none of its plans

    def __len__(self) -> int:
        return sum(len(plans) for plans in self._by_kernel.values())

    def bind(
        self,
        kernel: object,
        args: tuple[object, ...],
        grid: object,
        block: object,
        shared_mem: object,
        resident_results: bool,
    ) -> BoundCall:
        """Validate a call of *kernel* on *args* (see :func:`~asyncgraph._args._arguments.bind`).

        Raises:
            DispatchError: an argument or the launch shape is invalid (the message says which).
            StaleBufferError: a resident buffer is closed or belongs to another backend.
            UnsupportedError: a device array given to a backend that cannot read device memory.
        """
        plans = self._by_kernel.get(kernel) if type(kernel) is Kernel else None
        if plans is not None:
            for i, known in enumerate(plans):
                call = known.bind(args, grid, block, shared_mem, resident_results)
                if call is not None:
                    if i:
                        plans.insert(0, plans.pop(i))
                    self.hits += 1
                    return call
            self.misses += 1
        store = self._store
        call = bind(
            kernel,  # type: ignore[arg-type]  # bind() refuses anything but a Kernel
            args,
            grid=grid,
            block=block,
            shared_mem=shared_mem,
            limits=self._limits,
            store=store,
            device_arrays=self._device_arrays,
            resident_results=resident_results,
        )
        plan = plan_of(call, args, grid, block, shared_mem, resident_results, store)
        if plan is not None:
            call.plan = plan
            plans = self._by_kernel.setdefault(call.kernel, [])
            plans.insert(0, plan)
            del plans[MAX_PLANS:]
            if resident_results and self._learn is not None:
                self._learn(plan, call)
        return call

    def clear(self) -> None:
        """Drop every plan (closing)."""
        self._by_kernel.clear()


def plan_of(
    call: BoundCall,
    args: tuple[object, ...],
    grid: object,
    block: object,
    shared_mem: object,
    resident_results: bool,
    store: ResidentStore,
) -> Plan | None:
    """The plan of a call ``bind()`` just accepted, or ``None`` when it cannot be planned."""
    if call.foreign or call.fresh is not None or type(shared_mem) is not int:
        return None
    if not (_plannable_dims(grid) and _plannable_dims(block)):
        return None
    makers = []
    for arg, value in zip(call.args, args, strict=True):
        # Each kind says what a later value of it needs (``ArgKind.rebinder``).
        make = BOUND_KINDS[type(arg)].rebinder(arg, value, call.kernel, store)
        if make is None:
            return None
        makers.append(make)
    # The template keeps the layout, not the values: each new call has its own arguments.
    template = BoundCall(
        call.kernel,
        [],
        call.grid,
        call.block,
        call.shared_mem,
        [],
        call.bytes_in,
        call.bytes_out,
        call.resident,
        call.in_end,
        call.up_end,
        call.total,
        None,
        False,
        call.n_results,
    )
    return Plan(
        template,
        grid,
        block,
        shared_mem,
        resident_results,
        tuple(type(value) for value in args),
        tuple(makers),
        tuple(arg.index for arg in call.returned),
    )


def _plannable_dims(value: object) -> bool:
    if type(value) is int:
        return True
    return type(value) is tuple and all(type(dim) is int for dim in value)
