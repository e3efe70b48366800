"""What a batcher is made of: the rows of an item, its options checked, its statistics.

:class:`Row` describes one item's part of a batch array; :func:`check_options` checks what
:func:`asyncgraph.batcher` was given, against the kernel's parameter list where it can be read,
and :func:`check_launch_options` the options both batchers share (``max_size``, ``max_delay``,
``policy``); :class:`ItemChecker` checks each caller's item; :class:`BatcherStatistics` (with
:class:`BatchLaunches`) is the snapshot that ``statistics()`` returns.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from asyncgraph._args._checks import describe_value, is_int, is_masked, numeric_dtype, shape_tuple
from asyncgraph._args._kernel import Kernel, Param
from asyncgraph._runtime._exceptions import ArgumentTypeError, DispatchError, ShapeMismatchError

if TYPE_CHECKING:
    from asyncgraph._runtime._telemetry import HistogramSnapshot

__all__ = (
    "POLICIES",
    "BatchLaunches",
    "BatcherStatistics",
    "ItemChecker",
    "Row",
    "check_launch_options",
    "check_launch_shape",
    "check_options",
    "kernel_item_checker",
)

GRAPH_CHOICES = ("never", "auto", "always")
# The launch policies (docs/batching.md): the first is the default.
POLICIES = ("adaptive", "fixed_delay")
INT32_MAX = 2**31 - 1  # the kernel's int n


def _row_shape(shape: object) -> tuple[int, ...]:
    if isinstance(shape, tuple | list) and not shape:
        return ()  # one value per item
    return shape_tuple(shape, "Row")


def _row_dtype(dtype: object) -> np.dtype[Any]:
    return numeric_dtype(dtype, "Row")


@attrs.frozen
class Row:
    """The shape and dtype of one item's row in an input or output of a batch.

    ``Row((256,), np.float32)``: each caller passes (or gets back) a float32 array of shape
    ``(256,)``; the kernel sees one array of shape ``(n, 256)``. ``Row((), np.int32)`` is one
    value per item (the kernel sees shape ``(n,)``).

    Raises:
        ShapeMismatchError: the shape is not ``()`` or a tuple of positive ints.
        ArgumentTypeError: the dtype is not numeric.
    """

    shape: tuple[int, ...] = attrs.field(converter=_row_shape)
    dtype: np.dtype[Any] = attrs.field(converter=_row_dtype)


@attrs.frozen(kw_only=True)
class BatchLaunches:
    """Why each batch launched: the counts sum to ``BatcherStatistics.batches``.

    Attributes:
        full: it reached ``max_size`` (at the call that filled it).
        idle: its first caller found none of the batcher's batches in flight, so it launched
            at the end of that turn of the loop (``policy="adaptive"``).
        completion: it collected while a batch was in flight, and launched at the end of the
            turn in which that batch completed (``policy="adaptive"``).
        deadline: ``max_delay`` passed since its first caller.
        flush: ``flush()``, ``aclose()`` or the backend's close launched it.
    """

    full: int
    idle: int
    completion: int
    deadline: int
    flush: int


@attrs.frozen(kw_only=True)
class BatcherStatistics:
    """What a batcher did so far, frozen when ``Batcher.statistics()`` was called.

    Attributes:
        batches: batches launched (dispatched, or refused by the backend's dispatch); a batch
            the backend's close failed while it waited for room is no launch, only a failed
            batch.
        items: items in those batches.
        padded_rows: zero rows added to reach a bucket size (0 without buckets).
        mean_fill: mean over batches of items / capacity (``max_size``, or the bucket size
            with buckets); 0.0 before the first batch.
        waiting: seconds each launched item waited between its call and its batch's launch.
        cancelled_before_launch: callers cancelled while their batch was still collecting;
            they left it.
        failed_batches: batches whose dispatch was refused or failed (their callers got the
            error).
        pending: items not launched yet: collecting, or in a batch waiting for room.
        in_flight: batches launched and not completed.
        waiting_for_room: batches due that wait for room in the backend's queue
            (``BackendOptions.max_queued``); they take more items meanwhile, up to
            ``max_size``.
        launched: why the batches launched (:class:`BatchLaunches`).
    """

    batches: int
    items: int
    padded_rows: int
    mean_fill: float
    waiting: HistogramSnapshot
    cancelled_before_launch: int
    failed_batches: int
    pending: int
    in_flight: int
    waiting_for_room: int
    launched: BatchLaunches


def _name(param: Param | None, fallback: str) -> str:
    return f"{param.ctype} {param.name}" if param is not None else fallback


class ItemChecker:
    """Checks one caller's item against a batcher's input rows, cheaply when it is right.

    Args:
        owner: the batcher, as messages name it (``"batcher 'affine_rows'"``).
        where: for each row, what messages call the caller's value of it.
        rows: the rows an item holds.
    """

    __slots__ = ("_owner", "_rows", "_where")

    def __init__(self, owner: str, where: Sequence[str], rows: Sequence[Row]) -> None:
        self._owner = owner
        self._rows = tuple(rows)
        self._where = tuple(where)

    def __call__(self, items: tuple[object, ...]) -> None:
        """Raise if *items* is not one array per input row, of its dtype and shape.

        Raises:
            DispatchError: the number of arrays is wrong.
            ArgumentTypeError: an array is not a numpy array, or of another dtype.
            ShapeMismatchError: an array's shape is not the row's shape.
        """
        rows = self._rows
        if len(items) != len(rows):
            raise DispatchError(
                f"{self._owner} takes {len(rows)} arrays per item ({self._layout()}), "
                f"got {len(items)} — pass one row of each input per call"
            )
        for k, (value, row) in enumerate(zip(items, rows, strict=True)):
            if (
                isinstance(value, np.ndarray)
                and value.dtype == row.dtype
                and value.shape == row.shape
                and not is_masked(value)
            ):
                continue
            self._refuse(k, value, row)

    def _layout(self) -> str:
        """The rows of an item, as messages give them: ``float32[4], int32[]``."""
        return ", ".join(f"{r.dtype}{list(r.shape)}" for r in self._rows)

    def _refuse(self, k: int, value: object, row: Row) -> None:
        where = self._where[k]
        want = f"{row.dtype} rows of shape {row.shape}"
        if isinstance(value, np.generic) and row.shape == () and value.dtype == row.dtype:
            return  # a numpy scalar is one value
        if isinstance(value, bool | int | float | complex | np.generic):
            raise ArgumentTypeError(
                f"{where} is {describe_value(value)}; the batcher takes {want} — pass "
                f"np.asarray(value, dtype=np.{row.dtype})"
            )
        if not isinstance(value, np.ndarray):
            raise ArgumentTypeError(
                f"{where} is {describe_value(value)}; the batcher takes {want} as numpy "
                "arrays — convert it with np.asarray() (for a device array, copy it to the "
                "host first)"
            )
        if is_masked(value):
            raise ArgumentTypeError(
                f"{where} is a numpy masked array, whose mask a kernel would never see — pass "
                "arr.filled(value) or np.ma.getdata(arr), whichever you mean"
            )
        if value.dtype != row.dtype:
            raise ArgumentTypeError(
                f"{where} is {describe_value(value)}; the batcher takes {want} — pass "
                f"x.astype(np.{row.dtype})"
            )
        raise ShapeMismatchError(
            f"{where} has shape {value.shape}; the batcher takes {want}, one row per call — "
            "call it once per row (rows of one call are not split)"
        )

    def stacked(self, arrays: tuple[object, ...]) -> int:
        """How many items *arrays* hold: one numpy array per input row, of its dtype, holding
        the items' rows stacked (shape ``(k, *row.shape)``, the same ``k >= 1`` for each).

        Raises:
            DispatchError: the number of arrays is wrong.
            ArgumentTypeError: an array is not a numpy array, or of another dtype.
            ShapeMismatchError: an array's shape is not ``(k, *row.shape)``, or ``k`` differs.
        """
        rows = self._rows
        if len(arrays) != len(rows):
            raise DispatchError(
                f"{self._owner}.many() takes {len(rows)} arrays ({self._layout()} rows, "
                f"stacked), got {len(arrays)} — pass the items' rows of each input as one array"
            )
        count = 0
        for k, (value, row) in enumerate(zip(arrays, rows, strict=True)):
            where, want = self._where[k], f"{row.dtype} rows of shape {row.shape}, stacked"
            if not isinstance(value, np.ndarray) or is_masked(value):
                raise ArgumentTypeError(
                    f"{where} is {describe_value(value)}; many() takes {want} in one numpy "
                    "array — convert it with np.asarray() (np.ma.getdata() for a masked one)"
                )
            if value.dtype != row.dtype:
                raise ArgumentTypeError(
                    f"{where} is {describe_value(value)}; many() takes {want} — pass "
                    f"x.astype(np.{row.dtype})"
                )
            if not value.shape or value.shape[0] < 1 or value.shape[1:] != row.shape:
                dims = ", ".join(["k", *map(str, row.shape)]) + ("," if not row.shape else "")
                raise ShapeMismatchError(
                    f"{where} has shape {value.shape}; many() takes {want}: shape ({dims}) "
                    "with k >= 1 items"
                )
            if count and value.shape[0] != count:
                raise ShapeMismatchError(
                    f"{where} holds {value.shape[0]} items and {self._where[0]} {count}; "
                    "pass as many rows of each input"
                )
            count = value.shape[0]
        return count


def kernel_item_checker(kernel: Kernel, rows: Sequence[Row]) -> ItemChecker:
    """The :class:`ItemChecker` of a kernel's batcher: each row named by its parameter."""
    params = kernel.params
    where = tuple(
        f"items[{k}] of batcher {kernel.name!r} "
        f"({_name(params[k] if params is not None else None, f'input {k}')})"
        for k in range(len(rows))
    )
    return ItemChecker(f"batcher {kernel.name!r}", where, rows)


def check_launch_options(
    call: str, max_size: object, max_delay: object, policy: object
) -> tuple[int, float, str]:
    """Check the options both batchers share; *call* names the function in messages
    (``"batcher"``, ``"batch"``).

    Returns:
        ``max_size``, ``max_delay`` and ``policy``, as an int, a float and a str.

    Raises:
        DispatchError: an option's value is wrong.
    """
    if not is_int(max_size) or int(max_size) < 1:
        raise DispatchError(f"{call}(max_size={max_size!r}); pass an int >= 1")
    if (
        isinstance(max_delay, bool)
        or not isinstance(max_delay, numbers.Real)
        or not 0.0 <= float(max_delay) < math.inf
    ):
        raise DispatchError(f"{call}(max_delay={max_delay!r}); pass seconds as a float >= 0")
    if not isinstance(policy, str) or policy not in POLICIES:
        raise DispatchError(
            f"{call}(policy={policy!r}); pass 'adaptive' (launch as soon as nothing of the "
            "batcher is in flight, the default) or 'fixed_delay' (wait for max_size or "
            "max_delay)"
        )
    return int(max_size), float(max_delay), policy


def _check_rows(rows: object, what: str) -> tuple[Row, ...]:
    if not isinstance(rows, Sequence) or isinstance(rows, str):
        raise ArgumentTypeError(f"batcher({what}={rows!r}); pass a list of ag.Row(shape, dtype)")
    for row in rows:
        if not isinstance(row, Row):
            raise ArgumentTypeError(
                f"batcher({what}=...) holds {describe_value(row)}; pass ag.Row(shape, dtype) "
                "for each, e.g. ag.Row((256,), np.float32)"
            )
    return tuple(rows)


def _check_signature(
    kernel: Kernel, inputs: tuple[Row, ...], outputs: tuple[Row, ...], shared: tuple[object, ...]
) -> None:
    """Check the batch's argument layout against the kernel's parameters, where known."""
    params = kernel.params
    if params is None:
        return
    count = len(inputs) + len(outputs) + len(shared) + 1
    if len(params) != count:
        signature = ", ".join(f"{p.ctype} {p.name}" for p in params)
        raise DispatchError(
            f"batcher of {kernel.name!r} would pass {count} arguments ({len(inputs)} inputs, "
            f"{len(outputs)} outputs, {len(shared)} shared, the batch size), but the kernel "
            f"takes {len(params)} ({signature}) — see docs/batching.md for the order"
        )
    for k, row in enumerate((*inputs, *outputs)):
        param = params[k]
        is_output = k >= len(inputs)
        where = f"parameter {k} of {kernel.name!r} ({param.ctype} {param.name})"
        if not param.pointer:
            kind = "an output" if is_output else "an input"
            raise ArgumentTypeError(
                f"{where} is a value, but the batch passes {kind} array there — put inputs, "
                "then outputs, then shared arguments, then int n"
            )
        if param.dtype is not None and param.dtype != row.dtype:
            raise ArgumentTypeError(
                f"{where} takes {param.dtype}, but its Row is {row.dtype} — pass "
                f"ag.Row({row.shape}, np.{param.dtype})"
            )
        if is_output and param.const:
            raise DispatchError(f"{where} is const, but the batch writes its outputs there")
    last = params[-1]
    if last.pointer or (last.dtype is not None and last.dtype != np.int32):
        raise ArgumentTypeError(
            f"the last parameter of {kernel.name!r} ({last.ctype} {last.name}) gets the batch "
            "size as np.int32 — declare it 'int n'"
        )


def check_options(
    kernel: object,
    inputs: object,
    outputs: object,
    shared: object,
    launch: object,
    max_size: object,
    max_delay: object,
    policy: object,
    buckets: object,
    graph: object,
    shared_mem: object,
    max_shared_mem: int,
) -> tuple[tuple[Row, ...], tuple[Row, ...], tuple[object, ...], tuple[int, ...]]:
    """Check the options of ``batcher()``; return the inputs, outputs, shared and buckets.

    *max_shared_mem* is the backend's bound on *shared_mem* (its launch limits).

    Raises:
        ArgumentTypeError: an option is of the wrong type.
        DispatchError: an option's value is wrong, or the layout does not fit the kernel.
    """
    if not isinstance(kernel, Kernel):
        raise ArgumentTypeError(
            f"batcher() takes an asyncgraph.Kernel, got {describe_value(kernel)}; declare it "
            "with asyncgraph.Kernel(source, name, host=...)"
        )
    ins = _check_rows(inputs, "inputs")
    outs = _check_rows(outputs, "outputs")
    if not ins:
        raise DispatchError("batcher(inputs=[]); an item needs at least one input row")
    if not isinstance(shared, tuple | list):
        raise ArgumentTypeError(
            f"batcher(shared={shared!r}); pass a tuple of the arguments every batch shares"
        )
    if not callable(launch):
        raise ArgumentTypeError(
            f"batcher(launch={launch!r}); pass a function of the batch size n that returns "
            "(grid, block), e.g. lambda n: ((n + 255) // 256, 256)"
        )
    size = check_launch_options("batcher", max_size, max_delay, policy)[0]
    if graph not in GRAPH_CHOICES:
        raise DispatchError(f"batcher(graph={graph!r}); pass 'never', 'auto' or 'always'")
    if not is_int(shared_mem) or not 0 <= shared_mem <= max_shared_mem:
        raise DispatchError(
            f"batcher(shared_mem={shared_mem!r}); pass the bytes of dynamic shared memory per "
            f"block as an int between 0 and {max_shared_mem} (this backend's bound)"
        )
    sizes: tuple[int, ...] = ()
    if buckets is not None:
        if not isinstance(buckets, Sequence) or not all(is_int(b) and b >= 1 for b in buckets):
            raise DispatchError(
                f"batcher(buckets={buckets!r}); pass batch sizes as ints >= 1, e.g. (8, 16, 32)"
            )
        sizes = tuple(sorted({int(b) for b in buckets}))
        if not sizes or sizes[-1] < size:
            raise DispatchError(
                f"batcher(buckets={buckets!r}, max_size={max_size}); a full batch must fit a "
                f"bucket — add {max_size} to the buckets, or lower max_size"
            )
    _check_signature(kernel, ins, outs, tuple(shared))
    if sizes:
        _check_capacity(sizes[-1], (*ins, *outs), f"buckets={buckets!r}", "the largest bucket")
    else:
        _check_capacity(size, (*ins, *outs), f"max_size={max_size!r}", "max_size")
    return ins, outs, tuple(shared), sizes


def _memory_bytes() -> int | None:
    """The machine's physical memory, where the platform says (``None`` elsewhere)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def _check_capacity(capacity: int, rows: tuple[Row, ...], option: str, name: str) -> None:
    """Refuse a batch size that could never run: more than the kernel's ``int n`` holds, or
    whose staging and outputs (allocated at the first batch) exceed the machine's memory."""
    if capacity > INT32_MAX:
        raise DispatchError(
            f"batcher({option}); the kernel gets the batch size as int n (np.int32), which "
            f"holds at most {INT32_MAX} — pass {name} up to that"
        )
    per_item = sum(math.prod(row.shape) * row.dtype.itemsize for row in rows)
    memory = _memory_bytes()
    if memory is not None and capacity * per_item > memory:
        raise DispatchError(
            f"batcher({option}); a full batch allocates {capacity * per_item:,} bytes "
            f"({per_item:,} per item: its input and output rows), more than the {memory:,} "
            f"bytes of memory this machine has — pass {name} of at most {memory // per_item:,}"
        )


def check_launch_shape(kernel: Kernel, size: int, shape: object) -> tuple[object, object]:
    """What ``launch(size)`` returned, as ``(grid, block)`` (the dispatch checks each).

    Raises:
        ArgumentTypeError: it is not a tuple (or list) of two.
    """
    if isinstance(shape, tuple | list) and len(shape) == 2:
        return shape[0], shape[1]
    raise ArgumentTypeError(
        f"batcher {kernel.name!r}: launch({size}) returned {describe_value(shape)}; it must "
        "return a tuple (grid, block), e.g. lambda n: ((n + 255) // 256, 256)"
    )


LaunchShape = Callable[[int], tuple[object, object]]
