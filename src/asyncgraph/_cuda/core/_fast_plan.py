"""What the fast path knows of a signature: a plan's guards and layout, flattened.

When ``Plans`` makes a plan for ``dispatch()`` it tells the engine's fast path
(``FastDispatch.learn``), which keeps a :class:`FastPlan` of it if :func:`eligible`: per
argument its kind's code and descriptor (``_arg_kinds.ArgKind.fast``), its exact type and what
the plan's guard compares (shape, dtype and strides of
an array; shape and dtype of an ``Out``; the dtype of a resident buffer), its offset in the
staging layout; the staged uploads; the resident buffers and whether the kernel writes them;
and how each result is made. The compiled fast path copies it into C arrays once
(``CPlan``); it holds no array or buffer, only types, shapes and dtypes, as a plan does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncgraph._args._arguments import FAST_CODES, fast_arg
from asyncgraph._args._bound_args import upload_bytes

if TYPE_CHECKING:
    from asyncgraph._args._bound_args import BoundCall
    from asyncgraph._args._plan_cache import Plan

__all__ = (
    "K_IN",
    "K_INTO",
    "K_IN_OUT",
    "K_OUT",
    "K_RESIDENT",
    "K_SCALAR",
    "MAX_PLANS",
    "MAX_SHARED",
    "MAX_STAGED",
    "RING_BYTES",
    "FastPlan",
    "describes",
    "eligible",
)

RING_BYTES = 2 << 20  # each lane's pinned staging ring
MAX_STAGED = RING_BYTES >> 2  # bytes a dispatch may stage to take the fast path
MAX_SHARED = 48 * 1024  # dynamic shared memory a kernel has without asking for more
MAX_PLANS = 4  # signatures kept per kernel, most recently used first
_ALIGN = 256

# The codes of a plan's arguments (what each position takes, and so how it is checked and
# passed): the argument kinds' (``_arguments.FAST_CODES``). The staged ones (K_IN, K_IN_OUT, K_OUT)
# lie right above K_SCALAR: ``code <= K_OUT`` means staged.
K_SCALAR = FAST_CODES["scalar"]
K_IN = FAST_CODES["in"]
K_IN_OUT = FAST_CODES["in_out"]
K_OUT = FAST_CODES["out"]
K_RESIDENT = FAST_CODES["resident"]
K_INTO = FAST_CODES["into"]


def eligible(plan: Plan, call: BoundCall) -> bool:
    """Whether the fast path can launch calls of *plan* (*call* is the one it was made from):
    a plan of ``dispatch()`` whose staging fits a lane's ring, with no more dynamic shared
    memory than a kernel has without asking, and arguments of the kinds above."""
    return (
        plan.resident_results
        and call.total <= MAX_STAGED
        and call.shared_mem <= MAX_SHARED
        and all(fast_arg(arg) is not None for arg in call.args)
    )


class FastPlan:
    """One signature of one kernel that the fast path can launch.

    Attributes:
        template: the plan's bound call without arguments (the jobs' ``call``).
        name: the kernel's name.
        grid, block: the launch shape as the plan's guard compares it (int or tuple);
            grid_dims, block_dims: as three ints.
        shared_mem: bytes of dynamic shared memory.
        in_end, up_end, total: the staging layout's bounds (``_bound_args.lay_out``).
        up_copy: bytes the upload takes (``_bound_args.upload_bytes``): ``up_end``, or ``total``
            where the outputs are zeroed in the ring and go up with the inputs.
        staged: bytes of ring a dispatch takes (``total``, 256-byte aligned).
        n_args: how many arguments.
        args: per argument ``(kind, exact type, shape, dtype, strides, offset)``, ``None``
            where the kind has no such guard.
        uploads: per staged input ``(index, offset, nbytes, is an InOut)``.
        residents: per resident buffer ``(index, written, is an Out(into=))``.
        writes: per resident buffer, whether it is written (``track_uses``' argument).
        returned: per result ``(kind, index, offset, nbytes, dtype, shape)``.
        route: the cached graphs that ``graph="always"`` and ``"auto"`` dispatches of this
            signature replay (the compiled core's ``ReplayRoute``), or ``None``.
    """

    __slots__ = (
        "args",
        "block",
        "block_dims",
        "expected",
        "grid",
        "grid_dims",
        "in_end",
        "n_args",
        "name",
        "residents",
        "returned",
        "route",
        "shared_mem",
        "staged",
        "template",
        "total",
        "up_copy",
        "up_end",
        "uploads",
        "writes",
    )

    def __init__(self, plan: Plan, call: BoundCall) -> None:
        self.expected = 0.0  # seconds from dispatch to completion, learned (_watches.learned)
        self.route: Any = None
        template = plan.template
        self.template = template
        self.name = template.kernel.name
        self.grid, self.block, self.shared_mem = plan.grid, plan.block, plan.shared_mem
        self.grid_dims, self.block_dims = template.grid, template.block
        self.in_end, self.up_end, self.total = call.in_end, call.up_end, call.total
        self.up_copy = upload_bytes(call.up_end, call.total)
        self.staged = (call.total + _ALIGN - 1) & ~(_ALIGN - 1)
        self.n_args = len(call.args)
        args: list[tuple[Any, ...]] = []
        uploads: list[tuple[int, int, int, bool]] = []
        residents: list[tuple[int, bool, bool]] = []
        codes: dict[int, int] = {}  # by argument index
        for arg, kind in zip(call.args, plan.types, strict=True):
            code, shape, dtype, strides, offset = _guard(arg)
            codes[arg.index] = code
            args.append((code, kind, shape, dtype, strides, offset))
            if code in (K_IN, K_IN_OUT):
                uploads.append((arg.index, arg.offset, arg.nbytes, code == K_IN_OUT))
            elif code in (K_RESIDENT, K_INTO):
                residents.append((arg.index, arg.writes, code == K_INTO))
        self.args = tuple(args)
        self.uploads = tuple(uploads)
        self.residents = tuple(residents)
        self.writes = tuple(written for _index, written, _into in residents)
        self.returned = tuple(
            (codes[arg.index], arg.index, arg.offset, arg.nbytes, arg.value.dtype, arg.value.shape)
            for arg in call.returned
        )

    def __repr__(self) -> str:
        return f"<FastPlan {self.name!r} {self.n_args} arguments, {self.staged} bytes staged>"


def _guard(arg: Any) -> tuple[int, Any, Any, Any, int]:
    """What a plan's guard compares of a bound argument: (code, shape, dtype, strides, offset),
    ``None`` where the kind has no such guard (its kind's ``ArgKind.fast``)."""
    found = fast_arg(arg)
    if found is None:
        raise ValueError(f"{arg!r} never takes the fast path")
    return found


def describes(plan: FastPlan, call: BoundCall) -> bool:
    """Whether *plan* launches calls of *call*'s signature (its kinds, shapes and dtypes, and
    launch shape; resident buffers by dtype): the dispatches ``FastPath.steer`` means."""
    if (
        plan.grid_dims != call.grid
        or plan.block_dims != call.block
        or plan.shared_mem != call.shared_mem
        or plan.n_args != len(call.args)
        or any(fast_arg(arg) is None for arg in call.args)
    ):
        return False
    return all(
        (code, shape, dtype, strides, offset) == _guard(arg)
        for (code, _kind, shape, dtype, strides, offset), arg in zip(
            plan.args, call.args, strict=True
        )
    )
