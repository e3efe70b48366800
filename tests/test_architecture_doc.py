"""``docs/architecture.md``'s picture of the layers, checked against the imports.

The picture is a Mermaid flowchart: each box a layer naming its modules (dotted, below
``asyncgraph``; ``asyncgraph`` itself is the package's ``__init__``), each arrow pointing down
to a layer the one above may use. Every module must stand in exactly one box, and every import
(typing-only ones included) must stay in its layer or go down the arrows.

Folders are layers: all the modules of a folder (its ``__init__`` and the modules beside it, not
its sub-folders, which are folders of their own; the package's root is a folder too) stand in
one box, and no two folders import each other, typing-only imports included.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from tests.test_structure import PACKAGE, SRC, Module, iter_imports, load_modules, resolve

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
# What users import below the package, besides its root: every other folder or module at the
# top of the package is private, and says so with a leading underscore.
PUBLIC = frozenset({"capture", "pool", "prometheus", "ray", "testing", "__main__"})
_BLOCK = re.compile(r"```mermaid\n(.*?)```", re.DOTALL)
_NODE = re.compile(r'^\s*(\w+)\["(.*)"\]\s*$')
_EDGE = re.compile(r"^\s*(\w+)\s*-->\s*(\w+)\s*$")


def read_picture(text: str) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """(layer -> its module names, layer -> the layers its arrows point to) of the first
    Mermaid block of *text*.

    Raises:
        ValueError: no Mermaid block, or a line that is neither a box nor an arrow.
    """
    found = _BLOCK.search(text)
    if found is None:
        raise ValueError("no ```mermaid block")
    layers: dict[str, list[str]] = {}
    arrows: dict[str, set[str]] = defaultdict(set)
    for line in found.group(1).splitlines()[1:]:  # after "flowchart TD"
        if not line.strip():
            continue
        if node := _NODE.match(line):
            _title, *lists = node.group(2).split("<br/>")
            layers[node.group(1)] = [name for part in lists for name in part.split()]
        elif edge := _EDGE.match(line):
            arrows[edge.group(1)].add(edge.group(2))
        else:
            raise ValueError(f"neither a box nor an arrow: {line!r}")
    return layers, arrows


def check_picture(root: Path, package: str, text: str) -> list[str]:
    """What the picture in *text* gets wrong about the package under *root*."""
    layers, arrows = read_picture(text)
    modules = load_modules(root, package)
    problems = [
        f"an arrow from or to no box: {a} --> {b}"
        for a, targets in arrows.items()
        for b in targets
        if a not in layers or b not in layers
    ]
    layer_of: dict[str, str] = {}
    for layer, names in layers.items():
        for name in names:
            full = package if name == package else f"{package}.{name}"
            if full in layer_of:
                problems.append(f"{name} stands in {layer_of[full]} and in {layer}")
            layer_of[full] = layer
    ghosts = [name for name in layer_of if name not in modules]
    problems += [f"{name} is in the picture but is no module" for name in ghosts]
    missing = [name for name in modules if name not in layer_of]
    problems += [f"{name} is in no box of the picture" for name in missing]

    def below(layer: str) -> set[str]:
        seen: set[str] = set()
        todo = [layer]
        while todo:
            for nxt in arrows.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    for module in modules.values():
        here = layer_of.get(module.name)
        if here is None:
            continue
        allowed = below(here) | {here}
        for node, _typing_only in iter_imports(module.tree):
            for target, _, _ in resolve(module, node, modules):
                there = layer_of.get(target)
                if target != package and there is not None and there not in allowed:
                    problems.append(
                        f"{module.name}:{node.lineno} ({here}) imports {target} ({there}), "
                        "a layer it may not use"
                    )
    return problems


def folder_of(module: Module) -> str:
    """The folder *module* lives in, dotted: a package is its own folder's ``__init__``."""
    return module.name if module.is_package else module.name.rpartition(".")[0]


