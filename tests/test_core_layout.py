"""The compiled core reads and writes some slots of the front's classes in place, at offsets it
takes from their member descriptors at import (``_core_plan.pxi`` and the ``_core_mirror.pxi``
it includes: ``_slot`` and ``_offset``).

These tests read those mirrors from the source, so they fail when a mirrored name is no slot of
its Python class any more, whether the compiled core is built or not; and they check that such
a change makes ``import asyncgraph.cuda`` fall back to the Python core with a warning, instead
of failing.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from asyncgraph._resident import ResidentBuffer
from tests.needs import CORES

ROOT = Path(__file__).resolve().parent.parent
CUDA = ROOT / "src" / "asyncgraph" / "cuda"
SOURCES = (CUDA / "_core_plan.pxi", CUDA / "_core_mirror.pxi")  # the second included by the first
_IMPORTED = re.compile(r"^from \.\.(\w+) import (\w+) as (\w+)$", re.MULTILINE)
_SLOT = re.compile(r"_slot\((\w+), \"(\w+)\"\)")
_OFFSET = re.compile(r"_offset\(\"(\w+)\"\)")
_OFFSET_OF = re.compile(r"return _slot\((\w+), name\)")  # the class _offset() reads


def mirrored() -> list[tuple[type, str]]:
    """Each (class, slot name) the compiled core mirrors, read from its source."""
    source = "\n".join(path.read_text(encoding="utf-8") for path in SOURCES)
    classes: dict[str, type] = {}
    for module, name, alias in _IMPORTED.findall(source):
        value = getattr(importlib.import_module(f"asyncgraph.{module}"), name)
        if isinstance(value, type):
            classes[alias] = value
    pairs = [(classes[alias], name) for alias, name in _SLOT.findall(source)]
    (offset_class,) = _OFFSET_OF.findall(source)
    pairs += [(classes[offset_class], name) for name in _OFFSET.findall(source)]
    return pairs


def disagreements(pairs: list[tuple[type, str]]) -> list[str]:
    """The mirrored names that are no slot of their class (a slot is a member descriptor in
    the class's own ``__dict__``, which is what the compiled core reads the offset of)."""
    problems = []
    for cls, name in pairs:
        descriptor = cls.__dict__.get(name)
        kind = type(descriptor).__name__
        if kind != "member_descriptor":
            problems.append(f"{cls.__name__}.{name} is {kind}, not a slot")
    return problems


def test_every_slot_the_compiled_core_mirrors_is_a_slot_of_its_class() -> None:
    pairs = mirrored()
    names = {f"{cls.__name__}.{name}" for cls, name in pairs}
    assert {"ResidentBuffer._writer", "Out.into", "PendingDispatch._outcome"} <= names
    assert len(pairs) >= 18
    assert disagreements(pairs) == []


def test_a_slot_made_a_property_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ResidentBuffer, "_writer", property(lambda self: None))
    assert disagreements(mirrored()) == ["ResidentBuffer._writer is property, not a slot"]


CHILD = """
import json, warnings
import asyncgraph._resident as resident
resident.ResidentBuffer._writer = property(lambda self: None)  # the layout changed
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import asyncgraph.cuda
    from asyncgraph.cuda._cores import core, describe
print(json.dumps({"compiled": bool(core.COMPILED), "describe": describe(),
                  "warnings": [str(w.message) for w in caught]}))
"""


@pytest.mark.parametrize("core", CORES)
def test_a_layout_change_falls_back_to_the_python_core_with_a_warning(core: str) -> None:
    # It raised TypeError from _slot() out of ``import asyncgraph.cuda``.
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        env={**os.environ, "ASYNCGRAPH_CORE": core},
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
    reason = (
        "the compiled core does not match this asyncgraph (TypeError: ResidentBuffer._writer "
        "is not a slot); rebuild it (pip install -e . in a checkout)"
    )
    assert seen["warnings"] == [f"asyncgraph: {reason}; the Python core runs"]
    assert seen["describe"] == f"Python ({reason})"
