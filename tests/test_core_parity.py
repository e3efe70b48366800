"""The two dispatch cores show the same face: every name the Python core exports, the compiled
core has, and their classes have the same public methods with the same parameters.

The front and the reactor call either core through these names only (``_cores.core``), so a
method added to one core and not the other, or a parameter renamed in one, would pass the suite
on one core and break the other where it runs. Behind the names, one workload runs on each core
against the stand-in driver (``tests/fake_driver/parity_scenario.py``) and must show the same:
results, errors and their messages, telemetry counts, in-flight counts and the buffers' record
of their uses.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from asyncgraph.cuda.core import _core_python as _core_py
from tests.fake_driver import run_scenario

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


@pytest.mark.parametrize("streams", ["immediate", "deferred"])
def test_one_workload_shows_the_same_on_both_cores(compiled: ModuleType, streams: str) -> None:
    seen = {
        core: run_scenario("tests.fake_driver.parity_scenario", core, streams=streams)
        for core in ("python", "compiled")
    }
    assert (seen["python"].pop("compiled"), seen["compiled"].pop("compiled")) == (False, True)
    for observed in seen.values():
        observed.pop("stderr")
    assert seen["python"] == seen["compiled"]
    # And what both saw is right (two cores wrong alike would agree too).
    observed = seen["python"]
    x = np.arange(1024, dtype=np.float32)
    assert observed["round_trips"] == [["ok", [float((2 * (x + i)).sum())]] for i in range(6)]
    assert observed["resident"] == float((x + 5).sum())
    assert observed["into_result"] == float((3 * (x + 5)).sum())
    assert observed["concurrent"] == [["ok", [float((2 * (x - i)).sum())]] for i in range(32)]
    assert [kind for kind, _ in observed["refused"]] == ["ArgumentTypeError"] * 2
    assert observed["stale"][0] == "StaleBufferError"
    assert observed["launch_failed"][0] == observed["event_failed"][0] == "CudaError"
    assert observed["after_failures"] == observed["round_trips"][0]  # the backend goes on
    counts = observed["telemetry"]
    assert counts["dispatches"] == counts["dispatches_completed"] + counts["dispatches_failed"]
    assert (counts["dispatches_failed"], counts["in_flight"], counts["queued"]) == (2, 0, 0)
    assert observed["resident_tracking"] == observed["target_tracking"] == [0, True, 0]
    assert observed["buffers_tracking"] == [[0, True, 0], [0, True, 0]]