def check_folders(root: Path, package: str, text: str) -> list[str]:
    """Where the folders of the package under *root* are not layers of the picture in *text*: a
    folder whose modules stand in more than one box, two folders importing each other."""
    layers, _ = read_picture(text)
    modules = load_modules(root, package)
    boxes: dict[str, set[str]] = defaultdict(set)
    for layer, names in layers.items():
        for name in names:
            module = modules.get(package if name == package else f"{package}.{name}")
            if module is not None:
                boxes[folder_of(module)].add(layer)
    problems = [
        f"folder {folder} stands in {len(found)} boxes: {', '.join(sorted(found))}"
        for folder, found in sorted(boxes.items())
        if len(found) > 1
    ]
    first_import: dict[tuple[str, str], str] = {}
    for module in sorted(modules.values(), key=lambda m: m.name):
        for node, _typing_only in sorted(iter_imports(module.tree), key=lambda i: i[0].lineno):
            for target, _, _ in resolve(module, node, modules):
                edge = (folder_of(module), folder_of(modules[target]))
                if edge[0] != edge[1]:
                    first_import.setdefault(edge, f"{module.name}:{node.lineno} imports {target}")
    problems += [
        f"folders {a} and {b} import each other: {where}; {first_import[b, a]}"
        for (a, b), where in sorted(first_import.items())
        if a < b and (b, a) in first_import
    ]
    return problems


def test_the_picture_of_the_layers_matches_the_imports() -> None:
    problems = check_picture(SRC, PACKAGE, DOC.read_text(encoding="utf-8"))
    if problems:
        pytest.fail("docs/architecture.md's layers:\n" + "\n".join(problems), pytrace=False)


def test_each_folder_is_one_layer() -> None:
    problems = check_folders(SRC, PACKAGE, DOC.read_text(encoding="utf-8"))
    if problems:
        pytest.fail("folders that are no layer:\n" + "\n".join(problems), pytrace=False)


def test_the_private_folders_look_private() -> None:
    tops = {name.split(".")[1] for name in load_modules(SRC, PACKAGE) if name != PACKAGE}
    looks_private = {top for top in tops if top.startswith("_") and not top.startswith("__")}
    assert sorted(tops - looks_private - PUBLIC) == []  # private, with no underscore
    assert sorted((tops - looks_private) & PUBLIC) == sorted(PUBLIC)


def test_the_folder_check_finds_what_it_claims(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "_top.py").write_text("from .low._x import f\n", encoding="utf-8")
    (package / "low" / "__init__.py").write_text("", encoding="utf-8")
    typing_only = (
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .._top import T\n"
    )
    (package / "low" / "_x.py").write_text(typing_only, encoding="utf-8")
    picture = (
        "```mermaid\nflowchart TD\n"
        '    top["<b>top</b><br/>pkg _top low"]\n'
        '    low["<b>low</b><br/>low._x"]\n'
        "    top --> low\n```\n"
    )
    pair = "folders pkg and pkg.low import each other: pkg._top:1 imports pkg.low._x; "
    pair += "pkg.low._x:4 imports pkg._top"
    split = "folder pkg.low stands in 2 boxes: low, top"
    assert check_folders(tmp_path, "pkg", picture) == [split, pair]
    fixed = picture.replace("_top low", "_top").replace("low._x", "low low._x")
    assert check_folders(tmp_path, "pkg", fixed) == [pair]
    (package / "low" / "_x.py").write_text("f = 1\n", encoding="utf-8")
    assert check_folders(tmp_path, "pkg", fixed) == []


def test_the_check_finds_what_it_claims(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "_top.py").write_text("from ._low import f\n", encoding="utf-8")
    (package / "_low.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ._top import T\n",
        encoding="utf-8",
    )
    (package / "sub" / "__init__.py").write_text("", encoding="utf-8")
    picture = (
        "```mermaid\nflowchart TD\n"
        '    top["<b>top</b><br/>pkg _top _ghost"]\n'
        '    low["<b>low</b><br/>_low _top"]\n'
        "    top --> low\n```\n"
    )
    problems = check_picture(tmp_path, "pkg", picture)
    assert "_top stands in top and in low" in problems[0]
    assert "pkg._ghost is in the picture but is no module" in problems
    assert "pkg.sub is in no box of the picture" in problems
    fixed = picture.replace(" _top _ghost", " _top sub").replace("_low _top", "_low")
    assert check_picture(tmp_path, "pkg", fixed) == [
        "pkg._low:4 (low) imports pkg._top (top), a layer it may not use"
    ]
    with pytest.raises(ValueError, match=r"^neither a box nor an arrow: '    top -- low'$"):
        read_picture(fixed.replace("top --> low", "top -- low"))
