"""The compiled core changes the front's objects only through their owners' operations, which it
``cimport``s (``_fast_plan.pxi``). The owners (``tests.needs.OWNERS``) are Python modules that
the build compiles beside the core (``setup.py`` and ``scripts/build_core.py``, each with its
``OWNERS``), from their one source, with a ``.pxd`` each that declares their classes as extension
types, field by field, by the names of the classes' ``__slots__``.

These tests fail when the core cimports a module the build does not compile, when a ``.pxd``
and its class's ``__slots__`` name different fields, and they check that a compiled core whose
owners run as Python (which it would read as the wrong layout) is refused at its import:
``import asyncgraph._cuda`` then falls back to the Python core with a warning, instead of failing.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.needs import CORES, OWNERS, child_environment, source_copy

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
CORE = SRC / "asyncgraph" / "_cuda" / "core"
_CIMPORT = re.compile(r"^\s*from (asyncgraph\.[\w.]+) cimport", re.MULTILINE)
_CLASS = re.compile(r"^cdef class (\w+)\b.*:$")
_FIELD = re.compile(r"^    cdef (?:public |readonly )?[\w.]+ (\w+)(?:\s*#.*)?$")


def cimported() -> set[str]:
    """The package's modules the compiled core cimports."""
    sources = [*CORE.glob("*.pyx"), *CORE.glob("*.pxd"), *CORE.glob("*.pxi")]
    return {name for path in sources for name in _CIMPORT.findall(path.read_text("utf-8"))}


def owners_of(path: Path) -> tuple[str, ...]:
    """The value of the module-level ``OWNERS = (...)`` of the Python file at *path*."""
    for node in ast.parse(path.read_text("utf-8")).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["OWNERS"]:
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple)
            return value
    raise AssertionError(f"{path.name} sets no OWNERS")


def test_the_build_compiles_every_owner_the_core_cimports() -> None:
    assert cimported() == set(OWNERS)
    assert owners_of(ROOT / "setup.py") == owners_of(ROOT / "scripts" / "build_core.py") == OWNERS
    # The core's own check at its import names the same modules.
    checked = re.findall(r'"(asyncgraph\.\w+\._\w+)"', (CORE / "_fast_plan.pxi").read_text("utf-8"))
    assert sorted(checked) == sorted(OWNERS)


def fields_of(pxd: str) -> dict[str, list[str]]:
    """Each ``cdef class`` of a ``.pxd`` and the fields it declares (methods aside)."""
    classes: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in pxd.splitlines():
        if found := _CLASS.match(line):
            current = classes.setdefault(found.group(1), [])
        elif line and not line.startswith((" ", "#")):
            current = None
        elif current is not None and (field := _FIELD.match(line)):
            current.append(field.group(1))
    return classes


def slots_of(source: str) -> dict[str, list[str]]:
    """Each class of a Python module and the names its ``__slots__`` lists."""
    slots: dict[str, list[str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                targets = getattr(statement, "targets", [])
                if [ast.unparse(t) for t in targets] == ["__slots__"]:
                    slots[node.name] = list(ast.literal_eval(statement.value))  # type: ignore[attr-defined]  # an Assign, found by its targets
    return slots


def layout_problems(root: Path, modules: tuple[str, ...]) -> list[str]:
    """Where a ``.pxd`` of *modules* (under *root*) and its module's ``__slots__`` disagree."""
    problems = []
    for name in modules:
        path = root / Path(*name.split("."))
        declared = fields_of(path.with_suffix(".pxd").read_text("utf-8"))
        slots = slots_of(path.with_suffix(".py").read_text("utf-8"))
        if not declared:
            problems.append(f"{name}: its .pxd declares no class")
        for cls, fields in declared.items():
            if cls not in slots:
                problems.append(f"{name}.{cls}: no __slots__ in the .py")
            elif sorted(fields) != sorted(slots[cls]):
                only_pxd = sorted(set(fields) - set(slots[cls]))
                only_py = sorted(set(slots[cls]) - set(fields))
                problems.append(f"{name}.{cls}: .pxd only {only_pxd}, __slots__ only {only_py}")
    return problems


def test_each_owner_declares_the_fields_its_slots_name() -> None:
    assert layout_problems(SRC, OWNERS) == []
    pxd = (SRC / "asyncgraph" / "_jobs" / "_pending.pxd").read_text("utf-8")
    assert "_state" in fields_of(pxd)["PendingDispatch"]  # the check reads the fields


def test_a_field_missing_from_the_pxd_or_the_slots_is_found(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "_owner.py").write_text(
        'class A:\n    __slots__ = ("__weakref__", "_state", "_new")\n', encoding="utf-8"
    )
    (tmp_path / "pkg" / "_owner.pxd").write_text(
        "cdef class A:\n    cdef object __weakref__\n    cdef public int _state\n"
        "    cdef public object _old\n\n    cpdef f(self)\n",
        encoding="utf-8",
    )
    assert layout_problems(tmp_path, ("pkg._owner",)) == [
        "pkg._owner.A: .pxd only ['_old'], __slots__ only ['_new']"
    ]


CHILD = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import asyncgraph._cuda
    from asyncgraph._cuda.core._choose import core, describe
print(json.dumps({"compiled": bool(core.COMPILED), "describe": describe(),
                  "warnings": [str(w.message) for w in caught]}))
"""
_REFUSED = (
    r"the compiled core does not match this asyncgraph \(\w+Error: [^)]*"
    r"asyncgraph\._(jobs|buffers)\._\w+[^)]*\); rebuild it \(pip install -e \. in a checkout\)"
)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("owner", OWNERS)
def test_a_core_whose_owner_runs_as_python_is_refused_with_a_warning(
    core: str, owner: str, tmp_path: Path
) -> None:
    # The copy keeps the compiled core and every owner's build but one, which runs as Python.
    kept = tuple(name for name in OWNERS if name != owner)
    source = source_copy(tmp_path, keep=("asyncgraph._cuda.core._core_compiled", *kept))
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=tmp_path,
        env={**child_environment(source), "ASYNCGRAPH_CORE": core},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["compiled"] is False
    if core == "python":
        assert seen["warnings"] == []
        return
    assert len(seen["warnings"]) == 1
    assert re.match(rf"^asyncgraph: {_REFUSED}; the Python core runs$", seen["warnings"][0])
    assert re.match(rf"^Python \({_REFUSED}\)$", seen["describe"])


@pytest.mark.compiled
def test_the_compiled_core_runs_the_compiled_owners() -> None:
    importlib.import_module("asyncgraph._cuda.core._core_compiled")
    for name in OWNERS:
        module = importlib.import_module(name)
        assert type(module.__loader__).__name__ == "ExtensionFileLoader", name
        assert os.path.exists(module.__file__ or ""), name
