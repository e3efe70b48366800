"""The two dispatch cores show the same face: every name the Python core exports, the compiled
core has, and their classes have the same public methods with the same parameters.

The front and the reactor call either core through these names only (``_cores.core``), so a
method added to one core and not the other, or a parameter renamed in one, would pass the suite
on one core and break the other where it runs. The behaviour behind the names is checked by the
scenarios that run on both cores against the stand-in driver (``tests/test_reactor.py``,
``tests/test_core.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from asyncgraph.cuda import _core_py

from .needs import compiled_core

# Names a core may leave empty: the Python core has no native waiter threads.
OPTIONAL = {"NativeWaiter"}
# Functions that are the driver's own in the Python core (cuda.bindings' ``cuEventQuery`` and
# ``cuEventRecord``) and thin wrappers in the compiled one: their parameters differ in name.
DRIVER_FUNCTIONS = {"query", "record"}


def _methods(cls: type) -> dict[str, Callable[..., Any]]:
    """The public methods of *cls* (functions, static and class methods; not data)."""
    found: dict[str, Callable[..., Any]] = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        value = inspect.getattr_static(cls, name)
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if callable(value) and not isinstance(value, type):
            found[name] = value
    return found


def _parameters(fn: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(fn).parameters)


@pytest.fixture(scope="module")
def compiled() -> ModuleType:
    return compiled_core()


def test_every_name_of_the_python_core_is_in_the_compiled_core(compiled: ModuleType) -> None:
    missing = [name for name in _core_py.__all__ if not hasattr(compiled, name)]
    assert missing == []
    for name in _core_py.__all__:
        ours, theirs = getattr(_core_py, name), getattr(compiled, name)
        if name in OPTIONAL and ours is None:
            assert theirs is not None, f"{name}: the compiled core has it"
            continue
        assert isinstance(theirs, type) == isinstance(ours, type), name
        assert callable(theirs) == callable(ours), name


@pytest.mark.parametrize(
    "name", [name for name in _core_py.__all__ if isinstance(getattr(_core_py, name), type)]
)
def test_each_class_has_the_same_methods_and_parameters_in_both_cores(
    compiled: ModuleType, name: str
) -> None:
    ours, theirs = _methods(getattr(_core_py, name)), _methods(getattr(compiled, name))
    assert sorted(ours) == sorted(theirs), f"{name}: the methods differ"
    differ = {
        method: (_parameters(ours[method]), _parameters(theirs[method]))
        for method in ours
        if _parameters(ours[method]) != _parameters(theirs[method])
    }
    assert differ == {}, f"{name}: parameters differ (Python core, compiled core)"


def test_the_module_functions_take_as_many_arguments_in_both_cores(compiled: ModuleType) -> None:
    for name in _core_py.__all__:
        ours = getattr(_core_py, name)
        if not callable(ours) or isinstance(ours, type):
            continue
        theirs = getattr(compiled, name)
        assert len(_parameters(ours)) == len(_parameters(theirs)), name
        if name not in DRIVER_FUNCTIONS:
            assert _parameters(ours) == _parameters(theirs), name
