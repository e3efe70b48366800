"""Argument kinds: one table from a value's type to its kind, each kind with its fast-path codes
and descriptor, and the compiled core using the very same codes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._args import _arg_kinds
from asyncgraph._args import _bound_args as _bound
from asyncgraph._args._arg_kinds import (
    ARRAY,
    DEVICE_ARRAY,
    PYTHON_NUMBER,
    REPLICATED,
    RESIDENT,
    SCALAR,
    UNKNOWN,
    ArgKind,
)
from asyncgraph._args._arguments import (
    BOUND_KINDS,
    FAST_CODES,
    IN_OUT,
    KINDS,
    OUT,
    LaunchLimits,
    bind,
    fast_arg,
    kind_for,
    kind_of,
    register_kind,
)
from asyncgraph._args._bound_args import Arg, DeviceArg, ResidentOutArg, ScalarArg
from asyncgraph._scale._replicated import Replicated

from .kernels import SCALE
from .needs import compiled_core

# The codes the fast paths of both cores know how to guard, stage and pass.
HANDLED = {"scalar", "in", "in_out", "out", "resident", "into"}
# The kinds bind() may give a value: those of the table (Replicated's module, imported above,
# adds its kind as it loads), and those of kind_of() for the others.
ALL_KINDS = {*KINDS.values(), DEVICE_ARRAY, PYTHON_NUMBER, UNKNOWN}


def _problems(kinds: set[ArgKind]) -> list[str]:
    """What is missing of the kinds: their own codes, a descriptor where they have codes."""
    problems = []
    for kind in kinds:
        own = type(kind).__dict__
        if "codes" not in own:
            problems.append(f"{kind!r} states no fast-path codes of its own")
        elif kind.codes and "fast" not in own:
            problems.append(f"{kind!r} has codes but no fast-path descriptor (ArgKind.fast)")
        if "bind" not in own:
            problems.append(f"{kind!r} does not bind its values")
    return problems


def test_every_kind_of_the_table_states_its_codes_and_descriptor() -> None:
    assert _problems(ALL_KINDS) == []

    class Forgotten(ArgKind):
        name = "forgotten"

        def bind(self, value: Any, index: int, param: Any, binding: Any) -> Arg:
            raise NotImplementedError

    class NoDescriptor(ArgKind):
        name = "no descriptor"
        codes = {"new": 6}  # noqa: RUF012  # a kind's own table of codes

    assert len(_problems({Forgotten(), NoDescriptor()})) == 3
    with pytest.raises(TypeError, match="states no fast-path codes"):
        register_kind(type("Fresh", (), {}), Forgotten())
    with pytest.raises(TypeError, match="has fast-path codes"):  # the cores read them at import
        register_kind(type("Fresh", (), {}), NoDescriptor())
    with pytest.raises(TypeError, match="already"):
        register_kind(ag.Out, REPLICATED)
    assert "Fresh" not in {t.__name__ for t in KINDS}


def test_the_fast_codes_are_the_kinds_and_the_fast_paths_handle_each() -> None:
    stated = [code for kind in ALL_KINDS for code in kind.codes.values()]
    assert sorted(stated) == list(range(len(stated)))  # unique, no gaps
    assert set(FAST_CODES) == HANDLED
    assert {name: code for kind in ALL_KINDS for name, code in kind.codes.items()} == FAST_CODES
    # The staged codes lie right above the scalar's: the fast paths read `code <= out`.
    staged = {FAST_CODES["in"], FAST_CODES["in_out"], FAST_CODES["out"]}
    assert staged == set(range(FAST_CODES["scalar"] + 1, FAST_CODES["out"] + 1))
    from asyncgraph._cuda.core import _fast_plan

    assert {name: getattr(_fast_plan, f"K_{name.upper()}") for name in HANDLED} == FAST_CODES


def test_the_compiled_core_uses_the_tables_codes() -> None:
    assert compiled_core().fast_codes() == FAST_CODES


def test_each_bound_argument_class_belongs_to_one_kind() -> None:
    made = {
        cls
        for cls in vars(_bound).values()
        if isinstance(cls, type) and issubclass(cls, Arg) and cls not in (Arg, _bound.StagedArg)
    }
    assert set(BOUND_KINDS) == made
    for cls, kind in BOUND_KINDS.items():
        assert cls in kind.bound
        assert kind in ALL_KINDS


class _Subarray(np.ndarray):  # a subclass, for the lookup
    pass


class _Device:
    __cuda_array_interface__ = {"version": 3}  # noqa: RUF012  # the attribute is what counts


async def test_values_find_their_kind(host: ag.Backend) -> None:
    buffer = host.empty(4, np.float32)
    exact = [
        (np.ones(2), ARRAY),
        (np.float32(1), SCALAR),
        (np.bool_(True), SCALAR),
        (ag.Out(2, np.float32), OUT),
        (ag.InOut(np.ones(2)), IN_OUT),
        (buffer, RESIDENT),
    ]
    for value, kind in exact:
        assert KINDS[type(value)] is kind, value
    assert KINDS[Replicated] is REPLICATED
    assert kind_of(np.ones(2).view(_Subarray)) is ARRAY
    assert kind_of(np.ma.masked_array([1.0])) is ARRAY  # refused when bound: it is masked
    for number in (True, 1, 1.0, 1j):
        assert kind_of(number) is PYTHON_NUMBER
    assert kind_of(_Device()) is DEVICE_ARRAY
    assert kind_of(object()) is UNKNOWN
    assert kind_of(type("OutLike", (ag.Out,), {})(2, np.float32)) is UNKNOWN  # as ever


async def test_kinds_say_where_a_group_places_a_dispatch(host: ag.Backend) -> None:
    buffer = host.empty(4, np.float32)
    array = np.ones(2)
    replicated = SimpleNamespace(on=lambda member: (member, "copy"))
    placing = [
        (buffer, buffer),
        (ag.Out(into=buffer), buffer),
        (ag.Out(4, np.float32), None),
        (ag.InOut(array), None),
        (array, None),
        (np.float32(1), None),
        (3, None),
    ]
    for value, held in placing:
        assert kind_for(value).holds(value) is held, value
        assert kind_for(value).on_member(value, "m") is value
    assert REPLICATED.holds(replicated) is None
    assert REPLICATED.on_member(replicated, 1) == (1, "copy")
    assert kind_for(np.ones(2).view(_Subarray)) is ARRAY  # not in the table: kind_of's


async def test_each_kind_describes_its_arguments_for_the_fast_path(host: ag.Backend) -> None:
    buffer = host.empty(4, np.float32)
    x = np.ones(4, np.float32)
    store: Any = host._store
    limits = LaunchLimits()
    calls = [
        bind(
            SCALE,
            args,
            grid=1,
            block=1,
            shared_mem=0,
            limits=limits,
            store=store,
            device_arrays=True,
        )
        for args in (
            (x, ag.Out(4, np.float32), np.float32(2), np.int32(4)),
            (buffer, ag.Out(into=buffer), np.float32(2), np.int32(4)),
            (x, ag.InOut(np.zeros(4, np.float32)), np.float32(2), np.int32(4)),
        )
    ]
    seen = set()
    for call in calls:
        for arg in call.args:
            found = fast_arg(arg)
            assert found is not None
            kind = BOUND_KINDS[type(arg)]
            assert found[0] in kind.codes.values()
            seen.add(found[0])
    assert seen == set(FAST_CODES.values())  # every code, from its kind's descriptor
    foreign = DeviceArg.__new__(DeviceArg)
    assert fast_arg(foreign) is None  # a device array never takes the fast path


class _Order:
    def __init__(self) -> None:
        self.done: list[tuple[Any, ...]] = []

    def zero(self, pointer: int, nbytes: int, stream: Any) -> None:
        self.done.append(("zero", pointer, nbytes, stream))

    def after_producer(self, producer: int, stream: Any) -> None:
        self.done.append(("after", producer, stream))


async def test_launch_values_order_what_their_kind_needs(
    host: ag.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    buffer = host.empty(4, np.float32)
    # A device buffer's storage has a pointer (a host one is an array): this one's is 0x5000.
    monkeypatch.setattr(_bound, "storage_of", lambda _buffer: SimpleNamespace(handle=0x5000))
    call = bind(
        SCALE,
        (buffer, ag.Out(into=buffer), np.float32(2), np.int32(4)),
        grid=1,
        block=1,
        shared_mem=0,
        limits=LaunchLimits(),
        store=host._store,
        device_arrays=True,
    )
    order = _Order()
    values = [arg.enqueue_value(0, "s", order.zero, order.after_producer) for arg in call.args]
    assert values == [arg.launch_value(0) for arg in call.args]
    into = call.args[1]
    assert isinstance(into, ResidentOutArg)
    assert order.done == [("zero", values[1], 16, "s")]  # the resident output alone
    assert isinstance(call.args[2], ScalarArg)

    foreign = DeviceArg.__new__(DeviceArg)
    foreign.pointer, foreign.producer = 0x7000, 9
    assert foreign.enqueue_value(0, "s", order.zero, order.after_producer) == 0x7000
    assert order.done[-1] == ("after", 9, "s")


def test_the_kinds_module_names_each_kind_once() -> None:
    named = [v for v in vars(_arg_kinds).values() if isinstance(v, ArgKind)]
    assert len(named) == len(set(named)) == len(ALL_KINDS) - 2  # Out and InOut: in _args
