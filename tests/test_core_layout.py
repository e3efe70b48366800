"""The compiled core reads and writes some slots of the front's classes in place, at offsets it
takes from their member descriptors at import (``_doors.pxi``, included by
``_fast_plan.pxi``: ``_slot``): the private slots their owners lend it for its copies of their
doors (``_resident.BUFFER_FIELDS``, ``_pending.PENDING_FIELDS``), and public slots it names.

These tests fail when a lent or named name is no slot of its Python class any more, whether the
compiled core is built or not, and when the core names a private slot itself; and they check
that such a change makes ``import asyncgraph.cuda`` fall back to the Python core with a warning,
instead of failing.
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

from asyncgraph.buffers._resident import BUFFER_FIELDS, ResidentBuffer
from asyncgraph.jobs._pending import PENDING_FIELDS, PendingDispatch
from tests.needs import CORES

ROOT = Path(__file__).resolve().parent.parent
CUDA = ROOT / "src" / "asyncgraph" / "cuda" / "core"
SOURCES = (CUDA / "_fast_plan.pxi", CUDA / "_doors.pxi")  # the second included by the first
_IMPORTED = re.compile(r"^from asyncgraph\.([\w.]+) import (\w+) as (\w+)$", re.MULTILINE)
_NAMED = re.compile(r"_slot\((\w+), \"(\w+)\"\)")  # a slot the core names itself
_LENT = re.compile(r"_slot\((\w+), (\w+)\[\"(\w+)\"\]\)")  # one an owner lends, by role


def mirrored() -> list[tuple[type, str]]:
    """Each (class, slot name) the compiled core uses at an offset: the slots it names, and
    those the owners lend (each role it asks for must be lent)."""
    source = "\n".join(path.read_text(encoding="utf-8") for path in SOURCES)
    imported: dict[str, object] = {}
    for module, name, alias in _IMPORTED.findall(source):
        imported[alias] = getattr(importlib.import_module(f"asyncgraph.{module}"), name)
    pairs = [(imported[alias], name) for alias, name in _NAMED.findall(source)]
    for alias, lender, role in _LENT.findall(source):
        fields = imported[lender]
        assert isinstance(fields, dict), lender
        pairs.append((imported[alias], fields[role]))
    return [(cls, name) for cls, name in pairs if isinstance(cls, type)]


def disagreements(pairs: list[tuple[type, str]]) -> list[str]:
    """The names that are no slot of their class (a slot is a member descriptor in the class's
    own ``__dict__``, which is what the compiled core reads the offset of)."""
    problems = []
    for cls, name in pairs:
        descriptor = cls.__dict__.get(name)
        kind = type(descriptor).__name__
        if kind != "member_descriptor":
            problems.append(f"{cls.__name__}.{name} is {kind}, not a slot")
    return problems


def test_every_slot_the_compiled_core_uses_is_a_slot_of_its_class() -> None:
    pairs = mirrored()
    names = {f"{cls.__name__}.{name}" for cls, name in pairs}
    lent = {f"ResidentBuffer.{name}" for name in BUFFER_FIELDS.values()}
    lent |= {f"PendingDispatch.{name}" for name in PENDING_FIELDS.values()}
    assert lent | {"Out.into", "PendingDispatch.dispatch_id"} <= names
    assert len(pairs) >= 19
    assert disagreements(pairs) == []


def test_the_compiled_core_names_no_private_slot_itself() -> None:
    source = "\n".join(path.read_text(encoding="utf-8") for path in SOURCES)
    named = _NAMED.findall(source)
    assert named, "no slot named: the check would pass vacuously"
    assert [name for _, name in named if name.startswith("_")] == []
    assert {PendingDispatch, ResidentBuffer} <= {cls for cls, _ in mirrored()}


def test_a_slot_made_a_property_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ResidentBuffer, "_writer", property(lambda self: None))
    assert disagreements(mirrored()) == ["ResidentBuffer._writer is property, not a slot"]


CHILD = """
import json, warnings
import asyncgraph.buffers._resident as resident
resident.ResidentBuffer._writer = property(lambda self: None)  # the layout changed
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import asyncgraph.cuda
    from asyncgraph.cuda.core._choose import core, describe
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
