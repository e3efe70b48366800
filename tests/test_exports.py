"""The public surface: every name exported once, nothing private leaking."""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

import asyncgraph as ag


def test_all_is_a_sorted_tuple_without_duplicates() -> None:
    assert isinstance(ag.__all__, tuple)
    assert len(set(ag.__all__)) == len(ag.__all__)
    assert list(ag.__all__) == sorted(ag.__all__)


def test_every_exported_name_exists() -> None:
    missing = [name for name in ag.__all__ if not hasattr(ag, name)]
    assert missing == []


def test_every_public_attribute_is_exported() -> None:
    for name in ag.__all__:  # the names load when first used (tests/test_imports.py)
        getattr(ag, name)
    public = {
        name
        for name, value in vars(ag).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public - set(ag.__all__) == set()


def _typing_imports(path: Path) -> dict[str, str]:
    """``name -> module`` of the imports under ``if typing.TYPE_CHECKING:`` in *path*."""
    names: dict[str, str] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "typing.TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.module is not None:
                    names.update((alias.name, statement.module) for alias in statement.names)
    return names


def test_what_a_type_checker_sees_is_what_a_name_loads() -> None:
    # The package's names load lazily; a type checker reads them from the typing-only imports.
    # Both must name the same object, and together with the error tree cover __all__.
    typed = _typing_imports(Path(ag.__file__))
    for name, module in typed.items():
        assert getattr(ag, name) is getattr(importlib.import_module(module), name), name
    errors = {name for name in ag.__all__ if name.endswith("Error")}
    assert set(typed) | errors | {"__version__"} == set(ag.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"^module 'asyncgraph' has no attribute 'Kernal'$"):
        _ = ag.Kernal  # type: ignore[attr-defined]  # the misspelling is the test
    assert set(ag.__all__) <= set(dir(ag))


def test_both_batchers_and_what_they_return_are_exported() -> None:
    # ag.batcher batches a kernel's rows, ag.batch any async function; both return objects
    # whose statistics() is a BatcherStatistics with a BatchLaunches.
    names = (
        "batch", "batcher", "BatchedFunction", "Batcher", "BatcherStatistics", "BatchLaunches",
        "BatchFunctionError", "Row",
    )  # fmt: skip
    assert [name for name in names if name not in ag.__all__] == []
    assert isinstance(ag.batch(_nothing), ag.BatchedFunction)
    assert issubclass(ag.BatchFunctionError, ag.AsyncGraphError)


async def _nothing(xs: list[object]) -> list[object]:
    return xs


def test_exceptions_form_the_documented_tree() -> None:
    assert issubclass(ag.DeviceFaultError, ag.CudaError)
    assert issubclass(ag.ShapeMismatchError, ag.DispatchError)
    assert issubclass(ag.ArgumentTypeError, TypeError)
    assert issubclass(ag.DispatchError, ValueError)
    assert issubclass(ag.AllocationError, MemoryError)
    assert issubclass(ag.NotPicklableError, ag.UnsupportedError)
    assert issubclass(ag.NotPicklableError, TypeError)
    assert issubclass(ag.StartTimeoutError, TimeoutError)
    assert issubclass(ag.GroupError, ValueError)
    for name in ag.__all__:
        value = getattr(ag, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, ag.AsyncGraphError), name


def test_version_comes_from_package_metadata() -> None:
    assert isinstance(ag.__version__, str)
    assert ag.__version__ != ""


@pytest.mark.parametrize("module", ["asyncgraph.pool", "asyncgraph.capture", "asyncgraph.testing"])
def test_public_submodules_export_what_they_define(module: str) -> None:
    mod = importlib.import_module(module)
    assert isinstance(mod.__all__, tuple)
    assert len(set(mod.__all__)) == len(mod.__all__)
    assert [name for name in mod.__all__ if not hasattr(mod, name)] == []
