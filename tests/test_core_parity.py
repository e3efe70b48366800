"""The two dispatch cores show the same leaf: every class and function one core's ``__all__``
names (the launcher, event record and query, the reactor's watches and waiters) is in the other's,
with the same public methods and constructor, taking the same parameters.

The engine and the reactor call either core through these names only (``_choose.core``), so a
method added to one core and not the other, or a parameter renamed in one, would pass the suite
on one core and break the other where it runs. :func:`face_mismatches` lists every difference
(a test on a synthetic pair proves it finds each kind). The compiled core's fast path has no
twin: the Python core runs the general path, which is the reference. So one workload runs on
each core against the stand-in driver (``tests/fake_driver/parity_scenario.py``), the fast path
against the general path, and must show the same: results, errors and their messages,
telemetry counts, in-flight counts and the buffers' record of their uses, step by step; what
only the fast path has (its count of dispatches, its own job type) is compared to what it must
be on each.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from asyncgraph._cuda.core import _core_python as _core_py
from tests.fake_driver import run_scenario

from .needs import compiled_core

CUDA = Path(__file__).resolve().parent.parent / "src" / "asyncgraph" / "_cuda" / "core"

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


def python_constructor(cls: type) -> list[str] | None:
    """The parameters of *cls*'s constructor (``self`` left out), read by ``inspect``."""
    try:
        return list(inspect.signature(cls).parameters)
    except ValueError:
        return None


_CLASS = re.compile(r"^cdef class (\w+)", re.MULTILINE)
_TOP = re.compile(r"^(?:cdef |cpdef |def |class |include )", re.MULTILINE)
_INIT = re.compile(r"^    def (__init__|__cinit__)\(self,?(.*?)\):", re.MULTILINE | re.DOTALL)


def cython_constructors(sources: list[Path]) -> dict[str, list[str]]:
    """Per ``cdef class`` of the Cython *sources*, the parameters of its ``__init__`` (else its
    ``__cinit__``), read from the source: ``inspect`` cannot see a cdef class's constructor.
    A class with neither takes none."""
    found: dict[str, list[str]] = {}
    for path in sources:
        text = path.read_text(encoding="utf-8")
        for match in _CLASS.finditer(text):
            following = _TOP.search(text, match.end())
            body = text[match.end() : following.start() if following else len(text)]
            inits: dict[str, str] = dict(_INIT.findall(body))
            params = inits.get("__init__", inits.get("__cinit__", ""))
            names = [p.split("=")[0].split()[-1] for p in params.split(",") if p.strip()]
            found[match.group(1)] = names
    return found


def compiled_constructor(cls: type) -> list[str] | None:
    """The parameters of the compiled core's class *cls*'s constructor, from its sources."""
    sources = [CUDA / "_core_compiled.pyx", *sorted(CUDA.glob("*.pxi"))]
    return cython_constructors(sources).get(cls.__name__)


def face_mismatches(
    python: Mapping[str, object],
    compiled: Mapping[str, object],
    constructors: tuple[Callable[[type], list[str] | None], Callable[[type], list[str] | None]],
) -> list[str]:
    """Every difference between two cores' faces (name -> class or function), one line each:
    a name in one core only, a class in one and a function in the other, a public method in
    one class only, and parameters that differ (of a function, a method, or a constructor as
    *constructors* read it on each side). The exceptions above are left out."""
    problems: list[str] = []
    for name in sorted(python.keys() - compiled.keys()):
        problems.append(f"{name}: in the Python core only")
    for name in sorted(compiled.keys() - python.keys()):
        problems.append(f"{name}: in the compiled core only")
    for name in sorted(python.keys() & compiled.keys()):
        ours, theirs = python[name], compiled[name]
        if name in OPTIONAL and ours is None:
            continue
        if isinstance(ours, type) != isinstance(theirs, type):
            problems.append(f"{name}: a class in one core, a function in the other")
        elif isinstance(ours, type) and isinstance(theirs, type):
            problems.extend(_class_mismatches(name, ours, theirs, constructors))
        elif callable(ours) and callable(theirs):
            a, b = _parameters(ours), _parameters(theirs)
            if a != b and not (name in DRIVER_FUNCTIONS and len(a) == len(b)):
                problems.append(f"{name}: parameters {a} (Python) and {b} (compiled)")
    return problems


