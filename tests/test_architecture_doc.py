"""``docs/architecture.md``'s picture of the layers, checked against the imports.

The picture is a Mermaid flowchart: each box a layer naming its modules (dotted, below
``asyncgraph``; ``asyncgraph`` itself is the package's ``__init__``), each arrow pointing down
to a layer the one above may use. Every module must stand in exactly one box, and every import
(typing-only ones included) must stay in its layer or go down the arrows.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from tests.test_structure import PACKAGE, SRC, iter_imports, load_modules, resolve

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
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


def test_the_picture_of_the_layers_matches_the_imports() -> None:
    problems = check_picture(SRC, PACKAGE, DOC.read_text(encoding="utf-8"))
    if problems:
        pytest.fail("docs/architecture.md's layers:\n" + "\n".join(problems), pytrace=False)


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