def _class_mismatches(
    name: str,
    ours: type,
    theirs: type,
    constructors: tuple[Callable[[type], list[str] | None], Callable[[type], list[str] | None]],
) -> list[str]:
    problems: list[str] = []
    mine, yours = _methods(ours), _methods(theirs)
    for method in sorted(mine.keys() - yours.keys()):
        problems.append(f"{name}.{method}: in the Python core only")
    for method in sorted(yours.keys() - mine.keys()):
        problems.append(f"{name}.{method}: in the compiled core only")
    for method in sorted(mine.keys() & yours.keys()):
        a, b = _parameters(mine[method]), _parameters(yours[method])
        if a != b:
            problems.append(f"{name}.{method}: parameters {a} (Python) and {b} (compiled)")
    a_init, b_init = constructors[0](ours), constructors[1](theirs)
    if a_init != b_init:
        problems.append(f"{name}(): parameters {a_init} (Python) and {b_init} (compiled)")
    return problems


def leaf_face(module: ModuleType) -> dict[str, object]:
    """A core's leaf: the classes and functions its ``__all__`` names, by name."""
    face = {name: getattr(module, name) for name in module.__all__}
    return {name: value for name, value in face.items() if callable(value) or value is None}


@pytest.fixture(scope="module")
def compiled() -> ModuleType:
    return compiled_core()


def test_every_exported_name_of_the_python_core_is_in_the_compiled_core(
    compiled: ModuleType,
) -> None:
    missing = [name for name in _core_py.__all__ if not hasattr(compiled, name)]
    assert missing == []
    assert sorted(compiled.__all__) == sorted(_core_py.__all__)  # one leaf, named alike
    for name in _core_py.__all__:
        ours, theirs = getattr(_core_py, name), getattr(compiled, name)
        if name in OPTIONAL and ours is None:
            assert theirs is not None, f"{name}: the compiled core has it"
            continue
        assert isinstance(theirs, type) == isinstance(ours, type), name
        assert callable(theirs) == callable(ours), name


def test_both_cores_have_the_same_classes_functions_methods_and_parameters(
    compiled: ModuleType,
) -> None:
    face = leaf_face(compiled)
    assert {"Launcher", "Watches", "Watch", "NativeWaiter", "record", "query"} <= face.keys()
    constructors = (python_constructor, compiled_constructor)
    problems = face_mismatches(leaf_face(_core_py), face, constructors)
    assert problems == [], "the cores differ:\n" + "\n".join(problems)


def test_the_constructors_are_read_from_the_cython_sources() -> None:
    sources = [CUDA / "_core_compiled.pyx", *sorted(CUDA.glob("*.pxi"))]
    found = cython_constructors(sources)
    assert found["Watches"] == ["lanes", "idle_events", "spin_window", "context"]  # typed
    assert found["Launcher"] == ["function", "params"]  # __cinit__ only
    assert found["KnownKernel"] == []
    assert found["Watch"] == ["seq", "event", "callback", "expect"]


class _Twin:
    """A class of a synthetic core, and what differs in its twin below."""

    def __init__(self, a: int, b: int = 0) -> None:
        del a, b

    def same(self, x: int) -> None:
        del x

    def renamed(self, x: int) -> None:
        del x

    def only_here(self) -> None:
        pass

    @staticmethod
    def static(kernels: object) -> None:
        del kernels


class _OtherTwin:
    def __init__(self, a: int) -> None:
        del a

    def same(self, x: int) -> None:
        del x

    def renamed(self, y: int) -> None:
        del y

    def only_there(self) -> None:
        pass

    @staticmethod
    def static(kernels: object, extra: object) -> None:
        del kernels, extra


def _f(a: int, b: int) -> None:
    del a, b


def _g(a: int, c: int) -> None:
    del a, c


def test_face_mismatches_finds_each_kind_of_difference() -> None:
    python = {"Twin": _Twin, "f": _f, "record": _f, "Both": _Twin, "Gone": _Twin, "h": _f}
    compiled = {"Twin": _OtherTwin, "f": _g, "record": _g, "Both": _Twin, "New": _f, "h": _Twin}
    constructors = (python_constructor, python_constructor)
    assert face_mismatches(python, compiled, constructors) == [
        "Gone: in the Python core only",
        "New: in the compiled core only",
        "Twin.only_here: in the Python core only",
        "Twin.only_there: in the compiled core only",
        "Twin.renamed: parameters ['self', 'x'] (Python) and ['self', 'y'] (compiled)",
        "Twin.static: parameters ['kernels'] (Python) and ['kernels', 'extra'] (compiled)",
        "Twin(): parameters ['a', 'b'] (Python) and ['a'] (compiled)",
        "f: parameters ['a', 'b'] (Python) and ['a', 'c'] (compiled)",
        "h: a class in one core, a function in the other",
    ]
    assert face_mismatches(python, python, constructors) == []


@pytest.mark.parametrize("streams", ["immediate", "deferred"])
def test_one_workload_shows_the_same_on_both_cores(compiled: ModuleType, streams: str) -> None:
    seen = {
        core: run_scenario("tests.fake_driver.parity_scenario", core, streams=streams)
        for core in ("python", "compiled")
    }
    assert (seen["python"].pop("compiled"), seen["compiled"].pop("compiled")) == (False, True)
    for observed in seen.values():
        observed.pop("stderr")
    # The compiled core took the fast path where it could, the Python core the general path.
    fast = {core: _fast_path_facts(observed) for core, observed in seen.items()}
    assert fast["python"] == {"dispatches": 0, "jobs": ["CudaJob"]}
    assert fast["compiled"]["dispatches"] > 0
    assert fast["compiled"]["jobs"] == ["CudaJob", "FastJob"]
    assert _general(seen["python"]) == _general(seen["compiled"])
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
    for core, observed in seen.items():
        _check_steps(observed["steps"], compiled=core == "compiled")


def _fast_path_facts(observed: Any) -> dict[str, Any]:
    """What only the fast path shows: the most dispatches it counted, the job types seen."""
    counts: list[int] = []
    jobs: set[str] = set()

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            counts.extend(v for k, v in value.items() if k == "fast_path_dispatches")
            for v in value.values():
                visit(v)
        elif isinstance(value, list):
            if len(value) == 2 and value[0] in ("CudaJob", "FastJob"):
                jobs.add(value[0])
            for v in value:
                visit(v)

    visit(observed)
    return {"dispatches": max(counts), "jobs": sorted(jobs)}


# What the fast path changes otherwise than the general path: its own count, and the pinned
# pool's statistics (it stages in its lanes' rings, which are no blocks of the pool).
_FAST_PATH_ONLY = {
    "fast_path_dispatches",
    "pool_hits",
    "pool_misses",
    "pool_bytes_cached",
    "pool_bytes_in_use",
}


def _general(observed: Any) -> Any:
    """*observed* as the general path shows it: what only the fast path changes left out, its
    jobs named as the general path's."""
    if isinstance(observed, dict):
        return {k: _general(v) for k, v in observed.items() if k not in _FAST_PATH_ONLY}
    if isinstance(observed, list):
        if len(observed) == 2 and observed[0] == "FastJob":
            return ["CudaJob", observed[1]]
        return [_general(v) for v in observed]
    return observed


def _check_steps(steps: list[Any], compiled: bool) -> None:
    """What the steps of ``parity_scenario.steps`` must show (on both cores alike but for the
    fast path's own count and job type, which only the compiled core has)."""
    noted = {row[0]: row[1:] for row in steps if isinstance(row[1], dict)}
    fast = [noted[f"empty {i}: ['ok', []]"][0]["fast_path_dispatches"] for i in range(3)]
    assert fast == ([0, 1, 2] if compiled else [0, 0, 0])  # a signature's first: general
    fast_job = "FastJob" if compiled else "CudaJob"
    for cycle, kind in ((0, "CudaJob"), (1, fast_job)):
        counts, (buffer, target) = noted[f"{cycle}: read into the target"]
        first = 4 + 3 * cycle  # the dispatch ids: read, write, read into the target
        assert buffer == [3, [kind, first + 1], [[kind, first + 2]]]  # the read before the write
        assert target == [1, [kind, first + 2], []]
        assert counts["in_flight"] == 3
        awaited = next(row for label, row in noted.items() if label.startswith(f"{cycle}: awaited"))
        assert awaited[1] == [[0, None, []], [0, None, []]]
    assert [row for row in steps if row[0] == "target"] == [["target", 1577472.0]]
    before = next(row[0] for label, row in noted.items() if label.startswith("a round trip"))
    counts = noted["past the bound"][0]
    assert (counts["in_flight"], counts["queued"]) == (3, 2)  # the bound is 3
    assert counts["fast_path_dispatches"] - before["fast_path_dispatches"] == (3 if compiled else 0)
    assert noted["bound drained"][0]["in_flight"] == 0
    counts, (buffer,) = noted["cancelled: done False"]
    assert (counts["in_flight"], buffer[0], buffer[1][0]) == (1, 1, fast_job)
    counts, (buffer,) = noted["cancelled, then: ['ok', []]"]
    assert (counts["in_flight"], buffer) == (0, [0, None, []])
    counts, uses = noted["closed"]
    assert counts["dispatches"] == counts["dispatches_completed"] == counts["queue_wait values"]
    assert uses == [[0, None, []], [0, None, []]]
